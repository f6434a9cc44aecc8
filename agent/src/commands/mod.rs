//! The subcommands. Each returns a [`CommandError`]; `main` prints it as one `error:` line (with
//! its causes) and, where there is one, a `hint:` line, and exits non-zero.

mod events;

use std::io::Write as _;

use crate::{app, config::Command, kernel};

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

pub async fn run(command: Command) -> Result<(), CommandError> {
    match command {
        Command::Run(args) => Ok(app::run(args).await?),
        Command::Events(args) => events::run(args).await,
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
