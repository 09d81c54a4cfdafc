//! End to end: the driver (`verbs`) against the device model, two
//! functions cabled port to port on an in-process [`Fabric`], one RC
//! connection from A to B. Measured:
//!
//! - small RDMA WRITE message rate: 64-byte 1-SGE WRITEs posted in batches
//!   of up to 32 with one doorbell, every 32nd signaled, up to 512
//!   outstanding (as `ib_write_bw --post_list 32 --cq-mod 32` does);
//! - 64 KiB RDMA WRITE bandwidth, 16 outstanding, each signaled, against
//!   memcpy of 64 KiB with the same source and destination pattern, in the
//!   same run, two ways (issue 16 point 2):
//!   - "hot": one 64 KiB source, the destination walking 16 slots (1 MiB);
//!   - "> LLC": source and destination each walking 1024 slots (64 MiB
//!     each, 128 MiB together: past this machine's 32 MiB last-level cache).
//!
//! Targets: >= 5 M msg/s (issue 6), the WRITE >= 60% of memcpy like for
//! like (issue 16). Run with `cargo bench -p benches --bench datapath`; the
//! closing lines print the figures.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use mlx5_emu::{Fabric, Profile};
use verbs::cq::{Cq, Wc, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr};
use verbs::pd::Pd;
use verbs::qp::{
    required_mask, send_flags, AhAttr, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType,
};
use vfio::{DmaBuffer, PciFunction};

const SMALL: u32 = 64;
const BIG: usize = 64 << 10;
const SQ_DEPTH: u32 = 1024;
const SMALL_WINDOW: u32 = 512;
const BATCH: u32 = 32;
const BIG_WINDOW: u32 = 16;
/// Destination slots of the hot case (1 MiB).
const HOT_SLOTS: u64 = 16;
/// Source and destination slots of the > LLC case (64 MiB each).
const COLD_SLOTS: u64 = 1024;
const BUF: usize = BIG * COLD_SLOTS as usize;

struct Side {
    _ctx: Context,
    _pd: Pd,
    cq: Cq,
    _buf: Arc<DmaBuffer>,
    mr: Mr,
}

/// A connected RC QP on function A writing into B's MR.
struct Setup {
    _fabric: Fabric,
    a: Side,
    b: Side,
    qp: Qp,
    _qp_b: Qp,
}

fn side(f: Arc<dyn PciFunction>) -> Side {
    let ctx = Context::open(f, HcaOptions::default()).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(4096, None, None).expect("cq");
    let buf = DmaBuffer::new(BUF).expect("buffer");
    let acc = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    let mr = pd.reg_mr_buffer(&buf, 0, BUF, acc).expect("mr");
    Side {
        _ctx: ctx,
        _pd: pd,
        cq,
        _buf: buf,
        mr,
    }
}

fn qp(s: &Side) -> Qp {
    s._pd
        .create_qp(&QpInitAttr {
            send_cq: &s.cq,
            recv_cq: &s.cq,
            srq: None,
            cap: QpCap {
                max_send_wr: SQ_DEPTH,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .expect("qp")
}

/// RESET -> INIT -> RTR -> RTS towards `rqpn` on `remote`.
fn connect(qp: &mut Qp, remote: &Context, rqpn: u32) {
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        port_num: 1,
        qp_access_flags: access::REMOTE_WRITE | access::REMOTE_READ,
        ..Default::default()
    };
    qp.modify(
        &init,
        required_mask(QpType::Rc, QpState::Reset, QpState::Init),
    )
    .expect("init");
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: 5,
        dest_qp_num: rqpn,
        rq_psn: 0,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: remote.query_gid(1, 0).expect("gid"),
            sgid_index: 0,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    qp.modify(&rtr, required_mask(QpType::Rc, QpState::Init, QpState::Rtr))
        .expect("rtr");
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..Default::default()
    };
    qp.modify(&rts, required_mask(QpType::Rc, QpState::Rtr, QpState::Rts))
        .expect("rts");
}

fn setup() -> Setup {
    let fabric = Fabric::cabled(2, Profile::ConnectX4Lx);
    let f = |i| fabric.function(i).expect("function") as Arc<dyn PciFunction>;
    let a = side(f(0));
    let b = side(f(1));
    let mut qa = qp(&a);
    let mut qb = qp(&b);
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &b._ctx, nb);
    connect(&mut qb, &a._ctx, na);
    Setup {
        _fabric: fabric,
        a,
        b,
        qp: qa,
        _qp_b: qb,
    }
}

/// Where the WRITEs read and write: `slots` destinations of the message's
/// size in turn, and the source walking them too or fixed at offset 0.
#[derive(Clone, Copy)]
struct Walk {
    slots: u64,
    src_walks: bool,
}

/// The 64 B case and the hot 64 KiB case: one source, the destination
/// walking `HOT_SLOTS` (the 64 B case: one slot).
const HOT: Walk = Walk {
    slots: HOT_SLOTS,
    src_walks: false,
};
const COLD: Walk = Walk {
    slots: COLD_SLOTS,
    src_walks: true,
};

