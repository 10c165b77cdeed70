//! The HTTP endpoint of a running job ([`serve_job_http`]): Prometheus metrics, health and readiness
//! probes, the dashboard and the JSON it reads, and run-time tuning of the checkpoint settings.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /metrics` | the job's metrics in the OpenMetrics text format ([`super::prometheus`]) |
//! | `GET /healthz` | `200 ok` while the process serves (liveness: restarting the process would not help a job that restarts) |
//! | `GET /readyz` | `200` while the job's tasks run, `503` while it starts, restarts or does not answer |
//! | `GET /` | the dashboard: a page that reads the JSON below |
//! | `GET /api/status` | [`JobMetrics`] as JSON, with the 20 most recent checkpoints |
//! | `GET /api/checkpoints?limit=N` | [`JobMetrics`] with up to `N` (default 1,000) recent checkpoints |
//! | `GET /api/trace/<id>` or `/api/trace/latest` | the stored [`CheckpointRecord`] of a completed checkpoint (statistics and epoch trace) with its critical path ([`super::trace_json`]) |
//! | `GET /api/settings` | the settings in force, `key=value ...` as the admin socket's `config` prints them |
//! | `POST /api/settings` | body `key=value ...` (the admin socket's `set`): the settings now in force, as `config` prints them |
//!
//! # Who may do what
//!
//! Anyone who can reach the address may read everything and change checkpoint settings (not stop
//! the job, not write savepoints: those stay on the owner-only admin socket). The endpoint listens on
//! loopback unless told otherwise. `POST /api/settings` needs the header `X-Cutline-Tune: 1`, which a
//! page of another site cannot send without a CORS preflight this server never grants, and is refused
//! when the endpoint is read-only ([`WebOptions::read_only`]).

use super::http::{serve_http, Handler, HttpError, HttpServer, Request, Response};
use super::prometheus;
use super::protocol::{apply_settings, format_config, parse_set};
use crate::runtime::{CheckpointRecord, JobControl, JobMetrics, CHECKPOINTS_KEPT};
use cutline_core::CheckpointId;
use cutline_storage::CheckpointStore;
use std::sync::Arc;

/// The dashboard page (static; it reads `/api/...`).
const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// What the job's HTTP endpoint allows.
#[derive(Clone, Debug, Default)]
pub struct WebOptions {
    /// Refuse `POST /api/settings`.
    pub read_only: bool,
}

/// Serve the HTTP endpoint of the job behind `control` on `addr` (`host:port`; port 0 picks one).
/// `store` is the job's checkpoint store, where completed checkpoints' records are read from.
pub fn serve_job_http(
    addr: &str,
    control: JobControl,
    store: Arc<dyn CheckpointStore>,
    options: WebOptions,
) -> Result<HttpServer, HttpError> {
    serve_http(addr, Arc::new(JobRoutes { control, store, options }))
}

struct JobRoutes {
    control: JobControl,
    store: Arc<dyn CheckpointStore>,
    options: WebOptions,
}

fn json<T: serde::Serialize>(v: &T) -> Response {
    Response::json(serde_json::to_vec(v).expect("serializable"))
}

/// The stored record of checkpoint `id` (`latest`: the newest), or the answer saying why not.
pub fn read_record(store: &dyn CheckpointStore, id: &str) -> Result<CheckpointRecord, (u16, String)> {
    let id = if id == "latest" {
        let ids = store.list_stats().map_err(|e| (500, format!("cannot list checkpoint records: {e}")))?;
        *ids.last().ok_or((404, "no checkpoint has completed yet".to_string()))?
    } else {
        CheckpointId(id.parse().map_err(|_| (400, format!("{id:?} is not a checkpoint id (a number, or latest)")))?)
    };
    match store.read_stats(id) {
        Ok(Some(bytes)) => CheckpointRecord::from_json(&bytes).map_err(|e| (500, format!("the record of {id}: {e}"))),
        Ok(None) => Err((
            404,
            format!(
                "no record of {id}: it did not complete, or its record was pruned (the newest {} are kept)",
                crate::runtime::CHECKPOINT_RECORDS_KEPT
            ),
        )),
        Err(e) => Err((500, format!("the record of {id}: {e}"))),
    }
}

impl JobRoutes {
    fn metrics(&self, checkpoints: usize) -> Result<JobMetrics, Response> {
        self.control
            .metrics_with_history(checkpoints)
            .map_err(|e| Response::text(503, format!("the job does not answer: {e}\n")))
    }

