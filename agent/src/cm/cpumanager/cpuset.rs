//! `CpuSet`: an ordered set of logical CPU ids in the Linux cpulist syntax (`"0-3,7,9-10"`), the
//! form sysfs, cgroup `cpuset.cpus` and the CPU manager checkpoint all use. Upstream
//! `k8s.io/utils/cpuset` (formerly `pkg/kubelet/cm/cpuset`). Only the set and its text form live
//! here; nothing reads or writes files.

use std::collections::BTreeSet;
use std::fmt;

/// A cpulist that could not be parsed, naming the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu list {text:?}: {reason}")]
pub struct CpuSetError {
    pub text: String,
    pub reason: CpuSetErrorReason,
}

/// Why a cpulist was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetErrorReason {
    #[error("element {0:?} is not a CPU id")]
    NotANumber(String),
    #[error("range {0:?} ends before it starts")]
    ReversedRange(String),
}

/// An ordered set of logical CPU ids.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the Linux cpulist syntax; `""` (and surrounding whitespace, as sysfs files end in a
    /// newline) is the empty set.
    pub fn parse(text: &str) -> Result<Self, CpuSetError> {
        let err = |reason| CpuSetError {
            text: text.to_owned(),
            reason,
        };
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| err(CpuSetErrorReason::NotANumber(s.to_owned())))
        };
        let mut set = BTreeSet::new();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(Self(set));
        }
        for element in trimmed.split(',') {
            match element.split_once('-') {
                Some((first, last)) => {
                    let (first, last) = (number(first)?, number(last)?);
                    if last < first {
                        return Err(err(CpuSetErrorReason::ReversedRange(element.to_owned())));
                    }
                    set.extend(first..=last);
                }
                None => {
                    set.insert(number(element)?);
                }
            }
        }
        Ok(Self(set))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    /// The ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    pub fn insert(&mut self, cpu: u32) -> bool {
        self.0.insert(cpu)
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.union(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.intersection(&other.0).copied().collect())
    }

    /// The CPUs of `self` not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.difference(&other.0).copied().collect())
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl Extend<u32> for CpuSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

/// The canonical cpulist: ascending, runs of two or more ids as `a-b`, as upstream's `String()`.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.iter().peekable();
        let mut first_element = true;
        while let Some(start) = ids.next() {
            let mut end = start;
            while let Some(&next) = ids.peek() {
                if next != end + 1 {
                    break;
                }
                end = next;
                ids.next();
            }
            if !first_element {
                f.write_str(",")?;
            }
            first_element = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u32]) -> CpuSet {
        ids.iter().copied().collect()
    }

    #[test]
    fn parses_cpulists() {
        let cases: &[(&str, &[u32])] = &[
            ("", &[]),
            ("\n", &[]),
            ("0", &[0]),
            ("0-3,7,9-10", &[0, 1, 2, 3, 7, 9, 10]),
            ("0-1\n", &[0, 1]),
            ("5,1,3", &[1, 3, 5]),
            ("2-2", &[2]),
            ("0-2,1-3", &[0, 1, 2, 3]),
        ];
        for (text, ids) in cases {
            assert_eq!(CpuSet::parse(text).unwrap(), set(ids), "{text:?}");
        }
    }

    #[test]
    fn rejects_bad_cpulists_naming_the_text() {
        for text in ["a", "1-", "-1", "3-1", "1,,2", "1-2-3", "-", "4294967296"] {
            let err = CpuSet::parse(text).unwrap_err();
            assert_eq!(err.text, text);
            assert!(err.to_string().contains(&format!("{text:?}")), "{err}");
        }
    }

    #[test]
    fn displays_canonically() {
        let cases: &[(&[u32], &str)] = &[
            (&[], ""),
            (&[0], "0"),
            (&[0, 1], "0-1"),
            (&[0, 1, 2, 3, 7, 9, 10], "0-3,7,9-10"),
            (&[1, 3, 5], "1,3,5"),
            (&[0, 16], "0,16"),
        ];
        for (ids, text) in cases {
            assert_eq!(set(ids).to_string(), *text);
            assert_eq!(CpuSet::parse(text).unwrap(), set(ids));
        }
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::parse("0-5").unwrap();
        let b = CpuSet::parse("4-7").unwrap();
        assert_eq!(a.union(&b).to_string(), "0-7");
        assert_eq!(a.intersection(&b).to_string(), "4-5");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert!(CpuSet::parse("1,3").unwrap().is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(CpuSet::new().is_subset(&a));
        assert_eq!(a.len(), 6);
        assert!(CpuSet::new().is_empty());
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![4, 5, 6, 7]);
    }
}