/// Posts `n` WRITEs of `len` bytes to B, `window` outstanding at most,
/// signaling every `sig`-th, placed as `walk` says; returns when all `n`
/// have completed.
fn run(s: &mut Setup, n: u64, len: u32, window: u32, sig: u32, batch: u32, walk: Walk) -> Duration {
    let raddr = s.b.mr.addr();
    let rkey = s.b.mr.rkey();
    let big = len as usize >= BIG;
    let fixed = s.a.mr.sge(0, len).expect("sge");
    let mut wc = [Wc::default(); 32];
    let mut posted: u64 = 0;
    let mut done: u64 = 0;
    let t = Instant::now();
    let deadline = t + Duration::from_secs(30);
    let mut idle: u32 = 0;
    while done < n {
        let out = (posted - done) as u32;
        let room = (window - out).min((n - posted) as u32);
        if room >= batch.min((n - posted) as u32) && room > 0 {
            let k = room.min(batch);
            let ring = s.qp.send_ring();
            for _ in 0..k {
                posted += 1;
                // Signal every `sig`-th and the last.
                let flags = if posted % u64::from(sig) == 0 || posted == n {
                    send_flags::SIGNALED
                } else {
                    0
                };
                let off = if big {
                    (posted % walk.slots) * BIG as u64
                } else {
                    0
                };
                let sge = if walk.src_walks {
                    s.a.mr.sge(off, len).expect("sge")
                } else {
                    fixed
                };
                ring.write_rdma_write(posted, raddr + off, rkey, &sge, flags)
                    .expect("post");
            }
            ring.ring();
        }
        let k = s.a.cq.poll(&mut wc).expect("poll");
        for w in &wc[..k] {
            assert_eq!(w.status, WcStatus::Success, "completion {w:?}");
            done = w.wr_id;
        }
        if k == 0 {
            idle += 1;
            if idle % 1024 == 0 {
                assert!(Instant::now() < deadline, "{done} of {n} completed");
            }
            // The model's worker needs a core too (two here).
            std::thread::yield_now();
        }
    }
    t.elapsed()
}

/// Figures of this run, for the closing lines: (messages or bytes, time).
static FIGURES: Mutex<[(f64, f64); 5]> = Mutex::new([(0.0, 0.0); 5]);

fn record(i: usize, amount: u64, t: Duration) {
    let mut f = FIGURES.lock().unwrap_or_else(|p| p.into_inner());
    f[i].0 += amount as f64;
    f[i].1 += t.as_secs_f64();
}

fn datapath(c: &mut Criterion) {
    let mut s = setup();
    let mut g = c.benchmark_group("datapath");
    g.measurement_time(Duration::from_secs(5));

    g.throughput(Throughput::Elements(1));
    g.bench_function("RDMA WRITE 64 B message rate (A -> B)", |b| {
        b.iter_custom(|iters| {
            let t = run(&mut s, iters, SMALL, SMALL_WINDOW, BATCH, BATCH, HOT);
            record(0, iters, t);
            t
        })
    });

    // memcpy between two buffers as large as the MRs, 64 KiB at a time,
    // from and to the offsets the WRITEs of the same case use.
    let src = vec![0x5au8; BUF];
    let mut dst = vec![0u8; BUF];
    g.throughput(Throughput::Bytes(BIG as u64));
    for (k, name, walk) in [(1, "hot", HOT), (3, "> LLC", COLD)] {
        g.bench_function(
            format!("RDMA WRITE 64 KiB bandwidth (A -> B, {name})"),
            |b| {
                b.iter_custom(|iters| {
                    let t = run(&mut s, iters, BIG as u32, BIG_WINDOW, 1, 1, walk);
                    record(k, iters * BIG as u64, t);
                    t
                })
            },
        );
        let mut i = 0u64;
        g.bench_function(format!("memcpy 64 KiB ({name})"), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    // As `run` places the n-th WRITE (n from 1).
                    i += 1;
                    let o = ((i % walk.slots) * BIG as u64) as usize;
                    let so = if walk.src_walks { o } else { 0 };
                    dst[o..o + BIG].copy_from_slice(black_box(&src[so..so + BIG]));
                    black_box(&mut dst);
                }
                let t = t.elapsed();
                record(k + 1, iters * BIG as u64, t);
                t
            })
        });
    }
    g.finish();

    let f = *FIGURES.lock().unwrap_or_else(|p| p.into_inner());
    let per_s = |i: usize| f[i].0 / f[i].1;
    println!(
        "datapath: 64 B RDMA WRITE {:.2} M msg/s (target >= 5)",
        per_s(0) / 1e6
    );
    for (k, name) in [(1, "hot"), (3, "> LLC")] {
        println!(
            "datapath: 64 KiB RDMA WRITE ({name}) {:.2} GB/s, memcpy {:.2} GB/s: {:.0}% of memcpy \
             (target >= 60%)",
            per_s(k) / 1e9,
            per_s(k + 1) / 1e9,
            100.0 * per_s(k) / per_s(k + 1)
        );
    }
}

criterion_group!(benches, datapath);

/// `DATAPATH_PROFILE=N[,M]` runs N small and M (default N/64) large
/// WRITEs without criterion (for `valgrind --tool=callgrind`), else the
/// benches.
fn main() {
    let arg = std::env::var("DATAPATH_PROFILE").ok();
    let mut nums = arg
        .iter()
        .flat_map(|v| v.split(','))
        .map(|x| x.trim().parse::<u64>().ok());
    if let Some(Some(n)) = nums.next() {
        let m = nums.next().flatten().unwrap_or(n / 64);
        let mut s = setup();
        let t = run(&mut s, n, SMALL, SMALL_WINDOW, BATCH, BATCH, HOT);
        println!("{n} x 64 B WRITE in {t:?}");
        let t = run(&mut s, m, BIG as u32, BIG_WINDOW, 1, 1, HOT);
        println!("{m} x 64 KiB WRITE in {t:?}");
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
