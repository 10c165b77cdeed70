//! The readable report of the admin socket's `status` request.

use super::protocol::format_config;
use crate::runtime::JobMetrics;

/// The readable report of `status` (without its `ok` line).
pub fn format_status(m: &JobMetrics) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let pending = if m.pending.is_empty() {
        "none".to_string()
    } else {
        m.pending.iter().map(|c| format!("chk-{}", c.0)).collect::<Vec<_>>().join(", ")
    };
    if m.tasks.is_empty() {
        // Between generations (restarting after a failure) the job reports only its settings.
        let _ = writeln!(s, "job: restarting after a failure; figures are back once it runs again");
    } else {
        let _ = writeln!(
            s,
            "job: {}, {} checkpoints completed, {} failed, in flight: {pending}",
            m.generation, m.checkpoints_completed, m.checkpoints_failed
        );
    }
    let _ = writeln!(s, "settings: {}", format_config(&m.config));
    if !m.tasks.is_empty() {
        let _ = writeln!(s, "tasks (since {} started):", m.generation);
        let w = m.tasks.iter().map(|t| t.name.len()).max().unwrap_or(0);
        for t in &m.tasks {
            let _ =
                writeln!(s, "  {:<w$}  backpressured {:>8} ms  idle {:>8} ms", t.name, t.backpressured_ms, t.idle_ms);
        }
        let channels: Vec<_> = m.tasks.iter().flat_map(|t| &t.inputs).collect();
        if !channels.is_empty() {
            let _ = writeln!(s, "channels (batches queued/capacity, most ever queued):");
            let w = channels.iter().map(|c| c.name.len()).max().unwrap_or(0);
            for c in channels {
                let _ = writeln!(
                    s,
                    "  {:<w$}  {:>4}/{:<4} high {}",
                    c.name, c.queued_batches, c.capacity_batches, c.high_water_batches
                );
            }
        }
    }
    if !m.failed.is_empty() {
        let _ = writeln!(s, "recent failed checkpoints (oldest first):");
        for f in &m.failed {
            let by = if f.held_up_by.is_empty() {
                String::new()
            } else {
                format!(" (held up by {})", f.held_up_by.join(", "))
            };
            let _ = writeln!(s, "  failed chk-{}: {}{by}", f.checkpoint.0, f.reason);
        }
    }
    if m.checkpoints.is_empty() {
        let _ = write!(s, "checkpoints: none completed yet");
    } else {
        let _ = write!(s, "recent checkpoints (oldest first):");
        let total = m.tasks.len();
        for c in &m.checkpoints {
            let kind = if c.is_savepoint {
                "  savepoint"
            } else if c.is_final {
                "  final"
            } else {
                ""
            };
            let _ = write!(
                s,
                "\n  chk-{:<6} {:>6} ms  {:>10} bytes  {:>10} in-flight bytes  alignment {:>5} ms  unaligned {}/{} tasks ({} switched){kind}",
                c.checkpoint.0, c.duration_ms, c.bytes, c.channel_state_bytes, c.alignment_ms, c.unaligned_tasks, total, c.switched_tasks
            );
        }
    }
    s
}

// ---------------------------------------------------------------------------------------------------
// Server.
