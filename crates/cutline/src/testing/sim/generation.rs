//! One generation of the simulated job: the seeded scheduler that picks the next action (deliver a
//! message, deliver a control message, finish a snapshot write, flush, advance time, crash a task or the
//! whole process), and the control plane through which the coordinator's decisions reach the tasks.

use super::{Sim, SimAlignment, FINGERPRINT, RETUNE_PPM};
use crate::connectors::SourceStatus;
use crate::runtime::chains::Chains;
use crate::runtime::driver::{
    carry_out, write_snapshot, Carried, CheckpointLog, ControlPlane, DriverCtx, SnapshotJob, TaskMeta,
};
use crate::runtime::task::{Control, SnapshotTimings, SourcePhase, Task, TaskEnv};
use crate::runtime::{AckReport, RunConfig, RunError};
use crate::state::SnapshotBuilder;
use cutline_core::barrier::Barrier;
use cutline_core::coordinator::{Coordinator, Event};
use cutline_core::{CheckpointId, Generation, TaskId, TimeMs};
use std::collections::VecDeque;

enum SimEvent {
    Coord(Event<AckReport>),
}

/// The environment the simulated tasks see.
struct SimEnv<'a> {
    now: TimeMs,
    generation: Generation,
    writes: &'a mut Vec<SnapshotJob>,
    events: &'a mut VecDeque<SimEvent>,
    metas: &'a [TaskMeta],
    switched: &'a mut u64,
}

impl TaskEnv for SimEnv<'_> {
    fn now(&self) -> TimeMs {
        self.now
    }
    fn processing_time_ms(&self) -> u64 {
        self.now.0
    }
    fn decline(&mut self, task: TaskId, checkpoint: CheckpointId, reason: String) {
        self.events.push_back(SimEvent::Coord(Event::Declined {
            generation: self.generation,
            checkpoint,
            task,
            reason,
        }));
    }
    fn persist(&mut self, task: TaskId, barrier: Barrier, snap: SnapshotBuilder, timings: SnapshotTimings) {
        if timings.switched {
            *self.switched += 1;
        }
        let meta = self.metas[task.0 as usize].clone();
        self.writes.push(SnapshotJob { generation: self.generation, task, meta, barrier, snap, timings });
    }
    fn source_finished(&mut self, task: TaskId) {
        self.events.push_back(SimEvent::Coord(Event::SourceFinished { generation: self.generation, task }));
    }
    fn task_finished(&mut self, task: TaskId) {
        self.events.push_back(SimEvent::Coord(Event::TaskFinished { generation: self.generation, task }));
    }
}

