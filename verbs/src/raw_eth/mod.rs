//! Raw packet queues and a burst API for data planes (rdma-core's
//! `IBV_QPT_RAW_PACKET` over mlx5, DPDK's mlx5 PMD): a [`RawPacketQp`] is
//! what mlx5_ib makes underneath one: a transport domain, a TIS and an SQ
//! that sends through it, an RQ and a direct TIR that delivers to it. Flow
//! rules ([`crate::flow`]) steer received frames to the TIR.
//!
//! The data path takes bursts: [`RawPacketQp::tx_burst`] writes one send
//! WQE per packet (control segment, Ethernet segment with the packet's
//! headers inline and the checksum offloads, one data segment pointing at
//! the payload where it lies: no copy of the payload), asks for one
//! completion at the burst's end, and rings one doorbell;
//! [`RawPacketQp::poll_tx`] frees the ring from those completions.
//! Where the device offers enhanced multi-packet send WQEs and wants no
//! headers inline, [`RawPacketQp::tx_burst_empw`] sends whole frames many
//! to a WQE (16 bytes of WQE per frame by pointer, DPDK's eMPW and
//! mlx5e's TX MPWQE), small ones copied into it.
//! [`RawPacketQp::post_rx`] posts receive buffers (one data segment each)
//! with one doorbell-record update, and [`RawPacketQp::rx_burst`] turns
//! receive CQEs into [`RxPkt`]s: length, the RQ slot, checksums good, L3
//! and L4 types, RSS hash, VLAN. The send and receive CQs are polled
//! through their rings only (they must be two CQs, owned by the caller,
//! not shared with verbs QPs).
//!
//! A raw packet QP may instead complete into verbs CQs
//! ([`Context::create_raw_packet_qp_polled`], `polled.rs`:
//! `ibv_create_qp(IBV_QPT_RAW_PACKET)` as the C library offers it): one
//! work request at a time, each with its wr_id, and the completions taken
//! by [`Cq::poll`] beside those of other QPs.

mod polled;

pub use polled::{RawSendWr, RawSges};

use std::sync::Arc;

use mlx5_hw::cqe::{self as c, CqeOpcode, CqeSyndrome};
use mlx5_hw::eth::{
    CAP_INLINE_MODE_NOT_REQUIRED, CAP_INLINE_MODE_VPORT_CONTEXT, CQE_L3_HDR_TYPE_IPV4,
    CQE_L3_HDR_TYPE_IPV6, CQE_L3_HDR_TYPE_SHIFT, CQE_L3_OK, CQE_L4_HDR_TYPE_SHIFT,
    CQE_L4_HDR_TYPE_UDP, CQE_L4_OK, CQE_RX_TUNNEL_PACKET, CQE_VLAN_PRESENT, ETH_ADDRS_LEN,
    ETH_P_8021Q, ETH_WQE_L3_CSUM, ETH_WQE_L4_CSUM, INLINE_MODE_NONE, MIN_INLINE, MPWRQ_CQE_FILLER,
    MPWRQ_CQE_STRIDES_SHIFT, QUEUE_STATE_RDY, QUEUE_STATE_RST, TIRC_DISP_TYPE_DIRECT, VLAN_HLEN,
    WQ_TYPE_CYCLIC,
};
use mlx5_hw::ifc::{
    alloc_transport_domain_out, cqe64, create_rq_in, create_rq_out, create_sq_in, create_sq_out,
    create_tir_in, create_tir_out, create_tis_in, create_tis_out, dealloc_transport_domain_in,
    destroy_rq_in, destroy_sq_in, destroy_tir_in, destroy_tis_in, err_cqe,
    general_obj_in_cmd_hdr as hdr, modify_rq_in, modify_sq_in, rqc, sqc, tirc, tisc, wq,
    wqe_ctrl_seg, wqe_data_seg, wqe_eth_seg, PerProtocolNetworkingOffloadCaps,
    QueryNicVportContextOut,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::uar::BF_OFFSET;
use mlx5_hw::wqe::{self as w, WqeOpcode};
use vfio::mmio::{dma_wmb, wmb};
use vfio::DmaRing;

use crate::buf::DmaSlice;
use crate::caps::CapType;
use crate::cq::{Cq, CqeFields, WcStatus};
use crate::dbrec::Dbrec;
use crate::device::{Context, Ctx};
use crate::mr::Sge;
use crate::pd::Pd;
use crate::uar::Uar;
use crate::{Error, Result};

/// Bytes of a send WQE basic block (`MLX5_SEND_WQE_BB`).
const BB: usize = w::SEND_WQE_BB;
/// Output bytes of a destroy command (status, syndrome, reserved).
pub(crate) const DESTROY_OUT: usize = mlx5_hw::ifc::destroy_sq_out::SIZE_BYTES;
/// Output bytes of MODIFY_SQ / MODIFY_RQ.
const MODIFY_OUT: usize = mlx5_hw::ifc::modify_sq_out::SIZE_BYTES;
/// Bytes of a receive WQE: one data segment.
pub(crate) const RX_WQE: usize = wqe_data_seg::SIZE_BYTES;
/// Bytes of the next-WQE segment a striding RQ's WQE starts with.
const NEXT_SEG: usize = mlx5_hw::ifc::wqe_srq_next_seg::SIZE_BYTES;
/// Headers that fit inline in a two-block WQE (control, Ethernet segment
/// with its two header bytes, 48 more, one data segment).
pub const MAX_INLINE_HEADERS: usize =
    2 * BB - wqe_ctrl_seg::SIZE_BYTES - wqe_eth_seg::SIZE_BYTES - wqe_data_seg::SIZE_BYTES
        + INLINE_START;
/// Header bytes inside the Ethernet segment itself.
const INLINE_START: usize = wqe_eth_seg::INLINE_HDR_START.width / 8;
/// Largest frame [`TxFrame::Inline`] copies into an eMPW WQE (DPDK's
/// default `txq_inline_mpw` is 268 bytes with its 4-byte segment head).
pub const MAX_EMPW_INLINE: usize = 256;
/// Segments an eMPW WQE holds at most (its control and Ethernet segments
/// included): its `ds` count is six bits (`MLX5_WQE_CTRL_DS_MASK`, 63), and
/// no WQE is longer than `MLX5_SEND_WQE_MAX_WQEBBS` blocks (64 segments).
const EMPW_MAX_DS: usize = w::WQE_CTRL_DS_MASK as usize;
/// Headers that fit a one-block WQE: the two in the Ethernet segment and
/// one 16-byte unit after it (mlx5e's usual 18: Ethernet with a VLAN tag).
pub const ONE_BLOCK_INLINE_HEADERS: usize = INLINE_START + 16;

// The one-block WQE is built as eight words: the offsets it assumes.
const _: () = assert!(
    MIN_INLINE >= INLINE_START + 8
        && wqe_ctrl_seg::SIZE_BYTES == 16
        && wqe_ctrl_seg::FM_CE_SE.off / 8 == 11
        && wqe_eth_seg::SIZE_BYTES == 16
        && wqe_eth_seg::CS_FLAGS.off / 8 == 4
        && wqe_eth_seg::INLINE_HDR_SZ.off / 8 == 12
        && wqe_eth_seg::INLINE_HDR_START.off / 8 == 14
        && wqe_data_seg::BYTE_COUNT.off / 8 == 0
        && wqe_data_seg::LKEY.off / 8 == 4
        && wqe_data_seg::ADDR.off / 8 == 8
);

/// Ring sizes of a raw packet QP (log2).
#[derive(Debug, Clone, Copy)]
pub struct RawQpCap {
    /// Send ring: 2^this 64-byte blocks (one per packet whose headers are
    /// at most [`ONE_BLOCK_INLINE_HEADERS`] bytes, two for longer ones).
    pub log_sq_bbs: u8,
    /// Receive ring: 2^this buffers.
    pub log_rq_wqes: u8,
    /// Strip the C-VLAN tag of received frames into their completion
    /// ([`RxPkt::vlan`]; rdma-core's `IBV_QP_CREATE_CVLAN_STRIPPING`);
    /// refused where the device offers no VLAN offload (`vlan_cap`).
    /// Without it the tag stays in the frame (mlx5_ib sets `vsd`).
    pub strip_vlan: bool,
    /// Parse tunnels (mlx5dv's `MLX5DV_QP_CREATE_TUNNEL_OFFLOADS`, the
    /// TIR's `tunneled_offload_en`): a tunnelled frame (VXLAN to a port
    /// the function registered, [`Context::add_vxlan_udp_dport`], or GRE)
    /// completes as one ([`RxPkt::tunneled`]), its types and checksum
    /// verdicts the inner packet's.
    pub tunnel_offloads: bool,
    /// Multi-packet receive (a striding RQ, DPDK's MPRQ): each posted
    /// buffer is a WQE of strides that many frames land in; `None`: one
    /// frame a buffer.
    pub striding: Option<StridingRq>,
}

/// A striding RQ's WQEs ([`RawQpCap::striding`]): each buffer posted is
/// 2^`log_num_strides` strides of 2^`log_stride_size` bytes; a frame lands
/// at the next free stride and takes as many as it needs
/// ([`RxPkt::offset`]), one that no longer fits ends the buffer. Refused
/// without the device's `striding_rq`, strides outside 64 B-8 KiB, or
/// counts outside 2^9-2^16 (2^3 up with `ext_stride_num_range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridingRq {
    /// log2 of the strides a buffer holds.
    pub log_num_strides: u8,
    /// log2 of a stride's bytes.
    pub log_stride_size: u8,
}

