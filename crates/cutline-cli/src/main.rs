//! The `cutline` command: run the word-count job, tune it, take savepoints of it and show its status
//! while it runs (through its admin socket, `<state>/admin.sock`), list checkpoints, run failure drills
//! and benchmarks.

mod admin_cmd;
mod args;
mod bench;
mod bench_metrics;
mod bench_nexmark;
mod bench_timers;
mod cluster_cmd;
mod demo;
mod logging;
mod observe;
mod run;
mod signals;

use admin_cmd::{list_checkpoints, savepoint, status, trace, tune};
use args::{RunJob, TuneArgs};
use bench::{bench, bench_backlog, bench_coordinator, BenchArgs};

#[cfg(feature = "kafka")]
mod bench_kafka;
#[cfg(feature = "kafka")]
use bench_kafka::{bench_kafka, bench_kafka_latency};
#[cfg(not(feature = "kafka"))]
fn bench_kafka(_: &str, _: u64, _: u64, _: i32, _: &str, _: u32, _: u32) -> anyhow::Result<()> {
    anyhow::bail!("this cutline was built without Kafka support: build it with `--features kafka`")
}
#[cfg(not(feature = "kafka"))]
fn bench_kafka_latency(_: &str, _: &str, _: u64, _: u64, _: u64, _: i32) -> anyhow::Result<()> {
    bench_kafka("", 0, 0, 0, "", 0, 0)
}
#[cfg(feature = "postgres")]
mod bench_pg;
#[cfg(feature = "postgres")]
use bench_pg::bench_postgres;
#[cfg(not(feature = "postgres"))]
fn bench_postgres(_: &str, _: u64, _: u64, _: u64, _: &str, _: u32) -> anyhow::Result<()> {
    anyhow::bail!("this cutline was built without PostgreSQL support: build it with `--features postgres`")
}
use clap::{Parser, Subcommand};
use cluster_cmd::{launch_cluster, worker};
use demo::{demo, drill};
use run::{run_nexmark, run_wordcount};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "cutline", version, about = "A stream-processing engine whose checkpoints are consistent cuts")]
struct Cli {
    /// Show informational events too (every checkpoint, restore and restart), not only warnings and
    /// errors. `CUTLINE_LOG_FORMAT=json` prints every event as a JSON object with its fields.
    #[arg(long, short, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Benchmarks under `cutline bench`.
#[derive(Subcommand, Debug)]
enum BenchOther {
    /// A Nexmark query over generated events, with checkpoints every `--checkpoint-interval` and
    /// without, in alternating pairs; rates only when the committed rows match the query's batch
    /// reference.
    Nexmark {
        /// q0-q8, q11 or q12.
        #[arg(long)]
        query: cutline_nexmark::Query,
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        /// Checkpoint interval of the measured run (e.g. 1s); the other run has none but the final one.
        #[arg(long, default_value = "1s")]
        checkpoint_interval: String,
        /// Pairs of runs (the medians are printed).
        #[arg(long, default_value_t = 1)]
        reps: u32,
    },
    /// How fast the HTTP endpoint answers `/metrics` and `/api/status` for a job of `--tasks` tasks
    /// (every answer checked to hold every task).
    Metrics {
        #[arg(long, default_value_t = 1_000)]
        tasks: u32,
        #[arg(long, default_value_t = 100)]
        requests: u32,
        /// Sources run flat out (the job saturates every core) instead of trickling.
        #[arg(long)]
        busy: bool,
    },
    /// Checkpoints of a keyed operator with `--timers` pending event-time timers, and while one
    /// watermark makes them all due (figures only when every timer fired).
    Timers {
        #[arg(long, default_value_t = 10_000_000)]
        timers: u64,
        /// Checkpoint interval (e.g. 500ms).
        #[arg(long, default_value = "500ms")]
        checkpoint_interval: String,
    },
}

#[derive(Subcommand)]
// Parsed once per process; boxing the large variant would only add noise.
#[allow(clippy::large_enum_variant)]
enum Cmd {
    /// Run a job.
    Run {
        #[command(subcommand)]
        job: RunJob,
    },
    /// Word count over a bundled text with one injected crash: shows a checkpoint, a failure, a restore
    /// and checks the output.
    Demo {
        /// Where to put the demo's input, output and state (default: a fresh temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// List the complete checkpoints of a state directory and verify them.
    Checkpoints {
        #[arg(long)]
        state: PathBuf,
    },
    /// Change the checkpoint settings of the job running on a state directory; print the settings now
    /// in force (all of them, also when no option is given). They apply from the next checkpoint.
    Tune {
        /// The state directory of the running job.
        #[arg(long)]
        state: PathBuf,
        #[command(flatten)]
        settings: TuneArgs,
    },
    /// Take a savepoint of the job running on a state directory and print its directory.
    Savepoint {
        /// The state directory of the running job.
        #[arg(long)]
        state: PathBuf,
        /// A new or empty directory for the savepoint (default: the job's savepoint directory).
        #[arg(long)]
        to: Option<PathBuf>,
        /// Stop the job with the savepoint: it drains, commits its output up to the savepoint and stops.
        #[arg(long)]
        stop: bool,
    },
    /// Show the settings, flow control and recent checkpoints of the job running on a state directory.
    Status {
        /// The state directory of the running job.
        #[arg(long)]
        state: PathBuf,
        /// Print the job's metrics as one JSON object (for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Show how one completed checkpoint went through the job (its epoch trace): when its barrier
    /// reached each input of each task, the snapshots, uploads and acks, the commit, and the slowest
    /// step. Works on a running or a stopped job.
    Trace {
        /// The job's state directory.
        #[arg(long)]
        state: PathBuf,
        /// Where the checkpoints are, if not in the state directory (as `cutline run --checkpoint-store`).
        #[arg(long, value_name = "URL")]
        checkpoint_store: Option<String>,
        /// The checkpoint id, or `latest`.
        #[arg(long, default_value = "latest")]
        checkpoint: String,
        /// Print the trace as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Failure drill: run word count while injecting failures, restore, compare with a failure-free run.
    Drill {
        /// Seed of the first run (each run uses seed, seed+1, ...).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Number of drill runs.
        #[arg(long, default_value_t = 5)]
        runs: u64,
        /// Number of simulated seeds run first (deterministic protocol simulation).
        #[arg(long, default_value_t = 200)]
        sim_seeds: u64,
    },
    /// Join a cluster as a worker: run the tasks its coordinator places here, until the job is over.
    Worker {
        /// The coordinator's address (its --coordinator).
        #[arg(long, value_name = "HOST:PORT")]
        join: String,
        /// The cluster's secret (see `cutline run wordcount --secret-file`).
        #[arg(long, env = "CUTLINE_SECRET_FILE")]
        secret_file: Option<PathBuf>,
        /// Where other workers reach this one's data plane.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// The host (or host:port) other workers use to reach this one, when --listen is 0.0.0.0.
        #[arg(long)]
        advertise: Option<String>,
        /// How long to keep trying to reach a coordinator that is gone before exiting.
        #[arg(long, default_value = "60s")]
        rejoin_timeout: String,
        /// Seal every frame (see `cutline run wordcount --frame-protection`): auto, on or off; the
        /// coordinator and the other workers must agree.
        #[arg(long, default_value = "auto", value_name = "auto|on|off")]
        frame_protection: cutline::cluster::FrameProtection,
        /// Drills: SIGKILL this worker the Nth time one of its tasks reaches POINT (see `cutline run
        /// wordcount --kill-self-at`); a worker started again without it runs normally.
        #[arg(long, value_name = "POINT:N", hide = true)]
        kill_self_at: Option<String>,
        /// Serve health probes (/healthz, /readyz) and metrics (/metrics) on this address (e.g.
        /// 0.0.0.0:9471 in a container), or `off`.
        #[arg(long, default_value = "off", value_name = "HOST:PORT|off")]
        http: String,
    },
    /// Start a coordinator and N workers on this machine (a local cluster) for a job, and restart any
    /// of them that dies until the job is over.
    Cluster {
        /// Worker processes.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// The job and its options, as for `cutline run` (e.g. `wordcount --input ... --state ...`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        job: Vec<String>,
    },
    /// The keyed COUNT+SUM benchmark (or, with a subcommand, another one).
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        other: Option<BenchOther>,
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        /// After one event for each of the `--keys` keys, draw keys from the first this many only
        /// (0: every event draws from all keys): how many keys change per checkpoint interval.
        #[arg(long, default_value_t = 0)]
        hot_keys: u64,
        /// Write every checkpoint whole (default: incremental, only the keyed state that changed).
        #[arg(long)]
        full_checkpoints: bool,
        #[command(flatten)]
        state_backend: args::StateBackendArgs,
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        /// Checkpoint interval (e.g. 100ms, 1s) or `off`.
        #[arg(long, default_value = "1s")]
        checkpoint_interval: String,
        /// Checkpoints in flight at once.
        #[arg(long, default_value_t = 1)]
        max_concurrent: usize,
        /// A checkpoint not complete this long after its trigger is aborted (whole snapshots of
        /// very large state on disk may need more than the default).
        #[arg(long, default_value = "60s")]
        checkpoint_timeout: String,
        /// Run on this many worker processes of a local cluster (0: every task in this process).
        #[arg(long, default_value_t = 0)]
        workers: usize,
        /// Checkpoint storage: a directory or `s3://BUCKET/PREFIX` (default: a fresh temporary
        /// directory, removed afterwards).
        #[arg(long)]
        state: Option<String>,
        /// With --workers: SIGKILL worker 0 this long after the start (and start a replacement at
        /// once), and report how long the job took to run again.
        #[arg(long)]
        kill_worker_after: Option<String>,
        /// Batches per channel (credit).
        #[arg(long, default_value_t = cutline::runtime::DEFAULT_CHANNEL_CAPACITY)]
        channel_capacity: usize,
        /// With --workers: seal the cluster's frames (auto: not on loopback, so `on` measures it).
        #[arg(long, default_value = "auto", value_name = "auto|on|off")]
        frame_protection: cutline::cluster::FrameProtection,
        /// Serve the job's HTTP endpoint and scrape /metrics this often while it runs (in one
        /// process only), as a Prometheus server would: what watching the job costs it.
        #[arg(long)]
        scrape_every: Option<String>,
    },
    /// How long the coordinator takes per checkpoint for many simulated tasks, with acknowledgements
    /// aggregated per worker (one message per worker) or not (one per task).
    BenchCoordinator {
        #[arg(long, default_value_t = 10_000)]
        tasks: u32,
        /// Worker counts to measure, comma-separated; 0 means no aggregation.
        #[arg(long, default_value = "0,10,100")]
        workers: String,
        /// Measured checkpoints per configuration (after 20 unmeasured ones).
        #[arg(long, default_value_t = 200)]
        checkpoints: u32,
    },
    /// Rows per second of the exactly-once PostgreSQL sink (upsert, through the engine with
    /// checkpoints) against a bare multi-row upsert loop of the same client; needs `--features postgres`.
    BenchPostgres {
        /// Connection string of the database to write into (tables bench_pg_engine, bench_pg_bare).
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 2_000_000)]
        rows: u64,
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        #[arg(long, default_value_t = 1_000)]
        batch_rows: u64,
        #[arg(long, default_value = "1s")]
        checkpoint_interval: String,
        #[arg(long, default_value_t = 3)]
        reps: u32,
    },
    /// Records per second of Kafka -> keyed COUNT+SUM -> exactly-once Kafka through the engine with
    /// checkpoints, against a bare consume-aggregate-produce loop of the same client with
    /// transactions at the same interval; needs `--features kafka`.
    BenchKafka {
        /// Bootstrap brokers (topics bench-kafka-* are created).
        #[arg(long)]
        brokers: String,
        #[arg(long, default_value_t = 500_000)]
        records: u64,
        #[arg(long, default_value_t = 10_000)]
        keys: u64,
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        #[arg(long, default_value = "1s")]
        checkpoint_interval: String,
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        #[arg(long, default_value_t = 3)]
        reps: u32,
    },
    /// End-to-end latency (p50, p99, max) of Kafka -> keyed count -> exactly-once Kafka: from a
    /// record's timestamp at the producer to a `read_committed` reader seeing its update, at each
    /// checkpoint interval; needs `--features kafka`.
    BenchKafkaLatency {
        /// Bootstrap brokers (topics bench-kafka-lat-* are created).
        #[arg(long)]
        brokers: String,
        /// Checkpoint intervals to measure, comma-separated.
        #[arg(long, default_value = "100ms,1s")]
        intervals: String,
        /// Records produced per second.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Seconds of producing per interval (the first is warm-up).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 1_000)]
        keys: u64,
        #[arg(long, default_value_t = 4)]
        partitions: i32,
    },
    /// Checkpoints in front of a backlog: one slow task with about 10 s of data queued in front of it,
    /// checkpointed aligned, unaligned, or aligned with a timeout.
    BenchBacklog {
        /// `aligned`, `unaligned` or `timeout` (aligned, switching after --alignment-timeout).
        #[arg(long, default_value = "unaligned")]
        mode: String,
        #[arg(long, default_value = "200ms")]
        alignment_timeout: String,
        /// How long the job runs.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Records per second the slow task processes.
        #[arg(long, default_value_t = 6400)]
        slow_rate: u64,
        /// Batches per channel: the backlog is about capacity x batch size / slow rate seconds.
        #[arg(long, default_value_t = 64)]
        channel_capacity: usize,
        #[arg(long, default_value_t = 1024)]
        batch_size: usize,
        #[arg(long, default_value = "1s")]
        checkpoint_interval: String,
    },
}

fn main() {
    let cli = Cli::parse();
    // The demo's point is to show the checkpoints, the failure and the restore.
    logging::init(cli.verbose || matches!(cli.cmd, Cmd::Demo { .. }));
    let result = match cli.cmd {
        Cmd::Run { job: RunJob::Wordcount(args) } => run_wordcount(&args),
        Cmd::Run { job: RunJob::Nexmark(args) } => run_nexmark(&args),
        Cmd::Demo { dir } => demo(dir),
        Cmd::Checkpoints { state } => list_checkpoints(&state),
        Cmd::Tune { state, settings } => tune(&state, &settings),
        Cmd::Savepoint { state, to, stop } => savepoint(&state, to.as_deref(), stop),
        Cmd::Status { state, json } => status(&state, json),
        Cmd::Trace { state, checkpoint_store, checkpoint, json } => {
            trace(&state, checkpoint_store.as_deref(), &checkpoint, json)
        }
        Cmd::Drill { seed, runs, sim_seeds } => drill(seed, runs, sim_seeds),
        Cmd::Worker { join, secret_file, listen, advertise, rejoin_timeout, frame_protection, kill_self_at, http } => {
            match kill_self_at.as_deref().map(run::kill_self_at).transpose() {
                Ok(faults) => {
                    let faults = faults.unwrap_or_default();
                    let a = cluster_cmd::WorkerArgs { join, listen, advertise, frame_protection, http };
                    worker(a, secret_file.as_deref(), &rejoin_timeout, faults)
                }
                Err(e) => Err(e),
            }
        }
        Cmd::Cluster { workers, job } => launch_cluster(workers, &job, cli.verbose),
        Cmd::BenchCoordinator { tasks, workers, checkpoints } => bench_coordinator(tasks, &workers, checkpoints),
        Cmd::Bench {
            other: Some(BenchOther::Nexmark { query, events, parallelism, checkpoint_interval, reps }),
            ..
        } => bench_nexmark::bench_nexmark(query, events, parallelism, &checkpoint_interval, reps),
        Cmd::Bench { other: Some(BenchOther::Timers { timers, checkpoint_interval }), .. } => {
            bench_timers::bench_timers(timers, &checkpoint_interval)
        }
        Cmd::Bench { other: Some(BenchOther::Metrics { tasks, requests, busy }), .. } => {
            bench_metrics::bench_metrics(tasks, requests, busy)
        }
        Cmd::Bench {
            other: None,
            events,
            keys,
            hot_keys,
            full_checkpoints,
            state_backend,
            parallelism,
            checkpoint_interval,
            max_concurrent,
            checkpoint_timeout,
            workers,
            state,
            kill_worker_after,
            channel_capacity,
            frame_protection,
            scrape_every,
        } => bench(&BenchArgs {
            hot_keys,
            full_checkpoints,
            state_backend,
            channel_capacity,
            frame_protection,
            scrape_every,
            events,
            keys,
            parallelism,
            interval: checkpoint_interval,
            max_concurrent,
            checkpoint_timeout,
            workers,
            state,
            kill_worker_after,
        }),
        Cmd::BenchKafka { brokers, records, keys, partitions, checkpoint_interval, parallelism, reps } => {
            bench_kafka(&brokers, records, keys, partitions, &checkpoint_interval, parallelism, reps)
        }
        Cmd::BenchKafkaLatency { brokers, intervals, rate, seconds, keys, partitions } => {
            bench_kafka_latency(&brokers, &intervals, rate, seconds, keys, partitions)
        }
        Cmd::BenchPostgres { url, rows, keys, batch_rows, checkpoint_interval, reps } => {
            bench_postgres(&url, rows, keys, batch_rows, &checkpoint_interval, reps)
        }
        Cmd::BenchBacklog {
            mode,
            alignment_timeout,
            seconds,
            slow_rate,
            channel_capacity,
            batch_size,
            checkpoint_interval,
        } => bench_backlog(
            &mode,
            &alignment_timeout,
            seconds,
            slow_rate,
            channel_capacity,
            batch_size,
            &checkpoint_interval,
        ),
    };
    if let Err(e) = result {
        // Stopped by SIGTERM or SIGINT: not a failure, but not the end of the job either.
        if let Some(s) = e.downcast_ref::<signals::StoppedBySignal>() {
            eprintln!("cutline: {s}");
            std::process::exit(s.exit_code());
        }
        eprintln!("error: {e:#}");
        std::process::exit(if cluster_cmd::worker_refused(&e) { cluster_cmd::EXIT_WORKER_REFUSED } else { 1 });
    }
}
