//! The data plane between worker processes: type-erased ends of the channels whose two tasks run in
//! different processes ([`OutPump`], [`InPump`]), and the TCP links that carry them with credit-based
//! flow control.
//!
//! A channel that crosses processes is still an in-process [`channel`](crate::channel) on each side:
//! the upstream task pushes into a local channel that the outbound link drains, and the inbound link
//! pushes into a local channel that the downstream task reads. Between them, one TCP connection per
//! (sending worker, receiving worker, generation) multiplexes every crossing channel, in per-channel
//! FIFO order. The receiver grants credit per channel: the sender has at most `capacity` data batches
//! of a channel on the wire or queued at the receiver, so memory stays bounded on both sides.
//! Barriers and end-of-stream never need credit, so they always move, however backpressured the data.
//!
//! It does not decide anything about checkpoints; barriers are forwarded in order, never overtaking
//! data on the wire (an unaligned barrier overtakes only what is queued at the receiver).

use super::wire::{FrameReader, FrameWriter, WireError};
use crate::channel::pump::{InPump, Marker, Out, OutPump};
use crate::channel::Waker;
use cutline_core::barrier::Barrier;
use cutline_core::watermark::WatermarkUpdate;
use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Frame kinds of data links.
const KIND_DATA: u8 = 1;
const KIND_BARRIER: u8 = 2;
const KIND_END: u8 = 3;
const KIND_CREDIT: u8 = 4;
const KIND_WATERMARK: u8 = 5;

/// Longest sleep of a link thread with nothing to do (rings wake it earlier; this bounds a lost ring).
const LINK_IDLE_WAIT_MS: u64 = 10;
/// Socket buffer between a link thread and the kernel.
const LINK_BUFFER_BYTES: usize = 256 << 10;

/// Why a link stopped on its own (not because it was closed); its threads stop when it is set.
pub(crate) type LinkFailure = Arc<std::sync::Mutex<Option<String>>>;

/// The threads of one link direction. Dropping it closes the connection and joins them.
pub(crate) struct Link {
    stream: TcpStream,
    closing: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    waker: Arc<Waker>,
    failure: LinkFailure,
}

impl Link {
    /// Why the link stopped on its own (the peer went away, a frame was refused), if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.lock().expect("link failure").clone()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.waker.ring();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn fail(failure: &LinkFailure, closing: &AtomicBool, what: String) {
    if !closing.load(Ordering::SeqCst) {
        tracing::warn!(event = "link_failed", "{what}");
        failure.lock().expect("link failure").get_or_insert(what);
    }
}

/// A frame from the link's peer that did not open: logged with the peer, then the link closes.
fn log_rejected(name: &str, peer: &str, e: &WireError) {
    if e.is_integrity() {
        tracing::warn!(event = "frame_rejected", peer = %peer, reason = %e, "{name}: {e}");
    }
}

fn header(ch: u32, rest: &[u8], buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend_from_slice(&ch.to_be_bytes());
    buf.extend_from_slice(rest);
}

