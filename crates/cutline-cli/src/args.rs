//! Command-line arguments shared by several commands, and what they name: the job a worker rebuilds
//! from a coordinator's arguments, checkpoint storage by URL, the cluster secret, durations.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use cutline::admin;
use cutline::{CheckpointConfig, CheckpointStore, LocalDirStore};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Subcommand)]
// Parsed once per process; boxing the large variant would only add noise.
#[allow(clippy::large_enum_variant)]
pub(crate) enum RunJob {
    /// Count words of a text file; every count update goes to a directory through the transactional
    /// file sink, or to a PostgreSQL table.
    /// While it runs, it answers `cutline status`, `tune` and `savepoint` on `<state>/admin.sock`.
    Wordcount(WordcountArgs),
    /// A Nexmark query (event-time windows, joins, timers) over generated events; every result row
    /// goes to a directory as a JSON line through the transactional file sink. Started again after a
    /// crash, it resumes from its latest checkpoint.
    /// While it runs, it answers `cutline status`, `tune` and `savepoint` on `<state>/admin.sock`.
    Nexmark(NexmarkArgs),
}

#[derive(Args)]
pub(crate) struct NexmarkArgs {
    /// q0-q8, q11 or q12.
    #[arg(long)]
    pub(crate) query: cutline_nexmark::Query,
    /// Events to generate (deterministic by event number).
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) events: u64,
    /// A directory: committed files of rows, one JSON object per line.
    #[arg(long, value_name = "DIR")]
    pub(crate) output: PathBuf,
    #[arg(long)]
    pub(crate) state: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub(crate) parallelism: u32,
    /// Checkpoint interval (e.g. 200ms, 1s) or `off`.
    #[arg(long, default_value = "200ms")]
    pub(crate) checkpoint_interval: String,
    #[arg(long, default_value = "exactly-once")]
    pub(crate) mode: String,
    #[command(flatten)]
    pub(crate) tuning: CheckpointTuning,
    #[command(flatten)]
    pub(crate) observe: ObserveArgs,
    /// Sleep this many microseconds at one bid in 64, to make a small run last (drills).
    #[arg(long, default_value_t = 0)]
    pub(crate) pace_us: u64,
    /// Drills: SIGKILL this process the Nth time a task reaches POINT (see `cutline run wordcount`).
    #[arg(long, value_name = "POINT:N", hide = true)]
    pub(crate) kill_self_at: Option<String>,
}

#[derive(Args)]
pub(crate) struct WordcountArgs {
    /// A text file, or a Kafka topic whose record values are the lines:
    /// `kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?bounded=true]` (needs `--features kafka`).
    #[arg(long, value_name = "FILE|URL")]
    pub(crate) input: PathBuf,
    /// A directory (committed files of `WORD<TAB>COUNT` lines), a PostgreSQL table:
    /// `postgres://USER[:PASSWORD]@HOST:PORT/DATABASE?table=NAME` (one row per word, upserted by
    /// two-phase commit; created when missing; needs a build with `--features postgres`), or a Kafka
    /// topic: `kafka://HOST:PORT/TOPIC[?mode=at-least-once]` (word as key, count as value, exactly
    /// once by default; needs `--features kafka`).
    #[arg(long, value_name = "DIR|URL")]
    pub(crate) output: PathBuf,
    #[arg(long)]
    pub(crate) state: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub(crate) parallelism: u32,
    /// Checkpoint interval (e.g. 200ms, 1s) or `off`.
    #[arg(long, default_value = "200ms")]
    pub(crate) checkpoint_interval: String,
    #[arg(long, default_value = "exactly-once")]
    pub(crate) mode: String,
    #[command(flatten)]
    pub(crate) tuning: CheckpointTuning,
    /// Start from this savepoint (a directory `cutline savepoint` printed) if the state directory holds
    /// no checkpoint yet; the input and output must be those of the job the savepoint was taken from.
    #[arg(long)]
    pub(crate) from_savepoint: Option<PathBuf>,
    /// Where savepoints go when `cutline savepoint` names no directory (default: <state>/savepoints).
    #[arg(long)]
    pub(crate) savepoint_dir: Option<PathBuf>,
    /// Sleep this many microseconds per input line (and read in batches of 64 lines), to watch a small
    /// input being processed.
    #[arg(long, default_value_t = 0)]
    pub(crate) line_delay_us: u64,
    /// Put checkpoints here instead of in the state directory: `s3://BUCKET/PREFIX` on an
    /// S3-compatible store (endpoint and credentials from CUTLINE_S3_ENDPOINT / AWS_* variables;
    /// needs a build with `--features s3`), or another directory. The state directory keeps the admin
    /// socket (and a cluster's secret).
    #[arg(long, value_name = "URL")]
    pub(crate) checkpoint_store: Option<String>,
    /// Drills: send this process SIGKILL the Nth time a task reaches POINT (`sink-commit`: a
    /// checkpoint completed and its output is not committed yet; also `sink-prepare`,
    /// `sink-commit-midway`, `sink-recover`, `process-batch`, `snapshot`, `snapshot-write`).
    #[arg(long, value_name = "POINT:N", hide = true)]
    pub(crate) kill_self_at: Option<String>,
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
    #[command(flatten)]
    pub(crate) observe: ObserveArgs,
    #[command(flatten)]
    pub(crate) state_backend: StateBackendArgs,
}

