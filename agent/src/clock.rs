//! The wall clock as the agent's components take it: injected (STYLE rule 7), so that a test
//! pins the time it asserts against, and shared as one type by every component that reads it.

use std::{sync::Arc, time::SystemTime};

/// Where a component reads the wall-clock time.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The system's wall clock.
pub fn system() -> Clock {
    Arc::new(SystemTime::now)
}
