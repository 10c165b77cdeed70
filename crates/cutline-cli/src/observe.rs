//! Watching a job `cutline run` runs: its HTTP endpoint (dashboard, metrics, probes) and the live
//! status line it prints on a terminal.

use crate::args::{ObserveArgs, DEFAULT_HTTP_ADDR};
use anyhow::{bail, Context, Result};
use cutline::admin::http::HttpServer;
use cutline::admin::{serve_job_http, WebOptions};
use cutline::{CheckpointStore, JobControl, JobMetrics};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the status line is redrawn.
const STATUS_LINE_EVERY: Duration = Duration::from_secs(1);

/// Serve the job's HTTP endpoint as `--http` says. The default address falls back to a free port
/// when taken (with a warning naming it); an address given explicitly must be free.
pub(crate) fn serve_http(
    a: &ObserveArgs,
    control: JobControl,
    store: Arc<dyn CheckpointStore>,
) -> Result<Option<HttpServer>> {
    if a.http == "off" {
        return Ok(None);
    }
    let options = WebOptions { read_only: a.http_read_only };
    let server = match serve_job_http(&a.http, control.clone(), store.clone(), options.clone()) {
        Ok(s) => s,
        Err(e) if e.is_in_use() && a.http == DEFAULT_HTTP_ADDR => {
            let s = serve_job_http("127.0.0.1:0", control, store, options)
                .context("cannot serve the HTTP endpoint on a free loopback port")?;
            tracing::warn!(
                event = "http_port_taken",
                addr = %s.addr(),
                "{DEFAULT_HTTP_ADDR} is taken (another job?): the dashboard is at http://{}/ instead",
                s.addr()
            );
            s
        }
        Err(e) => return Err(e).context("--http"),
    };
    tracing::info!(
        event = "http_endpoint",
        addr = %server.addr(),
        "dashboard http://{0}/, metrics http://{0}/metrics, probes http://{0}/healthz and /readyz",
        server.addr()
    );
    Ok(Some(server))
}

/// Export checkpoint traces to `--otlp-endpoint`, if given: the exporter (keep it until the job
/// ended; dropping it sends what is queued) after installing its listener in `cfg`.
pub(crate) fn otlp(
    a: &ObserveArgs,
    cfg: &mut cutline::RunConfig,
    service: &str,
) -> Result<Option<cutline::admin::otlp::OtlpExporter>> {
    let Some(endpoint) = a.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) else { return Ok(None) };
    let (exporter, listener) = cutline::admin::otlp::otlp_exporter(endpoint, service).context("--otlp-endpoint")?;
    cfg.on_checkpoint = Some(listener);
    tracing::info!(event = "otlp_export", endpoint = %endpoint, "checkpoint traces go to {endpoint} (OTLP/HTTP)");
    Ok(Some(exporter))
}

/// Whether to draw the status line: `auto` when standard output is a terminal.
pub(crate) fn wants_status_line(a: &ObserveArgs) -> Result<bool> {
    match a.status_line.as_str() {
        "auto" => Ok(std::io::stdout().is_terminal()),
        "on" => Ok(true),
        "off" => Ok(false),
        other => bail!("--status-line {other:?}: use auto, on or off"),
    }
}

/// The live status line: redrawn every second until dropped, then cleared.
pub(crate) struct StatusLine {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StatusLine {
    pub(crate) fn start(control: JobControl) -> StatusLine {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cutline-status-line".into())
            .spawn(move || {
                let mut prev: Option<(Instant, u64)> = None;
                while !stop2.load(Ordering::SeqCst) {
                    if let Ok(m) = control.metrics() {
                        let line = status_line(&m, &mut prev, Instant::now());
                        let mut out = std::io::stdout().lock();
                        let _ = write!(out, "\r\x1b[2K{line}");
                        let _ = out.flush();
                    }
                    let until = Instant::now() + STATUS_LINE_EVERY;
                    while Instant::now() < until && !stop2.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            })
            .ok();
        StatusLine { stop, thread }
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r\x1b[2K");
            let _ = out.flush();
        }
    }
}

/// One status line: state, records read per second (since the previous line), the latest
/// checkpoint with its age and duration, checkpoints in flight, the backlog queued in channels, and
/// restarts.
pub(crate) fn status_line(m: &JobMetrics, prev: &mut Option<(Instant, u64)>, now: Instant) -> String {
    if m.tasks.is_empty() {
        *prev = None;
        return format!("cutline: restarting ({} restarts so far)", m.counters.restarts);
    }
    let read: u64 = m.tasks.iter().filter(|t| t.inputs.is_empty()).map(|t| t.records_in).sum();
    let rate = match prev.replace((now, read)) {
        Some((t, n)) if now > t && read >= n => {
            format!("{:.0} records/s", (read - n) as f64 / now.duration_since(t).as_secs_f64())
        }
        _ => "- records/s".into(),
    };
    let last = match m.checkpoints.last() {
        Some(c) => {
            let age_s = if c.triggered_at_unix_ms > 0 {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0);
                format!(" {}s ago", now_ms.saturating_sub(c.triggered_at_unix_ms) / 1000)
            } else {
                String::new()
            };
            format!("checkpoint {}{age_s} in {} ms", c.checkpoint.0, c.duration_ms)
        }
        None => "no checkpoint yet".into(),
    };
    let (queued, capacity) = m
        .tasks
        .iter()
        .flat_map(|t| &t.inputs)
        .fold((0, 0), |(q, c), ch| (q + ch.queued_batches, c + ch.capacity_batches));
    format!(
        "cutline: {} | {rate} | {last} | {} in flight | lag {queued}/{capacity} batches queued | {} restarts",
        m.generation,
        m.pending.len(),
        m.counters.restarts
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cutline::runtime::{CheckpointSummary, TaskReport};
    use cutline::{ChannelStats, CheckpointId, Generation};

    #[test]
    fn the_status_line_shows_the_rate_since_the_last_line_the_latest_checkpoint_and_the_backlog() {
        let mut m = JobMetrics { generation: Generation(2), ..Default::default() };
        m.tasks = vec![
            TaskReport { name: "src#0".into(), records_in: 1_000, ..Default::default() },
            TaskReport {
                name: "sink#0".into(),
                records_in: 900,
                inputs: vec![ChannelStats { queued_batches: 3, capacity_batches: 16, ..Default::default() }],
                ..Default::default()
            },
        ];
        m.checkpoints = vec![CheckpointSummary { checkpoint: CheckpointId(7), duration_ms: 42, ..Default::default() }];
        let t0 = Instant::now();
        let mut prev = None;
        let first = status_line(&m, &mut prev, t0);
        assert!(first.contains("- records/s"), "{first}");
        m.tasks[0].records_in = 3_000;
        let second = status_line(&m, &mut prev, t0 + Duration::from_secs(2));
        assert!(second.contains("gen-2 | 1000 records/s | checkpoint 7 in 42 ms"), "{second}");
        assert!(second.contains("lag 3/16 batches queued | 0 restarts"), "{second}");
        m.tasks.clear();
        assert!(status_line(&m, &mut prev, t0).contains("restarting"));
    }
}
