//! Multipart uploads: a task state file built in a scratch file and larger than a part goes up in
//! parts, and an upload that fails is aborted (no upload left open, no object).

use super::{behind_a_proxy, remote_parts};
use cutline_core::{CheckpointId, OperatorId, SubtaskIndex};
use cutline_storage::{
    CheckpointStore, S3Store, StorageError, TaskStateFrame, TaskStateHandle, UPLOAD_PARTS_IN_FLIGHT, UPLOAD_PART_BYTES,
};
use std::sync::atomic::Ordering;

/// A task state file built in a scratch file (a whole snapshot of the disk backend) and larger than
/// a part goes up as a multipart upload, [`UPLOAD_PARTS_IN_FLIGHT`] parts at a time, and reads back
/// whole; through a server that drops requests, each part is retried alone. One no larger than a
/// part is one PUT.
#[test]
fn a_spooled_state_file_larger_than_a_part_is_uploaded_in_parts_and_reads_back_whole() {
    let (proxy, store, raw) = behind_a_proxy("multipart");
    let dir = tempfile::tempdir().unwrap();
    let part = UPLOAD_PART_BYTES as usize;
    for (at, len, parts, refused) in [(1, 2 * part + 12_345, Some(3), 3), (2, part - 64, None, 0)] {
        let mut x: u64 = at;
        let payload: Vec<u8> = (0..len)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        let frame = TaskStateFrame::spool(&dir.path().join(format!("{at}.spool")), |w| w.write_all(&payload)).unwrap();
        assert!(frame.is_spooled());
        proxy.refuse_puts_only.store(true, Ordering::SeqCst);
        proxy.refuse_next.store(refused, Ordering::SeqCst); // fewer than any part's attempts
        proxy.put_answer_delay_ms.store(100, Ordering::SeqCst); // a slow store: parts overlap
        let handle =
            store.write_task_frame(CheckpointId(at), &OperatorId::new("op"), SubtaskIndex(0), 1, None, &frame).unwrap();
        assert_eq!(proxy.refuse_next.load(Ordering::SeqCst), 0, "every refusal was met");
        assert_eq!(store.read_task_state(&handle).unwrap(), payload, "{len} bytes read back");
        let e_tag = raw.e_tag(&handle.file);
        match parts {
            Some(n) => assert!(e_tag.trim_matches('"').ends_with(&format!("-{n}")), "{n} parts: {e_tag}"),
            None => assert!(!e_tag.contains('-'), "one PUT: {e_tag}"),
        }
    }
    assert_eq!(proxy.refused.load(Ordering::SeqCst), 3);
    let at_once = proxy.most_puts_open.load(Ordering::SeqCst);
    assert!((2..=UPLOAD_PARTS_IN_FLIGHT).contains(&at_once), "{at_once} parts sent at once");
}

/// A part that fails as many times as the attempts fails the write with a transient error, and the
/// aborted upload leaves no object behind.
#[test]
fn a_multipart_upload_whose_part_fails_for_good_leaves_no_object() {
    let (proxy, store, raw) = behind_a_proxy("multipart-fails");
    let dir = tempfile::tempdir().unwrap();
    let payload = vec![7u8; UPLOAD_PART_BYTES as usize + 1];
    let frame = TaskStateFrame::spool(&dir.path().join("big.spool"), |w| w.write_all(&payload)).unwrap();
    proxy.refuse_puts_only.store(true, Ordering::SeqCst);
    // As many as the attempts of every part in flight: whichever way they fall, one part uses up
    // its attempts.
    proxy.refuse_next.store(4 * UPLOAD_PARTS_IN_FLIGHT, Ordering::SeqCst);
    let err =
        store.write_task_frame(CheckpointId(1), &OperatorId::new("op"), SubtaskIndex(0), 1, None, &frame).unwrap_err();
    assert_eq!(remote_parts(&err), (None, true, 4), "{err}");
    assert_eq!(raw.files(), Vec::<String>::new(), "no object, whole or in part");
}

// ---- a failed upload is aborted ------------------------------------------------------------------
//
// An open multipart upload is not an object: listings of objects do not show it, only S3's
// ListMultipartUploads does (`Raw::open_uploads`). Each test first opens an upload of its own beside
// the store's, `CANARY`, and leaves it open: that the listing shows it proves that the listing sees
// open uploads, so that an empty answer cannot pass for "none left open".

/// The key of the upload each test leaves open on purpose (see above).
const CANARY: &str = "canary.state";

/// A task state file of `len` bytes built in a scratch file in `dir`, and its payload.
fn spooled(dir: &std::path::Path, at: u64, len: usize) -> (TaskStateFrame, Vec<u8>) {
    let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ at as u8).collect();
    let frame = TaskStateFrame::spool(&dir.join(format!("{at}.spool")), |w| w.write_all(&payload)).unwrap();
    assert!(frame.is_spooled());
    (frame, payload)
}

