//! systemd's service notification protocol (sd_notify(3)): the agent tells its service manager
//! when it is ready (`READY=1`, once the runtime, the PLEG and the servers are up), what it is
//! doing (`STATUS=`), that it is alive (`WATCHDOG=1`) and that it is stopping (`STOPPING=1`).
//! Owns the notification socket and the watchdog's decision; not what "healthy" means (the
//! caller passes the same check `/healthz` answers with, and the conditions that only show in
//! the status line, such as a container runtime outage) nor when the agent is ready (the
//! composition root decides). Without `NOTIFY_SOCKET` (not started by systemd, or by a unit that
//! is not `Type=notify`) every call is a no-op.
//!
//! Upstream: the kubelet sends `READY=1` through go-systemd's `daemon.SdNotify` once its server
//! starts (`cmd/kubelet/app/server.go`), and pets the watchdog at half of `WATCHDOG_USEC`, only
//! while its `/healthz` checks pass (`pkg/kubelet/watchdog/watchdog_linux.go`,
//! `healthChecker.Start`). The protocol is written here rather than taken from the `sd-notify`
//! crate: it is one datagram per message on a socket named by the environment, and taking the
//! socket as a value (not from the process environment at each call) is what lets the tests give
//! it a socket of their own.

use std::{
    os::unix::net::{SocketAddr, UnixDatagram},
    time::Duration,
};

use tokio_util::sync::CancellationToken;

/// The most a `STATUS=` line carries: a health problem may be long (and comes partly from the
/// runtime's and the kernel's error text), and systemd keeps the line in memory.
const STATUS_MAX: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET {socket:?}: {source}")]
    Address {
        socket: String,
        #[source]
        source: std::io::Error,
    },
    #[error("NOTIFY_SOCKET {socket:?}: not a unix socket path or abstract name")]
    Unsupported { socket: String },
    #[error("notifying the service manager: {0}")]
    Send(#[source] std::io::Error),
}

/// One notification, as sd_notify(3) spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Ready,
    Stopping,
    Watchdog,
    Status(String),
}

impl State {
    fn line(&self) -> String {
        match self {
            State::Ready => "READY=1".to_owned(),
            State::Stopping => "STOPPING=1".to_owned(),
            State::Watchdog => "WATCHDOG=1".to_owned(),
            // One line per assignment: a newline in the text would start another assignment.
            State::Status(text) => {
                let mut line: String = text
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                if line.len() > STATUS_MAX {
                    let mut end = STATUS_MAX;
                    while !line.is_char_boundary(end) {
                        end -= 1;
                    }
                    line.truncate(end);
                }
                format!("STATUS={line}")
            }
        }
    }
}

/// The service manager's notification socket, if there is one.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    target: Option<std::sync::Arc<SocketAddr>>,
}

impl Notifier {
    /// From `NOTIFY_SOCKET`: unset or empty is no service manager (a no-op notifier).
    pub fn from_env() -> Result<Self, NotifyError> {
        match std::env::var("NOTIFY_SOCKET") {
            Ok(socket) if !socket.is_empty() => Self::to(&socket),
            _ => Ok(Self::default()),
        }
    }

    /// A socket path, or an abstract name written `@name` (as systemd sets it).
    pub fn to(socket: &str) -> Result<Self, NotifyError> {
        let address = if let Some(name) = socket.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt as _;
            SocketAddr::from_abstract_name(name.as_bytes())
        } else if socket.starts_with('/') {
            SocketAddr::from_pathname(socket)
        } else {
            return Err(NotifyError::Unsupported {
                socket: socket.to_owned(),
            });
        }
        .map_err(|source| NotifyError::Address {
            socket: socket.to_owned(),
            source,
        })?;
        Ok(Self {
            target: Some(std::sync::Arc::new(address)),
        })
    }

    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `states` as one message (systemd applies them together).
    pub fn send(&self, states: &[State]) -> Result<(), NotifyError> {
        let Some(target) = &self.target else {
            return Ok(());
        };
        let message: Vec<String> = states.iter().map(State::line).collect();
        let socket = UnixDatagram::unbound().map_err(NotifyError::Send)?;
        socket
            .send_to_addr((message.join("\n") + "\n").as_bytes(), target)
            .map_err(NotifyError::Send)?;
        Ok(())
    }

    /// [`Notifier::send`], a failure logged: the agent goes on without its service manager
    /// hearing (systemd then acts on its own timeouts).
    pub fn tell(&self, states: &[State]) {
        if let Err(e) = self.send(states) {
            tracing::warn!(error = %e, "cannot notify the service manager");
        }
    }
}

