//! Faults on the wire, decided frame by frame from a seeded generator:
//! loss, duplication, reordering within a window, corruption (one byte of
//! the transport part flipped, so the receiver's ICRC check fails) and
//! delay (on the model's clock). The decisions are a function of the seed
//! and the sequence of frames sent, so a run with the same traffic loses,
//! duplicates and corrupts the same frames.
//!
//! A frame held back for reordering goes out after the next 1..=`window`
//! frames, or when the link has been idle for a tick (nothing more to
//! overtake it); a delayed frame when the clock reaches its time. At most
//! [`HELD_MAX`] frames are held; beyond, frames go out as they come.

use std::time::{Duration, Instant};

/// Frames held back (reordered or delayed) at most.
pub const HELD_MAX: usize = 4096;

/// Parts per million: the unit of every fault's probability.
pub const PPM: u32 = 1_000_000;

/// The faults of one port's wire (egress: every frame the port sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireFaults {
    /// Seed of the generator.
    pub seed: u64,
    /// Frames lost, per million.
    pub loss_ppm: u32,
    /// Frames sent twice, per million.
    pub duplicate_ppm: u32,
    /// Frames held back behind later ones, per million.
    pub reorder_ppm: u32,
    /// How many later frames a reordered frame lets pass, at most (1 if 0).
    pub window: u32,
    /// Frames with one byte flipped (bad ICRC), per million.
    pub corrupt_ppm: u32,
    /// Frames delayed by `delay`, per million.
    pub delay_ppm: u32,
    /// How long a delayed frame waits, on the model's clock.
    pub delay: Duration,
}

impl WireFaults {
    /// Whether any fault is on.
    pub fn any(&self) -> bool {
        self.loss_ppm | self.duplicate_ppm | self.reorder_ppm | self.corrupt_ppm | self.delay_ppm
            != 0
    }

    /// Parses `seed=N,loss=P,dup=P,reorder=P,window=N,corrupt=P,delay=P,delay_us=N`
    /// (P a probability, 0 to 1; any key may be left out).
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut f = Self::default();
        for kv in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("wire fault {kv:?}: not key=value"))?;
            let p = || -> Result<u32, String> {
                let x: f64 = v
                    .parse()
                    .map_err(|_| format!("wire fault {k}: {v:?} is not a number"))?;
                if !(0.0..=1.0).contains(&x) {
                    return Err(format!("wire fault {k}: {x} is not a probability"));
                }
                Ok((x * f64::from(PPM)).round() as u32)
            };
            let n = || -> Result<u64, String> {
                v.parse()
                    .map_err(|_| format!("wire fault {k}: {v:?} is not a whole number"))
            };
            match k {
                "seed" => f.seed = n()?,
                "loss" => f.loss_ppm = p()?,
                "dup" | "duplicate" => f.duplicate_ppm = p()?,
                "reorder" => f.reorder_ppm = p()?,
                "window" => f.window = n()?.min(1024) as u32,
                "corrupt" => f.corrupt_ppm = p()?,
                "delay" => f.delay_ppm = p()?,
                "delay_us" => f.delay = Duration::from_micros(n()?),
                _ => return Err(format!("wire fault {k:?}: unknown (seed, loss, dup, reorder, window, corrupt, delay, delay_us)")),
            }
        }
        Ok(f)
    }
}

/// What the faults did, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Frames lost.
    pub lost: u64,
    /// Frames sent twice.
    pub duplicated: u64,
    /// Frames held back behind later ones.
    pub reordered: u64,
    /// Frames sent corrupted (a duplicate of a corrupted frame too).
    pub corrupted: u64,
    /// Frames delayed.
    pub delayed: u64,
}

#[derive(Debug)]
struct Held {
    frame: Vec<u8>,
    /// Reordered: frames still to let pass.
    after: u32,
    /// Delayed: when it goes.
    due: Option<Instant>,
}

/// The fault state of one port's egress.
#[derive(Debug, Default)]
pub(crate) struct Impair {
    pub faults: WireFaults,
    rng: u64,
    held: Vec<Held>,
    pub counts: FaultCounts,
}

impl Impair {
    pub(crate) fn new(faults: WireFaults) -> Self {
        Self {
            faults,
            rng: faults.seed,
            held: Vec::new(),
            counts: FaultCounts::default(),
        }
    }

    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn hit(&mut self, ppm: u32) -> bool {
        ppm != 0 && (self.next() % u64::from(PPM)) < u64::from(ppm)
    }

