//! The fencing of checkpoints that an older generation commits after a newer one took over, as
//! tables of steps: each step is checked against explicit expectations and, after every step, the
//! whole listing against a model of the rule.

use super::{commit, record, Harness};
use cutline_core::{CheckpointId, Generation};
use cutline_storage::{CheckpointListing, StorageError};
use std::collections::BTreeMap;

/// One step of a fencing scenario.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Generation `.0` claims its record, having restored checkpoint `.1`.
    Claim(u64, Option<u64>),
    /// Generation `.1` commits checkpoint `.0`.
    Commit(u64, u64),
    /// `latest_complete` is this.
    Latest(Option<u64>),
    /// `verify(id)` passes.
    Verifies(u64),
    /// `verify(id)` is `Fenced`: written by `generation`, fenced by `by`.
    Fenced { id: u64, generation: u64, by: u64 },
    /// `check_not_fenced(.0)` passes.
    NotSuperseded(u64),
    /// `check_not_fenced(generation)` is `Superseded` by `newer`.
    Superseded { generation: u64, newer: u64 },
}
use Step::*;

struct Scenario {
    name: &'static str,
    steps: &'static [Step],
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "a zombie's commit after a newer generation took over is fenced",
        steps: &[
            Claim(1, None),
            Commit(5, 1),
            Claim(2, Some(5)),
            Commit(6, 1), // generation 1 is a zombie now
            Latest(Some(5)),
            Verifies(5),
            Fenced { id: 6, generation: 1, by: 2 },
            Superseded { generation: 1, newer: 2 },
            NotSuperseded(2),
            Commit(7, 2),
            Latest(Some(7)),
            Verifies(7),
            Fenced { id: 6, generation: 1, by: 2 },
        ],
    },
    Scenario {
        name: "a generation's own manifests are not fenced by its own record",
        steps: &[
            Commit(5, 1),
            Claim(2, Some(5)),
            Commit(6, 2),
            Commit(8, 2),
            Latest(Some(8)),
            Verifies(6),
            Verifies(8),
        ],
    },
    Scenario {
        name: "the checkpoint a generation restored and those below it are not fenced",
        steps: &[
            Commit(5, 1),
            Commit(6, 1),
            Claim(2, Some(6)),
            Latest(Some(6)),
            Verifies(5),
            Verifies(6),
            Commit(7, 1),
            Fenced { id: 7, generation: 1, by: 2 },
            Latest(Some(6)),
        ],
    },
    Scenario {
        name: "a zombie's late commit below the restore point is not fenced (the rule looks above it)",
        steps: &[Commit(5, 1), Claim(2, Some(5)), Commit(4, 1), Verifies(4), Latest(Some(5))],
    },
    Scenario {
        name: "a record that restored nothing fences every manifest of an older generation",
        steps: &[
            Commit(3, 1),
            Commit(4, 1),
            Claim(2, None),
            Latest(None),
            Fenced { id: 3, generation: 1, by: 2 },
            Fenced { id: 4, generation: 1, by: 2 },
            Commit(5, 2),
            Latest(Some(5)),
            Verifies(5),
        ],
    },
    Scenario {
        name: "a record that restored nothing fences nothing of its own or newer generations",
        steps: &[Claim(1, None), Commit(3, 2), Commit(4, 2), Commit(6, 1), Latest(Some(6)), Verifies(3), Verifies(6)],
    },
    Scenario {
        name: "fenced by the first generation that took over; zombies of zombies too",
        steps: &[
            Commit(5, 1),
            Claim(2, Some(5)),
            Claim(3, Some(5)),
            Commit(6, 1),
            Fenced { id: 6, generation: 1, by: 2 },
            Commit(8, 2), // generation 2 is a zombie of generation 3
            Fenced { id: 8, generation: 2, by: 3 },
            Superseded { generation: 2, newer: 3 },
            Superseded { generation: 1, newer: 3 },
            Latest(Some(5)),
            Commit(9, 3),
            Latest(Some(9)),
            NotSuperseded(3),
        ],
    },
    Scenario {
        name: "a newer generation's restore point does not unfence what an older record fenced",
        steps: &[
            Commit(5, 1),
            Claim(2, Some(5)),
            Commit(6, 2),
            Claim(3, Some(6)),
            Commit(7, 1), // above 5 and 6: fenced by 2 already
            Fenced { id: 7, generation: 1, by: 2 },
            Commit(8, 2),
            Fenced { id: 8, generation: 2, by: 3 },
            Latest(Some(6)),
        ],
    },
    Scenario {
        name: "without generation records nothing is fenced",
        steps: &[Commit(5, 1), Commit(6, 3), Commit(7, 2), Latest(Some(7)), Verifies(7), NotSuperseded(1)],
    },
];