/// One packet to send: `headers` go inline in the WQE (at least an
/// Ethernet header), the payload is read where it lies through its key.
#[derive(Debug, Clone, Copy)]
pub struct TxPkt<'a> {
    /// The headers, sent inline (Ethernet at least).
    pub headers: &'a [u8],
    /// The payload (empty: the headers are the whole frame).
    pub payload: Option<Sge>,
    /// Ask the device to fill the IPv4 and TCP/UDP checksums.
    pub csum: bool,
    /// Large send offload (TSO): 0 for none; else the device cuts this TCP
    /// segment into frames of at most `mss` payload bytes, each with a copy
    /// of `headers` (which must then be the whole Ethernet, IP and TCP
    /// headers) fixed up, checksums filled in (the LSO opcode).
    pub mss: u16,
    /// Send the frame with this 802.1Q (C-VLAN) tag, `headers` being
    /// untagged: the tag goes into the inline headers after the MAC
    /// addresses, as mlx5e and DPDK's mlx5 PMD insert it when they inline
    /// L2 (the device's own insertion, `wqe_vlan_insert`, is for WQEs
    /// without inline headers, which this path does not make). An
    /// Ethernet header with its tag fits a one-block WQE.
    pub vlan: Option<u16>,
}

/// One frame of an enhanced multi-packet burst
/// ([`RawPacketQp::tx_burst_empw`]): the whole frame, headers and all, at
/// least an Ethernet header.
#[derive(Debug, Clone, Copy)]
pub enum TxFrame<'a> {
    /// Read where it lies, through its key (no copy).
    Ref(Sge),
    /// Copied into the WQE (at most [`MAX_EMPW_INLINE`] bytes): the device
    /// reads it with the WQE, no read of its own.
    Inline(&'a [u8]),
}

/// One received packet, from its CQE.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxPkt {
    /// Bytes of the frame.
    pub len: u32,
    /// The receive slot it landed in (the order [`RawPacketQp::post_rx`]
    /// posted the buffers, modulo the ring).
    pub slot: u16,
    /// Where in the slot's buffer the frame starts: 0, or on a striding
    /// RQ the first stride it took times the stride's bytes.
    pub offset: u32,
    /// A tunnelled frame, through a QP that parses tunnels
    /// ([`RawQpCap::tunnel_offloads`]): the fields below describe its
    /// inner packet, and `l3_ok`/`l4_ok` say its outer checksums are good
    /// too.
    pub tunneled: bool,
    /// IPv4 frame.
    pub ipv4: bool,
    /// IPv6 frame.
    pub ipv6: bool,
    /// UDP datagram.
    pub udp: bool,
    /// IP header checksum good.
    pub l3_ok: bool,
    /// TCP/UDP checksum good.
    pub l4_ok: bool,
    /// The RSS hash (indirect TIRs), 0 otherwise.
    pub rss_hash: u32,
    /// The tag of the flow rule that steered it
    /// ([`crate::flow::FlowSteering::create_flow_tagged`]), 0 without one.
    pub flow_tag: u32,
    /// The C-VLAN tag's TCI, when the device stripped it from the frame
    /// ([`RawQpCap::strip_vlan`]).
    pub vlan: Option<u16>,
    /// `None`: received; else the error the device reported.
    pub error: Option<WcStatus>,
    /// When the device completed it: its free-running clock, in cycles of
    /// `device_frequency_khz` (the CQE's timestamp; [`Context::read_clock`]
    /// reads the same clock).
    pub timestamp: u64,
}

/// A raw packet QP: TD, TIS, SQ, RQ and a direct TIR.
#[derive(Debug)]
pub struct RawPacketQp {
    ctx: Arc<Ctx>,
    td: u32,
    tisn: u32,
    sqn: u32,
    rqn: u32,
    tirn: u32,
    send_cqn: u32,
    recv_cqn: u32,
    sq: DmaSlice,
    /// The send ring as 64-byte blocks (its bounds checked once).
    sq_ring: DmaRing<BB>,
    /// The receive side (its counter at +0 of `dbrec`).
    rx: RxRing,
    /// Receive counter at +0, send counter at +4.
    dbrec: Dbrec,
    /// The SQ's UAR page (given back on drop) and its BAR offset.
    uar: Option<Arc<Uar>>,
    uar_off: usize,
    log_sq: u8,
    /// The RQ strips C-VLAN tags (`rqc.vsd` clear).
    strip_vlan: bool,
    /// Its TIR parses tunnels ([`RawQpCap::tunnel_offloads`]).
    tunnel_offloads: bool,
    /// Send: next block, first block not yet completed.
    sq_pc: u16,
    sq_ci: u16,
    /// The first block of the last WQE written (the doorbell copies its
    /// first 8 bytes).
    sq_last: u16,
    /// Per block: where the WQE that starts there ends (for completions).
    ends: Vec<u16>,
    /// Segments an eMPW WQE may hold (0: the device offers none, or
    /// wants headers inline: [`Context::empw_offered`]).
    empw_ds: usize,
    /// Completions taken by verbs CQs (`polled.rs`); `None`: by
    /// [`Self::poll_tx`] and [`Self::rx_burst`].
    polled: Option<polled::Polled>,
}

pub(crate) fn cmd(op: Opcode, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    hdr::OPCODE.set(&mut v, u64::from(op.to_raw()));
    v
}

impl Context {
    /// `ibv_create_qp(IBV_QPT_RAW_PACKET)`: the QP's objects, its queues
    /// ready (SQ and RQ in RDY).
    pub fn create_raw_packet_qp(
        &self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: RawQpCap,
    ) -> Result<RawPacketQp> {
        if send_cq.cqn() == recv_cq.cqn() {
            return Err(Error::Invalid("raw packet QP: one CQ for send and receive"));
        }
        self.make_raw_packet_qp(pd, send_cq, recv_cq, cap, None, 1)
    }

