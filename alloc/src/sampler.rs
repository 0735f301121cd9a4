//! Which allocations are sampled: a Poisson process over allocated bytes.
//!
//! Each thread counts down the bytes to its next sample point; the distance
//! between sample points is drawn from an exponential distribution whose
//! mean is the sampling interval (512 KiB by default, as Go's
//! `MemProfileRate`, jemalloc's `lg_prof_sample = 19` and Datadog's heap
//! sampler). An allocation of `size` bytes is sampled when its bytes cross
//! one or more sample points; it then stands for `crossed × interval`
//! bytes, the weight the OpenTelemetry memory-profiling design
//! (`design-docs/00003-memory-profiling`) passes to `otel_memory:alloc`. The
//! expected number of points in `size` bytes is `size / interval`, so the
//! weights add up to the bytes allocated: the totals are unbiased.
//!
//! Everything here is plain arithmetic over a [`Countdown`], so it is
//! tested without an allocator; [`crate::SampledAllocator`] keeps one per
//! thread.

/// The default mean distance between samples, in bytes.
pub const DEFAULT_INTERVAL: u64 = 512 * 1024;

/// The longest distance drawn, so one draw never overflows the countdown
/// (intervals are at most 2^40: the tail beyond 2^62 is ~e^-4,000,000).
const MAX_DRAW: f64 = (1u64 << 62) as f64;

/// One thread's sampling state: the bytes left to the next sample point and
/// its random generator. `Countdown::UNSEEDED` (all zero) is the state of
/// a thread that has not allocated yet: its first allocation seeds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Countdown {
    /// Bytes to the next sample point; an allocation that brings it to zero
    /// or below is sampled.
    pub left: i64,
    /// xorshift64* state; 0 until seeded.
    pub rng: u64,
}

impl Countdown {
    /// A thread that has not allocated yet.
    pub const UNSEEDED: Countdown = Countdown { left: 0, rng: 0 };

    /// The fast path: `None` when `size` bytes cross no sample point (the
    /// countdown is stored by the caller), else the slow path decides.
    #[inline(always)]
    pub fn take(&mut self, size: usize) -> Option<()> {
        // `left` is never negative (0 only before seeding), so this is
        // `left - size > 0` without overflow for any size.
        if (size as u64) < self.left as u64 {
            self.left -= size as i64;
            None
        } else {
            Some(())
        }
    }

    /// The slow path, after [`Countdown::take`] said `size` bytes reach a
    /// sample point (or the thread is not seeded yet): the number of sample
    /// points they cross (0 for the seeding allocation when it crosses
    /// none), and the countdown moved past them. `interval` is the mean
    /// distance; `seed` seeds an unseeded thread (any value; it is mixed).
    #[cold]
    pub fn crossed(&mut self, size: usize, interval: u64, seed: u64) -> u64 {
        let size = size.min(i64::MAX as usize) as i64;
        if self.rng == 0 {
            self.rng = splitmix64(seed) | 1;
            self.left = self.draw(interval);
        }
        let mut left = self.left.saturating_sub(size);
        let mut points = 0;
        // Beyond the first point the process is memoryless: a huge request
        // gets the expected count of the rest at once (randomized rounding
        // keeps it unbiased) instead of a draw per point — 2^44 of them
        // for a malloc(SIZE_MAX).
        let rest = left.unsigned_abs(); // bytes past the first point
        if left <= 0 && rest > BULK * interval {
            let u = self.uniform();
            points = 1 + (rest as f64 / interval as f64 + u) as u64;
            left = self.draw(interval);
        }
        while left <= 0 {
            points += 1;
            left = left.saturating_add(self.draw(interval));
        }
        self.left = left;
        points
    }

    /// A uniform number in (0, 1] (xorshift64*, Vigna: 53 bits).
    fn uniform(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        let bits = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        (bits + 1) as f64 / (1u64 << 53) as f64
    }

    /// The distance to the next point: geometric over bytes with mean
    /// exactly `interval` (`1 + ⌊ln u / ln(1 − 1/interval)⌋`, ≥ 1; the
    /// discrete form of an exponential, so small intervals are not biased
    /// by rounding).
    fn draw(&mut self, interval: u64) -> i64 {
        let u = self.uniform();
        if interval <= 1 {
            return 1;
        }
        let d = 1.0 + (u.ln() / (-1.0 / interval as f64).ln_1p()).floor();
        d.clamp(1.0, MAX_DRAW) as i64
    }
}

/// Beyond this many intervals past its first sample point, a request's
/// remaining points are counted at once.
const BULK: u64 = 64;

/// The weight of an allocation that crossed `points` sample points: what
/// `otel_memory:alloc` reports (`nsamples × sampling_interval`).
pub fn weight(points: u64, interval: u64) -> u64 {
    points.saturating_mul(interval)
}

/// Parses the sampling interval from the environment variable's value:
/// decimal bytes; `0` turns sampling off (`None`); anything else that is
/// not a number keeps the default. Works on bytes: the allocator reads it
/// before anything may allocate.
pub fn parse_interval(value: Option<&[u8]>) -> Option<u64> {
    let Some(value) = value else {
        return Some(DEFAULT_INTERVAL);
    };
    let mut n: u64 = 0;
    if value.is_empty() {
        return Some(DEFAULT_INTERVAL);
    }
    for &b in value {
        if !b.is_ascii_digit() {
            return Some(DEFAULT_INTERVAL);
        }
        n = match n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
        {
            Some(n) => n,
            None => return Some(DEFAULT_INTERVAL),
        };
    }
    (n > 0).then_some(n.min(1 << 40))
}

