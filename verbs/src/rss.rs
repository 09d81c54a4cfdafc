//! Receive-side scaling for raw Ethernet (rdma-core's `ibv_create_wq`,
//! `ibv_create_rwq_ind_table` and the RSS raw packet QP, `ibv_create_qp_ex`
//! with `rx_hash_conf`; what DPDK's mlx5 PMD spreads its receive queues
//! with).
//!
//! A receive work queue [`Wq`] is an Ethernet RQ of its own on a CQ of its
//! own (mlx5_ib's `create_rq`: cyclic, one data segment per WQE, `vsd`
//! unless it strips VLAN tags), made ready at once; it is posted to and
//! polled as a raw packet QP's receive side ([`crate::raw_eth::RxPkt`]).
//! An indirection table [`RwqIndTable`] lists `2^n` of them (CREATE_RQT,
//! entries may repeat, `n` at most `log_max_rqt_size`). An [`RssQp`] is an
//! indirect TIR over the table hashing with Toeplitz under the caller's
//! 40-byte key over the fields [`rx_hash_fields`] selects, mapped to the
//! TIR's outer field selector as mlx5_ib's `create_rss_raw_qp_tir` maps
//! them (IPv4 and IPv6 together, or TCP and UDP together, refused); a flow
//! rule ([`crate::flow::FlowAction::Rss`]) steers frames to it, and each
//! lands on the WQ at `hash % 2^n` of the table, its CQE carrying the hash.

use std::sync::Arc;

use mlx5_hw::eth::{
    HASH_FIELD_SEL_DST_IP, HASH_FIELD_SEL_L4_DPORT, HASH_FIELD_SEL_L4_SPORT, HASH_FIELD_SEL_SRC_IP,
    L3_PROT_TYPE_IPV4, L3_PROT_TYPE_IPV6, L4_PROT_TYPE_TCP, L4_PROT_TYPE_UDP, RX_HASH_FN_TOEPLITZ,
    TIRC_DISP_TYPE_INDIRECT,
};
use mlx5_hw::ifc::{
    create_rqt_in, create_rqt_out, create_tir_in, create_tir_out, dealloc_transport_domain_in,
    destroy_rq_in, destroy_rqt_in, destroy_tir_in, rq_num, rqtc, rx_hash_field_select, tirc,
};
use mlx5_hw::opcode::Opcode;

use crate::cq::{Cq, CqShared};
use crate::dbrec::Dbrec;
use crate::device::{Context, Ctx};
use crate::mr::Sge;
use crate::pd::Pd;
use crate::raw_eth::{alloc_transport_domain, cmd, create_ready_rq, destroy_obj, RxPkt, RxRing};
use crate::wq::WqTrack;
use crate::{Error, Result};

/// `ibv_rx_hash_fields` (the same bits as mlx5's `MLX5_RX_HASH_*`): what
/// the Toeplitz hash of an [`RssQp`] is taken over.
pub mod rx_hash_fields {
    /// `IBV_RX_HASH_SRC_IPV4`.
    pub const SRC_IPV4: u32 = 1 << 0;
    /// `IBV_RX_HASH_DST_IPV4`.
    pub const DST_IPV4: u32 = 1 << 1;
    /// `IBV_RX_HASH_SRC_IPV6`.
    pub const SRC_IPV6: u32 = 1 << 2;
    /// `IBV_RX_HASH_DST_IPV6`.
    pub const DST_IPV6: u32 = 1 << 3;
    /// `IBV_RX_HASH_SRC_PORT_TCP`.
    pub const SRC_PORT_TCP: u32 = 1 << 4;
    /// `IBV_RX_HASH_DST_PORT_TCP`.
    pub const DST_PORT_TCP: u32 = 1 << 5;
    /// `IBV_RX_HASH_SRC_PORT_UDP`.
    pub const SRC_PORT_UDP: u32 = 1 << 6;
    /// `IBV_RX_HASH_DST_PORT_UDP`.
    pub const DST_PORT_UDP: u32 = 1 << 7;
    /// Every field this driver can hash over.
    pub const ALL: u32 = (1 << 8) - 1;
    /// `IBV_RX_HASH_INNER`: the fields are a tunnelled packet's inner
    /// headers (the TIR's inner selector, and it parses tunnels:
    /// `tunneled_offload_en`, as mlx5_ib's `create_rss_raw_qp_tir` sets
    /// them); a packet that is not tunnelled hashes to 0.
    pub const INNER: u32 = 1 << 31;
}

