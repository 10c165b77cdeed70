//! Rescaling a source that deals its input out by index: record `i` goes to subtask
//! `i % parallelism` (the generator's records, the line file's lines). Each subtask's offset is the
//! index it reads next, so after a restore at another parallelism no single offset says what was
//! read: the subtasks ran at their own pace, and record `i` was read iff `i < next[i % parallelism]`.
//!
//! A rescaled subtask therefore starts at the lowest old position (everything below it was read) and
//! carries [`ReadBefore`] layers, one per rescale it has not yet read past: a record a layer marks
//! as read is skipped. Once the subtask's position passes a layer's highest index, the layer marks
//! nothing ahead and is dropped, so in steady state the offsets are as small as before and the read
//! loop checks nothing per record.

use serde::{Deserialize, Serialize};

/// The most rescales a source carries at once before reading past the oldest: a rescale that would
/// need more is refused, with the way out (let the job run a little at its current parallelism).
pub const MAX_READ_BEFORE_LAYERS: usize = 8;

/// What the subtasks of one earlier parallelism had read: index `i` was read iff
/// `i < next[i % next.len()]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadBefore {
    /// The index each old subtask would have read next, by old subtask.
    pub next: Vec<u64>,
}

impl ReadBefore {
    /// Was index `i` read under this layer?
    #[inline]
    pub fn read(&self, i: u64) -> bool {
        let p = self.next.len() as u64;
        p > 0 && i < self.next[(i % p) as usize]
    }

    /// Nothing at or above this index is marked read.
    pub fn end(&self) -> u64 {
        self.next.iter().copied().max().unwrap_or(0)
    }
}

/// Was index `i` read under any layer?
#[inline]
pub fn read_before(layers: &[ReadBefore], i: u64) -> bool {
    layers.iter().any(|l| l.read(i))
}

/// Drop the layers that mark nothing at or above `position`.
pub fn prune(layers: &mut Vec<ReadBefore>, position: u64) {
    layers.retain(|l| l.end() > position);
}

/// Where every subtask of a new parallelism resumes when the old subtasks (in subtask order) had
/// reached `positions` (each old subtask's next index) carrying `layers` (each old subtask's own,
/// from earlier rescales): the lowest position, and the layers for what lies above it. Errors name
/// what is wrong with the old offsets (a damaged checkpoint) or that too many rescales pile up.
pub fn rescaled(positions: &[u64], layers: &[&[ReadBefore]]) -> Result<(u64, Vec<ReadBefore>), String> {
    let Some(start) = positions.iter().copied().min() else {
        return Err("the checkpoint holds no offset of any old subtask".into());
    };
    // A layer still held by one old subtask marks records of every subtask; a layer dropped by all
    // of them is covered by the new one (every old position is past its end).
    let mut all = vec![ReadBefore { next: positions.to_vec() }];
    for l in layers.iter().flat_map(|ls| ls.iter()) {
        if !all.contains(l) {
            all.push(l.clone());
        }
    }
    prune(&mut all, start);
    if all.len() > MAX_READ_BEFORE_LAYERS {
        return Err(format!(
            "the source was rescaled {} times without reading past the oldest rescale's position (at most {MAX_READ_BEFORE_LAYERS}); run the job at its current parallelism until it checkpoints again, then rescale",
            all.len() - 1
        ));
    }
    Ok((start, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of an interleaved reader: records `0..n` dealt out by index, read in random steps,
    /// rescaled at random to random parallelisms. Every record must be read exactly once.
    #[test]
    fn random_rescales_read_every_index_exactly_once() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next_rand = |bound: u64| {
            rng = crate::splitmix64(rng);
            rng % bound
        };
        for _ in 0..300 {
            let n = 1 + next_rand(400);
            let mut seen = vec![0u32; n as usize];
            let mut p = 1 + next_rand(5);
            // Each subtask: (next index of its own, layers)
            let mut subs: Vec<(u64, Vec<ReadBefore>)> = (0..p).map(|s| (s, vec![])).collect();
            loop {
                // Read a random number of records in every subtask.
                for (s, (next, layers)) in subs.iter_mut().enumerate() {
                    let steps = next_rand(40);
                    for _ in 0..steps {
                        if *next >= n {
                            break;
                        }
                        assert_eq!(*next % p, s as u64);
                        if !read_before(layers, *next) {
                            seen[*next as usize] += 1;
                        }
                        *next += p;
                        prune(layers, *next);
                    }
                }
                if subs.iter().all(|(next, _)| *next >= n) {
                    break;
                }
                if next_rand(3) == 0 {
                    let positions: Vec<u64> = subs.iter().map(|(next, _)| *next).collect();
                    let layers: Vec<&[ReadBefore]> = subs.iter().map(|(_, l)| &l[..]).collect();
                    let Ok((start, all)) = rescaled(&positions, &layers) else { continue };
                    p = 1 + next_rand(5);
                    subs = (0..p)
                        .map(|s| {
                            // The first index at or above `start` that is this subtask's.
                            let first = start + (s + p - start % p) % p;
                            (first, all.clone())
                        })
                        .collect();
                }
            }
            assert!(seen.iter().all(|c| *c == 1), "an index read twice or never: {seen:?}");
        }
    }

    #[test]
    fn a_layer_is_dropped_once_read_past() {
        let mut layers = vec![ReadBefore { next: vec![4, 7] }];
        assert!(layers[0].read(5) && !layers[0].read(6) && layers[0].read(2) && !layers[0].read(4));
        prune(&mut layers, 6);
        assert_eq!(layers.len(), 1);
        prune(&mut layers, 7);
        assert!(layers.is_empty());
    }

    #[test]
    fn too_many_rescales_without_progress_are_refused_with_the_way_out() {
        let mut layers: Vec<ReadBefore> = vec![];
        for k in 0..MAX_READ_BEFORE_LAYERS as u64 {
            let positions = [10 + k, 20 + 2 * k];
            let (_, l) = rescaled(&positions, &[&layers]).expect("within the limit");
            layers = l;
        }
        let e = rescaled(&[10, 200], &[&layers]).unwrap_err();
        assert!(e.contains("until it checkpoints again"), "{e}");
        assert!(rescaled(&[], &[]).is_err());
    }
}