fn write_spooled(store: &S3Store, at: u64, frame: &TaskStateFrame) -> Result<TaskStateHandle, StorageError> {
    store.write_task_frame(CheckpointId(at), &OperatorId::new("op"), SubtaskIndex(0), 1, None, frame)
}

/// A part that fails for good after another went through (the upload holds a part on the server)
/// fails the write, and the upload is aborted: none is left open under the prefix, and there is no
/// object.
#[test]
fn a_multipart_upload_whose_part_fails_for_good_is_aborted_and_left_open_nowhere() {
    let (proxy, store, raw) = behind_a_proxy("part-fails-aborted");
    let canary = raw.open_upload(CANARY);
    assert_eq!(raw.open_uploads(), vec![CANARY], "the listing sees an open upload");
    let dir = tempfile::tempdir().unwrap();
    let (frame, _) = spooled(dir.path(), 1, 2 * UPLOAD_PART_BYTES as usize + 1); // three parts
    proxy.refuse_puts_only.store(true, Ordering::SeqCst);
    proxy.pass_before_refusing.store(1, Ordering::SeqCst); // one part goes through
                                                           // As many as the attempts of every part in flight: one of the others uses up its attempts.
    proxy.refuse_next.store(4 * UPLOAD_PARTS_IN_FLIGHT, Ordering::SeqCst);
    let err = write_spooled(&store, 1, &frame).unwrap_err();
    assert_eq!(remote_parts(&err), (None, true, 4), "{err}");
    assert_eq!(proxy.pass_before_refusing.load(Ordering::SeqCst), 0, "a part went through first");
    assert_eq!(raw.open_uploads(), vec![CANARY], "the failed upload is not left open");
    assert_eq!(raw.files(), Vec::<String>::new(), "no object, whole or in part");
    raw.abort_upload(CANARY, &canary);
}

/// Every part is sent, but the completion fails for good: the write fails with the completion's
/// error, and the upload, all of whose parts are on the server, is aborted.
#[test]
fn a_multipart_upload_whose_completion_fails_for_good_is_aborted_and_left_open_nowhere() {
    let (proxy, store, raw) = behind_a_proxy("completion-fails-aborted");
    let canary = raw.open_upload(CANARY);
    let dir = tempfile::tempdir().unwrap();
    let (frame, _) = spooled(dir.path(), 1, UPLOAD_PART_BYTES as usize + 1);
    proxy.refuse_posts_only.store(true, Ordering::SeqCst);
    proxy.pass_before_refusing.store(1, Ordering::SeqCst); // the create
    proxy.refuse_next.store(4, Ordering::SeqCst); // every attempt of the completion
    let err = write_spooled(&store, 1, &frame).unwrap_err();
    assert_eq!(remote_parts(&err), (None, true, 4), "{err}");
    assert_eq!(proxy.refused.load(Ordering::SeqCst), 4, "the completion was refused, nothing else");
    assert_eq!(raw.open_uploads(), vec![CANARY], "the failed upload is not left open");
    assert_eq!(raw.files(), Vec::<String>::new(), "no object");
    raw.abort_upload(CANARY, &canary);
}

/// The server creates an upload but its answer is lost, so the retry creates a second one: the
/// write goes on with the second, and the first, which nothing would ever complete, is aborted
/// (else it stays open until a lifecycle rule removes it). Both when the write succeeds and when
/// it then fails.
#[test]
fn an_upload_created_twice_after_a_lost_answer_leaves_none_open() {
    let (proxy, store, raw) = behind_a_proxy("create-answer-lost");
    let canary = raw.open_upload(CANARY);
    let dir = tempfile::tempdir().unwrap();

    let (frame, payload) = spooled(dir.path(), 1, UPLOAD_PART_BYTES as usize + 1);
    proxy.swallow_next_create_upload.store(true, Ordering::SeqCst);
    let handle = write_spooled(&store, 1, &frame).unwrap();
    assert_eq!(proxy.swallowed.load(Ordering::SeqCst), 1, "the create's answer was swallowed");
    assert_eq!(store.read_task_state(&handle).unwrap(), payload);
    assert_eq!(raw.open_uploads(), vec![CANARY], "the upload whose answer was lost is not left open");

    let (frame, _) = spooled(dir.path(), 2, UPLOAD_PART_BYTES as usize + 1);
    proxy.swallow_next_create_upload.store(true, Ordering::SeqCst);
    proxy.refuse_puts_only.store(true, Ordering::SeqCst);
    proxy.refuse_next.store(4 * UPLOAD_PARTS_IN_FLIGHT, Ordering::SeqCst);
    let err = write_spooled(&store, 2, &frame).unwrap_err();
    assert_eq!(remote_parts(&err), (None, true, 4), "{err}");
    assert_eq!(proxy.swallowed.load(Ordering::SeqCst), 2, "the create's answer was swallowed");
    assert_eq!(raw.open_uploads(), vec![CANARY], "neither upload of the failed write is left open");
    assert_eq!(raw.files(), vec![handle.file.clone()], "no object of the failed write");
    raw.abort_upload(CANARY, &canary);
}