    /// The objects of a raw packet QP whose completions go to `send_cq`
    /// and `recv_cq`, its RQ created with user index `uidx` (polled
    /// through verbs CQs) and receive WQEs of `rx_segs` data segments.
    fn make_raw_packet_qp(
        &self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: RawQpCap,
        uidx: Option<u32>,
        rx_segs: usize,
    ) -> Result<RawPacketQp> {
        if cap.log_sq_bbs < 1 || cap.log_sq_bbs > 15 || cap.log_rq_wqes > 15 {
            return Err(Error::Invalid("raw packet QP: ring size"));
        }
        if cap.strip_vlan && !self.vlan_offload()? {
            return Err(Error::NotSupported(
                "raw packet QP: VLAN stripping (no vlan_cap)",
            ));
        }
        if cap.tunnel_offloads && !self.tunnel_offload()? {
            return Err(Error::NotSupported(
                "raw packet QP: tunnel offloads (no tunnel_stateless_vxlan or _gre)",
            ));
        }
        let empw_ds = match self.empw_offered()? {
            true => EMPW_MAX_DS.min(usize::from(self.ctx.hca.caps().gen().max_wqe_sz_sq()) / 16),
            false => 0,
        };
        let c = self.ctx.clone();
        let dma = c.hca.dma();
        let sq = dma.alloc_buf(BB << cap.log_sq_bbs)?;
        let sq_ring = DmaRing::new(sq.buf().clone(), sq.offset(), 1 << cap.log_sq_bbs)?;
        if let Some(st) = cap.striding {
            self.check_striding(st)?;
        }
        let rq = dma.alloc_buf(RxRing::wqe_bytes(cap.striding, rx_segs) << cap.log_rq_wqes)?;
        let dbrec = dma.alloc_dbrec()?;
        dbrec.buf().write(dbrec.offset(), &[0; 8])?;
        let rx = RxRing::new(rq, &dbrec, cap.log_rq_wqes, cap.striding, rx_segs);
        let uar = c.alloc_uar()?;
        let td = match alloc_transport_domain(&c) {
            Ok(td) => td,
            Err(e) => {
                c.release_uar(uar);
                return Err(e);
            }
        };
        let mut qp = RawPacketQp {
            ctx: c,
            td,
            tisn: 0,
            sqn: 0,
            rqn: 0,
            tirn: 0,
            send_cqn: send_cq.cqn(),
            recv_cqn: recv_cq.cqn(),
            sq,
            sq_ring,
            rx,
            dbrec,
            uar_off: uar.offset(),
            uar: Some(uar),
            log_sq: cap.log_sq_bbs,
            strip_vlan: cap.strip_vlan,
            tunnel_offloads: cap.tunnel_offloads,
            sq_pc: 0,
            sq_ci: 0,
            sq_last: 0,
            ends: vec![0; 1 << cap.log_sq_bbs],
            empw_ds,
            polled: None,
        };
        // On an error, Drop destroys what was made.
        qp.make_objects(pd.pdn(), uidx.unwrap_or(0))?;
        Ok(qp)
    }
}

impl Context {
    /// Whether the device parses some tunnel for its offloads
    /// (`tunnel_stateless_vxlan` or `tunnel_stateless_gre`), as mlx5_ib
    /// asks before it gives a QP `MLX5_QP_FLAG_TUNNEL_OFFLOADS`.
    pub(crate) fn tunnel_offload(&self) -> Result<bool> {
        Ok(self.eth_offload_caps()?.is_some_and(|p| {
            let c = PerProtocolNetworkingOffloadCaps::new_unchecked(&p[..]);
            c.tunnel_stateless_vxlan() || c.tunnel_stateless_gre()
        }))
    }

    /// Whether the device checks received IP and TCP/UDP checksums
    /// (the Ethernet offload caps' `csum_cap`): what mlx5_ib reports as
    /// `IB_DEVICE_RAW_IP_CSUM`. Queried when asked.
    pub fn raw_ip_csum(&self) -> Result<bool> {
        Ok(self
            .eth_offload_caps()?
            .is_some_and(|p| PerProtocolNetworkingOffloadCaps::new_unchecked(&p[..]).csum_cap()))
    }

    pub(crate) fn vlan_offload(&self) -> Result<bool> {
        Ok(self
            .eth_offload_caps()?
            .is_some_and(|p| PerProtocolNetworkingOffloadCaps::new_unchecked(&p[..]).vlan_cap()))
    }

    /// The Ethernet offload caps page (current values), `None` where the
    /// device has none (`eth_net_offloads` clear). Queried when asked.
    fn eth_offload_caps(&self) -> Result<Option<Vec<u8>>> {
        if !self.ctx.hca.caps().gen().eth_net_offloads() {
            return Ok(None);
        }
        crate::caps::query_cap(self.ctx.hca.cmd(), CapType::EthernetOffloads, true).map(Some)
    }

    /// A striding RQ's geometry against the device ([`StridingRq`]).
    fn check_striding(&self, st: StridingRq) -> Result<()> {
        use mlx5_hw::eth::{
            MPWQE_LOG_NUM_STRIDES_BASE as BASE, MPWQE_LOG_NUM_STRIDES_EXT_BASE as EXT,
            MPWQE_LOG_STRIDE_SZ_BASE as SZ,
        };
        let g = self.ctx.hca.caps().gen();
        if !g.striding_rq() {
            return Err(Error::NotSupported("striding RQ (no striding_rq)"));
        }
        let least = if g.ext_stride_num_range() { EXT } else { BASE };
        // The field's ranges: 2^9..2^18 (0..=9) or 2^3..2^8 (10..=15);
        // strides of 2^6..2^13 bytes (3 bits).
        if !(least..=BASE + 7).contains(&st.log_num_strides)
            || !(SZ..=SZ + 7).contains(&st.log_stride_size)
        {
            return Err(Error::Invalid(
                "striding RQ: strides or their size out of range",
            ));
        }
        Ok(())
    }

    /// Whether sends may use enhanced multi-packet WQEs, whose frames carry
    /// no inline headers: the device offers them
    /// (`enhanced_multi_pkt_send_wqe`, as mlx5e's
    /// `mlx5e_tx_mpwqe_supported`) and needs no headers inline (the caps'
    /// `wqe_inline_mode` not required, or deferring to the NIC vport
    /// context whose `min_wqe_inline_mode` is none: Linux's
    /// `mlx5_query_min_inline`; mlx5e sends by MPWQE only with no inline
    /// headers). Queried when asked, not at bring-up.
    pub fn empw_offered(&self) -> Result<bool> {
        let Some(page) = self.eth_offload_caps()? else {
            return Ok(false);
        };
        let caps = PerProtocolNetworkingOffloadCaps::new_unchecked(&page[..]);
        if !caps.enhanced_multi_pkt_send_wqe() {
            return Ok(false);
        }
        Ok(match caps.wqe_inline_mode() {
            CAP_INLINE_MODE_NOT_REQUIRED => true,
            CAP_INLINE_MODE_VPORT_CONTEXT => {
                let out = self.ctx.hca.query_nic_vport_context()?;
                let o = QueryNicVportContextOut::new_unchecked(&out[..]);
                o.nic_vport_context().min_wqe_inline_mode() == INLINE_MODE_NONE
            }
            _ => false,
        })
    }
}

/// `p` with its headers tagged with the 802.1Q tag `tci` after the MAC
/// addresses, built in `buf`; `None` when they would no longer fit inline.
fn with_vlan_tag<'a>(
    p: &TxPkt<'_>,
    tci: u16,
    buf: &'a mut [u8; MAX_INLINE_HEADERS],
) -> Option<TxPkt<'a>> {
    let (addrs, rest) = p.headers.split_at(ETH_ADDRS_LEN);
    let n = p.headers.len() + VLAN_HLEN;
    let out = buf.get_mut(..n)?;
    out[..ETH_ADDRS_LEN].copy_from_slice(addrs);
    out[ETH_ADDRS_LEN..ETH_ADDRS_LEN + 2].copy_from_slice(&ETH_P_8021Q.to_be_bytes());
    out[ETH_ADDRS_LEN + 2..ETH_ADDRS_LEN + VLAN_HLEN].copy_from_slice(&tci.to_be_bytes());
    out[ETH_ADDRS_LEN + VLAN_HLEN..].copy_from_slice(rest);
    Some(TxPkt {
        headers: out,
        payload: p.payload,
        csum: p.csum,
        mss: p.mss,
        vlan: None,
    })
}

