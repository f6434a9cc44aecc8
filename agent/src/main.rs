//! The `swiftlet` binary: parse arguments, start telemetry, run the command.

use std::process::ExitCode;

use clap::Parser as _;
use swiftlet::{commands, config::Args, telemetry};

fn main() -> ExitCode {
    let args = Args::parse();
    telemetry::init(&args.log_level, args.log_format);
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
    let result = runtime.block_on(commands::run(args.command));
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
