//! Shared set-up of the verbs end-to-end tests: contexts on cabled
//! device-model functions, MRs over DMA buffers, RC/UC/UD connection.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5_emu::transport::RETRY_DEADLINE;
use mlx5_emu::{DeviceConfig, Fabric, Profile};
use tests::wait::{until, HANG_GUARD};
use verbs::ah::Ah;
use verbs::cq::{Cq, Wc};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr};
use verbs::pd::Pd;
use verbs::qp::{required_mask, AhAttr, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType};
use vfio::clock::ManualClock;
use vfio::{DmaBuffer, PciFunction};

/// One side: a context, a PD, a CQ and a buffer with its MR.
pub struct Side {
    pub ctx: Context,
    pub pd: Pd,
    pub cq: Cq,
    pub buf: Arc<DmaBuffer>,
    pub mr: Mr,
}

/// Two cabled functions (kept alive with the fabric).
pub struct Pair {
    pub fabric: Fabric,
    pub a: Side,
    pub b: Side,
}

pub const ALL: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;

pub fn open(f: Arc<dyn PciFunction>) -> Context {
    Context::open(f, HcaOptions::default()).unwrap_or_else(|e| panic!("open: {e}"))
}

pub fn side(ctx: Context, len: usize, acc: u32) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None, None).unwrap();
    let buf = DmaBuffer::new(len).unwrap();
    let mr = pd.reg_mr_buffer(&buf, 0, len, acc).unwrap();
    Side {
        ctx,
        pd,
        cq,
        buf,
        mr,
    }
}

pub fn function(fabric: &Fabric, i: usize) -> Arc<dyn PciFunction> {
    fabric.function(i).expect("fabric function") as Arc<dyn PciFunction>
}

pub fn pair(len: usize) -> Pair {
    let fabric = Fabric::cabled(2, Profile::ConnectX4Lx);
    let a = side(open(function(&fabric, 0)), len, ALL);
    let b = side(open(function(&fabric, 1)), len, ALL);
    Pair { fabric, a, b }
}

/// [`pair`] with the models and the drivers on `clock`: retry timers
/// (and every driver timeout) wait until the test moves it.
pub fn pair_on(len: usize, clock: &Arc<ManualClock>) -> Pair {
    let fabric = Fabric::cabled_as(
        2,
        &DeviceConfig {
            fw_start: Duration::ZERO,
            clock: clock.shared(),
            ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
        },
    );
    let opts = || HcaOptions {
        clock: clock.shared(),
        ..HcaOptions::default()
    };
    let on =
        |i| Context::open(function(&fabric, i), opts()).unwrap_or_else(|e| panic!("open: {e}"));
    let a = side(on(0), len, ALL);
    let b = side(on(1), len, ALL);
    Pair { fabric, a, b }
}

/// Once a send queue waits for its retry timer (ACK timeout, RNR timer),
/// moves `clock` to it; returns how long the timer was.
pub fn next_retry(clock: &ManualClock) -> Duration {
    let before = clock.now();
    clock.advance_to_armed(RETRY_DEADLINE, HANG_GUARD) - before
}

pub fn cap(wr: u32) -> QpCap {
    QpCap {
        max_send_wr: wr,
        max_recv_wr: wr,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

pub fn create_qp(s: &Side, t: QpType, cap: QpCap) -> Qp {
    s.pd.create_qp(&QpInitAttr {
        send_cq: &s.cq,
        recv_cq: &s.cq,
        srq: None,
        cap,
        qp_type: t,
        sq_sig_all: false,
    })
    .unwrap()
}

pub const QKEY: u32 = 0x1111_2222;

/// RESET -> INIT -> RTR -> RTS towards `(remote ctx, remote qpn)`.
pub fn connect(qp: &mut Qp, local: &Context, remote: &Context, rqpn: u32) {
    connect_with(qp, local, remote, rqpn, Retry::default());
}

/// Timeouts and retries of an RC connection.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// [`connect`] with `retry`.
pub fn connect_with(qp: &mut Qp, local: &Context, remote: &Context, rqpn: u32, retry: Retry) {
    let t = qp.qp_type();
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        port_num: 1,
        qp_access_flags: access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC,
        qkey: QKEY,
        ..Default::default()
    };
    qp.modify(&init, required_mask(t, QpState::Reset, QpState::Init))
        .unwrap();
    let _ = local;
    let dgid = remote.query_gid(1, 0).unwrap();
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: 3,
        dest_qp_num: rqpn,
        rq_psn: 0x100,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    qp.modify(&rtr, required_mask(t, QpState::Init, QpState::Rtr))
        .unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: 0x100,
        timeout: retry.timeout,
        retry_cnt: retry.retry_cnt,
        rnr_retry: retry.rnr_retry,
        max_rd_atomic: 4,
        ..Default::default()
    };
    qp.modify(&rts, required_mask(t, QpState::Rtr, QpState::Rts))
        .unwrap();
}

