//! The store contract, pinned once and run against every store.

use super::{dir_of, manifest, Harness};
use crate::{CheckpointListing, CheckpointStore, JobMeta, StorageError, TaskStateHandle};
use cutline_core::{CheckpointId, Generation, KeyGroupRange, OperatorId, SubtaskIndex};
use std::io::{Error, ErrorKind};

fn write(s: &dyn CheckpointStore, id: u64, op: &str, sub: u32, payload: &[u8]) -> TaskStateHandle {
    let kg = KeyGroupRange::for_subtask(128, 2, sub % 2);
    s.write_task_state(CheckpointId(id), &OperatorId::new(op), SubtaskIndex(sub), 2, Some(kg), payload).unwrap()
}

fn listing(pairs: &[(u64, bool)]) -> Vec<CheckpointListing> {
    pairs.iter().map(|&(id, complete)| CheckpointListing { id: CheckpointId(id), complete, fenced: false }).collect()
}

fn write_commit_list_verify(h: &Harness) {
    let s = &*h.store;
    assert_eq!(s.list_checkpoints().unwrap(), vec![]);
    let a = write(s, 1, "map.1", 0, b"alpha");
    let b = write(s, 1, "map.1", 1, b"beta");
    assert_eq!(a.file, format!("{}/map.1-0.state", dir_of(1)));
    assert_eq!(a.size_bytes, 5 + 20);
    let raw = h.get_raw(&a.file).unwrap();
    assert_eq!(a.crc32.to_le_bytes(), raw[raw.len() - 4..]);
    // A retried write replaces the file.
    let b = {
        let retried = write(s, 1, "map.1", 1, b"beta, retried");
        assert_eq!(retried.file, b.file);
        retried
    };
    assert_eq!(s.read_task_state(&b).unwrap(), b"beta, retried");
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, false)]));
    assert_eq!(s.latest_complete().unwrap(), None);

    let m = manifest(1, vec![a.clone(), b.clone()]);
    assert_eq!(m.total_size_bytes(), a.size_bytes + b.size_bytes);
    s.commit_manifest(&m).unwrap();
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, true)]));
    assert_eq!(s.read_manifest(CheckpointId(1)).unwrap(), m);
    assert_eq!(s.verify(CheckpointId(1)).unwrap(), m);
    assert_eq!(s.read_task_state(&a).unwrap(), b"alpha");

    write(s, 3, "src", 0, b"later attempt");
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, true), (3, false)]));
    assert_eq!(s.max_checkpoint_id_seen().unwrap(), Some(CheckpointId(3)));
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(1)));
    assert!(matches!(s.read_manifest(CheckpointId(3)), Err(StorageError::NotFound { .. })));
    assert!(h.files().iter().all(|f| !f.ends_with(".tmp")), "{h:?}", h = h.files());
}

fn committed_checkpoints_are_immutable(h: &Harness) {
    let s = &*h.store;
    let a = write(s, 7, "op", 0, b"x");
    let m = manifest(7, vec![a]);
    s.commit_manifest(&m).unwrap();
    let before = h.snapshot();
    let mut other = m.clone();
    other.created_at_unix_ms += 1;
    assert!(matches!(s.commit_manifest(&other), Err(StorageError::ManifestExists(CheckpointId(7)))));
    assert!(matches!(
        s.write_task_state(CheckpointId(7), &OperatorId::new("op"), SubtaskIndex(0), 1, None, b"y"),
        Err(StorageError::ManifestExists(CheckpointId(7)))
    ));
    assert_eq!(h.snapshot(), before);
    assert_eq!(s.read_manifest(CheckpointId(7)).unwrap(), m);
}

fn discard_removes_attempts_and_refuses_complete(h: &Harness) {
    let s = &*h.store;
    let done = write(s, 1, "op", 0, b"done");
    s.commit_manifest(&manifest(1, vec![done])).unwrap();
    write(s, 2, "op", 0, b"aborted");
    write(s, 2, "op", 1, b"aborted too");
    h.put_raw(&format!("{}/._MANIFEST.1-1.tmp", dir_of(2)), b"half a manifest");
    s.discard(CheckpointId(2)).unwrap();
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, true)]));
    assert!(h.files().iter().all(|f| !f.starts_with(&dir_of(2))));
    s.discard(CheckpointId(2)).unwrap(); // idempotent
    s.discard(CheckpointId(99)).unwrap();
    let before = h.snapshot();
    let err = s.discard(CheckpointId(1)).unwrap_err();
    assert!(matches!(err, StorageError::DiscardComplete(CheckpointId(1))));
    assert_eq!(h.snapshot(), before);
    s.verify(CheckpointId(1)).unwrap();
}

