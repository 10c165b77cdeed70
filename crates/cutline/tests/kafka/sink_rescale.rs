//! The exactly-once Kafka sink restored at another parallelism: a new subtask commits each old
//! subtask's checkpoints it takes over under that subtask's marker, step by step (with a dead
//! process's half-written transaction) and in a whole job rescaled after each of two crashes.

use super::*;

#[test]
fn a_subtask_after_a_rescale_commits_each_old_subtasks_checkpoints_once_under_its_marker() {
    let t = topic("sink-take-over", 2);
    let exactly_once = || KafkaSinkConfig::exactly_once(&brokers(), &t);
    let rescaled = |subtask: u32, parallelism: u32, generation: u64| SinkContext {
        parallelism,
        ..sink_ctx("take-over", subtask, generation)
    };
    // Generation 1 runs at parallelism 2. Each subtask prepares checkpoints 1 and 2; subtask 1
    // commits checkpoint 1 before the job dies, subtask 0 commits nothing.
    let mut prepared = Vec::new();
    for j in 0..2u32 {
        let mut s = string_sink(exactly_once());
        s.open(&rescaled(j, 2, 1)).unwrap();
        s.recover(&[]).unwrap();
        let mut txns = Vec::new();
        for cp in 1..=2u64 {
            for i in 0..10 {
                s.write((format!("s{j}"), format!("s{j}-c{cp}-{i}"))).unwrap();
            }
            txns.push(s.prepare(CheckpointId(cp)).unwrap().unwrap());
        }
        if j == 1 {
            s.commit(&txns[..1]).unwrap();
        }
        prepared.push((j, txns));
    }
    // Subtask 1's process died in the middle of checkpoint 2's commit, with records written.
    let zombie: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("transactional.id", KafkaSink::<(String, String)>::transactional_id(&rescaled(1, 2, 1)))
        .create()
        .unwrap();
    zombie.init_transactions(Duration::from_secs(30)).unwrap();
    zombie.begin_transaction().unwrap();
    zombie.send(BaseRecord::to(&t).partition(0).key("s1").payload("half-written")).unwrap();
    zombie.flush(Duration::from_secs(30)).unwrap();
    std::mem::forget(zombie);

    // Generation 2 restores checkpoint 2 at parallelism 1: its one subtask takes over both.
    let mut next = string_sink(exactly_once());
    next.open(&rescaled(0, 1, 2)).unwrap();
    assert!(Sink::<(String, String)>::take_over(&mut next, &[0, 1], 2).unwrap(), "the sink refuses to rescale");
    assert_eq!(next.committed_after(Some(CheckpointId(2))).unwrap(), Some(false));
    assert_eq!(
        next.committed_after(Some(CheckpointId(0))).unwrap(),
        Some(true),
        "old subtask 1's commit of checkpoint 1 went unnoticed"
    );
    next.recover_taken_over(&prepared).unwrap();
    let mut got: Vec<String> = read_committed(&brokers(), &t, 2).unwrap().iter().map(|r| text(r).1).collect();
    got.sort();
    let mut want: Vec<String> =
        (0..2).flat_map(|j| (1..=2).flat_map(move |cp| (0..10).map(move |i| format!("s{j}-c{cp}-{i}")))).collect();
    want.sort();
    assert_eq!(got, want, "a checkpoint of an old subtask was lost, doubled, or the zombie's records show");
    // Recovering again (a crash during recovery) writes nothing twice.
    let mut again = string_sink(exactly_once());
    again.open(&rescaled(0, 1, 3)).unwrap();
    assert!(Sink::<(String, String)>::take_over(&mut again, &[0, 1], 2).unwrap());
    again.recover_taken_over(&prepared).unwrap();
    assert_eq!(read_committed(&brokers(), &t, 2).unwrap().len(), want.len(), "a second recovery wrote again");
}

/// The whole job, its sink included, restored at another parallelism after each of two crashes
/// that fall between a checkpoint's completion and its commit (2 -> 1 -> 3): a new sink subtask
/// commits the checkpoints of the old subtasks it takes over, each under that subtask's marker.
#[test]
fn a_job_rescaled_with_its_sink_after_each_crash_writes_exactly_the_failure_free_result() {
    let (i, o) = (input("job-sink-rescale-in"), topic("job-sink-rescale-out", 3));
    let dir = tempfile::tempdir().unwrap();
    let name = format!("kafka-sink-rescale-{}", run_id());
    for (step, p) in [2u32, 1].into_iter().enumerate() {
        // The input is held back (1 ms a record) so that the run is still going at its 3rd commit.
        // That and every later commit fail, so every subtask is left with a checkpoint to commit.
        let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let commits = Arc::new(AtomicU64::new(0));
        let faults =
            Faults::new(move |f| f == FaultPoint::SinkCommit && commits.fetch_add(1, Ordering::SeqCst) + 1 >= 3);
        let mut cfg = config(dir.path(), &name, faults);
        cfg.restart = RestartStrategy::None;
        let job = count_job_held(&brokers(), "kafka-sink-rescale", &i, &o, (true, p, p), Some(hold));
        let err = cutline::run(&job, cfg).unwrap_err();
        assert!(format!("{err:#}").contains("injected failure"), "run {step} at parallelism {p}: {err:#}");
    }
    let partial = seen_counts(&o).len();
    assert!(partial < failure_free().len(), "the crashed runs committed all {partial} updates");
    let job = count_job_held(&brokers(), "kafka-sink-rescale", &i, &o, (true, 3, 3), None);
    let report = cutline::run(&job, config(dir.path(), &name, Faults::none())).unwrap();
    assert!(report.restored_from.is_some(), "the last run did not restore a checkpoint");
    assert_exactly_once(&o);
}
