//! Errors of CRI calls: which operation on which object failed, and how — with the gRPC code
//! and message the runtime gave. Upstream the kubelet inspects raw gRPC statuses
//! (`crierror.IsNotFound`, `codes.DeadlineExceeded` in `remote_runtime.go`); here the cases
//! callers act on are variants: a vanished object ([`Error::NotFound`]), a runtime that does not
//! answer ([`Error::Unreachable`], [`Error::DeadlineExceeded`]).

use std::time::Duration;

use super::Operation;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an endpoint string was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointProblem {
    Empty,
    /// `tcp://`, `npipe://`, `http://`…: CRI runtimes on Linux listen on unix sockets only.
    UnsupportedScheme,
    /// `unix://` without a path.
    MissingPath,
}

impl EndpointProblem {
    fn describe(self) -> &'static str {
        match self {
            EndpointProblem::Empty => "it is empty",
            EndpointProblem::UnsupportedScheme => "only unix sockets are supported",
            EndpointProblem::MissingPath => "the unix:// URL has no path",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "invalid --runtime-endpoint {endpoint:?}: {}; expected unix:///path/to/socket or a \
         socket path, e.g. unix:///run/containerd/containerd.sock",
        .problem.describe()
    )]
    InvalidEndpoint {
        endpoint: String,
        problem: EndpointProblem,
    },

    /// The runtime did not accept the connection, or answered but not with CRI v1.
    #[error("container runtime unreachable at {endpoint} ({operation}): {message}; {hint}")]
    Unreachable {
        endpoint: String,
        operation: Operation,
        message: String,
        hint: &'static str,
    },

    /// The object is gone (or never was). Callers treat a vanished container as removed.
    #[error("{operation} {id:?}: not found: {message}")]
    NotFound {
        operation: Operation,
        id: String,
        message: String,
    },

    /// No answer within the deadline (ours, or one the runtime reported).
    #[error("{operation} {id:?}: no answer within {timeout:?}: {message}")]
    DeadlineExceeded {
        operation: Operation,
        id: String,
        timeout: Option<Duration>,
        message: String,
    },

    /// Any other gRPC failure, with the runtime's code and message.
    #[error("{operation} {id:?}: {code:?}: {message}")]
    Runtime {
        operation: Operation,
        id: String,
        code: tonic::Code,
        message: String,
    },

    /// The runtime answered, but without a field CRI requires (upstream `verifySandboxStatus`,
    /// `verifyContainerStatus`, and the empty-id checks of `remote_runtime.go`).
    #[error("{operation} {id:?}: invalid response from the runtime: {problem}")]
    InvalidResponse {
        operation: Operation,
        id: String,
        problem: &'static str,
    },
}

/// What to tell an operator when the runtime cannot be reached.
const HINT_DOWN: &str =
    "is the container runtime running, and does --runtime-endpoint name its CRI socket?";
const HINT_HUNG: &str =
    "the runtime accepts connections but does not answer; is it overloaded or hung?";
const HINT_NOT_CRI: &str = "the socket answers but not as a CRI v1 runtime; is it \
     containerd's socket, with the CRI plugin enabled (not in disabled_plugins)?";

impl Error {
    /// Maps a gRPC status to an error of `operation` on `id` (a container, sandbox or image id,
    /// empty for lists). `endpoint` names the runtime in [`Error::Unreachable`].
    pub fn from_status(
        operation: Operation,
        id: &str,
        endpoint: &str,
        timeout: Option<Duration>,
        status: tonic::Status,
    ) -> Error {
        let id = id.to_owned();
        let message = status_detail(&status);
        match status.code() {
            tonic::Code::NotFound => Error::NotFound {
                operation,
                id,
                message,
            },
            tonic::Code::DeadlineExceeded => Error::DeadlineExceeded {
                operation,
                id,
                timeout,
                message,
            },
            tonic::Code::Unavailable => Error::Unreachable {
                endpoint: endpoint.to_owned(),
                operation,
                message,
                hint: HINT_DOWN,
            },
            // Only the connection check turns Unimplemented into "unreachable": a runtime that
            // lacks one optional RPC is otherwise reachable.
            tonic::Code::Unimplemented if operation == Operation::Version => Error::Unreachable {
                endpoint: endpoint.to_owned(),
                operation,
                message,
                hint: HINT_NOT_CRI,
            },
            code => Error::Runtime {
                operation,
                id,
                code,
                message,
            },
        }
    }

