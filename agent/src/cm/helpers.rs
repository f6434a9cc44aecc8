//! CPU requests and limits as cgroup values (upstream `pkg/kubelet/cm/helpers_linux.go`
//! `MilliCPUToShares`, `MilliCPUToQuota`): one conversion for the containers' CRI resources
//! (`kuberuntime::container_config`) and the pod cgroups (`pod_cgroups`).

/// The CFS period the kubelet uses (100 ms).
pub const CPU_PERIOD_US: i64 = 100_000;
/// The smallest CPU shares value (upstream `MinShares`).
pub const MIN_SHARES: i64 = 2;
/// The smallest CFS quota (upstream `MinQuotaPeriod`, 1 ms).
pub const MIN_QUOTA_US: i64 = 1_000;

/// 1024 shares per CPU, at least 2.
pub fn milli_cpu_to_shares(millis: i64) -> i64 {
    if millis == 0 {
        return MIN_SHARES;
    }
    (millis * 1024 / 1000).max(MIN_SHARES)
}

/// The CFS quota for a limit, at least 1 ms.
pub fn milli_cpu_to_quota(millis: i64) -> i64 {
    if millis == 0 {
        return 0;
    }
    (millis * CPU_PERIOD_US / 1000).max(MIN_QUOTA_US)
}
