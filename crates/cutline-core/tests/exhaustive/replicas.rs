//! Replicas: the real machines, made copyable by replaying the calls made on them.

use super::*;

/// Calls on the real machines, memoized by (fingerprint of the machine's state, call): a machine state
/// reached again on another path reuses the result instead of copying (replaying) the machine.
#[derive(Default)]
#[allow(clippy::type_complexity)] // (state, call) -> (machine after, its decisions): read once, here
pub(crate) struct Memo {
    pub(crate) aligners: FingerprintMap<(u64, u64), (Rc<AlignerReplica>, Vec<AlignAction>)>,
    pub(crate) coordinators: FingerprintMap<(u64, u64), (Rc<CoordinatorReplica>, Vec<Decision<()>>)>,
}

#[derive(Clone, Debug)]
pub(crate) enum AlignerCall {
    Barrier(usize, Barrier, TimeMs),
    End(usize, TimeMs),
    Switch(CheckpointId, TimeMs),
}

/// A real [`Aligner`] and the calls that built its state.
pub(crate) struct AlignerReplica {
    pub(crate) inputs: usize,
    pub(crate) aligner: Aligner,
    pub(crate) log: Vec<AlignerCall>,
    pub(crate) fp: u64,
}

impl AlignerReplica {
    pub(crate) fn new(inputs: usize) -> AlignerReplica {
        let aligner = Aligner::new(inputs);
        let fp = Self::fingerprint(&aligner);
        AlignerReplica { inputs, aligner, log: Vec::new(), fp }
    }
    pub(crate) fn run(aligner: &mut Aligner, call: &AlignerCall, out: &mut Vec<AlignAction>) {
        match *call {
            AlignerCall::Barrier(input, barrier, now) => aligner.on_barrier(input, barrier, now, out),
            AlignerCall::End(input, now) => aligner.on_end_of_input(input, now, out),
            AlignerCall::Switch(id, now) => aligner.switch_to_unaligned(id, now, out),
        }
    }
    pub(crate) fn call(&mut self, call: AlignerCall) -> Vec<AlignAction> {
        let mut out = Vec::new();
        Self::run(&mut self.aligner, &call, &mut out);
        self.log.push(call);
        self.fp = Self::fingerprint(&self.aligner);
        out
    }
    /// The aligner's state without the time each checkpoint's first barrier arrived, which only feeds
    /// the alignment statistics of a snapshot (the model ignores them).
    pub(crate) fn fingerprint(a: &Aligner) -> u64 {
        fingerprint_debug(&blank_times(&format!("{a:?}"), "first_at: "))
    }
}

impl AlignerReplica {
    /// Make `call` on the aligner in `rc` (shared, never changed in place): `rc` now points at the
    /// state after the call.
    pub(crate) fn step(rc: &mut Rc<AlignerReplica>, call: AlignerCall, memo: &RefCell<Memo>) -> Vec<AlignAction> {
        let key = (rc.fp, fingerprint_debug(&call));
        if let Some((next, out)) = memo.borrow().aligners.get(&key) {
            *rc = Rc::clone(next);
            return out.clone();
        }
        let mut next = AlignerReplica::clone(rc);
        let out = next.call(call);
        let next = Rc::new(next);
        memo.borrow_mut().aligners.insert(key, (Rc::clone(&next), out.clone()));
        *rc = next;
        out
    }
}

impl Clone for AlignerReplica {
    fn clone(&self) -> Self {
        let mut aligner = Aligner::new(self.inputs);
        let mut scratch = Vec::new();
        for call in &self.log {
            scratch.clear();
            Self::run(&mut aligner, call, &mut scratch);
        }
        AlignerReplica { inputs: self.inputs, aligner, log: self.log.clone(), fp: self.fp }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum CoordinatorCall {
    Handle(TimeMs, Event<()>),
    Restart { generation: Generation, restored: Option<CheckpointId>, now: TimeMs },
}

/// A real [`Coordinator`] and the calls that built its state.
pub(crate) struct CoordinatorReplica {
    pub(crate) config: CheckpointConfig,
    pub(crate) coordinator: Coordinator<()>,
    pub(crate) log: Vec<CoordinatorCall>,
    pub(crate) fp: u64,
}

impl CoordinatorReplica {
    pub(crate) fn fresh(config: &CheckpointConfig) -> Coordinator<()> {
        Coordinator::new(
            config.clone(),
            Generation(1),
            ALL_TASKS,
            SOURCE_TASKS,
            CheckpointId(1),
            LEASE_END,
            None,
            TimeMs(0),
        )
    }
    pub(crate) fn new(config: &CheckpointConfig) -> CoordinatorReplica {
        let coordinator = Self::fresh(config);
        let fp = Self::fingerprint(&coordinator);
        CoordinatorReplica { config: config.clone(), coordinator, log: Vec::new(), fp }
    }
    pub(crate) fn run(c: &mut Coordinator<()>, call: &CoordinatorCall, out: &mut Vec<Decision<()>>) {
        match call {
            CoordinatorCall::Handle(now, event) => {
                c.handle(*now, event.clone(), out).expect("the exhaustive model sends only legal events")
            }
            CoordinatorCall::Restart { generation, restored, now } => {
                c.restart(*generation, ALL_TASKS, SOURCE_TASKS, *restored, *now, out)
            }
        }
    }
    pub(crate) fn call(&mut self, call: CoordinatorCall) -> Vec<Decision<()>> {
        let mut out = Vec::new();
        Self::run(&mut self.coordinator, &call, &mut out);
        self.log.push(call);
        self.fp = Self::fingerprint(&self.coordinator);
        out
    }
    /// The coordinator's state without its statistics (the history of finished checkpoints, the
    /// counts, and when each ack came), which never change a decision: states that differ only there
    /// behave the same.
    pub(crate) fn fingerprint(c: &Coordinator<()>) -> u64 {
        let history: Vec<_> = c.history().collect();
        let behaviour = blank_times(&format!("{c:?}"), "((), ")
            .replacen(&format!("history: {history:?}"), "", 1)
            .replacen(&format!("completed_count: {}", c.completed_count()), "", 1)
            .replacen(&format!("failed_count: {}", c.failed_count()), "", 1);
        assert!(
            !behaviour.contains("CheckpointStats"),
            "the coordinator's Debug output changed shape; update CoordinatorReplica::fingerprint: {behaviour}"
        );
        fingerprint_debug(&behaviour)
    }
    /// Make `call` on the coordinator in `rc`, as [`AlignerReplica::step`] does.
    pub(crate) fn step(
        rc: &mut Rc<CoordinatorReplica>,
        call: CoordinatorCall,
        memo: &RefCell<Memo>,
    ) -> Vec<Decision<()>> {
        let key = (rc.fp, fingerprint_debug(&call));
        if let Some((next, out)) = memo.borrow().coordinators.get(&key) {
            *rc = Rc::clone(next);
            return out.clone();
        }
        let mut next = CoordinatorReplica::clone(rc);
        let out = next.call(call);
        let next = Rc::new(next);
        memo.borrow_mut().coordinators.insert(key, (Rc::clone(&next), out.clone()));
        *rc = next;
        out
    }
}

impl Clone for CoordinatorReplica {
    fn clone(&self) -> Self {
        let mut coordinator = Self::fresh(&self.config);
        let mut scratch = Vec::new();
        for call in &self.log {
            scratch.clear();
            Self::run(&mut coordinator, call, &mut scratch);
        }
        CoordinatorReplica { config: self.config.clone(), coordinator, log: self.log.clone(), fp: self.fp }
    }
}
