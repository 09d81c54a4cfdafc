//! The device clock: the init segment's free-running internal timer (in
//! cycles of the general caps' `device_frequency_khz`), which every CQE
//! is stamped with, and its conversion to wall-clock time.
//!
//! Linux's mlx5_core keeps the conversion in a timecounter
//! (`lib/clock.c`: `mlx5_timecounter_init`, a 41-bit cycle mask, shift
//! `MLX5_CYCLES_SHIFT` 23, `clocksource_khz2mult`) and hands user space
//! a page of it (`struct mlx5_ib_clock_info`: the wall time `nsec` at
//! `cycles`, `mult`, `shift`, `mask`), refreshed by its overflow work;
//! libmlx5's `mlx5dv_get_clock_info` copies it and the inline
//! `mlx5dv_ts_to_ns` converts with it. Here the driver is the kernel:
//! [`Context::clock_info`] takes that snapshot itself (the timer read
//! through the BAR beside `CLOCK_REALTIME`) and keeps it for
//! [`CLOCK_INFO_REFRESH`] of the context's clock, and
//! [`ClockInfo::to_ns`] is `mlx5dv_ts_to_ns`.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::device::Context;
use crate::{Error, Result};

/// `MLX5_CYCLES_SHIFT`: the cycle counter's shift (Linux's mlx5 clock).
pub const CYCLES_SHIFT: u32 = 23;
/// `CLOCKSOURCE_MASK(41)`: the cycle bits the conversion uses.
pub const CYCLES_MASK: u64 = (1 << 41) - 1;
/// `ibv_device_attr_ex.completion_timestamp_mask` as mlx5_ib reports it
/// (`props->timestamp_mask`): the CQE's 63 low bits.
pub const COMPLETION_TIMESTAMP_MASK: u64 = 0x7fff_ffff_ffff_ffff;
/// How long a snapshot is kept: the conversion's rate is the nominal
/// frequency, so a crystal off by some ppm drifts from the wall clock by
/// that much of the snapshot's age (the kernel's snapshot follows its PTP
/// adjustments; this one has none, so it is retaken often).
pub const CLOCK_INFO_REFRESH: Duration = Duration::from_secs(1);

/// `struct mlx5dv_clock_info`: the wall time `nsec` (ns since the Unix
/// epoch) when the device clock read `last_cycles`, and the rate between
/// them (`mult` / 2^`shift` ns a cycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockInfo {
    /// Wall-clock nanoseconds at `last_cycles`.
    pub nsec: u64,
    /// The device clock at the snapshot.
    pub last_cycles: u64,
    /// The timecounter's fractional nanoseconds (0: a fresh snapshot).
    pub frac: u64,
    /// Nanoseconds a cycle, times 2^`shift`.
    pub mult: u32,
    /// See `mult`.
    pub shift: u32,
    /// The cycle bits that count ([`CYCLES_MASK`]).
    pub mask: u64,
}

impl ClockInfo {
    /// The conversion for a clock of `khz` that read `cycles` at wall time
    /// `nsec`, as `mlx5_timecounter_init` sets it up; `None` for a device
    /// that reports no frequency (Linux then starts no clock).
    pub fn new(khz: u32, cycles: u64, nsec: u64) -> Option<Self> {
        if khz == 0 {
            return None;
        }
        // clocksource_khz2mult: (10^6 << shift) / khz, rounded.
        let mult = ((1_000_000u64 << CYCLES_SHIFT) + u64::from(khz) / 2) / u64::from(khz);
        Some(Self {
            nsec,
            last_cycles: cycles & CYCLES_MASK,
            frac: 0,
            mult: u32::try_from(mult).ok()?,
            shift: CYCLES_SHIFT,
            mask: CYCLES_MASK,
        })
    }

    /// `mlx5dv_ts_to_ns`: the wall time of a device timestamp. A stamp
    /// more than half the mask after the snapshot is taken as one before
    /// it.
    pub fn to_ns(&self, ts: u64) -> u64 {
        let m = u64::from(self.mult);
        let delta = ts.wrapping_sub(self.last_cycles) & self.mask;
        if delta > self.mask / 2 {
            let back = self.last_cycles.wrapping_sub(ts) & self.mask;
            self.nsec
                .wrapping_sub(back.wrapping_mul(m).wrapping_sub(self.frac) >> self.shift)
        } else {
            self.nsec
                .wrapping_add(delta.wrapping_mul(m).wrapping_add(self.frac) >> self.shift)
        }
    }

    /// How far a snapshot stays good, in ns (`mlx5_init_overflow_period`:
    /// a third of the mask, or fewer cycles if their product with `mult`
    /// would pass 63 bits), which libmlx5 reports as
    /// `mlx5dv_context.max_clock_info_update_nsec`.
    pub fn update_period_ns(&self) -> u64 {
        let m = u64::from(self.mult).max(1);
        let cycles = ((u64::MAX >> 1) / m).min(self.mask / 3);
        cycles.saturating_mul(m) >> self.shift
    }
}

