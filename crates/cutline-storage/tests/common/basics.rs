//! The store contract: task state, the manifest as commit point, listing, verification, discard,
//! damage, crash leftovers, job metadata, and concurrent clients.

use super::{dir_of, framed, listing, manifest, manifest_path, race, write, Harness};
use cutline_core::{CheckpointId, Generation, OperatorId, SubtaskIndex};
use cutline_storage::{encode_frame, CheckpointStore, FileKind, JobMeta, Manifest, StorageError, TaskStateHandle};
use std::sync::Arc;

pub fn write_commit_list_verify(h: &dyn Harness) {
    let s = h.store();
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
    // What a restore reads: each task's chain, handed over as it is verified.
    let mut handed = Vec::new();
    assert_eq!(s.verify_reading(CheckpointId(1), &mut |h, chain| handed.push((h.clone(), chain))).unwrap(), m);
    assert_eq!(handed, vec![(a.clone(), vec![b"alpha".to_vec()]), (b.clone(), vec![b"beta, retried".to_vec()])]);
    assert_eq!(s.read_task_state(&a).unwrap(), b"alpha");

    write(s, 3, "src", 0, b"later attempt");
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(1, true), (3, false)]));
    assert_eq!(s.max_checkpoint_id_seen().unwrap(), Some(CheckpointId(3)));
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(1)));
    assert!(matches!(s.read_manifest(CheckpointId(3)), Err(StorageError::NotFound { .. })));
    assert!(h.files().iter().all(|f| !f.ends_with(".tmp")), "{}: {:?}", h.name(), h.files());
    // Exactly the layout, the same on every store, and no temporary files.
    assert_eq!(
        h.files(),
        vec![
            manifest_path(1),
            format!("{}/map.1-0.state", dir_of(1)),
            format!("{}/map.1-1.state", dir_of(1)),
            format!("{}/src-0.state", dir_of(3)),
        ],
        "{}",
        h.name()
    );
}

