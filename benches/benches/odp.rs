//! On-demand paging (issue 21, point 5), two cabled ConnectX-5 models in
//! this process, RDMA WRITEs from a pinned region of A into an ODP region
//! of B (anonymous process memory), on the system clock (B's RNR NAKs
//! while a fault is handled cost the requester the RNR timer, code 1:
//! 10 us, as hardware would):
//!
//! - `first touch 4 KiB` / `first touch 2 MiB`: one WRITE of 4 KiB / 2 MiB
//!   into pages the device never had mapped: fault event, the driver's
//!   fault thread (vma check, DMA map, UMR of the MTT entries, resume),
//!   the requester's RNR retry, the data. Untimed between iterations:
//!   the region is invalidated when its pages run out.
//! - `steady odp 64 KiB` / `steady pinned 64 KiB`: the same WRITE into
//!   mapped ODP pages against a pinned `reg_mr_buffer` region.
//! - `fault 64 KiB` / `prefetch 64 KiB`: a WRITE into 16 unmapped pages,
//!   faulting, against `advise_mr(PREFETCH_WRITE)` of them then the WRITE
//!   (both invalidated again untimed).
//!
//! `cargo bench -p benches --bench odp`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mlx5_emu::{Fabric, Profile};
use verbs::cq::{Cq, Wc, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr};
use verbs::odp::{advice, OdpMr};
use verbs::pd::Pd;
use verbs::qp::{send_flags, Payload, Qp, QpCap, QpInitAttr, QpType, SendOp, SendWr};
use vfio::{DmaBuffer, PciFunction};

const ACC: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
/// B's ODP region: 64 MiB of address space, backed as it is touched.
const REGION: usize = 64 << 20;

struct Rig {
    _fabric: Fabric,
    _ctxs: [Context; 2],
    _pds: [Pd; 2],
    cq: Cq,
    _cqb: Cq,
    qp: Qp,
    _qpb: Qp,
    src: Mr,
    _buf: Arc<DmaBuffer>,
    pinned: Mr,
    _pinned_buf: Arc<DmaBuffer>,
    odp: OdpMr,
    mem: *mut u8,
    /// Next untouched offset in the region.
    next: usize,
}

fn create_qp(pd: &Pd, cq: &Cq) -> Qp {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 64,
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

impl Rig {
    fn new() -> Self {
        let fabric = Fabric::cabled(2, Profile::ConnectX5);
        let open = |i| {
            let f = fabric.function(i).expect("function") as Arc<dyn PciFunction>;
            let o = HcaOptions {
                health_interval: None,
                ..HcaOptions::default()
            };
            Context::open(f, o).expect("open")
        };
        let (a, b) = (open(0), open(1));
        let (pa, pb) = (a.alloc_pd().expect("pd"), b.alloc_pd().expect("pd"));
        let (cq, cqb) = (
            a.create_cq(256, None, None).expect("cq"),
            b.create_cq(256, None, None).expect("cq"),
        );
        let (mut qp, mut qpb) = (create_qp(&pa, &cq), create_qp(&pb, &cqb));
        let (na, nb) = (qp.qp_num(), qpb.qp_num());
        benches::connect(&mut qp, &b, nb);
        benches::connect(&mut qpb, &a, na);
        let buf = DmaBuffer::new(2 << 20).expect("buffer");
        let src = pa.reg_mr_buffer(&buf, 0, 2 << 20, ACC).expect("mr");
        let pinned_buf = DmaBuffer::new(2 << 20).expect("buffer");
        let pinned = pb.reg_mr_buffer(&pinned_buf, 0, 2 << 20, ACC).expect("mr");
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh anonymous mapping, kept for the whole run.
        let mem = unsafe { libc::mmap(std::ptr::null_mut(), REGION, prot, flags, -1, 0) };
        assert_ne!(mem, libc::MAP_FAILED);
        let mem = mem.cast::<u8>();
        // SAFETY: `mem` lives until the process ends; the program never
        // touches it.
        let odp = unsafe { pb.reg_mr_odp(mem, REGION, ACC | access::ON_DEMAND) }.expect("odp");
        Rig {
            _fabric: fabric,
            _ctxs: [a, b],
            _pds: [pa, pb],
            cq,
            _cqb: cqb,
            qp,
            _qpb: qpb,
            src,
            _buf: buf,
            pinned,
            _pinned_buf: pinned_buf,
            odp,
            mem,
            next: 0,
        }
    }

    /// One signaled WRITE of `len` bytes to `(raddr, rkey)`, completed.
    fn write(&mut self, raddr: u64, rkey: u32, len: u32) {
        let sge = self.src.sge(0, len).expect("sge");
        self.qp
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite { raddr, rkey },
                payload: Payload::Sges(&[sge]),
                flags: send_flags::SIGNALED,
                ud: None,
            }])
            .expect("post");
        let mut wc = [Wc::default()];
        while self.cq.poll(&mut wc).expect("poll") == 0 {
            std::hint::spin_loop();
        }
        assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    }

    /// `len` bytes of the region never mapped for the device.
    fn fresh(&mut self, len: usize) -> u64 {
        if self.next + len > REGION {
            self.odp
                .invalidate_range(self.mem as u64, REGION as u64)
                .expect("invalidate");
            self.next = 0;
        }
        let a = self.mem as u64 + self.next as u64;
        self.next += len;
        a
    }
}

