//! Bursts of a watched directory's inotify events: an editor's save, a rename over a file or
//! a `..data` symlink swap arrive as several events in a row, and whoever watches a directory
//! (the static pod manifests, the kubelet server's certificates) wants to act once per burst,
//! not per event. A burst ends after a quiet window, or after a cap so that a directory
//! written to without pause is still acted on.

use std::{ffi::OsString, io, time::Duration};

use inotify::{Event, EventStream};
use tokio::time::Instant;
use tokio_stream::StreamExt as _;

/// How a burst ended: quiet (or capped), or with the event stream broken — an error reading it
/// or its end, after which the watch is lost and must be made again.
#[derive(Debug)]
pub enum BurstEnd {
    Quiet,
    Broken(Option<io::Error>),
}

/// Waits for an event on `stream`, then takes the rest of its burst: until `quiet` passes
/// without one, or `cap` after the first. Each event goes to `on_event` as it comes.
pub async fn next_burst(
    stream: &mut EventStream<Vec<u8>>,
    quiet: Duration,
    cap: Duration,
    mut on_event: impl FnMut(Event<OsString>),
) -> BurstEnd {
    let next = stream.next().await;
    let deadline = Instant::now() + cap;
    let mut next = next;
    loop {
        match next {
            Some(Ok(event)) => on_event(event),
            Some(Err(error)) => return BurstEnd::Broken(Some(error)),
            None => return BurstEnd::Broken(None),
        }
        let until = (Instant::now() + quiet).min(deadline);
        next = match tokio::time::timeout_at(until, stream.next()).await {
            Ok(next) => next,
            Err(_quiet) => return BurstEnd::Quiet,
        };
    }
}