/// Where keyed operators keep their state.
#[derive(Args, Clone)]
pub(crate) struct StateBackendArgs {
    /// Where keyed operators keep their state: `memory` (the fastest; the state must fit in memory)
    /// or `disk` (state larger than memory: an embedded store per task under --local-state-dir with
    /// a cache in memory; needs a build with `--features spill`). Checkpoints are the same either
    /// way: a job may restart from one written under the other backend.
    #[arg(long, default_value = "memory", value_name = "memory|disk")]
    pub(crate) state_backend: String,
    /// The disk backend's directory, on a local disk (default: `cutline-state` in the system's
    /// temporary directory). Scratch space: the state is rebuilt from the checkpoint on restart.
    #[arg(long, value_name = "DIR")]
    pub(crate) local_state_dir: Option<PathBuf>,
    /// Keys each task of the disk backend caches in memory (default 65536). Up to four caches are
    /// in memory per task: its own and three its store's writer is still writing.
    #[arg(long, value_name = "N")]
    pub(crate) state_cache_entries: Option<usize>,
}

impl StateBackendArgs {
    /// The backend these flags choose.
    pub(crate) fn backend(&self) -> anyhow::Result<cutline::StateBackend> {
        match self.state_backend.as_str() {
            "memory" if self.local_state_dir.is_some() => {
                anyhow::bail!("--local-state-dir is for --state-backend disk")
            }
            "memory" if self.state_cache_entries.is_some() => {
                anyhow::bail!("--state-cache-entries is for --state-backend disk")
            }
            "memory" => Ok(cutline::StateBackend::Memory),
            "disk" => Ok(cutline::StateBackend::Disk {
                dir: self.local_state_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("cutline-state")),
                cache_entries: self.state_cache_entries.unwrap_or(cutline::DEFAULT_DISK_CACHE_ENTRIES),
            }),
            other => anyhow::bail!("--state-backend {other:?}: use memory or disk"),
        }
    }
}

/// The HTTP endpoint's address when none is given: loopback only.
pub(crate) const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9470";

/// How a running job can be watched: its HTTP endpoint and its status line.
#[derive(Args, Clone)]
pub(crate) struct ObserveArgs {
    /// Serve the dashboard (/), Prometheus metrics (/metrics) and health probes (/healthz, /readyz)
    /// on this address, or `off`. Loopback by default; if the default port is taken, a free one is
    /// used (and logged). Anyone who can reach it may change checkpoint settings (see
    /// --http-read-only).
    #[arg(long, default_value = DEFAULT_HTTP_ADDR, env = "CUTLINE_HTTP", value_name = "HOST:PORT|off")]
    pub(crate) http: String,
    /// The HTTP endpoint refuses changes to the checkpoint settings.
    #[arg(long)]
    pub(crate) http_read_only: bool,
    /// A live status line (records/s, the latest checkpoint, backlog) on standard output: `auto`
    /// (when it is a terminal), `on` or `off`.
    #[arg(long, default_value = "auto", value_name = "auto|on|off")]
    pub(crate) status_line: String,
    /// Export every completed checkpoint's trace to this OpenTelemetry collector (OTLP over HTTP
    /// with JSON: `http://HOST:4318`; traces go to `/v1/traces` under it).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
}

