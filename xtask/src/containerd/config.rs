//! The private containerd's configuration, rewritten at every start: config version 2 with its
//! own root, state, sockets and runc root under the state folder, the CRI plugin pointed at the
//! local pause image, and a CNI bridge network for pods that do not use the host's network.
//! Kubernetes' counterpart is the node set-up a cluster installer does (e.g. kind's
//! `containerd` config), not the kubelet.

use std::{fs, path::PathBuf};

use anyhow::Context as _;
use serde_json::json;

use super::{CgroupDriver, Paths};
use crate::images;

/// The CNI network the sandboxes join when they do not use the host's network.
const BRIDGE: &str = "swiftlet0";
const POD_SUBNET: &str = "10.88.0.0/16";

/// Writes config.toml and the CNI network for this instance.
pub(super) fn write(paths: &Paths, cgroup_driver: CgroupDriver) -> anyhow::Result<()> {
    for dir in [
        paths.root(),
        paths.run(),
        paths.runc_root(),
        paths.cni_conf_dir(),
    ] {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let restrict_oom_score_adj = !has_cap_sys_resource()?;
    if restrict_oom_score_adj {
        println!(
            "xtask: containerd: no CAP_SYS_RESOURCE here, so restrict_oom_score_adj = true \
             (runc could not set the sandbox's negative oom_score_adj)"
        );
    }
    // TOML basic strings accept JSON's string escapes.
    let quoted = |path: PathBuf| serde_json::to_string(&path.display().to_string());
    let config = format!(
        r#"# Written by `cargo xtask` (xtask/src/containerd/config.rs) at every start; edits are lost.
version = 2
root = {root}
state = {state}
# Snapshotters this instance never uses; the CRI plugin uses overlayfs.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {opt}
  [plugins."io.containerd.grpc.v1.cri"]
    # No registry is reachable: the sandbox image is the local one xtask imports.
    sandbox_image = "{pause}"
    restrict_oom_score_adj = {restrict_oom_score_adj}
    # Network namespaces under our state folder, where leftovers are ours to unmount.
    netns_mounts_under_state_dir = true
    # AppArmor stays on: containerd applies its default profile only where the host supports
    # AppArmor, and works without it (this project's VMs have none).
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = {cni_conf_dir}
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          # runc's state apart from any system containerd's, to find our leftovers.
          Root = {runc_root}
          # The driver swiftlet's cgroupDriver names: containers' cgroups as systemd scopes
          # below the pods' slices, or directories below the pods' cgroups.
          SystemdCgroup = {systemd_cgroup}
"#,
        root = quoted(paths.root())?,
        state = quoted(paths.run())?,
        socket = quoted(paths.socket())?,
        ttrpc = quoted(paths.ttrpc_socket())?,
        opt = quoted(paths.state.join("opt"))?,
        pause = images::PAUSE,
        cni_conf_dir = quoted(paths.cni_conf_dir())?,
        runc_root = quoted(paths.runc_root())?,
        systemd_cgroup = cgroup_driver == CgroupDriver::Systemd,
    );
    fs::write(paths.config(), config)?;
    // The CRI plugin adds the loopback interface itself (with /usr/lib/cni/loopback). The address
    // reservations stay in host-local's default /var/lib/cni/networks/swiftlet, shared (and
    // locked) by every checkout's instance on this one bridge, so they never hand out one
    // address twice. No masquerading: pods have nowhere outside to go.
    let network = json!({
        "cniVersion": "1.0.0",
        "name": "swiftlet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": POD_SUBNET }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    });
    fs::write(
        paths.cni_conf_dir().join("10-swiftlet.conflist"),
        serde_json::to_string_pretty(&network)?,
    )?;
    Ok(())
}

/// CapEff bit 24. Without it (this project's VMs) a negative oom_score_adj cannot be written.
fn has_cap_sys_resource() -> anyhow::Result<bool> {
    let status = fs::read_to_string("/proc/self/status")?;
    cap_sys_resource_in(&status)
}

fn cap_sys_resource_in(proc_status: &str) -> anyhow::Result<bool> {
    const CAP_SYS_RESOURCE: u32 = 24;
    let hex = proc_status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .context("/proc/self/status has no CapEff line")?;
    let caps = u64::from_str_radix(hex.trim(), 16).context("parsing CapEff")?;
    Ok(caps & (1 << CAP_SYS_RESOURCE) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_sys_resource_is_read_from_cap_eff() {
        for (cap_eff, has) in [
            // Every capability but CAP_SYS_RESOURCE: this project's VMs.
            ("000001fffeffffff", false),
            ("000001ffffffffff", true),
            ("0000000001000000", true),
            ("0000000000000000", false),
        ] {
            let status = format!("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\n");
            assert_eq!(cap_sys_resource_in(&status).unwrap(), has, "{cap_eff}");
        }
        assert!(cap_sys_resource_in("Name:\tx\n").is_err());
    }
}
