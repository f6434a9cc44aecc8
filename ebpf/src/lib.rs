//! Empty on purpose: the agent lists this crate as a build-dependency so that cargo rebuilds it
//! when the programs (the `swiftlet` binary target, `src/main.rs`) change.
#![no_std]
