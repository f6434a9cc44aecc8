//! What `swiftlet run` does to its own process before anything else: the soft limit of open
//! descriptors raised to the hard one (the listeners' connection limits are derived from it), and
//! its own `oom_score_adj` set so the OOM killer takes pods before the agent.
//!
//! Upstream: `cmd/kubelet/app/server.go` `run` (`oomAdjuster.ApplyOOMScoreAdj(0,
//! kubeCfg.OOMScoreAdj)`, a warning on failure) and `RunKubelet` (`rlimit.SetNumFiles(
//! maxOpenFiles)`). Deviation: the kubelet sets both limits to `maxOpenFiles` (1,000,000), which
//! needs CAP_SYS_RESOURCE to raise the hard limit; swiftlet raises only the soft limit, which any
//! process may, so it works unprivileged too.

use std::path::Path;

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit in force.
pub fn raise_open_files_limit() -> u64 {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read RLIMIT_NOFILE; assuming 1024 descriptors");
            return 1024;
        }
    };
    if soft >= hard {
        tracing::info!(
            soft,
            hard,
            "open files limit (RLIMIT_NOFILE) already at its hard limit"
        );
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::info!(
                from = soft,
                to = hard,
                "raised the open files limit (RLIMIT_NOFILE) to its hard limit"
            );
            hard
        }
        Err(e) => {
            tracing::warn!(soft, hard, error = %e, "cannot raise the open files limit (RLIMIT_NOFILE)");
            soft
        }
    }
}

/// What setting the agent's own oom_score_adj came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OomScoreAdj {
    /// Written and read back.
    Set(i32),
    /// Could not be written; the value in force (if readable) and why.
    Refused {
        wanted: i32,
        current: Option<i32>,
        reason: String,
    },
}

/// Writes `value` to `proc_self/oom_score_adj` (normally `/proc/self`), saying once in the log
/// when it cannot (lowering it needs CAP_SYS_RESOURCE).
pub fn set_own_oom_score_adj(proc_self: &Path, value: i32) -> OomScoreAdj {
    let file = proc_self.join("oom_score_adj");
    let current = || {
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
    };
    match std::fs::write(&file, format!("{value}\n")) {
        Ok(()) => {
            let now = current();
            if now == Some(value) {
                tracing::info!(oom_score_adj = value, "set the agent's own oom_score_adj");
                return OomScoreAdj::Set(value);
            }
            let reason = format!("wrote {value}, read back {now:?}");
            tracing::warn!(wanted = value, current = ?now, "the agent's own oom_score_adj did not take: {reason}");
            OomScoreAdj::Refused {
                wanted: value,
                current: now,
                reason,
            }
        }
        Err(e) => {
            let now = current();
            let reason = if e.kind() == std::io::ErrorKind::PermissionDenied {
                format!(
                    "writing {}: {e} (lowering oom_score_adj needs CAP_SYS_RESOURCE, which this \
                     process lacks)",
                    file.display()
                )
            } else {
                format!("writing {}: {e}", file.display())
            };
            tracing::warn!(
                wanted = value,
                current = ?now,
                "cannot set the agent's own oom_score_adj: {reason}; the OOM killer may choose \
                 swiftlet before the pods it runs"
            );
            OomScoreAdj::Refused {
                wanted: value,
                current: now,
                reason,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_score_adj_is_written_and_read_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("oom_score_adj"), "0\n").expect("file");
        assert_eq!(
            set_own_oom_score_adj(dir.path(), -999),
            OomScoreAdj::Set(-999)
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("oom_score_adj")).expect("read"),
            "-999\n"
        );
    }

    #[test]
    fn a_refused_oom_score_adj_says_why_and_what_is_in_force() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A directory where the file should be: the write fails, as /proc refuses one.
        std::fs::create_dir(dir.path().join("oom_score_adj")).expect("dir");
        match set_own_oom_score_adj(dir.path(), -999) {
            OomScoreAdj::Refused {
                wanted,
                current,
                reason,
            } => {
                assert_eq!(wanted, -999);
                assert_eq!(current, None);
                assert!(reason.contains("oom_score_adj"), "{reason}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_soft_open_files_limit_ends_at_the_hard_one() {
        let soft = raise_open_files_limit();
        let (now, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        assert_eq!(soft, now);
        assert_eq!(now, hard);
    }
}