pub(super) enum GenEnd {
    Finished(CheckpointId),
    /// Stopped with a savepoint: the process ends and a new one resumes from it.
    Stopped,
    FailOver(String),
    ProcessCrash,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_generation_sim(
    sim: &mut Sim,
    coord: &mut Coordinator<AckReport>,
    tasks: &mut [Option<Task>],
    metas: &[TaskMeta],
    generation: Generation,
    lease_end: &mut CheckpointId,
    cfg: &RunConfig,
) -> Result<GenEnd, String> {
    let store = sim.store.clone();
    // The writers of this generation: a snapshot builds on files this generation wrote.
    let chains = Chains::default();
    let mut controls: Vec<VecDeque<Control>> = tasks.iter().map(|_| VecDeque::new()).collect();
    let mut writes = std::mem::take(&mut sim.writes);
    let mut events: VecDeque<SimEvent> = VecDeque::new();
    let mut out = Vec::new();
    let mut stats = CheckpointLog::default();
    // Every task starts (sinks recover) before the first step; a failure there is a task failure.
    for slot in tasks.iter_mut() {
        let t = slot.as_mut().expect("freshly deployed");
        if let Err(e) = t.start() {
            events.push_back(SimEvent::Coord(Event::TaskFailed {
                generation,
                task: t.id,
                reason: e.to_string(),
                permanent: e.is_permanent(),
            }));
            *slot = None;
        }
    }
    // A stalled task is not scheduled until this time (a straggler or a stuck task).
    let mut stalled_until: Vec<TimeMs> = tasks.iter().map(|_| TimeMs(0)).collect();
    let mut switched = 0u64;
    loop {
        sim.report.switched_snapshots += std::mem::take(&mut switched);
        sim.report.steps += 1;
        if sim.report.steps > sim.o.max_steps {
            return Err(format!(
                "seed {}: no completion after {} steps (livelock or deadlock)",
                sim.seed, sim.o.max_steps
            ));
        }
        if sim.chance(sim.o.process_crash_ppm) {
            return Ok(GenEnd::ProcessCrash);
        }
        if sim.chance(sim.o.stall_ppm) {
            let ti = sim.rand(tasks.len() as u64) as usize;
            stalled_until[ti] = sim.now.plus_ms(sim.rand(800));
            sim.report.stalls += 1;
        }
        if sim.o.alignment == SimAlignment::Mixed && sim.chance(RETUNE_PPM) {
            // Settings change while the job runs; they apply from the next trigger.
            let c = sim.checkpoint_config();
            coord.set_config(c).map_err(|e| format!("seed {}: valid settings refused: {e}", sim.seed))?;
            sim.report.retunes += 1;
        }
        if sim.chance(sim.o.savepoint_ppm) {
            let stop = sim.rand(3) == 0;
            events.push_back(SimEvent::Coord(Event::SavepointRequested { stop }));
            sim.report.savepoints_requested += 1;
        }
        let now = sim.now;
        let live = |ti: usize| stalled_until[ti] <= now;
        // Pick one enabled action at random.
        let mut failed: Option<(TaskId, String)> = None;
        let choice = sim.rand(100);
        {
            let mut env = SimEnv {
                now: sim.now,
                generation,
                writes: &mut writes,
                events: &mut events,
                metas,
                switched: &mut switched,
            };
            if choice < 45 {
                // Deliver one data message on a random (task, readable input) that has one.
                let mut cands = Vec::new();
                for (ti, t) in tasks.iter().enumerate() {
                    let Some(t) = t else { continue };
                    if !live(ti) {
                        continue;
                    }
                    if t.is_source() {
                        if t.source_phase() == SourcePhase::Reading && t.has_credit() {
                            cands.push((ti, None));
                        }
                    } else {
                        for i in 0..t.inputs() {
                            if t.readable(i) && t.has_message(i) {
                                cands.push((ti, Some(i)));
                            }
                        }
                    }
                }
                if !cands.is_empty() {
                    let (ti, input) = cands[sim.rand(cands.len() as u64) as usize];
                    let t = tasks[ti].as_mut().expect("alive");
                    let r = match input {
                        None => t.step_source(&mut env).map(|s| debug_assert!(s != SourceStatus::Idle)),
                        Some(i) => t.step_input(i, &mut env).map(|_| ()),
                    };
                    if let Err(e) = r {
                        failed = Some((t.id, e.to_string()));
                    }
                }
            } else if choice < 60 {
                // Deliver one control message (per task in order).
                let cands: Vec<usize> =
                    (0..tasks.len()).filter(|i| tasks[*i].is_some() && !controls[*i].is_empty() && live(*i)).collect();
                if !cands.is_empty() {
                    let ti = cands[sim.rand(cands.len() as u64) as usize];
                    let c = controls[ti].pop_front().expect("non-empty");
                    let t = tasks[ti].as_mut().expect("alive");
                    if let Err(e) = t.on_control(c, &mut env) {
                        failed = Some((t.id, e.to_string()));
                    }
                }
            } else if choice < 72 {
                // Complete one pending snapshot write, in any order.
                if !env.writes.is_empty() {
                    let w = env.writes.swap_remove(sim.rand(env.writes.len() as u64) as usize);
                    if w.generation != generation {
                        sim.report.late_writes += 1;
                    }
                    let ev = write_snapshot(&*store, &cfg.faults, (&chains, cfg.incremental_checkpoints), w, || 0);
                    env.events.push_back(SimEvent::Coord(ev));
                }
            } else if choice < 80 {
                // Flush a random task's partial batches, or (with credit) let it fire due timers.
                let ti = sim.rand(tasks.len() as u64) as usize;
                let tick = sim.chance(500_000);
                if let Some(t) = tasks[ti].as_mut().filter(|_| live(ti)) {
                    let r = if tick && t.has_credit() { t.tick(&mut env).map(|_| ()) } else { t.flush() };
                    if let Err(e) = r {
                        failed = Some((t.id, e.to_string()));
                    }
                }
            } else if choice < 81 && sim.chance(sim.o.task_crash_ppm * 100) {
                let ti = sim.rand(tasks.len() as u64) as usize;
                if let Some(t) = tasks[ti].as_ref() {
                    failed = Some((t.id, "crashed by the simulation".into()));
                }
            } else {
                // Time passes: coordinator timers, and alignment timeouts at the tasks.
                sim.now = sim.now.plus_ms(sim.rand(3));
                env.now = sim.now;
                env.events.push_back(SimEvent::Coord(Event::Tick));
                for (ti, slot) in tasks.iter_mut().enumerate() {
                    if let Some(t) = slot.as_mut().filter(|_| stalled_until[ti] <= sim.now) {
                        if let Err(e) = t.check_alignment(&mut env) {
                            failed = Some((t.id, e.to_string()));
                            break;
                        }
                    }
                }
            }
        }
        if let Some((task, reason)) = failed {
            tasks[task.0 as usize] = None; // the task is gone
            events.push_back(SimEvent::Coord(Event::TaskFailed { generation, task, reason, permanent: false }));
        }
        // Quiescent? Flush everything so that partial batches cannot stall the job.
        // Feed events to the coordinator and carry out its decisions.
        while let Some(SimEvent::Coord(e)) = events.pop_front() {
            coord
                .handle(sim.now, e, &mut out)
                .map_err(|v| format!("seed {}: a task broke the protocol: {v}", sim.seed))?;
            if out.is_empty() {
                continue;
            }
            let mut plane = SimPlane { sim: &mut *sim, tasks: &*tasks, controls: &mut controls };
            let mut ctx = DriverCtx {
                store: &*store,
                fingerprint: FINGERPRINT,
                generation,
                retain: cfg.retain,
                lease_end: &mut *lease_end,
                stats: &mut stats,
                unix_ms: plane.now().0,
                savepoints: Vec::new(),
            };
            match carry_out(coord, std::mem::take(&mut out), &mut ctx, &mut plane).map_err(|e| e.to_string())? {
                Carried::Continue => {}
                Carried::FailOver(reason) => {
                    sim.writes = writes;
                    return Ok(GenEnd::FailOver(reason));
                }
                Carried::Finished(c) => return Ok(GenEnd::Finished(c)),
                Carried::Stopped(_) => {
                    sim.report.stopped_with_savepoint += 1;
                    return Ok(GenEnd::Stopped);
                }
            }
        }
    }
}

/// The simulation's control plane: a FIFO queue of control messages per task, delivered by the
/// scheduler; every epoch triggered is checked to be new, every committed checkpoint to be a cut.
struct SimPlane<'a> {
    sim: &'a mut Sim,
    tasks: &'a [Option<Task>],
    controls: &'a mut [VecDeque<Control>],
}

impl ControlPlane for SimPlane<'_> {
    fn send_all(&mut self, c: Control, sources_only: bool) {
        if let Control::Trigger(b) = &c {
            if let Some(l) = self.sim.last_triggered {
                assert!(b.checkpoint > l, "epoch {} triggered after {l}: reused or reordered", b.checkpoint);
            }
            self.sim.last_triggered = Some(b.checkpoint);
        }
        if let Control::Complete(_) = &c {
            self.sim.report.checkpoints_completed += 1;
        }
        for (i, t) in self.tasks.iter().enumerate() {
            if t.as_ref().is_some_and(|t| !sources_only || t.is_source()) {
                self.controls[i].push_back(c.clone());
            }
        }
    }
    fn now(&self) -> TimeMs {
        self.sim.now
    }
    fn committed(&mut self, checkpoint: CheckpointId) -> Result<(), RunError> {
        self.sim.check_cut(checkpoint).map_err(|reason| RunError::Restore { checkpoint, reason })
    }
}