fn odp(c: &mut Criterion) {
    let mut r = Rig::new();
    let mut g = c.benchmark_group("odp");
    g.measurement_time(Duration::from_secs(3));
    g.sample_size(20);
    for (name, len) in [("4 KiB", 4usize << 10), ("2 MiB", 2 << 20)] {
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(format!("first touch {name}"), |b| {
            b.iter_custom(|n| {
                let mut t = Duration::ZERO;
                for _ in 0..n {
                    let a = r.fresh(len);
                    let key = r.odp.rkey();
                    let s = Instant::now();
                    r.write(a, key, len as u32);
                    t += s.elapsed();
                }
                t
            })
        });
    }
    let len = 64usize << 10;
    g.throughput(Throughput::Bytes(len as u64));
    let mapped = r.fresh(len);
    r.odp
        .advise(
            advice::PREFETCH_WRITE,
            advice::FLAG_FLUSH,
            &[(mapped, len as u64)],
        )
        .expect("prefetch");
    g.bench_function("steady odp 64 KiB", |b| {
        let key = r.odp.rkey();
        b.iter(|| r.write(mapped, key, len as u32))
    });
    g.bench_function("steady pinned 64 KiB", |b| {
        let (a, key) = (r.pinned.addr(), r.pinned.rkey());
        b.iter(|| r.write(a, key, len as u32))
    });
    g.bench_function("fault 64 KiB", |b| {
        b.iter_custom(|n| {
            let mut t = Duration::ZERO;
            for _ in 0..n {
                let a = r.fresh(len);
                let key = r.odp.rkey();
                let s = Instant::now();
                r.write(a, key, len as u32);
                t += s.elapsed();
            }
            t
        })
    });
    g.bench_function("prefetch 64 KiB", |b| {
        b.iter_custom(|n| {
            let mut t = Duration::ZERO;
            for _ in 0..n {
                let a = r.fresh(len);
                let key = r.odp.rkey();
                let s = Instant::now();
                r.odp
                    .advise(
                        advice::PREFETCH_WRITE,
                        advice::FLAG_FLUSH,
                        &[(a, len as u64)],
                    )
                    .expect("prefetch");
                r.write(a, key, len as u32);
                t += s.elapsed();
            }
            t
        })
    });
    g.finish();
    let s = r.odp.stats();
    println!(
        "odp stats: {} faults, {} pages faulted, {} prefetches ({} pages), {} invalidations, {} mappings held",
        s.page_faults, s.pages_faulted, s.prefetches, s.pages_prefetched, s.invalidations, s.mappings
    );
}

criterion_group!(benches, odp);
criterion_main!(benches);