/// Bytes of a Toeplitz key (`tirc.rx_hash_toeplitz_key`).
pub const RSS_KEY_LEN: usize = tirc::RX_HASH_TOEPLITZ_KEY.width / 8;

/// What a receive work queue is made with (`ibv_wq_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct WqCap {
    /// Receive ring: 2^this buffers.
    pub log_wqes: u8,
    /// Strip C-VLAN tags into the completion
    /// (`IBV_WQ_FLAGS_CVLAN_STRIPPING`); refused without `vlan_cap`.
    pub strip_vlan: bool,
}

/// A receive work queue (`ibv_wq` of type `IBV_WQT_RQ`), ready.
#[derive(Debug)]
pub struct Wq {
    ctx: Arc<Ctx>,
    rqn: u32,
    rx: RxRing,
    dbrec: Dbrec,
    /// Completions taken by its verbs CQ ([`Context::create_wq_polled`]).
    polled: Option<WqPolled>,
}

/// A work queue's place in its verbs CQ: its tracking under the user
/// index its receive CQEs carry (`crate::uidx`).
#[derive(Debug)]
struct WqPolled {
    cq: Arc<CqShared>,
    t: Arc<WqTrack>,
    uidx: u32,
}

/// An indirection table of receive work queues (`ibv_rwq_ind_table`).
#[derive(Debug)]
pub struct RwqIndTable {
    ctx: Arc<Ctx>,
    rqtn: u32,
    log_size: u8,
}

/// What an RSS QP hashes with (`ibv_rx_hash_conf`, Toeplitz).
#[derive(Debug, Clone, Copy)]
pub struct RxHashConf<'a> {
    /// The queues it spreads over.
    pub table: &'a RwqIndTable,
    /// The Toeplitz key.
    pub key: [u8; RSS_KEY_LEN],
    /// [`rx_hash_fields`]; 0 only over a one-entry table (no hashing).
    pub fields: u32,
}

/// An RSS raw packet QP: an indirect TIR (and its transport domain).
#[derive(Debug)]
pub struct RssQp {
    ctx: Arc<Ctx>,
    td: u32,
    tirn: u32,
}

impl Context {
    /// `ibv_create_wq(IBV_WQT_RQ)` on `cq`, then to ready (`ibv_modify_wq`
    /// to `IBV_WQS_RDY`).
    pub fn create_wq(&self, pd: &Pd, cq: &Cq, cap: WqCap) -> Result<Wq> {
        self.make_wq(pd, cq, cap, 0, 1)
    }

    /// [`create_wq`](Self::create_wq) for a verbs program
    /// (`ibv_create_wq` through C): receive WQEs of up to `sges` buffers
    /// posted one WR at a time ([`Wq::post_recv_wr`]), their completions
    /// taken by [`Cq::poll`] (the CQ may be shared with other WQs and
    /// QPs): the RQ's CQEs carry a user index of the context's, which the
    /// CQ's user-index table maps to the WQ.
    pub fn create_wq_polled(&self, pd: &Pd, cq: &Cq, cap: WqCap, sges: usize) -> Result<Wq> {
        if sges > crate::qp::MAX_SGE {
            return Err(Error::Invalid("work queue: more SGEs than MAX_SGE"));
        }
        let uidx = self.ctx.uidx.alloc()?;
        let mut wq = match self.make_wq(pd, cq, cap, uidx, sges) {
            Ok(w) => w,
            Err(e) => {
                self.ctx.uidx.free(uidx);
                return Err(e);
            }
        };
        let t = WqTrack::new(wq.rqn, 0, 1 << cap.log_wqes);
        cq.shared.attach_uidx(uidx, t.clone());
        wq.polled = Some(WqPolled {
            cq: cq.shared.clone(),
            t,
            uidx,
        });
        Ok(wq)
    }

