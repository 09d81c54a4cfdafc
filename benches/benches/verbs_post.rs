//! The driver's data path alone, the UAR backed by plain memory: post one
//! 1-SGE RDMA WRITE with its doorbell (8-byte doorbell, and BlueFlame),
//! the cost per WQE of a batch of 32 with one doorbell, and polling one CQE
//! (a requester completion decoded into a work completion). Targets (issue
//! 6): <= 10 ns, <= 4 ns per WQE, <= 5 ns. rdma-core's mlx5 anchors are in
//! `performance-anchors.md`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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

fn poll(c: &mut Criterion) {
    const LOG_CQ: u8 = 10;
    let n = 1usize << LOG_CQ;
    let buf = DmaBuffer::new(n * CQE_SIZE).expect("cq");
    let dbrec = DmaBuffer::new(4096).expect("dbrec");
    let track = WqTrack::new(0x123, 1 << 16, 0);
    let mut cq = CqRing::new(buf.clone(), LOG_CQ, dbrec, 0, 7, uar(), 0).expect("cq ring");
    // The device stand-in: fills the whole ring with requester CQEs of the
    // pass that begins at `ci`.
    let fill = |ci: u32| {
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
                    black_box(cq.poll_one_qp(&track, &mut wc));
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
criterion_main!(benches);
