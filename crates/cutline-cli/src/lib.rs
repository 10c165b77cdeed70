//! The library half of the `cutline` command: the jobs it runs (word count, the keyed benchmark, the
//! backlog benchmark, drills) and the check of word count's output, shared with its integration tests.
//! The command itself is `src/main.rs`.

pub mod jobs;
