//! The `cutline` command: run the word-count job, tune it, take savepoints of it and show its status
//! while it runs (through its admin socket, `<state>/admin.sock`), list checkpoints, run failure drills
//! and benchmarks.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use cutline::admin::{self, AdminError};
use cutline::cluster::{ClusterConfig, WorkerConfig};
use cutline::{CheckpointConfig, CheckpointMode, CheckpointStore, LocalDirStore, RunConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "cutline", version, about = "A stream-processing engine whose checkpoints are consistent cuts")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
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
    /// The keyed COUNT+SUM benchmark.
    Bench {
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        /// Checkpoint interval (e.g. 100ms, 1s) or `off`.
        #[arg(long, default_value = "1s")]
        checkpoint_interval: String,
        /// Checkpoints in flight at once.
        #[arg(long, default_value_t = 1)]
        max_concurrent: usize,
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

#[derive(Subcommand)]
enum RunJob {
    /// Count words of a text file; every count update goes to DIR through the transactional file sink.
    /// While it runs, it answers `cutline status`, `tune` and `savepoint` on `<state>/admin.sock`.
    Wordcount(WordcountArgs),
}

#[derive(Args)]
struct WordcountArgs {
    #[arg(long)]
    input: PathBuf,
    #[arg(long)]
    output: PathBuf,
    #[arg(long)]
    state: PathBuf,
    #[arg(long, default_value_t = 1)]
    parallelism: u32,
    /// Checkpoint interval (e.g. 200ms, 1s) or `off`.
    #[arg(long, default_value = "200ms")]
    checkpoint_interval: String,
    #[arg(long, default_value = "exactly-once")]
    mode: String,
    #[command(flatten)]
    tuning: CheckpointTuning,
    /// Start from this savepoint (a directory `cutline savepoint` printed) if the state directory holds
    /// no checkpoint yet; the input and output must be those of the job the savepoint was taken from.
    #[arg(long)]
    from_savepoint: Option<PathBuf>,
    /// Where savepoints go when `cutline savepoint` names no directory (default: <state>/savepoints).
    #[arg(long)]
    savepoint_dir: Option<PathBuf>,
    /// Sleep this many microseconds per input line (and read in batches of 64 lines), to watch a small
    /// input being processed.
    #[arg(long, default_value_t = 0)]
    line_delay_us: u64,
    /// Print a line per checkpoint and failure.
    #[arg(long, short)]
    verbose: bool,
    /// Put checkpoints here instead of in the state directory: `s3://BUCKET/PREFIX` on an
    /// S3-compatible store (endpoint and credentials from CUTLINE_S3_ENDPOINT / AWS_* variables;
    /// needs a build with `--features s3`), or another directory. The state directory keeps the admin
    /// socket (and a cluster's secret).
    #[arg(long, value_name = "URL")]
    checkpoint_store: Option<String>,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// Run the job as the coordinator of worker processes (see `cutline worker`).
#[derive(Args, Clone)]
struct ClusterArgs {
    /// Be the coordinator of a cluster: listen for workers on this address (e.g. 0.0.0.0:7070) and
    /// run the tasks on them, none in this process.
    #[arg(long, value_name = "ADDR")]
    coordinator: Option<String>,
    /// Workers a generation runs on when all are there (with --coordinator).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// After a worker is lost, run on this many if no replacement joins within --replacement-wait.
    #[arg(long, default_value_t = 1)]
    min_workers: usize,
    /// How long a restart waits for lost workers to be replaced.
    #[arg(long, default_value = "5s")]
    replacement_wait: String,
    /// File holding the cluster's shared secret (at least 16 bytes; make one with
    /// `head -c 32 /dev/urandom | base64 > cluster.secret`). Default: $CUTLINE_SECRET_FILE.
    #[arg(long, env = "CUTLINE_SECRET_FILE")]
    secret_file: Option<PathBuf>,
    /// Interval of heartbeats between coordinator and workers, both ways.
    #[arg(long, default_value = "200ms")]
    heartbeat_interval: String,
    /// A peer silent this long is lost.
    #[arg(long, default_value = "3s")]
    heartbeat_timeout: String,
}

fn read_secret(path: Option<&Path>) -> Result<Vec<u8>> {
    let Some(path) = path else {
        bail!("a cluster needs a shared secret: pass --secret-file FILE (make one with `head -c 32 /dev/urandom | base64 > cluster.secret`) or set CUTLINE_SECRET_FILE");
    };
    let bytes = std::fs::read(path).with_context(|| format!("cannot read the secret file {}", path.display()))?;
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map(|i| i + 1).unwrap_or(0);
    Ok(bytes[..end].to_vec())
}

fn ms_flag(name: &str, v: &str) -> Result<u64> {
    admin::parse_duration_ms(v).map_err(|e| anyhow::anyhow!("--{name}: bad duration {v:?}: {e}"))
}

/// The job part of a `cutline run wordcount` command line, as workers rebuild it.
#[derive(Parser)]
#[command(name = "job", no_binary_name = true)]
enum JobSpec {
    Wordcount {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: PathBuf,
        #[arg(long)]
        parallelism: u32,
        #[arg(long)]
        line_delay_us: u64,
    },
    Bench {
        #[arg(long)]
        events: u64,
        #[arg(long)]
        keys: u64,
        #[arg(long)]
        parallelism: u32,
    },
}

/// Build the job a coordinator names (on a worker): the graph and its fingerprint.
fn build_job(args: &[String]) -> std::result::Result<(cutline::JobGraph, String), String> {
    let spec = JobSpec::try_parse_from(args).map_err(|e| e.to_string())?;
    let (input, output, parallelism, line_delay_us) = match spec {
        JobSpec::Wordcount { input, output, parallelism, line_delay_us } => (input, output, parallelism, line_delay_us),
        JobSpec::Bench { events, keys, parallelism } => {
            let graph = cutline::jobs::keyed_bench(events, keys, parallelism).build().map_err(|e| e.to_string())?;
            return Ok((graph, "bench".into()));
        }
    };
    let fingerprint = format!("wordcount input={} output={}", input.display(), output.display());
    let graph =
        cutline::jobs::wordcount_paced(&input, parallelism, cutline::jobs::wordcount_file_sink(&output), line_delay_us)
            .build()
            .map_err(|e| e.to_string())?;
    Ok((graph, fingerprint))
}

/// Open checkpoint storage: a directory, or `s3://BUCKET[/PREFIX]` (with the `s3` feature; the
/// endpoint and credentials come from the environment, see `S3Config::from_env`).
fn open_store(state: &str) -> std::result::Result<Arc<dyn CheckpointStore>, String> {
    if let Some(rest) = state.strip_prefix("s3://") {
        return open_s3(rest);
    }
    LocalDirStore::open(Path::new(state))
        .map(|s| Arc::new(s) as Arc<dyn CheckpointStore>)
        .map_err(|e| format!("cannot open state directory {state}: {e}"))
}

#[cfg(feature = "s3")]
fn open_s3(rest: &str) -> std::result::Result<Arc<dyn CheckpointStore>, String> {
    use cutline_storage::{S3Config, S3Store};
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let mut cfg = S3Config::from_vars(|name| match name {
        "CUTLINE_S3_BUCKET" => Some(bucket.to_string()),
        "CUTLINE_S3_PREFIX" => Some(prefix.trim_matches('/').to_string()),
        other => std::env::var(other).ok(),
    })
    .map_err(|e| e.to_string())?;
    cfg.prefix = prefix.trim_matches('/').to_string();
    S3Store::open(cfg).map(|s| Arc::new(s) as Arc<dyn CheckpointStore>).map_err(|e| e.to_string())
}

#[cfg(not(feature = "s3"))]
fn open_s3(_: &str) -> std::result::Result<Arc<dyn CheckpointStore>, String> {
    Err("this cutline was built without S3 support: build it with `--features s3`".into())
}

/// Checkpoint settings beyond interval and mode, for the jobs `cutline` runs.
#[derive(Args)]
struct CheckpointTuning {
    /// A checkpoint not complete this long after its trigger is aborted.
    #[arg(long, default_value = "60s")]
    checkpoint_timeout: String,
    /// Checkpoints in flight at once.
    #[arg(long, default_value_t = 1)]
    max_concurrent: usize,
    /// Unaligned exactly-once checkpoints: barriers overtake queued records, which are stored with the
    /// checkpoint, so checkpoints do not wait for a backlog.
    #[arg(long)]
    unaligned: bool,
    /// Aligned checkpoints switch to unaligned once they are this old, counted from their trigger
    /// (e.g. 500ms), or `off`.
    #[arg(long, default_value = "off")]
    alignment_timeout: String,
    /// Aligned checkpoints switch to unaligned at a task whose blocked inputs hold more than this many
    /// bytes (e.g. 1048576, 64MiB), or `off`.
    #[arg(long, default_value = "off")]
    max_aligned_bytes: String,
}

impl CheckpointTuning {
    fn apply(&self, cfg: &mut CheckpointConfig) -> Result<()> {
        let flag = |name: &str, e: String| anyhow::anyhow!("--{name}: {e}");
        cfg.timeout_ms = admin::parse_duration_ms(&self.checkpoint_timeout)
            .map_err(|e| flag("checkpoint-timeout", format!("bad duration {:?}: {e}", self.checkpoint_timeout)))?;
        cfg.max_concurrent = self.max_concurrent;
        cfg.unaligned = self.unaligned;
        cfg.alignment_timeout_ms = admin::parse_optional_duration_ms(&self.alignment_timeout)
            .map_err(|e| flag("alignment-timeout", format!("bad duration {:?}: {e}", self.alignment_timeout)))?;
        cfg.max_aligned_bytes = admin::parse_optional_bytes(&self.max_aligned_bytes)
            .map_err(|e| flag("max-aligned-bytes", format!("bad size {:?}: {e}", self.max_aligned_bytes)))?;
        cfg.validate().map_err(|e| anyhow::anyhow!("invalid checkpoint settings: {e}"))
    }
}

/// The settings `cutline tune` may change. Each value is checked here; the job checks them together.
#[derive(Args)]
struct TuneArgs {
    /// Checkpoint interval (e.g. 200ms, 1s) or `off`.
    #[arg(long)]
    checkpoint_interval: Option<String>,
    /// Checkpoint timeout (e.g. 30s).
    #[arg(long)]
    checkpoint_timeout: Option<String>,
    /// Minimum pause between the end of one checkpoint and the next trigger (e.g. 0, 100ms).
    #[arg(long)]
    min_pause: Option<String>,
    /// Checkpoints in flight at once.
    #[arg(long)]
    max_concurrent: Option<String>,
    /// Consecutive failed checkpoints tolerated before the job fails over.
    #[arg(long)]
    tolerable_failures: Option<String>,
    /// exactly-once or at-least-once.
    #[arg(long)]
    mode: Option<String>,
    /// true or false: exactly-once checkpoints are unaligned.
    #[arg(long)]
    unaligned: Option<String>,
    /// Switch aligned checkpoints to unaligned once they are this old, counted from their trigger (e.g. 500ms), or `off`.
    #[arg(long)]
    alignment_timeout: Option<String>,
    /// Switch aligned checkpoints to unaligned above this many blocked bytes (e.g. 64MiB), or `off`.
    #[arg(long)]
    max_aligned_bytes: Option<String>,
}

impl TuneArgs {
    /// `(flag, protocol key, value)` of every option given.
    fn given(&self) -> Vec<(&'static str, &'static str, &str)> {
        [
            ("--checkpoint-interval", "interval", &self.checkpoint_interval),
            ("--checkpoint-timeout", "timeout", &self.checkpoint_timeout),
            ("--min-pause", "min-pause", &self.min_pause),
            ("--max-concurrent", "max-concurrent", &self.max_concurrent),
            ("--tolerable-failures", "tolerable-failures", &self.tolerable_failures),
            ("--mode", "mode", &self.mode),
            ("--unaligned", "unaligned", &self.unaligned),
            ("--alignment-timeout", "alignment-timeout", &self.alignment_timeout),
            ("--max-aligned-bytes", "max-aligned-bytes", &self.max_aligned_bytes),
        ]
        .into_iter()
        .filter_map(|(flag, key, v)| v.as_deref().map(|v| (flag, key, v)))
        .collect()
    }
}

/// `200ms`, `1s`, `2m`, or `off` (None).
fn parse_interval(s: &str) -> Result<Option<u64>> {
    if s == "off" {
        return Ok(None);
    }
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else {
        bail!("bad duration {s:?}: use a number with ms, s or m (e.g. 200ms, 1s), or off");
    };
    let n: u64 = num.parse().with_context(|| format!("bad duration {s:?}: use e.g. 200ms, 1s, or off"))?;
    if n == 0 {
        bail!("bad duration {s:?}: must be positive (or off)");
    }
    match n.checked_mul(mult) {
        Some(ms) if ms <= 365 * 86_400_000 => Ok(Some(ms)),
        _ => bail!("bad duration {s:?}: at most a year"),
    }
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run { job: RunJob::Wordcount(args) } => run_wordcount(&args),
        Cmd::Demo { dir } => demo(dir),
        Cmd::Checkpoints { state } => list_checkpoints(&state),
        Cmd::Tune { state, settings } => tune(&state, &settings),
        Cmd::Savepoint { state, to, stop } => savepoint(&state, to.as_deref(), stop),
        Cmd::Status { state } => status(&state),
        Cmd::Drill { seed, runs, sim_seeds } => drill(seed, runs, sim_seeds),
        Cmd::Worker { join, secret_file, listen, advertise, rejoin_timeout } => {
            worker(join, secret_file.as_deref(), listen, advertise, &rejoin_timeout)
        }
        Cmd::Cluster { workers, job } => launch_cluster(workers, &job),
        Cmd::BenchCoordinator { tasks, workers, checkpoints } => bench_coordinator(tasks, &workers, checkpoints),
        Cmd::Bench {
            events,
            keys,
            parallelism,
            checkpoint_interval,
            max_concurrent,
            workers,
            state,
            kill_worker_after,
            channel_capacity,
        } => bench(&BenchArgs {
            channel_capacity,
            events,
            keys,
            parallelism,
            interval: checkpoint_interval,
            max_concurrent,
            workers,
            state,
            kill_worker_after,
        }),
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
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn check_writable_dir(dir: &Path, what: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {what} directory {}", dir.display()))?;
    let probe = dir.join(format!(".cutline-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("{what} directory {} is not writable", dir.display()))?;
    std::fs::remove_file(&probe).ok();
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn wordcount_config(
    input: &Path,
    output: &Path,
    state: &Path,
    parallelism: u32,
    interval: &str,
    mode: &str,
    line_delay_us: u64,
    from_savepoint: Option<&Path>,
    checkpoint_store: Option<&str>,
) -> Result<(cutline::JobGraph, RunConfig)> {
    let interval_ms = parse_interval(interval)?;
    let mode: CheckpointMode = mode.parse().map_err(anyhow::Error::msg)?;
    if parallelism == 0 {
        bail!("--parallelism must be at least 1");
    }
    let meta = std::fs::metadata(input).with_context(|| format!("cannot read input {}", input.display()))?;
    if !meta.is_file() {
        bail!(
            "input {} is not a regular file (a directory, pipe or device): the source rewinds it by byte offset after a failure, so it must be a file",
            input.display()
        );
    }
    std::fs::File::open(input).with_context(|| format!("cannot read input {}", input.display()))?;
    let input_abs = std::fs::canonicalize(input)?;
    // The output's absolute path names the job: refuse another job's state before creating anything.
    let output_abs = std::path::absolute(output)
        .with_context(|| format!("cannot make output path {} absolute", output.display()))?;
    let fingerprint = format!("wordcount input={} output={}", input_abs.display(), output_abs.display());
    if state.join("job.meta").exists() {
        let store = LocalDirStore::open_existing(state)
            .with_context(|| format!("cannot open state directory {}", state.display()))?;
        if let Some(m) = store.read_meta()? {
            if m.job_fingerprint != fingerprint {
                bail!(
                    "the state directory {} belongs to job {:?}, not {:?}: use another --state directory",
                    state.display(),
                    m.job_fingerprint,
                    fingerprint
                );
            }
        }
    }
    let from_savepoint = match from_savepoint {
        Some(sp) => Some(check_savepoint(sp, &fingerprint)?),
        None => None,
    };
    // Build (and so validate) the job before creating any directory.
    let graph = cutline::jobs::wordcount_paced(
        &input_abs,
        parallelism,
        cutline::jobs::wordcount_file_sink(&output_abs),
        line_delay_us,
    )
    .build()?;
    check_writable_dir(output, "output")?;
    check_writable_dir(state, "state")?;
    let store: Arc<dyn CheckpointStore> = match checkpoint_store {
        Some(url) => open_store(url).map_err(|e| anyhow::anyhow!("--checkpoint-store {url}: {e}"))?,
        None => Arc::new(
            LocalDirStore::open(state).with_context(|| format!("cannot open state directory {}", state.display()))?,
        ),
    };
    let mut cfg = RunConfig::new(store, fingerprint);
    cfg.checkpoint.interval_ms = interval_ms;
    cfg.checkpoint.mode = mode;
    cfg.from_savepoint = from_savepoint;
    Ok((graph, cfg))
}

/// Check that `path` is a savepoint of the job `fingerprint` names before anything is created; the
/// runtime opens it again when the run starts. Returns its absolute path.
fn check_savepoint(path: &Path, fingerprint: &str) -> Result<PathBuf> {
    let hint = "pass a directory that `cutline savepoint` printed";
    let abs = std::path::absolute(path).with_context(|| format!("--from-savepoint {}", path.display()))?;
    match std::fs::metadata(&abs) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("--from-savepoint {} is not a directory: {hint}", path.display()),
        Err(e) => bail!("--from-savepoint {}: cannot open it ({e}): {hint}", path.display()),
    }
    let store = LocalDirStore::open_existing(&abs)?;
    let meta = store
        .read_meta()
        .with_context(|| format!("--from-savepoint {}: its job.meta cannot be read", path.display()))?;
    let Some(meta) = meta else {
        bail!("--from-savepoint {} is not a savepoint (it has no job.meta): {hint}", path.display());
    };
    if meta.job_fingerprint != fingerprint {
        bail!(
            "--from-savepoint {}: the savepoint was taken from job {:?}, and this run is job {:?}: a savepoint restores into a run of the same job (the same --input and --output)",
            path.display(),
            meta.job_fingerprint,
            fingerprint
        );
    }
    if store.latest_complete()?.is_none() {
        bail!("--from-savepoint {} holds no complete checkpoint, so it is not a savepoint: {hint}", path.display());
    }
    Ok(abs)
}

fn run_wordcount(a: &WordcountArgs) -> Result<()> {
    // Settings are checked before anything is created.
    let mut checkpoint = CheckpointConfig {
        interval_ms: parse_interval(&a.checkpoint_interval)?,
        mode: a.mode.parse().map_err(anyhow::Error::msg)?,
        ..CheckpointConfig::default()
    };
    a.tuning.apply(&mut checkpoint)?;
    let (graph, mut cfg) = wordcount_config(
        &a.input,
        &a.output,
        &a.state,
        a.parallelism,
        &a.checkpoint_interval,
        &a.mode,
        a.line_delay_us,
        a.from_savepoint.as_deref(),
        a.checkpoint_store.as_deref(),
    )?;
    cfg.checkpoint = checkpoint;
    cfg.verbose = a.verbose;
    if a.line_delay_us > 0 {
        cfg.batch_size = 64;
    }
    let savepoint_dir = a.savepoint_dir.clone().unwrap_or_else(|| a.state.join("savepoints"));
    cfg.savepoint_dir = Some(
        std::path::absolute(&savepoint_dir).with_context(|| format!("--savepoint-dir {}", savepoint_dir.display()))?,
    );
    if cfg.from_savepoint.is_some() && cfg.store.latest_complete().ok().flatten().is_some() {
        eprintln!(
            "cutline: {} already holds checkpoints of this job: the run resumes from its latest checkpoint, not from the savepoint",
            a.state.display()
        );
    }
    let socket = a.state.join(admin::SOCKET_FILE);
    let handle = match &a.cluster.coordinator {
        None => cutline::spawn(graph, cfg),
        Some(listen) => {
            let c = &a.cluster;
            let input = std::fs::canonicalize(&a.input)?;
            let output = std::path::absolute(&a.output)?;
            let job_args = ["wordcount", "--input", &input.display().to_string(), "--output"]
                .iter()
                .map(|s| s.to_string())
                .chain([
                    output.display().to_string(),
                    "--parallelism".into(),
                    a.parallelism.to_string(),
                    "--line-delay-us".into(),
                    a.line_delay_us.to_string(),
                ])
                .collect();
            let state = match &a.checkpoint_store {
                Some(url) if url.starts_with("s3://") => url.clone(),
                Some(dir) => std::path::absolute(dir)?.display().to_string(),
                None => std::path::absolute(&a.state)?.display().to_string(),
            };
            let mut cluster =
                ClusterConfig::new(listen, c.workers, read_secret(c.secret_file.as_deref())?, job_args, state);
            cluster.min_workers = c.min_workers;
            cluster.replacement_wait_ms = ms_flag("replacement-wait", &c.replacement_wait)?;
            cluster.heartbeat_interval_ms = ms_flag("heartbeat-interval", &c.heartbeat_interval)?;
            cluster.heartbeat_timeout_ms = ms_flag("heartbeat-timeout", &c.heartbeat_timeout)?;
            cutline::cluster::spawn_cluster(graph, cfg, cluster)?
        }
    };
    // Serve the admin socket only once the job answers: it then holds the state directory's lock, so
    // a second run on the same directory is refused by the lock and never touches this run's socket.
    // If the job ended already (refused, failed or finished), `join` says how.
    let server = match handle.checkpoint_config() {
        Ok(_) => match admin::serve(handle.control(), &socket) {
            Ok(server) => {
                if a.verbose {
                    let shown = std::path::absolute(&socket).unwrap_or(socket.clone());
                    eprintln!(
                        "cutline: admin socket {} (cutline status|tune|savepoint --state {})",
                        shown.display(),
                        a.state.display()
                    );
                }
                Some(server)
            }
            Err(e @ AdminError::PathTooLong { .. }) => {
                eprintln!("cutline: WARNING: running without an admin socket: {e}");
                None
            }
            Err(e) => {
                handle.stop();
                let _ = handle.join();
                return Err(e).context("cannot serve the admin socket; the job was stopped");
            }
        },
        Err(_) => None,
    };
    let report = handle.join();
    drop(server); // after the job ended: requests in progress are answered first
    let report = report?;
    if report.already_finished {
        println!(
            "job already finished (final checkpoint {}); nothing written",
            report.final_checkpoint.map(|c| c.0).unwrap_or(0)
        );
        return Ok(());
    }
    let counts = format!(
        "{} checkpoints, {} failed, {} restarts{}",
        report.checkpoints_completed,
        report.checkpoints_failed,
        report.restarts,
        report.restored_from.map(|c| format!(", resumed from checkpoint {}", c.0)).unwrap_or_default()
    );
    if let Some(sp) = &report.stopped_with_savepoint {
        println!(
            "stopped with savepoint {} in {} ({} bytes): {counts}; start a new run from it with --from-savepoint {}",
            sp.checkpoint.0,
            sp.path.display(),
            sp.bytes,
            sp.path.display()
        );
    } else if report.stopped {
        println!("stopped: {counts}; run the same command again to resume from the latest checkpoint");
    } else {
        println!("finished: final checkpoint {}, {counts}", report.final_checkpoint.map(|c| c.0).unwrap_or(0));
    }
    Ok(())
}

fn worker(
    join: String,
    secret_file: Option<&Path>,
    listen: String,
    advertise: Option<String>,
    rejoin_timeout: &str,
) -> Result<()> {
    let mut cfg = WorkerConfig::new(join, read_secret(secret_file)?);
    cfg.listen = listen;
    cfg.advertise = advertise;
    cfg.rejoin_timeout_ms = ms_flag("rejoin-timeout", rejoin_timeout)?;
    cutline::cluster::run_worker(cfg, &build_job, &open_store).map_err(anyhow::Error::msg)
}

/// A local cluster: the coordinator and `workers` worker processes of this binary, each restarted
/// when it dies before the job is over.
fn launch_cluster(workers: usize, job: &[String]) -> Result<()> {
    use std::process::{Child, Command};
    if workers == 0 {
        bail!("--workers must be at least 1");
    }
    let state = job
        .iter()
        .position(|a| a == "--state")
        .and_then(|i| job.get(i + 1))
        .context("the job needs --state DIR (the coordinator's state directory)")?;
    std::fs::create_dir_all(state).with_context(|| format!("cannot create state directory {state}"))?;
    let secret = match job.iter().position(|a| a == "--secret-file").and_then(|i| job.get(i + 1)) {
        Some(s) => PathBuf::from(s),
        None => {
            // A secret of this cluster only, readable by this user only.
            let path = Path::new(state).join("cluster.secret");
            if !path.exists() {
                use std::io::Read;
                use std::os::unix::fs::OpenOptionsExt;
                let mut bytes = [0u8; 32];
                std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
                std::io::Write::write_all(&mut f, hex.as_bytes())?;
            }
            path
        }
    };
    let addr = match job.iter().position(|a| a == "--coordinator").and_then(|i| job.get(i + 1)) {
        Some(a) => a.clone(),
        None => {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.to_string()
        }
    };
    let exe = std::env::current_exe()?;
    let mut coord_args: Vec<String> = vec!["run".into()];
    coord_args.extend(job.iter().cloned());
    if !job.iter().any(|a| a == "--coordinator") {
        coord_args.extend(["--coordinator".into(), addr.clone()]);
    }
    if !job.iter().any(|a| a == "--workers") {
        coord_args.extend(["--workers".into(), workers.to_string()]);
    }
    let secret_s = secret.display().to_string();
    if !job.iter().any(|a| a == "--secret-file") {
        coord_args.extend(["--secret-file".into(), secret_s.clone()]);
    }
    let start_coord = || Command::new(&exe).args(&coord_args).spawn().context("cannot start the coordinator");
    let start_worker = || {
        Command::new(&exe)
            .args(["worker", "--join", &addr, "--secret-file", &secret_s])
            .spawn()
            .context("cannot start a worker")
    };
    eprintln!("cutline: local cluster: coordinator on {addr}, {workers} worker(s), secret in {secret_s}");
    let mut coord: Child = start_coord()?;
    let mut ws: Vec<Child> = (0..workers).map(|_| start_worker()).collect::<Result<_>>()?;
    let status = loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        if let Some(st) = coord.try_wait()? {
            use std::os::unix::process::ExitStatusExt;
            if st.signal().is_some() {
                eprintln!("cutline: the coordinator died ({st}); restarting it");
                coord = start_coord()?;
                continue;
            }
            break st;
        }
        for w in ws.iter_mut() {
            match w.try_wait()? {
                // Told by the coordinator that the job is over.
                Some(st) if st.success() => {}
                Some(st) => {
                    eprintln!("cutline: a worker exited ({st}); starting a replacement");
                    *w = start_worker()?;
                }
                None => {}
            }
        }
    };
    // The coordinator told its workers the job is over; give them a moment, then make sure.
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    for w in ws.iter_mut() {
        while w.try_wait()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = w.kill();
        let _ = w.wait();
    }
    if !status.success() {
        bail!("the coordinator failed ({status})");
    }
    Ok(())
}

fn bench_coordinator(tasks: u32, workers: &str, checkpoints: u32) -> Result<()> {
    use cutline::coordbench::{coordinator_bench, CoordBench, CoordBenchResult};
    if tasks == 0 || checkpoints == 0 {
        bail!("--tasks and --checkpoints must be positive");
    }
    let counts = workers
        .split(',')
        .map(|w| w.trim().parse::<u32>().with_context(|| format!("--workers: {w:?} is not a number")))
        .collect::<Result<Vec<_>>>()?;
    println!("{}", CoordBenchResult::header());
    for w in counts {
        println!("{}", coordinator_bench(&CoordBench { tasks, workers: w, checkpoints }));
    }
    Ok(())
}

/// Send `line` to the job running on `state`; its answer after `ok`.
fn ask(state: &Path, line: &str) -> Result<String> {
    let socket = state.join(admin::SOCKET_FILE);
    match admin::request_ok(&socket, line) {
        Ok(a) => Ok(a),
        Err(AdminError::NotRunning { .. }) => bail!(
            "no running job answers on {}: start it with cutline run wordcount ... --state {}",
            socket.display(),
            state.display()
        ),
        Err(AdminError::Refused(reason)) => bail!("the job refused: {reason}"),
        Err(e) => Err(e.into()),
    }
}

fn tune(state: &Path, args: &TuneArgs) -> Result<()> {
    let given = args.given();
    let line = if given.is_empty() {
        "config".to_string()
    } else {
        let mut parts = vec!["set".to_string()];
        for (flag, key, value) in given {
            // Checked here too, so a typo is named by its flag; the job checks the combination.
            let setting = admin::parse_setting(key, value).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
            parts.push(setting.to_protocol());
        }
        parts.join(" ")
    };
    let settings = ask(state, &line)?;
    println!("checkpoint settings in force:");
    for kv in settings.split_whitespace() {
        println!("  {kv}");
    }
    Ok(())
}

fn savepoint(state: &Path, to: Option<&Path>, stop: bool) -> Result<()> {
    let mut line = if stop { "stop-with-savepoint".to_string() } else { "savepoint".to_string() };
    if let Some(to) = to {
        let abs = std::path::absolute(to).with_context(|| format!("--to {}", to.display()))?;
        // The job exports the savepoint only after taking it (and, with --stop, after stopping its
        // sources): refuse a target it would refuse before asking.
        match std::fs::read_dir(&abs).map(|mut entries| entries.next().is_none()) {
            Ok(true) => {}
            Ok(false) => {
                bail!("--to {}: the directory exists and is not empty: choose a new directory", to.display())
            }
            Err(e) if abs.exists() => bail!("--to {}: cannot use it as the savepoint directory ({e})", to.display()),
            Err(_) => {}
        }
        match abs.to_str() {
            Some(p) if !p.contains(['\n', '\r']) => line.push_str(&format!(" to={p}")),
            _ => bail!("--to {}: the path must be valid UTF-8 without line breaks", to.display()),
        }
    }
    let answer = match ask(state, &line) {
        Ok(a) => a,
        // A stop-with-savepoint whose savepoint completed but could not be exported still stops the
        // job: say which happened.
        Err(e) if stop && wait_until_gone(state, std::time::Duration::from_secs(3)) => {
            bail!("{e:#}\nthe job has stopped: run the same `cutline run` command to resume it from its latest checkpoint")
        }
        Err(e) => return Err(e),
    };
    let (fields, path) =
        answer.split_once(" path=").with_context(|| format!("unexpected answer from the job: {answer:?}"))?;
    println!("{path}");
    let field = |k: &str| fields.split(' ').find_map(|kv| kv.strip_prefix(k)).unwrap_or("?");
    eprintln!(
        "cutline: savepoint of checkpoint {}, {} bytes; {}",
        field("checkpoint="),
        field("bytes="),
        if stop { "the job stops" } else { "the job runs on" }
    );
    // The job has its savepoint and is stopping: return once it has (its socket is gone), so that a
    // new run may start right away.
    if stop && !wait_until_gone(state, std::time::Duration::from_secs(60)) {
        eprintln!(
            "cutline: WARNING: the job still answers on {} 60 s after its savepoint",
            state.join(admin::SOCKET_FILE).display()
        );
    }
    Ok(())
}

/// Wait until no job answers on `state` (its run has ended and removed its socket), at most `limit`.
fn wait_until_gone(state: &Path, limit: std::time::Duration) -> bool {
    let socket = state.join(admin::SOCKET_FILE);
    let deadline = Instant::now() + limit;
    loop {
        if let Err(AdminError::NotRunning { .. }) =
            admin::request_with_timeout(&socket, "ping", std::time::Duration::from_secs(5))
        {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn status(state: &Path) -> Result<()> {
    println!("{}", ask(state, "status")?);
    Ok(())
}

fn list_checkpoints(state: &Path) -> Result<()> {
    if !state.is_dir() {
        bail!("state directory {} does not exist", state.display());
    }
    if !state.join("job.meta").exists() && !state.join("checkpoints").is_dir() {
        bail!("{} holds no cutline state (no job.meta, no checkpoints/)", state.display());
    }
    let store = LocalDirStore::open_existing(state)?;
    let meta = store.read_meta()?;
    match &meta {
        Some(m) => println!("job: {}\ngeneration: {}", m.job_fingerprint, m.generation.0),
        None => println!("no job has run in {}", state.display()),
    }
    match store.finished() {
        Ok(Some(f)) => println!("finished with checkpoint {}", f.0),
        Ok(None) => {}
        Err(e) => println!("WARNING: the FINISHED marker is damaged ({e}); delete it to let the job resume"),
    }
    println!("{:>8}  {:<24}  {:>12}  {:>5}  {:<6}  verified", "id", "time (UTC)", "bytes", "tasks", "final");
    let mut bad = 0;
    for l in store.list_checkpoints()? {
        if !l.complete {
            continue;
        }
        match store.verify(l.id) {
            Ok(m) => println!(
                "{:>8}  {:<24}  {:>12}  {:>5}  {:<6}  ok",
                l.id.0,
                utc(m.created_at_unix_ms),
                m.total_size_bytes(),
                m.tasks.len(),
                if m.is_final { "yes" } else { "no" }
            ),
            Err(e) => {
                // Retention may remove a checkpoint between the listing and the verification (a job is
                // running): that is not damage.
                let still_there = store.list_checkpoints()?.iter().any(|x| x.id == l.id && x.complete);
                if !still_there {
                    println!("{:>8}  removed by retention while listing", l.id.0);
                    continue;
                }
                bad += 1;
                println!("{:>8}  {:<24}  {:>12}  {:>5}  {:<6}  FAILED: {e}", l.id.0, "?", "?", "?", "?");
            }
        }
    }
    if bad > 0 {
        bail!("{bad} checkpoint(s) failed verification");
    }
    Ok(())
}

/// `2026-11-29T19:45:33.123Z` from milliseconds since the Unix epoch (proleptic Gregorian, UTC).
fn utc(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// The text the demo counts.
const DEMO_TEXT: &str = include_str!("../../../../data/demo.txt");

fn demo(dir: Option<PathBuf>) -> Result<()> {
    let dir = match dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("cutline-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("input.txt");
    // Repeat the bundled text so the job runs long enough for several checkpoints.
    let text: String = (0..600).map(|_| DEMO_TEXT).collect();
    std::fs::write(&input, &text)?;
    let output = dir.join("output");
    let state = dir.join("state");
    for d in [&output, &state] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
    }
    println!("cutline demo: counting words of {} ({} bytes) into {}", input.display(), text.len(), output.display());
    let (graph, mut cfg) = wordcount_config(&input, &output, &state, 2, "50ms", "exactly-once", 200, None, None)?;
    cfg.verbose = true;
    cfg.batch_size = 64;
    // One injected crash: the first sink commit after the second completed checkpoint fails.
    let commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c2 = commits.clone();
    cfg.faults = cutline::Faults::new(move |p| {
        p == cutline::FaultPoint::SinkCommitMidway && c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 3
    });
    let start = Instant::now();
    let report = cutline::run(&graph, cfg)?;
    println!(
        "done in {} ms: {} checkpoints, {} restart(s) after the injected crash, recovery took {:?} ms",
        start.elapsed().as_millis(),
        report.checkpoints_completed,
        report.restarts,
        report.recovery_ms
    );
    let problems = cutline::jobs::check_wordcount_output(&text, &output)?;
    if problems.is_empty() {
        println!("output verified: every word's counts 1..n appear exactly once, as in a run without failures");
        Ok(())
    } else {
        bail!("output differs from a failure-free run: {}", problems.join("; "))
    }
}

fn drill(seed: u64, runs: u64, sim_seeds: u64) -> Result<()> {
    println!("drill 1/2: deterministic simulation, seeds {seed}..{}", seed + sim_seeds);
    for s in seed..seed + sim_seeds {
        if let Err(e) = cutline::sim::run_seed(s, &cutline::sim::SimOptions::default()) {
            bail!("simulation seed {s} FAILED: {e}\nreplay with: cutline drill --seed {s} --sim-seeds 1 --runs 0");
        }
    }
    println!("  {sim_seeds} seeds passed");
    println!("drill 2/2: threaded runtime with injected failures on real files, {runs} runs");
    for s in seed..seed + runs {
        let v = cutline::jobs::drill_run(s)
            .map_err(|e| anyhow::anyhow!("{e}\nreplay with: cutline drill --seed {s} --runs 1 --sim-seeds 0"))?;
        println!("  seed {s}: {v}");
    }
    println!("verdict: PASS");
    Ok(())
}

struct BenchArgs {
    events: u64,
    keys: u64,
    parallelism: u32,
    interval: String,
    max_concurrent: usize,
    workers: usize,
    state: Option<String>,
    kill_worker_after: Option<String>,
    channel_capacity: usize,
}

fn bench(a: &BenchArgs) -> Result<()> {
    let (events, keys, parallelism, interval, max_concurrent) =
        (a.events, a.keys, a.parallelism, a.interval.as_str(), a.max_concurrent);
    let interval_ms = parse_interval(interval)?;
    if keys == 0 || parallelism == 0 {
        bail!("--keys and --parallelism must be positive");
    }
    let dir = std::env::temp_dir().join(format!(
        "cutline-bench-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos()
    ));
    let state = a.state.clone().unwrap_or_else(|| dir.display().to_string());
    let store = open_store(&state).map_err(anyhow::Error::msg)?;
    let job_args: Vec<String> = ["bench", "--events", &events.to_string(), "--keys", &keys.to_string()]
        .iter()
        .map(|s| s.to_string())
        .chain(["--parallelism".to_string(), parallelism.to_string()])
        .collect();
    let (graph, fingerprint) = build_job(&job_args).map_err(anyhow::Error::msg)?;
    let mut cfg = RunConfig::new(store, fingerprint);
    cfg.checkpoint.interval_ms = interval_ms;
    cfg.checkpoint.max_concurrent = max_concurrent;
    cfg.checkpoint.validate().map_err(anyhow::Error::msg)?;
    cfg.restart = cutline::RestartStrategy::None;
    if a.channel_capacity == 0 {
        bail!("--channel-capacity must be at least 1");
    }
    cfg.channel_capacity = a.channel_capacity;
    let start = Instant::now();
    let mut recovery = String::new();
    let report = if a.workers == 0 {
        if a.kill_worker_after.is_some() {
            bail!("--kill-worker-after needs --workers");
        }
        cutline::run(&graph, cfg)
    } else {
        use std::process::Command;
        cfg.restart = cutline::RestartStrategy::default();
        std::fs::create_dir_all(&dir)?;
        let secret_file = dir.join("cluster.secret");
        std::fs::write(&secret_file, format!("bench-{}-{}", std::process::id(), start.elapsed().as_nanos()).repeat(2))?;
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
        let mut cluster =
            ClusterConfig::new(&addr, a.workers, std::fs::read(&secret_file)?, job_args.clone(), state.clone());
        cluster.heartbeat_timeout_ms = 2_000;
        let handle = cutline::cluster::spawn_cluster(graph, cfg, cluster)?;
        let exe = std::env::current_exe()?;
        let worker = || {
            Command::new(&exe)
                .args(["worker", "--join", &addr, "--secret-file"])
                .arg(&secret_file)
                .stderr(std::process::Stdio::null())
                .spawn()
        };
        let mut children = (0..a.workers).map(|_| worker()).collect::<std::io::Result<Vec<_>>>()?;
        if let Some(after) = &a.kill_worker_after {
            std::thread::sleep(std::time::Duration::from_millis(ms_flag("kill-worker-after", after)?));
            let before = handle.metrics().map(|m| m.generation).unwrap_or_default();
            let killed = Instant::now();
            children[0].kill()?;
            children[0].wait()?;
            children[0] = worker()?;
            // Running again: the coordinator reports a newer generation once every worker deployed it.
            loop {
                match handle.metrics() {
                    Ok(m) if m.generation > before && !m.tasks.is_empty() => break,
                    Err(_) => bail!("the job ended before it recovered"),
                    _ => std::thread::sleep(std::time::Duration::from_millis(1)),
                }
            }
            recovery = format!(" recovery_ms={}", killed.elapsed().as_millis());
        }
        let r = handle.join();
        for c in &mut children {
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            while c.try_wait()?.is_none() && Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        r
    };
    let secs = start.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&dir).ok();
    let report = report?;
    let pct = |v: &[u64], p: f64| -> u64 {
        if v.is_empty() {
            return 0;
        }
        let mut v = v.to_vec();
        v.sort_unstable();
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    // The final checkpoint at end of input is not a periodic one: leave it out of the statistics.
    let periodic: Vec<&cutline::CheckpointSummary> = report.checkpoints.iter().filter(|c| !c.is_final).collect();
    let col = |f: &dyn Fn(&cutline::CheckpointSummary) -> u64| periodic.iter().map(|c| f(c)).collect::<Vec<u64>>();
    let d = col(&|c| c.duration_ms);
    println!(
        "events={events} keys={keys} parallelism={parallelism} workers={} interval={interval} max_concurrent={max_concurrent} elapsed_s={secs:.3} events_per_s={:.0} checkpoints={} duration_p50_ms={} duration_p99_ms={} alignment_p99_ms={} start_delay_p99_ms={} persist_p50_ms={} encode_p50_us={} write_p50_us={} state_bytes={} restarts={}{recovery}",
        a.workers,
        events as f64 / secs,
        d.len(),
        pct(&d, 0.5),
        pct(&d, 0.99),
        pct(&col(&|c| c.alignment_ms), 0.99),
        pct(&col(&|c| c.start_delay_ms), 0.99),
        pct(&col(&|c| c.persist_ms), 0.5),
        pct(&col(&|c| c.encode_us), 0.5),
        pct(&col(&|c| c.write_us), 0.5),
        report.checkpoints.last().map(|c| c.bytes).unwrap_or(0),
        report.restarts,
    );
    Ok(())
}

fn bench_backlog(
    mode: &str,
    alignment_timeout: &str,
    seconds: u64,
    slow_rate: u64,
    channel_capacity: usize,
    batch_size: usize,
    interval: &str,
) -> Result<()> {
    if seconds == 0 || slow_rate == 0 || channel_capacity == 0 || batch_size == 0 {
        bail!("--seconds, --slow-rate, --channel-capacity and --batch-size must be positive");
    }
    let mut checkpoint = CheckpointConfig { interval_ms: parse_interval(interval)?, ..Default::default() };
    match mode {
        "aligned" => {}
        "unaligned" => checkpoint.unaligned = true,
        "timeout" => {
            checkpoint.alignment_timeout_ms = Some(
                admin::parse_duration_ms(alignment_timeout)
                    .map_err(|e| anyhow::anyhow!("--alignment-timeout {alignment_timeout:?}: {e}"))?,
            )
        }
        other => bail!("unknown --mode {other:?}: use aligned, unaligned or timeout"),
    }
    let dir = std::env::temp_dir().join(format!("cutline-bench-backlog-{}", std::process::id()));
    let store = Arc::new(LocalDirStore::open(&dir)?);
    let b = cutline::jobs::BacklogBench {
        seconds,
        slow_records_per_s: slow_rate,
        channel_capacity,
        batch_size,
        checkpoint,
    };
    let r = cutline::jobs::backlog_bench(&b, store);
    std::fs::remove_dir_all(&dir).ok();
    let r = r.map_err(anyhow::Error::msg)?;
    let pct = |mut v: Vec<u64>, p: f64| -> u64 {
        if v.is_empty() {
            return 0;
        }
        v.sort_unstable();
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    let col = |f: &dyn Fn(&cutline::CheckpointSummary) -> u64| r.checkpoints.iter().map(f).collect::<Vec<u64>>();
    println!(
        "mode={mode} seconds={seconds} backlog_s={:.1} checkpoints={} failed={} duration_p50_ms={} duration_max_ms={} start_delay_p50_ms={} in_flight_bytes_p50={} switched_tasks_max={} channel_high_water={}/{} source_backpressured_ms={} records={} records_per_s={:.0} peak_rss_mib={:.1}",
        r.backlog_s,
        r.checkpoints.len(),
        r.failed,
        pct(col(&|c| c.duration_ms), 0.5),
        pct(col(&|c| c.duration_ms), 1.0),
        pct(col(&|c| c.start_delay_ms), 0.5),
        pct(col(&|c| c.channel_state_bytes), 0.5),
        pct(col(&|c| c.switched_tasks as u64), 1.0),
        r.high_water_batches,
        r.capacity_batches,
        r.source_backpressured_ms,
        r.records_processed,
        r.records_processed as f64 / seconds as f64,
        r.peak_rss_bytes.unwrap_or(0) as f64 / (1024.0 * 1024.0),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(super::utc(1_795_980_486_035), "2026-11-29T19:28:06.035Z");
    }
}