    /// One frame to send at `now`: what goes out now is appended to `out`
    /// (this frame, its duplicate, held frames whose turn came); the frame
    /// itself is returned if the faults lost it.
    pub(crate) fn frame(
        &mut self,
        mut f: Vec<u8>,
        now: Instant,
        out: &mut Vec<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        if !self.faults.any() && self.held.is_empty() {
            out.push(f);
            return None;
        }
        // Every decision is drawn for every frame, so one fault's rate
        // does not shift another's sequence.
        let (lose, corrupt, dup, delay, reorder) = {
            let fl = self.faults;
            (
                self.hit(fl.loss_ppm),
                self.hit(fl.corrupt_ppm),
                self.hit(fl.duplicate_ppm),
                self.hit(fl.delay_ppm),
                self.hit(fl.reorder_ppm),
            )
        };
        let pick = self.next();
        let room = self.held.len() < HELD_MAX;
        if lose {
            self.counts.lost += 1;
            self.due(now, out);
            return Some(f);
        } else {
            let from = super::transport_at(&f);
            let corrupt = corrupt && f.len() > from + 4;
            if corrupt {
                // A byte of the transport headers or payload: only the
                // ICRC can tell.
                let mut at = from + (pick as usize % (f.len() - 4 - from));
                if at == from + 4 {
                    // The BTH's reserved byte is masked out of the ICRC:
                    // its neighbour instead.
                    at += 1;
                }
                f[at] ^= 1 << ((pick >> 32) % 8);
                self.counts.corrupted += 1;
            }
            if delay && room {
                self.counts.delayed += 1;
                let due = vfio::clock::later(now, self.faults.delay);
                self.held.push(Held {
                    frame: f,
                    after: 0,
                    due: Some(due),
                });
            } else if reorder && room {
                self.counts.reordered += 1;
                let w = self.faults.window.max(1);
                let after = 1 + ((pick >> 40) as u32 % w);
                self.held.push(Held {
                    frame: f,
                    after,
                    due: None,
                });
            } else {
                if dup {
                    self.counts.duplicated += 1;
                    // Counted as the corrupted frames that went out.
                    self.counts.corrupted += u64::from(corrupt);
                    out.push(f.clone());
                }
                out.push(f);
                self.passed(out);
            }
        }
        self.due(now, out);
        None
    }

    /// A frame went out: reordered frames that let enough pass follow it.
    fn passed(&mut self, out: &mut Vec<Vec<u8>>) {
        let mut i = 0;
        while i < self.held.len() {
            let h = &mut self.held[i];
            if h.due.is_none() {
                h.after = h.after.saturating_sub(1);
                if h.after == 0 {
                    out.push(self.held.remove(i).frame);
                    continue;
                }
            }
            i += 1;
        }
    }

    /// Delayed frames whose time came at `now`.
    pub(crate) fn due(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].due.is_some_and(|d| d <= now) {
                out.push(self.held.remove(i).frame);
                continue;
            }
            i += 1;
        }
    }

    /// The link went idle: reordered frames have nothing left to let pass
    /// and go now; delayed ones whose time came too.
    pub(crate) fn idle(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].due.is_none() {
                out.push(self.held.remove(i).frame);
                continue;
            }
            i += 1;
        }
        self.due(now, out);
    }

    /// Frames held now.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: WireFaults, n: u8) -> (Vec<Vec<u8>>, FaultCounts) {
        let mut im = Impair::new(f);
        let now = Instant::now();
        let mut out = Vec::new();
        for i in 0..n {
            im.frame(vec![i; 80], now, &mut out);
        }
        im.idle(now, &mut out);
        (out, im.counts)
    }

    #[test]
    fn same_seed_same_faults() {
        let f =
            WireFaults::parse("seed=7,loss=0.1,dup=0.1,reorder=0.1,window=3,corrupt=0.1").unwrap();
        let (a, ca) = run(f, 200);
        let (b, cb) = run(f, 200);
        assert_eq!((a, ca), (b, cb));
        assert!(ca.lost > 5 && ca.duplicated > 5 && ca.reordered > 5 && ca.corrupted > 5);
        let (c, _) = run(WireFaults { seed: 8, ..f }, 200);
        let (a, _) = run(f, 200);
        assert_ne!(a, c, "another seed, other faults");
    }

    #[test]
    fn every_frame_out_once_without_loss_or_dup() {
        let f = WireFaults::parse("seed=1,reorder=0.3,window=4").unwrap();
        let (out, c) = run(f, 100);
        let mut firsts: Vec<u8> = out.iter().map(|f| f[0]).collect();
        assert_ne!(firsts, (0..100).collect::<Vec<_>>(), "some reordered");
        assert!(c.reordered > 10);
        firsts.sort_unstable();
        assert_eq!(firsts, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn delay_waits_for_the_clock() {
        let f = WireFaults::parse("seed=1,delay=1,delay_us=50").unwrap();
        let mut im = Impair::new(f);
        let now = Instant::now();
        let mut out = Vec::new();
        im.frame(vec![1; 80], now, &mut out);
        im.idle(now, &mut out);
        assert!(out.is_empty());
        im.due(now + Duration::from_micros(50), &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn bad_fault_strings_are_refused() {
        for s in ["loss", "loss=2", "nope=1", "seed=x", "loss=-0.1"] {
            assert!(WireFaults::parse(s).is_err(), "{s}");
        }
        assert_eq!(WireFaults::parse("").unwrap(), WireFaults::default());
    }
}
