//! Issue 22's benchmarks, in one run (`cargo bench -p benches --bench
//! memory_features`):
//!
//! - `scatter_to_cqe`: the receive side of 32-byte SENDs, polls per
//!   second (criterion's elements/s: one element is one receive
//!   completion polled). Two cabled ConnectX-5 models; B posts [`RING`]
//!   receives of 64 bytes, A sends [`RING`] 32-byte SENDs, the model
//!   writes B's [`RING`] receive CQEs, then the models stop and the bench
//!   polls that ring lap after lap (owner bits flipped between laps,
//!   outside the timing). Cases: `buffer` (a QP created with
//!   `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`: the data is in the receive
//!   buffer, the poll only decodes), `cqe+copy` (scatter to CQE, the poll
//!   copies the 32 bytes into the receive WQE's segment as libmlx5 does)
//!   and `cqe in place` (`Cq::poll_inline`: the bytes handed out from the
//!   CQE). The driver's side only: what the device saves (a PCIe write of
//!   the payload per message) does not show in a model.
//! - `memic_write`: the latency of one signaled 64-byte RDMA WRITE, posted
//!   and its completion polled, into device memory (a `reg_dm_mr` over
//!   `alloc_dm`) against into host memory (a `reg_mr_buffer`), two cabled
//!   ConnectX-5 models running; and `memcpy_to_dm` of 64 bytes (16 4-byte
//!   MMIO stores into BAR0) against a 64-byte copy into host DMA memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::connect;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mlx5_emu::{Fabric, Profile};
use mlx5_hw::ifc::{query_cq_in, query_cq_out, QueryCqIn};
use mlx5_hw::opcode::Opcode;
use verbs::cq::{Cq, Wc, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr};
use verbs::pd::Pd;
use verbs::qp::{send_flags, Payload, Qp, QpCap, QpInitAttr, QpType, RecvWr, SendOp, SendWr};
use verbs::scatter_cqe::{dv_flags, InlineRecv};
use vfio::emulated::DeviceModel;
use vfio::IovaMemory;
use vfio::{DmaBuffer, PciFunction};
use vm_memory::{Bytes, GuestAddress};

/// Receive CQEs per lap (B's CQ is this big).
const RING: usize = 1024;
/// Bytes per SEND.
const MSG: usize = 32;

struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    _buf: Arc<DmaBuffer>,
    mr: Mr,
}

fn side(f: Arc<dyn PciFunction>) -> Side {
    let opts = HcaOptions {
        health_interval: None,
        ..HcaOptions::default()
    };
    let ctx = Context::open(f, opts).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(RING as u32 - 1, None, None).expect("cq");
    let buf = DmaBuffer::new(1 << 20).expect("buffer");
    let acc = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    let mr = pd.reg_mr_buffer(&buf, 0, 1 << 20, acc).expect("mr");
    Side {
        ctx,
        pd,
        cq,
        _buf: buf,
        mr,
    }
}

