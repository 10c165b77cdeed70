//! Which subtask reads which partition ([`owner_of`]), and the split id a partition has for
//! per-split watermarks ([`split_of`]).

use crate::connectors::source::SplitId;

/// The subtask of `parallelism` that reads `partition` of `topic`: consecutive partitions of a topic
/// go to consecutive subtasks, starting at a subtask that depends on the topic's name (so the first
/// partitions of several topics do not all land on subtask 0).
pub fn owner_of(topic: &str, partition: i32, parallelism: u32) -> u32 {
    let base = crc32fast::hash(topic.as_bytes()) as u64;
    ((base + partition as u64) % parallelism.max(1) as u64) as u32
}

/// The split of `topic`/`partition` for per-split watermarks
/// ([`WatermarkStrategy::per_split`](crate::WatermarkStrategy::per_split)): the topic's CRC-32 in
/// the high half, the partition in the low half, so it is stable across runs and restores, and
/// partitions of one topic never collide. [`KafkaRecord::split`](super::KafkaRecord::split) gives a
/// record's.
pub fn split_of(topic: &str, partition: i32) -> SplitId {
    SplitId((crc32fast::hash(topic.as_bytes()) as u64) << 32 | partition as u32 as u64)
}

/// The partitions among `all` of `topic` that `subtask` of `parallelism` owns and does not read yet.
pub(super) fn unread_partitions(
    topic: &str,
    all: &[i32],
    subtask: u32,
    parallelism: u32,
    reading: impl Fn(i32) -> bool,
) -> Vec<i32> {
    all.iter().copied().filter(|p| owner_of(topic, *p, parallelism) == subtask && !reading(*p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_added_to_a_topic_go_to_their_owners_once_and_the_owners_cover_every_partition() {
        for parallelism in 1..5u32 {
            let before: Vec<i32> = (0..3).collect();
            let after: Vec<i32> = (0..8).collect();
            let mut owners = vec![0u32; 8];
            for subtask in 0..parallelism {
                let first = unread_partitions("t", &before, subtask, parallelism, |_| false);
                let added = unread_partitions("t", &after, subtask, parallelism, |p| first.contains(&p));
                assert!(added.iter().all(|p| *p >= 3), "a partition read already was added again: {added:?}");
                for p in first.iter().chain(&added) {
                    owners[*p as usize] += 1;
                }
            }
            assert_eq!(owners, vec![1; 8], "parallelism {parallelism}: every partition is read by one subtask");
        }
    }

    #[test]
    fn split_ids_tell_partitions_and_topics_apart() {
        assert_ne!(split_of("t", 0), split_of("t", 1));
        assert_ne!(split_of("t", 0), split_of("u", 0));
        assert_eq!(split_of("t", 3), split_of("t", 3));
    }
}
