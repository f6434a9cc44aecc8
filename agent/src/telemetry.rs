//! Logs and traces: `tracing` to stderr, text or JSON, filtered by `RUST_LOG`, else `--log-level`,
//! else the configuration file's `logging.verbosity` (mapped in `config/logging.rs`), else `info`;
//! the format from `--log-format`, else the file's `logging.format`, else text (upstream: flags
//! over the file). Each line is written unbuffered. `log` records (aya, and the eBPF programs'
//! aya-log output) are bridged into `tracing`.

use tracing_subscriber::{EnvFilter, fmt};

use crate::config::{LogFormat, LoggingConfig};

/// Installs the global subscriber from the flags (`None` when not given) and the file's
/// `logging`. An invalid filter falls back to `info` and says so.
pub fn init(flag_level: Option<&str>, flag_format: Option<LogFormat>, file: &LoggingConfig) {
    let level = flag_level.or(file.level()).unwrap_or("info");
    let format = flag_format.or(file.format).unwrap_or(LogFormat::Text);
    let (filter, bad) = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => match EnvFilter::try_new(&env) {
            Ok(filter) => (filter, None),
            Err(e) => (
                EnvFilter::new("info"),
                Some(format!("RUST_LOG={env:?}: {e}")),
            ),
        },
        _ => match EnvFilter::try_new(level) {
            Ok(filter) => (filter, None),
            Err(e) => (
                EnvFilter::new("info"),
                Some(format!("--log-level {level:?}: {e}")),
            ),
        },
    };
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(true);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if installed.is_err() {
        // A subscriber is already installed (tests); keep it.
        return;
    }
    if let Some(bad) = bad {
        tracing::warn!("ignoring invalid log filter {bad}; using info");
    }
}
