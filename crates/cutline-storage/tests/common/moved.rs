//! What users do by hand to a store, and values at the end of their range: a checkpoint directory
//! renamed (`mv chk-…05 chk-…09`) or copied (`cp -r`), a manifest of another job, ids and generations
//! at `u64::MAX`, names past it, sizes near it. Each is an error that says what happened (corruption,
//! which a restore skips) or simply works; none panics.

use super::{commit, dir_of, framed, generation_path, listing, manifest, manifest_path, record, write, Harness};
use cutline_core::{CheckpointId, Generation, OperatorId, SubtaskIndex};
use cutline_storage::{FileKind, JobMeta, Manifest, StorageError};

/// What a restore does (as the runtime's `restore_latest`): the newest complete checkpoint that
/// verifies, skipping damaged ones; any other error fails.
fn restorable(h: &dyn Harness) -> Option<CheckpointId> {
    let s = h.store();
    for l in s.list_checkpoints().unwrap().iter().rev().filter(|l| l.complete) {
        match s.verify(l.id) {
            Ok(_) => return Some(l.id),
            Err(e) if e.is_corruption() => continue,
            Err(e) => panic!("{}: a restore fails on {}: {e}", h.name(), l.id),
        }
    }
    None
}

/// `err` says that the directory of checkpoint `dir` holds the manifest of checkpoint `belongs`, what
/// happened, and where the directory belongs; and it is corruption.
fn assert_misplaced(h: &dyn Harness, err: StorageError, dir: u64, belongs: u64) {
    let shown = h.shown(&manifest_path(dir));
    match &err {
        StorageError::MisplacedManifest { path, expected, found } => {
            assert_eq!((*expected, *found), (CheckpointId(dir), CheckpointId(belongs)), "{}", h.name());
            assert_eq!(path.display().to_string(), shown, "{}", h.name());
        }
        other => panic!("{}: expected MisplacedManifest, got {other}", h.name()),
    }
    assert!(err.is_corruption() && !err.is_transient(), "{}: {err}", h.name());
    let text = err.to_string();
    for part in [
        shown.as_str(),
        &format!("the manifest of checkpoint {belongs}, not of checkpoint {dir}"),
        "renamed or copied by hand",
        &format!("chk-{belongs:020}"),
    ] {
        assert!(text.contains(part), "{}: the message says {part:?}: {text}", h.name());
    }
}

/// `mv chk-…05 chk-…09`: the directory of 9 holds the manifest of 5, whose references point into the
/// (now missing) directory of 5. Listing, reading, verifying, discarding and gc report or skip it;
/// a restore falls back to 4; moving it back, as the message says, makes 5 whole again.
pub fn a_renamed_checkpoint_directory_is_corruption_not_a_panic(h: &dyn Harness) {
    let s = h.store();
    // With a generation record that could fence anything, listings read every manifest.
    s.claim_generation(&record(1, None, "host-1")).unwrap();
    commit(s, 4, 1);
    let five = commit(s, 5, 1);
    h.copy_checkpoint_dir(5, 9, true);

    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(4, true), (9, true)]), "{}", h.name());
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(9)));
    assert_eq!(s.max_checkpoint_id_seen().unwrap(), Some(CheckpointId(9)));
    assert_misplaced(h, s.read_manifest(CheckpointId(9)).unwrap_err(), 9, 5);
    assert_misplaced(h, s.verify(CheckpointId(9)).unwrap_err(), 9, 5);
    assert_eq!(restorable(h), Some(CheckpointId(4)), "{}", h.name());

    // The coordinator's other calls meet it too.
    assert!(matches!(s.discard(CheckpointId(9)), Err(StorageError::DiscardComplete(CheckpointId(9)))));
    write(s, 7, "op", 0, b"an attempt below it");
    s.discard(CheckpointId(7)).unwrap(); // reads the manifests above 7 for the files they reference
    let in_nine: Vec<(String, Vec<u8>)> =
        h.snapshot().into_iter().filter(|(p, _)| p.starts_with(&format!("{}/", dir_of(9)))).collect();
    s.gc(2, &[]).unwrap();
    let after: Vec<(String, Vec<u8>)> =
        h.snapshot().into_iter().filter(|(p, _)| p.starts_with(&format!("{}/", dir_of(9)))).collect();
    assert_eq!(after, in_nine, "{}: gc keeps a retained misplaced checkpoint whole", h.name());
    s.verify(CheckpointId(4)).unwrap();

    // Moved back, it is checkpoint 5 again.
    h.copy_checkpoint_dir(9, 5, true);
    assert_eq!(s.verify(CheckpointId(5)).unwrap(), five);
    assert_eq!(restorable(h), Some(CheckpointId(5)), "{}", h.name());
}

