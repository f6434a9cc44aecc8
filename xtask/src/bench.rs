//! Benchmarks. Each builds in release mode and runs its driver as root; results (table on stdout,
//! JSON and a plot) go to `target/bench/`.

use std::path::PathBuf;

use clap::Subcommand;

use crate::{sh, tasks};

#[derive(Subcommand)]
pub enum Which {
    /// Kernel-to-userspace latency of exit events, and the spawn-storm rate and losses.
    Events {
        /// Where to write the JSON results (default target/bench/events.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Exits to measure in the paced scenario (at least 10,000 for the README's numbers).
        #[arg(long, default_value_t = 20_000)]
        exits: u64,
    },
}

pub fn run(which: Which) -> anyhow::Result<()> {
    tasks::build(true)?;
    let out_dir = sh::root().join("target").join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let driver = sh::root()
        .join("target")
        .join("release")
        .join("swiftlet-bench");
    match which {
        Which::Events { json, exits } => {
            let json = json.unwrap_or_else(|| out_dir.join("events.json"));
            let args = vec![
                "events".to_owned(),
                "--exits".to_owned(),
                exits.to_string(),
                "--json".to_owned(),
                json.display().to_string(),
                "--out-dir".to_owned(),
                out_dir.display().to_string(),
            ];
            tasks::exec_as_root(&driver, &args)
        }
    }
}
