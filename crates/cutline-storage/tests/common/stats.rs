//! Checkpoint statistics: written after a checkpoint completed, read back by `cutline trace` and the
//! dashboard, pruned to the newest; damage is corruption; retention of checkpoints leaves them alone.

use super::{commit, write, Harness};
use cutline_core::CheckpointId;

fn stats_file(id: u64) -> String {
    format!("stats/chk-{id:020}")
}

pub fn stats_roundtrip_survive_gc_and_prune_to_the_newest(h: &dyn Harness) {
    let s = h.store();
    assert_eq!(s.list_stats().unwrap(), vec![]);
    assert_eq!(s.read_stats(CheckpointId(1)).unwrap(), None);
    for id in 1..=5 {
        write(s, id, "op", 0, b"state");
        commit(s, id, 1);
        s.write_stats(CheckpointId(id), format!("stats of {id}").as_bytes()).unwrap();
    }
    // A rewrite replaces.
    s.write_stats(CheckpointId(5), b"stats of 5, again").unwrap();
    assert_eq!(s.read_stats(CheckpointId(5)).unwrap().as_deref(), Some(&b"stats of 5, again"[..]));
    // Retention of checkpoints does not touch statistics.
    s.gc(1, &[]).unwrap();
    assert_eq!(s.list_stats().unwrap(), (1..=5).map(CheckpointId).collect::<Vec<_>>(), "{}", h.name());
    assert_eq!(s.read_stats(CheckpointId(1)).unwrap().as_deref(), Some(&b"stats of 1"[..]));
    // An interrupted write's leftover is not listed, and pruning removes it.
    h.put_raw("stats/.chk-00000000000000000009.123-0.tmp", b"partial");
    assert_eq!(s.list_stats().unwrap().len(), 5);
    assert_eq!(s.prune_stats(2).unwrap(), 4, "{}: three old files and the leftover", h.name());
    assert_eq!(s.list_stats().unwrap(), vec![CheckpointId(4), CheckpointId(5)]);
    assert!(h.files().iter().all(|f| !f.ends_with(".tmp")), "{}: {:?}", h.name(), h.files());
    assert_eq!(s.prune_stats(2).unwrap(), 0);
    // Damage is reported as corruption, never returned as statistics.
    h.flip_byte(&stats_file(4), 20);
    let err = s.read_stats(CheckpointId(4)).unwrap_err();
    assert!(err.is_corruption(), "{}: {err}", h.name());
    // A file of another kind at that name is refused too.
    let other = h.get_raw(&format!("checkpoints/chk-{:020}/_MANIFEST", 5)).unwrap();
    h.put_raw(&stats_file(5), &other);
    assert!(s.read_stats(CheckpointId(5)).is_err(), "{}", h.name());
}