impl RawPacketQp {
    /// TIS, SQ (to RDY), RQ (to RDY, its CQEs carrying `uidx`), TIR.
    fn make_objects(&mut self, pdn: u32, uidx: u32) -> Result<()> {
        let hca = &self.ctx.hca;
        let mut i = cmd(Opcode::CreateTis, create_tis_in::SIZE_BYTES);
        tisc::TRANSPORT_DOMAIN
            .at(create_tis_in::CTX.off)
            .set(&mut i, u64::from(self.td));
        let out = hca.cmd().exec(&i, create_tis_out::SIZE_BYTES)?;
        self.tisn = create_tis_out::TISN.get(&out) as u32;
        let mut i = cmd(Opcode::CreateSq, create_sq_in::SIZE_BYTES + 8);
        let ctx = create_sq_in::CTX.off;
        sqc::CQN.at(ctx).set(&mut i, u64::from(self.send_cqn));
        sqc::TIS_LST_SZ.at(ctx).set(&mut i, 1);
        sqc::TIS_NUM_0.at(ctx).set(&mut i, u64::from(self.tisn));
        set_wq(&mut i, ctx + sqc::WQ.off, pdn, &self.sq, self.log_sq, BB);
        wq::UAR_PAGE.at(ctx + sqc::WQ.off).set(
            &mut i,
            u64::from(self.uar.as_ref().map_or(0, |u| u.index())),
        );
        wq::DBR_ADDR
            .at(ctx + sqc::WQ.off)
            .set(&mut i, self.dbrec.iova().0);
        let out = hca.cmd().exec(&i, create_sq_out::SIZE_BYTES)?;
        self.sqn = create_sq_out::SQN.get(&out) as u32;
        let mut i = cmd(Opcode::ModifySq, modify_sq_in::SIZE_BYTES);
        modify_sq_in::SQ_STATE.set(&mut i, QUEUE_STATE_RST);
        modify_sq_in::SQN.set(&mut i, u64::from(self.sqn));
        sqc::STATE
            .at(modify_sq_in::CTX.off)
            .set(&mut i, QUEUE_STATE_RDY);
        hca.cmd().exec(&i, MODIFY_OUT)?;
        self.rqn = create_ready_rq(
            &self.ctx,
            pdn,
            self.recv_cqn,
            self.strip_vlan,
            &self.rx,
            self.dbrec.iova(),
            uidx,
        )?;
        let mut i = cmd(Opcode::CreateTir, create_tir_in::SIZE_BYTES);
        let ctx = create_tir_in::CTX.off;
        tirc::TRANSPORT_DOMAIN
            .at(ctx)
            .set(&mut i, u64::from(self.td));
        tirc::DISP_TYPE.at(ctx).set(&mut i, TIRC_DISP_TYPE_DIRECT);
        tirc::INLINE_RQN.at(ctx).set(&mut i, u64::from(self.rqn));
        tirc::TUNNELED_OFFLOAD_EN
            .at(ctx)
            .set(&mut i, u64::from(self.tunnel_offloads));
        let out = hca.cmd().exec(&i, create_tir_out::SIZE_BYTES)?;
        self.tirn = create_tir_out::TIRN.get(&out) as u32;
        Ok(())
    }

    /// The SQ number (what send CQEs name).
    pub fn sqn(&self) -> u32 {
        self.sqn
    }

    /// The RQ number (what receive CQEs name).
    pub fn rqn(&self) -> u32 {
        self.rqn
    }

    /// The TIR flow rules forward to.
    pub fn tirn(&self) -> u32 {
        self.tirn
    }

    /// Send blocks free.
    fn sq_room(&self) -> u16 {
        (1u16 << self.log_sq) - self.sq_pc.wrapping_sub(self.sq_ci)
    }

    /// Send-ring blocks whose WQEs have not completed yet (0: every
    /// payload posted so far has been read and its buffer may be reused).
    pub fn tx_in_flight(&self) -> u16 {
        self.sq_pc.wrapping_sub(self.sq_ci)
    }

