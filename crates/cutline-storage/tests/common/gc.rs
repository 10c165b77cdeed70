//! Retention against a model: random histories of complete checkpoints (some reusing files of older
//! ones, some incremental: files on top of an older checkpoint's chain), abandoned and in-flight
//! attempts (whose base retention may remove before they commit), and crash leftovers. How many and
//! how long is the store's [`Budget`].

use super::{dir_of, manifest, manifest_path, Budget, Harness};
use cutline_core::{CheckpointId, OperatorId, SubtaskIndex};
use cutline_storage::{CheckpointStore, Manifest, StorageError, TaskStateHandle};
use std::collections::{BTreeMap, BTreeSet};

/// xorshift64: deterministic and good enough to pick histories.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

const SUBTASKS: u32 = 2;

struct Model {
    rng: Rng,
    budget: Budget,
    next_id: u64,
    /// Complete checkpoints that must still exist.
    live: BTreeMap<u64, Manifest>,
    /// In-flight attempts and the handles they wrote so far.
    in_flight: BTreeMap<u64, Vec<TaskStateHandle>>,
    /// The payload written to each file.
    payloads: BTreeMap<String, Vec<u8>>,
}

impl Model {
    fn write(&mut self, s: &dyn CheckpointStore, id: u64, op: &str, sub: u32) -> TaskStateHandle {
        let payload = format!("{id}/{op}/{sub}/{}", self.rng.next()).into_bytes();
        let handle = s
            .write_task_state(CheckpointId(id), &OperatorId::new(op), SubtaskIndex(sub), SUBTASKS, None, &payload)
            .unwrap();
        self.payloads.insert(handle.file.clone(), payload);
        handle
    }

    /// One new checkpoint id: completed (possibly reusing older files), abandoned, or left in flight.
    fn step(&mut self, h: &dyn Harness) {
        let s = h.store();
        let id = self.next_id;
        self.next_id += 1;
        let fate = self.rng.below(10);
        // Incremental: new files on top of the chains of a complete checkpoint.
        let on_top_of = if !self.live.is_empty() && self.rng.percent(40) {
            let pick = self.rng.below(self.live.len() as u64) as usize;
            self.live.iter().nth(pick).map(|(id, m)| (*id, m.clone()))
        } else {
            None
        };
        let mut tasks = Vec::new();
        for &op in self.budget.gc_operators {
            for sub in 0..SUBTASKS {
                if fate >= 6 && self.rng.percent(30) {
                    continue; // attempts may stop part-way
                }
                let base = if fate < 6 && !self.live.is_empty() && self.rng.percent(50) {
                    let pick = self.rng.below(self.live.len() as u64) as usize;
                    self.live.values().nth(pick)
                } else {
                    None
                };
                let reused = base
                    .and_then(|m| m.tasks.iter().find(|t| t.operator.as_str() == op && t.subtask.0 == sub).cloned());
                tasks.push(match reused {
                    Some(handle) => handle,
                    None => {
                        let mut handle = self.write(s, id, op, sub);
                        let under = on_top_of.as_ref().and_then(|(bid, m)| {
                            m.tasks.iter().find(|t| t.operator.as_str() == op && t.subtask.0 == sub).map(|t| (*bid, t))
                        });
                        if let Some((bid, t)) = under {
                            handle.base = t.base.clone();
                            handle.base.push(t.file_ref(CheckpointId(bid)));
                        }
                        handle
                    }
                });
            }
        }
        if self.rng.percent(25) {
            let name = if self.rng.percent(50) { "_MANIFEST" } else { "src-0.state" };
            h.put_raw(&format!("{}/.{name}.77-{id}.tmp", dir_of(id)), b"crash leftover");
        }
        match fate {
            0..=5 => {
                let m = manifest(id, tasks);
                s.commit_manifest(&m).unwrap();
                self.live.insert(id, m);
            }
            6..=7 => {} // abandoned
            _ => {
                self.in_flight.insert(id, tasks);
            }
        }
    }

    /// In-flight attempts either complete late or get abandoned.
    fn settle_some_in_flight(&mut self, h: &dyn Harness) {
        let ids: Vec<u64> = self.in_flight.keys().copied().collect();
        for id in ids {
            match self.rng.below(3) {
                0 => {
                    let tasks = self.in_flight.remove(&id).unwrap();
                    let m = manifest(id, tasks);
                    match h.store().commit_manifest(&m) {
                        Ok(()) => {
                            self.live.insert(id, m);
                        }
                        // Retention removed a file it builds on since it was written: refused, and
                        // only then.
                        Err(StorageError::BaseMissing { file, .. }) => {
                            assert!(h.get_raw(&file).is_none(), "{}: {file} is there", h.name());
                            assert!(m.tasks.iter().any(|t| t.base.iter().any(|b| b.file == file)));
                        }
                        Err(e) => panic!("{}: committing {id}: {e}", h.name()),
                    }
                }
                1 => {
                    self.in_flight.remove(&id);
                }
                _ => {}
            }
        }
    }
}