/// Drive the sending side of a link: `pumps[i]` is channel `i` of this connection. `waker` is rung
/// when an upstream task pushes into one of the channels (it is the wake-up of the remote tasks).
pub(crate) fn start_sender(
    stream: TcpStream,
    name: String,
    pumps: Vec<Box<dyn OutPump>>,
    capacity: usize,
    waker: Arc<Waker>,
    (mut writer, mut reader): (FrameWriter, FrameReader),
) -> std::io::Result<Link> {
    stream.set_nodelay(true)?;
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let name = format!("{name} (peer {peer})");
    let closing = Arc::new(AtomicBool::new(false));
    let failure: LinkFailure = Default::default();
    let credits: Arc<Vec<AtomicI64>> = Arc::new((0..pumps.len()).map(|_| AtomicI64::new(capacity as i64)).collect());
    // Channels whose end-of-stream was sent: once all are, the receiver closing is a goodbye.
    let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let channels = pumps.len();
    let mut threads = Vec::new();
    // Credit reader.
    {
        let (closing, failure, credits, waker) = (closing.clone(), failure.clone(), credits.clone(), waker.clone());
        let ended = ended.clone();
        let mut r = BufReader::new(stream.try_clone()?);
        let (name, peer) = (name.clone(), peer.clone());
        threads.push(std::thread::Builder::new().name("cutline-link-credit".into()).spawn(move || {
            let mut payload = Vec::new();
            loop {
                match reader.read(&mut r, &mut payload) {
                    Ok(KIND_CREDIT) if payload.len() == 8 => {
                        let ch = u32::from_be_bytes(payload[0..4].try_into().expect("4 bytes")) as usize;
                        let n = u32::from_be_bytes(payload[4..8].try_into().expect("4 bytes")) as i64;
                        let Some(c) = credits.get(ch) else {
                            return fail(
                                &failure,
                                &closing,
                                format!("{name}: credit for unknown channel {ch}; link closed"),
                            );
                        };
                        // More than the capacity outstanding would mean the receiver lost count.
                        if c.fetch_add(n, Ordering::SeqCst) + n > capacity as i64 {
                            return fail(
                                &failure,
                                &closing,
                                format!(
                                    "{name}: the receiver granted more credit than the channel capacity; link closed"
                                ),
                            );
                        }
                        waker.ring();
                    }
                    Ok(kind) => {
                        return fail(
                            &failure,
                            &closing,
                            format!("{name}: unexpected frame kind {kind} from the receiver; link closed"),
                        )
                    }
                    Err(e) if e.is_closed() && ended.load(Ordering::SeqCst) == channels => return,
                    Err(e) => {
                        waker.ring();
                        log_rejected(&name, &peer, &e);
                        return fail(&failure, &closing, format!("{name}: {e}"));
                    }
                }
            }
        })?);
    }
    // Sender.
    {
        let (closing, failure, waker) = (closing.clone(), failure.clone(), waker.clone());
        let mut w = BufWriter::with_capacity(LINK_BUFFER_BYTES, stream.try_clone()?);
        let mut pumps = pumps;
        let name = name.clone();
        threads.push(std::thread::Builder::new().name("cutline-link-send".into()).spawn(move || {
            let (mut body, mut msg) = (Vec::new(), Vec::new());
            let mut done = vec![false; pumps.len()];
            loop {
                if closing.load(Ordering::SeqCst) || failure.lock().expect("link failure").is_some() {
                    return;
                }
                let seen = waker.rings();
                let mut progressed = false;
                for (i, p) in pumps.iter_mut().enumerate() {
                    if done[i] {
                        continue;
                    }
                    loop {
                        let credit = credits[i].load(Ordering::SeqCst) > 0;
                        let r = match p.poll(credit, i as u32, &mut body) {
                            Out::Empty => break,
                            Out::Gone => {
                                done[i] = true;
                                break;
                            }
                            Out::Data => {
                                credits[i].fetch_sub(1, Ordering::SeqCst);
                                writer.write(&mut w, KIND_DATA, &body)
                            }
                            Out::Barrier(b) => {
                                let bytes = postcard::to_allocvec(&b).expect("a barrier serialises");
                                header(i as u32, &bytes, &mut msg);
                                writer.write(&mut w, KIND_BARRIER, &msg)
                            }
                            // Without credit: at most one watermark sits between two other messages
                            // of a channel (the queue keeps the newest), so they are bounded by them.
                            Out::Watermark(wm) => {
                                let bytes = postcard::to_allocvec(&wm).expect("a watermark serialises");
                                header(i as u32, &bytes, &mut msg);
                                writer.write(&mut w, KIND_WATERMARK, &msg)
                            }
                            Out::End => {
                                done[i] = true;
                                ended.fetch_add(1, Ordering::SeqCst);
                                header(i as u32, &[], &mut msg);
                                writer.write(&mut w, KIND_END, &msg)
                            }
                        };
                        progressed = true;
                        if let Err(e) = r {
                            return fail(&failure, &closing, format!("{name}: sending failed: {e}"));
                        }
                        if done[i] {
                            break;
                        }
                    }
                }
                if let Err(e) = w.flush() {
                    return fail(&failure, &closing, format!("{name}: sending failed: {e}"));
                }
                if !progressed {
                    waker.sleep(seen, Duration::from_millis(LINK_IDLE_WAIT_MS));
                }
            }
        })?);
    }
    Ok(Link { stream, closing, threads, waker, failure })
}

