//! The readable form of a checkpoint's epoch trace (`cutline trace`): every task's part, then the
//! critical path with its slowest step marked and what that step means.

use crate::runtime::{CheckpointRecord, TaskTrace};
use std::fmt::Write as _;

/// Inputs a task row lists one by one; beyond that only the first and the last barrier.
const INPUTS_LISTED: usize = 4;

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn inputs_text(t: &TaskTrace) -> String {
    let arrived: Vec<(&str, u64)> =
        t.inputs.iter().filter_map(|i| i.barrier_us.map(|at| (i.from.as_str(), at))).collect();
    let ended = t.inputs.len() - arrived.len();
    let ended = if ended > 0 { format!(" ({ended} ended)") } else { String::new() };
    if t.inputs.is_empty() {
        return "source: barrier injected".into();
    }
    if arrived.len() <= INPUTS_LISTED {
        let list: Vec<String> = arrived.iter().map(|(from, at)| format!("{from} +{}", ms(*at))).collect();
        return format!("{}{ended}", list.join(", "));
    }
    let first = arrived.iter().min_by_key(|(_, at)| *at).expect("not empty");
    let last = arrived.iter().max_by_key(|(_, at)| *at).expect("not empty");
    format!("{} inputs: first {} +{}, last {} +{}{ended}", arrived.len(), first.0, ms(first.1), last.0, ms(last.1))
}

fn size(b: u64) -> String {
    bytesize::ByteSize::b(b).display().iec().to_string()
}

/// `r` as text: a header, one row per task (times in milliseconds after the trigger), the critical
/// path, and the slowest step marked with `<== slowest`.
pub fn format_trace(r: &CheckpointRecord) -> String {
    let mut s = String::new();
    let when = if r.triggered_at_unix_ms > 0 {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.triggered_at_unix_ms);
        format!(", triggered {}", humantime::format_rfc3339_millis(t))
    } else {
        String::new()
    };
    let mode = if r.unaligned_tasks > 0 {
        format!("unaligned at {} of {} tasks ({} switched)", r.unaligned_tasks, r.tasks.len(), r.switched_tasks)
    } else {
        "aligned".to_string()
    };
    let _ = writeln!(
        s,
        "checkpoint {} ({}, gen-{}){when}: complete in {} ms, {} of state, {} in flight, {mode}",
        r.checkpoint,
        r.kind,
        r.generation,
        r.duration_ms,
        size(r.bytes),
        size(r.channel_state_bytes)
    );
    let _ = writeln!(s, "times are milliseconds after the trigger\n");
    let w = r.tasks.iter().map(|t| t.task.len()).max().unwrap_or(4).max("coordinator".len());
    let rows: Vec<String> = r.tasks.iter().map(inputs_text).collect();
    let iw = rows.iter().map(|x| x.len()).max().unwrap_or(6).clamp(6, 70);
    let _ = writeln!(
        s,
        "{:<w$}  {:<iw$}  {:>9}  {:>8}  {:>9}  {:>9}  {:>10}  notes",
        "task", "barrier arrived", "snapshot", "sync µs", "durable", "acked", "state"
    );
    for (t, inputs) in r.tasks.iter().zip(&rows) {
        let mut notes = Vec::new();
        if t.unaligned {
            notes.push(if t.switched { "unaligned (switched)".to_string() } else { "unaligned".into() });
        }
        if t.channel_state_bytes > 0 {
            notes.push(format!("{} in flight", size(t.channel_state_bytes)));
        }
        if t.blocked_records > 0 {
            notes.push(format!("{} records piled up while aligning", t.blocked_records));
        }
        let row = format!(
            "{:<w$}  {:<iw$}  {:>9}  {:>8}  {:>9}  {:>9}  {:>10}  {}",
            t.task,
            inputs,
            format!("+{}", ms(t.snapshot_us)),
            t.sync_us,
            format!("+{}", ms(t.durable_us)),
            format!("+{}", ms(t.acked_us)),
            size(t.bytes),
            notes.join(", ")
        );
        let _ = writeln!(s, "{}", row.trim_end());
    }
    let _ = writeln!(
        s,
        "{:<w$}  manifest durable +{}, tasks notified +{}",
        "coordinator",
        ms(r.committed_us),
        ms(r.notified_us)
    );
    let path = r.critical_path();
    let slowest = r.slowest_step();
    let _ = writeln!(s, "\ncritical path (from the trigger to the commit, along the latest barriers):");
    let aw = path.iter().map(|p| p.at.len()).max().unwrap_or(0);
    for step in &path {
        let mark = match &slowest {
            Some(x) if x == step => "  <== slowest".to_string(),
            _ => String::new(),
        };
        let _ = writeln!(s, "  {:<14} {:<aw$} {:>10} ms{mark}", step.what.name(), step.at, ms(step.us));
    }
    if let Some(x) = slowest {
        let _ = writeln!(s, "slowest step: {} at {}, {} ms: {}", x.what.name(), x.at, ms(x.us), x.what.meaning());
    }
    match r.longest_alignment() {
        Some((t, us)) => {
            let _ = write!(
                s,
                "longest alignment: {}, {} ms between its first and last barrier, {} records piled up on its inputs",
                t.task,
                ms(us),
                t.blocked_records
            );
        }
        None => {
            let _ = write!(s, "no task waited between barriers (no alignment)");
        }
    }
    s
}