pub fn committed_checkpoints_are_immutable(h: &dyn Harness) {
    let s = h.store();
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

pub fn discard_removes_attempts_and_refuses_complete(h: &dyn Harness) {
    let s = h.store();
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

pub fn discard_keeps_files_a_later_manifest_references(h: &dyn Harness) {
    let s = h.store();
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
pub fn damaged_task_file_fails_verify(h: &dyn Harness) {
    type Damage = fn(&dyn Harness, &str);
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
            |h, p| h.put_raw(p, &encode_frame(FileKind::TaskState, b"payloaD")),
            |e| matches!(e, StorageError::ChecksumMismatch { .. }),
        ),
    ];
    let s = h.store();
    for (i, (what, damage, expect)) in cases.into_iter().enumerate() {
        let id = 10 + i as u64;
        let good = write(s, id, "ok", 0, b"fine");
        let bad = write(s, id, "victim", 0, b"payload");
        s.commit_manifest(&manifest(id, vec![good, bad.clone()])).unwrap();
        s.verify(CheckpointId(id)).unwrap();
        damage(h, &bad.file);
        let err = s.verify(CheckpointId(id)).unwrap_err();
        assert!(expect(&err), "{}: {what}: got {err}", h.name());
        assert!(err.is_corruption() && !err.is_transient(), "{}: {what}: {err}", h.name());
        assert!(err.to_string().contains(&h.shown(&bad.file)), "{}: {what}: names the file: {err}", h.name());
        assert!(s.read_task_state(&bad).is_err());
    }
    // A missing file.
    let gone = write(s, 30, "victim", 0, b"payload");
    s.commit_manifest(&manifest(30, vec![gone.clone()])).unwrap();
    s.discard(CheckpointId(29)).unwrap();
    let all = h.snapshot();
    assert!(all.iter().any(|(p, _)| *p == gone.file));
    let mut handle = gone;
    handle.file = format!("{}/nope-0.state", dir_of(30));
    assert!(matches!(s.read_task_state(&handle), Err(StorageError::NotFound { .. })));
}

pub fn damaged_manifest_fails_read(h: &dyn Harness) {
    let s = h.store();
    let a = write(s, 4, "op", 0, b"x");
    s.commit_manifest(&manifest(4, vec![a])).unwrap();
    let path = manifest_path(4);
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

/// Temporary names (a crash between writing a temporary file and renaming it; an object store never
/// writes them, but another writer or a copied local store may have left them) are not commits, and gc
/// cleans them up outside in-flight attempts.
pub fn temp_manifest_left_by_a_crash_is_not_a_commit(h: &dyn Harness) {
    let s = h.store();
    let a = write(s, 5, "op", 0, b"x");
    let m = manifest(5, vec![a]);
    // The crash hit after the temporary manifest was written but before the rename.
    let temp = format!("{}/._MANIFEST.4242-0.tmp", dir_of(5));
    h.put_raw(&temp, &framed(FileKind::Manifest, &m));
    h.put_raw(".job.meta.4242-1.tmp", b"half");
    assert_eq!(s.list_checkpoints().unwrap(), listing(&[(5, false)]));
    assert!(matches!(s.read_manifest(CheckpointId(5)), Err(StorageError::NotFound { .. })));
    assert_eq!(s.read_meta().unwrap(), None);
    // In flight: gc leaves the attempt alone, but cleans the root.
    s.gc(1, &[CheckpointId(5)]).unwrap();
    assert!(h.get_raw(&temp).is_some(), "{}: gc left the in-flight attempt alone", h.name());
    assert!(h.get_raw(".job.meta.4242-1.tmp").is_none());
    // The retried commit succeeds; the next gc removes the leftover.
    s.commit_manifest(&m).unwrap();
    let report = s.gc(1, &[]).unwrap();
    assert_eq!(report.removed_files, 1);
    assert_eq!(report.removed_checkpoints, vec![]);
    assert!(h.get_raw(&temp).is_none());
    s.verify(CheckpointId(5)).unwrap();
}

pub fn meta_and_finished_roundtrip(h: &dyn Harness) {
    let s = h.store();
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

pub fn unrelated_entries_are_ignored_and_kept(h: &dyn Harness) {
    let s = h.store();
    let junk = [
        "checkpoints/chk-12/state",
        "checkpoints/chk-0000000000000000000x/y",
        "checkpoints/notes.txt",
        "checkpoints/chk-00000000000000000009.bak/z",
        // A file where a checkpoint directory belongs.
        "checkpoints/chk-00000000000000000003",
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
        assert!(h.get_raw(path).is_some(), "{}: gc removed {path}", h.name());
    }
    assert!(s.read_manifest(CheckpointId(3)).is_err());
}

pub fn invalid_ids_and_references_are_rejected(h: &dyn Harness) {
    let s = h.store();
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

/// Retention must not fail, nor delete anything of a retained checkpoint, when that checkpoint's
/// manifest is damaged: a restore skips it and may fall back to an older one.
pub fn gc_keeps_a_retained_checkpoint_whose_manifest_is_damaged_whole(h: &dyn Harness) {
    let s = h.store();
    for id in 1..=3 {
        let t = s.write_task_state(CheckpointId(id), &OperatorId::new("op"), SubtaskIndex(0), 1, None, b"state");
        s.commit_manifest(&Manifest::new("job", CheckpointId(id), Generation(1), 0, false, vec![t.unwrap()])).unwrap();
    }
    let path = manifest_path(3);
    let middle = h.get_raw(&path).unwrap().len() / 2;
    h.flip_byte(&path, middle);
    s.gc(2, &[]).expect("a damaged manifest does not fail retention");
    let paths = h.files();
    assert_eq!(paths.iter().filter(|p| p.starts_with(&dir_of(3))).count(), 2, "{}: {paths:?}", h.name());
    assert!(paths.iter().any(|p| p.starts_with(&dir_of(2))), "{}: the fallback stays: {paths:?}", h.name());
    assert!(!paths.iter().any(|p| p.starts_with(&dir_of(1))), "{}: older ones go: {paths:?}", h.name());
    assert!(s.verify(CheckpointId(3)).is_err());
    s.verify(CheckpointId(2)).unwrap();
}

/// Two clients (as two coordinators in two processes would have) commit different manifests of the
/// same checkpoint at the same moment: exactly one wins, and the stored manifest is the winner's.
pub fn of_two_racing_committers_exactly_one_wins(h: &dyn Harness) {
    let stores = [h.shared(), h.another_client()];
    for id in 1..=h.budget().race_rounds {
        let task = write(h.store(), id, "op", 0, format!("state {id}").as_bytes());
        let work = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let mut m = manifest(id, vec![task.clone()]);
                m.created_at_unix_ms = 10 * id + i as u64; // different bytes per committer
                (store.clone(), m)
            })
            .collect();
        let results = race(work, |s, m| s.commit_manifest(m));
        let winners: Vec<&Manifest> = results.iter().filter(|(_, r)| r.is_ok()).map(|(m, _)| m).collect();
        assert_eq!(winners.len(), 1, "{}: checkpoint {id}: {results:?}", h.name());
        for (_, r) in &results {
            if let Err(e) = r {
                assert!(matches!(e, StorageError::ManifestExists(c) if *c == CheckpointId(id)), "{e}");
            }
        }
        for store in &stores {
            assert_eq!(&store.read_manifest(CheckpointId(id)).unwrap(), winners[0]);
        }
    }
    assert!(h.files().iter().all(|f| !f.ends_with(".tmp")), "{}: {:?}", h.name(), h.files());
}

/// Tasks write concurrently from many threads through one shared store.
pub fn tasks_write_concurrently_through_one_store(h: &dyn Harness) {
    let store: Arc<dyn CheckpointStore> = h.shared();
    let threads: Vec<_> = (0..8u32)
        .map(|sub| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..5u64)
                    .map(|id| write(&*store, id + 1, "op", sub, format!("{id}/{sub}").as_bytes()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let handles: Vec<Vec<TaskStateHandle>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for id in 1..=5u64 {
        let tasks: Vec<TaskStateHandle> = handles.iter().map(|hs| hs[(id - 1) as usize].clone()).collect();
        store.commit_manifest(&manifest(id, tasks)).unwrap();
        let m = store.verify(CheckpointId(id)).unwrap();
        for t in &m.tasks {
            assert_eq!(store.read_task_state(t).unwrap(), format!("{}/{}", id - 1, t.subtask.0).into_bytes());
        }
    }
    assert_eq!(store.latest_complete().unwrap(), Some(CheckpointId(5)));
}
