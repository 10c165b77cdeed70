use super::*;

fn ctx(uid: &str, subtask: u32, incarnation: u64) -> SinkContext {
    SinkContext { uid: uid.into(), subtask, parallelism: 2, incarnation, job: "j1".into() }
}

fn line_sink(dir: &Path) -> TransactionalFileSink<String> {
    TransactionalFileSink::new(dir, |s: &String, buf: &mut Vec<u8>| buf.extend_from_slice(s.as_bytes()))
}

#[test]
fn recover_of_one_sink_never_discards_another_sinks_pending_files_regression_prefix_collision() {
    // Sink "out" subtask 1 and sink "out-1" subtask 0 share a directory; with names "uid-subtask-..."
    // the first one's recovery took the second one's pending file for its own and deleted it.
    let dir = tempfile::tempdir().unwrap();
    let mut other = line_sink(dir.path());
    other.open(&ctx("out-1", 0, 7)).unwrap();
    other.write("kept".into()).unwrap();
    let prepared = other.prepare(CheckpointId(3)).unwrap().expect("a transaction");
    let mut sink = line_sink(dir.path());
    sink.open(&ctx("out", 1, 9)).unwrap();
    sink.recover(&[]).unwrap();
    other.commit(&[prepared]).unwrap();
    let committed = std::fs::read_to_string(dir.path().join("part-out-1-0-000000000003")).unwrap();
    assert_eq!(committed, "kept\n");
}

#[test]
fn a_stale_incarnation_never_discards_a_newer_generations_transaction_regression_late_worker() {
    // A worker that started its tasks late (its deployment was called off while it restored) ran
    // `recover` after the next generation, on another worker, had prepared its transaction.
    let dir = tempfile::tempdir().unwrap();
    let mut newer = line_sink(dir.path());
    newer.open(&ctx("out", 0, (5 << 32) | 3)).unwrap();
    newer.write("kept".into()).unwrap();
    let prepared = newer.prepare(CheckpointId(9)).unwrap().expect("a transaction");
    let mut stale = line_sink(dir.path());
    stale.open(&ctx("out", 0, (4 << 32) | 3)).unwrap();
    stale.recover(&[]).unwrap();
    newer.commit(&[prepared]).unwrap();
    let committed = std::fs::read_to_string(dir.path().join("part-out-0-000000000009")).unwrap();
    assert_eq!(committed, "kept\n");
}

#[test]
fn commit_is_idempotent_and_recover_discards_newer_pending_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = line_sink(dir.path());
    s.open(&ctx("out", 0, 1)).unwrap();
    s.write("a".into()).unwrap();
    let c1 = s.prepare(CheckpointId(1)).unwrap().unwrap();
    s.write("b".into()).unwrap();
    let _c2 = s.prepare(CheckpointId(2)).unwrap().unwrap();
    s.write("c".into()).unwrap(); // open, never prepared
    s.commit(std::slice::from_ref(&c1)).unwrap();
    s.commit(std::slice::from_ref(&c1)).unwrap(); // again: a no-op
                                                  // A new incarnation restores checkpoint 1: c1 is committed already, c2 and the open file go.
    let mut r = line_sink(dir.path());
    r.open(&ctx("out", 0, 2)).unwrap();
    r.recover(std::slice::from_ref(&c1)).unwrap();
    let pending: Vec<_> = std::fs::read_dir(dir.path().join(PENDING_DIR)).unwrap().collect();
    assert!(pending.is_empty(), "newer transactions must be discarded: {pending:?}");
    let parts: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("part-"))
        .collect();
    assert_eq!(parts, vec!["part-out-0-000000000001".to_string()]);
}

#[test]
fn committing_a_transaction_whose_file_is_gone_is_an_error_not_silent_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = line_sink(dir.path());
    s.open(&ctx("out", 0, 1)).unwrap();
    let ghost = PendingFile {
        pending: "out@0@j1@1-0.pending".into(),
        final_name: "part-out-0-000000000001".into(),
        identity: FileIdentity::Unknown,
    };
    assert!(s.commit(&[ghost]).is_err());
}

#[test]
fn commit_never_replaces_another_runs_output_regression_overwrite() {
    // A second run with a fresh state directory but the same output directory reused checkpoint
    // ids; its commit silently replaced the first run's committed file.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("part-out-0-000000000001"), "first run\n").unwrap();
    let mut s = line_sink(dir.path());
    s.open(&ctx("out", 0, 1)).unwrap();
    s.write("second run".into()).unwrap();
    let c = s.prepare(CheckpointId(1)).unwrap().unwrap();
    let err = s.commit(&[c]).expect_err("must not replace committed output").to_string();
    assert!(err.contains("another run's file"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.path().join("part-out-0-000000000001")).unwrap(), "first run\n");
}

