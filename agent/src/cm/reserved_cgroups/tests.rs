use std::{fs, path::Path};

use super::*;

const GI: i64 = 1 << 30;

fn reserved(name: &str, compressible_only: bool) -> ReservedCgroup {
    ReservedCgroup {
        field: "systemReservedCgroup",
        enforcement: if compressible_only {
            "system-reserved-compressible"
        } else {
            "system-reserved"
        },
        name: name.to_owned(),
        cpu_millis: Some(500),
        memory_bytes: (!compressible_only).then_some(GI),
        pids: (!compressible_only).then_some(1000),
    }
}

/// A cgroup2 hierarchy with `cpu memory pids` and cgroup `dir` holding their files at their
/// kernel defaults.
fn unified(root: &Path, dir: &str) -> CgroupLayout {
    fs::create_dir_all(root).unwrap();
    fs::write(
        root.join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    )
    .unwrap();
    let cg = root.join(dir);
    fs::create_dir_all(&cg).unwrap();
    for (file, value) in [
        ("cpu.weight", "100"),
        ("memory.max", "max"),
        ("pids.max", "max"),
    ] {
        fs::write(cg.join(file), value).unwrap();
    }
    CgroupLayout::Unified {
        root: root.to_owned(),
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap()
}

#[test]
fn a_full_reservation_sets_weight_memory_and_pids_on_v2() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = unified(tmp.path(), "system.slice");
    enforce(
        &layout,
        CgroupDriver::Systemd,
        &reserved("/system.slice", false),
    )
    .unwrap();
    let cg = tmp.path().join("system.slice");
    // 500m → 512 shares → weight 20 (runc's conversion).
    assert_eq!(read(&cg.join("cpu.weight")), "20");
    assert_eq!(read(&cg.join("memory.max")), GI.to_string());
    assert_eq!(read(&cg.join("pids.max")), "1000");
}

#[test]
fn compressible_writes_the_cpu_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = unified(tmp.path(), "kube/daemons");
    enforce(
        &layout,
        CgroupDriver::Cgroupfs,
        &reserved("/kube/daemons", true),
    )
    .unwrap();
    let cg = tmp.path().join("kube/daemons");
    assert_eq!(read(&cg.join("cpu.weight")), "20");
    assert_eq!(read(&cg.join("memory.max")), "max");
    assert_eq!(read(&cg.join("pids.max")), "max");
}

#[test]
fn unlisted_and_zero_resources_are_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = unified(tmp.path(), "sys");
    let cgroup = ReservedCgroup {
        cpu_millis: None,
        memory_bytes: Some(0),
        pids: None,
        ..reserved("/sys", false)
    };
    enforce(&layout, CgroupDriver::Cgroupfs, &cgroup).unwrap();
    let cg = tmp.path().join("sys");
    assert_eq!(read(&cg.join("cpu.weight")), "100");
    assert_eq!(read(&cg.join("memory.max")), "max");
    assert_eq!(read(&cg.join("pids.max")), "max");
}

#[test]
fn v1_hierarchies_get_shares_and_limit_in_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let v1_root = tmp.path().join("v1");
    let unified_root = tmp.path().join("unified");
    fs::create_dir_all(&unified_root).unwrap();
    fs::write(unified_root.join("cgroup.controllers"), "hugetlb\n").unwrap();
    for (controller, file, value) in [
        ("cpu", "cpu.shares", "1024"),
        ("memory", "memory.limit_in_bytes", "9223372036854771712"),
        ("pids", "pids.max", "max"),
    ] {
        let mount = v1_root.join(controller);
        fs::create_dir_all(mount.join("sys")).unwrap();
        fs::write(mount.join("cgroup.procs"), "").unwrap();
        fs::write(mount.join("sys").join(file), value).unwrap();
    }
    let layout = CgroupLayout::Hybrid {
        unified: unified_root,
        v1_root: v1_root.clone(),
    };
    enforce(&layout, CgroupDriver::Cgroupfs, &reserved("/sys", false)).unwrap();
    assert_eq!(read(&v1_root.join("cpu/sys/cpu.shares")), "512");
    assert_eq!(
        read(&v1_root.join("memory/sys/memory.limit_in_bytes")),
        GI.to_string()
    );
    assert_eq!(read(&v1_root.join("pids/sys/pids.max")), "1000");
}

#[test]
fn a_missing_cgroup_names_the_field_and_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = unified(tmp.path(), "other");
    let err = enforce(
        &layout,
        CgroupDriver::Cgroupfs,
        &reserved("/system.slice", false),
    )
    .unwrap_err();
    assert!(matches!(err.problem, Problem::Missing { .. }), "{err:?}");
    let message = err.to_string();
    let path = tmp.path().join("system.slice");
    assert!(message.contains("systemReservedCgroup"), "{message}");
    assert!(message.contains("system-reserved"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
}

#[test]
fn a_link_on_the_way_is_refused_not_followed() {
    // Attack: something able to write below the cgroup root plants a link where the reserved
    // cgroup's parent should be, pointing at files swiftlet must not write (outside the cgroup
    // filesystem, e.g. /etc). The write is refused and the target keeps its contents.
    let tmp = tempfile::tempdir().unwrap();
    let layout = unified(&tmp.path().join("root"), "placeholder");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(outside.join("sys")).unwrap();
    fs::write(outside.join("sys/cpu.weight"), "precious").unwrap();
    std::os::unix::fs::symlink(&outside, tmp.path().join("root/kube")).unwrap();
    let err = enforce(
        &layout,
        CgroupDriver::Cgroupfs,
        &reserved("/kube/sys", true),
    )
    .unwrap_err();
    assert!(
        matches!(err.problem, Problem::Fs(hostfs::Error::Symlink { .. })),
        "{err:?}"
    );
    assert_eq!(read(&outside.join("sys/cpu.weight")), "precious");

    // The cgroup's own file a link: refused as well.
    let cg = tmp.path().join("root/placeholder");
    fs::remove_file(cg.join("memory.max")).unwrap();
    fs::write(outside.join("memory"), "precious").unwrap();
    std::os::unix::fs::symlink(outside.join("memory"), cg.join("memory.max")).unwrap();
    let err = enforce(
        &layout,
        CgroupDriver::Cgroupfs,
        &reserved("/placeholder", false),
    )
    .unwrap_err();
    assert!(matches!(err.problem, Problem::Fs(_)), "{err:?}");
    assert_eq!(read(&outside.join("memory")), "precious");
}

#[test]
fn a_fifo_in_place_of_a_file_does_not_block_the_start() {
    // Attack: a FIFO where `pids.max` should be would hang a blocking open for writing.
    let tmp = tempfile::tempdir().unwrap();
    let layout = unified(tmp.path(), "sys");
    let fifo = tmp.path().join("sys/pids.max");
    fs::remove_file(&fifo).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let err = enforce(&layout, CgroupDriver::Cgroupfs, &reserved("/sys", false)).unwrap_err();
    assert!(matches!(err.problem, Problem::Fs(_)), "{err:?}");
}

#[test]
fn the_root_cgroup_takes_no_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = unified(tmp.path(), "sys");
    let err = enforce(&layout, CgroupDriver::Systemd, &reserved("/-.slice", false)).unwrap_err();
    assert!(matches!(err.problem, Problem::Root), "{err:?}");
}
