//! The command line: `swiftlet` with its global flags and its commands, `run` (whose flags come
//! from the settings table, `settings.rs`) and `events`.
//!
//! Not here: the flags of `swiftlet run` (`settings.rs`) and of the kernel programs
//! (`kernel.rs`). Upstream: `cmd/kubelet/app/server.go` (`NewKubeletCommand`).

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};

use super::{kernel::KernelArgs, settings::RunArgs};

/// swiftlet: a Kubernetes node agent that learns what happens to containers from kernel events.
#[derive(Debug, Parser)]
#[command(name = "swiftlet", version, about, propagate_version = true)]
pub struct Args {
    /// Log filter, in `RUST_LOG` syntax (e.g. `info`, `swiftlet=debug`); RUST_LOG wins if set.
    /// Default: the configuration file's `logging.verbosity`, else `info`.
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Log line format on stderr. Default: the configuration file's `logging.format`, else text.
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once at start; boxing `RunArgs` would only add noise at every use"
)]
pub enum Command {
    /// Run the node agent: load the kernel programs and serve the API and metrics.
    Run(RunArgs),
    /// Print kernel events (exits, execs, OOM kills, cgroup changes) as they happen.
    Events(EventsArgs),
}

#[derive(Debug, ClapArgs)]
pub struct EventsArgs {
    #[command(flatten)]
    pub kernel: KernelArgs,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit after this many events.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn parses_events_flags() {
        let args = Args::try_parse_from([
            "swiftlet", "events", "--json", "--cgroup", "/a", "--cgroup", "b", "--count", "3",
        ])
        .expect("parses");
        let Command::Events(events) = args.command else {
            panic!("not events")
        };
        assert!(events.json);
        assert_eq!(events.count, Some(3));
        assert_eq!(
            events.kernel.cgroups,
            vec![PathBuf::from("/a"), PathBuf::from("b")]
        );
        assert_eq!(events.kernel.load_options().watch.len(), 2);
    }

    #[test]
    fn rejects_a_bad_address_naming_the_flag() {
        let err = Args::try_parse_from(["swiftlet", "run", "--http-address", "nope"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--http-address"), "{err}");
    }
}