/// `cp -a SRC DST` as far as the sink can tell: the same names and bytes, new inodes.
fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn a_copied_output_directory_resumes_regression_dev_ino() {
    // Committed files were known by (device, inode): in a copy of the output directory (cp -a, a
    // backup restored, a move to another disk) every recovery commit took its own file for
    // "another run's" and the job could not resume.
    let dir = tempfile::tempdir().unwrap();
    let (orig, copy) = (dir.path().join("orig"), dir.path().join("copy"));
    let mut s = line_sink(&orig);
    s.open(&ctx("out", 0, 1)).unwrap();
    s.write("a".into()).unwrap();
    let c1 = s.prepare(CheckpointId(1)).unwrap().unwrap();
    s.commit(std::slice::from_ref(&c1)).unwrap(); // committed: the pending name is gone
    s.write("b".into()).unwrap();
    let c2 = s.prepare(CheckpointId(2)).unwrap().unwrap();
    // A crash between the link and the unlink of c2's commit.
    std::fs::hard_link(orig.join(PENDING_DIR).join(&c2.pending), orig.join(&c2.final_name)).unwrap();
    copy_dir(&orig, &copy);
    let mut r = line_sink(&copy);
    r.open(&ctx("out", 0, 2)).unwrap();
    r.recover(&[c1.clone(), c2.clone()]).expect("the copy's files are the transactions' own");
    r.commit(&[c1, c2]).expect("and committing them again is a no-op");
    assert_eq!(std::fs::read_to_string(copy.join("part-out-0-000000000001")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(copy.join("part-out-0-000000000002")).unwrap(), "b\n");
    let pending: Vec<_> = std::fs::read_dir(copy.join(PENDING_DIR)).unwrap().collect();
    assert!(pending.is_empty(), "{pending:?}");
}

#[test]
fn a_committed_name_with_other_content_is_another_runs_file_named_with_both_identities() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = line_sink(dir.path());
    s.open(&ctx("out", 0, 1)).unwrap();
    s.write("mine".into()).unwrap();
    let c = s.prepare(CheckpointId(3)).unwrap().unwrap();
    assert_eq!(c.identity, FileIdentity::Content { len: 5, crc32: crc32fast::hash(b"mine\n") });
    s.commit(std::slice::from_ref(&c)).unwrap();
    // Another run's file of the same name (the pending file is gone: committed before).
    std::fs::write(dir.path().join(&c.final_name), "theirs!\n").unwrap();
    let err = s.commit(std::slice::from_ref(&c)).expect_err("not this transaction's file");
    assert!(err.is_permanent(), "{err}");
    let err = err.to_string();
    let theirs = format!("8 bytes, CRC-32 {:08x}", crc32fast::hash(b"theirs!\n"));
    let mine = format!("5 bytes, CRC-32 {:08x}", crc32fast::hash(b"mine\n"));
    assert!(err.contains("another run's file") && err.contains(&theirs) && err.contains(&mine), "{err}");
}

#[test]
fn committables_of_older_versions_still_decode() {
    #[derive(Serialize)]
    struct OldPendingFile {
        pending: String,
        final_name: String,
        file_id: Option<(u64, u64)>,
    }
    let old = |file_id| OldPendingFile { pending: "p".into(), final_name: "f".into(), file_id };
    let decoded: PendingFile = postcard::from_bytes(&postcard::to_allocvec(&old(Some((7, 42)))).unwrap()).unwrap();
    assert_eq!(decoded.identity, FileIdentity::DevIno(7, 42));
    assert_eq!((decoded.pending.as_str(), decoded.final_name.as_str()), ("p", "f"));
    let decoded: PendingFile = postcard::from_bytes(&postcard::to_allocvec(&old(None)).unwrap()).unwrap();
    assert_eq!(decoded.identity, FileIdentity::Unknown);
    // And in the sink's state, a map from checkpoint to committable.
    let map: std::collections::BTreeMap<CheckpointId, OldPendingFile> =
        [(CheckpointId(5), old(Some((1, 2)))), (CheckpointId(6), old(None))].into_iter().collect();
    let decoded: std::collections::BTreeMap<CheckpointId, PendingFile> =
        postcard::from_bytes(&postcard::to_allocvec(&map).unwrap()).unwrap();
    assert_eq!(decoded[&CheckpointId(5)].identity, FileIdentity::DevIno(1, 2));
    assert_eq!(decoded[&CheckpointId(6)].identity, FileIdentity::Unknown);
}