fn discard_keeps_files_a_later_manifest_references(h: &Harness) {
    let s = &*h.store;
    // Attempt 1 never completed, but checkpoint 2 (incrementally) reuses one of its files.
    let shared = write(s, 1, "op", 0, b"shared");
    write(s, 1, "op", 1, b"private");
    let own = write(s, 2, "op", 1, b"own");
    s.commit_manifest(&manifest(2, vec![shared.clone(), own])).unwrap();
    s.discard(CheckpointId(1)).unwrap();
    s.verify(CheckpointId(2)).unwrap();
    let left: Vec<String> = h.files().into_iter().filter(|f| f.starts_with(&dir_of(1))).collect();
    assert_eq!(left, vec![shared.file]);
}

/// Each kind of damage to a committed task file, and the error verify must report.
fn damaged_task_file_fails_verify(h: &Harness) {
    type Damage = fn(&Harness, &str);
    type Expect = fn(&StorageError) -> bool;
    let cases: Vec<(&str, Damage, Expect)> = vec![
        ("flip in header", |h, p| h.flip_byte(p, 0), |e| matches!(e, StorageError::ChecksumMismatch { .. })),
        ("flip in payload", |h, p| h.flip_byte(p, 17), |e| matches!(e, StorageError::ChecksumMismatch { .. })),
        (
            "flip in checksum",
            |h, p| {
                let len = h.get_raw(p).unwrap().len();
                h.flip_byte(p, len - 1)
            },
            |e| matches!(e, StorageError::ChecksumMismatch { .. }),
        ),
        (
            "truncated",
            |h, p| {
                let bytes = h.get_raw(p).unwrap();
                h.put_raw(p, &bytes[..bytes.len() - 3])
            },
            |e| matches!(e, StorageError::SizeMismatch { .. }),
        ),
        (
            "grown",
            |h, p| {
                let mut bytes = h.get_raw(p).unwrap();
                bytes.push(0);
                h.put_raw(p, &bytes)
            },
            |e| matches!(e, StorageError::SizeMismatch { .. }),
        ),
        (
            "replaced by another valid frame of the same size",
            |h, p| h.put_raw(p, &crate::encode_frame(crate::FileKind::TaskState, b"payloaD")),
            |e| matches!(e, StorageError::ChecksumMismatch { .. }),
        ),
    ];
    for (i, (what, damage, expect)) in cases.into_iter().enumerate() {
        let id = 10 + i as u64;
        let good = write(h.store.as_ref(), id, "ok", 0, b"fine");
        let bad = write(h.store.as_ref(), id, "victim", 0, b"payload");
        h.store.commit_manifest(&manifest(id, vec![good, bad.clone()])).unwrap();
        h.store.verify(CheckpointId(id)).unwrap();
        damage(h, &bad.file);
        let err = h.store.verify(CheckpointId(id)).unwrap_err();
        assert!(expect(&err), "{}: {what}: got {err}", h.name);
        assert!(!err.is_transient());
        assert!(h.store.read_task_state(&bad).is_err());
    }
    // A missing file.
    let gone = write(h.store.as_ref(), 30, "victim", 0, b"payload");
    h.store.commit_manifest(&manifest(30, vec![gone.clone()])).unwrap();
    h.store.discard(CheckpointId(29)).unwrap();
    let all = h.snapshot();
    assert!(all.iter().any(|(p, _)| *p == gone.file));
    let mut handle = gone;
    handle.file = format!("{}/nope-0.state", dir_of(30));
    assert!(matches!(h.store.read_task_state(&handle), Err(StorageError::NotFound { .. })));
}

