//! The driver's data path alone, no device reading it (what each case
//! times and leaves out: `benches/README.md`).
//!
//! - `verbs_api`: the public API, as users call it, on a QP and CQ made
//!   through `verbs` on the in-process model, the model then stopped
//!   ([`benches::ApiRig`]): `Qp::post_send` of one 1-SGE RDMA WRITE and of
//!   a 32-WR list, the `wr_*` batch of 1 and of 32, `Cq::poll` of 1 and of
//!   16 entries per call, every timed poll finding CQEs. Targets (issue 16):
//!   <= 6 ns, <= 2.5 ns per WR, poll <= 5 ns, <= 3 ns per CQE.
//! - `verbs_post` / `verbs_poll`, "low-level": the ring types alone
//!   (`SendRing::write_rdma_write` + `ring()`, `CqRing::poll_one_qp` handed
//!   its QP), the UAR plain memory. Targets (issue 6): <= 10 ns, <= 4 ns per
//!   WQE, <= 5 ns.
//!
//! rdma-core's mlx5 figures are in `performance-anchors.md`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{ApiRig, RING};
use criterion::{criterion_group, Criterion, Throughput};
use mlx5_hw::cqe::{CqeOpcode, CQE_OPCODE_SHIFT, CQE_OP_OWN_OFFSET, CQE_SIZE};
use mlx5_hw::ifc::cqe64;
use verbs::cq::{CqRing, Wc};
use verbs::mr::Sge;
use verbs::qp::{send_flags, SendRing, WqTrack};
use verbs::wr::SendWr;
use vfio::{DmaBuffer, MemType, Mmio};
use vm_memory::mmap::MmapRegion;

/// 1024 blocks (64 KiB): a usual queue depth, the ring staying in cache.
const LOG_SQ: u32 = 10;

/// Plain memory standing in for a write-combining UAR (so that BlueFlame
/// may be chosen).
fn uar() -> Arc<Mmio> {
    Arc::new(Mmio::with_type(
        MmapRegion::<()>::new(4096).expect("uar memory"),
        0,
        MemType::WriteCombining,
    ))
}

fn ring(blueflame: bool) -> (SendRing, Arc<WqTrack>) {
    let buf = DmaBuffer::new(64 << LOG_SQ).expect("sq");
    let dbrec = DmaBuffer::new(4096).expect("dbrec");
    let track = WqTrack::new(0x123, 1 << LOG_SQ, 0);
    let mut r = SendRing::new(buf, 0, LOG_SQ, dbrec, 4, uar(), 0x800, track.clone()).expect("ring");
    r.set_blueflame(blueflame);
    (r, track)
}

fn post(c: &mut Criterion) {
    // SAFETY: a bench SGE that the driver-alone ring never hands to a device.
    let sge = unsafe { Sge::new_unchecked(0x1000, 64, 0x100) };
    let mut g = c.benchmark_group("verbs_post");
    g.measurement_time(Duration::from_secs(4));
    for (name, bf) in [("doorbell", false), ("blueflame", true)] {
        let (mut r, track) = ring(bf);
        let mut i: u64 = 0;
        g.bench_function(
            format!("low-level: post 1 RDMA WRITE 1 SGE ({name})"),
            |b| {
                b.iter(|| {
                    i += 1;
                    if i & 1023 == 0 {
                        // The device stand-in completes everything posted so far.
                        track.sq_complete(r.pc().wrapping_sub(1) as u16);
                    }
                    let _ = r.write_rdma_write(
                        i,
                        black_box(0x2000),
                        black_box(7),
                        &sge,
                        send_flags::SIGNALED,
                    );
                    r.ring();
                })
            },
        );
    }
    let (mut r, track) = ring(false);
    g.throughput(Throughput::Elements(32));
    g.bench_function("low-level: batch of 32 RDMA WRITEs, one doorbell", |b| {
        b.iter(|| {
            track.sq_complete(r.pc().wrapping_sub(1) as u16);
            for k in 0..32u64 {
                let _ = r.write_rdma_write(k, black_box(0x2000), 7, &sge, 0);
            }
            r.ring();
        })
    });
    g.finish();
}

