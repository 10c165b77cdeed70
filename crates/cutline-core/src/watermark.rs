//! Event time: the [`EventTime`] of records, the watermark messages that travel on data channels
//! beside records and barriers ([`WatermarkUpdate`]), and the per-task [`WatermarkTracker`] that
//! combines the watermarks of a task's inputs into its own.
//!
//! A watermark `t` on a channel says: no record with an event time at or below `t` follows on this
//! channel (later ones are *late*). A task's watermark is the minimum over its active inputs; an input
//! marked idle does not hold it back until it sends a watermark again; a source whose input is
//! exhausted sends [`EventTime::MAX`] (end-of-stream alone says nothing of event time: after a stop
//! with a savepoint the input resumes later). The tracker never lets a task's watermark go backwards, whatever its inputs
//! send, and its state is what a checkpoint records so that it does not go backwards across a restore
//! either.

use serde::{Deserialize, Serialize};

/// Milliseconds of event time (the time a record says it happened, usually since the Unix epoch; any
/// origin works as long as one job uses one). Signed, so that sources with times before their origin
/// and the "no watermark yet" value [`EventTime::MIN`] fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EventTime(pub i64);

impl EventTime {
    /// Before every event: the watermark of an input that has sent none.
    pub const MIN: EventTime = EventTime(i64::MIN);
    /// After every event: the watermark of an ended input; it fires every timer.
    pub const MAX: EventTime = EventTime(i64::MAX);

    /// `ms` milliseconds earlier, saturating at [`EventTime::MIN`].
    pub fn minus_ms(self, ms: u64) -> EventTime {
        EventTime(self.0.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX)))
    }
    /// `ms` milliseconds later, saturating at [`EventTime::MAX`].
    pub fn plus_ms(self, ms: u64) -> EventTime {
        EventTime(self.0.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
    }
}

impl std::fmt::Display for EventTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            EventTime::MIN => write!(f, "-inf"),
            EventTime::MAX => write!(f, "+inf"),
            EventTime(t) => write!(f, "{t}ms"),
        }
    }
}

/// What a watermark message on a data channel says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatermarkUpdate {
    /// No record at or below this time follows on the channel; also marks the channel active again.
    At(EventTime),
    /// The channel sends nothing for now (its source is idle): do not wait for it. The next `At`
    /// makes it active again.
    Idle,
}

/// One input's watermark as a task knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputWatermark {
    /// The highest watermark this input sent (never lowered).
    pub at: EventTime,
    /// The input said it is idle and sent no watermark since.
    pub idle: bool,
}

/// What a checkpoint records of a task's watermarks (see [`WatermarkTracker::image`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatermarkImage {
    /// Per input, in input order.
    pub inputs: Vec<InputWatermark>,
    /// The task's own watermark.
    pub current: EventTime,
    /// The task last told its outputs it is idle.
    pub idle: bool,
}

/// Combines the watermarks of a task's inputs: pure; messages go in, what to forward comes out.
#[derive(Clone, Debug)]
pub struct WatermarkTracker {
    inputs: Vec<InputWatermark>,
    current: EventTime,
    idle: bool,
}

impl WatermarkTracker {
    /// A task with `inputs` inputs that has seen no watermark.
    pub fn new(inputs: usize) -> WatermarkTracker {
        WatermarkTracker {
            inputs: vec![InputWatermark { at: EventTime::MIN, idle: false }; inputs],
            current: EventTime::MIN,
            idle: false,
        }
    }

    /// A tracker as a checkpoint recorded it, for a task with `inputs` inputs. With another number of
    /// inputs (the job was rescaled) every input starts at the recorded watermark: no input can then
    /// move the task's watermark back, and none is assumed ahead of where the task was.
    pub fn restored(image: WatermarkImage, inputs: usize) -> WatermarkTracker {
        if image.inputs.len() == inputs {
            return WatermarkTracker { inputs: image.inputs, current: image.current, idle: image.idle };
        }
        WatermarkTracker {
            inputs: vec![InputWatermark { at: image.current, idle: false }; inputs],
            current: image.current,
            idle: false,
        }
    }

    /// The task's watermark.
    pub fn current(&self) -> EventTime {
        self.current
    }