fn qp(s: &Side, flags: u32) -> Qp {
    let attr = QpInitAttr {
        send_cq: &s.cq,
        recv_cq: &s.cq,
        srq: None,
        cap: QpCap {
            max_send_wr: RING as u32,
            max_recv_wr: RING as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    s.pd.create_qp_dv(&attr, flags).expect("qp")
}

/// B's CQ full of [`RING`] receive CQEs of 32-byte SENDs, the models
/// stopped; the ring's place in B's memory for the refills.
struct RecvRig {
    _fabric: Fabric,
    _a: Side,
    b: Side,
    _qps: (Qp, Qp),
    ring: (Arc<IovaMemory>, u64),
}

fn cq_iova(ctx: &Context, cqn: u32) -> u64 {
    let mut inb = [0u8; query_cq_in::SIZE_BYTES];
    QueryCqIn::new_unchecked(&mut inb[..])
        .set_opcode(Opcode::QueryCq.to_raw())
        .set_cqn(cqn);
    let out = ctx
        .hca()
        .cmd()
        .exec(&inb, query_cq_out::SIZE_BYTES + 8)
        .expect("QUERY_CQ");
    let p = query_cq_out::SIZE_BYTES;
    u64::from_be_bytes(out[p..p + 8].try_into().expect("pas[0]"))
}

impl RecvRig {
    fn new(flags: u32) -> Self {
        let fabric = Fabric::cabled(2, Profile::ConnectX5);
        let f = |i| fabric.function(i).expect("function");
        let (fa, fb) = (f(0), f(1));
        let mut a = side(fa.clone() as Arc<dyn PciFunction>);
        let mut b = side(fb.clone() as Arc<dyn PciFunction>);
        let (mut qa, mut qb) = (qp(&a, 0), qp(&b, flags));
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        connect(&mut qa, &b.ctx, nb);
        connect(&mut qb, &a.ctx, na);
        for i in 0..RING {
            let sge = b.mr.sge((i * 64) as u64, 64).expect("sge");
            qb.post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: &[sge],
            }])
            .expect("post_recv");
        }
        let before = fb.model().stats().cqes;
        let sge = a.mr.sge(0, MSG as u32).expect("sge");
        for i in 0..RING {
            let sig = if i % 64 == 63 {
                send_flags::SIGNALED
            } else {
                0
            };
            qa.post_send(&[SendWr {
                wr_id: i as u64,
                op: SendOp::Send,
                payload: Payload::Sges(&[sge]),
                flags: sig,
                ud: None,
            }])
            .expect("post_send");
            if i % 64 == 63 {
                let mut wc = [Wc::default()];
                let deadline = Instant::now() + Duration::from_secs(60);
                while a.cq_poll_one(&mut wc) == 0 {
                    assert!(Instant::now() < deadline, "no send completion");
                    std::thread::yield_now();
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while fb.model().stats().cqes < before + RING as u64 {
            assert!(Instant::now() < deadline, "the model wrote no CQEs");
            std::thread::yield_now();
        }
        let iova = cq_iova(&b.ctx, b.cq.cqn());
        fa.model().shutdown();
        fb.model().shutdown();
        let mem = fb.bus().dma.memory();
        // Polled once: the CQEs are known good receives.
        let mut wc = [Wc::default(); 16];
        let mut n = 0;
        while n < RING {
            let k = b.cq.poll(&mut wc).expect("poll");
            assert!(wc[..k].iter().all(|w| w.status == WcStatus::Success));
            assert!(wc[..k].iter().all(|w| w.byte_len == MSG as u32));
            n += k;
        }
        let rig = Self {
            _fabric: fabric,
            _a: a,
            b,
            _qps: (qa, qb),
            ring: (mem, iova),
        };
        rig.refill();
        rig
    }

    /// Flips every CQE's owner bit: the ring is full again.
    fn refill(&self) {
        let (mem, iova) = &self.ring;
        for i in 0..RING as u64 {
            let at = GuestAddress(iova + i * 64 + 63);
            let b: u8 = mem.read_obj(at).expect("op_own");
            mem.write_obj(b ^ 1, at).expect("op_own");
        }
    }

    /// The format bits of CQE 0 (1: 32 bytes in the CQE).
    fn format(&self) -> u8 {
        let (mem, iova) = &self.ring;
        let b: u8 = mem.read_obj(GuestAddress(iova + 63)).expect("op_own");
        (b >> 2) & 3
    }
}

trait PollOne {
    fn cq_poll_one(&mut self, wc: &mut [Wc; 1]) -> usize;
}

impl PollOne for Side {
    fn cq_poll_one(&mut self, wc: &mut [Wc; 1]) -> usize {
        self.cq.poll(wc).expect("poll")
    }
}

/// Times `laps` whole laps of `poll` (refills between laps not counted).
fn laps(rig: &mut RecvRig, laps: u64, mut poll: impl FnMut(&mut Cq) -> usize) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..laps {
        let t = Instant::now();
        let mut n = 0;
        while n < RING {
            n += poll(&mut rig.b.cq);
        }
        total += t.elapsed();
        rig.refill();
    }
    total
}

fn scatter_to_cqe(c: &mut Criterion) {
    let mut buffer = RecvRig::new(dv_flags::DISABLE_SCATTER_TO_CQE);
    let mut cqe = RecvRig::new(0);
    assert_eq!(buffer.format(), 0, "disabled: no data in the CQE");
    assert_eq!(cqe.format(), 1, "32 bytes in the CQE");
    let mut g = c.benchmark_group("scatter_to_cqe");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(RING as u64));
    let mut wc = [Wc::default(); 16];
    g.bench_function("buffer", |b| {
        b.iter_custom(|n| laps(&mut buffer, n, |cq| cq.poll(&mut wc).expect("poll")))
    });
    g.bench_function("cqe+copy", |b| {
        b.iter_custom(|n| laps(&mut cqe, n, |cq| cq.poll(&mut wc).expect("poll")))
    });
    let mut inl = [InlineRecv::default(); 16];
    g.bench_function("cqe in place", |b| {
        b.iter_custom(|n| {
            laps(&mut cqe, n, |cq| {
                let k = cq.poll_inline(&mut wc, &mut inl).expect("poll");
                std::hint::black_box(&inl[..k]);
                k
            })
        })
    });
    g.finish();
    // The models are stopped: closing would wait out every command's
    // timeout. Leaked, as `benches::ApiRig` is.
    std::mem::forget(buffer);
    std::mem::forget(cqe);
}