    /// Sends as many of `pkts` as the ring has room for: one WQE each
    /// (one block when the headers are at most
    /// [`ONE_BLOCK_INLINE_HEADERS`] bytes, else two), the last asking for a
    /// completion, one doorbell. Returns how many were posted; a packet
    /// whose headers are shorter than an Ethernet header or longer than
    /// [`MAX_INLINE_HEADERS`] (with its VLAN tag, [`TxPkt::vlan`]) ends the
    /// burst there.
    pub fn tx_burst(&mut self, pkts: &[TxPkt<'_>]) -> usize {
        let mut sent = 0;
        for p in pkts {
            if !(MIN_INLINE..=MAX_INLINE_HEADERS).contains(&p.headers.len()) {
                break;
            }
            // A packet to tag: its headers copied with the tag (only then).
            let (mut tagged, with_tag);
            let p = match p.vlan {
                None => p,
                Some(tci) => {
                    tagged = [0u8; MAX_INLINE_HEADERS];
                    match with_vlan_tag(p, tci, &mut tagged) {
                        Some(t) => {
                            with_tag = t;
                            &with_tag
                        }
                        None => break,
                    }
                }
            };
            let ihs = p.headers.len();
            let one = ihs <= ONE_BLOCK_INLINE_HEADERS && p.mss == 0;
            if self.sq_room() < if one { 1 } else { 2 } {
                break;
            }
            if one {
                self.write_send_1bb(p);
            } else {
                self.write_send_2bb(p);
            }
            sent += 1;
        }
        if sent > 0 {
            // The burst's last WQE asks for the completion (control
            // segment bytes 8..16: signature, reserved, fm_ce_se, imm).
            let fm = u64::from_ne_bytes([0, 0, 0, w::WQE_CTRL_CQ_UPDATE, 0, 0, 0, 0]);
            self.sq_ring
                .store_words_at::<8, 1>(u32::from(self.sq_last), &[fm]);
            self.ring_sq();
        }
        sent
    }

    /// Sends as many of `frames` as the ring has room for in enhanced
    /// multi-packet WQEs (ENHANCED_MPSW): each WQE a control and an
    /// Ethernet segment (`csum`: the IPv4 and TCP/UDP checksums of every
    /// frame filled in by the device) and then one segment per frame, a
    /// data segment pointing at it ([`TxFrame::Ref`], 16 bytes) or the
    /// frame copied in after a 4-byte head ([`TxFrame::Inline`]); up to
    /// the device's largest WQE each; the last WQE asks for a completion;
    /// one doorbell. Returns how many were posted; a frame shorter than an
    /// Ethernet header or an inline one longer than [`MAX_EMPW_INLINE`] ends
    /// the burst there. Refused where the device offers no eMPW or wants
    /// headers inline ([`Context::empw_offered`]): use [`Self::tx_burst`].
    pub fn tx_burst_empw(&mut self, frames: &[TxFrame<'_>], csum: bool) -> Result<usize> {
        if self.empw_ds == 0 {
            return Err(Error::NotSupported(
                "eMPW: no enhanced_multi_pkt_send_wqe, or headers must be inline",
            ));
        }
        let cs = if csum {
            ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM
        } else {
            0
        };
        let eth = [u64::from_ne_bytes([0, 0, 0, 0, cs, 0, 0, 0]), 0];
        let mut sent = 0;
        let mut bad = false;
        while sent < frames.len() && !bad {
            // Segments this WQE may take: the device's largest WQE, or the
            // ring's free blocks.
            let max = self.empw_ds.min(usize::from(self.sq_room()) * 4);
            let start = self.sq_pc;
            let mut ds = 2;
            let mut k = sent;
            for f in &frames[sent..] {
                let need = match *f {
                    TxFrame::Ref(s) if s.length as usize >= MIN_INLINE => 1,
                    TxFrame::Inline(b) if (MIN_INLINE..=MAX_EMPW_INLINE).contains(&b.len()) => {
                        (4 + b.len()).div_ceil(16)
                    }
                    _ => {
                        bad = true;
                        break;
                    }
                };
                if ds + need > max {
                    break;
                }
                match *f {
                    TxFrame::Ref(s) => self.store_seg(
                        start,
                        ds,
                        [
                            (u64::from(s.length) << 32 | u64::from(s.lkey)).to_be(),
                            s.addr.to_be(),
                        ],
                    ),
                    TxFrame::Inline(b) => self.store_inline(start, ds, b),
                }
                ds += need;
                k += 1;
            }
            if k == sent {
                break;
            }
            self.store_seg(
                start,
                0,
                [self.ctrl_word(start, ds, WqeOpcode::EnhancedMpsw), 0],
            );
            self.store_seg(start, 1, eth);
            self.advance(ds.div_ceil(4) as u16);
            sent = k;
        }
        if sent > 0 {
            let fm = u64::from_ne_bytes([0, 0, 0, w::WQE_CTRL_CQ_UPDATE, 0, 0, 0, 0]);
            self.sq_ring
                .store_words_at::<8, 1>(u32::from(self.sq_last), &[fm]);
            self.ring_sq();
        }
        Ok(sent)
    }

    /// Stores 16-byte segment `i` of the WQE starting at block `start`.
    #[inline(always)]
    fn store_seg(&self, start: u16, i: usize, words: [u64; 2]) {
        let idx = u32::from(start).wrapping_add((i / 4) as u32);
        match i % 4 {
            0 => self.sq_ring.store_words_at::<0, 2>(idx, &words),
            1 => self.sq_ring.store_words_at::<16, 2>(idx, &words),
            2 => self.sq_ring.store_words_at::<32, 2>(idx, &words),
            _ => self.sq_ring.store_words_at::<48, 2>(idx, &words),
        }
    }

    /// Stores an inline data segment carrying `frame` from segment `i` of
    /// the WQE at `start` on: `byte_count` with `MLX5_INLINE_SEG`, the bytes,
    /// zeros to the next 16.
    fn store_inline(&self, start: u16, i: usize, frame: &[u8]) {
        let word = |x: &[u8]| u64::from_ne_bytes(x.try_into().unwrap_or_default());
        // The first 16 bytes: the head and the frame's first 12 (a frame
        // is at least an Ethernet header, 14).
        let mut first = [0u8; 16];
        first[..4].copy_from_slice(&(frame.len() as u32 | w::INLINE_SEG).to_be_bytes());
        first[4..].copy_from_slice(&frame[..12]);
        self.store_seg(start, i, [word(&first[..8]), word(&first[8..])]);
        let mut chunks = frame[12..].chunks_exact(16);
        let mut n = i + 1;
        for c in &mut chunks {
            self.store_seg(start, n, [word(&c[..8]), word(&c[8..])]);
            n += 1;
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 16];
            last[..rest.len()].copy_from_slice(rest);
            self.store_seg(start, n, [word(&last[..8]), word(&last[8..])]);
        }
    }

    /// The control segment's first word: opcode, index, SQ number, size.
    fn ctrl_word(&self, idx: u16, ds: usize, opcode: WqeOpcode) -> u64 {
        let op = w::opmod_idx_opcode(0, idx, opcode);
        (u64::from(op) << 32 | u64::from(self.sqn << 8 | ds as u32)).to_be()
    }

    /// Marks the WQE of `nbb` blocks written at the producer counter.
    fn advance(&mut self, nbb: u16) {
        let idx = self.sq_pc;
        self.sq_last = idx;
        self.sq_pc = idx.wrapping_add(nbb);
        let mask = (1u16 << self.log_sq) - 1;
        self.ends[usize::from(idx & mask)] = self.sq_pc;
    }

    /// One-block send WQE built as eight words in registers: control,
    /// Ethernet segment with the first two header bytes, 16 more header
    /// bytes, the payload's data segment.
    fn write_send_1bb(&mut self, p: &TxPkt<'_>) {
        let h = p.headers;
        let ihs = h.len();
        // Headers are 14..=18 bytes here: 2..10 always there, 10..18 padded
        // with zeros when shorter (a fixed-size load in mlx5e's usual 18).
        let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or_default());
        let w4 = word(&h[INLINE_START..INLINE_START + 8]);
        let w5 = match h.get(INLINE_START + 8..INLINE_START + 16) {
            Some(b) => word(b),
            None => {
                let mut t = [0u8; 8];
                t[..ihs - INLINE_START - 8].copy_from_slice(&h[INLINE_START + 8..]);
                u64::from_ne_bytes(t)
            }
        };
        let ds = 3 + usize::from(p.payload.is_some());
        let cs = if p.csum {
            ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM
        } else {
            0
        };
        let [sz_hi, sz_lo] = (ihs as u16).to_be_bytes();
        let (bc_lkey, addr) = match p.payload {
            Some(s) => (
                (u64::from(s.length) << 32 | u64::from(s.lkey)).to_be(),
                s.addr.to_be(),
            ),
            None => (0, 0),
        };
        let words = [
            self.ctrl_word(self.sq_pc, ds, WqeOpcode::Send),
            0,
            u64::from_ne_bytes([0, 0, 0, 0, cs, 0, 0, 0]),
            u64::from_ne_bytes([0, 0, 0, 0, sz_hi, sz_lo, h[0], h[1]]),
            w4,
            w5,
            bc_lkey,
            addr,
        ];
        self.sq_ring
            .store_words_at::<0, 8>(u32::from(self.sq_pc), &words);
        self.advance(1);
    }

    /// Two-block send WQE (headers past [`ONE_BLOCK_INLINE_HEADERS`], or
    /// LSO):
    /// built in a staging buffer through the segment views, then stored.
    fn write_send_2bb(&mut self, p: &TxPkt<'_>) {
        let mut wqe = [0u8; 2 * BB];
        let ctrl = wqe_ctrl_seg::SIZE_BYTES;
        let eth = ctrl + wqe_eth_seg::SIZE_BYTES;
        let ihs = p.headers.len();
        let data = eth + (ihs - INLINE_START).next_multiple_of(16);
        let ds = (data + wqe_data_seg::SIZE_BYTES) / 16;
        let e = &mut wqe[ctrl..];
        if p.csum || p.mss != 0 {
            wqe_eth_seg::CS_FLAGS.set(e, u64::from(ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM));
        }
        wqe_eth_seg::MSS.set(e, u64::from(p.mss));
        let opcode = if p.mss != 0 {
            WqeOpcode::Lso
        } else {
            WqeOpcode::Send
        };
        wqe_eth_seg::INLINE_HDR_SZ.set(e, ihs as u64);
        let at = wqe_eth_seg::INLINE_HDR_START.off / 8;
        e[at..at + ihs].copy_from_slice(p.headers);
        if let Some(s) = p.payload {
            let d = &mut wqe[data..];
            wqe_data_seg::BYTE_COUNT.set(d, u64::from(s.length));
            wqe_data_seg::LKEY.set(d, u64::from(s.lkey));
            wqe_data_seg::ADDR.set(d, s.addr);
        }
        let mut words = [0u64; 16];
        for (w, b) in words.iter_mut().zip(wqe.chunks_exact(8)) {
            *w = u64::from_ne_bytes(b.try_into().unwrap_or_default());
        }
        words[0] = self.ctrl_word(self.sq_pc, ds, opcode);
        let (a, b) = words.split_at(8);
        let idx = u32::from(self.sq_pc);
        self.sq_ring
            .store_words_at::<0, 8>(idx, a.try_into().unwrap_or(&[0; 8]));
        self.sq_ring
            .store_words_at::<0, 8>(idx.wrapping_add(1), b.try_into().unwrap_or(&[0; 8]));
        self.advance(2);
    }

