//! DC vs RC (issue 20): the message rate of one DCI over 1, 16 and 256
//! targets (DCTs) against one RC QP per target, and the memory the driver
//! and the model hold per peer in each case, in one run.
//!
//! Two cabled ConnectX-6 model functions; A sends 64-byte RDMA WRITEs
//! (inline) to B, in batches of 32 with one doorbell, every 32nd signaled,
//! at most 512 outstanding:
//!
//! - DC, "interleaved": consecutive WQEs name consecutive targets, so with
//!   more than one target every WQE disconnects and connects (the worst
//!   case for DC);
//! - DC, "batched": 32 WQEs per target in a row (one connection each);
//! - RC: one QP per target, a batch of 32 on each in turn.
//!
//! Memory per peer: the driver's queue memory (`Hca::queue_memory`, the
//! pieces handed out) and the model's state (`Stats::qp_state_bytes`, and
//! for DC `Stats::dc_bytes` while connected), divided by the peers.
//!
//! `cargo bench -p benches --bench dc` (optionally `DC_BENCH_MSGS=N`,
//! default 200,000 per case). Prints one table.

use std::sync::Arc;
use std::time::Instant;

use mlx5_emu::{Fabric, Profile};
use verbs::ah::Ah;
use verbs::cq::{Cq, Wc, WcStatus};
use verbs::dc::{DcAv, Dci, DciInitAttr, DciPath, Dct, DctInitAttr};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr};
use verbs::pd::Pd;
use verbs::qp::{
    required_mask, send_flags, AhAttr, Payload, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType,
    SendOp, SendWr,
};
use verbs::srq::Srq;
use vfio::{DmaBuffer, PciFunction};

const BATCH: usize = 32;
const WINDOW: usize = 512;
const KEY: u64 = 0xdc;

struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    _buf: Arc<DmaBuffer>,
    _mr: Mr,
    rkey: u32,
    addr: u64,
}

fn side(f: Arc<dyn PciFunction>) -> Side {
    let ctx = Context::open(f, HcaOptions::default()).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(4096, None, None).expect("cq");
    let buf = DmaBuffer::new(1 << 20).expect("buffer");
    let acc = access::LOCAL_WRITE | access::REMOTE_WRITE;
    let mr = pd.reg_mr_buffer(&buf, 0, 1 << 20, acc).expect("mr");
    let (rkey, addr) = (mr.rkey(), mr.addr());
    Side {
        ctx,
        pd,
        cq,
        _buf: buf,
        _mr: mr,
        rkey,
        addr,
    }
}

fn write_wr(id: u64, signaled: bool, raddr: u64, rkey: u32, data: &[u8]) -> SendWr<'_> {
    SendWr {
        wr_id: id,
        op: SendOp::RdmaWrite { raddr, rkey },
        payload: Payload::Inline(data),
        flags: if signaled { send_flags::SIGNALED } else { 0 },
        ud: None,
    }
}

/// Polls until at most `window - BATCH` WRs are outstanding (each CQE
/// stands for a batch).
fn reap(cq: &mut Cq, outstanding: &mut usize, window: usize) {
    let mut wc = [Wc::default(); 16];
    while *outstanding + BATCH > window {
        let n = cq.poll(&mut wc).expect("poll");
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            *outstanding -= BATCH;
        }
    }
}

fn rate(msgs: usize, t: Instant) -> f64 {
    msgs as f64 / t.elapsed().as_secs_f64()
}

/// Memory the driver and the model hold per peer.
#[derive(Debug, Clone, Copy)]
struct PerPeer {
    driver: f64,
    model: f64,
}

