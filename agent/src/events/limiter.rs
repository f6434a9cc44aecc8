//! A token bucket (client-go's `flowcontrol.NewTokenBucketRateLimiter`): `burst` tokens at
//! first, refilled at `qps` a second up to `burst`. It limits both the events written to the API
//! server (`eventRecordQPS`/`eventBurst`) and, per object, what the spam filter lets through.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Debug)]
pub(super) struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps` must be positive; a `burst` below one still lets one through (a
    /// bucket that never holds a whole token would block forever).
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps,
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
    }

    /// Takes a token if one is there (upstream `TryAccept`).
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes a token now or in advance, and says how long to wait for it (upstream `Accept`).
    pub fn reserve(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_refill_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 3, start);
        assert!((0..3).all(|_| bucket.try_take(start)));
        assert!(!bucket.try_take(start));
        // Half a second refills one token at 2 a second.
        let later = start + Duration::from_millis(500);
        assert!(bucket.try_take(later));
        assert!(!bucket.try_take(later));
        // Never more than the burst, however long it waited.
        let much_later = later + Duration::from_secs(3600);
        assert_eq!((0..10).filter(|_| bucket.try_take(much_later)).count(), 3);
    }

    #[test]
    fn reservations_queue_up_behind_the_burst() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 2, start);
        assert_eq!(bucket.reserve(start), Duration::ZERO);
        assert_eq!(bucket.reserve(start), Duration::ZERO);
        let third = bucket.reserve(start);
        let fourth = bucket.reserve(start);
        assert!(
            third > Duration::ZERO && fourth > third,
            "{third:?} {fourth:?}"
        );
        assert!(fourth <= Duration::from_millis(201), "{fourth:?}");
    }

    #[test]
    fn a_zero_burst_still_lets_one_through() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1.0, 0, start);
        assert!(bucket.try_take(start));
        assert!(!bucket.try_take(start));
    }
}
