//! Building blocks of `swiftlet-bench` (`src/bin/swiftlet-bench.rs`): scenarios run against the
//! real kernel, the statistics taken from them, and how they are reported (Markdown, JSON, SVG).
//! They live in the library so that the arithmetic is unit-tested without root.

pub mod cluster;
pub mod cpumanager;
pub mod driver;
pub mod events;
pub mod eviction;
pub mod harness;
pub mod machine;
pub mod pleg;
pub mod plot;
pub mod report;
pub mod startup;
pub mod stats;
