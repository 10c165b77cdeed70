//! State evolution: savepoints written by older versions of a job's state type, kept in
//! `tests/fixtures/`, restored by jobs whose state type changed since. A compatible change (a new
//! field with a default, a field renamed with an alias) restores; an incompatible one is refused at
//! start, naming the operator and both types; a registered migration upgrades the old state.
//!
//! The fixtures are real savepoints. Regenerate them (only when their format is meant to change)
//! with `cargo test --release -p cutline --features testing --test state_evolution -- --ignored`.

use cutline::{
    GeneratorSource, Job, JobGraph, KeyedProcess, KeyedStream, LocalDirStore, MemoryTxnSink, MemoryTxnStore,
};
use cutline::{Output, Stream};
use cutline::{RestartStrategy, RunConfig};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const KEYS: u64 = 10;
const FINGERPRINT: &str = "state-evolution-v1";

/// The state type the fixtures were written with.
mod v1 {
    use super::*;
    #[derive(Clone, Debug, Serialize, Deserialize)]
    pub struct Tally {
        pub count: u64,
        pub last: u64,
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The job that wrote the fixtures: event `i` has key `i % KEYS`; the state counts a key's events
/// and keeps the last one.
fn v1_job(events: u64) -> JobGraph {
    let job = Job::new("evolution");
    job.set_parallelism(1);
    job.source("events", GeneratorSource::new(events, |i| (i % KEYS, i)))
        .key_by(|e: &(u64, u64)| e.0)
        .process("tally", |_k: &u64, s: &mut Option<v1::Tally>, e: (u64, u64), _out: &mut Output<String>| {
            let t = s.get_or_insert(v1::Tally { count: 0, last: 0 });
            t.count += 1;
            t.last = e.1;
        })
        .sink("out", MemoryTxnSink::new(Arc::new(Mutex::new(MemoryTxnStore::default()))));
    job.build().expect("valid job")
}

fn config(dir: &Path) -> RunConfig {
    let mut cfg = RunConfig::new(Arc::new(LocalDirStore::open(dir).unwrap()), FINGERPRINT);
    cfg.checkpoint.interval_ms = Some(20);
    cfg.restart = RestartStrategy::None;
    cfg
}

/// Write a fixture savepoint: the v1 job on an endless input, stopped with a savepoint.
fn write_fixture(name: &str) {
    let target = fixture(name);
    let _ = std::fs::remove_dir_all(&target);
    let state = tempfile::tempdir().unwrap();
    let handle = cutline::spawn(v1_job(u64::MAX / 2), config(state.path()));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let info = handle.stop_with_savepoint(Some(target.clone())).expect("savepoint");
    handle.join().expect("the v1 job stops");
    println!("wrote {} ({info:?})", target.display());
}

/// A compatible change of `v1::Tally`: `count` renamed (declared with an alias), a field added
/// with a default.
mod v2 {
    use super::*;
    #[derive(Clone, Debug, Serialize, Deserialize)]
    pub struct Tally {
        #[serde(alias = "count")]
        pub events: u64,
        pub last: u64,
        #[serde(default)]
        pub note: String,
    }
}

/// Incompatible changes: a field's type changed; a field added without a default.
mod v3 {
    use super::*;
    #[derive(Clone, Debug, Serialize, Deserialize)]
    pub struct Tally {
        pub count: String,
        pub last: u64,
    }
    #[derive(Clone, Debug, Serialize, Deserialize)]
    pub struct Required {
        pub count: u64,
        pub last: u64,
        pub since: u64,
    }
}

/// A keyed operator that only shows its restored state at the end of the input.
struct Show<S>(fn(&u64, &S) -> String);

impl<S: Clone + Send + Sync + Serialize + DeserializeOwned + 'static> KeyedProcess<u64, (u64, u64), String>
    for Show<S>
{
    type State = S;
    fn process(&self, _: &u64, _: &mut Option<S>, _: (u64, u64), _: &mut Output<String>) {}
    fn end_of_input(&self, key: &u64, state: &mut Option<S>, out: &mut Output<String>) {
        if let Some(s) = state {
            out.emit((self.0)(key, s));
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Restore the fixture savepoint `name` into a job whose keyed operator `op` makes of the keyed
/// stream, and return what it emits, sorted; or the run's error.
fn run_restored(
    name: &str,
    op: impl FnOnce(KeyedStream<u64, (u64, u64)>) -> Stream<String>,
) -> Result<Vec<String>, String> {
    // Nothing new to read: the restored offset is past the end, so the input ends at once.
    run_restored_at(name, 1, 0, op)
}

/// [`run_restored`] with every stage at `parallelism`, the input now `events` long.
fn run_restored_at(
    name: &str,
    parallelism: u32,
    events: u64,
    op: impl FnOnce(KeyedStream<u64, (u64, u64)>) -> Stream<String>,
) -> Result<Vec<String>, String> {
    let (savepoint, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    copy_dir(&fixture(name), savepoint.path());
    let out = Arc::new(Mutex::new(MemoryTxnStore::default()));
    let job = Job::new("evolution");
    job.set_parallelism(parallelism);
    op(job.source("events", GeneratorSource::new(events, |i| (i % KEYS, i))).key_by(|e: &(u64, u64)| e.0))
        .sink("out", MemoryTxnSink::new(out.clone()));
    let mut cfg = config(state.path());
    cfg.from_savepoint = Some(savepoint.path().to_path_buf());
    cutline::run(&job.build().expect("valid job"), cfg).map_err(|e| e.to_string())?;
    let mut got = out.lock().unwrap().committed_records();
    got.sort();
    Ok(got)
}

/// [`run_restored`] into an operator keeping state `S` that shows every key's state at the end.
fn restored<S: Clone + Send + Sync + Serialize + DeserializeOwned + 'static>(
    name: &str,
    show: fn(&u64, &S) -> String,
) -> Result<Vec<String>, String> {
    run_restored(name, |keyed| keyed.process_with("tally", Show(show)))
}

/// The fixtures' state is consistent: key `k` saw events `k, k + KEYS, ...` up to `last`.
fn assert_consistent(got: &[String], what: &str) {
    assert_eq!(got.len() as u64, KEYS, "{what}: one line per key: {got:?}");
    for line in got {
        let v: Vec<u64> = line.split(' ').map(|x| x.parse().expect("numbers")).collect();
        let (k, count, last) = (v[0], v[1], v[2]);
        assert!(count > 1, "{what}: {line}");
        assert_eq!((last % KEYS, last / KEYS + 1), (k, count), "{what}: `{line}` is not a restored tally");
    }
}

#[test]
fn a_savepoint_from_before_state_types_were_recorded_restores_as_it_was_written() {
    let got = restored("v1-before-schemas", |k, t: &v1::Tally| format!("{k} {} {}", t.count, t.last)).unwrap();
    assert_consistent(&got, "v1 before schemas");
}

/// The v1 tally, going on counting, showing every key's state at the end of the input.
struct Count;

impl KeyedProcess<u64, (u64, u64), String> for Count {
    type State = v1::Tally;
    fn process(&self, _: &u64, s: &mut Option<v1::Tally>, e: (u64, u64), _: &mut Output<String>) {
        let t = s.get_or_insert(v1::Tally { count: 0, last: 0 });
        t.count += 1;
        t.last = t.last.max(e.1); // events of a key come from several source subtasks
    }
    fn end_of_input(&self, key: &u64, s: &mut Option<v1::Tally>, out: &mut Output<String>) {
        if let Some(t) = s {
            out.emit(format!("{key} {} {}", t.count, t.last));
        }
    }
}

/// The fixtures were written at parallelism 1, by a version whose generator offset was a bare
/// index (before sources could rescale). Restored with every stage at another parallelism, the
/// input resumes exactly where the savepoint stood: every event counted once.
#[test]
fn a_savepoint_from_before_rescaling_existed_restores_at_another_parallelism() {
    let stood = restored("v1", |k, t: &v1::Tally| format!("{k} {} {}", t.count, t.last)).unwrap();
    let read = stood.iter().map(|l| l.split(' ').nth(2).unwrap().parse::<u64>().unwrap()).max().unwrap() + 1;
    for parallelism in [3, 2] {
        let events = read + 5000;
        let got = run_restored_at("v1", parallelism, events, |k| k.process_with("tally", Count)).unwrap();
        assert_consistent(&got, &format!("v1 at parallelism {parallelism}"));
        for line in &got {
            let last: u64 = line.split(' ').nth(2).unwrap().parse().unwrap();
            assert!(last + KEYS >= events, "the input was not read to its end: {line} of {events} events");
        }
    }
}

#[test]
fn an_unchanged_state_type_restores() {
    let got = restored("v1", |k, t: &v1::Tally| format!("{k} {} {}", t.count, t.last)).unwrap();
    assert_consistent(&got, "v1");
}

#[test]
fn a_renamed_field_with_an_alias_and_a_new_field_with_a_default_restore() {
    let got = restored("v1", |k, t: &v2::Tally| {
        assert_eq!(t.note, "", "the new field takes its default");
        format!("{k} {} {}", t.events, t.last)
    })
    .unwrap();
    assert_consistent(&got, "v1 -> v2");
}

#[test]
fn an_incompatible_state_type_is_refused_naming_the_operator_and_both_types() {
    for (err, missing) in [
        (restored("v1", |_, _: &v3::Tally| String::new()).err(), "invalid type"),
        (restored("v1", |_, _: &v3::Required| String::new()).err(), "missing field `since`"),
    ] {
        let e = err.expect("an incompatible change restores nothing");
        for part in ["tally", "state_evolution::v1::Tally", "state_evolution::v3::", missing, "serde(default)"] {
            assert!(e.contains(part), "the error names `{part}`: {e}");
        }
    }
}

/// A change serde cannot read by itself, with the user's upgrade.
mod v4 {
    use super::*;
    #[derive(Clone, Debug, Serialize, Deserialize)]
    pub struct Tally {
        pub count: String,
        pub last_seen: [u64; 2],
    }
}

/// [`restored`] with a migration from `v1::Tally` to `v4::Tally` before the keyed operator.
fn restored_migrating(name: &str) -> Result<Vec<String>, String> {
    run_restored(name, |keyed| {
        keyed
            .migrate_state(|old: v1::Tally| v4::Tally { count: old.count.to_string(), last_seen: [old.last, 0] })
            .process_with("tally", Show(|k, t: &v4::Tally| format!("{k} {} {}", t.count, t.last_seen[0])))
    })
}

#[test]
fn a_registered_migration_upgrades_state_of_the_old_type() {
    assert_consistent(&restored_migrating("v1").unwrap(), "v1 -> v4 migrated");
    // Before types were recorded, the migration is taken at its word.
    assert_consistent(&restored_migrating("v1-before-schemas").unwrap(), "v1 before schemas -> v4 migrated");
    // Without it, the same change is refused.
    let e = restored("v1", |_, _: &v4::Tally| String::new()).expect_err("refused without the migration");
    assert!(e.contains("state_evolution::v4::Tally"), "{e}");
}

#[test]
#[ignore = "writes the fixtures; run by hand"]
fn write_the_fixtures() {
    // `v1-before-schemas` was written by cutline before state types were recorded (9501e9e) and
    // cannot be written again.
    write_fixture("v1");
}