/// `cp -r chk-…05 chk-…09`: the copy's manifest names 5 and references the files of 5, which are
/// intact, so only the id tells it apart. It is skipped; 5 restores; deleting the copy, as the message
/// says, leaves the store as it was.
pub fn a_copied_checkpoint_directory_is_skipped_and_the_original_restores(h: &dyn Harness) {
    let s = h.store();
    let five = commit(s, 5, 1);
    h.copy_checkpoint_dir(5, 9, false);

    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(5, true), (9, true)]), "{}", h.name());
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(9)));
    assert_misplaced(h, s.read_manifest(CheckpointId(9)).unwrap_err(), 9, 5);
    assert_misplaced(h, s.verify(CheckpointId(9)).unwrap_err(), 9, 5);
    assert_eq!(s.verify(CheckpointId(5)).unwrap(), five);
    assert_eq!(restorable(h), Some(CheckpointId(5)), "{}", h.name());

    write(s, 6, "op", 0, b"an attempt between them");
    s.discard(CheckpointId(6)).unwrap();
    s.gc(2, &[]).unwrap();
    s.verify(CheckpointId(5)).unwrap();
    assert_misplaced(h, s.verify(CheckpointId(9)).unwrap_err(), 9, 5);

    for file in h.files().into_iter().filter(|f| f.starts_with(&format!("{}/", dir_of(9)))) {
        h.remove_raw(&file);
    }
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(5, true)]), "{}", h.name());
    assert_eq!(restorable(h), Some(CheckpointId(5)));
}

/// The manifest of another job's checkpoint 4, copied in by hand. The store does not know jobs: it
/// reads the manifest as it is (the runtime refuses it by its fingerprint), and verifying it finds
/// that its files are not here, as corruption; nothing panics.
pub fn a_manifest_of_another_job_is_read_and_reported_not_a_panic(h: &dyn Harness) {
    let other = h.fresh();
    let theirs =
        other.store().write_task_state(CheckpointId(4), &OperatorId::new("op"), SubtaskIndex(0), 1, None, b"theirs");
    let m = Manifest::new("another-job", CheckpointId(4), Generation(7), 0, false, vec![theirs.unwrap()]);
    other.store().commit_manifest(&m).unwrap();

    let s = h.store();
    commit(s, 3, 1);
    s.claim_generation(&record(2, Some(3), "host-2")).unwrap(); // could fence 4: its manifest is read
    h.put_raw(&manifest_path(4), &other.get_raw(&manifest_path(4)).unwrap());

    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(3, true), (4, true)]), "{}", h.name());
    let read = s.read_manifest(CheckpointId(4)).unwrap();
    assert_eq!(read, m);
    assert_eq!(read.job_fingerprint, "another-job");
    let err = s.verify(CheckpointId(4)).unwrap_err();
    assert!(matches!(err, StorageError::NotFound { .. }) && err.is_corruption(), "{}: {err}", h.name());
    assert_eq!(restorable(h), Some(CheckpointId(3)), "{}", h.name());
    assert!(matches!(s.discard(CheckpointId(4)), Err(StorageError::DiscardComplete(CheckpointId(4)))));
    s.gc(2, &[]).unwrap();
    s.verify(CheckpointId(3)).unwrap();
}

