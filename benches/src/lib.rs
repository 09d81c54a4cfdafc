//! Criterion benchmarks live in `benches/benches/`; run them with
//! `cargo bench -p benches`. What each case times is in `benches/README.md`.
//!
//! This library holds what more than one bench needs: [`ApiRig`], a
//! connected RC QP of the public API (`verbs`) on the in-process model,
//! whose completion ring a bench can refill without the model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5_emu::{Fabric, Profile};
use mlx5_hw::ifc::{query_cq_in, query_cq_out, QueryCqIn};
use mlx5_hw::opcode::Opcode;
use verbs::cq::{Cq, Wc, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr, Sge};
use verbs::pd::Pd;
use verbs::qp::{
    required_mask, send_flags, AhAttr, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType,
};
use verbs::wr::{Payload, SendOp, SendWr};
use vfio::emulated::DeviceModel;
use vfio::IovaMemory;
use vfio::{DmaBuffer, PciFunction};
use vm_memory::{Bytes, GuestAddress};

/// Entries of the rig's CQ (and blocks of its SQ): every one holds a CQE
/// when a poll bench starts a lap.
pub const RING: usize = 1024;

/// One function's objects.
struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    _buf: Arc<DmaBuffer>,
    mr: Mr,
}

/// A QP of A connected to B on two cabled in-process functions, through the
/// public API, then the model stopped: the driver's data path alone, as
/// users call it (`Qp::post_send`, the `wr_*` batch, `Cq::poll`), the UAR
/// and rings in the model's memory but no device reading them.
///
/// A's CQ holds [`RING`] requester CQEs the model wrote (64 B RDMA WRITEs,
/// signaled), already polled once; [`refill_cq`](Self::refill_cq) hands
/// them back for the next lap by flipping their owner bits, as rdma-core's
/// harness does. Posting never waits for completions: the benches rewind
/// the producer counter instead (rdma-core's harness sets `sq.tail =
/// sq.head`). Nothing is torn down (the model is gone): the rig is leaked.
pub struct ApiRig {
    _fabric: Fabric,
    a: Side,
    b: Side,
    /// A's QP, connected to `qp_b`.
    pub qp: Qp,
    _qp_b: Qp,
    /// A's CQ ring, where the CQEs lie (host memory).
    cq_ring: (Arc<IovaMemory>, u64),
}

impl std::fmt::Debug for ApiRig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRig")
            .field("qpn", &self.qp.qp_num())
            .field("cqn", &self.a.cq.cqn())
            .finish()
    }
}

fn side(f: Arc<dyn PciFunction>) -> Side {
    let opts = HcaOptions {
        // The model is stopped after set-up: nothing may poll its health.
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

fn qp(s: &Side) -> Qp {
    s.pd.create_qp(&QpInitAttr {
        send_cq: &s.cq,
        recv_cq: &s.cq,
        srq: None,
        cap: QpCap {
            max_send_wr: RING as u32,
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
pub fn connect(qp: &mut Qp, remote: &Context, rqpn: u32) {
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        port_num: 1,
        qp_access_flags: access::REMOTE_WRITE | access::REMOTE_READ,
        ..Default::default()
    };
    let m = |f, t| required_mask(QpType::Rc, f, t);
    qp.modify(&init, m(QpState::Reset, QpState::Init))
        .expect("init");
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: 5,
        dest_qp_num: rqpn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: remote.query_gid(1, 0).expect("gid"),
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    qp.modify(&rtr, m(QpState::Init, QpState::Rtr))
        .expect("rtr");
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..Default::default()
    };
    qp.modify(&rts, m(QpState::Rtr, QpState::Rts)).expect("rts");
}

/// Where the CQ's ring starts: QUERY_CQ's first page address.
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

impl ApiRig {
    /// Builds the pair, fills A's CQ through the model, stops the model.
    pub fn new() -> &'static mut Self {
        let fabric = Fabric::cabled(2, Profile::ConnectX4Lx);
        let f = |i| fabric.function(i).expect("function");
        let (fa, fb) = (f(0), f(1));
        let a = side(fa.clone() as Arc<dyn PciFunction>);
        let b = side(fb.clone() as Arc<dyn PciFunction>);
        let (mut qa, mut qb) = (qp(&a), qp(&b));
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        connect(&mut qa, &b.ctx, nb);
        connect(&mut qb, &a.ctx, na);
        let iova = cq_iova(&a.ctx, a.cq.cqn());
        let mem = fa.bus().dma.memory();
        let mut rig = Box::new(Self {
            _fabric: fabric,
            a,
            b,
            qp: qa,
            _qp_b: qb,
            cq_ring: (mem, iova),
        });
        // RING signaled WRITEs the model executes: RING CQEs in A's CQ.
        let sge = rig.sge();
        let (raddr, rkey) = (rig.b.mr.addr(), rig.b.mr.rkey());
        let before = fa.model().stats().cqes;
        for chunk in 0..RING / 32 {
            let wrs: Vec<SendWr<'_>> = (0..32)
                .map(|k| Self::write_wr((chunk * 32 + k) as u64, raddr, rkey, &sge))
                .collect();
            rig.qp.post_send(&wrs).expect("post");
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while fa.model().stats().cqes < before + RING as u64 {
            assert!(Instant::now() < deadline, "the model wrote no CQEs");
            std::thread::yield_now();
        }
        fa.model().shutdown();
        fb.model().shutdown();
        // Polled once, so that the SQ is free and the CQEs are known good.
        let mut wc = [Wc::default(); 16];
        let mut n = 0;
        while n < RING {
            let k = rig.a.cq.poll(&mut wc).expect("poll");
            assert!(Instant::now() < deadline, "{n} of {RING} CQEs");
            assert!(wc[..k].iter().all(|w| w.status == WcStatus::Success));
            n += k;
        }
        rig.refill_cq();
        Box::leak(rig)
    }

    /// A 64-byte SGE of A's MR.
    pub fn sge(&self) -> Sge {
        self.a.mr.sge(0, 64).expect("sge")
    }

    /// B's MR: (address, rkey).
    pub fn remote(&self) -> (u64, u32) {
        (self.b.mr.addr(), self.b.mr.rkey())
    }

    /// A signaled 1-SGE RDMA WRITE.
    pub fn write_wr(wr_id: u64, raddr: u64, rkey: u32, sge: &Sge) -> SendWr<'_> {
        SendWr {
            wr_id,
            op: SendOp::RdmaWrite { raddr, rkey },
            payload: Payload::Sges(std::slice::from_ref(sge)),
            flags: send_flags::SIGNALED,
            ud: None,
        }
    }

    /// A's CQ (the one [`refill_cq`](Self::refill_cq) refills).
    pub fn cq(&mut self) -> &mut Cq {
        &mut self.a.cq
    }

    /// Hands every CQE of A's CQ back for the next lap (flips its owner
    /// bit). Call only after a whole lap of [`RING`] CQEs was polled.
    pub fn refill_cq(&self) {
        let (mem, iova) = &self.cq_ring;
        for i in 0..RING as u64 {
            let at = GuestAddress(iova + i * 64 + 63);
            let b: u8 = mem.read_obj(at).expect("op_own");
            mem.write_obj(b ^ 1, at).expect("op_own");
        }
    }
}