/// SplitMix64: turns any seed (an address, a counter) into a well-mixed
/// nonzero-ish state.
pub fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `sizes` through one countdown: (allocations sampled, the sum of
    /// their weights, bytes allocated).
    fn run(sizes: impl Iterator<Item = usize>, interval: u64, seed: u64) -> (u64, u64, u64) {
        let mut c = Countdown::UNSEEDED;
        let (mut sampled, mut weights, mut bytes) = (0, 0, 0);
        for size in sizes {
            bytes += size as u64;
            if c.take(size).is_some() {
                let points = c.crossed(size, interval, seed);
                if points > 0 {
                    sampled += 1;
                    weights += weight(points, interval);
                }
            }
        }
        (sampled, weights, bytes)
    }

    #[test]
    fn weights_add_up_to_the_bytes_allocated() {
        // Varied sizes from 16 B to 1 MiB (a multiplicative walk), 1 GiB+.
        let mut x = 1u64;
        let sizes = std::iter::from_fn(|| {
            x = splitmix64(x);
            Some(16usize << (x % 17))
        })
        .take(60_000);
        let (sampled, weights, bytes) = run(sizes, DEFAULT_INTERVAL, 42);
        let ratio = weights as f64 / bytes as f64;
        assert!(
            (0.97..1.03).contains(&ratio),
            "{weights} / {bytes} = {ratio}"
        );
        assert!(sampled > 1000, "{sampled}");
    }

    #[test]
    fn small_allocations_are_sampled_once_per_interval_on_average() {
        // 64-byte blocks: 10 M of them are 640 MB, ~1,220 sample points.
        let (sampled, weights, bytes) =
            run(std::iter::repeat_n(64, 10_000_000), DEFAULT_INTERVAL, 7);
        let expected = bytes as f64 / DEFAULT_INTERVAL as f64;
        assert!(
            (sampled as f64 - expected).abs() < 4.0 * expected.sqrt(),
            "{sampled} samples, expected {expected}"
        );
        assert_eq!(weights, sampled * DEFAULT_INTERVAL);
    }

    #[test]
    fn a_large_allocation_crosses_many_points() {
        let mut c = Countdown::UNSEEDED;
        let _ = c.crossed(1, DEFAULT_INTERVAL, 3); // seed
        let mut total = 0;
        for _ in 0..100 {
            total += c.crossed(64 << 20, DEFAULT_INTERVAL, 3);
        }
        // 100 × 64 MiB = 12,800 intervals on average.
        assert!((12_300..13_300).contains(&total), "{total}");
        assert!(c.left > 0);
    }

    #[test]
    fn seeds_differ_between_threads() {
        let a = run(std::iter::repeat_n(4096, 100_000), 65536, 1);
        let b = run(std::iter::repeat_n(4096, 100_000), 65536, 2);
        assert_ne!(a.0, b.0, "two seeds gave the same sample count");
    }

    #[test]
    fn the_interval_is_read_from_bytes() {
        assert_eq!(parse_interval(None), Some(DEFAULT_INTERVAL));
        assert_eq!(parse_interval(Some(b"")), Some(DEFAULT_INTERVAL));
        assert_eq!(parse_interval(Some(b"65536")), Some(65536));
        assert_eq!(parse_interval(Some(b"0")), None);
        assert_eq!(parse_interval(Some(b"12k")), Some(DEFAULT_INTERVAL));
        assert_eq!(
            parse_interval(Some(b"99999999999999999999999")),
            Some(DEFAULT_INTERVAL)
        );
        assert_eq!(parse_interval(Some(b"1")), Some(1));
    }

    #[test]
    fn small_intervals_keep_their_mean() {
        for interval in [1u64, 2, 3, 64] {
            let (_, weights, bytes) = run(std::iter::repeat_n(1, 2_000_000), interval, 5);
            let ratio = weights as f64 / bytes as f64;
            assert!(
                (0.98..1.02).contains(&ratio),
                "interval {interval}: {ratio}"
            );
        }
    }

    #[test]
    fn a_huge_request_is_counted_at_once_and_without_bias() {
        let mut c = Countdown::UNSEEDED;
        let mut total = 0;
        for _ in 0..1000 {
            total += c.crossed(1 << 50, DEFAULT_INTERVAL, 9);
        }
        // 1000 × 2^50 / 2^19 = 2^31 × 1000 points (a draw per point would
        // take days: this test would not end).
        let want = 1000.0 * (1u64 << 31) as f64;
        assert!((total as f64 / want - 1.0).abs() < 1e-3, "{total}");
        assert!(c.crossed(usize::MAX, DEFAULT_INTERVAL, 9) > 0);
    }

    #[test]
    fn sizes_beyond_i64_are_sampled_not_wrapped() {
        let mut c = Countdown {
            left: 100,
            rng: 12345,
        };
        assert!(c.take(usize::MAX).is_some());
        assert!(c.crossed(usize::MAX, 1 << 40, 0) > 0);
    }
}
