//! Admission of workers at the coordinator: the acceptor, the authenticated handshake on a thread of
//! its own per connection, and each admitted worker's reader and writer threads.

use super::coordinator::{EventSink, Inbox, Reports, WorkerConn, WORKER_QUEUE_MESSAGES};
use super::proto::{self, message, version, JobInfo, JoinHello, ToCoordinator, ToWorker, WelcomeHello, KIND_MESSAGE};
use super::wire::{self, FrameProtection, Secret};
use crate::runtime::run::RtEvent;
use crossbeam_channel::Sender;
use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handshakes in progress at once; more connections are closed at once (a flood of unauthenticated
/// peers costs a bounded number of threads).
pub(crate) const MAX_PENDING_HANDSHAKES: usize = 64;

/// What the acceptor and every admission share.
pub(crate) struct AdmitCtx {
    pub(crate) secret: Secret,
    pub(crate) protection: FrameProtection,
    pub(crate) job: JobInfo,
    pub(crate) inbox: Sender<Inbox>,
    pub(crate) events: EventSink,
    pub(crate) reports: Reports,
    pub(crate) clock: Instant,
    pub(crate) max_frame_bytes: u32,
    pub(crate) heartbeat_interval_ms: u64,
    /// Ids go to authenticated workers only.
    pub(crate) next_id: std::sync::atomic::AtomicU32,
    /// Handshakes in progress.
    pub(crate) handshakes: std::sync::atomic::AtomicUsize,
}

/// Accept workers: authenticate, hand them the job, and start a reader and a writer per connection.
pub(crate) fn accept_workers(listener: TcpListener, ctx: Arc<AdmitCtx>, closing: Arc<AtomicBool>) {
    for stream in listener.incoming() {
        if closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        if ctx.handshakes.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            ctx.handshakes.fetch_sub(1, Ordering::SeqCst);
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::warn!(
                event = "connection_refused",
                peer = %peer,
                "refused a connection from {peer}: {MAX_PENDING_HANDSHAKES} handshakes already in progress"
            );
            continue;
        }
        let ctx = ctx.clone();
        // Each handshake on its own thread: a slow or hostile peer holds up no one else.
        let spawned = std::thread::Builder::new().name("cutline-admit".into()).spawn(move || {
            admit(stream, &ctx);
        });
        if spawned.is_err() {
            // The closure (and its count) is gone with the failed spawn; the count stays one high,
            // which only lowers the limit.
            continue;
        }
    }
}

