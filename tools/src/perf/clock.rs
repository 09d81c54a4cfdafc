//! Timestamps: perftest counts CPU cycles (`get_cycles`) and converts with
//! the CPU's MHz; this crate forbids `unsafe` (RDTSC is an unsafe
//! intrinsic), so a "cycle" here is one nanosecond of the monotonic clock
//! (`clock_gettime(CLOCK_MONOTONIC)` through the vDSO: ns resolution,
//! ~20 ns per read), i.e. a 1000 MHz cycle counter. The reports compute
//! exactly as perftest's do with `cycles_to_units = MHZ * 1e6`.

use std::sync::OnceLock;
use std::time::Instant;

/// Cycles per microsecond of [`cycles`].
pub const MHZ: f64 = 1000.0;

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

/// The current timestamp in cycles.
#[inline]
pub fn cycles() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// CPU time counters of `/proc/stat`'s first line: `(busy, idle)` jiffies
/// (perftest's `--cpu_util`).
pub fn cpu_stat() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    let busy = v.iter().sum::<u64>() - idle;
    Some((busy, idle))
}

/// Busy percentage between two [`cpu_stat`] readings.
pub fn cpu_util(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> f64 {
    match (a, b) {
        (Some((b0, i0)), Some((b1, i1))) => {
            let busy = b1.saturating_sub(b0) as f64;
            let idle = i1.saturating_sub(i0) as f64;
            if busy + idle == 0.0 {
                0.0
            } else {
                busy / (busy + idle) * 100.0
            }
        }
        _ => 0.0,
    }
}
