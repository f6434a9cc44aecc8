//! CPU requests and limits as cgroup values (upstream `pkg/kubelet/cm/helpers_linux.go`
//! `MilliCPUToShares`, `MilliCPUToQuota`; runc's `ConvertCPUSharesToCgroupV2Value`): one
//! conversion for the containers' CRI resources (`kuberuntime::container_config`), the pod
//! cgroups and the QoS levels (`pod_cgroups`), and the systemd slices (`systemd`).

/// The CFS period the kubelet uses unless `cpuCFSQuotaPeriod` says otherwise (100 ms).
pub const CPU_PERIOD_US: i64 = 100_000;
/// The smallest CPU shares value (upstream `MinShares`).
pub const MIN_SHARES: i64 = 2;
/// The largest CPU shares value (upstream `MaxShares`, the kernel's).
pub const MAX_SHARES: i64 = 262_144;
/// The smallest CFS quota, and the smallest `cpuCFSQuotaPeriod` (upstream `MinQuotaPeriod`, 1 ms).
pub const MIN_QUOTA_US: i64 = 1_000;
/// The largest `cpuCFSQuotaPeriod` upstream's validation accepts (1 s), also the kernel's.
pub const MAX_QUOTA_PERIOD_US: i64 = 1_000_000;

/// 1024 shares per CPU, within [`MIN_SHARES`]..=[`MAX_SHARES`] (upstream `MilliCPUToShares`).
pub fn milli_cpu_to_shares(millis: i64) -> i64 {
    if millis <= 0 {
        return MIN_SHARES;
    }
    (millis.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// The CFS quota for a limit of `millis` in periods of `period_us`, at least 1 ms; 0 for no
/// limit (upstream `MilliCPUToQuota`).
pub fn milli_cpu_to_quota(millis: i64, period_us: i64) -> i64 {
    if millis <= 0 {
        return 0;
    }
    (millis.saturating_mul(period_us) / 1000).max(MIN_QUOTA_US)
}

/// CPU shares as cgroup v2's `cpu.weight`: shares 2..262144 onto weight 1..10000 (runc's
/// `ConvertCPUSharesToCgroupV2Value`, which the runtime applies to the containers' shares; 0
/// stays "unset").
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + (shares.clamp(2, MAX_SHARES as u64) - 2) * 9999 / 262_142
}

/// How CPU limits become CFS quotas (`cpuCFSQuota`, `cpuCFSQuotaPeriod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CfsQuota {
    /// `cpuCFSQuota`: false leaves every container and pod without a quota.
    pub enforce: bool,
    /// `cpuCFSQuotaPeriod` in µs, within [`MIN_QUOTA_US`]..=[`MAX_QUOTA_PERIOD_US`] (the
    /// config's validation sees to it).
    pub period_us: i64,
}

impl Default for CfsQuota {
    fn default() -> Self {
        CfsQuota {
            enforce: true,
            period_us: CPU_PERIOD_US,
        }
    }
}

impl CfsQuota {
    /// The quota of a CPU limit of `millis`: `None` when quotas are not enforced.
    pub fn quota_for(&self, millis: i64) -> Option<i64> {
        self.enforce
            .then(|| milli_cpu_to_quota(millis, self.period_us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_quotas_match_upstreams_numbers() {
        // helpers_linux_test.go's `TestMilliCPUToShares` and `TestMilliCPUToQuota` cases.
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(500_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(0, 100_000), 0);
        assert_eq!(milli_cpu_to_quota(5, 100_000), 1_000);
        assert_eq!(milli_cpu_to_quota(9, 100_000), 1_000);
        assert_eq!(milli_cpu_to_quota(10, 100_000), 1_000);
        assert_eq!(milli_cpu_to_quota(100, 100_000), 10_000);
        assert_eq!(milli_cpu_to_quota(200, 100_000), 20_000);
        assert_eq!(milli_cpu_to_quota(1_000, 100_000), 100_000);
        assert_eq!(milli_cpu_to_quota(1_500, 100_000), 150_000);
        assert_eq!(milli_cpu_to_quota(100, 50_000), 5_000);
        assert_eq!(milli_cpu_to_quota(1_500, 5_000), 7_500);
        assert_eq!(milli_cpu_to_quota(10, 5_000), 1_000);
    }

    #[test]
    fn weights_follow_runc() {
        assert_eq!(shares_to_weight(0), 0);
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(102), 4);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(u64::MAX), 10_000);
    }

    #[test]
    fn no_quota_without_enforcement() {
        let off = CfsQuota {
            enforce: false,
            period_us: CPU_PERIOD_US,
        };
        assert_eq!(off.quota_for(500), None);
        let short = CfsQuota {
            enforce: true,
            period_us: 50_000,
        };
        assert_eq!(short.quota_for(500), Some(25_000));
    }
}
