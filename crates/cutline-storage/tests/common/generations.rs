//! Generation records (create-if-absent claims): claims, races between claims, damaged records,
//! which records gc may remove, zombies, and released claims. The fencing scenario tables are in
//! [`super::fencing`].

use super::{commit, dir_of, framed, generation_path, manifest_path, race, record, Harness};
use cutline_core::{CheckpointId, Generation};
use cutline_storage::{CheckpointListing, FileKind, GenerationRecord, StorageError};

// ---- claims ------------------------------------------------------------------------------------

pub fn claiming_a_generation_twice_is_refused(h: &dyn Harness) {
    let s = h.store();
    assert_eq!(s.latest_generation().unwrap(), None);
    assert_eq!(s.generations().unwrap(), vec![]);
    let first = record(1, None, "host-a/pid-1");
    s.claim_generation(&first).unwrap();
    let before = h.snapshot();
    for second in [first.clone(), record(1, Some(4), "host-b/pid-2")] {
        let err = s.claim_generation(&second).unwrap_err();
        match &err {
            StorageError::GenerationTaken { generation, owner } => {
                assert_eq!((*generation, owner.as_str()), (Generation(1), "host-a/pid-1"), "{}", h.name())
            }
            other => panic!("{}: expected GenerationTaken, got {other}", h.name()),
        }
        let text = err.to_string();
        assert!(text.contains("already started by another coordinator (host-a/pid-1)"), "{text}");
        assert!(text.contains("do not run two coordinators for one job"), "{text}");
        assert!(!err.is_transient() && !err.is_corruption());
    }
    assert_eq!(h.snapshot(), before, "{}: a refused claim changed the store", h.name());
    assert_eq!(s.generations().unwrap(), vec![first.clone()]);
    assert_eq!(s.latest_generation().unwrap(), Some(first.clone()));
    // The record is a framed file where the layout says.
    let raw = h.get_raw(&generation_path(1)).expect("the record's file");
    assert_eq!(&raw[..4], b"CUTL");
    assert_eq!(u16::from_le_bytes([raw[6], raw[7]]), FileKind::GenerationRecord as u16);
    assert!(h.files().iter().all(|f| !f.ends_with(".tmp")), "{:?}", h.files());

    // The record is the only file.
    assert_eq!(h.files(), vec![generation_path(1)], "{}", h.name());

    let later = record(3, Some(9), "host-c/pid-3");
    s.claim_generation(&later).unwrap();
    assert_eq!(s.generations().unwrap(), vec![first, later.clone()]);
    assert_eq!(s.latest_generation().unwrap(), Some(later));
    // Below the latest: superseded, and nothing is written.
    assert!(matches!(
        s.claim_generation(&record(2, None, "host-old")),
        Err(StorageError::Superseded { generation: Generation(2), newer: Generation(3), .. })
    ));
    assert!(h.get_raw(&generation_path(2)).is_none(), "{}: a superseded claim writes nothing", h.name());
    assert_eq!(s.latest_generation().unwrap().unwrap().owner, "host-c/pid-3");
    // A damaged record is corruption, as a damaged job.meta is.
    h.flip_byte(&generation_path(3), 3);
    assert!(matches!(s.latest_generation(), Err(StorageError::BadMagic { .. })));
}

pub fn claiming_below_the_latest_generation_is_superseded(h: &dyn Harness) {
    let s = h.store();
    s.claim_generation(&record(5, None, "host-new")).unwrap();
    let before = h.snapshot();
    for (generation, restored) in [(4, Some(1)), (2, None), (5, None)] {
        let err = s.claim_generation(&record(generation, restored, "host-old")).unwrap_err();
        if generation == 5 {
            assert!(matches!(err, StorageError::GenerationTaken { .. }), "{err}");
            continue;
        }
        match &err {
            StorageError::Superseded { generation: g, newer, owner } => {
                assert_eq!((*g, *newer, owner.as_str()), (Generation(generation), Generation(5), "host-new"))
            }
            other => panic!("{}: expected Superseded, got {other}", h.name()),
        }
        assert_eq!(
            err.to_string(),
            format!(
                "a newer coordinator (generation 5, owner host-new) took over this job: this one (generation \
                 {generation}) stops"
            )
        );
    }
    assert_eq!(h.snapshot(), before, "{}: no record of an older generation may be written", h.name());
    s.check_not_fenced(Generation(5)).unwrap();
    s.check_not_fenced(Generation(6)).unwrap();
}

