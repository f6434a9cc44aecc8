//! The `swiftlet` binary: parse arguments, load `run`'s configuration, start telemetry, run the
//! command.

use std::process::ExitCode;

use clap::Parser as _;
use swiftlet::{
    commands,
    config::{Args, LoggingConfig},
    telemetry,
};

fn main() -> ExitCode {
    let args = Args::parse();
    // `run` reads its configuration before telemetry starts: the file's `logging` configures it.
    let prepared = commands::prepare(args.command);
    let file_logging = match &prepared {
        Ok(prepared) => prepared.logging(),
        Err(_) => LoggingConfig::default(),
    };
    telemetry::init(args.log_level.as_deref(), args.log_format, &file_logging);
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            commands::report(&error);
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(commands::run(prepared));
    // Blocking threads (a file watcher's read) must not hold the process up once the agent ends.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            commands::report(&error);
            ExitCode::FAILURE
        }
    }
}