#[test]
fn a_commit_interrupted_between_link_and_unlink_is_finished_by_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = line_sink(dir.path());
    s.open(&ctx("out", 0, 1)).unwrap();
    s.write("x".into()).unwrap();
    let c = s.prepare(CheckpointId(4)).unwrap().unwrap();
    // The crash left both names pointing at the transaction.
    std::fs::hard_link(dir.path().join(PENDING_DIR).join(&c.pending), dir.path().join(&c.final_name)).unwrap();
    s.commit(std::slice::from_ref(&c)).unwrap();
    assert!(!dir.path().join(PENDING_DIR).join(&c.pending).exists());
    assert_eq!(std::fs::read_to_string(dir.path().join(&c.final_name)).unwrap(), "x\n");
}

#[test]
fn two_jobs_sharing_an_output_directory_never_take_each_others_transactions_regression_shared_output() {
    // Job A started while job B had an open transaction in the same directory: A's recovery
    // deleted B's pending file, and B's commit took A's part file of the same name for its own.
    let dir = tempfile::tempdir().unwrap();
    let job = |j: &str| SinkContext { uid: "output".into(), subtask: 0, parallelism: 1, incarnation: 1, job: j.into() };
    let mut b = line_sink(dir.path());
    b.open(&job("b")).unwrap();
    b.write("from b".into()).unwrap();
    let mut a = line_sink(dir.path());
    a.open(&job("a")).unwrap();
    a.recover(&[]).unwrap(); // must not touch b's open transaction
    a.write("from a".into()).unwrap();
    let ca = a.prepare(CheckpointId(1)).unwrap().unwrap();
    a.commit(&[ca]).unwrap();
    let cb = b.prepare(CheckpointId(1)).unwrap().expect("b's transaction survived a's recovery");
    let err =
        b.commit(std::slice::from_ref(&cb)).expect_err("a's file of the same name is not b's transaction").to_string();
    assert!(err.contains("another run"), "{err}");
    // And if b's pending file is gone, a's file is still not taken for b's.
    std::fs::remove_file(dir.path().join(PENDING_DIR).join(&cb.pending)).unwrap();
    assert!(b.commit(&[cb]).is_err());
    assert_eq!(std::fs::read_to_string(dir.path().join("part-output-0-000000000001")).unwrap(), "from a\n");
}

#[test]
fn a_rescaled_subtask_commits_and_discards_the_transactions_of_the_old_subtasks_it_takes_over() {
    // Two old subtasks each prepared checkpoint 4 (in the restored checkpoint) and 5 (after it).
    let dir = tempfile::tempdir().unwrap();
    let mut in_checkpoint = Vec::new();
    for old in 0..2 {
        let mut s = line_sink(dir.path());
        s.open(&ctx("out", old, 1 << 32)).unwrap();
        s.write(format!("from {old}")).unwrap();
        in_checkpoint.push(s.prepare(CheckpointId(4)).unwrap().unwrap());
        s.write("after the checkpoint".into()).unwrap();
        s.prepare(CheckpointId(5)).unwrap().unwrap();
    }
    // The job restores checkpoint 4 at parallelism 1: subtask 0 takes over old subtasks 0 and 1.
    let mut r = line_sink(dir.path());
    r.open(&SinkContext { uid: "out".into(), subtask: 0, parallelism: 1, incarnation: 2 << 32, job: "j1".into() })
        .unwrap();
    assert!(<TransactionalFileSink<String> as Sink<String>>::take_over(&mut r, &[0, 1], 2).unwrap());
    assert_eq!(r.committed_after(Some(CheckpointId(4))).unwrap(), Some(false));
    r.recover(&in_checkpoint).unwrap();
    for old in 0..2 {
        let part = dir.path().join(format!("part-out-{old}-000000000004"));
        assert_eq!(std::fs::read_to_string(part).unwrap(), format!("from {old}\n"));
    }
    let left: Vec<_> = std::fs::read_dir(dir.path().join(PENDING_DIR)).unwrap().collect();
    assert!(left.is_empty(), "the transactions prepared after the checkpoint must go: {left:?}");
    // Output an old subtask published after the checkpoint is seen, so such a restore is refused.
    assert_eq!(r.committed_after(Some(CheckpointId(3))).unwrap(), Some(true));
}
