use super::{
    frame_encoded, frame_payload, write_streamed, ElementState, Encoded, KeyedStream, StreamFailure, TaskStatePayload,
};
use cutline_core::{CheckpointId, KeyGroupRange, OperatorId, SubtaskIndex};
use cutline_storage::{CheckpointStore, LocalDirStore, TaskStateFrame};
use std::path::Path;

fn blob(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed) as u8).collect()
}

/// Every kind of element, with empty and long blobs (lengths whose varints take one, two and three
/// bytes).
fn elements() -> Vec<(String, ElementState)> {
    vec![
        ("source".into(), ElementState::Plain(blob(1, 9))),
        ("empty".into(), ElementState::Plain(Vec::new())),
        (
            "count".into(),
            ElementState::Keyed {
                max_parallelism: 128,
                groups: vec![(0, blob(2, 0)), (5, blob(3, 127)), (77, blob(4, 128)), (127, blob(5, 20_000))],
            },
        ),
        ("nothing".into(), ElementState::Keyed { max_parallelism: 4096, groups: Vec::new() }),
        (
            "window".into(),
            ElementState::KeyedDelta {
                max_parallelism: 300,
                groups: vec![(3, blob(6, 200), Vec::new()), (299, Vec::new(), blob(7, 17_000))],
            },
        ),
    ]
}

#[test]
fn a_frame_built_as_blobs_are_let_go_of_holds_the_payload_postcard_writes() {
    let expected = postcard::to_allocvec(&TaskStatePayload { elements: elements() }).unwrap();
    let built = frame_payload(elements()).unwrap();
    assert_eq!(built.bytes().unwrap(), TaskStateFrame::new(&expected).bytes().unwrap());
    let back: TaskStatePayload = postcard::from_bytes(&expected).unwrap();
    assert_eq!(format!("{:?}", back.elements), format!("{:?}", elements()));
}

#[test]
fn each_element_alone_frames_as_postcard_writes_it() {
    for element in elements() {
        let expected = postcard::to_allocvec(&TaskStatePayload { elements: vec![element] }).unwrap();
        let element = postcard::from_bytes::<TaskStatePayload>(&expected).unwrap().elements;
        assert_eq!(frame_payload(element).unwrap().bytes().unwrap(), TaskStateFrame::new(&expected).bytes().unwrap());
    }
}

/// A streamed element of groups 8..16 that produces `groups` as they are given.
fn streamed(spool: &Path, groups: Vec<(u32, Vec<u8>)>, fail: Option<&'static str>) -> Encoded {
    Encoded::Stream(KeyedStream {
        max_parallelism: 128,
        range: KeyGroupRange { start: 8, end: 16 },
        spool: spool.to_path_buf(),
        produce: Box::new(move |emit| {
            for (kg, blob) in &groups {
                emit(*kg, blob)?;
            }
            fail.map_or(Ok(()), |e| Err(e.to_string()))
        }),
    })
}

#[test]
fn a_streamed_element_is_built_in_a_file_and_stored_as_the_whole_keyed_state_of_its_range() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("task.spool");
    let produced = vec![(9, blob(1, 300)), (10, blob(2, 5)), (14, blob(3, 70_000))];
    let frame = frame_encoded(vec![
        ("source".into(), ElementState::Plain(blob(4, 9)).into()),
        ("count".into(), streamed(&spool, produced.clone(), None)),
    ])
    .unwrap();
    assert!(frame.is_spooled() && spool.exists(), "built in the spool file");
    // What a reader expects: every group of the range, in order, the empty ones too.
    let groups = (8..16).map(|kg| (kg, produced.iter().find(|(g, _)| *g == kg).map_or(Vec::new(), |(_, b)| b.clone())));
    let expected = TaskStatePayload {
        elements: vec![
            ("source".into(), ElementState::Plain(blob(4, 9))),
            ("count".into(), ElementState::Keyed { max_parallelism: 128, groups: groups.collect() }),
        ],
    };
    let store = LocalDirStore::open(dir.path().join("store")).unwrap();
    let at = (CheckpointId(1), OperatorId::new("op"), SubtaskIndex(0));
    let handle = store.write_task_frame(at.0, &at.1, at.2, 1, None, &frame).unwrap();
    drop(frame);
    assert!(!spool.exists(), "the spool file goes with its frame");
    assert_eq!(store.read_task_state(&handle).unwrap(), postcard::to_allocvec(&expected).unwrap());
}

#[test]
fn a_stream_that_fails_or_gives_its_groups_out_of_order_is_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("task.spool");
    let cases = [
        (vec![(9, blob(1, 3))], Some("the store failed"), "the store failed"),
        (vec![(10, blob(1, 3)), (9, blob(1, 3))], None, "out of order"),
        (vec![(9, blob(1, 3)), (9, blob(1, 3))], None, "out of order"),
        (vec![(16, blob(1, 3))], None, "outside 8..16"),
    ];
    for (groups, fail, error) in cases {
        let Err(e) = frame_encoded(vec![("count".into(), streamed(&spool, groups, fail))]) else {
            panic!("expected {error}")
        };
        assert!(e.contains(error), "{e}");
        assert!(!spool.exists());
    }
}

/// A disk that fills after `room` bytes.
struct FillingDisk {
    room: usize,
}

impl std::io::Write for FillingDisk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.room == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device"));
        }
        let n = buf.len().min(self.room);
        self.room -= n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_disk_that_fills_while_a_stream_is_written_is_reported_as_a_full_disk_not_as_the_producers_failure() {
    // Regression: the producer, told only that its group could not be written, returned postcard's
    // "serialization error", and that was the checkpoint's failure.
    for room in [0, 5, 400] {
        let groups = vec![(9, blob(1, 300)), (10, blob(2, 5)), (14, blob(3, 7_000))];
        let elements = vec![("count".into(), streamed(Path::new("unused"), groups, None))];
        match write_streamed(elements, &mut FillingDisk { room }) {
            Err(StreamFailure::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::StorageFull, "{e}"),
            other => panic!("with room for {room} bytes: {other:?}"),
        }
    }
}
