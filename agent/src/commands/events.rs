//! `swiftlet events`: the kernel event stream on stdout, one event per line (text or JSON).

use std::io::{self, BufWriter, Write};

use super::CommandError;
use crate::{
    config::EventsArgs,
    kernel::{EventBody, KernelEvent, KernelEvents, StreamItem},
};

pub async fn run(args: EventsArgs) -> Result<(), CommandError> {
    let mut events = KernelEvents::load(&args.kernel.load_options())?;
    let mut out = BufWriter::new(io::stdout().lock());
    let mut printed = 0u64;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        if args.count.is_some_and(|limit| printed >= limit) {
            break;
        }
        let item = tokio::select! {
            item = events.next() => item?,
            () = &mut shutdown => break,
        };
        if let StreamItem::Event(_) = item {
            printed += 1;
        }
        let line = if args.json {
            json_line(&item)
        } else {
            text_line(&item)
        };
        match writeln!(out, "{line}").and_then(|()| out.flush()) {
            Ok(()) => {}
            // The reader went away (e.g. `| head`): that is how a pipeline ends, not an error.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(CommandError::Output(e)),
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn json_line(item: &StreamItem) -> String {
    match item {
        StreamItem::Event(event) => serde_json::to_string(event).unwrap_or_else(|e| {
            serde_json::json!({ "kind": "error", "error": e.to_string() }).to_string()
        }),
        StreamItem::Lost { count } => {
            serde_json::json!({ "kind": "lost", "count": count }).to_string()
        }
    }
}

/// `exit ts=12.000001234 cgroup=25 pid=7 tid=7 comm=sh exit_code=3`
pub fn text_line(item: &StreamItem) -> String {
    let event: &KernelEvent = match item {
        StreamItem::Event(event) => event,
        StreamItem::Lost { count } => return format!("lost count={count}"),
    };
    let ts = format!(
        "{}.{:09}",
        event.ts_ns / 1_000_000_000,
        event.ts_ns % 1_000_000_000
    );
    let head = format!(
        "{} ts={ts} cgroup={}",
        event.body.kind().as_str(),
        event.body.cgroup_id()
    );
    match &event.body {
        EventBody::Exit(e) => {
            let status = match (e.exit_code, e.signal) {
                (Some(code), _) => format!("exit_code={code}"),
                (None, Some(sig)) if e.core_dumped => format!("signal={sig} core_dumped"),
                (None, Some(sig)) => format!("signal={sig}"),
                (None, None) => String::new(),
            };
            format!(
                "{head} pid={} tid={} comm={} {status}",
                e.pid, e.tid, e.comm
            )
        }
        EventBody::Exec(e) => format!(
            "{head} pid={} tid={} comm={} filename={}",
            e.pid, e.tid, e.comm, e.filename
        ),
        EventBody::Oom(e) => {
            let mut line = format!("{head} pid={} comm={}", e.pid, e.comm);
            if let Some(rss) = e.anon_rss_kb {
                line.push_str(&format!(" anon_rss_kb={rss}"));
            }
            if let Some(adj) = e.oom_score_adj {
                line.push_str(&format!(" oom_score_adj={adj}"));
            }
            line
        }
        EventBody::CgroupMkdir(c) | EventBody::CgroupRmdir(c) => {
            format!("{head} level={} path={}", c.level, c.path.display())
        }
        EventBody::Pressure(p) => {
            let mut line = format!("{head} source={}", p.source.as_str());
            if let Some(order) = p.order {
                line.push_str(&format!(" order={order}"));
            }
            line.push_str(&format!(" suppressed={}", p.suppressed));
            line
        }
        EventBody::MemcgLevel(m) => format!(
            "{head} usage_pages={} nr_pages={} level_pages={}",
            m.usage_pages, m.nr_pages, m.level_pages
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{MemoryPressure, PressureSource, ProcessExit};

    #[test]
    fn formats_exits_as_text_and_json() {
        let item = StreamItem::Event(KernelEvent {
            ts_ns: 12_000_001_234,
            received_ns: 0,
            cpu: 0,
            body: EventBody::Exit(ProcessExit {
                cgroup_id: 25,
                pid: 7,
                tid: 7,
                comm: "sh".into(),
                exit_code: None,
                signal: Some(9),
                core_dumped: false,
                wait_status: 9,
            }),
        });
        assert_eq!(
            text_line(&item),
            "exit ts=12.000001234 cgroup=25 pid=7 tid=7 comm=sh signal=9"
        );
        let json: serde_json::Value = serde_json::from_str(&json_line(&item)).expect("json");
        assert_eq!(json["kind"], "exit");
        assert_eq!(json["signal"], 9);
        assert_eq!(json["exit_code"], serde_json::Value::Null);
        assert_eq!(json["pid"], 7);
        let pressure = StreamItem::Event(KernelEvent {
            ts_ns: 3_000_000_000,
            received_ns: 0,
            cpu: 1,
            body: EventBody::Pressure(MemoryPressure {
                cgroup_id: 0,
                source: PressureSource::KswapdWake,
                order: Some(0),
                suppressed: 17,
            }),
        });
        assert_eq!(
            text_line(&pressure),
            "pressure ts=3.000000000 cgroup=0 source=kswapd_wake order=0 suppressed=17"
        );
        let json: serde_json::Value = serde_json::from_str(&json_line(&pressure)).expect("json");
        assert_eq!(
            (json["kind"].as_str(), json["source"].as_str()),
            (Some("pressure"), Some("kswapd_wake"))
        );
        let lost: serde_json::Value =
            serde_json::from_str(&json_line(&StreamItem::Lost { count: 4 })).expect("json");
        assert_eq!(
            (lost["kind"].as_str(), lost["count"].as_u64()),
            (Some("lost"), Some(4))
        );
    }
}
