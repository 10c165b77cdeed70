//! The library half of the `cutline` command: the jobs it runs (word count, the keyed benchmark, the
//! backlog benchmark, drills), the check of word count's output and the keyed benchmark's tally of
//! the work it did, shared with its integration tests.
//! The command itself is `src/main.rs`.

pub mod endpoints;
pub mod jobs;
pub mod tally;