fn damaged_manifest_fails_read(h: &Harness) {
    let s = &*h.store;
    let a = write(s, 4, "op", 0, b"x");
    s.commit_manifest(&manifest(4, vec![a])).unwrap();
    let path = format!("{}/_MANIFEST", dir_of(4));
    let len = h.get_raw(&path).unwrap().len();
    for at in [0, 5, 9, len / 2, len - 1] {
        h.flip_byte(&path, at);
        assert!(s.read_manifest(CheckpointId(4)).is_err(), "flip at {at}");
        assert!(s.verify(CheckpointId(4)).is_err(), "flip at {at}");
        h.flip_byte(&path, at);
    }
    s.verify(CheckpointId(4)).unwrap();
    // A task state file is not a manifest.
    let state = h.get_raw(&format!("{}/op-0.state", dir_of(4))).unwrap();
    h.put_raw(&path, &state);
    assert!(matches!(s.read_manifest(CheckpointId(4)), Err(StorageError::WrongKind { .. })));
}

fn temp_manifest_left_by_a_crash_is_not_a_commit(h: &Harness) {
    let s = &*h.store;
    let a = write(s, 5, "op", 0, b"x");
    let m = manifest(5, vec![a]);
    // The crash hit after the temporary manifest was written but before the rename.
    let whole = crate::format::encode_record(crate::FileKind::Manifest, &m);
    let temp = format!("{}/._MANIFEST.4242-0.tmp", dir_of(5));
    h.put_raw(&temp, &whole);
    h.put_raw(".job.meta.4242-1.tmp", b"half");
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(5, false)]));
    assert!(matches!(s.read_manifest(CheckpointId(5)), Err(StorageError::NotFound { .. })));
    assert_eq!(s.read_meta().unwrap(), None);
    // In flight: gc leaves the attempt alone, but cleans the root.
    s.gc(1, &[CheckpointId(5)]).unwrap();
    assert!(h.get_raw(&temp).is_some());
    assert!(h.get_raw(".job.meta.4242-1.tmp").is_none());
    // The retried commit succeeds; the next gc removes the leftover.
    s.commit_manifest(&m).unwrap();
    let report = s.gc(1, &[]).unwrap();
    assert_eq!(report.removed_files, 1);
    assert_eq!(report.removed_checkpoints, vec![]);
    assert!(h.get_raw(&temp).is_none());
    s.verify(CheckpointId(5)).unwrap();
}

fn meta_and_finished_roundtrip(h: &Harness) {
    let s = &*h.store;
    assert_eq!(s.read_meta().unwrap(), None);
    assert_eq!(s.finished().unwrap(), None);
    for gen in 1..4 {
        let meta = JobMeta {
            job_fingerprint: "fp".into(),
            generation: Generation(gen),
            epoch_lease_end: CheckpointId(gen * 100),
        };
        s.write_meta(&meta).unwrap();
        assert_eq!(s.read_meta().unwrap(), Some(meta));
    }
    assert!(matches!(s.mark_finished(CheckpointId(3)), Err(StorageError::NotFound { .. })));
    let a = write(s, 3, "op", 0, b"last");
    let mut m = manifest(3, vec![a]);
    m.is_final = true;
    s.commit_manifest(&m).unwrap();
    s.mark_finished(CheckpointId(3)).unwrap();
    assert_eq!(s.finished().unwrap(), Some(CheckpointId(3)));
    assert!(s.read_manifest(CheckpointId(3)).unwrap().is_final);
    h.flip_byte("job.meta", 3);
    assert!(matches!(s.read_meta(), Err(StorageError::BadMagic { .. })));
    assert!(h.files().iter().all(|f| !f.ends_with(".tmp")));
}

fn unrelated_entries_are_ignored_and_kept(h: &Harness) {
    let s = &*h.store;
    let junk = [
        "checkpoints/chk-12/state",
        "checkpoints/chk-0000000000000000000x/y",
        "checkpoints/notes.txt",
        "checkpoints/chk-00000000000000000009.bak/z",
        "README",
    ];
    for path in junk {
        h.put_raw(path, b"not cutline's");
    }
    let a = write(s, 2, "op", 0, b"x");
    s.commit_manifest(&manifest(2, vec![a])).unwrap();
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(2, true)]));
    s.gc(1, &[]).unwrap();
    for path in junk {
        assert!(h.get_raw(path).is_some(), "{}: gc removed {path}", h.name);
    }
}

