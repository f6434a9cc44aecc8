//! The eviction benchmark's pods and what it reads about them: the hog (Burstable: a busybox
//! shell that allocates anonymous memory in shell variables; in the PSI scenario beside a
//! container that thrashes the page cache in its own memory limit), the bystander (Guaranteed,
//! which must never be evicted), and their state in `/pods`.
//!
//! Memory is taken in chunks of command substitution (`a0=$(head -c BYTES /dev/zero | tr '\0'
//! x); a1=...`): busybox holds a substitution's output twice for a moment (the read buffer and
//! the variable's copy), so one large chunk would peak at twice what it keeps. Every script ends
//! with `; true`, so the shell never execs its last command and lets go of the memory, and exits
//! on SIGTERM (a trap, with `sleep & wait` so that the trap runs at once): the time to stop is
//! the agent's, not the 2 s grace of a shell that ignores SIGTERM as a pid namespace's init.

use serde_json::Value;

use crate::bench::harness::{pod_header, shell_container};

const MI: u64 = 1 << 20;

/// What the hog pod does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hog {
    /// One container (`main`) allocates `mib` MiB and holds it.
    Hold { mib: u64 },
    /// Two containers. `thrash`, limited to `limit_mib` MiB, writes a file of `file_mib` MiB
    /// into its writable layer and reads it over and over from the start: the file does not fit
    /// in its limit, so every pass reclaims what the previous one read and the reads stall on
    /// refaults — a memory stall PSI reports in the pods' cgroup from the first seconds on. `main`
    /// waits `warmup_s` seconds, then allocates `mib` MiB and holds it: the working set crosses
    /// the threshold while the stall goes on.
    ThrashBeside {
        mib: u64,
        limit_mib: u64,
        file_mib: u64,
        warmup_s: u64,
    },
}

/// The hog's and the bystander's chunk of allocation.
const HOG_CHUNK_MIB: u64 = 16;
const BYSTANDER_CHUNK_MIB: u64 = 10;

/// What the bystander holds, of its 100Mi limit.
pub const BYSTANDER_MIB: u64 = 50;

/// Where the thrashing hog's file goes (the container's writable layer: on disk, reclaimable,
/// where tmpfs pages would not be without swap). The trap removes it, so its page cache goes
/// with the pod.
const THRASH_FILE: &str = "/tmp/thrash";

/// `a0=$(...); a1=$(...); ...`: `mib` MiB held in chunks of at most `chunk` MiB.
pub fn allocate(mib: u64, chunk: u64) -> String {
    let mut parts = Vec::new();
    let mut left = mib;
    while left > 0 {
        let this = left.min(chunk);
        parts.push(format!(
            "a{}=$(head -c {} /dev/zero | tr '\\0' x)",
            parts.len(),
            this * MI
        ));
        left -= this;
    }
    parts.join("; ")
}

/// `main`'s resources in the hog: Burstable, so that MemoryPressure never turns it away.
const HOG_RESOURCES: &str = "      resources:\n        requests:\n          memory: 10Mi\n";

impl Hog {
    /// Its containers: name, resources (YAML lines), script.
    fn containers(self) -> Vec<(&'static str, String, String)> {
        let hold = |mib, warmup_s: u64| {
            let warmup = if warmup_s > 0 {
                format!("sleep {warmup_s} & wait; ")
            } else {
                String::new()
            };
            format!(
                "trap 'exit 143' TERM; {warmup}{}; sleep 3600 & wait; true",
                allocate(mib, HOG_CHUNK_MIB)
            )
        };
        match self {
            Hog::Hold { mib } => vec![("main", HOG_RESOURCES.to_owned(), hold(mib, 0))],
            Hog::ThrashBeside {
                mib,
                limit_mib,
                file_mib,
                warmup_s,
            } => vec![
                (
                    "thrash",
                    format!("      resources:\n        limits:\n          memory: {limit_mib}Mi\n"),
                    format!(
                        "trap 'rm -f {THRASH_FILE}; exit 143' TERM; dd if=/dev/zero \
                         of={THRASH_FILE} bs=1M count={file_mib} 2>/dev/null; while :; do cat \
                         {THRASH_FILE} > /dev/null; done; true"
                    ),
                ),
                ("main", HOG_RESOURCES.to_owned(), hold(mib, warmup_s)),
            ],
        }
    }

    /// How many containers the pod has (each one's death is waited for).
    pub fn container_count(self) -> usize {
        self.containers().len()
    }

    /// For the report.
    pub fn describe(self) -> String {
        match self {
            Hog::Hold { mib } => format!("holds {mib} MiB"),
            Hog::ThrashBeside {
                mib,
                limit_mib,
                file_mib,
                warmup_s,
            } => format!(
                "holds {mib} MiB after {warmup_s} s, beside a container re-reading a {file_mib} \
                 MiB file in a {limit_mib} MiB limit"
            ),
        }
    }
}

/// The hog pod, never restarted.
pub fn hog(name: &str, hog: Hog) -> String {
    manifest(name, "Never", &hog.containers())
}