/// A CQ ring, the tracking of its one QP, and the device stand-in: fills
/// the whole ring with requester CQEs of the pass that begins at `ci`.
fn cq_ring() -> (CqRing, Arc<WqTrack>, impl Fn(u32)) {
    let n = 1usize << LOG_CQ;
    let buf = DmaBuffer::new(n * CQE_SIZE).expect("cq");
    let dbrec = DmaBuffer::new(4096).expect("dbrec");
    let track = WqTrack::new(0x123, 1 << 16, 0);
    let cq = CqRing::new(buf.clone(), LOG_CQ, dbrec, 0, 7, uar(), 0).expect("cq ring");
    let fill = move |ci: u32| {
        let owner = ((ci >> LOG_CQ) & 1) as u8;
        let mut e = [0u8; CQE_SIZE];
        let q = cqe64::SOP_DROP_QPN.off / 8;
        e[q..q + 4].copy_from_slice(&((0x08u32 << 24) | 0x123).to_be_bytes());
        for i in 0..n {
            let w = cqe64::WQE_COUNTER.off / 8;
            e[w..w + 2].copy_from_slice(&(i as u16).to_be_bytes());
            e[CQE_OP_OWN_OFFSET] = (CqeOpcode::Req.to_raw() << CQE_OPCODE_SHIFT) | owner;
            buf.write(i * CQE_SIZE, &e).expect("cqe");
        }
    };
    (cq, track, fill)
}

fn poll(c: &mut Criterion) {
    let n = 1usize << LOG_CQ;
    let (mut cq, track, fill) = cq_ring();
    let mut g = c.benchmark_group("verbs_poll");
    g.measurement_time(Duration::from_secs(4));
    g.bench_function("low-level: poll 1 CQE", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            let mut wc = [Wc::default(); 1];
            let mut got = 0u64;
            while left > 0 {
                // The rest of this lap only: each timed poll finds a CQE.
                fill(cq.ci());
                let k = left.min((n - cq.ci() as usize % n) as u64);
                let t = Instant::now();
                for _ in 0..k {
                    // The Wc is observed: its decode cannot be dropped.
                    got += cq.poll_one_qp(&track, &mut wc) as u64;
                    black_box(&wc);
                }
                total += t.elapsed();
                left -= k;
            }
            assert_eq!(got, iters, "a timed poll found no CQE");
            total
        })
    });
    g.finish();
}

/// Posts through `Qp::post_send` or the `wr_*` batch, `per` WRs a call.
fn api_post(c: &mut Criterion, rig: &mut ApiRig) {
    let sge = rig.sge();
    let (raddr, rkey) = rig.remote();
    let list: Vec<SendWr<'_>> = (0..32)
        .map(|k| ApiRig::write_wr(k, raddr, rkey, &sge))
        .collect();
    let base = rig.qp.send_ring().pc();
    let mut g = c.benchmark_group("verbs_api");
    g.measurement_time(Duration::from_secs(4));
    for per in [1usize, 32] {
        g.throughput(Throughput::Elements(per as u64));
        let mut i = 0u32;
        let qp = &mut rig.qp;
        g.bench_function(format!("post_send {per} RDMA WRITE"), |b| {
            b.iter(|| {
                // Checked as a caller's `?` checks it (its tag), not handed
                // out whole: a copy of the whole result read back at once
                // would wait for the callee's stores (no store forwarding
                // from two stores to one load), a cost of the bench's copy.
                qp.post_send(black_box(&list[..per])).expect("post");
                i += per as u32;
                if i >= RING as u32 / 2 {
                    // Every WQE done (rdma-core's harness: sq.tail = sq.head).
                    qp.send_ring().rewind(base);
                    i = 0;
                }
            })
        });
        let mut i = 0u32;
        g.bench_function(format!("wr_* {per} RDMA WRITE, wr_complete"), |b| {
            b.iter(|| {
                let mut w = qp.wr_start();
                for k in 0..per as u64 {
                    w.wr_id(k, send_flags::SIGNALED)
                        .rdma_write(rkey, black_box(raddr))
                        .set_sge(sge);
                }
                w.complete().expect("post");
                i += per as u32;
                if i >= RING as u32 / 2 {
                    qp.send_ring().rewind(base);
                    i = 0;
                }
            })
        });
    }
    g.finish();
}