    /// A WQ on `cq` whose CQEs carry `uidx`, WQEs of `sges` buffers.
    fn make_wq(&self, pd: &Pd, cq: &Cq, cap: WqCap, uidx: u32, sges: usize) -> Result<Wq> {
        if cap.log_wqes > 15 {
            return Err(Error::Invalid("work queue: ring size"));
        }
        if cap.strip_vlan && !self.vlan_offload()? {
            return Err(Error::NotSupported(
                "work queue: VLAN stripping (no vlan_cap)",
            ));
        }
        let ctx = self.ctx.clone();
        let dma = ctx.hca.dma();
        let ring = dma.alloc_buf(RxRing::wqe_bytes(None, sges) << cap.log_wqes)?;
        let dbrec = dma.alloc_dbrec()?;
        dbrec.buf().write(dbrec.offset(), &[0; 8])?;
        let rx = RxRing::new(ring, &dbrec, cap.log_wqes, None, sges);
        let rqn = create_ready_rq(
            &ctx,
            pd.pdn(),
            cq.cqn(),
            cap.strip_vlan,
            &rx,
            dbrec.iova(),
            uidx,
        )?;
        tracing::debug!(rqn, cqn = cq.cqn(), uidx, "ibv_create_wq");
        Ok(Wq {
            ctx,
            rqn,
            rx,
            dbrec,
            polled: None,
        })
    }

    /// `ibv_create_rwq_ind_table`: `wqs` (2^n of them, repeats allowed,
    /// n at most the device's `log_max_rqt_size`) as one RQ table.
    pub fn create_rwq_ind_table(&self, wqs: &[&Wq]) -> Result<RwqIndTable> {
        let n = wqs.len();
        if !n.is_power_of_two() {
            return Err(Error::Invalid("indirection table: 2^n work queues"));
        }
        let log_size = n.trailing_zeros() as u8;
        if log_size > self.ctx.hca.caps().gen().log_max_rqt_size() {
            return Err(Error::Invalid("indirection table: over log_max_rqt_size"));
        }
        let at = create_rqt_in::RQT_CONTEXT.off / 8;
        let mut i = cmd(
            Opcode::CreateRqt,
            at + rqtc::SIZE_BYTES + n * rq_num::SIZE_BYTES,
        );
        let c = &mut i[at..];
        rqtc::RQT_MAX_SIZE.set(c, n as u64);
        rqtc::RQT_ACTUAL_SIZE.set(c, n as u64);
        for (k, w) in wqs.iter().enumerate() {
            let e = &mut c[rqtc::SIZE_BYTES + k * rq_num::SIZE_BYTES..];
            rq_num::RQ_NUM.set(e, u64::from(w.rqn));
        }
        let out = self.ctx.hca.cmd().exec(&i, create_rqt_out::SIZE_BYTES)?;
        let rqtn = create_rqt_out::RQTN.get(&out) as u32;
        tracing::debug!(rqtn, n, "ibv_create_rwq_ind_table");
        Ok(RwqIndTable {
            ctx: self.ctx.clone(),
            rqtn,
            log_size,
        })
    }

