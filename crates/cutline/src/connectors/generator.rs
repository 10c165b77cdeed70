//! [`GeneratorSource`]: a deterministic generator, replayable by record index (benchmarks, tests,
//! the simulation), and rescalable (see [`ReadBefore`]).

use super::interleave::{prune, read_before, rescaled, ReadBefore};
use super::source::{Source, SourceStatus};
use crate::error::{ConnectorError, ConnectorResult};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// A deterministic generator: record `i` (for `i` in `0..count`, split across subtasks by `i % parallelism`)
/// is `f(i)`. Replayable by index, and restorable at another parallelism.
pub struct GeneratorSource<T> {
    count: u64,
    f: std::sync::Arc<dyn Fn(u64) -> T + Send + Sync>,
    at: GeneratorOffset,
    step: u64,
}

/// A [`GeneratorSource`] subtask's position: the index it produces next, and what earlier
/// parallelisms already produced above it (after a rescale; empty otherwise).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GeneratorOffset {
    /// The index this subtask produces next.
    pub next: u64,
    /// Indices at or above `next` that an earlier parallelism produced (skipped).
    pub read_before: Vec<ReadBefore>,
}

impl<T> GeneratorSource<T> {
    /// `count` records in all (over every subtask), record `i` being `f(i)`. `f` must be
    /// deterministic: a restore replays records from their index.
    pub fn new(count: u64, f: impl Fn(u64) -> T + Send + Sync + 'static) -> GeneratorSource<T> {
        GeneratorSource { count, f: std::sync::Arc::new(f), at: GeneratorOffset::default(), step: 1 }
    }
}

impl<T> Clone for GeneratorSource<T> {
    fn clone(&self) -> Self {
        GeneratorSource { count: self.count, f: self.f.clone(), at: self.at.clone(), step: self.step }
    }
}

/// The first index at or above `from` that subtask `subtask` of `parallelism` produces.
fn first_of(from: u64, subtask: u32, parallelism: u32) -> u64 {
    let p = parallelism as u64;
    from + (subtask as u64 + p - from % p) % p
}

impl<T: Send + 'static> Source for GeneratorSource<T> {
    type Item = T;
    type Offset = GeneratorOffset;

    fn open(&mut self, subtask: u32, parallelism: u32, restored: Option<GeneratorOffset>) -> ConnectorResult<()> {
        self.step = parallelism as u64;
        self.at = match restored {
            Some(o) => {
                if o.next % self.step != subtask as u64 % self.step && o.next < self.count {
                    return Err(
                        format!("offset {} does not belong to subtask {subtask} of {parallelism}", o.next).into()
                    );
                }
                o
            }
            None => GeneratorOffset { next: subtask as u64, read_before: Vec::new() },
        };
        Ok(())
    }

    fn rescale(old: Vec<GeneratorOffset>, subtask: u32, parallelism: u32) -> ConnectorResult<Option<GeneratorOffset>> {
        let p_old = old.len() as u64;
        // A subtask's index always stays in its own residue (it steps by the parallelism).
        if let Some((j, o)) = old.iter().enumerate().find(|(j, o)| o.next % p_old != *j as u64) {
            return Err(ConnectorError::permanent(format!(
                "the checkpoint is damaged: old subtask {j} of {p_old} is at index {}, which is not its own",
                o.next
            )));
        }
        let positions: Vec<u64> = old.iter().map(|o| o.next).collect();
        let layers: Vec<&[ReadBefore]> = old.iter().map(|o| &o.read_before[..]).collect();
        let (start, read_before) = rescaled(&positions, &layers).map_err(ConnectorError::permanent)?;
        Ok(Some(GeneratorOffset { next: first_of(start, subtask, parallelism), read_before }))
    }

    fn poll(&mut self, out: &mut Vec<T>, max: usize) -> ConnectorResult<SourceStatus> {
        let mut n = 0;
        if self.at.read_before.is_empty() {
            while n < max && self.at.next < self.count {
                out.push((self.f)(self.at.next));
                self.at.next += self.step;
                n += 1;
            }
        } else {
            // After a rescale: skip what an earlier parallelism produced, until past all of it.
            while n < max && self.at.next < self.count {
                if !read_before(&self.at.read_before, self.at.next) {
                    out.push((self.f)(self.at.next));
                    n += 1;
                }
                self.at.next += self.step;
            }
            prune(&mut self.at.read_before, self.at.next);
        }
        Ok(if n == 0 && self.at.next >= self.count { SourceStatus::Finished } else { SourceStatus::More })
    }

    fn offset(&self) -> GeneratorOffset {
        self.at.clone()
    }
}