fn invalid_ids_and_references_are_rejected(h: &Harness) {
    let s = &*h.store;
    for bad in ["", "a/b", "../up", "a b", "é"] {
        let err =
            s.write_task_state(CheckpointId(1), &OperatorId::new(bad), SubtaskIndex(0), 1, None, b"").unwrap_err();
        assert!(matches!(err, StorageError::InvalidOperatorId(ref s) if s == bad));
    }
    let mut handle = write(s, 1, "op", 0, b"x");
    for bad in ["../outside", "/etc/passwd", "checkpoints/../../x"] {
        handle.file = bad.to_string();
        assert!(matches!(s.read_task_state(&handle), Err(StorageError::InvalidPath(_))));
    }
    assert!(h.files().iter().all(|f| f.starts_with("checkpoints/")));
}

#[test]
fn write_commit_list_verify_on_every_store() {
    Harness::both().iter().for_each(write_commit_list_verify);
}

#[test]
fn committed_checkpoints_are_immutable_on_every_store() {
    Harness::both().iter().for_each(committed_checkpoints_are_immutable);
}

#[test]
fn discard_removes_attempts_and_refuses_complete_on_every_store() {
    Harness::both().iter().for_each(discard_removes_attempts_and_refuses_complete);
}

#[test]
fn discard_keeps_referenced_files_on_every_store() {
    Harness::both().iter().for_each(discard_keeps_files_a_later_manifest_references);
}

#[test]
fn damaged_task_file_fails_verify_on_every_store() {
    Harness::both().iter().for_each(damaged_task_file_fails_verify);
}

#[test]
fn damaged_manifest_fails_read_on_every_store() {
    Harness::both().iter().for_each(damaged_manifest_fails_read);
}

#[test]
fn temp_manifest_left_by_a_crash_is_not_a_commit_on_every_store() {
    Harness::both().iter().for_each(temp_manifest_left_by_a_crash_is_not_a_commit);
}

#[test]
fn meta_and_finished_roundtrip_on_every_store() {
    Harness::both().iter().for_each(meta_and_finished_roundtrip);
}

#[test]
fn unrelated_entries_are_ignored_and_kept_on_every_store() {
    Harness::both().iter().for_each(unrelated_entries_are_ignored_and_kept);
}

#[test]
fn invalid_ids_and_references_are_rejected_on_every_store() {
    Harness::both().iter().for_each(invalid_ids_and_references_are_rejected);
}

#[test]
#[should_panic(expected = "may only reference acknowledged task state writes")]
fn commit_of_a_manifest_with_a_missing_file_panics() {
    let h = Harness::mem();
    let mut a = write(&*h.store, 1, "op", 0, b"x");
    a.size_bytes += 1;
    let _ = h.store.commit_manifest(&manifest(1, vec![a]));
}

#[test]
fn mem_store_corrupt_flips_a_byte() {
    let store = crate::MemStore::new();
    let a = write(&store, 1, "op", 0, b"payload");
    store.commit_manifest(&manifest(1, vec![a.clone()])).unwrap();
    assert_eq!(store.paths(), vec![format!("{}/_MANIFEST", dir_of(1)), a.file.clone()]);
    store.corrupt(&a.file);
    assert!(matches!(store.verify(CheckpointId(1)), Err(StorageError::ChecksumMismatch { .. })));
}

#[test]
fn only_interrupted_io_and_injected_failures_are_transient() {
    let io = |kind| StorageError::io("p", "read", Error::from(kind));
    let cases = [
        (io(ErrorKind::Interrupted), true),
        (io(ErrorKind::TimedOut), true),
        (io(ErrorKind::WouldBlock), true),
        (StorageError::Injected("drill".into()), true),
        (io(ErrorKind::NotFound), false),
        (io(ErrorKind::PermissionDenied), false),
        (StorageError::BadMagic { path: "p".into() }, false),
        (StorageError::ChecksumMismatch { path: "p".into(), expected: 1, actual: 2 }, false),
        (StorageError::ManifestExists(CheckpointId(1)), false),
    ];
    for (err, transient) in cases {
        assert_eq!(err.is_transient(), transient, "{err}");
    }
}