    /// `ibv_create_qp_ex(IBV_QPT_RAW_PACKET)` with `rx_hash_conf`: an
    /// indirect TIR hashing as `conf` says over its table.
    pub fn create_rss_qp(&self, conf: &RxHashConf<'_>) -> Result<RssQp> {
        let sel = field_select(conf.fields, conf.table.log_size)?;
        if conf.fields & rx_hash_fields::INNER != 0 && !self.tunnel_offload()? {
            return Err(Error::NotSupported(
                "RSS QP: inner hashing (no tunnel_stateless_vxlan or _gre)",
            ));
        }
        let ctx = self.ctx.clone();
        let td = alloc_transport_domain(&ctx)?;
        let mut qp = RssQp { ctx, td, tirn: 0 };
        let at = create_tir_in::CTX.off;
        let mut i = cmd(Opcode::CreateTir, create_tir_in::SIZE_BYTES);
        tirc::TRANSPORT_DOMAIN.at(at).set(&mut i, u64::from(td));
        tirc::DISP_TYPE.at(at).set(&mut i, TIRC_DISP_TYPE_INDIRECT);
        tirc::INDIRECT_TABLE
            .at(at)
            .set(&mut i, u64::from(conf.table.rqtn));
        tirc::RX_HASH_FN.at(at).set(&mut i, RX_HASH_FN_TOEPLITZ);
        let k = (at + tirc::RX_HASH_TOEPLITZ_KEY.off) / 8;
        i[k..k + RSS_KEY_LEN].copy_from_slice(&conf.key);
        if let Some((l3, l4, fields)) = sel {
            let inner = conf.fields & rx_hash_fields::INNER != 0;
            let s = at
                + if inner {
                    tirc::TUNNELED_OFFLOAD_EN.at(at).set(&mut i, 1);
                    tirc::RX_HASH_FIELD_SELECTOR_INNER.off
                } else {
                    tirc::RX_HASH_FIELD_SELECTOR_OUTER.off
                };
            rx_hash_field_select::L3_PROT_TYPE.at(s).set(&mut i, l3);
            rx_hash_field_select::L4_PROT_TYPE.at(s).set(&mut i, l4);
            rx_hash_field_select::SELECTED_FIELDS
                .at(s)
                .set(&mut i, fields);
        }
        // On an error, Drop deallocates the TD.
        let out = qp.ctx.hca.cmd().exec(&i, create_tir_out::SIZE_BYTES)?;
        qp.tirn = create_tir_out::TIRN.get(&out) as u32;
        tracing::debug!(tirn = qp.tirn, rqtn = conf.table.rqtn, "RSS QP");
        Ok(qp)
    }
}

/// `ibv_rx_hash_fields` as a TIR's field selector, the outer one or with
/// [`rx_hash_fields::INNER`] the inner one (L3 type, L4 type, selected
/// fields), as mlx5_ib's `create_rss_raw_qp_tir` maps them;
/// `None`: no hashing (only over a one-entry table).
fn field_select(f: u32, log_size: u8) -> Result<Option<(u64, u64, u64)>> {
    use rx_hash_fields::*;
    let f = f & !INNER;
    if f & !ALL != 0 {
        return Err(Error::NotSupported(
            "RSS QP: hash fields beyond IP and TCP/UDP ports",
        ));
    }
    if f == 0 {
        return match log_size {
            0 => Ok(None),
            _ => Err(Error::Invalid("RSS QP: no hash fields over several queues")),
        };
    }
    let (v4, v6) = (f & (SRC_IPV4 | DST_IPV4), f & (SRC_IPV6 | DST_IPV6));
    let (tcp, udp) = (
        f & (SRC_PORT_TCP | DST_PORT_TCP),
        f & (SRC_PORT_UDP | DST_PORT_UDP),
    );
    if v4 != 0 && v6 != 0 {
        return Err(Error::Invalid("RSS QP: IPv4 and IPv6 fields together"));
    }
    if tcp != 0 && udp != 0 {
        return Err(Error::Invalid("RSS QP: TCP and UDP fields together"));
    }
    let l3 = if v6 != 0 {
        L3_PROT_TYPE_IPV6
    } else {
        L3_PROT_TYPE_IPV4
    };
    let l4 = if udp != 0 {
        L4_PROT_TYPE_UDP
    } else {
        L4_PROT_TYPE_TCP
    };
    let mut sel = 0;
    for (bits, field) in [
        (SRC_IPV4 | SRC_IPV6, HASH_FIELD_SEL_SRC_IP),
        (DST_IPV4 | DST_IPV6, HASH_FIELD_SEL_DST_IP),
        (SRC_PORT_TCP | SRC_PORT_UDP, HASH_FIELD_SEL_L4_SPORT),
        (DST_PORT_TCP | DST_PORT_UDP, HASH_FIELD_SEL_L4_DPORT),
    ] {
        if f & bits != 0 {
            sel |= field;
        }
    }
    Ok(Some((l3, l4, sel)))
}