/// Two connected QPs of type `t`, one on each side.
pub fn qp_pair(p: &Pair, t: QpType, cap: QpCap) -> (Qp, Qp) {
    qp_pair_with(p, t, cap, Retry::default())
}

/// [`qp_pair`] with `retry`.
pub fn qp_pair_with(p: &Pair, t: QpType, cap: QpCap, retry: Retry) -> (Qp, Qp) {
    let mut qa = create_qp(&p.a, t, cap);
    let mut qb = create_qp(&p.b, t, cap);
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect_with(&mut qa, &p.a.ctx, &p.b.ctx, nb, retry);
    connect_with(&mut qb, &p.b.ctx, &p.a.ctx, na, retry);
    (qa, qb)
}

/// Polls `cq` until `n` completions came ([`HANG_GUARD`]: a hang is a bug).
pub fn poll_n(cq: &mut Cq, n: usize) -> Vec<Wc> {
    let mut out = Vec::with_capacity(n);
    let mut wc = [Wc::default(); 16];
    let deadline = Instant::now() + HANG_GUARD;
    while out.len() < n {
        let k = cq
            .poll(&mut wc[..(n - out.len()).min(16)])
            .unwrap_or_else(|e| panic!("ibv_poll_cq: {e}"));
        out.extend_from_slice(&wc[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} completions: {out:?}",
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}

/// The device-model statistics of function `i`.
pub fn stats(fabric: &Fabric, i: usize) -> mlx5_emu::Stats {
    fabric.function(i).expect("function").model().stats()
}

/// Whether `cq` stays empty once every model of `fabric` has made a whole
/// worker pass (what they had to write, they have written).
pub fn nothing_more(fabric: &Fabric, cq: &mut Cq) -> bool {
    settle(fabric);
    let mut wc = [Wc::default(); 4];
    cq.poll(&mut wc)
        .unwrap_or_else(|e| panic!("ibv_poll_cq: {e}"))
        == 0
}

/// Returns once every model of `fabric` has made a whole worker pass.
pub fn settle(fabric: &Fabric) {
    for i in 0..fabric.len() {
        let m = fabric.function(i).expect("function").model().clone();
        let n = m.worker_passes();
        until("a worker pass", || m.worker_passes() >= n + 2);
    }
}

pub fn fill(buf: &DmaBuffer, off: usize, len: usize, seed: u8) -> Vec<u8> {
    let v: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    buf.write(off, &v).unwrap();
    v
}

pub fn read(buf: &DmaBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    buf.read(off, &mut v).unwrap();
    v
}

/// [`pair`] on two cabled functions of `profile`, MRs with access `acc`.
pub fn pair_profile(len: usize, profile: Profile, acc: u32) -> Pair {
    let fabric = Fabric::cabled(2, profile);
    let a = side(open(function(&fabric, 0)), len, acc);
    let b = side(open(function(&fabric, 1)), len, acc);
    Pair { fabric, a, b }
}

/// Side a's model: the CQEs its CQs have been written.
pub fn cqes_written(p: &Pair) -> u64 {
    p.fabric.function(0).expect("function").model().stats().cqes
}

/// Posts `n` signaled 8-byte RDMA WRITEs from a to b on `qp`, wr_ids
/// `base..base + n`.
pub fn post_writes(p: &Pair, qp: &mut Qp, base: u64, n: u64) {
    use verbs::qp::{send_flags, Payload, SendOp, SendWr};
    let sge = p.a.mr.sge(0, 8).unwrap();
    for i in 0..n {
        qp.post_send(&[SendWr {
            wr_id: base + i,
            op: SendOp::RdmaWrite {
                raddr: p.b.mr.addr(),
                rkey: p.b.mr.rkey(),
            },
            payload: Payload::Sges(&[sge]),
            flags: send_flags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    }
}

/// An address handle on `from` toward `to`'s port 1, GID 0 (RoCE v2).
pub fn ah(from: &Side, to: &Side) -> Ah {
    from.pd
        .create_ah(&AhAttr {
            dgid: to.ctx.query_gid(1, 0).unwrap(),
            sgid_index: 0,
            hop_limit: 64,
            port_num: 1,
            ..AhAttr::default()
        })
        .unwrap()
}
