//! A `read_committed` reader that decides visibility itself, from the log's control records, for
//! tests of the exactly-once Kafka sink (features `testing` and `kafka`).
//!
//! Why not a librdkafka consumer with `isolation.level = read_committed`: librdkafka filters out the
//! records of aborted transactions using the list of aborted transactions the broker returns with
//! each fetch, and the broker the tests run against (Tansu 0.6.0) always returns an empty list, so
//! records of aborted transactions reach such a consumer. This reader fetches raw record batches
//! (Kafka's Fetch API, version 4, `read_uncommitted`) and applies the protocol's rule directly: a
//! record of a transactional batch is visible once a COMMIT control record of its producer follows
//! it, and never if an ABORT follows; records of non-transactional batches are visible at once.
//! Records of a transaction still open at the end of the log are not returned.
//!
//! It speaks the wire protocol to one broker (the partitions' leader; the tests run one broker) and
//! reads uncompressed batches only (the sinks under test do not compress).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Bytes asked per fetch, per partition.
const FETCH_MAX_BYTES: i32 = 8 << 20;
/// Longest response accepted.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// A record a `read_committed` consumer may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedRecord {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// The id of the producer that wrote it (-1 for a non-idempotent producer).
    pub producer_id: i64,
    /// That producer's epoch when it wrote it.
    pub producer_epoch: i16,
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        let s = self.b.get(self.at..self.at + n).ok_or_else(|| bad("response truncated"))?;
        self.at += n;
        Ok(s)
    }
    fn i8(&mut self) -> io::Result<i8> {
        Ok(self.take(1)?[0] as i8)
    }
    fn i16(&mut self) -> io::Result<i16> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> io::Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn i64(&mut self) -> io::Result<i64> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn string(&mut self) -> io::Result<String> {
        let n = self.i16()?;
        Ok(String::from_utf8_lossy(self.take(n.max(0) as usize)?).into_owned())
    }
    fn varlong(&mut self) -> io::Result<i64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        Err(bad("varint too long"))
    }
    fn bytes_varint(&mut self) -> io::Result<Option<Vec<u8>>> {
        let n = self.varlong()?;
        if n < 0 {
            return Ok(None);
        }
        Ok(Some(self.take(n as usize)?.to_vec()))
    }
}

fn fetch(conn: &mut TcpStream, correlation: i32, topic: &str, partition: i32, offset: i64) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    body.extend_from_slice(&1i16.to_be_bytes()); // Fetch
    body.extend_from_slice(&4i16.to_be_bytes()); // version 4
    body.extend_from_slice(&correlation.to_be_bytes());
    let client = b"cutline-test";
    body.extend_from_slice(&(client.len() as i16).to_be_bytes());
    body.extend_from_slice(client);
    body.extend_from_slice(&(-1i32).to_be_bytes()); // replica id
    body.extend_from_slice(&100i32.to_be_bytes()); // max wait ms
    body.extend_from_slice(&0i32.to_be_bytes()); // min bytes
    body.extend_from_slice(&FETCH_MAX_BYTES.to_be_bytes());
    body.push(0); // read_uncommitted: visibility is decided here
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&partition.to_be_bytes());
    body.extend_from_slice(&offset.to_be_bytes());
    body.extend_from_slice(&FETCH_MAX_BYTES.to_be_bytes());
    conn.write_all(&(body.len() as i32).to_be_bytes())?;
    conn.write_all(&body)?;
    let mut len = [0u8; 4];
    conn.read_exact(&mut len)?;
    let len = i32::from_be_bytes(len);
    if len < 0 || len as usize > MAX_RESPONSE_BYTES {
        return Err(bad(format!("response of {len} bytes")));
    }
    let mut resp = vec![0u8; len as usize];
    conn.read_exact(&mut resp)?;
    Ok(resp)
}

