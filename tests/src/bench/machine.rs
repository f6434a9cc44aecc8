//! What the numbers were measured on, so that results from different machines are not compared
//! unknowingly.

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// As `uname -r` prints it.
    pub kernel_release: String,
    /// CPUs this process may run on (what the storm scenario sizes its parallelism to).
    pub cpus: usize,
    pub cpu_model: String,
}

impl Machine {
    pub fn detect() -> Machine {
        Machine {
            // The same string uname(2) returns as `release`, without a syscall wrapper.
            kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".into()),
            cpus: cpus(),
            cpu_model: std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|info| cpu_model(&info))
                .unwrap_or_else(|| "unknown".into()),
        }
    }
}

impl Machine {
    /// `Machine: Linux <release>, <n> CPUs, <model>; <date>`: the line above a report's table.
    pub fn line(&self, date: &str) -> String {
        format!(
            "Machine: Linux {}, {} CPUs, {}; {date}",
            self.kernel_release, self.cpus, self.cpu_model
        )
    }
}

/// CPUs available to this process (its affinity mask and cgroup quota included).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The first CPU's model from `/proc/cpuinfo`: `model name` on x86, and on arm64 (which has no
/// model name) the `Hardware` or `CPU part` line.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    ["model name", "Hardware", "CPU part"]
        .iter()
        .find_map(|key| {
            cpuinfo.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                (name.trim() == *key).then(|| value.trim().to_owned())
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_model_from_cpuinfo() {
        let x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) \
                   Processor\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            cpu_model(x86).as_deref(),
            Some("Intel(R) Xeon(R) Processor")
        );
        let arm = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n";
        assert_eq!(cpu_model(arm).as_deref(), Some("0xd0c"));
        assert_eq!(cpu_model(""), None);
    }
}
