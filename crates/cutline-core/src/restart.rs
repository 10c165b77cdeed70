//! Recovery decisions: whether and when to restart after a failure, and which checkpoint to restore.
//!
//! Pure: the runtime reports failures with the current time and the verification result of each
//! candidate checkpoint; this module answers. It does not read storage or sleep.

use crate::ids::{CheckpointId, TimeMs};

/// How the job is restarted after a failover. Defaults: exponential backoff from 100 ms doubling up to
/// 10 s, at most 10 restarts; the count resets when a failure comes 60 s or more after the previous
/// one. Check the values with [`RestartStrategy::validate`] before use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestartStrategy {
    /// Never restart: the first failure fails the job.
    None,
    /// Wait `delay_ms` before each restart; give up at the failure after the `max_attempts`-th
    /// restart. The count never resets: the failures need not be consecutive.
    FixedDelay {
        /// Milliseconds to wait before each restart.
        delay_ms: u64,
        /// Restarts allowed in all; 0 gives up at the first failure.
        max_attempts: u32,
    },
    /// Wait `initial_ms`, then twice as long each time up to `max_ms`; give up at the failure after
    /// the `max_attempts`-th restart.
    ExponentialBackoff {
        /// Milliseconds to wait before the first restart.
        initial_ms: u64,
        /// The longest wait in milliseconds; at least `initial_ms`.
        max_ms: u64,
        /// Restarts allowed before the count resets; 0 gives up at the first failure.
        max_attempts: u32,
        /// A failure at least this many milliseconds after the previous one resets the count (and the
        /// wait) to the first restart's.
        reset_after_ms: u64,
    },
    /// Wait `delay_ms` before each restart; give up when more than `max_failures` failures fall within
    /// any window of `interval_ms` (a failure that repeats quickly gives up quickly, while rare failures
    /// over a long run are restarted forever). `max_failures` is at most [`MAX_FAILURE_RATE_FAILURES`].
    FailureRate {
        /// Failures tolerated within one window; 0 gives up at the first failure.
        max_failures: u32,
        /// The window in milliseconds: a failure counts while it is less than this old. Above 0.
        interval_ms: u64,
        /// Milliseconds to wait before each restart.
        delay_ms: u64,
    },
}

/// The largest `max_failures` of [`RestartStrategy::FailureRate`]: the tracker remembers that many
/// failure times.
pub const MAX_FAILURE_RATE_FAILURES: u32 = 1_000;

impl RestartStrategy {
    /// Check the strategy's values: zero or out-of-range values are refused with the reason.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            RestartStrategy::FailureRate { max_failures, interval_ms, .. } => {
                if max_failures > MAX_FAILURE_RATE_FAILURES {
                    return Err(format!(
                        "failure-rate restart strategy: max_failures {max_failures} is above {MAX_FAILURE_RATE_FAILURES}"
                    ));
                }
                if interval_ms == 0 {
                    return Err("failure-rate restart strategy: interval_ms must be above 0".into());
                }
                Ok(())
            }
            RestartStrategy::ExponentialBackoff { initial_ms, max_ms, .. } if max_ms < initial_ms => {
                Err(format!("exponential-backoff restart strategy: max_ms {max_ms} is below initial_ms {initial_ms}"))
            }
            _ => Ok(()),
        }
    }
}

impl Default for RestartStrategy {
    fn default() -> Self {
        RestartStrategy::ExponentialBackoff {
            initial_ms: 100,
            max_ms: 10_000,
            max_attempts: 10,
            reset_after_ms: 60_000,
        }
    }
}

/// The answer to a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestartDecision {
    /// Restart after `delay_ms`.
    RestartAfter {
        /// Milliseconds to wait before the restart.
        delay_ms: u64,
        /// The number of this restart, from 1 (since the last reset of the count).
        attempt: u32,
    },
    /// Do not restart: the job fails.
    GiveUp {
        /// The restarts granted before (since the last reset of the count).
        attempts: u32,
    },
}