/// Drive the receiving side of a link: `pumps[i]` is channel `i` of this connection. `waker` is rung
/// when a downstream task frees room in one of the channels (it is the wake-up of the remote tasks).
pub(crate) fn start_receiver(
    stream: TcpStream,
    name: String,
    pumps: Vec<Box<dyn InPump>>,
    capacity: usize,
    waker: Arc<Waker>,
    (mut writer, mut reader): (FrameWriter, FrameReader),
) -> std::io::Result<Link> {
    stream.set_nodelay(true)?;
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let name = format!("{name} (peer {peer})");
    let closing = Arc::new(AtomicBool::new(false));
    let failure: LinkFailure = Default::default();
    // Credit the sender holds, per channel (it starts with the whole capacity).
    let granted: Arc<Vec<AtomicI64>> = Arc::new((0..pumps.len()).map(|_| AtomicI64::new(capacity as i64)).collect());
    let pumps = Arc::new(std::sync::Mutex::new(pumps));
    let mut threads = Vec::new();
    // Reader: frames into the local channels.
    {
        let (closing, failure, granted, pumps, waker) =
            (closing.clone(), failure.clone(), granted.clone(), pumps.clone(), waker.clone());
        let mut r = BufReader::with_capacity(LINK_BUFFER_BYTES, stream.try_clone()?);
        let (name, peer) = (name.clone(), peer.clone());
        threads.push(std::thread::Builder::new().name("cutline-link-recv".into()).spawn(move || {
            let mut payload = Vec::new();
            let mut ended = 0;
            let why = loop {
                let kind = match reader.read(&mut r, &mut payload) {
                    Ok(k) => k,
                    Err(WireError::Closed) if closing.load(Ordering::SeqCst) => break None,
                    // Every channel ended: the sender is done, and closing is how it says goodbye.
                    Err(WireError::Closed) if ended == pumps.lock().expect("pumps").len() => break None,
                    Err(e) => {
                        log_rejected(&name, &peer, &e);
                        break Some(format!("{name}: {e}; link closed"));
                    }
                };
                if payload.len() < 4 {
                    break Some(format!("{name}: a frame without a channel number; link closed"));
                }
                let ch = u32::from_be_bytes(payload[0..4].try_into().expect("4 bytes")) as usize;
                let body = &payload[4..];
                let mut pumps = pumps.lock().expect("pumps");
                let Some(p) = pumps.get_mut(ch) else {
                    break Some(format!("{name}: a frame for unknown channel {ch}; link closed"));
                };
                let r = match kind {
                    KIND_DATA => {
                        if granted[ch].fetch_sub(1, Ordering::SeqCst) <= 0 {
                            Err("the sender sent data without credit".to_string())
                        } else {
                            p.push_data(body)
                        }
                    }
                    KIND_BARRIER => match postcard::from_bytes::<Barrier>(body) {
                        Ok(b) => p.push(Marker::Barrier(b)),
                        Err(e) => Err(format!("a barrier does not decode: {e}")),
                    },
                    KIND_WATERMARK => match postcard::from_bytes::<WatermarkUpdate>(body) {
                        Ok(wm) => p.push(Marker::Watermark(wm)),
                        Err(e) => Err(format!("a watermark does not decode: {e}")),
                    },
                    KIND_END => {
                        ended += 1;
                        p.push(Marker::End)
                    }
                    k => Err(format!("unexpected frame kind {k}")),
                };
                if let Err(e) = r {
                    break Some(format!("{name}: channel {ch}: {e}; link closed"));
                }
            };
            if let Some(why) = why {
                fail(&failure, &closing, why);
            }
            // The downstream tasks see their producers gone: a failed link fails them, and the job
            // restores (a closed one is part of a teardown anyway).
            pumps.lock().expect("pumps").clear();
            waker.ring();
        })?);
    }
    // Credit writer: grant what the downstream tasks freed, in bursts of at least half the capacity.
    {
        let (closing, failure, waker) = (closing.clone(), failure.clone(), waker.clone());
        let mut w = BufWriter::new(stream.try_clone()?);
        threads.push(std::thread::Builder::new().name("cutline-link-grant".into()).spawn(move || {
            let burst = (capacity as i64 / 2).max(1);
            loop {
                if closing.load(Ordering::SeqCst) || failure.lock().expect("link failure").is_some() {
                    return;
                }
                let seen = waker.rings();
                // Queued batches and outstanding credit are read together under the pumps lock,
                // which the reader holds while it delivers a batch (and takes its credit back), so a
                // grant never counts a batch twice.
                let grants: Vec<(usize, i64)> = {
                    let pumps = pumps.lock().expect("pumps");
                    pumps
                        .iter()
                        .enumerate()
                        .filter_map(|(ch, p)| {
                            let free = capacity as i64 - p.queued_batches() as i64 - granted[ch].load(Ordering::SeqCst);
                            (free >= burst).then(|| {
                                granted[ch].fetch_add(free, Ordering::SeqCst);
                                (ch, free)
                            })
                        })
                        .collect()
                };
                let sent = !grants.is_empty();
                for (ch, free) in grants {
                    let mut msg = (ch as u32).to_be_bytes().to_vec();
                    msg.extend_from_slice(&(free as u32).to_be_bytes());
                    if let Err(e) = writer.write(&mut w, KIND_CREDIT, &msg) {
                        return fail(&failure, &closing, format!("{name}: granting credit failed: {e}"));
                    }
                }
                if sent {
                    if let Err(e) = w.flush() {
                        return fail(&failure, &closing, format!("{name}: granting credit failed: {e}"));
                    }
                } else {
                    waker.sleep(seen, Duration::from_millis(LINK_IDLE_WAIT_MS));
                }
            }
        })?);
    }
    Ok(Link { stream, closing, threads, waker, failure })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::pump::{in_pump, out_pump};
    use crate::channel::{channel, Message, Rx, Taken, Tx};
    use crate::cluster::wire::{self, sealed_test_ends};
    use cutline_core::barrier::{Alignment, CheckpointMode, SnapshotKind};
    use cutline_core::{CheckpointId, Generation, TimeMs};
    use std::net::TcpListener;
    use std::time::Instant;

    const CAPACITY: usize = 2;

    fn barrier(id: u64) -> Barrier {
        Barrier {
            checkpoint: CheckpointId(id),
            generation: Generation(1),
            triggered_at: TimeMs(0),
            kind: SnapshotKind::Checkpoint,
            mode: CheckpointMode::ExactlyOnce,
            alignment: Alignment::Aligned,
        }
    }

    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// What the downstream task reads, without taking data when `data` is false.
    fn take(rx: &Rx<u64>, data: bool) -> Option<String> {
        match rx.poll(&|_| false, &|_| Vec::new(), data) {
            Taken::Msg(Message::Data(v)) => Some(format!("{v:?}")),
            Taken::Msg(Message::Barrier(b)) => Some(format!("b{}", b.checkpoint.0)),
            Taken::Msg(Message::Watermark(WatermarkUpdate::At(t))) => Some(format!("w{}", t.0)),
            Taken::Msg(Message::Watermark(WatermarkUpdate::Idle)) => Some("idle".into()),
            Taken::Msg(Message::End) => Some("end".into()),
            Taken::Disconnected => Some("gone".into()),
            _ => None,
        }
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn plain() -> (FrameWriter, FrameReader) {
        (FrameWriter::plain(), FrameReader::plain(1 << 20))
    }

    /// upstream Tx -> [local channel -> out pump] ==TCP== [in pump -> local channel] -> downstream Rx
    fn bridge() -> (Tx<u64>, Rx<u64>, Link, Link) {
        bridge_with(plain(), plain())
    }

    fn bridge_with(
        sender: (FrameWriter, FrameReader),
        receiver: (FrameWriter, FrameReader),
    ) -> (Tx<u64>, Rx<u64>, Link, Link) {
        let (up_tx, up_rx) = channel::<u64>(CAPACITY, Waker::new(), Waker::new(), "up".into());
        let (down_tx, down_rx) = channel::<u64>(CAPACITY, Waker::new(), Waker::new(), "down".into());
        let (a, b) = tcp_pair();
        // The pumps' wakers: the sender's is rung by pushes into `up` (its consumer waker stands for
        // the remote task); here the test rings through short idle waits instead.
        let send = start_sender(a, "test send".into(), vec![out_pump(up_rx)], CAPACITY, Waker::new(), sender).unwrap();
        let recv =
            start_receiver(b, "test recv".into(), vec![in_pump(down_tx)], CAPACITY, Waker::new(), receiver).unwrap();
        (up_tx, down_rx, send, recv)
    }

    #[test]
    fn credit_bounds_the_data_in_flight_and_barriers_cross_without_credit() {
        let (up, down, _s, _r) = bridge();
        for i in 0..10 {
            up.push(Message::Data(vec![i])).unwrap(); // pushing never blocks (overdraft)
        }
        wait_for("the first batches to cross", || down.queued_bytes(&|_| 1) == CAPACITY as u64);
        std::thread::sleep(Duration::from_millis(100));
        // The receiver granted no more than the capacity: the rest waits at the sender.
        assert_eq!(down.queued_bytes(&|_| 1), CAPACITY as u64, "more than the credit crossed");
        assert_eq!(up.queued_batches(), 10 - CAPACITY, "the sender kept the data it had no credit for");
        // Drain in order; credit returns and everything crosses, in order, then a barrier and the end.
        let mut got = Vec::new();
        wait_for("all data", || {
            if let Some(m) = take(&down, true) {
                got.push(m);
            }
            got.len() == 10
        });
        assert_eq!(got, (0..10).map(|i| format!("[{i}]")).collect::<Vec<_>>());
        // With no credit left on the wire side (the downstream channel full), a barrier still crosses.
        up.push(Message::Data(vec![100])).unwrap();
        up.push(Message::Data(vec![101])).unwrap();
        wait_for("the channel to fill", || down.queued_bytes(&|_| 1) == 2);
        up.push(Message::Barrier(barrier(7))).unwrap();
        up.push(Message::End).unwrap();
        let mut order = Vec::new();
        wait_for("barrier and end", || {
            if let Some(m) = take(&down, true) {
                order.push(m);
            }
            order.last().is_some_and(|m| m == "end")
        });
        assert_eq!(order, ["[100]", "[101]", "b7", "end"]);
    }

    #[test]
    fn watermarks_cross_in_their_place_between_records_and_barriers() {
        let (up, down, _s, _r) = bridge();
        let wm = |t| Message::Watermark(WatermarkUpdate::At(cutline_core::watermark::EventTime(t)));
        up.push(Message::Data(vec![1])).unwrap();
        up.push(wm(5)).unwrap();
        up.push(Message::Data(vec![2])).unwrap();
        up.push(Message::Watermark(WatermarkUpdate::Idle)).unwrap();
        up.push(Message::Barrier(barrier(3))).unwrap();
        up.push(wm(9)).unwrap();
        up.push(Message::End).unwrap();
        let mut order = Vec::new();
        wait_for("everything", || {
            if let Some(m) = take(&down, true) {
                order.push(m);
            }
            order.last().is_some_and(|m| m == "end")
        });
        assert_eq!(order, ["[1]", "w5", "[2]", "idle", "b3", "w9", "end"]);
    }

    #[test]
    fn a_barrier_at_the_head_of_the_queue_crosses_while_the_receiver_is_full() {
        let (up, down, _s, _r) = bridge();
        up.push(Message::Data(vec![1])).unwrap();
        up.push(Message::Data(vec![2])).unwrap();
        wait_for("the channel to fill", || down.queued_bytes(&|_| 1) == 2);
        // The downstream task takes nothing (it is backpressured), yet the barrier arrives.
        up.push(Message::Barrier(barrier(3))).unwrap();
        wait_for("the barrier", || {
            down.has_message() && down.queued_bytes(&|_| 1) == 2 && {
                // A task with no output credit may take only markers: the barrier is queued behind data,
                // and an unaligned task could overtake it here.
                matches!(down.poll(&|b| b.checkpoint.0 == 3, &|_| Vec::new(), false), Taken::Overtook { .. })
            }
        });
    }

    #[test]
    fn a_malformed_frame_closes_the_link_and_the_downstream_task_sees_its_producer_gone() {
        for (kind, body) in [
            (KIND_DATA, vec![0, 0, 0, 0, 0xff, 0xff, 0xff]), // a batch that does not decode
            (KIND_DATA, vec![0, 0, 0, 9, 1, 1]),             // unknown channel
            (KIND_BARRIER, vec![0, 0, 0, 0, 1]),             // a barrier that does not decode
            (77, vec![0, 0, 0, 0]),                          // unknown kind
            (KIND_DATA, vec![0]),                            // no channel number
        ] {
            let (down_tx, down_rx) = channel::<u64>(CAPACITY, Waker::new(), Waker::new(), "down".into());
            let (mut a, b) = tcp_pair();
            let _r = start_receiver(b, "test".into(), vec![in_pump(down_tx)], CAPACITY, Waker::new(), plain()).unwrap();
            wire::write_frame(&mut a, kind, &body).unwrap();
            wait_for("the downstream task to see the producer gone", || {
                take(&down_rx, true).as_deref() == Some("gone")
            });
        }
    }

    #[test]
    fn data_beyond_the_credit_is_a_protocol_violation() {
        let (down_tx, down_rx) = channel::<u64>(CAPACITY, Waker::new(), Waker::new(), "down".into());
        let (mut a, b) = tcp_pair();
        let _r = start_receiver(b, "test".into(), vec![in_pump(down_tx)], CAPACITY, Waker::new(), plain()).unwrap();
        let batch = postcard::to_allocvec(&vec![1u64]).unwrap();
        let mut frame = vec![0, 0, 0, 0];
        frame.extend_from_slice(&batch);
        for _ in 0..=CAPACITY {
            wire::write_frame(&mut a, KIND_DATA, &frame).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut seen = Vec::new();
        wait_for("the link to close", || {
            if let Some(m) = take(&down_rx, true) {
                seen.push(m);
            }
            seen.last().is_some_and(|m| m == "gone")
        });
        assert_eq!(
            seen,
            ["[1]", "[1]", "gone"],
            "the credited batches arrive, the one beyond the credit closes the link"
        );
    }

    #[test]
    fn a_sealed_link_carries_data_barriers_and_credit() {
        let (client, server) = sealed_test_ends(1 << 20);
        let (up, down, _s, _r) = bridge_with(client, server);
        for i in 0..10 {
            up.push(Message::Data(vec![i])).unwrap();
        }
        up.push(Message::Barrier(barrier(4))).unwrap();
        up.push(Message::End).unwrap();
        let mut got = Vec::new();
        wait_for("everything to cross", || {
            if let Some(m) = take(&down, true) {
                got.push(m);
            }
            got.last().is_some_and(|m| m == "end")
        });
        let mut expected: Vec<String> = (0..10).map(|i| format!("[{i}]")).collect();
        expected.extend(["b4".to_string(), "end".to_string()]);
        assert_eq!(got, expected, "in order, through credit grants (10 batches at a capacity of {CAPACITY})");
    }

    #[test]
    fn a_frame_injected_into_a_sealed_link_closes_it_with_the_peer_named() {
        let (_, (w, r)) = sealed_test_ends(1 << 20);
        let (down_tx, down_rx) = channel::<u64>(CAPACITY, Waker::new(), Waker::new(), "down".into());
        let (mut a, b) = tcp_pair();
        let link = start_receiver(b, "test".into(), vec![in_pump(down_tx)], CAPACITY, Waker::new(), (w, r)).unwrap();
        // A well-formed plain data frame, as an attacker on the path could write it.
        let mut frame = vec![0, 0, 0, 0];
        frame.extend_from_slice(&postcard::to_allocvec(&vec![1u64]).unwrap());
        wire::write_frame(&mut a, KIND_DATA, &frame).unwrap();
        let mut seen = Vec::new();
        wait_for("the downstream task to see the producer gone", || {
            seen.extend(take(&down_rx, true));
            seen.last().is_some_and(|m| m == "gone")
        });
        assert_eq!(seen, ["gone"], "nothing of the injected frame is delivered");
        let why = link.failure().expect("the link failed");
        let peer = a.local_addr().unwrap().to_string();
        assert!(why.contains("integrity check") && why.contains(&peer), "{why}");
    }
}