    /// The runtime accepted the connection but did not answer the connection check in time.
    pub(super) fn no_answer(endpoint: &str, timeout: Option<Duration>) -> Error {
        Error::Unreachable {
            endpoint: endpoint.to_owned(),
            operation: Operation::Version,
            message: format!("no answer within {timeout:?}"),
            hint: HINT_HUNG,
        }
    }

    /// Something answered the connection check, but not as a CRI v1 runtime.
    pub(super) fn not_cri(endpoint: &str, message: String) -> Error {
        Error::Unreachable {
            endpoint: endpoint.to_owned(),
            operation: Operation::Version,
            message,
            hint: HINT_NOT_CRI,
        }
    }

    /// Whether the object the call named does not exist (upstream `crierror.IsNotFound`).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// The gRPC code this error stands for (`Internal` for an invalid response).
    pub fn code(&self) -> tonic::Code {
        match self {
            Error::InvalidEndpoint { .. } => tonic::Code::InvalidArgument,
            Error::Unreachable { .. } => tonic::Code::Unavailable,
            Error::NotFound { .. } => tonic::Code::NotFound,
            Error::DeadlineExceeded { .. } => tonic::Code::DeadlineExceeded,
            Error::Runtime { code, .. } => *code,
            Error::InvalidResponse { .. } => tonic::Code::Internal,
        }
    }

    /// The operation that failed (`None` for a refused endpoint).
    pub fn operation(&self) -> Option<Operation> {
        match self {
            Error::InvalidEndpoint { .. } => None,
            Error::Unreachable { operation, .. }
            | Error::NotFound { operation, .. }
            | Error::DeadlineExceeded { operation, .. }
            | Error::Runtime { operation, .. }
            | Error::InvalidResponse { operation, .. } => Some(*operation),
        }
    }
}

/// A transport failure's status message is generic ("transport error"); the cause (e.g. "No
/// such file or directory") is in its source chain, which an operator needs to see.
fn status_detail(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(op: Operation, code: tonic::Code) -> Error {
        Error::from_status(
            op,
            "c1",
            "unix:///x",
            None,
            tonic::Status::new(code, "boom"),
        )
    }

    #[test]
    fn grpc_codes_map_to_the_variants_callers_act_on() {
        let e = map(Operation::ContainerStatus, tonic::Code::NotFound);
        assert!(e.is_not_found());
        assert_eq!(e.operation(), Some(Operation::ContainerStatus));
        assert_eq!(e.to_string(), "ContainerStatus \"c1\": not found: boom");

        let e = map(Operation::ExecSync, tonic::Code::DeadlineExceeded);
        assert!(matches!(e, Error::DeadlineExceeded { .. }));

        let e = map(Operation::ListContainers, tonic::Code::Unavailable);
        assert!(matches!(e, Error::Unreachable { .. }));
        assert!(e.to_string().contains("unix:///x"), "{e}");
        assert!(e.to_string().contains("--runtime-endpoint"), "{e}");

        let e = map(Operation::Version, tonic::Code::Unimplemented);
        assert!(e.to_string().contains("CRI plugin"), "{e}");
        let e = map(Operation::ExecSync, tonic::Code::Unimplemented);
        assert_eq!(e.code(), tonic::Code::Unimplemented);

        let e = map(Operation::StartContainer, tonic::Code::Unknown);
        assert_eq!(e.code(), tonic::Code::Unknown);
        assert!(!e.is_not_found());
        assert_eq!(e.to_string(), "StartContainer \"c1\": Unknown: boom");
    }

    #[test]
    fn a_bad_endpoint_names_the_flag() {
        let e = Error::InvalidEndpoint {
            endpoint: "tcp://1.2.3.4:5".into(),
            problem: EndpointProblem::UnsupportedScheme,
        };
        let text = e.to_string();
        assert!(text.contains("--runtime-endpoint"), "{text}");
        assert!(text.contains("only unix sockets"), "{text}");
        assert_eq!(e.operation(), None);
    }
}