/// How often to pet the watchdog: half of `WATCHDOG_USEC` (as go-systemd's `SdWatchdogEnabled`
/// and the kubelet do), when the watchdog is meant for this process (`WATCHDOG_PID` unset or
/// ours). `None`: no watchdog. A value that is not a positive number of microseconds is none.
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(own_pid)
    {
        return None;
    }
    let usec = usec?.trim().parse::<u64>().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(usec) / 2)
}

/// [`watchdog_interval`] from this process's environment.
pub fn watchdog_interval_from_env() -> Option<Duration> {
    watchdog_interval(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

/// How often the agent's status line is brought up to date when the watchdog asks for nothing
/// more often: a runtime outage shows in `systemctl status` within this.
pub const STATUS_PERIOD: Duration = Duration::from_secs(2);

/// The status line for the agent's health: a `problem` (what fails `/healthz`) first, else a
/// `condition` (what the agent reports without failing, e.g. the node not ready while the runtime
/// is down), else `running`.
pub fn status_text(problem: Option<&str>, condition: Option<&str>) -> String {
    match (problem, condition) {
        (Some(problem), _) => format!("unhealthy: {problem}"),
        (None, Some(condition)) => format!("running; {}", condition.replace('\n', "; ")),
        (None, None) => "running".to_owned(),
    }
}

/// What one tick sends, given the status line last sent: `STATUS=` when the line changed, and
/// `WATCHDOG=1` when `pet` (the unit has a watchdog) and nothing fails. A condition does not stop
/// the petting: systemd restarts an agent that hangs or is broken, not one whose container runtime
/// is away (see [`watchdog`]).
pub fn tick(problem: Option<&str>, condition: Option<&str>, pet: bool, last: &str) -> Vec<State> {
    let text = status_text(problem, condition);
    let mut states = Vec::new();
    if text != last {
        states.push(State::Status(text));
    }
    if pet && problem.is_none() {
        states.push(State::Watchdog);
    }
    states
}

/// Keeps the service manager told until `shutdown`: every `period`, the status line when it
/// changed, and, with `pet`, the watchdog while `health` says nothing is wrong.
///
/// What withholds the watchdog is the agent's own failure (`/healthz`: a kernel event stream that
/// ended, a PLEG that stopped relisting), never a container runtime outage alone. The kubelet's
/// `/healthz` does not check the runtime either (its checks are ping, log and the sync loop); the
/// runtime's state goes to the node's Ready condition instead, as here (`conditions`, shown in the
/// status line). A restart would not bring the runtime back, would make the agent start without
/// one (it refuses to: it needs the runtime's version and cgroup driver) and churn every
/// `RestartSec` until the runtime returns, and would throw away what the running agent knows (the
/// PLEG's kernel events of containers that exited meanwhile, probe states, back-offs). Running
/// on, the agent reconnects by itself and catches up with one relist.
pub async fn watchdog(
    notifier: Notifier,
    period: Duration,
    pet: bool,
    health: impl Fn() -> Option<String> + Send + 'static,
    conditions: impl Fn() -> Option<String> + Send + 'static,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = status_text(None, None);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let problem = health();
        let condition = conditions();
        let states = tick(problem.as_deref(), condition.as_deref(), pet, &last);
        for state in &states {
            if let State::Status(text) = state {
                match (&problem, pet) {
                    (Some(problem), true) => tracing::error!(
                        problem,
                        "not petting the systemd watchdog while the agent is unhealthy"
                    ),
                    _ => tracing::info!(status = text, "service status"),
                }
                last.clone_from(text);
            }
        }
        if !states.is_empty() {
            notifier.tell(&states);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_manager() -> (tempfile::TempDir, UnixDatagram, Notifier) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).expect("bind");
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let notifier = Notifier::to(path.to_str().expect("utf-8")).expect("notifier");
        (dir, socket, notifier)
    }

    fn receive(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).expect("a message");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn messages_are_one_datagram_of_assignments() {
        let (_dir, socket, notifier) = fake_manager();
        notifier
            .send(&[
                State::Status("running\nREADY=1 forged".to_owned()),
                State::Ready,
            ])
            .expect("send");
        assert_eq!(receive(&socket), "STATUS=running READY=1 forged\nREADY=1\n");
        notifier.send(&[State::Stopping]).expect("send");
        assert_eq!(receive(&socket), "STOPPING=1\n");
    }

    #[test]
    fn a_long_status_is_cut_on_a_character_boundary() {
        let line = State::Status("é".repeat(STATUS_MAX)).line();
        assert_eq!(line.len(), "STATUS=".len() + STATUS_MAX);
        assert!(line.ends_with('é'));
    }

    #[test]
    fn no_socket_is_a_no_op_and_a_bad_one_is_named() {
        let none = Notifier::default();
        assert!(!none.enabled());
        assert!(none.send(&[State::Ready]).is_ok());
        let error = Notifier::to("relative/path").err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("NOTIFY_SOCKET \"relative/path\": not a unix socket path or abstract name")
        );
        assert!(Notifier::to("@swiftlet-test-abstract").is_ok_and(|n| n.enabled()));
    }

    #[test]
    fn the_watchdog_is_half_its_timeout_and_only_for_its_process() {
        assert_eq!(
            watchdog_interval(Some("30000000"), None, 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_interval(Some("30000000"), Some("7"), 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(watchdog_interval(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
    }

    #[test]
    fn only_a_healthy_agent_pets_and_a_condition_only_changes_the_status() {
        assert_eq!(tick(None, None, true, "running"), vec![State::Watchdog]);
        assert_eq!(tick(None, None, false, "running"), vec![]);
        assert_eq!(
            tick(Some("runtime: down"), None, true, "running"),
            vec![State::Status("unhealthy: runtime: down".to_owned())]
        );
        assert_eq!(
            tick(None, None, true, "unhealthy: runtime: down"),
            vec![State::Status("running".to_owned()), State::Watchdog]
        );
        let down = Some("node not ready: container runtime is down");
        assert_eq!(
            tick(None, down, true, "running"),
            vec![
                State::Status("running; node not ready: container runtime is down".to_owned()),
                State::Watchdog
            ]
        );
        assert_eq!(
            tick(
                None,
                down,
                true,
                "running; node not ready: container runtime is down"
            ),
            vec![State::Watchdog]
        );
        assert_eq!(
            status_text(None, Some("a: one\nb: two")),
            "running; a: one; b: two"
        );
    }

    #[tokio::test]
    async fn the_watchdog_task_stops_petting_while_unhealthy_and_ends_on_shutdown() {
        let (_dir, socket, notifier) = fake_manager();
        // The agent at each tick: fine, fine, a problem, fine, the runtime away, fine.
        let checks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let conditions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(watchdog(
            notifier,
            Duration::from_millis(5),
            true,
            {
                let checks = checks.clone();
                move || {
                    let n = checks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    (n == 2).then(|| "kernel events: lost".to_owned())
                }
            },
            {
                let conditions = conditions.clone();
                move || {
                    let n = conditions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    (n == 4).then(|| "node not ready: container runtime is down".to_owned())
                }
            },
            shutdown.clone(),
        ));
        let received = tokio::task::spawn_blocking(move || {
            (0..6).map(|_| receive(&socket)).collect::<Vec<_>>()
        })
        .await
        .expect("join");
        assert_eq!(
            received,
            [
                "WATCHDOG=1\n",
                "WATCHDOG=1\n",
                "STATUS=unhealthy: kernel events: lost\n",
                "STATUS=running\nWATCHDOG=1\n",
                "STATUS=running; node not ready: container runtime is down\nWATCHDOG=1\n",
                "STATUS=running\nWATCHDOG=1\n",
            ]
        );
        shutdown.cancel();
        task.await.expect("the task ends on shutdown");
    }
}