fn dc_case(a: &mut Side, b: &Side, ahs: &[Ah], dcts: &[Dct], batched: bool, msgs: usize) -> f64 {
    let mut dci =
        a.pd.create_dci(&DciInitAttr {
            send_cq: &a.cq,
            cap: QpCap {
                max_send_wr: 1024,
                max_send_sge: 1,
                max_inline_data: 64,
                ..QpCap::default()
            },
            sq_sig_all: false,
            streams: None,
            create_flags: 0,
        })
        .expect("dci");
    dci.to_rts(&DciPath {
        path_mtu: 3,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: 0,
    })
    .expect("dci rts");
    let avs: Vec<DcAv> = ahs
        .iter()
        .zip(dcts)
        .map(|(ah, d)| DcAv::new(ah, d.dctn(), KEY, 0))
        .collect();
    let data = [0x5au8; 64];
    let (mut sent, mut outstanding) = (0usize, 0usize);
    let t = Instant::now();
    while sent < msgs {
        reap(&mut a.cq, &mut outstanding, WINDOW);
        let wrs: Vec<(SendWr<'_>, DcAv)> = (0..BATCH)
            .map(|i| {
                let n = sent + i;
                let k = if batched { n / BATCH } else { n } % avs.len();
                let wr = write_wr(n as u64, i + 1 == BATCH, b.addr, b.rkey, &data);
                (wr, avs[k].clone())
            })
            .collect();
        dci.post_send(&wrs).expect("post");
        sent += BATCH;
        outstanding += BATCH;
    }
    reap(&mut a.cq, &mut outstanding, BATCH);
    let r = rate(sent, t);
    dci.destroy().expect("destroy dci");
    r
}

fn rc_qp(peer: &Side, lqp: &mut Qp, rqpn: u32) {
    let dgid = peer.ctx.query_gid(1, 0).expect("gid");
    let steps = [
        QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qp_access_flags: access::REMOTE_WRITE,
            ..QpAttr::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: 3,
            dest_qp_num: rqpn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            ah_attr: AhAttr {
                dgid,
                hop_limit: 64,
                port_num: 1,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rts),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..QpAttr::default()
        },
    ];
    let mut from = QpState::Reset;
    for a in steps {
        let to = a.qp_state.expect("state");
        lqp.modify(&a, required_mask(QpType::Rc, from, to))
            .expect("modify");
        from = to;
    }
}

fn create_rc(s: &Side, cq: &Cq) -> Qp {
    s.pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    })
    .expect("qp")
}

/// `n` RC QPs on A connected to `n` on B; the per-peer memory.
fn rc_setup(fabric: &Fabric, a: &Side, b: &Side, n: usize) -> (Vec<Qp>, Vec<Qp>, PerPeer) {
    let (qa0, ma0) = (a.ctx.hca().queue_memory(), stats(fabric, 0));
    let (qb0, mb0) = (b.ctx.hca().queue_memory(), stats(fabric, 1));
    let mut qa: Vec<Qp> = (0..n).map(|_| create_rc(a, &a.cq)).collect();
    let mut qb: Vec<Qp> = (0..n).map(|_| create_rc(b, &b.cq)).collect();
    for i in 0..n {
        let (na, nb) = (qa[i].qp_num(), qb[i].qp_num());
        rc_qp(b, &mut qa[i], nb);
        rc_qp(a, &mut qb[i], na);
    }
    let driver = (a.ctx.hca().queue_memory().piece_bytes - qa0.piece_bytes)
        + (b.ctx.hca().queue_memory().piece_bytes - qb0.piece_bytes);
    let model = (stats(fabric, 0).qp_state_bytes - ma0.qp_state_bytes)
        + (stats(fabric, 1).qp_state_bytes - mb0.qp_state_bytes);
    let per = PerPeer {
        driver: driver as f64 / n as f64,
        model: model as f64 / n as f64,
    };
    (qa, qb, per)
}

fn rc_case(a: &mut Side, b: &Side, qps: &mut [Qp], msgs: usize) -> f64 {
    let data = [0x5au8; 64];
    let (mut sent, mut outstanding) = (0usize, 0usize);
    // Per QP at most 64 outstanding (its depth): two batches.
    let window = WINDOW.min(qps.len() * 2 * BATCH);
    let mut per_qp = vec![0usize; qps.len()];
    let mut wc = [Wc::default(); 16];
    let t = Instant::now();
    let mut k = 0;
    while sent < msgs {
        while outstanding + BATCH > window || per_qp[k] + BATCH > 64 {
            let n = a.cq.poll(&mut wc).expect("poll");
            for w in &wc[..n] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                outstanding -= BATCH;
                let q = qps.iter().position(|q| q.qp_num() == w.qp_num).expect("qp");
                per_qp[q] -= BATCH;
            }
        }
        let wrs: Vec<SendWr<'_>> = (0..BATCH)
            .map(|i| write_wr((sent + i) as u64, i + 1 == BATCH, b.addr, b.rkey, &data))
            .collect();
        qps[k].post_send(&wrs).expect("post");
        sent += BATCH;
        outstanding += BATCH;
        per_qp[k] += BATCH;
        k = (k + 1) % qps.len();
    }
    while outstanding > 0 {
        let n = a.cq.poll(&mut wc).expect("poll");
        outstanding -= n * BATCH;
    }
    rate(sent, t)
}

