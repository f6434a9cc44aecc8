//! The benchmark's static pods: one busybox container each, named so that every round's pods are
//! new to the runtime (a static pod's UID follows from its manifest, so a name reused across
//! rounds would meet the previous round's leftovers), and written so that each manifest appears
//! in the watched directory whole, by a rename, at an instant the benchmark records.

use std::{path::Path, time::Instant};

use anyhow::Result;

use super::super::harness::{NODE_NAME, manifests};

/// One pod of a batch.
#[derive(Clone, Debug)]
pub struct BenchPod {
    /// The manifest's `metadata.name`, also its file name's stem.
    pub name: String,
}

impl BenchPod {
    /// Pod `index` (0-based) of round `round` of the batch of `size`.
    pub fn new(size: usize, round: usize, index: usize) -> BenchPod {
        BenchPod {
            name: format!("startup-{size}-r{round}-{index:02}"),
        }
    }

    /// The name the pod has on the node: a static pod's name ends with the node's.
    pub fn node_name(&self) -> String {
        format!("{}-{NODE_NAME}", self.name)
    }

    fn file_name(&self) -> String {
        format!("{}.yaml", self.name)
    }

    /// The manifest: one busybox `sleep`, restarted if it ever exits.
    pub fn manifest(&self) -> String {
        super::super::harness::sleep_pod(&self.name, "swiftlet-bench-startup", "Always")
    }
}

/// Writes the batch at once (see [`manifests::write_all`]): the instant each manifest appeared.
pub fn write_batch(pods: &[BenchPod], staging: &Path, manifests: &Path) -> Result<Vec<Instant>> {
    let files: Vec<(String, String)> = pods.iter().map(|p| (p.file_name(), p.manifest())).collect();
    manifests::write_all(&files, staging, manifests)
}

/// Removes the manifests of `pods` from `manifests` (those already gone are fine).
pub fn delete_batch(pods: &[BenchPod], manifests: &Path) -> Result<()> {
    let files: Vec<String> = pods.iter().map(BenchPod::file_name).collect();
    manifests::remove_all(&files, manifests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_per_round_and_carry_the_node_suffix() {
        let pod = BenchPod::new(30, 2, 7);
        assert_eq!(pod.name, "startup-30-r2-07");
        assert_eq!(pod.node_name(), "startup-30-r2-07-bench");
        assert_ne!(BenchPod::new(10, 1, 7).name, BenchPod::new(10, 2, 7).name);
        assert_ne!(BenchPod::new(10, 1, 7).name, BenchPod::new(30, 1, 7).name);
    }

    #[test]
    fn manifest_is_one_busybox_pod_in_the_bench_namespace() {
        let text = BenchPod::new(10, 1, 3).manifest();
        assert!(text.contains("  name: startup-10-r1-03\n"), "{text}");
        assert!(text.contains("  namespace: swiftlet-bench\n"), "{text}");
        assert!(
            text.contains("      image: localhost/swiftlet/busybox:latest\n"),
            "{text}"
        );
        assert!(text.contains("      imagePullPolicy: Never\n"), "{text}");
        assert!(
            text.contains("      command: [\"sleep\", \"3600\"]\n"),
            "{text}"
        );
        assert_eq!(text.matches("- name:").count(), 1, "{text}");
    }

    #[test]
    fn a_batch_is_staged_then_renamed_into_place() {
        let base = std::env::temp_dir().join(format!(
            "swiftlet-bench-manifest-test-{}",
            std::process::id()
        ));
        let (staging, manifests) = (base.join("staging"), base.join("manifests"));
        std::fs::create_dir_all(&staging).expect("staging dir");
        std::fs::create_dir_all(&manifests).expect("manifests dir");
        let pods: Vec<BenchPod> = (0..3).map(|i| BenchPod::new(3, 1, i)).collect();
        let written = write_batch(&pods, &staging, &manifests).expect("write");
        assert_eq!(written.len(), 3);
        assert!(written.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(std::fs::read_dir(&staging).expect("ls").count(), 0);
        let on_disk =
            std::fs::read_to_string(manifests.join("startup-3-r1-01.yaml")).expect("read");
        assert_eq!(on_disk, pods[1].manifest());
        delete_batch(&pods, &manifests).expect("delete");
        delete_batch(&pods, &manifests).expect("deleting again is fine");
        assert_eq!(std::fs::read_dir(&manifests).expect("ls").count(), 0);
        let _ = std::fs::remove_dir_all(&base);
    }
}