/// Counts failures under a [`RestartStrategy`] and decides each restart. It knows only failure times:
/// there is no "success" event, so only [`RestartStrategy::ExponentialBackoff`] (after
/// `reset_after_ms` without failure) and [`RestartStrategy::FailureRate`] (its window) forget old
/// failures.
#[derive(Clone, Debug)]
pub struct RestartTracker {
    strategy: RestartStrategy,
    attempts: u32,
    last_restart_at: Option<TimeMs>,
    /// `FailureRate` only: the times of the latest failures, at most `max_failures + 1`.
    recent: std::collections::VecDeque<TimeMs>,
}

impl RestartTracker {
    /// A tracker that has seen no failure. `strategy` is taken as is: check it with
    /// [`RestartStrategy::validate`] first.
    pub fn new(strategy: RestartStrategy) -> RestartTracker {
        RestartTracker { strategy, attempts: 0, last_restart_at: None, recent: Default::default() }
    }

    /// Failures seen (each one granted or refused a restart) since the count last reset.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// A failure happened at `now`.
    pub fn on_failure(&mut self, now: TimeMs) -> RestartDecision {
        if let (RestartStrategy::ExponentialBackoff { reset_after_ms, .. }, Some(at)) =
            (&self.strategy, self.last_restart_at)
        {
            if now.saturating_sub(at) >= *reset_after_ms {
                self.attempts = 0;
            }
        }
        self.attempts = self.attempts.saturating_add(1);
        self.last_restart_at = Some(now);
        let attempt = self.attempts;
        match self.strategy {
            RestartStrategy::None => RestartDecision::GiveUp { attempts: attempt - 1 },
            RestartStrategy::FixedDelay { delay_ms, max_attempts } => {
                if attempt > max_attempts {
                    RestartDecision::GiveUp { attempts: attempt - 1 }
                } else {
                    RestartDecision::RestartAfter { delay_ms, attempt }
                }
            }
            RestartStrategy::ExponentialBackoff { initial_ms, max_ms, max_attempts, .. } => {
                if attempt > max_attempts {
                    return RestartDecision::GiveUp { attempts: attempt - 1 };
                }
                let shift = (attempt - 1).min(40);
                let delay_ms = initial_ms.saturating_mul(1u64 << shift).min(max_ms);
                RestartDecision::RestartAfter { delay_ms, attempt }
            }
            RestartStrategy::FailureRate { max_failures, interval_ms, delay_ms } => {
                self.recent.push_back(now);
                while self.recent.front().is_some_and(|t| now.saturating_sub(*t) >= interval_ms) {
                    self.recent.pop_front();
                }
                let keep = (max_failures.min(MAX_FAILURE_RATE_FAILURES) as usize) + 1;
                while self.recent.len() > keep {
                    self.recent.pop_front();
                }
                if self.recent.len() > max_failures as usize {
                    RestartDecision::GiveUp { attempts: attempt - 1 }
                } else {
                    RestartDecision::RestartAfter { delay_ms, attempt }
                }
            }
        }
    }
}

/// One complete checkpoint found in storage, and whether every file of it verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// `Err(reason)` when a checksum, size or decode check failed.
    pub verified: Result<(), String>,
}

/// Which checkpoint to restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreChoice {
    /// `None`: start from scratch (no complete checkpoint verified).
    pub checkpoint: Option<CheckpointId>,
    /// Newer complete checkpoints that failed verification and were skipped, with the reason: each is
    /// a warning the operator must see.
    pub skipped: Vec<(CheckpointId, String)>,
}