/// One signaled WRITE of `sge` to `(raddr, rkey)`, its completion polled.
fn write_once(qp: &mut Qp, cq: &mut Cq, sge: &verbs::mr::Sge, raddr: u64, rkey: u32) {
    qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite { raddr, rkey },
        payload: Payload::Sges(std::slice::from_ref(sge)),
        flags: send_flags::SIGNALED,
        ud: None,
    }])
    .expect("post");
    let mut wc = [Wc::default()];
    while cq.poll(&mut wc).expect("poll") == 0 {
        std::hint::spin_loop();
    }
    assert_eq!(wc[0].status, WcStatus::Success);
}

fn memic_write(c: &mut Criterion) {
    let fabric = Fabric::cabled(2, Profile::ConnectX5);
    let f = |i| fabric.function(i).expect("function") as Arc<dyn PciFunction>;
    let mut a = side(f(0));
    let b = side(f(1));
    let (mut qa, mut qb) = (qp(&a, 0), qp(&b, 0));
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &b.ctx, nb);
    connect(&mut qb, &a.ctx, na);
    let dm = b.ctx.alloc_dm(4096, 0).expect("alloc_dm");
    let acc = access::LOCAL_WRITE | access::REMOTE_WRITE | access::ZERO_BASED;
    let dm_mr = b.pd.reg_dm_mr(&dm, 0, 4096, acc).expect("reg_dm_mr");
    let sge = a.mr.sge(0, 64).expect("sge");
    let mut g = c.benchmark_group("memic_write");
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("rdma_write 64 B host", |bch| {
        bch.iter(|| write_once(&mut qa, &mut a.cq, &sge, b.mr.addr(), b.mr.rkey()))
    });
    g.bench_function("rdma_write 64 B memic", |bch| {
        bch.iter(|| write_once(&mut qa, &mut a.cq, &sge, 0, dm_mr.rkey()))
    });
    let data = [0x5au8; 64];
    g.bench_function("memcpy_to_dm 64 B", |bch| {
        bch.iter(|| {
            dm.memcpy_to_dm(64, std::hint::black_box(&data))
                .expect("memcpy")
        })
    });
    let host = DmaBuffer::new(4096).expect("buffer");
    g.bench_function("copy to host DMA memory 64 B", |bch| {
        bch.iter(|| host.write(64, std::hint::black_box(&data)).expect("write"))
    });
    g.finish();
    drop(dm_mr);
    drop(dm);
}

criterion_group!(benches, scatter_to_cqe, memic_write);
criterion_main!(benches);
