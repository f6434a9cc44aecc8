//! The node's filesystem under attack, over the real container runtime and the node's real
//! mounts: an unprivileged local user swapping a downwardAPI volume's `..data` and planting links
//! in it while swiftlet rewrites it; a container swapping a subPath directory for a link to `/`
//! while another container of its pod restarts; a hostPath of `/` still working as asked; and
//! `fsGroup` owning emptyDir and downwardAPI volumes. Victims outside the pod are checked after
//! every round. Needs root and the private containerd.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::{
        fs::{MetadataExt as _, PermissionsExt as _},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use swiftlet_tests::{
    eventually,
    manifest::PodManifest,
    node::{Node, status},
};

/// The unprivileged local user of the attacks: a dedicated uid and gid no account uses, taken
/// by the attacker's processes with `setuid`/`setgid` (no supplementary groups).
const ATTACKER: u32 = 61_234;
/// Rounds of each attack (the issue asks for at least 1,000).
const ROUNDS: usize = 1000;
/// A bound on each attack, not a performance figure: a test that cannot finish fails.
const ATTACK_DEADLINE: Duration = Duration::from_secs(180);

fn node(test: &str, name: &str) -> Option<Node> {
    Node::for_test(test, name, &[])
}

fn mode(path: &Path) -> (u32, u32, u32) {
    let meta =
        std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    (meta.mode() & 0o7777, meta.uid(), meta.gid())
}

/// Deletes the pod and waits until its directory is gone.
fn delete(node: &Node, file: &str, name: &str, uid: &str) {
    node.remove_manifest(file);
    node.wait_gone(name);
    let dir = node.pod_dir(uid);
    eventually("the pod's directory is removed", || !dir.exists());
}

/// A shell run as the attacker.
fn as_attacker(script: &str) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(script)
        .uid(ATTACKER)
        .gid(ATTACKER)
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    cmd
}

/// A directory outside every pod's with a file and a subdirectory in it, watched with inotify:
/// any open, read, write, attribute change, creation, deletion or move there is an event.
struct Victim {
    dir: PathBuf,
    file: PathBuf,
    inotify: inotify::Inotify,
    before: Vec<(PathBuf, Facts)>,
}

/// (inode, size, mtime, ctime, mode) of a file.
type Facts = (u64, u64, i64, i64, u32);

