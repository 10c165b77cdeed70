//! Alignment settings.

use super::*;

#[test]
fn config_validation_rejects_unaligned_and_alignment_limits_with_at_least_once() {
    let alo = CheckpointConfig { mode: CheckpointMode::AtLeastOnce, ..Default::default() };
    assert_eq!(alo.validate(), Ok(()));
    let bad = [
        ("unaligned", CheckpointConfig { unaligned: true, ..alo.clone() }),
        ("an alignment timeout", CheckpointConfig { alignment_timeout_ms: Some(50), ..alo.clone() }),
        ("a blocked-bytes limit", CheckpointConfig { max_aligned_bytes: Some(1 << 20), ..alo.clone() }),
    ];
    for (what, cfg) in bad {
        let err = cfg.validate().expect_err(what);
        assert!(err.contains("exactly-once"), "at-least-once with {what}: the message must say what to change: {err}");
    }
    // Exactly-once takes them all.
    let eo = CheckpointConfig {
        unaligned: true,
        alignment_timeout_ms: Some(50),
        max_aligned_bytes: Some(1 << 20),
        ..Default::default()
    };
    assert_eq!(eo.validate(), Ok(()));
}

#[test]
fn max_concurrent_is_bounded_regression_tune_accepted_4294967296() {
    for n in [0, MAX_CONCURRENT_CHECKPOINTS + 1, 1 << 32] {
        let cfg = CheckpointConfig { max_concurrent: n, ..Default::default() };
        let err = cfg.validate().expect_err("out of range");
        assert_eq!(
            err,
            format!("max concurrent checkpoints must be at least 1 and at most {MAX_CONCURRENT_CHECKPOINTS}, not {n}")
        );
    }
    for n in [1, MAX_CONCURRENT_CHECKPOINTS] {
        assert_eq!(CheckpointConfig { max_concurrent: n, ..Default::default() }.validate(), Ok(()));
    }
}

#[test]
#[should_panic(expected = "invalid checkpoint config")]
fn a_job_cannot_start_with_unaligned_at_least_once_checkpoints() {
    job().at_least_once().unaligned().start();
}

#[test]
#[rustfmt::skip] // scenarios read as prose: one step per call, grouped by instant
fn alignment_settings_changed_while_running_are_validated_and_apply_from_the_next_trigger() {
    let mut s = job().start();
    s.at(100).tick().expect_trigger(1); // aligned
    let running = s.c.config().clone();
    let unaligned_alo = CheckpointConfig { mode: CheckpointMode::AtLeastOnce, unaligned: true, ..running.clone() };
    assert!(s.c.set_config(unaligned_alo).is_err(), "set_config accepted unaligned at-least-once");
    assert_eq!(s.c.config(), &running, "a refused change leaves the settings as they were");
    s.c.set_config(CheckpointConfig { unaligned: true, ..running }).unwrap();
    s.at(110).complete(1)
        .at(200).tick().expect_barrier(2, SnapshotKind::Checkpoint, CheckpointMode::ExactlyOnce, Alignment::Unaligned)
        .at(210).savepoint().expect_savepoint_trigger(3); // savepoints still align
}

#[test]
fn alignment_for_maps_settings_to_the_barrier_alignment() {
    use Alignment::*;
    const MAX: u64 = u64::MAX;
    struct Row {
        what: &'static str,
        mode: CheckpointMode,
        unaligned: bool,
        timeout: Option<u64>,
        bytes: Option<u64>,
        /// For periodic checkpoints; the final checkpoint and savepoints are always `Aligned`.
        want: Alignment,
    }
    #[rustfmt::skip]
    let table = [
        Row { what: "the default aligns",
              mode: CheckpointMode::ExactlyOnce, unaligned: false, timeout: None, bytes: None, want: Aligned },
        Row { what: "unaligned",
              mode: CheckpointMode::ExactlyOnce, unaligned: true, timeout: None, bytes: None, want: Unaligned },
        Row { what: "an alignment timeout alone: no bytes limit",
              mode: CheckpointMode::ExactlyOnce, unaligned: false, timeout: Some(50), bytes: None,
              want: AlignedWithTimeout { timeout_ms: 50, max_blocked_bytes: MAX } },
        Row { what: "a bytes limit alone: no timeout",
              mode: CheckpointMode::ExactlyOnce, unaligned: false, timeout: None, bytes: Some(4096),
              want: AlignedWithTimeout { timeout_ms: MAX, max_blocked_bytes: 4096 } },
        Row { what: "both limits",
              mode: CheckpointMode::ExactlyOnce, unaligned: false, timeout: Some(50), bytes: Some(4096),
              want: AlignedWithTimeout { timeout_ms: 50, max_blocked_bytes: 4096 } },
        Row { what: "unaligned from the start wins over limits that would switch later",
              mode: CheckpointMode::ExactlyOnce, unaligned: true, timeout: Some(50), bytes: Some(4096), want: Unaligned },
        Row { what: "at-least-once never blocks: nothing to unalign",
              mode: CheckpointMode::AtLeastOnce, unaligned: false, timeout: None, bytes: None, want: Aligned },
    ];
    for row in table {
        let cfg = CheckpointConfig {
            mode: row.mode,
            unaligned: row.unaligned,
            alignment_timeout_ms: row.timeout,
            max_aligned_bytes: row.bytes,
            ..Default::default()
        };
        assert_eq!(cfg.validate(), Ok(()), "{}", row.what);
        assert_eq!(cfg.alignment_for(SnapshotKind::Checkpoint), row.want, "{}", row.what);
        for kind in [SnapshotKind::Final, SnapshotKind::Savepoint, SnapshotKind::StopSavepoint] {
            assert_eq!(cfg.alignment_for(kind), Aligned, "{}: {kind:?} must align", row.what);
        }
    }
}