    /// The send doorbell: the record, then the last WQE's first 8 bytes at
    /// the UAR's BlueFlame register.
    fn ring_sq(&self) {
        dma_wmb();
        let rec = self.dbrec.buf();
        let _ = rec.store_u32_be(self.dbrec.offset() + 4, u32::from(self.sq_pc));
        wmb();
        let [first] = self.sq_ring.load_words_at::<0, 1>(u32::from(self.sq_last));
        let bar = self.ctx.hca.bar();
        let _ = bar.write64_raw(self.uar_off + BF_OFFSET, first.to_ne_bytes());
    }

    /// Reads the send CQ: each completion frees the ring up to the end of
    /// the WQE it names. Returns the completions read, or the status of an
    /// error CQE (the SQ is then in error).
    pub fn poll_tx(&mut self, cq: &mut Cq) -> std::result::Result<usize, WcStatus> {
        let mask = (1u16 << self.log_sq) - 1;
        let mut n = 0;
        let ring = cq.ring_mut();
        while let Some(e) = ring.next_cqe() {
            let op = c::cqe_opcode(e.u8_at(cqe64::OP_OWN.off / 8));
            if op != CqeOpcode::Req {
                let s = e.u8_at(err_cqe::SYNDROME.off / 8);
                ring.update_ci();
                return Err(WcStatus::from_syndrome(CqeSyndrome::from_raw(s)));
            }
            let at = e.be16_at(cqe64::WQE_COUNTER.off / 8);
            self.sq_ci = self.ends[usize::from(at & mask)];
            n += 1;
        }
        ring.update_ci();
        Ok(n)
    }

    /// Counts everything posted as completed without a completion
    /// (benchmarks over a stopped device, as rdma-core's harness sets
    /// `sq.tail = sq.head`). With a live device, WQEs it has not read yet
    /// would be overwritten by the next burst.
    pub fn tx_rewind(&mut self) {
        self.sq_ci = self.sq_pc;
    }

    /// Posts receive buffers (one per WQE, at most the ring's free room);
    /// one doorbell-record update. Returns how many were posted.
    pub fn post_rx(&mut self, bufs: &[Sge]) -> usize {
        self.rx.post(bufs)
    }

    /// Takes up to `out.len()` received packets from the receive CQ.
    pub fn rx_burst(&mut self, cq: &mut Cq, out: &mut [RxPkt]) -> usize {
        self.rx.burst(cq, out)
    }

