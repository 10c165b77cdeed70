//! Exploration.

use super::*;

/// A broken invariant and the path to it.
#[derive(Debug)]
pub(crate) struct Violation {
    pub(crate) model: &'static str,
    pub(crate) mutation: Option<Mutation>,
    pub(crate) path: Vec<Step>,
    pub(crate) what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mutation {
            Some(m) => writeln!(f, "[{} with mutation {m:?}] {}", self.model, self.what)?,
            None => writeln!(f, "[{}] {}", self.model, self.what)?,
        }
        writeln!(f, "path ({} steps):", self.path.len())?;
        for (n, line) in self.narrate().iter().enumerate() {
            writeln!(f, "  {:>3}. {line}", n + 1)?;
        }
        write!(f, "replay: {:?}", self.path)
    }
}

impl Violation {
    /// The path in words, re-run from the start (the words need the state before each step).
    pub(crate) fn narrate(&self) -> Vec<String> {
        let mut model = model_named(self.model);
        model.mutation = self.mutation;
        let mut world = World::new(&model);
        let mut lines = Vec::new();
        for &step in &self.path {
            lines.push(world.describe(step));
            match catch_unwind(AssertUnwindSafe(|| world.child(&model, step))) {
                Ok(Ok(next)) => world = next,
                _ => break,
            }
        }
        lines
    }
}

/// The unmutated model of that name.
pub(crate) fn model_named(name: &str) -> Model {
    [
        Model::aligned(),
        Model::unaligned(),
        Model::aligned_with_timeout(),
        Model::at_least_once(),
        Model::at_least_once_with_a_savepoint(),
    ]
    .into_iter()
    .find(|m| m.name == name)
    .unwrap_or_else(Model::aligned)
}

/// Counts of one exploration, and how often the interesting transitions occur (so that a passing run
/// is known not to be vacuous).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) states: usize,
    pub(crate) transitions: usize,
    pub(crate) finished_states: usize,
    /// Complete executions from the start to a finished job.
    pub(crate) paths: u128,
    pub(crate) max_depth: usize,
    pub(crate) overtakes: usize,
    pub(crate) timeouts: usize,
    pub(crate) savepoints: usize,
    pub(crate) crashes: usize,
    /// Restarts that queued restored channel state.
    pub(crate) channel_state_replays: usize,
    /// Restarts whose sink committed transactions that had not been committed before the crash.
    pub(crate) recovery_commits: usize,
    pub(crate) elapsed: Duration,
}

/// Explore every interleaving of `model`; the first violation stops the search.
pub(crate) fn explore(model: &Model) -> Result<Stats, Violation> {
    #[allow(clippy::large_enum_variant)] // one frame per level of a shallow stack
    enum Frame {
        Enter(World, u64),
        Exit { fp: u64, children: Vec<u64> },
    }
    let start = Instant::now();
    let mut stats = Stats::default();
    // Complete executions from each finished-expanding state; doubles as the visited set.
    let mut paths: FingerprintMap<u64, u128> = FingerprintMap::default();
    let mut expanding = FingerprintSet::default();
    let root = World::new(model);
    let root_fp = root.fingerprint();
    let mut stack = vec![Frame::Enter(root, root_fp)];
    while let Some(frame) = stack.pop() {
        let (world, fp) = match frame {
            Frame::Enter(world, fp) => (world, fp),
            Frame::Exit { fp, children } => {
                let n = children.iter().map(|c| paths.get(c).copied().unwrap_or(0)).fold(0u128, u128::saturating_add);
                paths.insert(fp, n);
                expanding.remove(&fp);
                continue;
            }
        };
        if paths.contains_key(&fp) {
            continue;
        }
        let fail =
            |what: String| Violation { model: model.name, mutation: model.mutation, path: world.path.clone(), what };
        if !expanding.insert(fp) {
            return Err(fail("a cycle in the state graph: the run can go on forever".into()));
        }
        stats.states += 1;
        stats.max_depth = stats.max_depth.max(world.path.len());
        if stats.states > MAX_STATES {
            return Err(fail(format!("exploration too large: {} states in {:?}", stats.states, start.elapsed())));
        }
        let steps = world.enabled(model);
        world.check_progress(model, &steps).map_err(fail)?;
        if steps.is_empty() {
            stats.finished_states += 1;
            paths.insert(fp, 1);
            expanding.remove(&fp);
            continue;
        }
        let mut children = Vec::with_capacity(steps.len());
        let mut todo = Vec::with_capacity(steps.len());
        for step in steps {
            let child = world.child(model, step)?;
            stats.transitions += 1;
            match step {
                Step::OpOvertake(_) => stats.overtakes += 1,
                Step::OpTimeout => stats.timeouts += 1,
                Step::Savepoint => stats.savepoints += 1,
                Step::Crash => stats.crashes += 1,
                Step::Restart => {
                    if child.inputs.iter().chain([&child.to_sink]).any(|q| !q.is_empty()) {
                        stats.channel_state_replays += 1;
                    }
                    if child.committed.len() > world.committed.len() {
                        stats.recovery_commits += 1;
                    }
                }
                _ => {}
            }
            let cfp = child.fingerprint();
            children.push(cfp);
            if !paths.contains_key(&cfp) {
                todo.push(Frame::Enter(child, cfp));
            }
        }
        stack.push(Frame::Exit { fp, children });
        stack.extend(todo);
    }
    stats.paths = paths.get(&root_fp).copied().unwrap_or(0);
    stats.elapsed = start.elapsed();
    Ok(stats)
}

