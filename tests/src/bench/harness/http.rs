//! Looking at the node the way a user does: `GET /pods` on swiftlet's read-only port, and which of
//! the listed pods are running, i.e. in phase Running with every container in state `running`;
//! and single samples of `GET /metrics`.
//!
//! The HTTP client is a few lines over a TCP stream (one request per connection), so that the
//! poll costs no more than it must on a 2-CPU machine and the benchmark needs no HTTP client
//! crate.

use std::{collections::BTreeMap, net::Ipv4Addr};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

/// `GET path` on 127.0.0.1:`port`; the body of a 200 response.
pub async fn get(port: u16, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .with_context(|| format!("sending GET {path}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .await
        .with_context(|| format!("reading the answer to GET {path}"))?;
    body_of(&raw).with_context(|| format!("GET {path}"))
}

/// The body of an HTTP/1.1 response with status 200 that ends with the connection (no chunked
/// encoding: swiftlet's answers have a length).
fn body_of(raw: &[u8]) -> Result<String> {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("the answer has no end of headers: {text:?}");
    };
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("answered {status:?}: {body}");
    }
    if head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:"))
    {
        bail!("a chunked answer, which this client does not read: {head}");
    }
    Ok(body.to_owned())
}

/// What `/pods` says about one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub uid: String,
    pub running: bool,
    /// The runtime's ids of its containers (`containerID` without the `containerd://`), in the
    /// order of `containerStatuses`; those without an id yet are left out.
    pub container_ids: Vec<String>,
}

/// Every pod of a PodList by `metadata.name`.
pub fn list(pod_list: &str) -> Result<BTreeMap<String, Listed>> {
    let list: Value = serde_json::from_str(pod_list).context("/pods is not JSON")?;
    let Some(items) = list.get("items").and_then(Value::as_array) else {
        bail!("/pods has no items: {pod_list}");
    };
    Ok(items
        .iter()
        .map(|pod| {
            let text = |pointer| {
                pod.pointer(pointer)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let listed = Listed {
                uid: text("/metadata/uid"),
                running: is_running(pod),
                container_ids: container_ids(pod),
            };
            (text("/metadata/name"), listed)
        })
        .collect())
}

fn container_ids(pod: &Value) -> Vec<String> {
    pod.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(|s| s.get("containerID").and_then(Value::as_str))
        .filter(|id| !id.is_empty())
        .map(|id| id.split_once("://").map_or(id, |(_, bare)| bare).to_owned())
        .collect()
}

/// Phase Running, and a status for each of the spec's containers, every one `running`.
fn is_running(pod: &Value) -> bool {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    let wanted = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    phase == Some("Running")
        && wanted > 0
        && statuses.len() == wanted
        && statuses
            .iter()
            .all(|s| s.pointer("/state/running").is_some_and(Value::is_object))
}

/// The value of the sample `series` (a metric name with its labels, as exposed, e.g.
/// `swiftlet_node_pressure_condition{condition="MemoryPressure"}`) in a Prometheus text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.starts_with(' ')
            .then(|| rest.trim().parse().ok())
            .flatten()
    })
}

/// Every sample of `name` by its label set.
pub fn metric_by_label(text: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    let prefix = format!("{name}{{{label}=\"");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (value_of_label, rest) = rest.split_once('"')?;
            let value = rest.strip_prefix('}')?.trim().parse().ok()?;
            Some((value_of_label.to_owned(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_of_a_200_and_errors_otherwise() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(body_of(ok).unwrap(), "{}");
        let missing = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        assert!(body_of(missing).is_err());
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert!(body_of(chunked).is_err());
        assert!(body_of(b"HTTP/1.1 200 OK\r\n").is_err());
    }

    fn pod(name: &str, phase: &str, containers: usize, states: &[&str]) -> Value {
        let specs: Vec<Value> = (0..containers)
            .map(|i| serde_json::json!({"name": format!("c{i}")}))
            .collect();
        let statuses: Vec<Value> = states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::json!({
                    "name": "c",
                    "state": {*s: {}},
                    "containerID": format!("containerd://{name}-{i}"),
                })
            })
            .collect();
        serde_json::json!({
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {"containers": specs},
            "status": {"phase": phase, "containerStatuses": statuses},
        })
    }

    #[test]
    fn running_means_phase_and_every_container() {
        let list = serde_json::json!({
            "kind": "PodList",
            "items": [
                pod("up", "Running", 1, &["running"]),
                pod("pending", "Pending", 1, &["waiting"]),
                pod("half", "Running", 2, &["running", "waiting"]),
                pod("unreported", "Running", 2, &["running"]),
                pod("no-containers", "Running", 0, &[]),
                serde_json::json!({"metadata": {"name": "bare"}}),
            ],
        })
        .to_string();
        let found = super::list(&list).unwrap();
        assert_eq!(found.len(), 6);
        assert!(found["up"].running);
        assert_eq!(found["up"].uid, "uid-up");
        assert_eq!(found["up"].container_ids, ["up-0"]);
        assert_eq!(found["half"].container_ids, ["half-0", "half-1"]);
        assert!(found["bare"].container_ids.is_empty());
        for name in ["pending", "half", "unreported", "no-containers", "bare"] {
            assert!(!found[name].running, "{name}");
        }
        assert_eq!(found["bare"].uid, "");
        assert!(super::list("{}").is_err());
        assert!(super::list("nope").is_err());
    }

    #[test]
    fn metrics_are_read() {
        let text = "# HELP x\n\
                    swiftlet_node_pressure_condition{condition=\"MemoryPressure\"} 1\n\
                    swiftlet_eviction_wakeups_total{source=\"memcg\"} 3\n\
                    swiftlet_eviction_wakeups_total{source=\"psi\"} 0\n";
        assert_eq!(
            metric(
                text,
                "swiftlet_node_pressure_condition{condition=\"MemoryPressure\"}"
            ),
            Some(1.0)
        );
        assert_eq!(metric(text, "swiftlet_node_pressure_condition"), None);
        assert_eq!(
            metric_by_label(text, "swiftlet_eviction_wakeups_total", "source"),
            [("memcg".to_owned(), 3.0), ("psi".to_owned(), 0.0)]
        );
    }
}
