//! The configuration file (`--config`): its bytes parsed as the KubeletConfiguration-style YAML
//! (`swiftlet::config::FileConfig::parse`), its relative paths resolved, then merged with the
//! default flags and validated into a `Config` (`Config::resolve`), exactly as `Config::load`
//! does after reading the file. A rejection is fine and its message is rendered; a panic is a
//! finding.
#![no_main]

use std::{path::Path, sync::OnceLock};

use clap::Parser as _;
use libfuzzer_sys::fuzz_target;
use swiftlet::config::{Args, Command, Config, ConfigError, FileConfig, Origin, RunArgs};

fn run_args() -> &'static RunArgs {
    static ARGS: OnceLock<RunArgs> = OnceLock::new();
    ARGS.get_or_init(|| match Args::try_parse_from(["swiftlet", "run"]) {
        Ok(Args {
            command: Command::Run(run),
            ..
        }) => run,
        _ => panic!("`swiftlet run` parses"),
    })
}

fn hostname() -> Result<String, ConfigError> {
    Ok("node-1".to_owned())
}

fuzz_target!(|data: &[u8]| {
    // The loader reads the file as UTF-8 text; anything else is refused before parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/swiftlet/config.yaml");
    let mut file = match FileConfig::parse(path, text) {
        Ok(file) => file,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    file.resolve_relative_paths(Path::new("/etc/swiftlet"));
    match Config::resolve(&file, Origin::File(path.to_owned()), run_args(), &hostname) {
        Ok(config) => assert_eq!(config.file.as_deref(), Some(path)),
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