/// The bystander: Guaranteed (requests = limits: memory 100Mi, cpu 100m), holding
/// [`BYSTANDER_MIB`].
pub fn bystander(name: &str) -> String {
    let resources = "      resources:\n        requests:\n          cpu: 100m\n          memory: \
                     100Mi\n        limits:\n          cpu: 100m\n          memory: 100Mi\n";
    let script = format!(
        "trap 'exit 143' TERM; {}; sleep 3600 & wait; true",
        allocate(BYSTANDER_MIB, BYSTANDER_CHUNK_MIB)
    );
    manifest(name, "Always", &[("main", resources.to_owned(), script)])
}

fn manifest(name: &str, restart_policy: &str, containers: &[(&str, String, String)]) -> String {
    let mut text = pod_header(name, "swiftlet-bench-eviction", restart_policy);
    for (container, resources, script) in containers {
        text.push_str(&shell_container(container, resources, script));
    }
    text
}

/// A pod as `/pods` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodState {
    pub uid: String,
    pub phase: String,
    /// `status.reason` (e.g. "Evicted").
    pub reason: String,
    /// Its container runs.
    pub running: bool,
    pub restarts: i64,
}

/// The pod `name` of a PodList, if listed.
pub fn pod_state(pod_list: &str, name: &str) -> Option<PodState> {
    let list: Value = serde_json::from_str(pod_list).ok()?;
    let pod = list
        .get("items")?
        .as_array()?
        .iter()
        .find(|p| p.pointer("/metadata/name").and_then(Value::as_str) == Some(name))?;
    let text = |pointer: &str| {
        pod.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let container = pod.pointer("/status/containerStatuses/0");
    Some(PodState {
        uid: text("/metadata/uid"),
        phase: text("/status/phase"),
        reason: text("/status/reason"),
        running: container
            .and_then(|c| c.pointer("/state/running"))
            .is_some_and(Value::is_object),
        restarts: container
            .and_then(|c| c.get("restartCount"))
            .and_then(Value::as_i64)
            .unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::harness::NAMESPACE;

    #[test]
    fn memory_is_taken_in_chunks() {
        assert_eq!(
            allocate(90, 40),
            "a0=$(head -c 41943040 /dev/zero | tr '\\0' x); a1=$(head -c 41943040 /dev/zero | tr \
             '\\0' x); a2=$(head -c 10485760 /dev/zero | tr '\\0' x)"
        );
        assert_eq!(allocate(0, 40), "");
        let hold = Hog::Hold { mib: 80 }.containers();
        assert_eq!(hold.len(), 1);
        let (name, _, script) = &hold[0];
        assert_eq!(*name, "main");
        assert!(
            script.starts_with("trap 'exit 143' TERM; a0=$("),
            "{script}"
        );
        assert!(script.ends_with("; sleep 3600 & wait; true"), "{script}");
        let beside = Hog::ThrashBeside {
            mib: 40,
            limit_mib: 128,
            file_mib: 192,
            warmup_s: 3,
        };
        let containers = beside.containers();
        assert_eq!(beside.container_count(), 2);
        let (name, resources, thrash) = &containers[0];
        assert_eq!(*name, "thrash");
        assert!(resources.contains("memory: 128Mi"), "{resources}");
        assert!(thrash.contains("count=192"), "{thrash}");
        assert!(thrash.contains("while :; do cat /tmp/thrash"), "{thrash}");
        let (_, _, main) = &containers[1];
        assert!(
            main.starts_with("trap 'exit 143' TERM; sleep 3 & wait; a0=$("),
            "{main}"
        );
    }

    #[test]
    fn manifests_are_yaml_with_the_script_intact() {
        let text = hog("hog-x", Hog::Hold { mib: 40 });
        assert!(text.contains("restartPolicy: Never"), "{text}");
        assert!(
            text.contains("  containers:\n    - name: main\n      image: "),
            "{text}"
        );
        assert!(text.contains("memory: 10Mi"), "{text}");
        assert!(text.contains(&format!("namespace: {NAMESPACE}")), "{text}");
        // The YAML double-quoted string holds `tr '\0' x` as `tr '\\0' x`.
        assert!(text.contains("tr '\\\\0' x"), "{text}");
        let text = bystander("b");
        assert!(text.contains("restartPolicy: Always"), "{text}");
        assert_eq!(text.matches("memory: 100Mi").count(), 2, "{text}");
        assert_eq!(text.matches("cpu: 100m").count(), 2, "{text}");
    }

    #[test]
    fn pod_states_are_read() {
        let list = serde_json::json!({"items": [
            {"metadata": {"name": "a", "uid": "u-a"},
             "status": {"phase": "Failed", "reason": "Evicted",
                        "containerStatuses": [{"restartCount": 0, "state": {"terminated": {}}}]}},
            {"metadata": {"name": "b", "uid": "u-b"},
             "status": {"phase": "Running",
                        "containerStatuses": [{"restartCount": 2, "state": {"running": {}}}]}},
        ]})
        .to_string();
        let a = pod_state(&list, "a").unwrap();
        assert_eq!(
            (a.phase.as_str(), a.reason.as_str(), a.running),
            ("Failed", "Evicted", false)
        );
        let b = pod_state(&list, "b").unwrap();
        assert_eq!((b.uid.as_str(), b.running, b.restarts), ("u-b", true, 2));
        assert!(pod_state(&list, "c").is_none());
    }
}