    /// Destroys TIR, RQ, SQ, TIS and the TD.
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let mut first = Ok(());
        let steps: [(Opcode, mlx5_hw::bits::BitField, usize, &mut u32); 5] = [
            (
                Opcode::DestroyTir,
                destroy_tir_in::TIRN,
                destroy_tir_in::SIZE_BYTES,
                &mut self.tirn,
            ),
            (
                Opcode::DestroyRq,
                destroy_rq_in::RQN,
                destroy_rq_in::SIZE_BYTES,
                &mut self.rqn,
            ),
            (
                Opcode::DestroySq,
                destroy_sq_in::SQN,
                destroy_sq_in::SIZE_BYTES,
                &mut self.sqn,
            ),
            (
                Opcode::DestroyTis,
                destroy_tis_in::TISN,
                destroy_tis_in::SIZE_BYTES,
                &mut self.tisn,
            ),
            (
                Opcode::DeallocTransportDomain,
                dealloc_transport_domain_in::TRANSPORT_DOMAIN,
                dealloc_transport_domain_in::SIZE_BYTES,
                &mut self.td,
            ),
        ];
        for (op, f, len, n) in steps {
            let r = destroy_obj(&self.ctx, op, f, len, n);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// A cyclic `wq` at bit `at` of `i` over `buf` (one page list entry
/// after the input's fixed part).
fn set_wq(i: &mut [u8], at: usize, pdn: u32, buf: &DmaSlice, log: u8, stride: usize) {
    wq::WQ_TYPE.at(at).set(i, WQ_TYPE_CYCLIC);
    wq::PD.at(at).set(i, u64::from(pdn));
    wq::LOG_WQ_STRIDE
        .at(at)
        .set(i, u64::from(stride.trailing_zeros()));
    wq::LOG_WQ_SZ.at(at).set(i, u64::from(log));
    let log_page = buf.len().next_power_of_two().trailing_zeros().max(12) - 12;
    wq::LOG_WQ_PG_SZ.at(at).set(i, u64::from(log_page));
    let n = i.len();
    i[n - 8..].copy_from_slice(&buf.iova().0.to_be_bytes());
}

/// The receive side of a cyclic Ethernet RQ (one data segment per WQE,
/// its receive counter at +0 of a doorbell record): what a raw packet QP
/// and a receive work queue ([`crate::rss::Wq`]) post to and poll.
#[derive(Debug)]
pub(crate) struct RxRing {
    ring: DmaSlice,
    /// The doorbell record's buffer and where the record starts in it.
    rec: Arc<vfio::DmaBuffer>,
    rec_off: usize,
    log: u8,
    /// Bytes of a WQE: a data segment, or on a striding RQ the next-WQE
    /// segment and a data segment.
    wqe: usize,
    striding: Option<StridingRq>,
    /// A striding RQ: strides the head buffer's completions consumed.
    used: u32,
    /// Buffers posted, buffers completed.
    pc: u16,
    ci: u16,
    /// A compressed session being expanded.
    zip: Option<Zip>,
}

/// A compressed session of CQEs being expanded
/// ([`crate::cq::CqeCompression`]): a title CQE counting them in
/// `byte_cnt`, then arrays of eight mini CQEs (8 bytes: the RSS hash or
/// the checksum, then the byte count) at slots 1, 8, 16, ... after it.
/// Each packet is the title with its mini CQE's fields and the WQE
/// counter worked out: one more buffer each on a cyclic RQ, the strides
/// the last one took on a striding RQ (whose WQE is the title's).
#[derive(Debug)]
struct Zip {
    title: [u8; 64],
    /// The title's CQ index, the session's CQEs, those taken.
    at: u32,
    n: u32,
    taken: u32,
    /// The mini CQE array of the packets `taken & !7..`.
    minis: [u8; 64],
    /// The WQE counter of the next packet.
    counter: u16,
}

impl RxRing {
    /// `ring` of `2^log` WQEs, counted in `dbrec`.
    pub(crate) fn new(
        ring: DmaSlice,
        dbrec: &Dbrec,
        log: u8,
        striding: Option<StridingRq>,
        segs: usize,
    ) -> Self {
        Self {
            ring,
            rec: dbrec.buf().clone(),
            rec_off: dbrec.offset(),
            log,
            wqe: Self::wqe_bytes(striding, segs),
            striding,
            used: 0,
            pc: 0,
            ci: 0,
            zip: None,
        }
    }

    /// Bytes of a receive WQE (`MLX5_SEND_WQE_DS` for each of its `segs`
    /// data segments, a power of two of them; a striding RQ's WQE, of one
    /// segment, begins with the next-WQE segment, as DPDK's
    /// `mlx5_wqe_mprq`).
    pub(crate) fn wqe_bytes(striding: Option<StridingRq>, segs: usize) -> usize {
        match striding {
            Some(_) => NEXT_SEG + RX_WQE,
            None => RX_WQE * segs.max(1).next_power_of_two(),
        }
    }

    /// [`post_sges`](Self::post_sges) for a queue polled through verbs CQs
    /// (`polled.rs`): the ring free up to where the CQ's poll completed it
    /// (`t`'s receive tail), `wr_id` recorded for the completion.
    /// `QueueFull` when the ring is full, `Invalid` for more buffers than
    /// a WQE holds.
    pub(crate) fn post_tracked(
        &mut self,
        t: &crate::wq::WqTrack,
        sg: &[Sge],
        wr_id: u64,
    ) -> Result<()> {
        if sg.len() > self.wqe / RX_WQE {
            return Err(Error::Invalid("receive: more buffers than a WQE holds"));
        }
        self.ci = t.rq_tail.load(std::sync::atomic::Ordering::Acquire) as u16;
        let mask = (1u16 << self.log) - 1;
        let at = self.pc;
        if self.pc.wrapping_sub(self.ci) > mask {
            return Err(Error::QueueFull("receive queue"));
        }
        t.rq_wrid[usize::from(at & mask)].store(wr_id, std::sync::atomic::Ordering::Relaxed);
        if self.post_sges(sg) {
            Ok(())
        } else {
            Err(Error::QueueFull("receive queue"))
        }
    }

    /// Posts one receive WQE of the buffers `sg` (at most the WQE's data
    /// segments; fewer end with the terminating lkey, as libmlx5 ends a
    /// short scatter list) with its doorbell-record update; false when the
    /// ring is full or `sg` does not fit.
    pub(crate) fn post_sges(&mut self, sg: &[Sge]) -> bool {
        let cap = self.wqe / RX_WQE;
        if self.striding.is_some() || sg.len() > cap {
            return false;
        }
        if self.pc.wrapping_sub(self.ci) >= 1u16 << self.log {
            return false;
        }
        let mut wqe = vec![0u8; self.wqe];
        for (i, seg) in wqe.chunks_exact_mut(RX_WQE).enumerate() {
            match sg.get(i) {
                Some(s) => {
                    wqe_data_seg::BYTE_COUNT.set(seg, u64::from(s.length));
                    wqe_data_seg::LKEY.set(seg, u64::from(s.lkey));
                    wqe_data_seg::ADDR.set(seg, s.addr);
                }
                None => {
                    wqe_data_seg::LKEY.set(seg, u64::from(w::TERMINATE_SCATTER_LIST_LKEY));
                    break;
                }
            }
        }
        let mask = (1u16 << self.log) - 1;
        let _ = self
            .ring
            .write(usize::from(self.pc & mask) * self.wqe, &wqe);
        self.pc = self.pc.wrapping_add(1);
        dma_wmb();
        let _ = self.rec.store_u32_be(self.rec_off, u32::from(self.pc));
        true
    }

    /// Posts receive buffers (one per WQE, at most the ring's free room);
    /// one doorbell-record update. Returns how many were posted.
    pub(crate) fn post(&mut self, bufs: &[Sge]) -> usize {
        let room = (1u16 << self.log) - self.pc.wrapping_sub(self.ci);
        let n = bufs.len().min(usize::from(room));
        let mask = (1u16 << self.log) - 1;
        let mut seg = [0u8; RX_WQE];
        // A striding WQE's next-WQE segment stays zero (a cyclic ring).
        let at = self.wqe - RX_WQE;
        for s in &bufs[..n] {
            wqe_data_seg::BYTE_COUNT.set(&mut seg, u64::from(s.length));
            wqe_data_seg::LKEY.set(&mut seg, u64::from(s.lkey));
            wqe_data_seg::ADDR.set(&mut seg, s.addr);
            let _ = self
                .ring
                .write(usize::from(self.pc & mask) * self.wqe + at, &seg);
            self.pc = self.pc.wrapping_add(1);
        }
        if n > 0 {
            dma_wmb();
            let _ = self.rec.store_u32_be(self.rec_off, u32::from(self.pc));
        }
        n
    }

    /// Takes up to `out.len()` received packets from the receive CQ
    /// (expanding compressed sessions).
    pub(crate) fn burst(&mut self, cq: &mut Cq, out: &mut [RxPkt]) -> usize {
        let ring = cq.ring_mut();
        let mut n = 0;
        while n < out.len() {
            if self.zip.is_some() {
                if let Some(p) = self.unzip(ring) {
                    out[n] = p;
                    n += 1;
                }
                continue;
            }
            let Some(e) = ring.next_cqe() else {
                break;
            };
            if c::cqe_format(e.u8_at(cqe64::OP_OWN.off / 8)) == c::CQE_FORMAT_COMPRESSED {
                self.zip_start(ring);
                continue;
            }
            if let Some(p) = self.take(&e) {
                out[n] = p;
                n += 1;
            }
        }
        ring.update_ci();
        n
    }

    /// The CQE just taken from `ring` is a compressed session's title.
    fn zip_start(&mut self, ring: &crate::cq::CqRing) {
        let at = ring.ci().wrapping_sub(1);
        let title = ring.cqe_bytes(at);
        // A count of 0 (or beyond the ring) from a faulty device is taken
        // as the title alone / the ring's size: never a loop.
        let size = 1u32 << ring.log_size();
        let count = title.be32_at(cqe64::BYTE_CNT.off / 8).clamp(1, size);
        self.zip = Some(Zip {
            title,
            at,
            n: count,
            taken: 0,
            minis: ring.cqe_bytes(at.wrapping_add(1)),
            counter: title.be16_at(cqe64::WQE_COUNTER.off / 8),
        });
    }

    /// The next packet of the session being expanded; at its end its
    /// slots go back to the device.
    fn unzip(&mut self, ring: &mut crate::cq::CqRing) -> Option<RxPkt> {
        let z = self.zip.as_mut()?;
        let i = z.taken;
        if i > 0 && i % 8 == 0 {
            z.minis = ring.cqe_bytes(z.at.wrapping_add(i));
        }
        let m = &z.minis[(i as usize % 8) * 8..][..8];
        let mut e = z.title;
        e[cqe64::BYTE_CNT.off / 8..][..4].copy_from_slice(&m[4..8]);
        e[cqe64::WQE_COUNTER.off / 8..][..2].copy_from_slice(&z.counter.to_be_bytes());
        let hash = cqe64::RSS_HASH_RESULT.off / 8;
        match ring.compress {
            Some(crate::cq::CqeCompression::Hash) => e[hash..][..4].copy_from_slice(&m[..4]),
            _ => {
                e[hash..][..4].fill(0);
                e[cqe64::CHECK_SUM.off / 8..][..2].copy_from_slice(&m[..2]);
            }
        }
        let bc = u32::from_be_bytes([m[4], m[5], m[6], m[7]]);
        z.counter = z.counter.wrapping_add(match self.striding {
            Some(_) => (bc >> MPWRQ_CQE_STRIDES_SHIFT & 0x7fff) as u16,
            None => 1,
        });
        z.taken += 1;
        if z.taken >= z.n {
            let (at, n) = (z.at, z.n);
            self.zip = None;
            ring.retire_session(at, n);
        }
        self.take(&e)
    }

    /// The packet CQE `e` completes (`None`: a striding RQ's filler), the
    /// buffers it used retired.
    fn take(&mut self, e: &impl CqeFields) -> Option<RxPkt> {
        let mask = (1u16 << self.log) - 1;
        let op = c::cqe_opcode(e.u8_at(cqe64::OP_OWN.off / 8));
        let counter = e.be16_at(cqe64::WQE_COUNTER.off / 8);
        if let (Some(st), CqeOpcode::RespSend) = (self.striding, op) {
            // A striding RQ's CQE: the WQE in `wqe_id`, the frame's
            // first stride in `wqe_counter`; `byte_cnt`: filler, strides
            // consumed, the frame's bytes.
            let slot = e.be16_at(cqe64::WQE_ID.off / 8) & mask;
            let bc = e.be32_at(cqe64::BYTE_CNT.off / 8);
            self.used += bc >> MPWRQ_CQE_STRIDES_SHIFT & 0x7fff;
            if self.used >= 1 << st.log_num_strides {
                self.used = 0;
                self.ci = self.ci.wrapping_add(1);
            }
            if bc & MPWRQ_CQE_FILLER != 0 {
                return None;
            }
            let mut p = rx_pkt(e, slot);
            p.len = bc & 0xffff;
            p.offset = u32::from(counter) << st.log_stride_size;
            return Some(p);
        }
        let slot = counter & mask;
        self.ci = self.ci.wrapping_add(1);
        Some(if op == CqeOpcode::RespSend {
            rx_pkt(e, slot)
        } else {
            let s = e.u8_at(err_cqe::SYNDROME.off / 8);
            RxPkt {
                slot,
                error: Some(WcStatus::from_syndrome(CqeSyndrome::from_raw(s))),
                ..RxPkt::default()
            }
        })
    }
}

/// CREATE_RQ (cyclic over `rx`'s ring, on CQ `cqn`, counted at `dbr`;
/// `vsd` set unless it strips VLAN tags, as mlx5_ib does) and MODIFY_RQ
/// RST->RDY: the RQ's number.
#[allow(clippy::too_many_arguments)]
pub(crate) fn create_ready_rq(
    ctx: &Ctx,
    pdn: u32,
    cqn: u32,
    strip_vlan: bool,
    rx: &RxRing,
    dbr: vfio::Iova,
    user_index: u32,
) -> Result<u32> {
    let hca = &ctx.hca;
    let mut i = cmd(Opcode::CreateRq, create_rq_in::SIZE_BYTES + 8);
    let at = create_rq_in::CTX.off;
    rqc::CQN.at(at).set(&mut i, u64::from(cqn));
    rqc::USER_INDEX.at(at).set(&mut i, u64::from(user_index));
    rqc::VSD.at(at).set(&mut i, u64::from(!strip_vlan));
    set_wq(&mut i, at + rqc::WQ.off, pdn, &rx.ring, rx.log, rx.wqe);
    wq::DBR_ADDR.at(at + rqc::WQ.off).set(&mut i, dbr.0);
    if let Some(st) = rx.striding {
        use mlx5_hw::eth::{
            MPWQE_LOG_NUM_STRIDES_BASE as BASE, MPWQE_LOG_NUM_STRIDES_EXT_BASE as EXT,
            MPWQE_LOG_STRIDE_SZ_BASE as SZ, WQ_TYPE_CYCLIC_STRIDING_RQ,
        };
        let w = at + rqc::WQ.off;
        wq::WQ_TYPE.at(w).set(&mut i, WQ_TYPE_CYCLIC_STRIDING_RQ);
        // 2^(9 + v) for v in 0..=9, 2^(v - 7) for v in 10..=15.
        let v = match st.log_num_strides {
            n if n >= BASE => n - BASE,
            n => n - EXT + 10,
        };
        wq::LOG_WQE_NUM_OF_STRIDES.at(w).set(&mut i, u64::from(v));
        wq::LOG_WQE_STRIDE_SIZE
            .at(w)
            .set(&mut i, u64::from(st.log_stride_size - SZ));
    }
    let out = hca.cmd().exec(&i, create_rq_out::SIZE_BYTES)?;
    let rqn = create_rq_out::RQN.get(&out) as u32;
    let mut i = cmd(Opcode::ModifyRq, modify_rq_in::SIZE_BYTES);
    modify_rq_in::RQ_STATE.set(&mut i, QUEUE_STATE_RST);
    modify_rq_in::RQN.set(&mut i, u64::from(rqn));
    rqc::STATE
        .at(modify_rq_in::CTX.off)
        .set(&mut i, QUEUE_STATE_RDY);
    if let Err(e) = hca.cmd().exec(&i, MODIFY_OUT) {
        let (f, len) = (destroy_rq_in::RQN, destroy_rq_in::SIZE_BYTES);
        if let Err(d) = destroy_obj(ctx, Opcode::DestroyRq, f, len, &mut rqn.clone()) {
            tracing::warn!(rqn, error = %d, "DESTROY_RQ after a failed MODIFY_RQ");
        }
        return Err(e);
    }
    Ok(rqn)
}

/// ALLOC_TRANSPORT_DOMAIN: the TD a TIS or TIR is made in.
pub(crate) fn alloc_transport_domain(ctx: &Ctx) -> Result<u32> {
    let i = cmd(
        Opcode::AllocTransportDomain,
        mlx5_hw::ifc::alloc_transport_domain_in::SIZE_BYTES,
    );
    let o = ctx
        .hca
        .cmd()
        .exec(&i, alloc_transport_domain_out::SIZE_BYTES)?;
    Ok(alloc_transport_domain_out::TRANSPORT_DOMAIN.get(&o) as u32)
}

/// DESTROY_* (or DEALLOC_*) of object `*n` (its number at `field`) unless
/// it is 0 (none, or destroyed already); `*n` is 0 afterwards either way.
pub(crate) fn destroy_obj(
    ctx: &Ctx,
    op: Opcode,
    field: mlx5_hw::bits::BitField,
    len: usize,
    n: &mut u32,
) -> Result<()> {
    if *n == 0 {
        return Ok(());
    }
    let mut i = cmd(op, len);
    field.set(&mut i, u64::from(std::mem::take(n)));
    ctx.hca.cmd().exec(&i, DESTROY_OUT).map(|_| ())
}

impl Drop for RawPacketQp {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!(error = %e, "raw packet QP teardown");
        }
        // The queues are gone: their CQEs left in the CQs go too.
        if let Some(p) = self.polled.take() {
            p.detach(&self.ctx);
        }
        // The last reference, so that the pool deallocates the page.
        if let Some(u) = self.uar.take() {
            self.ctx.release_uar(u);
        }
    }
}

