//! Raw Ethernet send bursts, the driver alone (issue 26): `tx_burst` of
//! 64-byte frames (18 bytes of headers inline, one-block WQEs, or 42
//! bytes, two-block ones; the rest of the frame by one data segment,
//! checksum offload asked) in bursts of 1, 8 and 32, one doorbell
//! per burst; `tx_burst_empw` of whole 64-byte frames (a ConnectX-5 model,
//! which offers enhanced multi-packet WQEs): each frame one 16-byte data
//! segment, or copied inline; beside the project's RDMA `post_send` of 1 and 32 WRs
//! (`benches::ApiRig`), in one run. The models are stopped after set-up:
//! no device reads the WQEs; every 512 packets the send ring is counted as
//! completed (`RawPacketQp::tx_rewind`, as rdma-core's harness sets
//! `sq.tail = sq.head`). The UAR is the model's BAR, ordinary memory.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use benches::{ApiRig, RING};
use criterion::{Criterion, Throughput};
use mlx5_emu::{Fabric, Profile};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::access;
use verbs::raw_eth::{RawPacketQp, RawQpCap, TxFrame, TxPkt};
use verbs::wr::SendWr;
use vfio::emulated::DeviceModel;
use vfio::{DmaBuffer, PciFunction};

/// Everything the bench keeps alive (leaked: the models are gone).
struct RawRig {
    _fabric: Fabric,
    qp: RawPacketQp,
    mr: verbs::mr::Mr,
    _keep: Box<dyn std::any::Any>,
}

impl RawRig {
    /// The payload: `len` bytes at the MR's start.
    fn qp_sge(&self, len: usize) -> Option<verbs::mr::Sge> {
        Some(self.mr.sge(0, len as u32).expect("sge"))
    }
}

fn raw_rig(profile: Profile) -> &'static mut RawRig {
    let fabric = Fabric::cabled(2, profile);
    let f = fabric.function(0).expect("function");
    let opts = HcaOptions {
        health_interval: None,
        ..HcaOptions::default()
    };
    let ctx = Context::open(f.clone() as Arc<dyn PciFunction>, opts).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let tx = ctx.create_cq(1023, None, None).expect("cq");
    let rx = ctx.create_cq(15, None, None).expect("cq");
    let cap = RawQpCap {
        log_sq_bbs: 11,
        log_rq_wqes: 4,
        strip_vlan: false,
        striding: None,
    };
    let qp = ctx
        .create_raw_packet_qp(&pd, &tx, &rx, cap)
        .expect("raw qp");
    let buf = DmaBuffer::new(1 << 16).expect("buffer");
    let mr = pd
        .reg_mr_buffer(&buf, 0, 1 << 16, access::LOCAL_WRITE)
        .expect("mr");
    f.model().shutdown();
    if let Some(g) = fabric.function(1) {
        g.model().shutdown();
    }
    Box::leak(Box::new(RawRig {
        _fabric: fabric,
        qp,
        mr,
        _keep: Box::new((ctx, pd, tx, rx, buf)),
    }))
}

fn bench(c: &mut Criterion) {
    let raw = raw_rig(Profile::ConnectX4Lx);
    let hdr = [0x5au8; 42];
    let mut g = c.benchmark_group("raw_eth");
    g.measurement_time(Duration::from_secs(4));
    // 18 bytes inline (Ethernet and a VLAN tag, mlx5e's usual minimum):
    // one-block WQEs built in registers; 42 (Ethernet, IPv4, UDP): two
    // blocks through the staging buffer.
    for (inline, blocks) in [(18usize, "1 block"), (42, "2 blocks")] {
        let pkt = TxPkt {
            headers: &hdr[..inline],
            payload: raw.qp_sge(64 - inline),
            csum: true,
            mss: 0,
            vlan: None,
        };
        let pkts = [pkt; 32];
        for per in [1usize, 8, 32] {
            g.throughput(Throughput::Elements(per as u64));
            let mut i = 0usize;
            let qp = &mut raw.qp;
            let name = format!("tx_burst {per} x 64 B, {inline} B inline ({blocks})");
            g.bench_function(name, |b| {
                b.iter(|| {
                    let n = qp.tx_burst(black_box(&pkts[..per]));
                    i += per;
                    if i >= 512 {
                        qp.tx_rewind();
                        i = 0;
                    }
                    assert_eq!(n, per);
                })
            });
        }
    }
    // Whole 64-byte frames by enhanced multi-packet WQEs: by pointer (one
    // data segment each) and copied inline (five segments each).
    let empw = raw_rig(Profile::ConnectX5);
    let frame = [0x5au8; 64];
    let by_ref = [TxFrame::Ref(empw.mr.sge(0, 64).expect("sge")); 32];
    let inline = [TxFrame::Inline(&frame); 32];
    for (frames, how) in [(&by_ref, "by pointer"), (&inline, "inline")] {
        for per in [1usize, 8, 32] {
            if how == "inline" && per != 32 {
                continue;
            }
            g.throughput(Throughput::Elements(per as u64));
            let mut i = 0usize;
            let qp = &mut empw.qp;
            g.bench_function(format!("tx_burst_empw {per} x 64 B, {how}"), |b| {
                b.iter(|| {
                    let n = qp.tx_burst_empw(black_box(&frames[..per]), true);
                    i += per;
                    if i >= 512 {
                        qp.tx_rewind();
                        i = 0;
                    }
                    assert_eq!(n.ok(), Some(per));
                })
            });
        }
    }
    let rig = ApiRig::new();
    let sge = rig.sge();
    let (raddr, rkey) = rig.remote();
    let list: Vec<SendWr<'_>> = (0..32)
        .map(|k| ApiRig::write_wr(k, raddr, rkey, &sge))
        .collect();
    let base = rig.qp.send_ring().pc();
    for per in [1usize, 32] {
        g.throughput(Throughput::Elements(per as u64));
        let mut i = 0u32;
        let qp = &mut rig.qp;
        g.bench_function(format!("post_send {per} RDMA WRITE (beside)"), |b| {
            b.iter(|| {
                let r = qp.post_send(black_box(&list[..per]));
                i += per as u32;
                if i >= RING as u32 / 2 {
                    qp.send_ring().rewind(base);
                    i = 0;
                }
                r
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