/// Checkpoint ids and generations at `u64::MAX` are names like any other: committed, listed, verified,
/// fenced (or not), claimed, superseded, finished, retained and discarded without overflow.
pub fn ids_and_generations_at_u64_max_work(h: &dyn Harness) {
    const MAX: u64 = u64::MAX;
    let s = h.store();
    s.claim_generation(&record(MAX - 1, None, "older")).unwrap();
    let below = commit(s, MAX - 1, MAX - 1);
    s.claim_generation(&record(MAX, Some(MAX - 1), "newest")).unwrap();
    let top = commit(s, MAX, MAX);
    for path in [manifest_path(MAX), generation_path(MAX)] {
        assert!(h.files().contains(&path), "{}: {path} in {:?}", h.name(), h.files());
    }
    assert!(manifest_path(MAX).contains("chk-18446744073709551615/"));

    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(MAX - 1, true), (MAX, true)]), "{}", h.name());
    assert_eq!(s.max_checkpoint_id_seen().unwrap(), Some(CheckpointId(MAX)));
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(MAX)));
    assert_eq!(s.read_manifest(CheckpointId(MAX)).unwrap(), top);
    assert_eq!(s.verify(CheckpointId(MAX)).unwrap(), top);
    assert_eq!(s.verify(CheckpointId(MAX - 1)).unwrap(), below);

    assert_eq!(s.generations().unwrap(), vec![record(MAX - 1, None, "older"), record(MAX, Some(MAX - 1), "newest")]);
    assert_eq!(s.latest_generation().unwrap(), Some(record(MAX, Some(MAX - 1), "newest")));
    s.check_not_fenced(Generation(MAX)).unwrap();
    match s.check_not_fenced(Generation(MAX - 1)) {
        Err(StorageError::Superseded { newer, owner, .. }) => {
            assert_eq!((newer, owner.as_str()), (Generation(MAX), "newest"))
        }
        other => panic!("{}: expected Superseded, got {other:?}", h.name()),
    }
    assert!(matches!(
        s.claim_generation(&record(MAX, None, "again")),
        Err(StorageError::GenerationTaken { generation: Generation(MAX), .. })
    ));
    assert!(matches!(
        s.claim_generation(&record(0, None, "oldest")),
        Err(StorageError::Superseded { newer: Generation(MAX), .. })
    ));

    let meta =
        JobMeta { job_fingerprint: "fp".into(), generation: Generation(MAX), epoch_lease_end: CheckpointId(MAX) };
    s.write_meta(&meta).unwrap();
    assert_eq!(s.read_meta().unwrap(), Some(meta));
    s.mark_finished(CheckpointId(MAX)).unwrap();
    assert_eq!(s.finished().unwrap(), Some(CheckpointId(MAX)));

    let report = s.gc(1, &[]).unwrap();
    assert_eq!(report.removed_checkpoints, vec![CheckpointId(MAX - 1)], "{}", h.name());
    assert_eq!(report.removed_generations, vec![], "{}: the newest two records stay", h.name());
    s.verify(CheckpointId(MAX)).unwrap();
    assert!(matches!(s.discard(CheckpointId(MAX)), Err(StorageError::DiscardComplete(CheckpointId(MAX)))));
    s.release_generation(Generation(MAX)).unwrap();
    assert_eq!(s.latest_generation().unwrap().map(|r| r.generation), Some(Generation(MAX - 1)));
    s.check_not_fenced(Generation(MAX - 1)).unwrap();
}

/// Twenty digits can spell numbers past `u64::MAX`: such directories and records are not cutline's
/// names, so they are ignored (and kept), like any unrelated entry.
pub fn names_beyond_u64_max_are_ignored(h: &dyn Harness) {
    let s = h.store();
    commit(s, 5, 1);
    let manifest_bytes = h.get_raw(&manifest_path(5)).unwrap();
    let record_bytes = framed(FileKind::GenerationRecord, &record(9, None, "x"));
    let planted = [
        ("checkpoints/chk-18446744073709551616/_MANIFEST", &manifest_bytes),
        ("checkpoints/chk-99999999999999999999/_MANIFEST", &manifest_bytes),
        ("generations/gen-18446744073709551616", &record_bytes),
        ("generations/gen-99999999999999999999", &record_bytes),
    ];
    for (path, bytes) in planted {
        h.put_raw(path, bytes);
    }
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(5, true)]), "{}", h.name());
    assert_eq!(s.max_checkpoint_id_seen().unwrap(), Some(CheckpointId(5)));
    assert_eq!(s.generations().unwrap(), vec![]);
    assert_eq!(s.latest_generation().unwrap(), None);
    s.check_not_fenced(Generation(1)).unwrap();
    s.gc(1, &[]).unwrap();
    for (path, bytes) in planted {
        assert_eq!(h.get_raw(path).as_ref(), Some(bytes), "{}: {path} was touched", h.name());
    }
}

/// A manifest (planted: `commit_manifest` refuses sizes it did not write) whose recorded sizes add up
/// past `u64::MAX`: its total saturates instead of overflowing, and verifying it reports the sizes.
pub fn sizes_near_u64_max_in_a_manifest_do_not_overflow(h: &dyn Harness) {
    let s = h.store();
    let mut a = write(s, 3, "op", 0, b"x");
    let mut b = write(s, 3, "op", 1, b"y");
    a.size_bytes = u64::MAX;
    b.size_bytes = u64::MAX / 2 + 2;
    h.put_raw(&manifest_path(3), &framed(FileKind::Manifest, &manifest(3, vec![a, b])));
    let read = s.read_manifest(CheckpointId(3)).unwrap();
    assert_eq!(read.total_size_bytes(), u64::MAX, "{}", h.name());
    let err = s.verify(CheckpointId(3)).unwrap_err();
    assert!(matches!(err, StorageError::SizeMismatch { expected: u64::MAX, .. }), "{}: {err}", h.name());
    assert!(err.is_corruption());
    assert_eq!(restorable(h), None);
    s.gc(1, &[]).unwrap();
}