pub fn check_not_fenced_with_no_records_passes(h: &dyn Harness) {
    let s = h.store();
    s.check_not_fenced(Generation(0)).unwrap();
    s.check_not_fenced(Generation(7)).unwrap();
    commit(s, 1, 1);
    s.check_not_fenced(Generation(1)).unwrap();
}

/// A crash while claiming leaves a temporary file under `generations/`: not a claim.
pub fn temporary_record_left_by_a_crash_is_not_a_claim(h: &dyn Harness) {
    let s = h.store();
    let leftover = format!("generations/.gen-{:020}.4242-0.tmp", 2);
    h.put_raw(&leftover, &framed(FileKind::GenerationRecord, &record(2, None, "x")));
    assert_eq!(s.generations().unwrap(), vec![]);
    assert_eq!(s.latest_generation().unwrap(), None);
    s.check_not_fenced(Generation(1)).unwrap();
    s.claim_generation(&record(2, Some(1), "y")).unwrap();
    assert_eq!(s.latest_generation().unwrap(), Some(record(2, Some(1), "y")));
}

/// Two coordinators (two clients, as two processes would have) claim the same generation at the same
/// moment: exactly one wins, the other is told who did, and the stored record is the winner's, whole.
pub fn of_two_racing_claims_of_one_generation_exactly_one_wins(h: &dyn Harness) {
    let stores = [h.shared(), h.another_client()];
    let rounds = h.budget().race_rounds;
    for generation in 1..=rounds {
        let work = stores
            .iter()
            .zip(["host-a", "host-b"])
            .map(|(store, host)| (store.clone(), record(generation, Some(generation), &format!("{host}/{generation}"))))
            .collect();
        let results = race(work, |s, claim| s.claim_generation(claim));
        let winners: Vec<&GenerationRecord> = results.iter().filter(|(_, r)| r.is_ok()).map(|(c, _)| c).collect();
        assert_eq!(winners.len(), 1, "{}: generation {generation}: {results:?}", h.name());
        for (_, result) in &results {
            if let Err(e) = result {
                assert!(
                    matches!(e, StorageError::GenerationTaken { generation: g, owner }
                        if *g == Generation(generation) && owner == &winners[0].owner),
                    "{}: generation {generation}: {e}",
                    h.name()
                );
            }
        }
        for store in &stores {
            assert_eq!(store.latest_generation().unwrap().as_ref(), Some(winners[0]));
        }
    }
    let names: Vec<String> = h.files().into_iter().filter(|f| f.starts_with("generations/")).collect();
    assert_eq!(names.len() as u64, rounds, "{}: no temporary file is left behind: {names:?}", h.name());
}

/// A coordinator claims generation g while another claims g + 1: the newer always wins; the older
/// either finished its claim before the newer one looked, or is superseded and leaves no record.
pub fn a_claim_racing_a_newer_generation_loses_without_a_trace(h: &dyn Harness) {
    let stores = [h.shared(), h.another_client()];
    let rounds = h.budget().race_rounds;
    let mut superseded = 0;
    for round in 0..rounds {
        let (older, newer) = (2 * round + 1, 2 * round + 2);
        let work = vec![
            (stores[0].clone(), record(older, Some(1), "older")),
            (stores[1].clone(), record(newer, Some(2), "newer")),
        ];
        let results = race(work, |s, claim| s.claim_generation(claim));
        results[1].1.as_ref().unwrap_or_else(|e| panic!("{}: round {round}: the newer claim failed: {e}", h.name()));
        let older_file = generation_path(older);
        match &results[0].1 {
            Ok(()) => assert!(h.get_raw(&older_file).is_some()),
            Err(StorageError::Superseded { newer: n, .. }) => {
                assert_eq!(*n, Generation(newer));
                assert!(
                    h.get_raw(&older_file).is_none(),
                    "{}: round {round}: a superseded claim left its record",
                    h.name()
                );
                superseded += 1;
            }
            Err(e) => panic!("{}: round {round}: {e}", h.name()),
        }
        assert_eq!(stores[0].latest_generation().unwrap().unwrap().generation, Generation(newer));
    }
    eprintln!("{}: {superseded} of {rounds} older claims were superseded", h.name());
}

// ---- damage ------------------------------------------------------------------------------------

