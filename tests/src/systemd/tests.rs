use std::path::{Path, PathBuf};

use super::{
    TARGET, first_child,
    hierarchies::{Hierarchy, HierarchyKind, cgroup_hierarchies, v1_controllers},
    init::{INIT_SCRIPT, init_args, owner, units},
    inside::socket_address,
};

const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

fn controllers() -> Vec<String> {
    ["cpu", "cpuacct", "cpuset", "memory", "pids"]
        .map(String::from)
        .to_vec()
}

fn v1(dir: &str, options: &str) -> Hierarchy {
    Hierarchy {
        dir: PathBuf::from(dir),
        kind: HierarchyKind::V1 {
            options: options.to_owned(),
        },
    }
}

#[test]
fn hybrid_hierarchies_keep_only_the_options_that_select_them() {
    let found = cgroup_hierarchies(HYBRID, &controllers());
    assert_eq!(
        found,
        vec![
            v1("cpu", "cpu"),
            v1("cpuset", "cpuset"),
            v1("memory", "memory"),
            v1("pids", "pids"),
            v1("systemd", "none,name=systemd"),
            Hierarchy {
                dir: PathBuf::from("unified"),
                kind: HierarchyKind::V2
            },
        ]
    );
    let args = init_args(&found, &[]);
    assert_eq!(args.first().map(String::as_str), Some("tmpfs"));
    assert_eq!(args.len(), 1 + 3 * found.len());
    assert!(args.windows(3).any(|w| w == ["v2", "unified", "-"]));
    assert!(
        args.windows(3)
            .any(|w| w == ["v1", "systemd", "none,name=systemd"])
    );
}

#[test]
fn a_pure_v2_host_is_one_hierarchy_mounted_over_the_tmpfs() {
    let mountinfo = "\
25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    let found = cgroup_hierarchies(mountinfo, &controllers());
    assert_eq!(
        found,
        vec![Hierarchy {
            dir: PathBuf::new(),
            kind: HierarchyKind::V2
        }]
    );
    assert!(found[0].holds("memory"));
    assert!(found[0].holds("systemd"));
    let links = [("cpu".to_owned(), "cpu,cpuacct".to_owned())];
    assert_eq!(init_args(&found, &links), vec!["unified"]);
}

#[test]
fn co_mounted_controllers_are_one_hierarchy_and_links_are_kept() {
    let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 / /sys/fs/cgroup/net_cls,net_prio rw - cgroup cgroup rw,net_cls,net_prio
";
    let found = cgroup_hierarchies(mountinfo, &controllers());
    // net_cls and net_prio are not among the enabled controllers given: not mounted.
    assert_eq!(found, vec![v1("cpu,cpuacct", "cpu,cpuacct")]);
    assert!(found[0].holds("cpuacct"));
    assert!(!found[0].holds("cpuset"));
    let links = [("cpu".to_owned(), "cpu,cpuacct".to_owned())];
    let args = init_args(&found, &links);
    assert_eq!(
        args,
        vec![
            "tmpfs",
            "v1",
            "cpu,cpuacct",
            "cpu,cpuacct",
            "link",
            "cpu",
            "cpu,cpuacct"
        ]
    );
}

#[test]
fn mounts_elsewhere_or_deeper_are_not_hierarchies_to_mount() {
    let mountinfo = "\
50 25 0:40 / /tmp/cg rw - cgroup2 cgroup2 rw
51 25 0:41 / /sys/fs/cgroup/memory/nested rw - cgroup cgroup rw,memory
52 25 0:42 / /sys/fs/cgroupx rw - cgroup2 cgroup2 rw
53 25 0:43 / /sys/fs/cgroup/unknown rw - cgroup cgroup rw,bogus
";
    assert!(cgroup_hierarchies(mountinfo, &controllers()).is_empty());
}

#[test]
fn the_later_of_two_mounts_on_one_point_wins_and_escapes_are_decoded() {
    let mountinfo = "\
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,xattr
37 31 0:34 / /sys/fs/cgroup/my\\040pids rw - cgroup cgroup rw,pids
";
    assert_eq!(
        cgroup_hierarchies(mountinfo, &controllers()),
        vec![v1("memory", "memory"), v1("my pids", "pids")]
    );
}

#[test]
fn only_enabled_controllers_count() {
    let proc_cgroups = "\
#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t103\t1
memory\t4\t406\t0
pids\t8\t124\t1
";
    assert_eq!(v1_controllers(proc_cgroups), vec!["cpuset", "pids"]);
}

#[test]
fn stale_leftovers_are_known_by_their_owners_pid() {
    assert_eq!(owner("swiftlet-systemd-4242-0-driver"), Some(4242));
    assert_eq!(owner("swiftlet-systemd-x-0-driver"), None);
    assert_eq!(owner("swiftlet-test-4242-0-x"), None);
    assert_eq!(owner("swiftlet-systemd-4242"), None);
}

#[test]
fn the_units_start_the_bus_without_the_hosts_targets() {
    let units = units(Path::new("/tmp/w"));
    let names: Vec<&str> = units.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, [TARGET, "dbus.socket", "dbus.service"]);
    assert!(units[0].1.contains("Wants=dbus.socket dbus.service"));
    for (name, text) in &units[1..] {
        assert!(
            text.contains("DefaultDependencies=no"),
            "{name} would need sysinit.target"
        );
    }
    assert!(
        units[1]
            .1
            .contains("ListenStream=/run/dbus/system_bus_socket")
    );
    assert!(
        units[2]
            .1
            .contains("ExecStart=/usr/bin/dbus-daemon --system")
    );
    assert!(units[2].1.contains("StandardError=append:/tmp/w/dbus.log"));
}

#[test]
fn socket_addresses_fit_or_are_refused() {
    let address = socket_address(Path::new("/proc/1/root/run/dbus/system_bus_socket"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(address.sun_family, libc::AF_UNIX as libc::sa_family_t);
    assert_eq!(address.sun_path[0], b'/' as libc::c_char);
    let long = format!("/{}", "x".repeat(200));
    assert!(socket_address(Path::new(&long)).is_err());
}

#[test]
fn the_init_is_the_first_child() {
    assert_eq!(first_child("4242 4250 "), Some(4242));
    assert_eq!(first_child(""), None);
    assert_eq!(first_child("x"), None);
}

#[test]
fn the_init_script_execs_systemd_last() {
    let last = INIT_SCRIPT.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("exec \"$SWIFTLET_SYSTEMD\" --system"));
    assert!(INIT_SCRIPT.starts_with("set -eu"));
}