/// `Cq::poll` with `per` entries a call; every timed call returns `per`.
fn api_poll(c: &mut Criterion, rig: &mut ApiRig) {
    let mut g = c.benchmark_group("verbs_api");
    g.measurement_time(Duration::from_secs(4));
    // CQEs left in this lap of the ring (the rig starts with a full one).
    let mut left = RING;
    for per in [1usize, 16] {
        g.throughput(Throughput::Elements(per as u64));
        g.bench_function(
            format!("Cq::poll {per} (only polls that return CQEs)"),
            |b| {
                b.iter_custom(|iters| {
                    let mut wc = [Wc::default(); 16];
                    let mut total = Duration::ZERO;
                    let mut calls = iters;
                    let mut got = 0u64;
                    while calls > 0 {
                        if left < per {
                            // Not timed: the rest of the lap (a case before
                            // may have left fewer than `per`), then the
                            // device stand-in hands the CQEs back.
                            while left > 0 {
                                let n = rig.cq().poll(&mut wc[..1]).unwrap_or(0);
                                assert_eq!(n, 1, "the rest of the lap");
                                left -= 1;
                            }
                            rig.refill_cq();
                            left = RING;
                        }
                        let k = calls.min((left / per) as u64);
                        let cq = rig.cq();
                        let t = Instant::now();
                        for _ in 0..k {
                            got += cq.poll(&mut wc[..per]).unwrap_or(0) as u64;
                            black_box(&wc);
                        }
                        total += t.elapsed();
                        left -= k as usize * per;
                        calls -= k;
                    }
                    assert_eq!(got, iters * per as u64, "a timed poll came back short");
                    total
                })
            },
        );
    }
    g.finish();
}

fn api(c: &mut Criterion) {
    let rig = ApiRig::new();
    api_post(c, rig);
    api_poll(c, rig);
}

criterion_group!(benches, api, post, poll);

/// A CQ ring of `2^LOG_CQ` entries and the device stand-in that fills it.
const LOG_CQ: u8 = 10;

#[inline(never)]
fn profile_post1(r: &mut SendRing, track: &WqTrack, sge: &Sge, n: u64) {
    for i in 0..n {
        if i & 1023 == 0 {
            track.sq_complete(r.pc().wrapping_sub(1) as u16);
        }
        let _ = r.write_rdma_write(
            i,
            black_box(0x2000),
            black_box(7),
            sge,
            send_flags::SIGNALED,
        );
        r.ring();
    }
}

#[inline(never)]
fn profile_batch32(r: &mut SendRing, track: &WqTrack, sge: &Sge, batches: u64) {
    for _ in 0..batches {
        track.sq_complete(r.pc().wrapping_sub(1) as u16);
        for k in 0..32u64 {
            let _ = r.write_rdma_write(k, black_box(0x2000), 7, sge, 0);
        }
        r.ring();
    }
}

#[inline(never)]
fn profile_poll(cq: &mut CqRing, track: &WqTrack, k: u64) {
    let mut wc = [Wc::default(); 1];
    for _ in 0..k {
        black_box(cq.poll_one_qp(track, &mut wc));
        black_box(&wc);
    }
}

/// `n` WRs through `post_send` (`per` a call) or the `wr_*` batch.
#[inline(never)]
fn profile_api_post(rig: &mut ApiRig, wr: bool, per: usize, n: u64) {
    let sge = rig.sge();
    let (raddr, rkey) = rig.remote();
    let list: Vec<SendWr<'_>> = (0..per as u64)
        .map(|k| ApiRig::write_wr(k, raddr, rkey, &sge))
        .collect();
    let base = rig.qp.send_ring().pc();
    let qp = &mut rig.qp;
    let mut i = 0;
    for _ in 0..n / per as u64 {
        let r = if wr {
            let mut w = qp.wr_start();
            for k in 0..per as u64 {
                w.wr_id(k, send_flags::SIGNALED)
                    .rdma_write(rkey, black_box(raddr))
                    .set_sge(sge);
            }
            w.complete().map_err(|e| (0, e))
        } else {
            qp.post_send(black_box(&list))
        };
        assert!(r.is_ok(), "post");
        i += per;
        if i >= RING / 2 {
            qp.send_ring().rewind(base);
            i = 0;
        }
    }
}