/// Generation 1 committed 3, generation 2 restored 3 and committed 4; then one record is damaged.
/// Explicit reads of a damaged record fail as corruption (like a damaged `job.meta`); fencing fails
/// only where the damaged record could decide it; a claim of its generation is still refused.
pub fn damaged_generation_record_is_corruption(h: &dyn Harness) {
    type Damage = fn(&dyn Harness, &str);
    type Expect = fn(&StorageError) -> bool;
    let cases: Vec<(&str, Damage, Expect)> = vec![
        ("flip in magic", |h, p| h.flip_byte(p, 3), |e| matches!(e, StorageError::BadMagic { .. })),
        ("flip in payload", |h, p| h.flip_byte(p, 20), |e| matches!(e, StorageError::ChecksumMismatch { .. })),
        (
            "truncated",
            |h, p| {
                let bytes = h.get_raw(p).unwrap();
                h.put_raw(p, &bytes[..bytes.len() - 1])
            },
            |e| matches!(e, StorageError::Truncated { .. }),
        ),
        (
            "the record of another generation",
            |h, p| {
                let other = framed(FileKind::GenerationRecord, &record(9, None, "x"));
                h.put_raw(p, &other)
            },
            |e| matches!(e, StorageError::Decode { reason, .. } if reason.contains("generation 9")),
        ),
        (
            "a manifest in its place",
            |h, p| {
                let m = h.get_raw(&manifest_path(4)).unwrap();
                h.put_raw(p, &m)
            },
            |e| matches!(e, StorageError::WrongKind { .. }),
        ),
    ];
    for (what, damage, expect) in cases {
        for damaged in [1u64, 2] {
            let fresh = h.fresh();
            let h = &*fresh;
            let s = h.store();
            s.claim_generation(&record(1, None, "host-1")).unwrap();
            commit(s, 3, 1);
            s.claim_generation(&record(2, Some(3), "host-2")).unwrap();
            commit(s, 4, 2);
            let path = format!("generations/gen-{damaged:020}");
            damage(h, &path);
            let case = format!("{}: {what} in the record of generation {damaged}", h.name());

            let err = s.generations().unwrap_err();
            assert!(expect(&err) && err.is_corruption(), "{case}: generations: {err}");
            assert!(err.to_string().contains(&path), "{case}: the message names the file: {err}");
            if damaged == 2 {
                let err = s.latest_generation().unwrap_err();
                assert!(expect(&err) && err.is_corruption(), "{case}: latest_generation: {err}");
                // The manifest of generation 1 could be fenced by the damaged record: undecidable.
                let err = s.list_checkpoints().unwrap_err();
                assert!(expect(&err), "{case}: list_checkpoints: {err}");
                assert!(expect(&s.verify(CheckpointId(3)).unwrap_err()), "{case}: verify 3");
                // Still superseded: the record's name says so.
                match s.check_not_fenced(Generation(1)) {
                    Err(StorageError::Superseded { newer, owner, .. }) => {
                        assert_eq!(newer, Generation(2));
                        assert!(owner.starts_with("owner unknown"), "{case}: {owner}");
                    }
                    other => panic!("{case}: expected Superseded, got {other:?}"),
                }
            } else {
                assert_eq!(s.latest_generation().unwrap().unwrap().owner, "host-2", "{case}");
                // A record of generation 1 can fence no manifest: generations 1 and 2 wrote them.
                let listed: Vec<(u64, bool)> =
                    s.list_checkpoints().unwrap().iter().map(|l| (l.id.0, l.complete)).collect();
                assert_eq!(listed, vec![(3, true), (4, true)], "{case}");
                s.verify(CheckpointId(3)).unwrap();
            }
            s.verify(CheckpointId(4)).unwrap(); // only records above generation 2 could fence it
            s.check_not_fenced(Generation(2)).unwrap();
            match (damaged, s.claim_generation(&record(damaged, None, "again"))) {
                // A damaged record still holds its generation.
                (2, Err(StorageError::GenerationTaken { owner, .. })) => {
                    assert!(owner.starts_with("owner unknown"), "{case}: {owner}")
                }
                (1, Err(StorageError::Superseded { newer: Generation(2), .. })) => {}
                (_, other) => panic!("{case}: claim again: {other:?}"),
            }
        }
    }
}

// ---- retention -----------------------------------------------------------------------------------

/// A gc case: generation records (generation, restored), commits (checkpoint, generation), what is
/// retained, and what must remain.
struct GcCase {
    name: &'static str,
    records: &'static [(u64, Option<u64>)],
    commits: &'static [(u64, u64)],
    retain: usize,
    /// What gc is told is in flight.
    in_flight: &'static [u64],
    /// Complete checkpoints after gc.
    checkpoints_after: &'static [u64],
    /// Generation records after gc.
    generations_after: &'static [u64],
    /// Damage the manifest of this checkpoint before gc.
    damage_manifest: Option<u64>,
}

