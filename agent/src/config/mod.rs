//! Configuration: the command line (`cli.rs`, `kernel.rs`), and the validated [`Config`] that
//! `swiftlet run` builds from its flags and its KubeletConfiguration-style file. Every setting is
//! defined once, in the settings table (`settings.rs`): its flag, its file key, its rule and its
//! default; the flags ([`RunArgs`]), the file form ([`FileConfig`]) and the resolved values are
//! generated from it, and `load.rs` assembles them into [`Config`]. Each error names the flag or
//! field and the bad value.
//!
//! Modules depend one way: the leaves (`error.rs`, `duration.rs`, `types.rs`, `defaults.rs`,
//! `file.rs`, `kernel.rs`, `no_effect.rs`, `logging.rs`, then the rules `input.rs`, `rules.rs` and `registration.rs`), then the table
//! (`settings.rs`), then the sections that check several settings together (`server.rs`,
//! `eviction.rs`, `reserved.rs`, `cpumanager.rs`, `cfs.rs`, `housekeeping.rs`, `image_pulls.rs`, `security.rs`, `shutdown.rs`,
//! `feature_gates.rs`), then loading (`zero.rs`, `load.rs`) and the command line (`cli.rs`). This file only declares and re-exports.
//!
//! Not here: what the components do with their settings. Upstream: `cmd/kubelet/app/options` and
//! `pkg/kubelet/apis/config`.

mod cfs;
mod cli;
pub mod configz;
mod cpumanager;
pub mod defaults;
mod duration;
mod error;
mod eviction;
mod feature_gates;
mod file;
mod housekeeping;
mod image_pulls;
mod input;
mod kernel;
mod load;
mod logging;
mod no_effect;
mod qos_reserved;
mod registration;
mod reserved;
mod rules;
mod security;
mod server;
mod settings;
mod shutdown;
mod types;
mod zero;

pub use cli::{Args, Command, EventsArgs, LogFormat};
pub use cpumanager::CpuManagerConfig;
pub use defaults::{GRPC_SOCKET as DEFAULT_GRPC_SOCKET, HTTP_ADDRESS as DEFAULT_HTTP_ADDRESS};
pub use duration::{DurationError, DurationErrorReason, GoDuration};
pub use error::{ConfigError, Origin};
pub use feature_gates::FeatureGates;
pub use housekeeping::{GcConfig, LogsConfig};
pub use kernel::KernelArgs;
pub use load::Config;
pub use logging::{LoggingConfig, verbosity_level};
pub use no_effect::NoEffect;
pub use registration::FileTaint;
pub use reserved::{Reserved, ReservedCgroup, ReservedResources};
pub use security::SecurityConfig;
pub use server::{Authentication, Authorization, AuthorizationMode, ServerConfig};
pub use settings::{FileConfig, RunArgs};
pub use shutdown::FileShutdownGrace;
pub use types::{
    CgroupDriver, ChangeDetectionStrategy, Cidr, CpuApply, CpuManagerPolicy, PlegMode, TlsVersion,
};
