//! The bandwidth loops (perftest's `run_iter_bw`, `run_iter_bw_server`,
//! `run_iter_duration` and `print_report_bw`): keep up to TX depth WRs
//! outstanding per QP, signal one in `cq_mod`, stamp every post and every
//! completion, and compute average and peak bandwidth from the stamps.

use std::time::{Duration, Instant};

use verbs::cq::Wc;

use super::clock;
use super::exchange::Ctl;
use super::params::Params;
use super::res::Side;

/// The timestamps of one measured round.
#[derive(Debug, Default)]
pub struct Stamps {
    /// When each WR was posted (iteration mode).
    pub posted: Vec<u64>,
    /// When each WR's completion was seen (iteration mode).
    pub completed: Vec<u64>,
    /// WRs completed.
    pub count: u64,
    /// First post.
    pub start: u64,
    /// Last completion (or the end of the duration).
    pub end: u64,
    /// Receives completed.
    pub received: u64,
}

/// What one round does on this side.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    /// Message size.
    pub size: u64,
    /// WRs per QP (iteration mode).
    pub iters: u64,
    /// Run for this long instead.
    pub duration: Option<Duration>,
    /// This side posts sends.
    pub tx: bool,
    /// This side consumes receives (send tests).
    pub rx: bool,
}

/// One bandwidth figure (perftest's `struct bw_report_data`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Messages counted.
    pub iters: u64,
    /// Peak bandwidth (MiB/s or Gb/s).
    pub peak: f64,
    /// Average bandwidth.
    pub avg: f64,
    /// Messages per second, millions.
    pub msg_rate: f64,
}

/// Runs one round.
pub fn run(side: &mut Side, p: &Params, ctl: &mut Ctl, r: Round) -> Result<Stamps, String> {
    let nq = side.nqps();
    let total = r.iters * nq as u64;
    let l = p.flags.post_list as u64;
    let cq_mod = p.cq_mod as u64;
    let depth = p.tx_depth as u64;
    let mut st = Stamps::default();
    if r.tx && r.duration.is_none() {
        st.posted = vec![0; total as usize];
        st.completed = vec![0; total as usize];
    }
    let mut scnt = vec![0u64; nq];
    let mut ccnt = vec![0u64; nq];
    let mut last_sig = vec![0u64; nq];
    let (mut totscnt, mut totccnt) = (0u64, 0u64);
    // Receives: fill the RQs.
    let mut rposted = vec![0u64; nq];
    if r.rx {
        for (i, rp) in rposted.iter_mut().enumerate() {
            let n = if r.duration.is_some() {
                p.rx_depth as u64
            } else {
                (p.rx_depth as u64).min(r.iters)
            };
            for _ in 0..n {
                side.post_recv(p, i, r.size)?;
            }
            *rp = n;
        }
    }
    // Both sides' receive queues are full before anyone sends.
    ctl.sync()?;
    let mut wc = [Wc::default(); 16];
    let t0 = Instant::now();
    st.start = clock::cycles();
    let mut stop = false;
    let mut tx_done = !r.tx;
    let mut rx_done = !r.rx;
    let mut idle = 0u32;
    let mut next_progress = t0 + Duration::from_secs(1);
    while !(tx_done && rx_done) {
        if let Some(d) = r.duration {
            if !stop && t0.elapsed() >= d {
                stop = true;
                st.end = clock::cycles();
            }
            if Instant::now() >= next_progress {
                super::progress(&format!(
                    "{} s of {} s: {} messages",
                    t0.elapsed().as_secs(),
                    d.as_secs(),
                    st.count
                ));
                next_progress += Duration::from_secs(1);
            }
        }
        if r.tx && !stop {
            for i in 0..nq {
                while (r.duration.is_some() || scnt[i] < r.iters) && scnt[i] - ccnt[i] + l <= depth
                {
                    let end = scnt[i] + l;
                    let last = r.duration.is_none() && end >= r.iters;
                    let sig = end % cq_mod == 0 || last;
                    let covered = end - last_sig[i];
                    if !st.posted.is_empty() {
                        let now = clock::cycles();
                        for k in 0..l {
                            st.posted[(totscnt + k) as usize] = now;
                        }
                    }
                    side.post_send(p, i, r.size, l as u32, sig, ((i as u64) << 32) | covered)?;
                    if sig {
                        last_sig[i] = end;
                    }
                    scnt[i] = end;
                    totscnt += l;
                }
            }
        }
        let mut got = 0;
        if r.tx && !tx_done {
            let n = side.poll(false, &mut wc)?;
            got += n;
            let now = clock::cycles();
            for w in &wc[..n] {
                let q = (w.wr_id >> 32) as usize;
                let c = w.wr_id & 0xffff_ffff;
                if q < nq {
                    ccnt[q] += c;
                }
                if !st.completed.is_empty() {
                    for k in 0..c {
                        if let Some(t) = st.completed.get_mut((totccnt + k) as usize) {
                            *t = now;
                        }
                    }
                }
                totccnt += c;
                if r.duration.is_none() || !stop {
                    st.count += c;
                }
            }
            tx_done = if r.duration.is_some() {
                stop && (0..nq).all(|i| ccnt[i] >= last_sig[i])
            } else {
                totccnt >= total
            };
            if tx_done && r.duration.is_none() {
                st.end = now;
            }
        }
        if r.rx && !rx_done {
            let n = side.poll(true, &mut wc)?;
            got += n;
            for w in &wc[..n] {
                let q = w.wr_id as usize;
                st.received += 1;
                if q < nq && (r.duration.is_some() || rposted[q] < r.iters) {
                    side.post_recv(p, q, r.size)?;
                    rposted[q] += 1;
                }
            }
            if r.duration.is_none() && st.received >= total {
                rx_done = true;
            } else if n == 0 {
                idle += 1;
                if idle % 256 == 0 && ctl.peer_done() {
                    // The peer's sends are all complete: drain what came.
                    loop {
                        let n = side.poll(true, &mut wc)?;
                        if n == 0 {
                            break;
                        }
                        st.received += n as u64;
                    }
                    rx_done = true;
                }
            }
        }
        if got == 0 {
            super::idle();
        }
    }
    if st.end == 0 {
        st.end = clock::cycles();
    }
    Ok(st)
}