/// `r` as JSON for the dashboard and `cutline trace --json`: the record's fields, plus
/// `critical_path` (each step's `at`, `step`, `us` and `meaning`), `slowest` (the index of the
/// slowest step in it) and `longest_alignment` (`task`, `us`, `blocked_records`, or null).
pub fn trace_json(r: &CheckpointRecord) -> serde_json::Value {
    let path = r.critical_path();
    let slowest = r.slowest_step().and_then(|x| path.iter().position(|p| *p == x));
    let mut v = serde_json::to_value(r).expect("a record serializes");
    let steps: Vec<serde_json::Value> = path
        .iter()
        .map(|p| serde_json::json!({ "at": p.at, "step": p.what.name(), "us": p.us, "meaning": p.what.meaning() }))
        .collect();
    let longest = r
        .longest_alignment()
        .map(|(t, us)| serde_json::json!({ "task": t.task, "us": us, "blocked_records": t.blocked_records }));
    if let Some(o) = v.as_object_mut() {
        o.insert("critical_path".into(), steps.into());
        o.insert("slowest".into(), slowest.into());
        o.insert("longest_alignment".into(), longest.unwrap_or(serde_json::Value::Null));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::InputTrace;

    fn task(name: &str, inputs: &[(&str, u64)], snapshot: u64, durable: u64, acked: u64) -> TaskTrace {
        TaskTrace {
            task: name.into(),
            inputs: inputs.iter().map(|(f, at)| InputTrace { from: f.to_string(), barrier_us: Some(*at) }).collect(),
            snapshot_us: snapshot,
            sync_us: 50,
            handoff_us: snapshot + 50,
            durable_us: durable,
            acked_us: acked,
            bytes: 4096,
            ..Default::default()
        }
    }

    fn record(tasks: Vec<TaskTrace>) -> CheckpointRecord {
        let last = tasks.iter().map(|t| t.acked_us).max().unwrap_or(0);
        CheckpointRecord {
            checkpoint: 7,
            generation: 1,
            kind: "checkpoint".into(),
            last_ack_us: last,
            committed_us: last + 2_000,
            notified_us: last + 2_100,
            tasks,
            ..Default::default()
        }
    }

    #[test]
    fn each_kind_of_slow_checkpoint_is_named_for_what_slowed_it() {
        // A slow source: its barrier leaves 300 ms after the trigger; agg aligns meanwhile.
        let slow_source = record(vec![
            task("fast#0", &[], 100, 1_000, 1_100),
            task("slow#0", &[], 300_000, 301_000, 301_100),
            task("agg#0", &[("fast#0", 400), ("slow#0", 300_400)], 300_400, 302_000, 302_100),
        ]);
        let text = format_trace(&slow_source);
        assert!(text.contains("slowest step: injection at slow#0, 300.00 ms: propagation"), "{text}");
        assert!(text.contains("longest alignment: agg#0, 300.00 ms"), "{text}");
        let path: Vec<String> =
            slow_source.critical_path().iter().map(|p| format!("{} {}", p.what.name(), p.at)).collect();
        assert_eq!(
            path,
            [
                "injection slow#0",
                "sync snapshot slow#0",
                "transit slow#0 -> agg#0",
                "sync snapshot agg#0",
                "upload agg#0",
                "ack agg#0",
                "commit coordinator",
                "notify coordinator"
            ]
        );
        // A barrier stuck behind queued records: forwarded at 0.15 ms, arrived at 250 ms.
        let stuck = record(vec![
            task("src#0", &[], 100, 900, 1_000),
            task("agg#0", &[("src#0", 250_000)], 250_000, 251_000, 251_100),
        ]);
        let text = format_trace(&stuck);
        assert!(text.contains("slowest step: transit at src#0 -> agg#0, 249.85 ms: propagation"), "{text}");
        // Snapshot I/O, and storage.
        let io = record(vec![task("agg#0", &[], 400, 500_000, 500_100)]);
        assert!(format_trace(&io).contains("slowest step: upload at agg#0"), "{}", format_trace(&io));
        let mut storage = record(vec![task("agg#0", &[], 400, 900, 1_000)]);
        storage.committed_us = 400_000;
        storage.notified_us = 400_100;
        assert!(format_trace(&storage).contains("slowest step: commit at coordinator"), "{}", format_trace(&storage));
        // Unaligned: the snapshot at the first barrier, handed over once the last one came.
        let mut agg = task("agg#0", &[("fast#0", 400), ("slow#0", 300_400)], 400, 301_000, 301_100);
        agg.handoff_us = 300_400;
        agg.unaligned = true;
        let unaligned =
            record(vec![task("fast#0", &[], 100, 900, 1_000), task("slow#0", &[], 300_000, 300_900, 301_000), agg]);
        let text = format_trace(&unaligned);
        assert!(text.contains("slowest step: channel state at agg#0, 299.95 ms: buffering"), "{text}");
        assert!(text.contains("transit        fast#0 -> agg#0"), "{text}");
    }

    #[test]
    fn many_inputs_are_summed_up_by_the_first_and_last_barrier() {
        let inputs: Vec<(String, u64)> = (0..100).map(|i| (format!("src#{i}"), 1_000 + i * 10)).collect();
        let inputs: Vec<(&str, u64)> = inputs.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let text = format_trace(&record(vec![task("agg#0", &inputs, 2_000, 3_000, 3_100)]));
        assert!(text.contains("100 inputs: first src#0 +1.00, last src#99 +1.99"), "{text}");
    }
}
