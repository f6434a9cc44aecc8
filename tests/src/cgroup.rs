//! Test cgroups: created fresh under the cgroup2 mount (and, on a hybrid layout, in the v1
//! memory hierarchy when a memory limit is wanted), and removed on drop, after killing whatever
//! still runs in them, even when the test failed.

use std::{
    fs,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use swiftlet::cm::CgroupLayout;

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct TestCgroup {
    /// The cgroup2 directory.
    pub dir: PathBuf,
    /// The v1 memory cgroup holding the limit, on hybrid layouts.
    memory_v1: Option<PathBuf>,
    /// Relative to the cgroup2 mount, starting with `/`.
    pub path: String,
}

impl TestCgroup {
    /// A fresh cgroup directly under the cgroup2 root.
    pub fn new(name: &str) -> TestCgroup {
        let layout = CgroupLayout::detect().expect("cgroup layout");
        let root = layout.cgroup2_root().expect("a cgroup2 mount").to_owned();
        let unique = format!(
            "swiftlet-test-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self::create(&root, &root.join(unique))
    }

    /// A child of this cgroup (its removal is up to the caller or this guard's drop).
    pub fn child(&self, name: &str) -> TestCgroup {
        let root = self.cgroup2_root();
        Self::create(&root, &self.dir.join(name))
    }

    /// A sibling whose name extends this one's (e.g. `/a` and `/ax`): the filter must not confuse
    /// a path prefix with a parent.
    pub fn prefix_sibling(&self, suffix: &str) -> TestCgroup {
        let root = self.cgroup2_root();
        let mut name = self.dir.file_name().unwrap_or_default().to_os_string();
        name.push(suffix);
        Self::create(&root, &self.dir.with_file_name(name))
    }

    /// A fresh cgroup whose memory is limited to `limit` bytes (without swap), on either layout.
    pub fn with_memory_limit(name: &str, limit: u64) -> TestCgroup {
        let layout = CgroupLayout::detect().expect("cgroup layout");
        let mut cgroup = Self::new(name);
        match layout.v1_controller("memory").filter(|p| p.exists()) {
            Some(memory_root) => {
                let dir = memory_root.join(cgroup.dir.file_name().unwrap_or_default());
                fs::create_dir(&dir).expect("create the v1 memory cgroup");
                write(&dir.join("memory.limit_in_bytes"), &limit.to_string());
                if dir.join("memory.memsw.limit_in_bytes").exists() {
                    write(&dir.join("memory.memsw.limit_in_bytes"), &limit.to_string());
                }
                cgroup.memory_v1 = Some(dir);
            }
            None => {
                let parent = cgroup
                    .dir
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                let control = parent.join("cgroup.subtree_control");
                if !fs::read_to_string(&control)
                    .unwrap_or_default()
                    .contains("memory")
                {
                    write(&control, "+memory");
                }
                write(&cgroup.dir.join("memory.max"), &limit.to_string());
                if cgroup.dir.join("memory.swap.max").exists() {
                    write(&cgroup.dir.join("memory.swap.max"), "0");
                }
            }
        }
        cgroup
    }

    fn create(root: &Path, dir: &Path) -> TestCgroup {
        fs::create_dir(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let rel = dir.strip_prefix(root).expect("under the cgroup2 root");
        TestCgroup {
            dir: dir.to_owned(),
            memory_v1: None,
            path: format!("/{}", rel.display()),
        }
    }

    fn cgroup2_root(&self) -> PathBuf {
        let depth = self.path.matches('/').count();
        let mut root = self.dir.clone();
        for _ in 0..depth {
            root.pop();
        }
        root
    }

    /// The cgroup2 id: the inode number of the directory.
    pub fn id(&self) -> u64 {
        fs::metadata(&self.dir).expect("stat cgroup").ino()
    }

    /// Starts `command` inside this cgroup (and its v1 memory cgroup): the child moves itself in
    /// between fork and exec, so everything it runs, its exec included, happens inside.
    pub fn spawn(&self, command: &mut Command) -> Child {
        let mut procs = vec![open_procs(&self.dir)];
        if let Some(memory) = &self.memory_v1 {
            procs.push(open_procs(memory));
        }
        let fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
        // SAFETY: the closure runs between fork and exec and only calls write(2) on fds opened
        // before the fork, which is async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                for fd in &fds {
                    if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("spawn in the test cgroup");
        drop(procs);
        child
    }

    /// Pids currently in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for dir in std::iter::once(&self.dir).chain(self.memory_v1.iter()) {
            remove_tree(dir);
        }
    }
}

/// Kills everything in `dir` and its children, then removes them, deepest first.
pub(crate) fn remove_tree(dir: &Path) {
    if !dir.exists() {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&entry.path());
            }
        }
    }
    for _ in 0..100 {
        let pids: Vec<i32> = fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if fs::remove_dir(dir).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("warning: could not remove test cgroup {}", dir.display());
}

fn open_procs(dir: &Path) -> fs::File {
    fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))
        .unwrap_or_else(|e| panic!("open {}/cgroup.procs: {e}", dir.display()))
}

fn write(path: &Path, value: &str) {
    fs::write(path, value).unwrap_or_else(|e| panic!("write {value} to {}: {e}", path.display()));
}