/// Choose the latest complete checkpoint that verifies, skipping (and reporting) newer broken ones.
pub fn choose_restore(mut candidates: Vec<Candidate>) -> RestoreChoice {
    candidates.sort_by_key(|c| std::cmp::Reverse(c.checkpoint));
    let mut skipped = Vec::new();
    for c in candidates {
        match c.verified {
            Ok(()) => return RestoreChoice { checkpoint: Some(c.checkpoint), skipped },
            Err(reason) => skipped.push((c.checkpoint, reason)),
        }
    }
    RestoreChoice { checkpoint: None, skipped }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_backoff_doubles_caps_and_gives_up() {
        let mut t = RestartTracker::new(RestartStrategy::ExponentialBackoff {
            initial_ms: 100,
            max_ms: 350,
            max_attempts: 4,
            reset_after_ms: 1_000_000,
        });
        let delays: Vec<_> = (0..5).map(|i| t.on_failure(TimeMs(i))).collect();
        assert_eq!(
            delays,
            vec![
                RestartDecision::RestartAfter { delay_ms: 100, attempt: 1 },
                RestartDecision::RestartAfter { delay_ms: 200, attempt: 2 },
                RestartDecision::RestartAfter { delay_ms: 350, attempt: 3 },
                RestartDecision::RestartAfter { delay_ms: 350, attempt: 4 },
                RestartDecision::GiveUp { attempts: 4 },
            ]
        );
    }

    #[test]
    fn backoff_resets_after_a_stable_run() {
        let mut t = RestartTracker::new(RestartStrategy::ExponentialBackoff {
            initial_ms: 10,
            max_ms: 1000,
            max_attempts: 2,
            reset_after_ms: 500,
        });
        t.on_failure(TimeMs(0));
        t.on_failure(TimeMs(100));
        assert_eq!(t.on_failure(TimeMs(10_000)), RestartDecision::RestartAfter { delay_ms: 10, attempt: 1 });
    }

    #[test]
    fn fixed_delay_and_none() {
        let mut t = RestartTracker::new(RestartStrategy::FixedDelay { delay_ms: 7, max_attempts: 1 });
        assert_eq!(t.on_failure(TimeMs(0)), RestartDecision::RestartAfter { delay_ms: 7, attempt: 1 });
        assert_eq!(t.on_failure(TimeMs(1)), RestartDecision::GiveUp { attempts: 1 });
        let mut n = RestartTracker::new(RestartStrategy::None);
        assert_eq!(n.on_failure(TimeMs(0)), RestartDecision::GiveUp { attempts: 0 });
    }

    #[test]
    fn failure_rate_gives_up_only_when_failures_crowd_into_the_interval() {
        let mut t =
            RestartTracker::new(RestartStrategy::FailureRate { max_failures: 2, interval_ms: 1_000, delay_ms: 5 });
        // Rare failures: never more than 2 within any second, restarted forever.
        for i in 0..20u64 {
            assert!(
                matches!(t.on_failure(TimeMs(i * 600)), RestartDecision::RestartAfter { delay_ms: 5, .. }),
                "failure {i}"
            );
        }
        // Three within one second: the third gives up.
        let mut t =
            RestartTracker::new(RestartStrategy::FailureRate { max_failures: 2, interval_ms: 1_000, delay_ms: 5 });
        assert!(matches!(t.on_failure(TimeMs(10_000)), RestartDecision::RestartAfter { .. }));
        assert!(matches!(t.on_failure(TimeMs(10_500)), RestartDecision::RestartAfter { .. }));
        assert_eq!(t.on_failure(TimeMs(10_999)), RestartDecision::GiveUp { attempts: 2 });
    }

    #[test]
    fn strategies_with_impossible_values_are_refused() {
        let too_many =
            RestartStrategy::FailureRate { max_failures: MAX_FAILURE_RATE_FAILURES + 1, interval_ms: 1, delay_ms: 0 };
        assert!(too_many.validate().unwrap_err().contains("max_failures"));
        let no_window = RestartStrategy::FailureRate { max_failures: 1, interval_ms: 0, delay_ms: 0 };
        assert!(no_window.validate().is_err());
        assert!(RestartStrategy::default().validate().is_ok());
    }

    #[test]
    fn restore_skips_newer_broken_checkpoints_with_a_warning() {
        let choice = choose_restore(vec![
            Candidate { checkpoint: CheckpointId(3), verified: Ok(()) },
            Candidate { checkpoint: CheckpointId(5), verified: Err("checksum".into()) },
            Candidate { checkpoint: CheckpointId(4), verified: Ok(()) },
        ]);
        assert_eq!(choice.checkpoint, Some(CheckpointId(4)));
        assert_eq!(choice.skipped, vec![(CheckpointId(5), "checksum".to_string())]);
        assert_eq!(choose_restore(vec![]).checkpoint, None);
    }
}