/// `n` CQEs through `Cq::poll`, `per` a call: only the laps are timed and
/// collected (`profile_api_poll_lap`), not the refills.
fn api_poll_laps(rig: &mut ApiRig, per: usize, n: u64) -> Duration {
    let mut left = n;
    let mut t = Duration::ZERO;
    while left > 0 {
        let k = left.min(RING as u64);
        let s = Instant::now();
        profile_api_poll_lap(rig, per, k);
        t += s.elapsed();
        rig.refill_cq();
        left -= k;
    }
    t
}

#[inline(never)]
fn profile_api_poll_lap(rig: &mut ApiRig, per: usize, k: u64) {
    let mut wc = [Wc::default(); 16];
    let cq = rig.cq();
    let mut got = 0;
    for _ in 0..k / per as u64 {
        got += cq.poll(&mut wc[..per]).unwrap_or(0) as u64;
        black_box(&wc);
    }
    assert_eq!(got, k / per as u64 * per as u64, "a poll came back short");
}

/// `VERBS_POST_PROFILE=CASE,N[,R]` runs N operations of one case R times
/// (default 1) without criterion, and prints the best wall-clock ns per
/// operation; for `valgrind --tool=callgrind --toggle-collect='*profile_*'`
/// (instructions per operation = the collected count / N / R). CASE: `db`
/// (post 1, doorbell), `bf` (post 1, BlueFlame), `batch` (N WQEs in
/// batches of 32), `poll` (N CQEs, polled one at a time; refilling the
/// ring is not timed); through the public API: `api-post1`, `api-post32`
/// (`post_send` of 1 or a 32-WR list), `api-wr1`, `api-wr32` (the `wr_*`
/// batch), `api-poll1`, `api-poll16` (`Cq::poll` of 1 or 16; N a multiple
/// of 1024). The API cases first build [`ApiRig`] (through the model,
/// which callgrind does not collect).
fn profile(case: &str, n: u64, rounds: u32) {
    // SAFETY: a bench SGE that the driver-alone ring never hands to a device.
    let sge = unsafe { Sge::new_unchecked(0x1000, 64, 0x100) };
    let mut best = f64::INFINITY;
    for _ in 0..rounds.max(1) {
        let mut t = Duration::ZERO;
        match case {
            "db" | "bf" => {
                let (mut r, track) = ring(case == "bf");
                let s = Instant::now();
                profile_post1(&mut r, &track, &sge, n);
                t = s.elapsed();
            }
            "batch" => {
                let (mut r, track) = ring(false);
                let s = Instant::now();
                profile_batch32(&mut r, &track, &sge, n / 32);
                t = s.elapsed();
            }
            "poll" => {
                let (mut cq, track, fill) = cq_ring();
                let mut left = n;
                while left > 0 {
                    fill(cq.ci());
                    let k = left.min(1 << LOG_CQ);
                    let s = Instant::now();
                    profile_poll(&mut cq, &track, k);
                    t += s.elapsed();
                    left -= k;
                }
            }
            api if api.starts_with("api-") => {
                let rig = ApiRig::new();
                let (kind, per) =
                    api[4..].split_at(api[4..].find(|c: char| c.is_ascii_digit()).unwrap_or(0));
                let per: usize = per.parse().expect("api-CASE<per call>");
                if kind == "poll" {
                    t = api_poll_laps(rig, per, n);
                } else {
                    let s = Instant::now();
                    profile_api_post(rig, kind == "wr", per, n);
                    t = s.elapsed();
                }
            }
            other => panic!("VERBS_POST_PROFILE case {other}: db, bf, batch, poll, api-*"),
        }
        best = best.min(t.as_secs_f64() * 1e9 / n.max(1) as f64);
    }
    println!("{case}: {n} operations x {rounds}: best {best:.2} ns per operation");
}

fn main() {
    if let Ok(v) = std::env::var("VERBS_POST_PROFILE") {
        let mut it = v.split(',').map(str::trim);
        let case = it.next().unwrap_or("db").to_owned();
        let num = |x: Option<&str>, d: u64| x.map_or(Ok(d), str::parse::<u64>);
        let n = num(it.next(), 1_000_000).expect("VERBS_POST_PROFILE=CASE,N[,R]");
        let r = num(it.next(), 1).expect("VERBS_POST_PROFILE=CASE,N[,R]");
        profile(&case, n, r as u32);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