/// The packet a receive CQE describes.
fn rx_pkt(e: &impl CqeFields, slot: u16) -> RxPkt {
    let types = e.u8_at(cqe64::L4_L3_HDR_TYPE.off / 8);
    let ok = e.u8_at(cqe64::HDS_IP_EXT.off / 8);
    let l3 = (types >> CQE_L3_HDR_TYPE_SHIFT) & 0x3;
    let l4 = (types >> CQE_L4_HDR_TYPE_SHIFT) & 0x7;
    RxPkt {
        len: e.be32_at(cqe64::BYTE_CNT.off / 8),
        slot,
        offset: 0,
        tunneled: e.u8_at(cqe64::TLS_OUTER_L3_TUNNELED.off / 8) & CQE_RX_TUNNEL_PACKET != 0,
        ipv4: l3 == CQE_L3_HDR_TYPE_IPV4,
        ipv6: l3 == CQE_L3_HDR_TYPE_IPV6,
        udp: l4 == CQE_L4_HDR_TYPE_UDP,
        l3_ok: ok & CQE_L3_OK != 0,
        l4_ok: ok & CQE_L4_OK != 0,
        rss_hash: e.be32_at(cqe64::RSS_HASH_RESULT.off / 8),
        flow_tag: e.be32_at(cqe64::SOP_DROP_QPN.off / 8) & c::CQE_QPN_MASK,
        vlan: (types & CQE_VLAN_PRESENT != 0).then(|| e.be16_at(cqe64::VLAN_INFO.off / 8)),
        error: None,
        timestamp: u64::from(e.be32_at(cqe64::TIMESTAMP_H.off / 8)) << 32
            | u64::from(e.be32_at(cqe64::TIMESTAMP_L.off / 8)),
    }
}
