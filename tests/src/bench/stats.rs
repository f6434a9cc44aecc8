//! Latency statistics: nearest-rank percentiles over a sorted sample, and the points of its
//! empirical CDF.

use serde::Serialize;

/// Summary of one scenario's latencies, in ns.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub mean_ns: f64,
}

impl Latency {
    /// Summarises `sorted` (ascending); all zero when it is empty.
    pub fn of(sorted: &[u64]) -> Latency {
        let Some(&max_ns) = sorted.last() else {
            return Latency::default();
        };
        // u128: 10^6 samples of seconds-long latencies would still not overflow.
        let sum: u128 = sorted.iter().map(|&ns| u128::from(ns)).sum();
        Latency {
            count: sorted.len() as u64,
            p50_ns: nearest_rank(sorted, 1, 2),
            p99_ns: nearest_rank(sorted, 99, 100),
            p999_ns: nearest_rank(sorted, 999, 1000),
            max_ns,
            mean_ns: sum as f64 / sorted.len() as f64,
        }
    }
}

/// The same summary in milliseconds, as the reports' JSON shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    pub n: u64,
}

impl LatencyMs {
    /// Summarises `sorted_ns` (ascending, in ns).
    pub fn of(sorted_ns: &[u64]) -> LatencyMs {
        let l = Latency::of(sorted_ns);
        LatencyMs {
            p50: ms(l.p50_ns),
            p99: ms(l.p99_ns),
            max: ms(l.max_ns),
            mean: l.mean_ns / 1e6,
            n: l.count,
        }
    }
}

/// Signed latencies in ns, ascending, those below 0 as 0: something that came before what it is
/// measured from counts as immediate.
pub fn sorted_ns(signed: impl Iterator<Item = i64>) -> Vec<u64> {
    let mut all: Vec<u64> = signed.map(|ns| u64::try_from(ns).unwrap_or(0)).collect();
    all.sort_unstable();
    all
}

/// Nanoseconds as milliseconds.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The nearest-rank quantile `num/den` (e.g. 999/1000 for p99.9) of `sorted` (ascending): the
/// smallest sample such that at least that share of the samples is at or below it. 0 for an empty
/// sample. A fraction of integers, not an f64 percentage: `99.9 / 100.0 * 1000.0` is a hair above
/// 999, and its ceiling would pick the wrong rank.
pub fn nearest_rank(sorted: &[u64], num: u64, den: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let n = sorted.len();
    let rank = (num * n as u64).div_ceil(den.max(1)) as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Points `(latency µs, fraction of samples at or below it)` of the empirical CDF of `sorted`,
/// at most about `max_points` of them (evenly spaced by rank; the last sample always included),
/// so that a plot of 10^5 samples stays small.
pub fn cdf_points(sorted: &[u64], max_points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(max_points.max(1));
    let point = |i: usize| (sorted[i] as f64 / 1000.0, (i + 1) as f64 / n as f64);
    let mut points: Vec<_> = (0..n).step_by(step).map(point).collect();
    if !(n - 1).is_multiple_of(step) {
        points.push(point(n - 1));
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&hundred, 1, 2), 50);
        assert_eq!(nearest_rank(&hundred, 99, 100), 99);
        assert_eq!(nearest_rank(&hundred, 999, 1000), 100);
        assert_eq!(nearest_rank(&hundred, 1, 1), 100);
        assert_eq!(nearest_rank(&hundred, 0, 1), 1);
        assert_eq!(nearest_rank(&[7], 999, 1000), 7);
        assert_eq!(nearest_rank(&[], 1, 2), 0);
        let thousand: Vec<u64> = (1..=1000).collect();
        assert_eq!(nearest_rank(&thousand, 999, 1000), 999);
        let odd: Vec<u64> = (1..=10_001).collect();
        assert_eq!(nearest_rank(&odd, 1, 2), 5001);
        assert_eq!(nearest_rank(&odd, 999, 1000), 9991);
    }

    #[test]
    fn summary() {
        let latency = Latency::of(&[1000, 2000, 3000, 4000]);
        assert_eq!(latency.count, 4);
        assert_eq!(latency.p50_ns, 2000);
        assert_eq!(latency.p99_ns, 4000);
        assert_eq!(latency.max_ns, 4000);
        assert!((latency.mean_ns - 2500.0).abs() < f64::EPSILON);
        assert_eq!(Latency::of(&[]), Latency::default());
    }

    #[test]
    fn signed_latencies_are_sorted_with_negatives_as_zero() {
        assert_eq!(sorted_ns([5, -3, 2].into_iter()), [0, 2, 5]);
        assert!(sorted_ns(std::iter::empty()).is_empty());
    }

    #[test]
    fn cdf_is_thinned_but_keeps_both_ends() {
        let sample: Vec<u64> = (1..=10_001).map(|i| i * 1000).collect();
        let points = cdf_points(&sample, 100);
        assert!(points.len() <= 102, "{}", points.len());
        assert_eq!(points.first(), Some(&(1.0, 1.0 / 10_001.0)));
        assert_eq!(points.last(), Some(&(10_001.0, 1.0)));
        assert!(
            points
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1)
        );
        assert_eq!(cdf_points(&[5000], 100), vec![(5.0, 1.0)]);
        assert!(cdf_points(&[], 100).is_empty());
    }
}