    /// Nothing was heard yet (a checkpoint need not record it).
    pub fn is_fresh(&self) -> bool {
        !self.idle && self.inputs.iter().all(|w| w.at == EventTime::MIN && !w.idle)
    }

    /// What a checkpoint records.
    pub fn image(&self) -> WatermarkImage {
        WatermarkImage { inputs: self.inputs.clone(), current: self.current, idle: self.idle }
    }

    /// Input `i` sent `update`. Returns what the task forwards, if anything: `At(t)` when its
    /// watermark advanced to `t` (or it becomes active again), `Idle` when every input is now idle.
    /// A watermark below what the input sent before changes nothing (it cannot move time back).
    pub fn on_update(&mut self, i: usize, update: WatermarkUpdate) -> Option<WatermarkUpdate> {
        let input = &mut self.inputs[i];
        match update {
            WatermarkUpdate::At(t) => {
                input.idle = false;
                input.at = input.at.max(t);
            }
            WatermarkUpdate::Idle => input.idle = true,
        }
        self.recompute()
    }

    fn recompute(&mut self) -> Option<WatermarkUpdate> {
        let active = self.inputs.iter().filter(|w| !w.idle).map(|w| w.at).min();
        match active {
            None => {
                // Every input is idle: tell downstream once, so it does not wait for this task.
                if self.idle {
                    None
                } else {
                    self.idle = true;
                    Some(WatermarkUpdate::Idle)
                }
            }
            Some(min) => {
                let was_idle = std::mem::replace(&mut self.idle, false);
                if min > self.current {
                    self.current = min;
                    Some(WatermarkUpdate::At(min))
                } else if was_idle {
                    Some(WatermarkUpdate::At(self.current))
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WatermarkUpdate::{At, Idle};
    use super::*;

    fn at(t: i64) -> WatermarkUpdate {
        At(EventTime(t))
    }

    #[test]
    fn the_watermark_is_the_minimum_of_the_inputs_and_never_goes_back() {
        let mut w = WatermarkTracker::new(2);
        assert_eq!(w.on_update(0, at(10)), None, "input 1 has sent nothing yet");
        assert_eq!(w.on_update(1, at(5)), Some(at(5)));
        assert_eq!(w.on_update(1, at(20)), Some(at(10)));
        assert_eq!(w.on_update(0, at(3)), None, "a lower watermark moves nothing back");
        assert_eq!(w.current(), EventTime(10));
        assert_eq!(w.on_update(0, at(15)), Some(at(15)));
        // Exhausted inputs end event time with MAX.
        assert_eq!(w.on_update(0, At(EventTime::MAX)), Some(at(20)));
        assert_eq!(w.on_update(1, At(EventTime::MAX)), Some(At(EventTime::MAX)));
    }

    #[test]
    fn idle_inputs_do_not_hold_time_back_until_they_speak_again() {
        let mut w = WatermarkTracker::new(3);
        w.on_update(0, at(100));
        w.on_update(1, at(50));
        assert_eq!(w.on_update(2, Idle), Some(at(50)));
        assert_eq!(w.on_update(1, Idle), Some(at(100)));
        assert_eq!(w.on_update(0, Idle), Some(Idle), "all idle: downstream need not wait");
        assert_eq!(w.on_update(0, Idle), None, "idleness is said once");
        assert_eq!(w.on_update(2, at(40)), Some(at(100)), "active again, and time does not go back");
        assert_eq!(w.on_update(2, at(120)), Some(at(120)));
    }

    #[test]
    fn a_restored_tracker_continues_where_the_checkpoint_was() {
        let mut w = WatermarkTracker::new(2);
        w.on_update(0, at(7));
        w.on_update(1, at(9));
        let image = w.image();
        let mut same = WatermarkTracker::restored(image.clone(), 2);
        assert_eq!(same.current(), EventTime(7));
        assert_eq!(same.on_update(0, at(8)), Some(at(8)), "input 1 is still known at 9");
        let mut rescaled = WatermarkTracker::restored(image, 3);
        assert_eq!(rescaled.current(), EventTime(7));
        assert_eq!(rescaled.on_update(0, at(1)), None);
        assert_eq!(rescaled.on_update(0, at(8)), None, "the other inputs are known only at 7");
    }
}