const GC_CASES: &[GcCase] = &[
    GcCase {
        name: "records below the oldest retained manifest's generation go",
        records: &[(1, None), (2, None), (3, None), (4, Some(10)), (5, Some(11))],
        commits: &[(10, 3), (11, 4), (12, 5)],
        retain: 2,
        in_flight: &[],
        checkpoints_after: &[11, 12],
        generations_after: &[4, 5],
        damage_manifest: None,
    },
    GcCase {
        name: "a record that can still fence a retained manifest stays",
        records: &[(1, None), (2, None), (3, None), (4, Some(10)), (5, Some(11))],
        commits: &[(10, 3), (11, 4), (12, 5)],
        retain: 3,
        in_flight: &[],
        checkpoints_after: &[10, 11, 12],
        generations_after: &[3, 4, 5],
        damage_manifest: None,
    },
    GcCase {
        name: "the newest two records always stay",
        records: &[(1, None), (2, None), (3, Some(10)), (4, Some(11)), (5, Some(11))],
        commits: &[(10, 2), (11, 3), (12, 5), (13, 5)],
        retain: 2,
        in_flight: &[],
        checkpoints_after: &[12, 13],
        generations_after: &[4, 5],
        damage_manifest: None,
    },
    GcCase {
        name: "the only record stays",
        records: &[(1, None)],
        commits: &[(10, 1), (11, 1)],
        retain: 1,
        in_flight: &[],
        checkpoints_after: &[11],
        generations_after: &[1],
        damage_manifest: None,
    },
    GcCase {
        name: "retained manifests of the oldest generation keep every record",
        records: &[(1, None), (2, Some(10)), (3, Some(10)), (4, Some(10))],
        commits: &[(10, 1)],
        retain: 1,
        in_flight: &[],
        checkpoints_after: &[10],
        generations_after: &[1, 2, 3, 4],
        damage_manifest: None,
    },
    GcCase {
        name: "a zombie's fenced checkpoint does not count towards retention and is removed",
        records: &[(1, None), (2, Some(5))],
        commits: &[(4, 1), (5, 1), (6, 1), (7, 1)],
        retain: 1,
        in_flight: &[7], // the zombie still thinks of it as its attempt: it has a manifest, it goes
        checkpoints_after: &[5],
        generations_after: &[1, 2],
        damage_manifest: None,
    },
    GcCase {
        name: "an unreadable retained manifest keeps every record",
        records: &[(1, None), (2, None), (3, None), (4, Some(11))],
        commits: &[(10, 3), (11, 4), (12, 4)],
        retain: 2,
        in_flight: &[],
        checkpoints_after: &[11, 12],
        generations_after: &[1, 2, 3, 4],
        damage_manifest: Some(12),
    },
];

fn gc_case(h: &dyn Harness, case: &GcCase) {
    let s = h.store();
    let what = format!("{}: {}", h.name(), case.name);
    for &(generation, restored) in case.records {
        s.claim_generation(&record(generation, restored, "host")).unwrap();
    }
    for &(id, generation) in case.commits {
        commit(s, id, generation);
    }
    if let Some(id) = case.damage_manifest {
        h.flip_byte(&manifest_path(id), 20);
    }
    let fenced_before: Vec<u64> = s.list_checkpoints().unwrap().iter().filter(|l| l.fenced).map(|l| l.id.0).collect();
    let in_flight: Vec<CheckpointId> = case.in_flight.iter().map(|&id| CheckpointId(id)).collect();
    let report = s.gc(case.retain, &in_flight).unwrap();
    let complete: Vec<u64> = s.list_checkpoints().unwrap().iter().filter(|l| l.complete).map(|l| l.id.0).collect();
    assert_eq!(complete, case.checkpoints_after, "{what}: checkpoints");
    let generations: Vec<u64> = s.generations().unwrap().iter().map(|r| r.generation.0).collect();
    assert_eq!(generations, case.generations_after, "{what}: generation records");
    let removed: Vec<u64> = report.removed_generations.iter().map(|g| g.0).collect();
    let expected: Vec<u64> = case.records.iter().map(|r| r.0).filter(|g| !case.generations_after.contains(g)).collect();
    assert_eq!(removed, expected, "{what}: the report");
    for id in fenced_before {
        assert!(report.removed_checkpoints.contains(&CheckpointId(id)), "{what}: fenced {id} stayed");
        assert!(h.files().iter().all(|f| !f.starts_with(&dir_of(id))), "{what}: files of fenced {id} stayed");
    }
    for &id in case.checkpoints_after {
        if Some(id) != case.damage_manifest {
            s.verify(CheckpointId(id)).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
    // Idempotent.
    let again = s.gc(case.retain, &in_flight).unwrap();
    assert_eq!((again.removed_files, again.removed_generations.len()), (0, 0), "{what}: second gc");
}

pub fn gc_removes_only_records_that_can_fence_nothing_stored(h: &dyn Harness) {
    for case in GC_CASES {
        gc_case(&*h.fresh(), case);
    }
}

/// The zombie runs gc itself after its fenced commit (it has not noticed yet): it must not remove the
/// checkpoint that the newer generation restored, even with `retain = 1`.
pub fn a_zombie_gc_keeps_the_newer_generation_restore_point(h: &dyn Harness) {
    let s = h.store();
    commit(s, 5, 1);
    s.claim_generation(&record(2, Some(5), "new")).unwrap();
    commit(s, 6, 1);
    s.gc(1, &[]).unwrap();
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(5)), "{}", h.name());
    s.verify(CheckpointId(5)).unwrap();
    assert_eq!(s.list_checkpoints().unwrap().len(), 1, "{}", h.name());
}