/// The fencing rule, as the brief states it, over the model's commits and records.
fn model_listing(commits: &BTreeMap<u64, u64>, records: &BTreeMap<u64, Option<u64>>) -> Vec<CheckpointListing> {
    commits
        .iter()
        .map(|(&c, &g)| {
            let fenced = records.iter().any(|(&g2, &restored)| g2 > g && restored.is_none_or(|r| r < c));
            CheckpointListing { id: CheckpointId(c), complete: !fenced, fenced }
        })
        .collect()
}

fn run_scenario(h: &dyn Harness, scenario: &Scenario) {
    let s = h.store();
    let at = |i: usize, step: &Step| format!("{}: {}: step {i} {step:?}", h.name(), scenario.name);
    let mut commits = BTreeMap::new();
    let mut records = BTreeMap::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        match *step {
            Claim(generation, restored) => {
                s.claim_generation(&record(generation, restored, &format!("host-a/pid-{generation}"))).unwrap();
                records.insert(generation, restored);
            }
            Commit(id, generation) => {
                commit(s, id, generation);
                commits.insert(id, generation);
            }
            Latest(id) => assert_eq!(s.latest_complete().unwrap(), id.map(CheckpointId), "{}", at(i, step)),
            Verifies(id) => {
                let m = s.verify(CheckpointId(id)).unwrap_or_else(|e| panic!("{}: {e}", at(i, step)));
                assert_eq!(m.generation, Generation(commits[&id]));
            }
            Fenced { id, generation, by } => {
                let err = s.verify(CheckpointId(id)).unwrap_err();
                let expected = (CheckpointId(id), Generation(generation), Generation(by));
                match &err {
                    StorageError::Fenced { checkpoint, generation, by } => {
                        assert_eq!((*checkpoint, *generation, *by), expected, "{}", at(i, step))
                    }
                    other => panic!("{}: expected Fenced, got {other}", at(i, step)),
                }
                assert_eq!(
                    err.to_string(),
                    format!(
                        "checkpoint {id} was completed by generation {generation} after generation {by} took over; \
                         it is ignored"
                    )
                );
                assert!(!err.is_transient() && !err.is_corruption());
                // Fenced is about restoring: the manifest itself is intact and readable.
                assert_eq!(s.read_manifest(CheckpointId(id)).unwrap().generation, Generation(generation));
            }
            NotSuperseded(generation) => {
                s.check_not_fenced(Generation(generation)).unwrap_or_else(|e| panic!("{}: {e}", at(i, step)))
            }
            Superseded { generation, newer } => match s.check_not_fenced(Generation(generation)) {
                Err(StorageError::Superseded { generation: g, newer: n, owner }) => {
                    assert_eq!((g, n), (Generation(generation), Generation(newer)), "{}", at(i, step));
                    assert_eq!(owner, format!("host-a/pid-{newer}"), "{}", at(i, step));
                }
                other => panic!("{}: expected Superseded, got {other:?}", at(i, step)),
            },
        }
        assert_eq!(s.list_checkpoints().unwrap(), model_listing(&commits, &records), "{}", at(i, step));
        // New ids must stay above fenced ones too.
        let max = commits.keys().last().map(|&id| CheckpointId(id));
        assert_eq!(s.max_checkpoint_id_seen().unwrap(), max, "{}", at(i, step));
    }
}

/// Every fencing scenario, each on a fresh store.
pub fn fencing_scenarios(h: &dyn Harness) {
    for scenario in SCENARIOS {
        run_scenario(&*h.fresh(), scenario);
    }
}