impl Wq {
    /// The work queue's number (`wq_num`: the RQ number, what its CQEs
    /// name).
    pub fn wqn(&self) -> u32 {
        self.rqn
    }

    /// Posts receive buffers (one per WQE, at most the ring's free room);
    /// one doorbell-record update. Returns how many were posted.
    pub fn post_rx(&mut self, bufs: &[Sge]) -> usize {
        self.rx.post(bufs)
    }

    /// Takes up to `out.len()` received packets from the WQ's CQ.
    pub fn rx_burst(&mut self, cq: &mut Cq, out: &mut [RxPkt]) -> usize {
        self.rx.burst(cq, out)
    }

    /// Posts one receive WQE of the buffers `sg` on a WQ made by
    /// [`Context::create_wq_polled`] (`ibv_post_wq_recv`); its completion,
    /// from [`Cq::poll`], reports `wr_id`. `QueueFull` when the ring is
    /// full; `Invalid` on a WQ not polled through its CQ or for more
    /// buffers than it takes.
    pub fn post_recv_wr(&mut self, sg: &[Sge], wr_id: u64) -> Result<()> {
        let Some(p) = &self.polled else {
            return Err(Error::Invalid(
                "work queue: work requests need a WQ polled through its CQ",
            ));
        };
        let t = p.t.clone();
        self.rx.post_tracked(&t, sg, wr_id)
    }

    /// `ibv_destroy_wq`.
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let (f, len) = (destroy_rq_in::RQN, destroy_rq_in::SIZE_BYTES);
        let r = destroy_obj(&self.ctx, Opcode::DestroyRq, f, len, &mut self.rqn);
        if r.is_err() {
            // The device may still write the receive counter's record.
            self.dbrec.device_may_still_use();
        }
        r
    }
}

impl Drop for Wq {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!(error = %e, "work queue teardown");
        }
        // The RQ is gone: its CQEs left in the CQ are dropped as the poll
        // finds them (their user index names nothing any more).
        if let Some(p) = self.polled.take() {
            p.cq.detach_uidx(p.uidx);
            self.ctx.uidx.free(p.uidx);
        }
    }
}

impl RwqIndTable {
    /// The RQ table's number.
    pub fn rqtn(&self) -> u32 {
        self.rqtn
    }

    /// `ibv_destroy_rwq_ind_table`.
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let (f, len) = (destroy_rqt_in::RQTN, destroy_rqt_in::SIZE_BYTES);
        destroy_obj(&self.ctx, Opcode::DestroyRqt, f, len, &mut self.rqtn)
    }
}

impl Drop for RwqIndTable {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!(error = %e, "indirection table teardown");
        }
    }
}

impl RssQp {
    /// The TIR number (what a flow rule forwards to).
    pub fn tirn(&self) -> u32 {
        self.tirn
    }

    /// `ibv_destroy_qp`: the TIR, then its transport domain.
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let (f, len) = (destroy_tir_in::TIRN, destroy_tir_in::SIZE_BYTES);
        let tir = destroy_obj(&self.ctx, Opcode::DestroyTir, f, len, &mut self.tirn);
        let f = dealloc_transport_domain_in::TRANSPORT_DOMAIN;
        let len = dealloc_transport_domain_in::SIZE_BYTES;
        let td = destroy_obj(
            &self.ctx,
            Opcode::DeallocTransportDomain,
            f,
            len,
            &mut self.td,
        );
        tir.and(td)
    }
}

impl Drop for RssQp {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!(error = %e, "RSS QP teardown");
        }
    }
}