/// Re-run a path printed by a violation; the violation it ends in, if any.
pub(crate) fn replay(model: &Model, path: &[Step]) -> Result<World, Violation> {
    let mut world = World::new(model);
    for &step in path {
        if !world.enabled(model).contains(&step) {
            return Err(Violation {
                model: model.name,
                mutation: model.mutation,
                path: world.path.clone(),
                what: format!("replay: {step:?} is not enabled here"),
            });
        }
        world = world.child(model, step)?;
    }
    let fail = |what| Violation { model: model.name, mutation: model.mutation, path: path.to_vec(), what };
    world.check_progress(model, &world.enabled(model)).map_err(fail)?;
    Ok(world)
}

/// Explore `model`, print its counts, and fail with the path if an invariant breaks.
pub(crate) fn check(model: Model) -> Stats {
    match explore(&model) {
        Ok(stats) => {
            println!(
                "{}: {} states, {} transitions, {} complete interleavings ({} distinct end states), depth {}, \
                 {} overtakes, {} timeouts, {} savepoints, {} crashes, {} restores replaying channel state, \
                 {} recovery commits, {:?}",
                model.name,
                stats.states,
                stats.transitions,
                if stats.paths == u128::MAX { "more than 10^38".to_string() } else { stats.paths.to_string() },
                stats.finished_states,
                stats.max_depth,
                stats.overtakes,
                stats.timeouts,
                stats.savepoints,
                stats.crashes,
                stats.channel_state_replays,
                stats.recovery_commits,
                stats.elapsed
            );
            let crashed = stats.crashes > 0 && stats.recovery_commits > 0;
            assert!(stats.paths > 0 && (crashed || model.max_crashes == 0), "{}: vacuous run: {stats:?}", model.name);
            stats
        }
        Err(v) => panic!("{v}"),
    }
}

/// The checker must find a violation of `model` (which carries a mutation) whose message contains
/// `expected`, and its path must replay to the same violation.
pub(crate) fn check_catches(model: Model, expected: &str) {
    let v = match explore(&model) {
        Ok(stats) => panic!("[{}] mutation {:?} went unnoticed: {stats:?}", model.name, model.mutation),
        Err(v) => v,
    };
    println!("{:?} caught:\n{v}", model.mutation);
    assert!(
        v.what.contains(expected),
        "mutation {:?}: expected a violation of {expected:?}, got:\n{v}",
        model.mutation
    );
    match replay(&model, &v.path) {
        Err(again) => assert_eq!(again.what, v.what, "the replayed path fails differently"),
        Ok(_) => panic!("the path of\n{v}\nreplays without a violation"),
    }
}