fn check_gc(h: &dyn Harness, model: &mut Model, retain: usize) {
    let s = h.store();
    let in_flight: Vec<CheckpointId> = model.in_flight.keys().map(|&id| CheckpointId(id)).collect();
    let in_flight_dirs: Vec<String> = model.in_flight.keys().map(|&id| dir_of(id)).collect();
    let under_in_flight = |path: &str| in_flight_dirs.iter().any(|d| path.starts_with(&format!("{d}/")));
    let before = h.snapshot();
    let dropped: Vec<u64> = model.live.keys().rev().skip(retain).copied().collect();

    let report = s.gc(retain, &in_flight).unwrap();

    for id in &dropped {
        model.live.remove(id);
    }
    let after = h.snapshot();
    // Every retained checkpoint verifies, and its files hold what was written.
    let listed: Vec<u64> = s.list_checkpoints().unwrap().iter().filter(|l| l.complete).map(|l| l.id.0).collect();
    assert_eq!(listed, model.live.keys().copied().collect::<Vec<_>>(), "{}", h.name());
    let mut expected: BTreeSet<String> = BTreeSet::new();
    for (id, m) in &model.live {
        assert_eq!(&s.verify(CheckpointId(*id)).unwrap(), m);
        expected.insert(manifest_path(*id));
        for t in &m.tasks {
            assert_eq!(s.read_task_state(t).unwrap(), model.payloads[&t.file]);
            let chain: Vec<Vec<u8>> = t.chain().map(|(f, _, _)| model.payloads[f].clone()).collect();
            assert_eq!(s.read_task_chain(t).unwrap(), chain);
            expected.extend(t.chain().map(|(f, _, _)| f.to_string()));
        }
    }
    // In-flight attempts are untouched.
    let flight = |snap: &[(String, Vec<u8>)]| -> Vec<(String, Vec<u8>)> {
        snap.iter().filter(|(p, _)| under_in_flight(p)).cloned().collect()
    };
    assert_eq!(flight(&before), flight(&after), "{}: gc touched an in-flight attempt", h.name());
    // Nothing else remains, except temporary files in retained checkpoints older than the newest:
    // those were swept when they were the newest and go with their directory once they leave retention.
    let older_retained: Vec<String> = model.live.keys().rev().skip(1).map(|&id| format!("{}/", dir_of(id))).collect();
    let tolerated = |p: &str| {
        let name = p.rsplit('/').next().unwrap_or(p);
        name.starts_with('.') && name.ends_with(".tmp") && older_retained.iter().any(|d| p.starts_with(d.as_str()))
    };
    let remaining: Vec<&String> = after
        .iter()
        .map(|(p, _)| p)
        .filter(|p| !under_in_flight(p) && !expected.contains(*p) && !tolerated(p))
        .collect();
    assert!(remaining.is_empty(), "{}: gc left {remaining:?}", h.name());
    // No empty checkpoint directory is left behind.
    for l in s.list_checkpoints().unwrap() {
        let dir = format!("{}/", dir_of(l.id.0));
        assert!(after.iter().any(|(p, _)| p.starts_with(&dir)), "{}: empty {dir}", h.name());
    }
    // The report adds up.
    let size = |snap: &[(String, Vec<u8>)]| snap.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
    assert_eq!(report.removed_files, before.len() - after.len());
    assert_eq!(report.removed_bytes, size(&before) - size(&after));
    for id in &dropped {
        assert!(report.removed_checkpoints.contains(&CheckpointId(*id)), "{id} not reported");
    }
    for id in &report.removed_checkpoints {
        assert!(!model.live.contains_key(&id.0) && !model.in_flight.contains_key(&id.0));
    }
    // A second gc with the same arguments has nothing to do.
    let again = s.gc(retain, &in_flight).unwrap();
    assert_eq!((again.removed_files, again.removed_bytes), (0, 0), "{}", h.name());
}

fn random_history(h: &dyn Harness, seed: u64) {
    let budget = h.budget();
    let mut model = Model {
        rng: Rng(seed),
        budget,
        next_id: 1,
        live: BTreeMap::new(),
        in_flight: BTreeMap::new(),
        payloads: BTreeMap::new(),
    };
    for _ in 0..budget.gc_rounds {
        for _ in 0..1 + model.rng.below(budget.gc_max_steps) {
            model.step(h);
        }
        if model.rng.percent(30) {
            h.put_raw(&format!(".job.meta.77-{}.tmp", model.next_id), b"crash leftover");
        }
        let retain = 1 + model.rng.below(budget.gc_max_retain) as usize;
        check_gc(h, &mut model, retain);
        model.settle_some_in_flight(h);
    }
}

/// Every retained checkpoint verifies with what was written, in-flight attempts are untouched, and
/// nothing else remains: after each gc of each random history.
pub fn gc_keeps_exactly_what_retained_manifests_and_in_flight_attempts_need(h: &dyn Harness) {
    for seed in 1..=h.budget().gc_histories {
        random_history(&*h.fresh(), seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
}
