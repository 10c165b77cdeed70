//! Many subtasks of one PostgreSQL sink: restored at another parallelism, a new subtask commits,
//! rolls back and answers for the transactions of the old subtasks it takes over (step by step, and
//! whole jobs rescaled after each of several crashes); opened at once, they create the marker table
//! once.

use super::*;

#[test]
fn a_subtask_after_a_rescale_commits_rolls_back_and_answers_for_the_old_subtasks_it_takes_over() {
    let _server = shared();
    let t = table("t_take_over");
    // Generation 1 runs at parallelism 2: both subtasks prepare checkpoints 1 and 2, and the job
    // dies before either commits.
    let mut prepared = Vec::new();
    for (j, base) in [(0u32, 0u64), (1, 100)] {
        let mut a = id_rows(&t);
        a.open(&ctx_of("take", 1, j, 2)).unwrap();
        write_all(&mut a, base..base + 10);
        let p1 = a.prepare(CheckpointId(1)).unwrap().unwrap();
        write_all(&mut a, base + 10..base + 20);
        let p2 = a.prepare(CheckpointId(2)).unwrap().unwrap();
        Sink::<u64>::abort(&mut a);
        prepared.push((p1, p2));
    }
    // A run restored at parallelism 3 failed before its first checkpoint completed: its subtask 2,
    // which no old subtask maps to, left a transaction prepared.
    let mut failed = id_rows(&t);
    failed.open(&ctx_of("take", 1, 2, 3)).unwrap();
    write_all(&mut failed, 200..210);
    failed.prepare(CheckpointId(2)).unwrap().unwrap();
    Sink::<u64>::abort(&mut failed);
    // Generation 2 restores checkpoint 1 at parallelism 1: its one subtask takes over both.
    let mut b = id_rows(&t);
    b.open(&ctx_of("take", 2, 0, 1)).unwrap();
    assert!(Sink::<u64>::take_over(&mut b, &[0, 1], 2).unwrap(), "the sink refuses to rescale");
    assert_eq!(b.committed_after(Some(CheckpointId(1))).unwrap(), Some(false));
    let to_commit: Vec<(u32, Vec<PreparedTxn>)> = (0..2).zip(prepared.iter().map(|(p1, _)| vec![p1.clone()])).collect();
    b.recover_taken_over(&to_commit).unwrap();
    let ids: Vec<i64> = rows(&t).iter().map(|r| r.0.unwrap()).collect();
    let want: Vec<i64> = (0..10).chain(100..110).collect();
    assert_eq!(ids, want, "checkpoint 1's rows of both old subtasks, and nothing else");
    assert_eq!(
        prepared_with("@take-"),
        Vec::<String>::new(),
        "checkpoint 2's transactions (or the failed run's) were not rolled back"
    );
    // Old subtask 1's output committed past checkpoint 1 (by hand here) is seen by its new owner.
    let (_, p2) = &prepared[1];
    let mut c = id_rows(&t);
    c.open(&ctx_of("take", 3, 1, 2)).unwrap();
    write_all(&mut c, 300..301);
    let late = c.prepare(CheckpointId(2)).unwrap().unwrap();
    c.commit(std::slice::from_ref(&late)).unwrap();
    assert_ne!(late.gid, p2.gid);
    let mut d = id_rows(&t);
    d.open(&ctx_of("take", 4, 0, 1)).unwrap();
    assert!(Sink::<u64>::take_over(&mut d, &[0, 1], 2).unwrap());
    assert_eq!(
        d.committed_after(Some(CheckpointId(1))).unwrap(),
        Some(true),
        "a taken-over subtask's commit after the restored checkpoint went unnoticed"
    );
}