impl Victim {
    fn new(at: &Path) -> Victim {
        let dir = at.join("victim");
        std::fs::create_dir_all(dir.join("sub")).expect("victim dir");
        let file = dir.join("secret");
        std::fs::write(&file, "keep").expect("victim file");
        std::fs::write(dir.join("sub/nested"), "keep").expect("victim file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let inotify = inotify::Inotify::init().expect("inotify");
        for watched in [dir.clone(), dir.join("sub")] {
            inotify
                .watches()
                .add(&watched, inotify::WatchMask::ALL_EVENTS)
                .expect("watch");
        }
        let mut victim = Victim {
            dir,
            file,
            inotify,
            before: Vec::new(),
        };
        victim.before = victim.snapshot();
        victim
    }

    /// (inode, size, mtime, ctime, mode) of everything, read with `lstat` (no inotify event).
    fn snapshot(&self) -> Vec<(PathBuf, Facts)> {
        [
            self.dir.clone(),
            self.file.clone(),
            self.dir.join("sub"),
            self.dir.join("sub/nested"),
        ]
        .into_iter()
        .map(|p| {
            let m = std::fs::symlink_metadata(&p)
                .unwrap_or_else(|e| panic!("the victim {} is gone: {e}", p.display()));
            let facts = (m.ino(), m.size(), m.mtime(), m.ctime(), m.mode());
            (p, facts)
        })
        .collect()
    }

    /// Fails the test if anything touched the victim since it was made.
    fn check(&mut self, round: usize) {
        let mut buffer = [0u8; 4096];
        match self.inotify.read_events(&mut buffer) {
            Ok(events) => {
                let seen: Vec<String> = events
                    .map(|e| format!("{:?} {:?}", e.mask, e.name))
                    .collect();
                assert!(
                    seen.is_empty(),
                    "round {round}: the victim was touched: {seen:?}"
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading inotify: {e}"),
        }
        assert_eq!(
            self.snapshot(),
            self.before,
            "round {round}: the victim changed"
        );
    }
}

/// A bind mount the test made, undone however the test ends.
struct BindGuard(PathBuf);

impl BindGuard {
    fn new(source: &Path, target: &Path) -> BindGuard {
        std::fs::create_dir_all(target).expect("bind target");
        nix::mount::mount(
            Some(source),
            target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .expect("bind mount");
        BindGuard(target.to_owned())
    }
}

impl Drop for BindGuard {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.0);
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn labelled_pod(label: usize) -> String {
    PodManifest::new("info")
        .metadata(&format!(
            "  uid: hostfs-attack-{pid}\n  labels:\n    round: \"{label}\"\n",
            pid = std::process::id()
        ))
        .restart("Always")
        .grace(1)
        .shell(
            "app",
            "exec sleep 3600",
            "      volumeMounts:\n        - name: info\n          mountPath: /info\n",
        )
        .volumes(
            "    - name: info
      downwardAPI:
        items:
          - path: labels
            fieldRef:
              fieldPath: metadata.labels
",
        )
        .yaml()
}

#[test]
fn an_unprivileged_user_swapping_data_never_reaches_outside_the_volume() {
    let Some(node) = node(
        "an_unprivileged_user_swapping_data_never_reaches_outside_the_volume",
        "fs-data",
    ) else {
        return;
    };
    node.write_manifest("info.yaml", &labelled_pod(0));
    node.wait_pod("info", "running", |p| {
        status::running(status::container(p, "app"))
    });
    let uid = node.pod_uid("info");
    let pod = node.pod_dir(&uid);
    let volume = pod.join("volumes/kubernetes.io~downward-api/info");
    eventually("the files are written", || volume.join("labels").exists());

    // The modes: every directory above the volume is root's, 0750, so the user reaches nothing.
    for dir in [
        node.dir().join("root"),
        node.dir().join("root/pods"),
        pod.clone(),
        pod.join("volumes"),
        pod.join("volumes/kubernetes.io~downward-api"),
    ] {
        assert_eq!(mode(&dir), (0o750, 0, 0), "{}", dir.display());
    }
    let (data_mode, _, _) = mode(&volume.join("..data/labels"));
    assert_eq!(data_mode, 0o644);
    let denied = as_attacker(&format!(
        "cat {v}/labels; ls {v}; ln -s /x {v}/planted",
        v = volume.display()
    ))
    .output()
    .expect("run the attacker");
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(!denied.status.success());
    assert!(denied.stdout.is_empty(), "{denied:?}");
    assert_eq!(
        stderr.matches("Permission denied").count(),
        3,
        "every access refused: {stderr}"
    );

    // To attack the writer itself, the test hands the volume to the user: its root becomes
    // theirs, reachable through a bind below a directory they may enter (as a node with a
    // careless mount would). swiftlet keeps rewriting it as the pod's labels change.
    let mut victim = Victim::new(node.dir());
    let reach = std::env::temp_dir().join(format!("swiftlet-attack-{}", std::process::id()));
    std::fs::create_dir_all(&reach).expect("mkdir");
    std::fs::set_permissions(&reach, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let handed = reach.join("vol");
    let _bind = BindGuard::new(&volume, &handed);
    std::os::unix::fs::chown(&volume, Some(ATTACKER), Some(ATTACKER)).expect("chown");

    let stop = Arc::new(AtomicBool::new(false));
    let editor = {
        let stop = stop.clone();
        let manifests = node.manifests.clone();
        let dir = node.dir().to_owned();
        std::thread::spawn(move || {
            let deadline = Instant::now() + ATTACK_DEADLINE;
            let mut label = 1;
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let tmp = dir.join(".info.yaml.tmp");
                std::fs::write(&tmp, labelled_pod(label)).expect("write");
                std::fs::rename(&tmp, manifests.join("info.yaml")).expect("rename");
                label += 1;
                // Longer than the static pod source's quiet window (50 ms), so that each edit
                // is an update of its own rather than part of one long burst.
                std::thread::sleep(Duration::from_millis(120));
            }
            label
        })
    };
    // Four attacks in turn, one per round: `..data` to the victim; the visible name and a new
    // name to the victim; the current payload directory moved away and its name made a link
    // to the victim (so `..data` leads there through a `..<timestamp>` name); `..data_tmp` to
    // the victim.
    let script = format!(
        "V={v}; T={t}; while read i; do case $((i % 4)) in \
         0) ln -sfn \"$T\" \"$V/..data\" ;; \
         1) ln -sfn \"$T/secret\" \"$V/labels\"; ln -sfn \"$T\" \"$V/planted$i\" ;; \
         2) d=$(readlink \"$V/..data\"); if [ -n \"$d\" ]; then mv -f \"$V/$d\" \"$V/stolen$i\"; ln -sfn \"$T\" \"$V/$d\"; fi ;; \
         3) ln -sfn \"$T\" \"$V/..data_tmp\" ;; \
         esac 2>/dev/null; echo \"$i\"; done",
        v = handed.display(),
        t = victim.dir.display()
    );
    let mut attacker = as_attacker(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the attacker");
    let mut to_attacker = attacker.stdin.take().expect("stdin");
    let mut from_attacker = BufReader::new(attacker.stdout.take().expect("stdout"));
    let mut payloads = BTreeSet::new();
    // Rounds after which a planted link was in place (the attacks did land).
    let mut landed = 0;
    let deadline = Instant::now() + ATTACK_DEADLINE;
    let mut rounds = 0;
    while rounds < ROUNDS && Instant::now() < deadline {
        writeln!(to_attacker, "{rounds}").expect("to the attacker");
        let mut line = String::new();
        from_attacker
            .read_line(&mut line)
            .expect("from the attacker");
        assert_eq!(line.trim(), rounds.to_string(), "the attacker's round");
        victim.check(rounds);
        let planted = |name: &str| {
            std::fs::read_link(volume.join(name)).is_ok_and(|t| t.starts_with(&victim.dir))
        };
        if planted("..data") || planted("labels") || planted("..data_tmp") {
            landed += 1;
        }
        // Each rewrite leaves its payload directory in the volume until the next one; the
        // attacker's `..<timestamp>` names are links, never directories.
        payloads.extend(
            std::fs::read_dir(&volume)
                .expect("list the volume")
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("..1")),
        );
        rounds += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(to_attacker);
    let _ = attacker.wait();
    stop.store(true, Ordering::Relaxed);
    let last_label = editor.join().expect("the editor") - 1;
    eprintln!(
        "{rounds} rounds, {landed} with a planted link in place, {} payload directories \
         written by swiftlet meanwhile, {last_label} label edits",
        payloads.len()
    );
    assert_eq!(rounds, ROUNDS, "rounds done before the deadline");
    assert!(
        landed > 0,
        "no attack ever landed: the test attacked nothing"
    );
    // swiftlet rewrote the volume all along (each rewrite is a new payload directory).
    assert!(
        payloads.len() >= 20,
        "only {} payload directories seen",
        payloads.len()
    );

    // Afterwards the volume is swiftlet's again: `..data` names a payload directory of the
    // volume holding the last labels, the planted names are gone, the victim is whole.
    // Read without following any link the attacker may have left: the names must be
    // swiftlet's links, and the payload directory a directory, before its file is read (reading
    // `labels` while it still led to the victim was the test itself touching the victim).
    eventually("the last labels are written", || {
        let Ok(data) = std::fs::read_link(volume.join("..data")) else {
            return false;
        };
        data.to_string_lossy().starts_with("..1")
            && std::fs::read_link(volume.join("labels"))
                .is_ok_and(|t| t == Path::new("..data/labels"))
            && std::fs::symlink_metadata(volume.join(&data)).is_ok_and(|m| m.is_dir())
            && std::fs::symlink_metadata(volume.join(&data).join("labels"))
                .is_ok_and(|m| m.is_file())
            && std::fs::read_to_string(volume.join(&data).join("labels"))
                .is_ok_and(|l| l == format!("round=\"{last_label}\""))
    });
    victim.check(rounds);
    assert_eq!(
        std::fs::read_to_string(&victim.file).expect("the victim"),
        "keep"
    );
    assert!(status::running(status::container(
        &node.pod("info").expect("listed"),
        "app"
    )));
    drop(_bind);
    delete(&node, "info.yaml", "info", &uid);
    assert_eq!(
        std::fs::read_to_string(&victim.file).expect("the victim"),
        "keep"
    );
}

#[test]
fn a_sub_path_swapped_for_a_link_to_root_never_shows_the_node() {
    let Some(node) = node(
        "a_sub_path_swapped_for_a_link_to_root_never_shows_the_node",
        "fs-subpath",
    ) else {
        return;
    };
    // A name that would appear in the node's `/` if swiftlet ever made the subPath through the
    // link.
    let probe = format!("swiftlet-subpath-probe-{}", std::process::id());
    let victim = Victim::new(node.dir());
    let swapper = format!(
        "P={probe}; mkdir -p /vol/d/$P; touch /vol/d/$P/inside; s=0; i=0; \
         while [ ! -e /vol/stop ]; do \
           rmdir /vol/sub/$P /vol/sub 2>/dev/null; \
           mv /vol/d /vol/sub 2>/dev/null; mv /vol/sub /vol/d 2>/dev/null; \
           ln -s / /vol/sub 2>/dev/null && s=$((s+1)); rm /vol/sub 2>/dev/null; \
           i=$((i+1)); if [ $((i % 50)) -eq 0 ]; then echo $s > /vol/count.tmp; mv /vol/count.tmp /vol/count; fi; \
         done; exec sleep 3600"
    );
    let app = "if [ -e /data/usr/lib ] || [ -e /data/proc/self ]; then echo HOST >> /report/seen; \
               elif [ -e /data/inside ]; then echo vol >> /report/seen; \
               else echo empty >> /report/seen; fi; exit 0";
    node.write_manifest(
        "swap.yaml",
        &PodManifest::new("swap")
            .restart("Always")
            .grace(1)
            .shell(
                "swapper",
                &swapper,
                "      volumeMounts:
        - name: work
          mountPath: /vol
",
            )
            .shell(
                "app",
                app,
                &format!(
                    "      volumeMounts:
        - name: work
          mountPath: /data
          subPath: sub/{probe}
        - name: report
          mountPath: /report
"
                ),
            )
            .volumes(
                "    - name: work
      emptyDir: {}
    - name: report
      emptyDir: {}
",
            )
            .yaml(),
    );
    node.wait_pod("swap", "the swapper running", |p| {
        status::running(status::container(p, "swapper"))
    });
    let uid = node.pod_uid("swap");
    let work = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~empty-dir/work");
    let seen_file = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~empty-dir/report/seen");
    let swaps = || {
        std::fs::read_to_string(work.join("count"))
            .ok()
            .and_then(|c| c.trim().parse::<usize>().ok())
            .unwrap_or(0)
    };
    let runs = || {
        std::fs::read_to_string(&seen_file)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    // Each start of the app either runs it (it reports what it saw) or fails before the
    // container exists, the subPath refused ("failed to prepare subPath", retried by the pod
    // worker after its back-off). The attack goes on for at least 1,000 swaps and two starts;
    // whether a start under attack runs or is refused is the swapper's timing.
    let refusals = |node: &Node| {
        node.log_lines()
            .iter()
            .filter(|l| {
                l.contains("error syncing pod")
                    && l.contains(
                        "failed to prepare subPath for volumeMount \"work\" of container \"app\"",
                    )
            })
            .count()
    };
    let mut refused = 0;
    let deadline = Instant::now() + ATTACK_DEADLINE;
    while (swaps() < ROUNDS || runs() + refused < 2) && Instant::now() < deadline {
        refused += refusals(&node);
        assert!(
            !Path::new("/").join(&probe).exists(),
            "swiftlet made the subPath in the node's /"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (swapped, runs_under_attack, refused_under_attack) = (swaps(), runs(), refused);
    // Then the swapper stops, leaving no link: the app's next start runs. Its refusals were
    // the attack's doing, not a subPath swiftlet can no longer make.
    std::fs::write(work.join("stop"), "").expect("stop the swapper");
    while runs() < 1 && Instant::now() < deadline {
        refused += refusals(&node);
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = std::fs::read_to_string(&seen_file).unwrap_or_default();
    eprintln!(
        "{swapped} swaps to a link to /; under attack {runs_under_attack} runs of the app and \
         {refused_under_attack} starts refused; {} runs in all ({:?}), {refused} refused",
        runs(),
        seen.lines().collect::<Vec<_>>()
    );
    assert!(swapped >= ROUNDS, "only {swapped} swaps");
    assert!(
        runs_under_attack + refused_under_attack >= 2,
        "the app was started {} times under attack",
        runs_under_attack + refused_under_attack
    );
    assert!(
        runs() >= 1,
        "the app never ran ({seen}), {refused} starts refused"
    );
    assert!(
        seen.lines().all(|l| l == "vol" || l == "empty"),
        "the app saw: {seen}"
    );
    assert!(!Path::new("/").join(&probe).exists());
    let mut victim = victim;
    victim.check(ROUNDS);
    delete(&node, "swap.yaml", "swap", &uid);
}

#[test]
fn a_host_path_of_the_root_is_still_what_the_pod_asked_for() {
    let Some(node) = node(
        "a_host_path_of_the_root_is_still_what_the_pod_asked_for",
        "fs-hostroot",
    ) else {
        return;
    };
    let marker = node.dir().join("marker");
    std::fs::write(&marker, "seen-from-the-pod").expect("marker");
    let shared = node.dir().join("hp");
    std::fs::create_dir_all(&shared).expect("mkdir");
    let relative = shared
        .strip_prefix("/")
        .expect("absolute")
        .to_string_lossy()
        .into_owned();
    let ro_probe = node.dir().join("ro-probe");
    let command = format!(
        "[ \"$(cat /host{m})\" = seen-from-the-pod ] || exit 3; \
         if touch /host{r} 2>/dev/null; then exit 4; fi; \
         echo w > /sub/written || exit 5; touch /tmp/checked; exec sleep 3600",
        m = marker.display(),
        r = ro_probe.display()
    );
    node.write_manifest(
        "root.yaml",
        &PodManifest::new("root")
            .restart("Never")
            .grace(1)
            .shell(
                "app",
                &command,
                &format!(
                    "      volumeMounts:
        - name: node
          mountPath: /host
          readOnly: true
        - name: node
          mountPath: /sub
          subPath: {relative}
      readinessProbe:
        exec:
          command: [\"cat\", \"/tmp/checked\"]
        periodSeconds: 1
        failureThreshold: 1
"
                ),
            )
            .volumes(
                "    - name: node
      hostPath:
        path: /
",
            )
            .yaml(),
    );
    let pod = node.wait_pod("root", "the container's checks passed", |p| {
        status::container(p, "app").is_some_and(|c| c.ready)
            || status::terminated(status::container(p, "app")).is_some()
    });
    // 3: the node's file not seen; 4: the read-only mount took a write; 5: the subPath of the
    // node's `/` not writable.
    assert_eq!(status::terminated(status::container(&pod, "app")), None);
    assert_eq!(
        std::fs::read_to_string(shared.join("written")).expect("written through the subPath"),
        "w\n"
    );
    assert!(!ro_probe.exists());
    let uid = node.pod_uid("root");
    delete(&node, "root.yaml", "root", &uid);
    assert_eq!(
        std::fs::read_to_string(&marker).expect("the node's file stays"),
        "seen-from-the-pod"
    );
    assert!(shared.join("written").exists(), "the node's files stay");
}

#[test]
fn an_fs_group_owns_empty_dir_and_downward_api_volumes() {
    let Some(node) = node(
        "an_fs_group_owns_empty_dir_and_downward_api_volumes",
        "fs-group",
    ) else {
        return;
    };
    let command = "[ \"$(stat -c %g /cache)\" = 4242 ] || exit 3; \
                   touch /cache/made; [ \"$(stat -c %g /cache/made)\" = 4242 ] || exit 4; \
                   [ \"$(stat -L -c %g /info/labels)\" = 4242 ] || exit 5; \
                   touch /tmp/checked; exec sleep 3600";
    node.write_manifest(
        "group.yaml",
        &PodManifest::new("group")
            .metadata("  labels:\n    app: g\n")
            .restart("Never")
            .grace(1)
            .spec("  securityContext:\n    fsGroup: 4242\n")
            .shell(
                "app",
                command,
                "      volumeMounts:
        - name: cache
          mountPath: /cache
        - name: info
          mountPath: /info
      readinessProbe:
        exec:
          command: [\"cat\", \"/tmp/checked\"]
        periodSeconds: 1
        failureThreshold: 1
",
            )
            .volumes(
                "    - name: cache
      emptyDir: {}
    - name: info
      downwardAPI:
        items:
          - path: labels
            fieldRef:
              fieldPath: metadata.labels
",
            )
            .yaml(),
    );
    let pod = node.wait_pod("group", "the container's checks passed", |p| {
        status::container(p, "app").is_some_and(|c| c.ready)
            || status::terminated(status::container(p, "app")).is_some()
    });
    // 3: the emptyDir's group; 4: a new file's group (setgid); 5: the downwardAPI file's group.
    assert_eq!(status::terminated(status::container(&pod, "app")), None);
    let uid = node.pod_uid("group");
    let volumes = node.pod_dir(&uid).join("volumes");
    let cache = volumes.join("kubernetes.io~empty-dir/cache");
    // 0777 + the group's read and write, search, setgid (upstream's rwMask, execMask).
    assert_eq!(mode(&cache), (0o2777, 0, 4242));
    assert_eq!(mode(&cache.join("made")).2, 4242);
    let info = volumes.join("kubernetes.io~downward-api/info");
    let data = std::fs::read_link(info.join("..data")).expect("..data");
    assert_eq!(mode(&info.join(&data)), (0o2755, 0, 4242));
    assert_eq!(mode(&info.join(&data).join("labels")), (0o644, 0, 4242));
    let (root_mode, _, root_gid) = mode(&info);
    assert_eq!(root_gid, 4242);
    assert_eq!(root_mode & 0o2550, 0o2550);
    delete(&node, "group.yaml", "group", &uid);
}