/// Offsets decode from checkpoints of every cutline version: before rescaling existed the offset was
/// the bare index (postcard has no field names, so the layers are read only if present).
impl<'de> Deserialize<'de> for GeneratorOffset {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<GeneratorOffset, D::Error> {
        struct OffsetVisitor;
        impl<'de> Visitor<'de> for OffsetVisitor {
            type Value = GeneratorOffset;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a generator offset")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<GeneratorOffset, A::Error> {
                let next = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                // An offset of an older version ends here: postcard reports the end of its input.
                let read_before = seq.next_element::<Vec<ReadBefore>>().ok().flatten().unwrap_or_default();
                Ok(GeneratorOffset { next, read_before })
            }
        }
        d.deserialize_struct("GeneratorOffset", &["next", "read_before"], OffsetVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `count` records through subtasks that each read a random amount, then restore them (their
    /// offsets through postcard, as a checkpoint keeps them) at a random parallelism, again and again:
    /// every record is produced exactly once.
    #[test]
    fn random_rescales_produce_every_record_exactly_once() {
        let mut rng = 7u64;
        let mut rand = |bound: u64| {
            rng = crate::splitmix64(rng);
            rng % bound
        };
        for _ in 0..200 {
            let count = rand(500);
            let mut seen = vec![0u32; count as usize];
            let mut p = 1 + rand(6) as u32;
            let mut offsets: Vec<Option<GeneratorOffset>> = vec![None; p as usize];
            let mut rescales = 0;
            loop {
                let mut all_done = true;
                for s in 0..p {
                    let mut g = GeneratorSource::new(count, |i| i);
                    g.open(s, p, offsets[s as usize].take()).unwrap();
                    let mut out = Vec::new();
                    let status = g.poll(&mut out, rand(30) as usize).unwrap();
                    for i in out {
                        seen[i as usize] += 1;
                    }
                    all_done &= status == SourceStatus::Finished;
                    let bytes = postcard::to_allocvec(&g.offset()).unwrap();
                    offsets[s as usize] = Some(postcard::from_bytes(&bytes).unwrap());
                }
                if all_done {
                    break;
                }
                if rand(3) == 0 {
                    let old: Vec<GeneratorOffset> = offsets.iter().map(|o| o.clone().unwrap()).collect();
                    let new_p = 1 + rand(6) as u32;
                    match (0..new_p)
                        .map(|s| GeneratorSource::<u64>::rescale(old.clone(), s, new_p))
                        .collect::<Result<Vec<_>, _>>()
                    {
                        Ok(new) => {
                            offsets = new;
                            p = new_p;
                            rescales += 1;
                        }
                        Err(e) => assert!(e.to_string().contains("checkpoints again"), "{e}"),
                    }
                }
            }
            assert!(
                seen.iter().all(|c| *c == 1),
                "after {rescales} rescales, a record produced twice or never: {seen:?}"
            );
        }
    }

    #[test]
    fn an_offset_of_a_version_before_rescaling_decodes() {
        let old = postcard::to_allocvec(&41u64).unwrap();
        let o: GeneratorOffset = postcard::from_bytes(&old).unwrap();
        assert_eq!(o, GeneratorOffset { next: 41, read_before: vec![] });
    }

    #[test]
    fn offsets_out_of_their_subtasks_residue_are_a_damaged_checkpoint() {
        let o = |next| GeneratorOffset { next, read_before: vec![] };
        let e = GeneratorSource::<u64>::rescale(vec![o(4), o(6)], 0, 3).unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
    }
}