/// A context's last snapshot and when (on the context's clock) it was
/// taken.
#[derive(Debug, Default)]
pub(crate) struct ClockCache(Mutex<Option<(Instant, ClockInfo)>>);

impl Context {
    /// The device's free-running clock (the init segment's internal timer,
    /// in cycles of `device_frequency_khz`: what completions are stamped
    /// with; rdma-core's `ibv_query_rt_values_ex` raw clock): the high
    /// word read again after the low one, so a carry between the two reads
    /// is never half seen.
    pub fn read_clock(&self) -> Result<u64> {
        use mlx5_hw::init::{ISEG_INTERNAL_TIMER_H as H, ISEG_INTERNAL_TIMER_L as L};
        let bar = self.ctx.hca.bar();
        for _ in 0..4 {
            let hi = bar.read32_be(H)?;
            let lo = bar.read32_be(L)?;
            if bar.read32_be(H)? == hi {
                return Ok(u64::from(hi) << 32 | u64::from(lo));
            }
        }
        Err(Error::Fault(
            "internal timer: the high word moves under every read",
        ))
    }

    /// Where the internal timer (its high word, then its low one, both
    /// big-endian) lies in this process's mapping of the BAR, for a
    /// program that reads the clock itself (libmlx5's `hca_core_clock`,
    /// handed out by `mlx5dv_query_device`): reads only, as the timer
    /// registers are read-only.
    pub fn internal_timer_addr(&self) -> Result<*const u8> {
        use mlx5_hw::init::ISEG_INTERNAL_TIMER_H as H;
        Ok(self.ctx.hca.bar().addr_of(H, 8)?.cast_const())
    }

    /// The clock's frequency (`device_frequency_khz`; 0: none reported).
    pub fn device_frequency_khz(&self) -> u32 {
        self.ctx.hca.caps().gen().device_frequency_khz()
    }

    /// The wall-clock conversion of the device clock
    /// (`mlx5dv_get_clock_info`): a snapshot at most
    /// [`CLOCK_INFO_REFRESH`] old. `NotSupported` on a device that reports
    /// no frequency.
    pub fn clock_info(&self) -> Result<ClockInfo> {
        let now = self.ctx.hca.cmd().0.clock().now();
        let mut c = self.ctx.clock.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, info)) = *c {
            if now.saturating_duration_since(at) < CLOCK_INFO_REFRESH {
                return Ok(info);
            }
        }
        let cycles = self.read_clock()?;
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let info = ClockInfo::new(self.device_frequency_khz(), cycles, wall)
            .ok_or(Error::NotSupported("device clock: no device_frequency_khz"))?;
        *c = Some((now, info));
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_count_converts_to_its_nanoseconds_either_side_of_the_snapshot() {
        // 156.25 MHz (ConnectX-5's clock): 6.4 ns a cycle.
        let c = ClockInfo::new(156_250, 1_000_000, 5_000_000_000).unwrap();
        assert_eq!(c.mult, 53_687_091); // (10^6 << 23) / 156250, rounded
        assert_eq!(c.to_ns(1_000_000), 5_000_000_000);
        // 156,250 cycles are 1 ms, to within the multiplier's rounding.
        let later = c.to_ns(1_000_000 + 156_250);
        assert!(later.abs_diff(5_001_000_000) <= 1, "{later}");
        let earlier = c.to_ns(1_000_000 - 156_250);
        assert!(earlier.abs_diff(4_999_000_000) <= 1, "{earlier}");
        // Only the mask's bits count: a stamp with high bits set beyond
        // it converts as its low bits.
        assert_eq!(c.to_ns((1 << 41) | 1_000_000), 5_000_000_000);
    }

    #[test]
    fn no_frequency_means_no_conversion() {
        assert_eq!(ClockInfo::new(0, 0, 0), None);
    }

    #[test]
    fn the_update_period_keeps_the_product_with_mult_in_63_bits() {
        // At 156.25 MHz, 2^63 / mult cycles (about 1.7e11, fewer than a
        // third of the mask) are 2^63 >> 23 = 2^40 ns: about 1,100 s.
        let c = ClockInfo::new(156_250, 0, 0).unwrap();
        let p = c.update_period_ns();
        assert!(p <= 1 << 40 && p > (1 << 40) - (1 << 30), "{p}");
        // A fast clock (1 GHz: mult 2^23, a cycle a nanosecond) meets the
        // mask's third first.
        let fast = ClockInfo::new(1_000_000, 0, 0).unwrap();
        assert_eq!(fast.update_period_ns(), CYCLES_MASK / 3);
    }
}