/// perftest's `print_report_bw` over `st` (`gbits`: Gb/s, else MiB/s).
pub fn report(p: &Params, st: &Stamps, size: u64, gbits: bool) -> BwReport {
    let per_sec = clock::MHZ * 1e6;
    let ff = if gbits { 125_000_000.0 } else { 1_048_576.0 };
    let n = st.count;
    let cycles = st.end.saturating_sub(st.start).max(1) as f64;
    let avg = size as f64 * n as f64 * per_sec / (cycles * ff);
    let msg_rate = n as f64 * per_sec / (cycles * 1e6);
    let peak = if st.posted.is_empty() || st.completed.is_empty() {
        0.0
    } else {
        let (tp, tc) = (&st.posted, &st.completed);
        let len = tp.len().min(tc.len());
        let cq = p.cq_mod as usize;
        let step = p.flags.post_list.max(1) as usize;
        let mut opt = tc[0].saturating_sub(tp[0]) as f64;
        let mut i = 0;
        while i < len {
            let mut j = (i + 1).next_multiple_of(cq) - 1;
            while j < len {
                let t = tc[j].saturating_sub(tp[i]) as f64 / (j - i + 1) as f64;
                if t < opt {
                    opt = t;
                }
                j += cq;
            }
            if len % cq != 0 {
                let j = len - 1;
                let t = tc[j].saturating_sub(tp[i]) as f64 / (j - i + 1) as f64;
                if t < opt {
                    opt = t;
                }
            }
            i += step;
        }
        if opt > 0.0 {
            size as f64 * per_sec / (opt * ff)
        } else {
            0.0
        }
    };
    BwReport {
        size,
        iters: n,
        peak,
        avg,
        msg_rate,
    }
}