/// The records of `topic`'s partitions `0..partitions` that a `read_committed` consumer may see, in
/// offset order per partition (partitions in order), as of now.
pub fn read_committed(broker: &str, topic: &str, partitions: i32) -> io::Result<Vec<CommittedRecord>> {
    let mut conn = TcpStream::connect(broker)?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut out = Vec::new();
    let mut correlation = 0;
    for partition in 0..partitions {
        let mut offset = 0i64;
        // Per producer id, the records of its open transaction.
        let mut open: HashMap<i64, Vec<CommittedRecord>> = HashMap::new();
        let mut visible = Vec::new();
        loop {
            correlation += 1;
            let resp = fetch(&mut conn, correlation, topic, partition, offset)?;
            let mut c = Cursor { b: &resp, at: 0 };
            if c.i32()? != correlation {
                return Err(bad("response to another request"));
            }
            let _throttle = c.i32()?;
            if c.i32()? != 1 {
                return Err(bad("expected one topic in the response"));
            }
            let _topic = c.string()?;
            if c.i32()? != 1 {
                return Err(bad("expected one partition in the response"));
            }
            let _p = c.i32()?;
            let error = c.i16()?;
            if error != 0 {
                return Err(bad(format!("fetch of {topic}/{partition} at {offset}: error code {error}")));
            }
            let high = c.i64()?;
            let _lso = c.i64()?;
            let aborted = c.i32()?;
            for _ in 0..aborted.max(0) {
                c.i64()?;
                c.i64()?;
            }
            let n = c.i32()?;
            let records = c.take(n.max(0) as usize)?;
            let before = offset;
            offset = parse_batches(records, partition, offset, &mut open, &mut visible)?;
            if offset >= high {
                break;
            }
            if offset == before {
                return Err(bad(format!(
                    "no progress reading {topic}/{partition} at {offset} (high watermark {high})"
                )));
            }
        }
        visible.sort_by_key(|r: &CommittedRecord| r.offset);
        out.extend(visible);
    }
    Ok(out)
}

/// Parse the whole batches in `b`; returns the offset after the last one.
fn parse_batches(
    b: &[u8],
    partition: i32,
    mut next: i64,
    open: &mut HashMap<i64, Vec<CommittedRecord>>,
    visible: &mut Vec<CommittedRecord>,
) -> io::Result<i64> {
    let mut at = 0usize;
    while b.len() - at >= 12 {
        let base = i64::from_be_bytes(b[at..at + 8].try_into().unwrap());
        let len = i32::from_be_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        if b.len() - at - 12 < len {
            break; // a partial batch at the end of the response
        }
        let mut c = Cursor { b: &b[at + 12..at + 12 + len], at: 0 };
        at += 12 + len;
        let _leader_epoch = c.i32()?;
        let magic = c.i8()?;
        if magic != 2 {
            return Err(bad(format!("record batch version {magic} (only 2 is read)")));
        }
        let _crc = c.i32()?;
        let attributes = c.i16()?;
        if attributes & 0x7 != 0 {
            return Err(bad("a compressed batch (this reader reads uncompressed batches only)"));
        }
        let transactional = attributes & 0x10 != 0;
        let control = attributes & 0x20 != 0;
        let last_delta = c.i32()?;
        let _base_ts = c.i64()?;
        let _max_ts = c.i64()?;
        let producer = c.i64()?;
        let epoch = c.i16()?;
        let _seq = c.i32()?;
        let count = c.i32()?;
        for _ in 0..count {
            let _len = c.varlong()?;
            let _attr = c.i8()?;
            let _ts = c.varlong()?;
            let delta = c.varlong()?;
            let key = c.bytes_varint()?;
            let value = c.bytes_varint()?;
            let headers = c.varlong()?;
            for _ in 0..headers {
                c.bytes_varint()?;
                c.bytes_varint()?;
            }
            let offset = base + delta;
            if offset < next {
                continue;
            }
            if control {
                let k = key.ok_or_else(|| bad("a control record without a key"))?;
                let kind = i16::from_be_bytes(k.get(2..4).ok_or_else(|| bad("short control key"))?.try_into().unwrap());
                let records = open.remove(&producer).unwrap_or_default();
                match kind {
                    1 => visible.extend(records),
                    0 => {}
                    other => return Err(bad(format!("control record of type {other}"))),
                }
                continue;
            }
            let r = CommittedRecord { partition, offset, key, value, producer_id: producer, producer_epoch: epoch };
            if transactional {
                open.entry(producer).or_default().push(r);
            } else {
                visible.push(r);
            }
        }
        next = next.max(base + last_delta as i64 + 1);
    }
    Ok(next)
}