/// Run the job as the coordinator of worker processes (see `cutline worker`).
#[derive(Args, Clone)]
pub(crate) struct ClusterArgs {
    /// Be the coordinator of a cluster: listen for workers on this address (e.g. 0.0.0.0:7070) and
    /// run the tasks on them, none in this process.
    #[arg(long, value_name = "ADDR")]
    pub(crate) coordinator: Option<String>,
    /// Workers a generation runs on when all are there (with --coordinator).
    #[arg(long, default_value_t = 1)]
    pub(crate) workers: usize,
    /// After a worker is lost, run on this many if no replacement joins within --replacement-wait.
    #[arg(long, default_value_t = 1)]
    pub(crate) min_workers: usize,
    /// How long a restart waits for lost workers to be replaced.
    #[arg(long, default_value = "5s")]
    pub(crate) replacement_wait: String,
    /// File holding the cluster's shared secret (at least 16 bytes; make one with
    /// `head -c 32 /dev/urandom | base64 > cluster.secret`). Default: $CUTLINE_SECRET_FILE.
    #[arg(long, env = "CUTLINE_SECRET_FILE")]
    pub(crate) secret_file: Option<PathBuf>,
    /// Interval of heartbeats between coordinator and workers, both ways.
    #[arg(long, default_value = "200ms")]
    pub(crate) heartbeat_interval: String,
    /// A peer silent this long is lost.
    #[arg(long, default_value = "3s")]
    pub(crate) heartbeat_timeout: String,
    /// Seal every frame of the cluster's connections (AES-256-GCM with per-connection keys from the
    /// secret): `auto` (unless both ends are loopback addresses), `on` or `off`. Workers must agree.
    #[arg(long, default_value = "auto", value_name = "auto|on|off")]
    pub(crate) frame_protection: cutline::cluster::FrameProtection,
}

pub(crate) fn read_secret(path: Option<&Path>) -> Result<Vec<u8>> {
    let Some(path) = path else {
        bail!("a cluster needs a shared secret: pass --secret-file FILE (make one with `head -c 32 /dev/urandom | base64 > cluster.secret`) or set CUTLINE_SECRET_FILE");
    };
    let bytes = std::fs::read(path).with_context(|| format!("cannot read the secret file {}", path.display()))?;
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map(|i| i + 1).unwrap_or(0);
    Ok(bytes[..end].to_vec())
}

pub(crate) fn ms_flag(name: &str, v: &str) -> Result<u64> {
    admin::parse_duration_ms(v).map_err(|e| anyhow::anyhow!("--{name}: bad duration {v:?}: {e}"))
}

/// The job part of a `cutline run wordcount` command line, as workers rebuild it.
#[derive(Parser)]
#[command(name = "job", no_binary_name = true)]
pub(crate) enum JobSpec {
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
        #[arg(long, default_value_t = 0)]
        hot_keys: u64,
        #[arg(long)]
        parallelism: u32,
        /// Where the sink reports what it received (see `cutline_cli::tally`).
        #[arg(long)]
        tally_dir: PathBuf,
    },
}

/// Build the job a coordinator names (on a worker): the graph and its fingerprint.
pub(crate) fn build_job(args: &[String]) -> std::result::Result<(cutline::JobGraph, String), String> {
    let spec = JobSpec::try_parse_from(args).map_err(|e| e.to_string())?;
    let (input, output, parallelism, line_delay_us) = match spec {
        JobSpec::Wordcount { input, output, parallelism, line_delay_us } => (input, output, parallelism, line_delay_us),
        JobSpec::Bench { events, keys, hot_keys, parallelism, tally_dir } => {
            let graph = cutline_cli::jobs::keyed_bench(events, (keys, hot_keys), parallelism, &tally_dir)
                .build()
                .map_err(|e| e.to_string())?;
            return Ok((graph, "bench".into()));
        }
    };
    let output = cutline_cli::jobs::WordcountOutput::parse(output.to_str().unwrap_or_default())?;
    let input = cutline_cli::jobs::WordcountInput::parse(input.to_str().unwrap_or_default())?;
    let fingerprint = format!("wordcount input={} output={}", input.name(), output.name());
    let graph = cutline_cli::jobs::wordcount_into(&input, parallelism, &output, line_delay_us)?
        .build()
        .map_err(|e| e.to_string())?;
    Ok((graph, fingerprint))
}

/// Open checkpoint storage: a directory, or `s3://BUCKET[/PREFIX]` (with the `s3` feature; the
/// endpoint and credentials come from the environment, see `S3Config::from_env`).
pub(crate) fn open_store(state: &str) -> std::result::Result<Arc<dyn CheckpointStore>, String> {
    if let Some(rest) = state.strip_prefix("s3://") {
        return open_s3(rest);
    }
    LocalDirStore::open(Path::new(state))
        .map(|s| Arc::new(s) as Arc<dyn CheckpointStore>)
        .map_err(|e| format!("cannot open state directory {state}: {e}"))
}

