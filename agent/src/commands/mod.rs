//! The subcommands. Each returns a [`CommandError`]; `main` prints it as one `error:` line (with
//! its causes) and, where there is one, a `hint:` line, and exits non-zero.

mod events;

use std::io::Write as _;

use crate::{
    app,
    config::{Command, Config, EventsArgs, LoggingConfig},
    kernel,
};

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Kernel(#[from] kernel::Error),
    #[error(transparent)]
    App(#[from] app::Error),
    #[error("writing events to stdout: {0}")]
    Output(#[source] std::io::Error),
}

impl CommandError {
    fn hint(&self) -> Option<String> {
        match self {
            CommandError::Kernel(e) => e.hint(),
            CommandError::App(e) => e.hint(),
            CommandError::Output(_) => None,
        }
    }
}

/// A command ready to run: `run`'s configuration loaded and validated.
pub enum Prepared {
    Run(Box<Config>),
    Events(EventsArgs),
}

impl Prepared {
    /// The configuration file's `logging` (telemetry starts from it).
    pub fn logging(&self) -> LoggingConfig {
        match self {
            Prepared::Run(config) => config.logging.clone(),
            Prepared::Events(_) => LoggingConfig::default(),
        }
    }
}

/// Loads `run`'s configuration (before telemetry starts, which it configures).
pub fn prepare(command: Command) -> Result<Prepared, CommandError> {
    match command {
        Command::Run(args) => Ok(Prepared::Run(Box::new(
            Config::load(&args).map_err(app::Error::Config)?,
        ))),
        Command::Events(args) => Ok(Prepared::Events(args)),
    }
}

pub async fn run(prepared: Prepared) -> Result<(), CommandError> {
    match prepared {
        Prepared::Run(config) => {
            config.warn_no_effect();
            tracing::info!(
                file = %config.file.as_deref().map_or("none".into(), |p| p.display().to_string()),
                "configuration loaded"
            );
            Ok(app::run(*config).await?)
        }
        Prepared::Events(args) => events::run(args).await,
    }
}

/// Prints an error for a person: the error and its causes on one line, then a hint.
pub fn report(error: &CommandError) {
    let mut line = format!("error: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{line}");
    if let Some(hint) = error.hint() {
        let _ = writeln!(stderr, "hint: {hint}");
    }
}