fn stats(fabric: &Fabric, i: usize) -> mlx5_emu::Stats {
    fabric.function(i).expect("function").model().stats()
}

/// `n` DCTs on B (one SRQ, no receives: WRITEs need none), an AH on A
/// for each; the per-peer memory (driver: the AHs; model: the DCTs'
/// state on B, connections included while connected: none when idle).
fn dc_setup(fabric: &Fabric, a: &Side, b: &Side, n: usize) -> (Vec<Dct>, Vec<Ah>, Srq, PerPeer) {
    let srq = b.pd.create_srq(16, 1).expect("srq");
    let m0 = stats(fabric, 1).dc_bytes;
    let dcts: Vec<Dct> = (0..n)
        .map(|_| {
            b.pd.create_dct(&DctInitAttr {
                cq: &b.cq,
                srq: &srq,
                access_key: KEY,
                access_flags: access::REMOTE_WRITE,
                path_mtu: 3,
                min_rnr_timer: 1,
                ah_attr: AhAttr {
                    hop_limit: 64,
                    port_num: 1,
                    ..AhAttr::default()
                },
                pkey_index: 0,
                create_flags: 0,
            })
            .expect("dct")
        })
        .collect();
    let dgid = b.ctx.query_gid(1, 0).expect("gid");
    let ahs: Vec<Ah> = (0..n)
        .map(|_| {
            a.pd.create_ah(&AhAttr {
                dgid,
                hop_limit: 64,
                port_num: 1,
                ..AhAttr::default()
            })
            .expect("ah")
        })
        .collect();
    let model = stats(fabric, 1).dc_bytes - m0;
    let per = PerPeer {
        driver: std::mem::size_of::<Ah>() as f64 + std::mem::size_of::<DcAv>() as f64,
        model: model as f64 / n as f64,
    };
    (dcts, ahs, srq, per)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let msgs: usize = std::env::var("DC_BENCH_MSGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
        / BATCH
        * BATCH;
    let fabric = Fabric::cabled(2, Profile::ConnectX6);
    let f = |i| fabric.function(i).expect("function") as Arc<dyn PciFunction>;
    let mut a = side(f(0));
    let b = side(f(1));
    // The DCI's own queue memory, once for all peers.
    let q0 = a.ctx.hca().queue_memory().piece_bytes;
    let dci_mem = {
        let d: Dci =
            a.pd.create_dci(&DciInitAttr {
                send_cq: &a.cq,
                cap: QpCap {
                    max_send_wr: 1024,
                    max_send_sge: 1,
                    max_inline_data: 64,
                    ..QpCap::default()
                },
                sq_sig_all: false,
                streams: None,
                create_flags: 0,
            })
            .expect("dci");
        let m = a.ctx.hca().queue_memory().piece_bytes - q0;
        d.destroy().expect("destroy");
        m
    };
    println!(
        "{msgs} 64-byte inline RDMA WRITEs per case, batches of {BATCH}, {WINDOW} outstanding"
    );
    println!("one DCI's queue memory: {dci_mem} bytes (all peers)");
    println!("| peers | DC interleaved Mmsg/s | DC batched Mmsg/s | RC QP per peer Mmsg/s | DC bytes/peer driver + model | RC bytes/peer driver + model |");
    println!("|---|---|---|---|---|---|");
    for n in [1usize, 16, 256] {
        let (dcts, ahs, srq, dc_per) = dc_setup(&fabric, &a, &b, n);
        let dci_i = dc_case(&mut a, &b, &ahs, &dcts, false, msgs);
        let dci_b = dc_case(&mut a, &b, &ahs, &dcts, true, msgs);
        let conns = stats(&fabric, 1).dc_connections;
        assert_eq!(conns, 0, "the DCI disconnected when idle");
        drop(dcts);
        drop(srq);
        let (mut qa, qb, rc_per) = rc_setup(&fabric, &a, &b, n);
        let rc = rc_case(&mut a, &b, &mut qa, msgs);
        drop(qa);
        drop(qb);
        println!(
            "| {n} | {:.3} | {:.3} | {:.3} | {:.0} + {:.0} | {:.0} + {:.0} |",
            dci_i / 1e6,
            dci_b / 1e6,
            rc / 1e6,
            dc_per.driver,
            dc_per.model,
            rc_per.driver,
            rc_per.model
        );
    }
}
