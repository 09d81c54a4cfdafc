//! The latency loops (perftest's `run_iter_lat_write`, `run_iter_lat_send`,
//! `run_iter_lat` and `print_report_lat`). WRITE and SEND ping-pong: the
//! client stamps each iteration as it posts, the server answers every
//! message it sees, and a sample is half the round trip. READ and atomics
//! are one-sided: a sample is the whole round trip of one WR.

use std::time::{Duration, Instant};

use verbs::cq::Wc;

use super::clock;
use super::exchange::Ctl;
use super::params::{Params, Verb};
use super::res::Side;

/// perftest's `LAT_MEASURE_TAIL`: the largest samples dropped.
pub const TAIL: usize = 2;

/// Latency figures in microseconds (perftest's report line).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatReport {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Minimum.
    pub t_min: f64,
    /// Maximum (after the tail).
    pub t_max: f64,
    /// Median.
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation.
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Duration mode: transactions per second.
    pub tps: Option<f64>,
}

/// Ping-pong (WRITE/SEND) or one-sided (READ/atomic) for `iters`
/// iterations or `duration`; returns the per-iteration stamps (client) and
/// the iterations done.
pub fn run(
    side: &mut Side,
    p: &Params,
    ctl: &mut Ctl,
    size: u64,
    iters: u64,
    duration: Option<Duration>,
) -> Result<(Vec<u64>, u64), String> {
    let client = ctl.client;
    let one_sided = matches!(p.test.verb, Verb::Read | Verb::Atomic);
    let poll_off = size as usize - 1;
    let send_off = side.send_off(0) as usize;
    if p.test.verb == Verb::Write {
        side.buf
            .store_u8_release(poll_off, 0)
            .map_err(|e| e.to_string())?;
        side.buf
            .store_u8_release(send_off + poll_off, 0)
            .map_err(|e| e.to_string())?;
    }
    if p.test.verb == Verb::Send {
        for _ in 0..p.rx_depth.min(16) {
            side.post_recv(p, 0, size)?;
        }
    }
    ctl.sync()?;
    let mut stamps = Vec::with_capacity(iters as usize + 1);
    let mut wc = [Wc::default(); 4];
    if one_sided && !client {
        return Ok((stamps, 0));
    }
    let t0 = Instant::now();
    let mut next_progress = t0 + Duration::from_secs(1);
    let mut i = 0u64;
    loop {
        if let Some(d) = duration {
            if client && t0.elapsed() >= d {
                break;
            }
            if Instant::now() >= next_progress {
                if client {
                    super::progress(&format!(
                        "{} s of {} s: {i} iterations",
                        t0.elapsed().as_secs(),
                        d.as_secs()
                    ));
                }
                next_progress += Duration::from_secs(1);
            }
        } else if i >= iters {
            break;
        }
        let tag = (i % 255) as u8 + 1;
        // The server waits for the ping first; the client posts first.
        if !client && !one_sided && !wait_ping(side, p, ctl, poll_off, tag, &mut wc)? {
            // The client is done (duration mode) or gone: the caller
            // checks the count.
            break;
        }
        if client {
            stamps.push(clock::cycles());
        }
        if p.test.verb == Verb::Write {
            side.buf
                .store_u8_release(send_off + poll_off, tag)
                .map_err(|e| e.to_string())?;
        }
        side.post_send(p, 0, size, 1, true, 0)?;
        if client && !one_sided && !wait_ping(side, p, ctl, poll_off, tag, &mut wc)? {
            return Err(format!("the server stopped answering after {i} iterations"));
        }
        // The WR's own completion.
        while side.poll(false, &mut wc[..1])? == 0 {
            super::idle();
        }
        i += 1;
    }
    if client {
        stamps.push(clock::cycles());
    }
    Ok((stamps, i))
}

/// Waits for the peer's message `tag` (WRITE: the last byte of our
/// receive half; SEND: a receive completion, then reposts); gives up
/// (false) when the peer says it is done or closes the connection.
fn wait_ping(
    side: &mut Side,
    p: &Params,
    ctl: &mut Ctl,
    poll_off: usize,
    tag: u8,
    wc: &mut [Wc],
) -> Result<bool, String> {
    let mut spins = 0u32;
    loop {
        let ok = if p.test.verb == Verb::Write {
            side.buf
                .load_u8_acquire(poll_off)
                .map_err(|e| e.to_string())?
                == tag
        } else {
            let n = side.poll(true, &mut wc[..1])?;
            if n == 1 {
                let size = poll_off as u64 + 1;
                side.post_recv(p, 0, size)?;
            }
            n == 1
        };
        if ok {
            return Ok(true);
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 && ctl.peer_done() {
            return Ok(false);
        }
        super::idle();
    }
}

/// perftest's `print_report_lat` over the client's stamps (one per
/// iteration, as it posted; a final stamp after the last reply is
/// ignored): `iters - 1` intervals, sorted, the [`TAIL`] largest cut,
/// t_max the largest kept + 1 and the percentiles at index
/// `ceil(n * q)` as perftest indexes them. The deviation is computed in
/// floating point (perftest truncates each term to an integer).
pub fn report(p: &Params, stamps: &[u64], size: u64, iters: u64) -> LatReport {
    let factor = if matches!(p.test.verb, Verb::Read | Verb::Atomic) {
        1.0
    } else {
        2.0
    };
    let stamps = &stamps[..stamps.len().min(iters as usize)];
    let mut delta: Vec<u64> = stamps
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect();
    delta.sort_unstable();
    if delta.len() <= TAIL {
        return LatReport {
            size,
            iters,
            ..Default::default()
        };
    }
    let n = delta.len() - TAIL;
    let us = |c: f64| c / clock::MHZ / factor;
    let d = &delta;
    let median = if n % 2 == 0 {
        (d[n / 2 - 1] + d[n / 2]) as f64 / 2.0
    } else {
        d[n / 2] as f64
    };
    let avg = d[..n].iter().map(|&x| us(x as f64)).sum::<f64>() / n as f64;
    let var = d[..n]
        .iter()
        .map(|&x| (us(x as f64) - avg).powi(2))
        .sum::<f64>()
        / n as f64;
    let pct = |q: f64| us(d[((n as f64 * q).ceil() as usize).min(d.len() - 1)] as f64);
    LatReport {
        size,
        iters,
        t_min: us(d[0] as f64),
        t_max: us(d[n] as f64),
        t_typical: us(median),
        t_avg: avg,
        t_stdev: var.sqrt(),
        p99: pct(0.99),
        p999: pct(0.999),
        tps: None,
    }
}

/// Duration mode: average latency and transactions per second.
pub fn report_duration(p: &Params, stamps: &[u64], size: u64, iters: u64) -> LatReport {
    let factor = if matches!(p.test.verb, Verb::Read | Verb::Atomic) {
        1.0
    } else {
        2.0
    };
    let cycles = match (stamps.first(), stamps.last()) {
        (Some(a), Some(b)) => b.saturating_sub(*a) as f64,
        _ => 0.0,
    };
    let secs = cycles / (clock::MHZ * 1e6);
    LatReport {
        size,
        iters,
        t_avg: if iters > 0 {
            cycles / clock::MHZ / iters as f64 / factor
        } else {
            0.0
        },
        tps: Some(if secs > 0.0 { iters as f64 / secs } else { 0.0 }),
        ..Default::default()
    }
}
