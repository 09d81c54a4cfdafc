//! The driver's data path alone, the UAR backed by plain memory: post one
//! 1-SGE RDMA WRITE with its doorbell (8-byte doorbell, and BlueFlame),
//! the cost per WQE of a batch of 32 with one doorbell, and polling one CQE
//! (a requester completion decoded into a work completion). Targets (issue
//! 6): <= 10 ns, <= 4 ns per WQE, <= 5 ns. rdma-core's mlx5 anchors are in
//! `performance-anchors.md`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use mlx5_hw::cqe::{CqeOpcode, CQE_OPCODE_SHIFT, CQE_OP_OWN_OFFSET, CQE_SIZE};
use mlx5_hw::ifc::cqe64;
use verbs::cq::{CqRing, Wc};
use verbs::mr::Sge;
use verbs::qp::{send_flags, SendRing, WqTrack};
use vfio::{DmaBuffer, Mmio};
use vm_memory::mmap::MmapRegion;

/// 1024 blocks (64 KiB): a usual queue depth, the ring staying in cache.
const LOG_SQ: u32 = 10;

fn uar() -> Arc<Mmio> {
    Arc::new(Mmio::new(
        MmapRegion::<()>::new(4096).expect("uar memory"),
        0,
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
        g.bench_function(format!("post 1 RDMA WRITE 1 SGE ({name})"), |b| {
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
        });
    }
    let (mut r, track) = ring(false);
    g.throughput(Throughput::Elements(32));
    g.bench_function("batch of 32 RDMA WRITEs, one doorbell (per batch)", |b| {
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
    g.bench_function("poll 1 CQE", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            let mut wc = [Wc::default(); 1];
            while left > 0 {
                fill(cq.ci());
                let k = left.min(n as u64);
                let t = Instant::now();
                for _ in 0..k {
                    // The Wc is observed: its decode cannot be dropped.
                    black_box(cq.poll_one_qp(&track, &mut wc));
                    black_box(&wc);
                }
                total += t.elapsed();
                left -= k;
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, post, poll);

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

/// `VERBS_POST_PROFILE=CASE,N[,R]` runs N operations of one case R times
/// (default 1) without criterion, and prints the best wall-clock ns per
/// operation; for `valgrind --tool=callgrind --toggle-collect='*profile_*'`
/// (instructions per operation = the collected count / N / R). CASE: `db`
/// (post 1, doorbell), `bf` (post 1, BlueFlame), `batch` (N WQEs in
/// batches of 32), `poll` (N CQEs, polled one at a time; refilling the
/// ring is not timed).
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
            other => panic!("VERBS_POST_PROFILE case {other}: db, bf, batch or poll"),
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
