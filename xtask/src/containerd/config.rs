//! The private containerd's configuration, rewritten at every start: config version 2 with its
//! own root, state, sockets and runc root under the state folder, the CRI plugin pointed at the
//! local pause image, and a CNI bridge network for pods that do not use the host's network.
//! Kubernetes' counterpart is the node set-up a cluster installer does (e.g. kind's
//! `containerd` config), not the kubelet.

use std::{fs, path::PathBuf};

use anyhow::Context as _;
use serde_json::json;

use super::{
    CgroupDriver, Paths,
    version::{ConfigFormat, Version},
};
use crate::images;

/// The CNI network the sandboxes join when they do not use the host's network.
const BRIDGE: &str = "swiftlet0";
const POD_SUBNET: &str = "10.88.0.0/16";

/// Writes config.toml and the CNI network for this instance.
pub(super) fn write(
    paths: &Paths,
    cgroup_driver: CgroupDriver,
    version: Version,
    crun: &std::path::Path,
) -> anyhow::Result<()> {
    for dir in [
        paths.root(),
        paths.run(),
        paths.runc_root(),
        paths.crun_root(),
        paths.certs_d(),
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
    let settings = Settings {
        root: quoted(paths.root())?,
        state: quoted(paths.run())?,
        socket: quoted(paths.socket())?,
        ttrpc: quoted(paths.ttrpc_socket())?,
        opt: quoted(paths.state.join("opt"))?,
        cni_conf_dir: quoted(paths.cni_conf_dir())?,
        runc_root: quoted(paths.runc_root())?,
        crun: quoted(crun.to_path_buf())?,
        crun_root: quoted(paths.crun_root())?,
        certs_d: quoted(paths.certs_d())?,
        restrict_oom_score_adj,
        systemd_cgroup: cgroup_driver == CgroupDriver::Systemd,
    };
    let config = match version.config_format() {
        ConfigFormat::V2 => version2(&settings),
        ConfigFormat::V3 => version3(&settings),
    };
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

/// What both formats say, each path already a quoted TOML string.
struct Settings {
    root: String,
    state: String,
    socket: String,
    ttrpc: String,
    opt: String,
    cni_conf_dir: String,
    runc_root: String,
    /// The crun binary and its state folder, for the `crun` handler.
    crun: String,
    crun_root: String,
    /// The registries' hosts folder (`<state>/certs.d`).
    certs_d: String,
    restrict_oom_score_adj: bool,
    systemd_cgroup: bool,
}

/// containerd 1.6 and 1.7: config version 2, one CRI plugin `io.containerd.grpc.v1.cri`.
fn version2(s: &Settings) -> String {
    format!(
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
    # Registries' hosts.toml (trusted CAs, mirrors), read at every pull: a test's local
    # registry puts its CA there.
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = {certs_d}
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
      # The second OCI runtime, for pods whose RuntimeClass names the handler `crun`: the same
      # shim, told to run crun instead of runc, with its own state folder.
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]
          BinaryName = {crun}
          Root = {crun_root}
          SystemdCgroup = {systemd_cgroup}
"#,
        root = s.root,
        state = s.state,
        socket = s.socket,
        ttrpc = s.ttrpc,
        opt = s.opt,
        pause = images::PAUSE,
        restrict_oom_score_adj = s.restrict_oom_score_adj,
        cni_conf_dir = s.cni_conf_dir,
        runc_root = s.runc_root,
        crun = s.crun,
        crun_root = s.crun_root,
        certs_d = s.certs_d,
        systemd_cgroup = s.systemd_cgroup,
    )
}

/// containerd 2.x: config version 3 (containerd 2.1's `containerd config default` and
/// docs/cri/config.md): the CRI plugin split into `io.containerd.cri.v1.images` (snapshotter,
/// the sandbox image as a pinned image) and `io.containerd.cri.v1.runtime` (runtimes, CNI with
/// `bin_dirs`), `io.containerd.grpc.v1.cri` keeping only the streaming server.
fn version3(s: &Settings) -> String {
    format!(
        r#"# Written by `cargo xtask` (xtask/src/containerd/config.rs) at every start; edits are lost.
version = 3
root = {root}
state = {state}
# Snapshotters this instance never uses; the CRI plugin uses overlayfs.
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {opt}
  # NRI is on by default in 2.x with a socket at /var/run/nri/nri.sock, which every instance on
  # the machine would share.
  [plugins."io.containerd.nri.v1.nri"]
    disable = true
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      # No registry is reachable: the sandbox image is the local one xtask imports; pinned, so
      # image GC (containerd's or the kubelet's) never takes it.
      sandbox = "{pause}"
    # Registries' hosts.toml (trusted CAs, mirrors), read at every pull: a test's local
    # registry puts its CA there.
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = {certs_d}
  [plugins."io.containerd.cri.v1.runtime"]
    restrict_oom_score_adj = {restrict_oom_score_adj}
    # Network namespaces under our state folder, where leftovers are ours to unmount.
    netns_mounts_under_state_dir = true
    # No CDI devices on these nodes: no spec folders to watch outside the state folder.
    enable_cdi = false
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = {cni_conf_dir}
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          # runc's state apart from any system containerd's, to find our leftovers.
          Root = {runc_root}
          # The driver swiftlet's cgroupDriver names: containers' cgroups as systemd scopes
          # below the pods' slices, or directories below the pods' cgroups.
          SystemdCgroup = {systemd_cgroup}
      # The second OCI runtime, for pods whose RuntimeClass names the handler `crun`: the same
      # shim, told to run crun instead of runc, with its own state folder.
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.crun]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.crun.options]
          BinaryName = {crun}
          Root = {crun_root}
          SystemdCgroup = {systemd_cgroup}
"#,
        root = s.root,
        state = s.state,
        socket = s.socket,
        ttrpc = s.ttrpc,
        opt = s.opt,
        pause = images::PAUSE,
        restrict_oom_score_adj = s.restrict_oom_score_adj,
        cni_conf_dir = s.cni_conf_dir,
        runc_root = s.runc_root,
        crun = s.crun,
        crun_root = s.crun_root,
        certs_d = s.certs_d,
        systemd_cgroup = s.systemd_cgroup,
    )
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

    fn settings(systemd_cgroup: bool) -> Settings {
        let q = |p: &str| serde_json::to_string(p).unwrap();
        Settings {
            root: q("/s/root"),
            state: q("/s/run"),
            socket: q("/s/containerd.sock"),
            ttrpc: q("/s/containerd.sock.ttrpc"),
            opt: q("/s/opt"),
            cni_conf_dir: q("/s/cni/net.d"),
            runc_root: q("/s/runc"),
            crun: q("/usr/bin/crun"),
            crun_root: q("/s/crun"),
            certs_d: q("/s/certs.d"),
            restrict_oom_score_adj: true,
            systemd_cgroup,
        }
    }

    /// The value at `path` (table names, then the key) in the parsed document, as TOML text.
    fn at(doc: &toml_edit::DocumentMut, path: &[&str]) -> String {
        let (key, tables) = path.split_last().unwrap();
        let mut table = doc.as_table();
        for name in tables {
            table = table
                .get(name)
                .and_then(toml_edit::Item::as_table)
                .unwrap_or_else(|| panic!("no table {name} on the way to {path:?}"));
        }
        let value = table
            .get(key)
            .and_then(toml_edit::Item::as_value)
            .unwrap_or_else(|| panic!("no key {path:?}"));
        match value {
            toml_edit::Value::String(s) => s.value().clone(),
            toml_edit::Value::Integer(i) => i.value().to_string(),
            toml_edit::Value::Boolean(b) => b.value().to_string(),
            toml_edit::Value::Array(a) => a
                .iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(","),
            other => panic!("unexpected {other:?} at {path:?}"),
        }
    }

    #[test]
    fn version_2_config_parses_and_names_the_cri_plugins_keys() {
        for systemd in [false, true] {
            let doc: toml_edit::DocumentMut = version2(&settings(systemd)).parse().unwrap();
            let cri = "io.containerd.grpc.v1.cri";
            assert_eq!(at(&doc, &["version"]), "2");
            assert_eq!(at(&doc, &["root"]), "/s/root");
            assert_eq!(at(&doc, &["grpc", "address"]), "/s/containerd.sock");
            assert_eq!(at(&doc, &["plugins", cri, "sandbox_image"]), images::PAUSE);
            assert_eq!(
                at(&doc, &["plugins", cri, "restrict_oom_score_adj"]),
                "true"
            );
            assert_eq!(
                at(&doc, &["plugins", cri, "cni", "conf_dir"]),
                "/s/cni/net.d"
            );
            assert_eq!(
                at(&doc, &["plugins", cri, "registry", "config_path"]),
                "/s/certs.d"
            );
            let runc = ["plugins", cri, "containerd", "runtimes", "runc", "options"];
            assert_eq!(at(&doc, &[&runc[..], &["Root"]].concat()), "/s/runc");
            assert_eq!(
                at(&doc, &[&runc[..], &["SystemdCgroup"]].concat()),
                systemd.to_string()
            );
            let crun = ["plugins", cri, "containerd", "runtimes", "crun", "options"];
            assert_eq!(
                at(&doc, &[&crun[..], &["BinaryName"]].concat()),
                "/usr/bin/crun"
            );
            assert_eq!(at(&doc, &[&crun[..], &["Root"]].concat()), "/s/crun");
            assert_eq!(
                at(&doc, &[&crun[..], &["SystemdCgroup"]].concat()),
                systemd.to_string()
            );
        }
    }

    #[test]
    fn version_3_config_parses_and_names_the_split_cri_plugins_keys() {
        for systemd in [false, true] {
            let doc: toml_edit::DocumentMut = version3(&settings(systemd)).parse().unwrap();
            let images_plugin = "io.containerd.cri.v1.images";
            let runtime = "io.containerd.cri.v1.runtime";
            assert_eq!(at(&doc, &["version"]), "3");
            assert_eq!(at(&doc, &["state"]), "/s/run");
            assert_eq!(at(&doc, &["ttrpc", "address"]), "/s/containerd.sock.ttrpc");
            assert_eq!(
                at(
                    &doc,
                    &["plugins", images_plugin, "pinned_images", "sandbox"]
                ),
                images::PAUSE
            );
            assert_eq!(
                at(&doc, &["plugins", images_plugin, "snapshotter"]),
                "overlayfs"
            );
            assert_eq!(
                at(&doc, &["plugins", images_plugin, "registry", "config_path"]),
                "/s/certs.d"
            );
            assert_eq!(
                at(&doc, &["plugins", runtime, "restrict_oom_score_adj"]),
                "true"
            );
            assert_eq!(
                at(&doc, &["plugins", runtime, "cni", "bin_dirs"]),
                "/usr/lib/cni"
            );
            assert_eq!(
                at(&doc, &["plugins", "io.containerd.nri.v1.nri", "disable"]),
                "true"
            );
            let runc = [
                "plugins",
                runtime,
                "containerd",
                "runtimes",
                "runc",
                "options",
            ];
            assert_eq!(at(&doc, &[&runc[..], &["Root"]].concat()), "/s/runc");
            assert_eq!(
                at(&doc, &[&runc[..], &["SystemdCgroup"]].concat()),
                systemd.to_string()
            );
            let crun = [
                "plugins",
                runtime,
                "containerd",
                "runtimes",
                "crun",
                "options",
            ];
            assert_eq!(
                at(&doc, &[&crun[..], &["BinaryName"]].concat()),
                "/usr/bin/crun"
            );
            assert_eq!(at(&doc, &[&crun[..], &["Root"]].concat()), "/s/crun");
            assert_eq!(
                at(&doc, &[&crun[..], &["SystemdCgroup"]].concat()),
                systemd.to_string()
            );
            // 1.x's single plugin's keys would be ignored by 2.x: none may be left.
            let plugins = doc["plugins"].as_table().unwrap();
            assert!(plugins.get("io.containerd.grpc.v1.cri").is_none());
        }
    }
}