/// Two old subtasks each deferred rows at checkpoint 2 (their checkpoint 1 was uncommitted, its
/// rows locked); the one new subtask that takes both over writes both sets, each under the marker
/// of the subtask that deferred it.
#[test]
fn regression_the_deferred_rows_of_two_old_subtasks_of_one_checkpoint_were_written_once_between_them() {
    let _server = shared();
    let t = table("t_take_over_deferred");
    let upsert = || {
        let row: RowFn<(String, i64)> = Arc::new(|(k, n): &(String, i64)| vec![k.as_str().into(), (*n).into()]);
        PostgresSink::new(PostgresSinkConfig::upsert(&url(), &t, &["k", "n"], &["k"]), row)
    };
    let mut prepared = Vec::new();
    for j in 0..2u32 {
        let mut a = upsert();
        a.open(&ctx_of("take-deferred", 1, j, 2)).unwrap();
        a.recover(&[]).unwrap();
        a.write((format!("a{j}"), 1)).unwrap();
        let p1 = a.prepare(CheckpointId(1)).unwrap().unwrap();
        a.write((format!("b{j}"), 2)).unwrap();
        let p2 = a.prepare(CheckpointId(2)).unwrap().unwrap();
        assert!(p2.gid.is_empty() && p2.deferred.len() == 1, "checkpoint 2 deferred its row: {p2:?}");
        Sink::<(String, i64)>::abort(&mut a);
        prepared.push((j, vec![p1, p2]));
    }
    let mut b = upsert();
    b.open(&ctx_of("take-deferred", 2, 0, 1)).unwrap();
    assert!(Sink::<(String, i64)>::take_over(&mut b, &[0, 1], 2).unwrap());
    b.recover_taken_over(&prepared).unwrap();
    let mut got: Vec<(String, i64)> = rows(&t).into_iter().map(|(_, k, n)| (k.unwrap(), n.unwrap())).collect();
    got.sort();
    let want: Vec<(String, i64)> =
        [("a0", 1), ("a1", 1), ("b0", 2), ("b1", 2)].iter().map(|(k, n)| (k.to_string(), *n)).collect();
    assert_eq!(got, want, "an old subtask's deferred rows were lost");
}

#[test]
fn a_job_rescaled_after_each_crash_commits_every_row_once() {
    let _server = shared();
    let (t, c) = (table("t_rescaled"), table("t_rescaled_counts"));
    let dir = tempfile::tempdir().unwrap();
    let name = "pg-rescaled";
    let fingerprint = format!("{name}{}", run_id());
    // Every run but the last stops at its n-th sink commit: a checkpoint complete, its
    // transactions prepared and not committed, for the next run (at another parallelism) to
    // take over. Up from 2 to 3 splits old subtasks' work; down to 1 merges three into one.
    let (runs, last) = ([2, 3, 1], 2);
    for (step, p) in runs.into_iter().enumerate() {
        let n = 4 + 2 * step as u64;
        let count = Arc::new(AtomicU64::new(0));
        let faults = Faults::new(move |f| f == FaultPoint::SinkCommit && count.fetch_add(1, Ordering::SeqCst) + 1 == n);
        let mut cfg = config(dir.path(), &fingerprint, faults);
        cfg.restart = RestartStrategy::None;
        let err = cutline::run(&graph(name, &t, &c, p), cfg).expect_err("stopped by the injected failure");
        assert!(format!("{err:#}").contains("injected failure"), "run {step} at parallelism {p}: {err:#}");
        assert!(!prepared_of_job(&fingerprint).is_empty(), "run {step} at parallelism {p} left nothing prepared");
        assert!(rows(&t).len() < RECORDS as usize, "run {step} at parallelism {p} ended before its crash");
    }
    let report = cutline::run(&graph(name, &t, &c, last), config(dir.path(), &fingerprint, Faults::none()))
        .unwrap_or_else(|e| panic!("the last run at parallelism {last}: {e}"));
    assert!(report.restored_from.is_some(), "the last run did not restore");
    assert_eq!(prepared_of_job(&fingerprint), Vec::<String>::new(), "prepared transactions left behind");
    assert_exact(&t, &c);
}

/// Sink subtasks opened at once against a schema without the marker table: each creates it if
/// missing, under an advisory lock; a look after taking the lock can miss a creation just
/// committed, and the loser met "relation already exists" and failed its task (seen in CI).
#[test]
fn regression_subtasks_creating_the_marker_table_at_once_failed_on_a_fresh_schema() {
    let _server = shared();
    for round in 0..5 {
        let schema = format!("fresh_{}_{round}", std::process::id());
        sql()
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id bigint)"
            ))
            .unwrap();
        let url = format!("{}?options=-c%20search_path%3D{schema}", url());
        let start = Arc::new(std::sync::Barrier::new(8));
        let opened: Vec<_> = (0..8u32)
            .map(|j| {
                let (url, start) = (url.clone(), start.clone());
                std::thread::spawn(move || {
                    let row: RowFn<u64> = Arc::new(|i: &u64| vec![SqlValue::from(*i as i64)]);
                    let mut s = PostgresSink::new(PostgresSinkConfig::insert(&url, "t", &["id"]), row);
                    start.wait();
                    s.open(&ctx_of("fresh", 1, j, 8)).map_err(|e| e.to_string())
                })
            })
            .collect();
        for (j, t) in opened.into_iter().enumerate() {
            t.join().unwrap().unwrap_or_else(|e| panic!("round {round}, subtask {j}: {e}"));
        }
        sql().batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).unwrap();
    }
}
