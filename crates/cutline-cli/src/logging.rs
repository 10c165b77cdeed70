//! The command's log output: a `tracing` subscriber for the engine's structured events.
//!
//! - Human (default): one line per event on stderr, `cutline: <message>`, warnings and errors marked.
//!   Warnings and errors always; informational events (every checkpoint, restore, restart) with `-v`.
//! - JSON (`CUTLINE_LOG_FORMAT=json`): one JSON object per event with every field (`event`, `chk`,
//!   `gen`, `worker`, ...), for scripts and the integration tests, which assert on fields rather than
//!   on wording. Processes a command starts (the workers of `cutline cluster`) inherit the variable.
//!
//! `CUTLINE_LOG=error|warn|info|debug|trace` overrides the level.

use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable that selects the format (`human` or `json`).
pub const FORMAT_VAR: &str = "CUTLINE_LOG_FORMAT";
/// The environment variable that overrides the level.
pub const LEVEL_VAR: &str = "CUTLINE_LOG";

/// Install the subscriber for this process. `verbose` shows informational events.
pub fn init(verbose: bool) {
    let level = std::env::var(LEVEL_VAR).ok().and_then(|l| l.parse::<Level>().ok()).unwrap_or(if verbose {
        Level::INFO
    } else {
        Level::WARN
    });
    let json = std::env::var(FORMAT_VAR).is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(level);
    // A second init (tests of the binary's functions) keeps the first subscriber.
    let _ = if json {
        builder.json().with_current_span(true).with_span_list(true).try_init()
    } else {
        builder.event_format(Human).try_init()
    };
}

/// `cutline: <message>`, with `WARNING:` or `ERROR:` in front of warnings and errors.
struct Human;

impl<S, N> FormatEvent<S, N> for Human
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mark = match *event.metadata().level() {
            Level::ERROR => "ERROR: ",
            Level::WARN => "WARNING: ",
            _ => "",
        };
        let mut message = MessageOnly(String::new());
        event.record(&mut message);
        writeln!(w, "cutline: {mark}{}", message.0)
    }
}

/// Keeps the `message` field of an event (the other fields are for machines).
struct MessageOnly(String);

impl tracing::field::Visit for MessageOnly {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_string();
        }
    }
}
