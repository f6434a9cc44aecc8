//! Command-line arguments. Each subcommand's flags are validated here or by the component they
//! configure, with errors that name the flag.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};

use crate::kernel::LoadOptions;

/// swiftlet: a Kubernetes node agent that learns what happens to containers from kernel events.
#[derive(Debug, Parser)]
#[command(name = "swiftlet", version, about, propagate_version = true)]
pub struct Args {
    /// Log filter, in `RUST_LOG` syntax (e.g. `info`, `swiftlet=debug`); RUST_LOG wins if set.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: load the kernel programs and serve the API and metrics.
    Run(RunArgs),
    /// Print kernel events (exits, execs, OOM kills, cgroup changes) as they happen.
    Events(EventsArgs),
}

/// Flags shared by every command that loads the kernel programs.
#[derive(Clone, Debug, ClapArgs)]
pub struct KernelArgs {
    /// Only events of this cgroup subtree (repeatable): a directory on the cgroup2 mount, or a
    /// path relative to it. Without any, the whole machine.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<PathBuf>,
    /// Size of the kernel's events ring buffer in bytes: a power-of-two multiple of the page size.
    #[arg(long, value_name = "BYTES", default_value_t = swiftlet_common::DEFAULT_RING_BYTES)]
    pub ring_buffer_bytes: u32,
}

impl KernelArgs {
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            ring_bytes: self.ring_buffer_bytes,
            watch: self.cgroups.clone(),
            ..LoadOptions::default()
        }
    }
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

#[derive(Debug, ClapArgs)]
pub struct RunArgs {
    #[command(flatten)]
    pub kernel: KernelArgs,
    /// Unix socket of swiftlet's gRPC API (swiftlet.v1).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/run/swiftlet/swiftlet.sock"
    )]
    pub grpc_socket: PathBuf,
    /// Address of the HTTP endpoints /healthz and /metrics.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:10248")]
    pub http_address: SocketAddr,
}

#[cfg(test)]
mod tests {
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
