//! The daemon's messages, through `tracing`: what an embedder's subscriber receives, and the
//! command line's own subscriber, which prints them to stderr as `uffd-daemon: [LEVEL: ]text`.
//!
//! Levels: `error` (a process stopped rather than handed wrong bytes), `warn` (memory left
//! unmanaged, a refused client, a degraded setting), `info` (what a user should know: a core
//! dump's pages brought back, a tracer's hold), `debug` (each decision: processes adopted,
//! bound, retired; the final counters).

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The environment variable that sets the filter (`tracing_subscriber`'s `EnvFilter` syntax,
/// e.g. `debug` or `uffd_daemon::fault=debug,info`); it overrides the verbosity flags.
pub const LOG_ENV: &str = "UFFD_DAEMON_LOG";

/// The level for a verbosity: 0 is `info`, each `-v` one more (`debug`, `trace`), each `-q`
/// one less (`warn`, `error`).
pub fn level_for(verbosity: i32) -> Level {
    match verbosity {
        i32::MIN..=-2 => Level::ERROR,
        -1 => Level::WARN,
        0 => Level::INFO,
        1 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// Installs the command line's subscriber: messages to stderr, filtered by [`LOG_ENV`] if set,
/// else by `verbosity` (see [`level_for`]). An invalid filter in the environment is said and
/// the flags' level used. Does nothing if a subscriber is set already.
pub fn init(verbosity: i32) {
    let level = level_for(verbosity);
    let filter = match std::env::var(LOG_ENV) {
        Ok(v) if !v.trim().is_empty() => {
            match EnvFilter::try_new(&v) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("uffd-daemon: warning: {LOG_ENV}={v:?} is not a filter ({e}); using {level}");
                    EnvFilter::new(level.as_str())
                }
            }
        }
        _ => EnvFilter::new(level.as_str()),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(Plain)
        .try_init();
}

/// `uffd-daemon: text` for `info`, `uffd-daemon: warning: text` and so on for the others: one
/// line a message, as the daemon's messages always read.
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            Level::INFO => "",
            Level::DEBUG => "debug: ",
            Level::TRACE => "trace: ",
        };
        write!(w, "uffd-daemon: {level}")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_to_levels() {
        assert_eq!(level_for(-5), Level::ERROR);
        assert_eq!(level_for(-1), Level::WARN);
        assert_eq!(level_for(0), Level::INFO);
        assert_eq!(level_for(1), Level::DEBUG);
        assert_eq!(level_for(3), Level::TRACE);
    }
}