    fn tune(&self, req: &Request) -> Response {
        if self.options.read_only {
            return Response::text(403, "this endpoint is read-only: tune with `cutline tune`\n");
        }
        if req.header("x-cutline-tune") != Some("1") {
            return Response::text(403, "send the header X-Cutline-Tune: 1 to change settings\n");
        }
        let Ok(body) = std::str::from_utf8(&req.body) else {
            return Response::text(400, "the body is not UTF-8\n");
        };
        let settings = match parse_set(body.trim()) {
            Ok(s) => s,
            Err(e) => return Response::text(400, format!("{e}\n")),
        };
        let keys: Vec<String> = settings.iter().map(|s| s.to_protocol()).collect();
        match self.control.update_checkpoint_config(move |cfg| {
            *cfg = apply_settings(cfg, &settings)?;
            Ok(())
        }) {
            Ok(c) => {
                tracing::info!(event = "settings_changed", via = "http", settings = %keys.join(" "), "checkpoint settings changed over HTTP: {}", keys.join(" "));
                Response::text(200, format!("{}\n", format_config(&c)))
            }
            Err(e) => Response::text(409, format!("{e}\n")),
        }
    }
}

impl Handler for JobRoutes {
    fn handle(&self, req: &Request) -> Response {
        let get = req.method == "GET" || req.method == "HEAD";
        match (get, req.path.as_str()) {
            (true, "/") | (true, "/index.html") => Response::ok("text/html; charset=utf-8", DASHBOARD_HTML),
            (true, "/metrics") => match self.metrics(0) {
                Ok(m) => Response::ok(prometheus::CONTENT_TYPE, prometheus::render(&m)),
                Err(r) => r,
            },
            // Liveness is the process's: a coordinator busy deploying (which can take a while on a
            // cluster) must not get its process restarted. Readiness says whether the job runs.
            (true, "/healthz") => Response::text(200, "ok\n"),
            (true, "/readyz") => match self.metrics(0) {
                Ok(m) if !m.tasks.is_empty() => Response::text(200, format!("ready: {} runs\n", m.generation)),
                Ok(_) => Response::text(503, "not ready: the job is starting or restarting\n"),
                Err(r) => r,
            },
            (true, "/api/status") => match self.metrics(crate::runtime::METRICS_CHECKPOINTS) {
                Ok(m) => json(&m),
                Err(r) => r,
            },
            (true, "/api/checkpoints") => {
                let limit = req.query_param("limit").and_then(|l| l.parse().ok()).unwrap_or(CHECKPOINTS_KEPT);
                match self.metrics(limit) {
                    Ok(m) => json(&m),
                    Err(r) => r,
                }
            }
            (true, p) if p.starts_with("/api/trace/") => match read_record(&*self.store, &p["/api/trace/".len()..]) {
                Ok(r) => json(&super::trace_json(&r)),
                Err((status, why)) => Response::text(status, format!("{why}\n")),
            },
            (true, "/api/settings") => match self.control.checkpoint_config() {
                Ok(c) => Response::text(200, format!("{}\n", format_config(&c))),
                Err(e) => Response::text(503, format!("the job does not answer: {e}\n")),
            },
            (false, "/api/settings") if req.method == "POST" => self.tune(req),
            (_, "/api/settings") => Response::text(405, "POST key=value ... to change settings\n"),
            (false, _) => Response::text(405, "only GET (and POST /api/settings)\n"),
            (true, _) => Response::text(404, "not found: try /, /metrics, /healthz, /readyz or /api/status\n"),
        }
    }
}

/// Serve a worker's probes and metrics on `addr`: `GET /healthz` (`200` while the process runs),
/// `GET /readyz` (`200` while it is joined to a coordinator with a generation deployed, `503`
/// otherwise), `GET /metrics` (its state and its tasks' figures) and `GET /api/status` (the same as
/// JSON).
pub fn serve_worker_http(addr: &str, status: Arc<crate::cluster::WorkerStatus>) -> Result<HttpServer, HttpError> {
    serve_http(addr, Arc::new(WorkerRoutes { status }))
}

struct WorkerRoutes {
    status: Arc<crate::cluster::WorkerStatus>,
}

impl Handler for WorkerRoutes {
    fn handle(&self, req: &Request) -> Response {
        if req.method != "GET" && req.method != "HEAD" {
            return Response::text(405, "only GET\n");
        }
        match req.path.as_str() {
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => {
                let s = self.status.snapshot();
                match (s.connected, s.generation) {
                    (true, Some(g)) => {
                        Response::text(200, format!("ready: gen-{g} runs {} task(s) here\n", s.tasks.len()))
                    }
                    (true, None) => Response::text(503, "not ready: joined, no generation deployed here yet\n"),
                    (false, _) => {
                        Response::text(503, format!("not ready: not joined to the coordinator at {}\n", s.coordinator))
                    }
                }
            }
            "/metrics" => Response::ok(prometheus::CONTENT_TYPE, prometheus::render_worker(&self.status.snapshot())),
            "/api/status" => json(&self.status.snapshot()),
            _ => Response::text(404, "not found: try /healthz, /readyz, /metrics or /api/status\n"),
        }
    }
}