/// Generation 1 completes 5; generation 2 takes over from 5 through its own client; the zombie
/// generation 1 then commits 6: 6 is fenced (never restored, removed by gc, even the zombie's own), 5
/// stays the latest until generation 2 commits 7.
pub fn a_zombie_with_its_own_client_is_fenced(h: &dyn Harness) {
    let zombie = h.another_client(); // the old coordinator's own client
    zombie.claim_generation(&record(1, None, "old-host/pid-1")).unwrap();
    commit(&*zombie, 5, 1);
    let s = h.store();
    s.claim_generation(&record(2, Some(5), "new-host/pid-2")).unwrap();
    zombie.check_not_fenced(Generation(1)).expect_err("superseded");
    commit(&*zombie, 6, 1); // it did not look
    for store in [s, &*zombie] {
        assert_eq!(store.latest_complete().unwrap(), Some(CheckpointId(5)));
        let listed = store.list_checkpoints().unwrap();
        assert_eq!(
            listed,
            vec![
                CheckpointListing { id: CheckpointId(5), complete: true, fenced: false },
                CheckpointListing { id: CheckpointId(6), complete: false, fenced: true },
            ]
        );
        match store.verify(CheckpointId(6)) {
            Err(StorageError::Fenced { checkpoint, generation, by }) => {
                assert_eq!((checkpoint, generation, by), (CheckpointId(6), Generation(1), Generation(2)))
            }
            other => panic!("{}: expected Fenced, got {other:?}", h.name()),
        }
    }
    match zombie.check_not_fenced(Generation(1)) {
        Err(StorageError::Superseded { newer, owner, .. }) => {
            assert_eq!((newer, owner.as_str()), (Generation(2), "new-host/pid-2"))
        }
        other => panic!("{}: expected Superseded, got {other:?}", h.name()),
    }
    s.check_not_fenced(Generation(2)).unwrap();
    // Even the zombie's own gc keeps generation 2's restore point and drops its fenced commit.
    let report = zombie.gc(1, &[]).unwrap();
    assert_eq!(report.removed_checkpoints, vec![CheckpointId(6)]);
    s.verify(CheckpointId(5)).unwrap();
    commit(s, 7, 2);
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(7)));
    s.verify(CheckpointId(7)).unwrap();
    let report = s.gc(1, &[]).unwrap();
    assert_eq!(report.removed_checkpoints, vec![CheckpointId(5)]);
    assert_eq!(report.removed_generations, vec![], "the newest two records always stay");
    assert_eq!(s.generations().unwrap().len(), 2);
}

/// A start that found a checkpoint committed between its listing and its claim releases the claim:
/// the checkpoint it fenced is complete again, and the generation can be claimed anew.
pub fn a_released_claim_fences_nothing_and_can_be_claimed_again(h: &dyn Harness) {
    let s = h.store();
    commit(s, 4, 1);
    s.claim_generation(&record(2, Some(4), "new")).unwrap();
    commit(s, 5, 1); // the old coordinator, in the gap
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(4)), "fenced by the claim");
    s.release_generation(Generation(2)).unwrap();
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(5)), "complete again once released");
    assert_eq!(s.latest_generation().unwrap(), None);
    s.claim_generation(&record(2, Some(5), "new")).unwrap();
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(5)));
    commit(s, 6, 1); // a later zombie commit is fenced by the new claim
    assert_eq!(s.latest_complete().unwrap(), Some(CheckpointId(5)));
}