#[cfg(feature = "s3")]
pub(crate) fn open_s3(rest: &str) -> std::result::Result<Arc<dyn CheckpointStore>, String> {
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
pub(crate) fn open_s3(_: &str) -> std::result::Result<Arc<dyn CheckpointStore>, String> {
    Err("this cutline was built without S3 support: build it with `--features s3`".into())
}

/// Checkpoint settings beyond interval and mode, for the jobs `cutline` runs.
#[derive(Args)]
pub(crate) struct CheckpointTuning {
    /// A checkpoint not complete this long after its trigger is aborted.
    #[arg(long, default_value = "60s")]
    pub(crate) checkpoint_timeout: String,
    /// Checkpoints in flight at once, 1 to 16 (concurrent ones are triggered at least 50 ms apart).
    #[arg(long, default_value_t = 1)]
    pub(crate) max_concurrent: usize,
    /// Unaligned exactly-once checkpoints: barriers overtake queued records, which are stored with the
    /// checkpoint, so checkpoints do not wait for a backlog.
    #[arg(long)]
    pub(crate) unaligned: bool,
    /// Aligned checkpoints switch to unaligned once they are this old, counted from their trigger
    /// (e.g. 500ms), or `off`.
    #[arg(long, default_value = "off")]
    pub(crate) alignment_timeout: String,
    /// Aligned checkpoints switch to unaligned at a task whose blocked inputs hold more than this many
    /// bytes (e.g. 1048576, 64MiB), or `off`.
    #[arg(long, default_value = "off")]
    pub(crate) max_aligned_bytes: String,
}

impl CheckpointTuning {
    pub(crate) fn apply(&self, cfg: &mut CheckpointConfig) -> Result<()> {
        let flag = |name: &str, e: String| anyhow::anyhow!("--{name}: {e}");
        cfg.timeout_ms = admin::parse_duration_ms(&self.checkpoint_timeout)
            .map_err(|e| flag("checkpoint-timeout", format!("bad duration {:?}: {e}", self.checkpoint_timeout)))?;
        cutline_core::coordinator::check_max_concurrent(self.max_concurrent).map_err(|e| flag("max-concurrent", e))?;
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
pub(crate) struct TuneArgs {
    /// Checkpoint interval (e.g. 200ms, 1s) or `off`.
    #[arg(long)]
    pub(crate) checkpoint_interval: Option<String>,
    /// Checkpoint timeout (e.g. 30s).
    #[arg(long)]
    pub(crate) checkpoint_timeout: Option<String>,
    /// Minimum pause between the end of one checkpoint and the next trigger (e.g. 0, 100ms).
    #[arg(long)]
    pub(crate) min_pause: Option<String>,
    /// Checkpoints in flight at once, 1 to 16.
    #[arg(long)]
    pub(crate) max_concurrent: Option<String>,
    /// Consecutive failed checkpoints tolerated before the job fails over.
    #[arg(long)]
    pub(crate) tolerable_failures: Option<String>,
    /// exactly-once or at-least-once.
    #[arg(long)]
    pub(crate) mode: Option<String>,
    /// true or false: exactly-once checkpoints are unaligned.
    #[arg(long)]
    pub(crate) unaligned: Option<String>,
    /// Switch aligned checkpoints to unaligned once they are this old, counted from their trigger (e.g. 500ms), or `off`.
    #[arg(long)]
    pub(crate) alignment_timeout: Option<String>,
    /// Switch aligned checkpoints to unaligned above this many blocked bytes (e.g. 64MiB), or `off`.
    #[arg(long)]
    pub(crate) max_aligned_bytes: Option<String>,
}

impl TuneArgs {
    /// `(flag, protocol key, value)` of every option given.
    pub(crate) fn given(&self) -> Vec<(&'static str, &'static str, &str)> {
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

/// A checkpoint interval flag: a duration, or `off` (only the final checkpoint).
pub(crate) fn parse_interval(s: &str) -> Result<Option<u64>> {
    match admin::parse_optional_duration_ms(s) {
        Ok(Some(0)) => bail!("bad duration {s:?}: must be positive (or off)"),
        Ok(v) => Ok(v),
        Err(e) => bail!("bad duration {s:?}: {e}"),
    }
}