/// Authenticate one connection; if it is a worker of our version, hand it the job and start its
/// reader and writer.
fn admit(mut stream: TcpStream, ctx: &AdmitCtx) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let welcome = proto::encode(&WelcomeHello { version: version() });
    let established = wire::handshake_server(&mut stream, &ctx.secret, ctx.protection, &welcome, ctx.max_frame_bytes)
        .and_then(|est| proto::decode::<JoinHello>(&est.hello).map(|h| (h, est)));
    ctx.handshakes.fetch_sub(1, Ordering::SeqCst);
    let (hello, wire::Established { writer: mut frames_out, reader: mut frames_in, .. }) = match established {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(event = "connection_refused", peer = %peer, reason = %e, "refused a connection from {peer}: {e}");
            return;
        }
    };
    if hello.version != version() {
        tracing::warn!(
            event = "connection_refused",
            peer = %peer,
            reason = "version",
            "refused worker {} at {peer}: it runs cutline {}, this coordinator {}; run the same version everywhere",
            hello.name,
            hello.version,
            version()
        );
        return;
    }
    let id = ctx.next_id.fetch_add(1, Ordering::SeqCst);
    let (clock, max_frame_bytes) = (ctx.clock, ctx.max_frame_bytes);
    let job = message(&ToWorker::Job { worker: id, job: ctx.job.clone() });
    let last_heard = Arc::new(AtomicU64::new(clock.elapsed().as_millis() as u64));
    let (out_tx, out_rx) = crossbeam_channel::bounded::<Arc<[u8]>>(WORKER_QUEUE_MESSAGES);
    let _ = out_tx.try_send(job);
    let (Ok(r), Ok(w)) = (stream.try_clone(), stream.try_clone()) else { return };
    let Ok(conn_stream) = stream.try_clone() else { return };
    // Known to the coordinator before its reader can report it lost.
    let conn = WorkerConn {
        name: hello.name,
        data_addr: hello.data_addr,
        out: out_tx,
        stream: conn_stream,
        last_heard: last_heard.clone(),
    };
    if ctx.inbox.send(Inbox::Joined(id, conn)).is_err() {
        return;
    }
    let (inbox, events, reports) = (&ctx.inbox, &ctx.events, &ctx.reports);
    // Writer: the coordinator's messages, and a heartbeat whenever nothing was sent for an interval.
    let inbox_w = inbox.clone();
    let beat = Duration::from_millis(ctx.heartbeat_interval_ms);
    let spawned_writer = std::thread::Builder::new().name(format!("cutline-to-worker-{id}")).spawn(move || {
        let mut w = BufWriter::new(w);
        let _ = w.get_ref().set_write_timeout(Some(Duration::from_secs(10)));
        let heartbeat = message(&ToWorker::Heartbeat);
        loop {
            let m = match out_rx.recv_timeout(beat) {
                Ok(m) => m,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => heartbeat.clone(),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            };
            let r = frames_out.write(&mut w, KIND_MESSAGE, &m).and_then(|()| {
                if out_rx.is_empty() {
                    w.flush().map_err(wire::WireError::Io)
                } else {
                    Ok(())
                }
            });
            if let Err(e) = r {
                let _ = inbox_w.send(Inbox::Lost(id, format!("sending to it failed: {e}")));
                return;
            }
        }
    });
    // Reader.
    let (inbox_r, events_r, heard, reports_r) = (inbox.clone(), events.clone(), last_heard.clone(), reports.clone());
    let _ = max_frame_bytes;
    let spawned_reader = std::thread::Builder::new().name(format!("cutline-from-worker-{id}")).spawn(move || {
        let mut r = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            let m = match proto::read_message::<ToCoordinator>(&mut frames_in, &mut r, &mut buf) {
                Ok(m) => m,
                Err(e) => {
                    if e.is_integrity() {
                        tracing::warn!(event = "frame_rejected", worker = id, peer = %peer, reason = %e, "worker {id} at {peer}: {e}");
                    }
                    let why = if e.is_closed() { "its connection closed".to_string() } else { e.to_string() };
                    let _ = inbox_r.send(Inbox::Lost(id, why));
                    return;
                }
            };
            heard.store(clock.elapsed().as_millis() as u64, Ordering::SeqCst);
            match m {
                ToCoordinator::Heartbeat { tasks } => {
                    // Only figures of tasks placed on this worker in the current generation: the map
                    // holds at most one entry per task of the job, whatever a worker sends.
                    let Some(placed) = events_r.lock().expect("event sink").as_ref().map(|s| s.worker_of.clone())
                    else {
                        continue;
                    };
                    let mut reports = reports_r.lock().expect("reports");
                    for (t, report) in tasks {
                        if placed.get(t as usize) == Some(&id) {
                            reports.insert(t, report);
                        }
                    }
                }
                ToCoordinator::Events(evs) => {
                    // Sent outside the lock: a full queue blocks this reader (and so the worker's
                    // connection), never the coordinator. Events of older generations are the
                    // coordinator's to ignore (it checks every event's generation).
                    let Some(tx) = events_r.lock().expect("event sink").as_ref().map(|s| s.events.clone()) else {
                        continue;
                    };
                    let mut out = Vec::new();
                    for e in evs {
                        e.into_events(&mut out);
                    }
                    let _ = tx.send(RtEvent::Batch { worker: id, events: out });
                }
                other => {
                    if inbox_r.send(Inbox::Msg(id, other)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    if spawned_writer.is_err() || spawned_reader.is_err() {
        let _ = stream.shutdown(Shutdown::Both);
        let _ = inbox.send(Inbox::Lost(id, "cannot start its threads".into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::acks::TaskEvent;
    use crate::cluster::coordinator::GenerationSink;
    use crate::cluster::proto::WorkerSettings;
    use crate::cluster::shape::GraphShape;
    use crate::runtime::TaskReport;
    use cutline_core::{Generation, TaskId};
    use std::sync::Mutex;

    const FLOOD_MESSAGES: u32 = 300;
    const TEST_EVENT_QUEUE: usize = 2;

    fn job() -> JobInfo {
        JobInfo {
            args: vec![],
            fingerprint: "test".into(),
            shape: GraphShape { max_parallelism: 1, stages: vec![], edges: vec![] },
            state: "/nowhere".into(),
            settings: WorkerSettings {
                heartbeat_interval_ms: 1000,
                heartbeat_timeout_ms: 5000,
                channel_capacity: 1,
                batch_size: 1,
                max_channel_state_bytes: 1,
                snapshot_writers: 1,
                incremental_checkpoints: true,
                state_backend: crate::state::StateBackend::Memory,
                max_frame_bytes: 1 << 20,
            },
        }
    }

    #[test]
    fn a_flooding_worker_is_backpressured_and_reports_only_its_own_tasks() {
        let secret = Secret::new(vec![5; 32]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (inbox_tx, inbox_rx) = crossbeam_channel::bounded(16);
        let (ev_tx, ev_rx) = crossbeam_channel::bounded::<RtEvent>(TEST_EVENT_QUEUE);
        // Tasks 0 and 2 are on worker 0 (the one that joins), 1 and 3 on worker 1.
        let sink = GenerationSink { events: ev_tx, worker_of: Arc::new(vec![0, 1, 0, 1]) };
        let (events, reports): (EventSink, Reports) = (Arc::new(Mutex::new(Some(sink))), Default::default());
        let ctx = Arc::new(AdmitCtx {
            secret: secret.clone(),
            protection: FrameProtection::On,
            job: job(),
            inbox: inbox_tx,
            events,
            reports: reports.clone(),
            clock: Instant::now(),
            max_frame_bytes: 1 << 20,
            heartbeat_interval_ms: 1000,
            next_id: Default::default(),
            handshakes: Default::default(),
        });
        std::thread::spawn(move || accept_workers(listener, ctx, Arc::new(AtomicBool::new(false))));

        // The worker, by hand.
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = proto::encode(&JoinHello { version: version(), name: "flood".into(), data_addr: "x:1".into() });
        let mut est = wire::handshake_client(&mut s, &secret, FrameProtection::On, &hello, 1 << 20).unwrap();
        assert!(matches!(inbox_rx.recv_timeout(Duration::from_secs(5)), Ok(Inbox::Joined(0, _))));
        let mut buf = Vec::new();
        let first = proto::read_message::<ToWorker>(&mut est.reader, &mut s.try_clone().unwrap(), &mut buf).unwrap();
        assert!(matches!(first, ToWorker::Job { worker: 0, .. }));
        let mut w = BufWriter::new(s.try_clone().unwrap());
        let mut send = |m: &ToCoordinator| {
            est.writer.write(&mut w, KIND_MESSAGE, &proto::encode(m)).unwrap();
            w.flush().unwrap();
        };
        // Figures for its own tasks, another worker's and tasks the job does not have.
        let tasks = [0u32, 1, 2, 3, 1_000_000].iter().map(|t| (*t, TaskReport::default())).collect();
        send(&ToCoordinator::Heartbeat { tasks });
        for i in 0..FLOOD_MESSAGES {
            let finished = TaskEvent::TaskFinished { generation: Generation(1), task: TaskId(i) };
            send(&ToCoordinator::Events(vec![finished]));
        }
        // Nobody drains the events: the queue stays at its bound and the reader waits.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(ev_rx.len(), TEST_EVENT_QUEUE, "the queue holds what its bound allows, no more");
        let placed: Vec<u32> = {
            let mut v: Vec<u32> = reports.lock().unwrap().keys().copied().collect();
            v.sort_unstable();
            v
        };
        assert_eq!(placed, [0, 2], "only the figures of the worker's own tasks are kept");
        // Backpressure, not loss: draining delivers every message, in order.
        let mut got = Vec::new();
        while got.len() < FLOOD_MESSAGES as usize {
            match ev_rx.recv_timeout(Duration::from_secs(5)) {
                Ok(RtEvent::Batch { worker: 0, events }) => got.extend(events),
                Ok(_) => panic!("an event not from worker 0"),
                Err(e) => panic!("only {} of {FLOOD_MESSAGES} events arrived: {e}", got.len()),
            }
        }
        let tasks: Vec<u32> = got
            .iter()
            .map(|e| match e {
                cutline_core::coordinator::Event::TaskFinished { task, .. } => task.0,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(tasks, (0..FLOOD_MESSAGES).collect::<Vec<_>>());
    }
}
