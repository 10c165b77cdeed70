use super::{frame_payload, ElementState, TaskStatePayload};
use cutline_storage::TaskStateFrame;

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
    assert_eq!(built.bytes(), TaskStateFrame::new(&expected).bytes());
    let back: TaskStatePayload = postcard::from_bytes(&expected).unwrap();
    assert_eq!(format!("{:?}", back.elements), format!("{:?}", elements()));
}

#[test]
fn each_element_alone_frames_as_postcard_writes_it() {
    for element in elements() {
        let expected = postcard::to_allocvec(&TaskStatePayload { elements: vec![element] }).unwrap();
        let element = postcard::from_bytes::<TaskStatePayload>(&expected).unwrap().elements;
        assert_eq!(frame_payload(element).unwrap().bytes(), TaskStateFrame::new(&expected).bytes());
    }
}
