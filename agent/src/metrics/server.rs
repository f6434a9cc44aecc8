//! Metrics of the agent's listeners (healthz, read-only, the kubelet server, the gRPC socket):
//! connections open now and the limit, and how many were accepted, evicted to make room and refused, by
//! listener. The label takes four fixed values.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

#[derive(Clone)]
pub struct ServerMetrics {
    pub open: IntGaugeVec,
    pub limit: IntGaugeVec,
    pub accepted: IntCounterVec,
    pub evicted: IntCounterVec,
    pub refused: IntCounterVec,
    pub timed_out: IntCounterVec,
}

impl ServerMetrics {
    pub fn register(registry: &Registry) -> Result<ServerMetrics, prometheus::Error> {
        let open = IntGaugeVec::new(
            Opts::new(
                "swiftlet_server_connections",
                "Connections open now, by listener.",
            ),
            &["listener"],
        )?;
        let limit = IntGaugeVec::new(
            Opts::new(
                "swiftlet_server_connections_limit",
                "Connections a listener holds at most (from the open files limit), by listener.",
            ),
            &["listener"],
        )?;
        let accepted = IntCounterVec::new(
            Opts::new(
                "swiftlet_server_connections_accepted_total",
                "Connections accepted, by listener.",
            ),
            &["listener"],
        )?;
        let evicted = IntCounterVec::new(
            Opts::new(
                "swiftlet_server_connections_evicted_total",
                "Connections closed to make room for a new one at the listener's limit (the \
                 oldest that had not sent a request, else the oldest idle one), by listener.",
            ),
            &["listener"],
        )?;
        let refused = IntCounterVec::new(
            Opts::new(
                "swiftlet_server_connections_refused_total",
                "Connections closed at once because the listener was at its limit with every \
                 connection busy, by listener.",
            ),
            &["listener"],
        )?;
        let timed_out = IntCounterVec::new(
            Opts::new(
                "swiftlet_server_connections_timed_out_total",
                "Connections closed for a missed deadline (TLS handshake, request headers, idle, \
                 or a stalled write), by listener.",
            ),
            &["listener"],
        )?;
        registry.register(Box::new(open.clone()))?;
        registry.register(Box::new(limit.clone()))?;
        registry.register(Box::new(accepted.clone()))?;
        registry.register(Box::new(evicted.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(timed_out.clone()))?;
        Ok(ServerMetrics {
            open,
            limit,
            accepted,
            evicted,
            refused,
            timed_out,
        })
    }
}
