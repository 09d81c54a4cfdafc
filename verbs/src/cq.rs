//! Completion queues: CREATE_CQ / DESTROY_CQ and polling
//! (`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`).
//!
//! A CQ is a power-of-two ring of 64-byte CQEs in DMA memory plus an
//! 8-byte doorbell record (consumer index, last arm command). Software
//! starts every CQE with opcode INVALID; the device writes entry `ci` with
//! owner bit `(ci >> log_size) & 1`. Polling ([`CqRing`]) reads the
//! `op_own` byte, then `dma_rmb` (the read barrier the PRM asks for
//! between the owner bit and the rest), copies the entry, and advances;
//! the consumer index goes to the doorbell record once per poll call.
//! Arming (PRM "CQ Doorbell") writes the arm word to the record, then the
//! 64-bit `[arm word, cqn]` to UAR +0x20.
//!
//! Work-completion status and opcode use libibverbs' numbering
//! ([`WcStatus`], [`WcOpcode`]); the vendor syndrome of an error CQE is
//! kept in [`Wc::vendor_err`].
//!
//! Thread safety: a [`Cq`] is `Send + Sync`; polling and arming take
//! `&mut self` (no lock on the fast path). Several threads poll one CQ
//! through [`Cq::into_shared`] ([`crate::shared::SharedCq`]).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use mlx5_hw::cqe::{self as c, CqeOpcode, CqeSyndrome};
use mlx5_hw::ifc::{cqe64, err_cqe, CreateCqIn, CreateCqOut, DestroyCqIn};
use mlx5_hw::ifc::{create_cq_in, create_cq_out, destroy_cq_in, destroy_cq_out};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::uar::{self as u, CQ_DOORBELL};
use mlx5_hw::wqe::WqeOpcode;
use vfio::dma_ring::DmaEntry;
use vfio::{DmaBuffer, DmaRing, Mmio};

use crate::buf::DmaSlice;
use crate::channel::CompChannel;
use crate::dbrec::Dbrec;
use crate::device::{Context, Ctx};
use crate::qp::WqTrack;
use crate::uar::Uar;
use crate::{Error, Result};

mod clean;
mod resize;

/// `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS.
    #[default]
    Success = 0,
    /// IBV_WC_LOC_LEN_ERR.
    LocLenErr = 1,
    /// IBV_WC_LOC_QP_OP_ERR.
    LocQpOpErr = 2,
    /// IBV_WC_LOC_PROT_ERR.
    LocProtErr = 4,
    /// IBV_WC_WR_FLUSH_ERR.
    WrFlushErr = 5,
    /// IBV_WC_MW_BIND_ERR.
    MwBindErr = 6,
    /// IBV_WC_BAD_RESP_ERR.
    BadRespErr = 7,
    /// IBV_WC_LOC_ACCESS_ERR.
    LocAccessErr = 8,
    /// IBV_WC_REM_INV_REQ_ERR.
    RemInvReqErr = 9,
    /// IBV_WC_REM_ACCESS_ERR.
    RemAccessErr = 10,
    /// IBV_WC_REM_OP_ERR.
    RemOpErr = 11,
    /// IBV_WC_RETRY_EXC_ERR.
    RetryExcErr = 12,
    /// IBV_WC_RNR_RETRY_EXC_ERR.
    RnrRetryExcErr = 13,
    /// IBV_WC_REM_ABORT_ERR.
    RemAbortErr = 16,
    /// IBV_WC_GENERAL_ERR.
    GeneralErr = 21,
}

impl WcStatus {
    /// The verbs status of an error CQE's syndrome, as rdma-core's mlx5
    /// provider maps it.
    pub fn from_syndrome(s: CqeSyndrome) -> Self {
        match s {
            CqeSyndrome::LocalLengthErr => Self::LocLenErr,
            CqeSyndrome::LocalQpOpErr => Self::LocQpOpErr,
            CqeSyndrome::LocalProtErr => Self::LocProtErr,
            CqeSyndrome::WrFlushErr => Self::WrFlushErr,
            CqeSyndrome::MwBindErr => Self::MwBindErr,
            CqeSyndrome::BadRespErr => Self::BadRespErr,
            CqeSyndrome::LocalAccessErr => Self::LocAccessErr,
            CqeSyndrome::RemoteInvalReqErr => Self::RemInvReqErr,
            CqeSyndrome::RemoteAccessErr => Self::RemAccessErr,
            CqeSyndrome::RemoteOpErr => Self::RemOpErr,
            CqeSyndrome::TransportRetryExcErr => Self::RetryExcErr,
            CqeSyndrome::RnrRetryExcErr => Self::RnrRetryExcErr,
            CqeSyndrome::RemoteAbortedErr => Self::RemAbortErr,
            CqeSyndrome::Unknown(_) => Self::GeneralErr,
        }
    }
}

/// `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum WcOpcode {
    /// IBV_WC_SEND.
    #[default]
    Send = 0,
    /// IBV_WC_RDMA_WRITE.
    RdmaWrite = 1,
    /// IBV_WC_RDMA_READ.
    RdmaRead = 2,
    /// IBV_WC_COMP_SWAP.
    CompSwap = 3,
    /// IBV_WC_FETCH_ADD.
    FetchAdd = 4,
    /// IBV_WC_BIND_MW.
    BindMw = 5,
    /// IBV_WC_LOCAL_INV.
    LocalInv = 6,
    /// IBV_WC_RECV.
    Recv = 128,
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    RecvRdmaWithImm = 129,
    /// IBV_WC_DRIVER1, mlx5dv's `MLX5DV_WC_UMR`: a UMR posted by
    /// [`Qp::post_umr`](crate::qp::Qp::post_umr).
    Umr = 135,
}

impl WcOpcode {
    /// The opcode a UMR WQE's slot recorded (`SendRing::set_wc_opcode`).
    fn from_umr_slot(op: u8) -> Self {
        match op {
            o if o == Self::BindMw as u8 => Self::BindMw,
            o if o == Self::LocalInv as u8 => Self::LocalInv,
            _ => Self::Umr,
        }
    }
}

/// `IBV_WC_*` flags of [`Wc::wc_flags`].
pub mod wc_flags {
    /// IBV_WC_GRH: a GRH is in the first 40 bytes of the receive buffer (UD).
    pub const GRH: u32 = 1;
    /// IBV_WC_WITH_IMM: `imm_data` is valid.
    pub const WITH_IMM: u32 = 2;
    /// IBV_WC_IP_CSUM_OK: a raw packet QP's frame whose IPv4 header and
    /// TCP/UDP checksums the device found good.
    pub const IP_CSUM_OK: u32 = 4;
    /// IBV_WC_WITH_INV: a SEND with Invalidate; `imm_data` holds the
    /// invalidated rkey (`ibv_wc`'s `invalidated_rkey`, same union).
    pub const WITH_INV: u32 = 8;
}

/// A work completion: `struct ibv_wc`, field for field and byte for byte
/// (`#[repr(C)]`, as `infiniband/verbs.h` lays it out), so that a poll
/// writes completions straight into a C caller's `ibv_wc` array
/// ([`WcSlot`]; the C library's `ibv_poll_cq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (valid for successful completions, as in verbs).
    pub opcode: WcOpcode,
    /// The CQE's vendor syndrome (error CQEs), and its syndrome in bits 15:8.
    pub vendor_err: u32,
    /// Bytes received (responder), or read/atomic result length.
    pub byte_len: u32,
    /// With [`wc_flags::WITH_IMM`] the immediate data in network order,
    /// as verbs keeps it ([`Wc::imm`] gives it in host order); with
    /// [`wc_flags::WITH_INV`] the invalidated rkey, host order (verbs'
    /// union of `imm_data` and `invalidated_rkey`).
    pub imm_data: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The source QP (UD receives).
    pub src_qp: u32,
    /// `IBV_WC_*` flags.
    pub wc_flags: u32,
    /// P_Key index (InfiniBand GSI receives; 0 on RoCE, as mlx5 reports).
    pub pkey_index: u16,
    /// Source LID (InfiniBand; 0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits (InfiniBand; 0 on RoCE).
    pub dlid_path_bits: u8,
}

impl Wc {
    /// The immediate data in host order, if the completion carries one.
    pub fn imm(&self) -> Option<u32> {
        (self.wc_flags & wc_flags::WITH_IMM != 0).then(|| u32::from_be(self.imm_data))
    }

    /// The rkey a SEND with Invalidate invalidated, if this is one.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        (self.wc_flags & wc_flags::WITH_INV != 0).then_some(self.imm_data)
    }
}

/// Where a poll puts a completion: a [`Wc`] the caller holds, or memory
/// laid out as one that need not be initialised (`MaybeUninit<Wc>`: the
/// C library polls into the caller's `ibv_wc` array as these, with no
/// copy in between).
pub trait WcSlot {
    /// Stores `wc`, the completion decoded from the CQE `e`.
    fn put(&mut self, wc: Wc, e: &impl CqeFields);
}

impl WcSlot for Wc {
    #[inline(always)]
    fn put(&mut self, wc: Wc, _: &impl CqeFields) {
        *self = wc;
    }
}

impl WcSlot for MaybeUninit<Wc> {
    #[inline(always)]
    fn put(&mut self, wc: Wc, _: &impl CqeFields) {
        // An assignment, not `write`: stored field by field, as into a
        // `Wc`, where `write` built the value aside and copied it.
        *self = MaybeUninit::new(wc);
    }
}

/// A completion and its CQE's timestamp (the device clock when the CQE
/// was written, in cycles of `device_frequency_khz`: what libmlx5's
/// `ibv_wc_read_completion_ts` reads; [`crate::clock::ClockInfo::to_ns`]
/// makes it wall time). Polled by [`Cq::poll_stamped`].
#[derive(Debug, Clone, Copy, Default)]
pub struct WcStamped {
    /// The completion.
    pub wc: Wc,
    /// The CQE's `timestamp_h:timestamp_l`.
    pub timestamp: u64,
}

impl WcSlot for WcStamped {
    #[inline(always)]
    fn put(&mut self, wc: Wc, e: &impl CqeFields) {
        self.wc = wc;
        self.timestamp = e.timestamp();
    }
}

/// `CQ_DB_REQ_NOT`: next completion; `CQ_DB_REQ_NOT_SOL`: next solicited.
pub use mlx5_hw::uar::{CQ_DB_REQ_NOT, CQ_DB_REQ_NOT_SOL};

const OP_OWN: usize = c::CQE_OP_OWN_OFFSET;
const BYTE_CNT: usize = cqe64::BYTE_CNT.off / 8;
const IMM: usize = cqe64::IMMEDIATE.off / 8;
const FLAGS_RQPN: usize = cqe64::FLAGS_RQPN.off / 8;
const SOP_QPN: usize = cqe64::SOP_DROP_QPN.off / 8;
const WQE_COUNTER: usize = cqe64::WQE_COUNTER.off / 8;
const SIGNATURE: usize = cqe64::SIGNATURE.off / 8;
const TIMESTAMP_H: usize = cqe64::TIMESTAMP_H.off / 8;
const TIMESTAMP_L: usize = cqe64::TIMESTAMP_L.off / 8;
const SRQN: usize = cqe64::SRQN.off / 8;
const SYNDROME: usize = err_cqe::SYNDROME.off / 8;
const VENDOR_SYND: usize = err_cqe::VENDOR_ERR_SYND.off / 8;

/// Where a CQE's fields are read from: a CQE still in ring memory, loaded
/// field by field so a completion reads only what its opcode needs
/// ([`RingCqe`]), or a copied one (`[u8; 64]`).
pub trait CqeFields {
    /// The byte at `off`.
    fn u8_at(&self, off: usize) -> u8;
    /// The big-endian u16 at `off`.
    fn be16_at(&self, off: usize) -> u16;
    /// The big-endian u32 at `off`.
    fn be32_at(&self, off: usize) -> u32;
    /// The CQE's last 8 bytes as a big-endian u64: `sop_drop_qpn` (bits
    /// 63:32), `wqe_counter` (31:16), `signature` and `op_own` (7:0), what
    /// every completion needs, in one load where the CQE is in memory.
    #[inline(always)]
    fn tail(&self) -> u64 {
        (u64::from(self.be32_at(SOP_QPN)) << 32)
            | (u64::from(self.be16_at(WQE_COUNTER)) << 16)
            | (u64::from(self.u8_at(SIGNATURE)) << 8)
            | u64::from(self.u8_at(OP_OWN))
    }
    /// The device clock when the CQE was written (`timestamp_h`,
    /// `timestamp_l`).
    #[inline(always)]
    fn timestamp(&self) -> u64 {
        (u64::from(self.be32_at(TIMESTAMP_H)) << 32) | u64::from(self.be32_at(TIMESTAMP_L))
    }
    /// The bytes the CQE carries in place of its buffer (scatter to CQE):
    /// how many, or `None`. A copied CQE has only its own 64 bytes, so
    /// only format 1 (32 bytes in the CQE).
    fn inline_data(&self, out: &mut [u8; 64]) -> Option<usize> {
        let format = (self.u8_at(OP_OWN) >> c::CQE_FORMAT_SHIFT) & c::CQE_FORMAT_MASK;
        if format != c::CQE_FORMAT_INLINE_DATA32_SEG {
            return None;
        }
        for (i, b) in out[..32].iter_mut().enumerate() {
            *b = self.u8_at(i);
        }
        Some((self.be32_at(BYTE_CNT) as usize).min(32))
    }
}

// The tail word's layout.
const _: () = assert!(SOP_QPN == 56 && WQE_COUNTER == 60 && SIGNATURE == 62 && OP_OWN == 63);

impl CqeFields for [u8; 64] {
    #[inline(always)]
    fn u8_at(&self, off: usize) -> u8 {
        self[off]
    }
    #[inline(always)]
    fn be16_at(&self, off: usize) -> u16 {
        u16::from_be_bytes([self[off], self[off + 1]])
    }
    #[inline(always)]
    fn be32_at(&self, off: usize) -> u32 {
        u32::from_be_bytes([self[off], self[off + 1], self[off + 2], self[off + 3]])
    }
}

/// A software-owned CQE in the ring (its owner byte was read with acquire
/// ordering, so its other fields are the device's), valid until the
/// consumer index is published.
#[derive(Debug, Clone, Copy)]
pub struct RingCqe<'a>(DmaEntry<'a, { c::CQE_SIZE }>, DmaEntry<'a, { c::CQE_SIZE }>);

impl<'a> RingCqe<'a> {
    /// The CQE at ring entry `idx` ([`CqRing::cqe_index`]); for 128-byte
    /// CQEs (`shift` 1) its first half is the entry before.
    #[inline(always)]
    fn at(ring: &'a DmaRing<{ c::CQE_SIZE }>, idx: u32, shift: u8) -> Self {
        RingCqe(
            ring.entry(idx),
            ring.entry(idx.wrapping_sub(u32::from(shift))),
        )
    }

    /// The bytes the CQE carries in place of its buffer (scatter to CQE)
    /// into `out`: how many, or `None` when it carries none.
    #[inline]
    pub fn inline_data(&self, out: &mut [u8; 64]) -> Option<usize> {
        let op_own = self.u8_at(OP_OWN);
        let format = (op_own >> c::CQE_FORMAT_SHIFT) & c::CQE_FORMAT_MASK;
        crate::scatter_cqe::inline_bytes(
            format,
            self.be32_at(BYTE_CNT),
            || self.0.load_words::<8>(0).unwrap_or([0; 8]),
            || self.1.load_words::<8>(0).unwrap_or([0; 8]),
            out,
        )
    }
}

impl CqeFields for RingCqe<'_> {
    // The CQE lies inside the ring (checked when the ring was made) and the
    // fields inside the CQE (constant offsets), so the loads do not fail; a
    // zero would be read if one did.
    #[inline(always)]
    fn u8_at(&self, off: usize) -> u8 {
        self.0.load_u8(off).unwrap_or(0)
    }
    #[inline(always)]
    fn be16_at(&self, off: usize) -> u16 {
        self.0.load_u16_be(off).unwrap_or(0)
    }
    #[inline(always)]
    fn be32_at(&self, off: usize) -> u32 {
        self.0.load_u32_be(off).unwrap_or(0)
    }
    #[inline(always)]
    fn tail(&self) -> u64 {
        self.0.load_u64_be(SOP_QPN).unwrap_or(0)
    }
    fn inline_data(&self, out: &mut [u8; 64]) -> Option<usize> {
        RingCqe::inline_data(self, out)
    }
}

/// The polling side of a CQ: ring memory, consumer index, doorbell record
/// and the UAR for arming. Usable on its own (driver-alone benchmarks).
#[derive(Debug)]
pub struct CqRing {
    /// CQE compression asked at creation ([`CqeCompression`]).
    pub(crate) compress: Option<CqeCompression>,
    ring: DmaRing<{ c::CQE_SIZE }>,
    log_size: u8,
    ci: u32,
    /// `set_ci` (+0) and `arm` (+4).
    dbrec: DmaRing<8>,
    /// 1 for 128-byte CQEs (two ring entries each, the CQE the second),
    /// else 0.
    shift: u8,
    cqn: u32,
    uar: Arc<Mmio>,
    uar_off: usize,
}

impl CqRing {
    /// A ring of `2^log_size` CQEs at offset 0 of `buf`, its doorbell record
    /// at `dbrec_off` of `dbrec`, arming through the UAR page at `uar_off`
    /// of `uar`. Every CQE is set to INVALID (software's initial value).
    pub fn new(
        buf: Arc<DmaBuffer>,
        log_size: u8,
        dbrec: Arc<DmaBuffer>,
        dbrec_off: usize,
        cqn: u32,
        uar: Arc<Mmio>,
        uar_off: usize,
    ) -> Result<Self> {
        let n = 1usize << log_size;
        if n * c::CQE_SIZE > buf.len() {
            return Err(Error::Invalid("CQ ring larger than its buffer"));
        }
        for i in 0..n {
            buf.write(
                i * c::CQE_SIZE + OP_OWN,
                &[CqeOpcode::Invalid.to_raw() << c::CQE_OPCODE_SHIFT],
            )?;
        }
        dbrec.write(dbrec_off, &[0; 8])?;
        Ok(Self::from_rings(
            DmaRing::new(buf, 0, n as u32)?,
            DmaRing::new(dbrec, dbrec_off, 1)?,
            cqn,
            uar,
            uar_off,
        ))
    }

    /// A ring over CQEs and a doorbell record already initialized (every
    /// CQE INVALID, the record zero).
    pub(crate) fn from_rings(
        ring: DmaRing<{ c::CQE_SIZE }>,
        dbrec: DmaRing<8>,
        cqn: u32,
        uar: Arc<Mmio>,
        uar_off: usize,
    ) -> Self {
        Self {
            compress: None,
            log_size: ring.entries().trailing_zeros() as u8,
            ring,
            shift: 0,
            ci: 0,
            dbrec,
            cqn,
            uar,
            uar_off,
        }
    }

    /// The ring holds 128-byte CQEs: two 64-byte entries each, the CQE in
    /// the second.
    pub(crate) fn set_cqe_128(&mut self) {
        if self.shift == 0 {
            self.shift = 1;
            self.log_size -= 1;
        }
    }

    /// The consumer index.
    pub fn ci(&self) -> u32 {
        self.ci
    }

    /// log2 of the CQEs the ring holds.
    pub(crate) fn log_size(&self) -> u8 {
        self.log_size
    }

    /// What a poller that does not hold this ring may read to tell it
    /// empty ([`CqProbe`]); `cmd` tells a failed device.
    fn probe(&self, cmd: &crate::cmd::Cmd) -> CqProbe {
        CqProbe {
            ring: self.ring.clone(),
            log_size: self.log_size,
            shift: self.shift,
            failed: cmd.clone(),
        }
    }

    /// The ring entry of CQE `i` (a 128-byte CQE is its second entry).
    #[inline(always)]
    fn cqe_index(&self, i: u32) -> u32 {
        (i << self.shift) | u32::from(self.shift)
    }

    /// Whether CQE `i` is software's (its owner bit, read with acquire
    /// ordering).
    #[inline(always)]
    fn sw_owned(&self, i: u32) -> bool {
        let e = self.ring.entry(self.cqe_index(i));
        e.load_u8_acquire(OP_OWN)
            .is_ok_and(|o| c::cqe_is_sw_owned(o, i, self.log_size))
    }

    /// Whether the next CQE is software-owned ([`next_cqe`](Self::next_cqe)
    /// would return it), without reading it.
    #[inline(always)]
    pub fn has_cqe(&self) -> bool {
        self.sw_owned(self.ci)
    }

    /// CQE `k` after the consumer index and its last 8 bytes
    /// ([`CqeFields::tail`]) if software owns it: the 8 bytes in one
    /// acquire load, the owner byte among them (the device writes it after
    /// the rest), then the read barrier before any other field.
    #[inline(always)]
    pub fn owned_at(&self, k: u32) -> Option<(RingCqe<'_>, u64)> {
        let i = self.ci.wrapping_add(k);
        let e = self.owned_cqe(k);
        let tail = e.0.load_u64_be_acquire(SOP_QPN).ok()?;
        if !c::cqe_is_sw_owned(tail as u8, i, self.log_size) {
            return None;
        }
        // The rest of a CQE is read only after its owner bit, also as
        // the device sees memory (Linux's `dma_rmb()` in mlx5_ib's
        // `get_sw_cqe` callers; rdma-core's `udma_from_device_barrier`):
        // a compiler barrier on x86-64, `dmb oshld` on arm64, where the
        // acquire load alone orders only the inner shareable domain.
        vfio::mmio::dma_rmb();
        Some((e, tail))
    }

    /// CQE `k` after the consumer index, in place, owned or not (the
    /// caller knows: [`owned_at`](Self::owned_at)).
    #[inline(always)]
    pub fn owned_cqe(&self, k: u32) -> RingCqe<'_> {
        let idx = self.cqe_index(self.ci.wrapping_add(k));
        RingCqe::at(&self.ring, idx, self.shift)
    }

    /// Moves the consumer index past `k` CQEs software owned (the device
    /// learns it at [`update_ci`](Self::update_ci)).
    #[inline(always)]
    pub fn consume(&mut self, k: u32) {
        self.ci = self.ci.wrapping_add(k);
    }

    /// The next software-owned CQE in place, advancing past it, or `None`.
    /// Its fields stay valid until [`update_ci`](Self::update_ci).
    #[inline(always)]
    pub fn next_cqe(&mut self) -> Option<RingCqe<'_>> {
        let ci = self.ci;
        if !self.sw_owned(ci) {
            return None;
        }
        // The rest of the CQE is read only after its owner bit, also as
        // the device sees memory (Linux's `dma_rmb()` in mlx5_ib's
        // `get_sw_cqe` callers; rdma-core's `udma_from_device_barrier`):
        // a compiler barrier on x86-64, `dmb oshld` on arm64, where the
        // acquire load alone orders only the inner shareable domain.
        vfio::mmio::dma_rmb();
        self.ci = ci.wrapping_add(1);
        Some(RingCqe::at(&self.ring, self.cqe_index(ci), self.shift))
    }

    /// The 64 bytes of CQE `ci` as they lie, owner bit or not (a slot of
    /// a compressed session: [`crate::raw_eth`]).
    pub(crate) fn cqe_bytes(&self, ci: u32) -> [u8; 64] {
        let idx = (ci << self.shift) | u32::from(self.shift);
        let words: [u64; 8] = self.ring.load_words(idx, 0).unwrap_or([0; 8]);
        let mut out = [0u8; 64];
        for (o, w) in out.chunks_exact_mut(8).zip(words) {
            o.copy_from_slice(&w.to_ne_bytes());
        }
        out
    }

    /// A compressed session of `n` CQEs whose title is CQE `from` was read:
    /// its slots are marked INVALID (the device rewrites only some of
    /// them, and an old one must not pass for a new CQE on a later pass:
    /// mlx5e's `mlx5e_cqes_update_owner`, DPDK's `MLX5_CQE_INVALIDATE`) and
    /// the consumer index moves past it.
    pub(crate) fn retire_session(&mut self, from: u32, n: u32) {
        for i in 0..n {
            let idx = (from.wrapping_add(i) << self.shift) | u32::from(self.shift);
            let e = self.ring.entry(idx);
            if let Ok([mut w]) = e.load_words::<1>(OP_OWN & !7) {
                let mut b = w.to_ne_bytes();
                b[OP_OWN & 7] = CqeOpcode::Invalid.to_raw() << c::CQE_OPCODE_SHIFT;
                w = u64::from_ne_bytes(b);
                let _ = e.store_words(OP_OWN & !7, &[w]);
            }
        }
        self.ci = from.wrapping_add(n);
    }

    /// Tells the device how far software got (doorbell record `set_ci`).
    #[inline(always)]
    pub fn update_ci(&self) {
        // Release: the CQEs were read before the index frees them for
        // reuse (a compiler barrier on x86-64).
        vfio::mmio::dma_wmb();
        self.dbrec.store_u32_be_at::<0>(0, self.ci & u::DB_CI_MASK);
    }

    /// Polls CQEs of the one QP `t` tracks into `wc` (driver-alone use:
    /// no QP lookup); updates the doorbell record once.
    #[inline(always)]
    pub fn poll_one_qp<S: WcSlot>(&mut self, t: &WqTrack, wc: &mut [S]) -> usize {
        let mut n = 0;
        while n < wc.len() {
            let Some(e) = self.next_cqe() else {
                break;
            };
            cqe_to_wc(&e, t, &mut wc[n]);
            n += 1;
        }
        if n > 0 {
            self.update_ci();
        }
        n
    }

    /// Arms the CQ for the next (or next solicited) completion.
    pub fn arm(&self, sn: u32, cmd: u32) -> Result<()> {
        let word = u::cq_arm_word(sn, cmd, self.ci);
        self.dbrec.store_u32_be(0, 4 * u::CQ_ARM_DB, word)?;
        // The record is written before the doorbell (PRM "CQ Doorbell").
        vfio::mmio::wmb();
        let v = u::cq_doorbell(sn, cmd, self.ci, self.cqn);
        self.uar
            .write64_raw(self.uar_off + CQ_DOORBELL, v.to_be_bytes())?;
        Ok(())
    }
}

/// Decodes a CQE of the QP `t` tracks into `wc` (the wr_id looked up,
/// queue space freed), reading only the fields its opcode has: a requester
/// completion needs the CQE's last 8 bytes alone.
#[inline(always)]
pub fn cqe_to_wc(e: &impl CqeFields, t: &WqTrack, wc: &mut impl WcSlot) {
    cqe_to_wc_as::<true>(e, e.tail(), t, wc)
}

/// [`cqe_to_wc`] of the CQE whose last 8 bytes (`CqeFields::tail`) the
/// caller read; with `COPY` false a receive whose data came in the CQE
/// leaves the receive buffer alone (the caller takes the bytes from the
/// CQE: [`Cq::poll_inline`]).
#[inline(always)]
fn cqe_to_wc_as<const COPY: bool>(
    e: &impl CqeFields,
    tail: u64,
    t: &WqTrack,
    wc: &mut impl WcSlot,
) {
    let op_own = tail as u8;
    let sop_qpn = (tail >> 32) as u32;
    let wqe_counter = (tail >> 16) as u16;
    let qpn = sop_qpn & c::CQE_QPN_MASK;
    // Tested on the raw opcode, most frequent first: a successful
    // requester completion is one compare, a receive a range test.
    let opc = op_own >> c::CQE_OPCODE_SHIFT;
    if opc == CqeOpcode::Req.to_raw() {
        let s_op = (sop_qpn >> c::CQE_S_WQE_OPCODE_SHIFT) as u8;
        let (opcode, byte_len) = if s_op == WqeOpcode::Umr.to_raw() {
            // What the posting recorded, as libmlx5's `handle_good_req`.
            (WcOpcode::from_umr_slot(t.sq_wc_op(wqe_counter)), 0)
        } else {
            let r = req_opcode(e, s_op);
            if op_own & (c::CQE_FORMAT_MASK << c::CQE_FORMAT_SHIFT) != 0 {
                return scattered_req::<COPY>(e, t, r, qpn, wqe_counter, wc);
            }
            r
        };
        wc.put(
            Wc {
                wr_id: t.sq_complete(wqe_counter),
                opcode,
                byte_len,
                qp_num: qpn,
                ..Wc::default()
            },
            e,
        );
    } else if opc.wrapping_sub(RESP_FIRST) <= RESP_LAST - RESP_FIRST {
        if op_own & (c::CQE_FORMAT_MASK << c::CQE_FORMAT_SHIFT) != 0 {
            return scattered_recv::<COPY>(e, t, op_own, qpn, wqe_counter, wc);
        }
        wc.put(recv_wc(e, opc, qpn, t.rq_complete(wqe_counter)), e);
    } else {
        error_cqe_to_wc(e, t, c::cqe_opcode(op_own), qpn, wqe_counter, wc);
    }
}

/// The work completion of a receive CQE (opcode `opc`, format 0) of QP
/// `qpn` whose WR was `wr_id`.
#[inline(always)]
fn recv_wc(e: &impl CqeFields, opc: u8, qpn: u32, wr_id: u64) -> Wc {
    let fr = e.be32_at(FLAGS_RQPN);
    let imm = opc == CqeOpcode::RespWrImm.to_raw() || opc == CqeOpcode::RespSendImm.to_raw();
    // RESP_SEND_INV: the immediate field carries the invalidated rkey.
    let inv = opc == CqeOpcode::RespSendInv.to_raw();
    // flags_rqpn bits 29:28: a GRH (L3 header) came with it.
    let grh = if (fr >> 28) & 3 != 0 {
        wc_flags::GRH
    } else {
        0
    };
    Wc {
        wr_id,
        opcode: if opc == CqeOpcode::RespWrImm.to_raw() {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        },
        byte_len: e.be32_at(BYTE_CNT),
        imm_data: imm_field(e, imm, inv),
        qp_num: qpn,
        src_qp: fr & c::CQE_QPN_MASK,
        wc_flags: grh
            | if imm { wc_flags::WITH_IMM } else { 0 }
            | if inv { wc_flags::WITH_INV } else { 0 },
        ..Wc::default()
    }
}

/// `op_own` of a successful requester CQE with nothing scattered to it:
/// opcode REQ, format 0 (the solicited and owner bits aside).
const PLAIN_REQ_MASK: u8 =
    (0xf << c::CQE_OPCODE_SHIFT) | (c::CQE_FORMAT_MASK << c::CQE_FORMAT_SHIFT);
const _: () = assert!(CqeOpcode::Req.to_raw() == 0);

/// The owned CQE `e` (its last 8 bytes `tail`) completed into `one` if it
/// is the cached QP's usual completion ([`complete_usual`]), its send
/// queue freed; the caller consumes it.
#[inline(always)]
fn complete_cached(
    cache: &Option<(u32, Arc<WqTrack>)>,
    e: &RingCqe<'_>,
    tail: u64,
    one: &mut impl WcSlot,
) -> bool {
    let qpn = (tail >> 32) as u32 & c::CQE_QPN_MASK;
    let mut sq_end = None;
    let Some((q, t)) = cache else {
        return false;
    };
    if *q != qpn || !complete_usual(t, e, tail, &mut sq_end, one) {
        return false;
    }
    if let Some(end) = sq_end {
        t.sq_free_to(end);
    }
    true
}

/// The completions a poll's loop decodes inline, for the QP `t` of the
/// last one: a successful requester CQE with nothing scattered to it and
/// not a UMR's, or a receive with nothing scattered to it on a QP without
/// an SRQ. A requester completion leaves the send counter to free the
/// queue to in `sq_end` (stored once the run ends: [`WqTrack::sq_free_to`]).
/// `false`, with nothing written, for any other CQE: [`complete`] then.
#[inline(always)]
fn complete_usual(
    t: &WqTrack,
    e: &RingCqe<'_>,
    tail: u64,
    sq_end: &mut Option<u32>,
    wc: &mut impl WcSlot,
) -> bool {
    let op_own = tail as u8;
    let sop_qpn = (tail >> 32) as u32;
    let wqe_counter = (tail >> 16) as u16;
    let qpn = sop_qpn & c::CQE_QPN_MASK;
    let opc = op_own >> c::CQE_OPCODE_SHIFT;
    let format = op_own & (c::CQE_FORMAT_MASK << c::CQE_FORMAT_SHIFT);
    if op_own & PLAIN_REQ_MASK == 0 {
        let s_op = (sop_qpn >> c::CQE_S_WQE_OPCODE_SHIFT) as u8;
        if s_op == WqeOpcode::Umr.to_raw() {
            return false;
        }
        let Some((wr_id, end)) = t.sq_take_checked(wqe_counter) else {
            return false;
        };
        let (opcode, byte_len) = req_opcode(e, s_op);
        *sq_end = Some(end);
        wc.put(
            Wc {
                wr_id,
                opcode,
                byte_len,
                qp_num: qpn,
                ..Wc::default()
            },
            e,
        );
        true
    } else if opc.wrapping_sub(RESP_FIRST) <= RESP_LAST - RESP_FIRST && format == 0 && !t.has_srq()
    {
        let Some(wr_id) = t.rq_complete_checked() else {
            return false;
        };
        wc.put(recv_wc(e, opc, qpn, wr_id), e);
        true
    } else {
        false
    }
}

/// A READ or an atomic whose response came in the CQE (requester scatter
/// to CQE): copied into the send WQE's data segments as libmlx5's
/// `handle_good_req` does (`COPY`), before the WQE's slot is freed.
#[cold]
#[inline(never)]
fn scattered_req<const COPY: bool>(
    e: &impl CqeFields,
    t: &WqTrack,
    (opcode, byte_len): (WcOpcode, u32),
    qpn: u32,
    wqe_counter: u16,
    wc: &mut impl WcSlot,
) {
    let mut status = WcStatus::Success;
    if COPY {
        let mut data = [0u8; 64];
        let n = e.inline_data(&mut data).unwrap_or(0).min(byte_len as usize);
        status = match t.send_view.get() {
            Some(v) => v.copy_to_wqe(wqe_counter, &data[..n]),
            // A QP that did not ask for it: nowhere to put the bytes.
            None => WcStatus::GeneralErr,
        };
    }
    wc.put(
        Wc {
            wr_id: t.sq_complete(wqe_counter),
            status,
            opcode,
            byte_len,
            qp_num: qpn,
            ..Wc::default()
        },
        e,
    );
}

/// A receive whose bytes came in the CQE (scatter to CQE, RC/UC): copied
/// into the receive WQE's segments as libmlx5's `handle_responder` does
/// (`COPY`), before the WQE's slot is freed; the CQE's `flags_rqpn` is
/// data here, so no source QP or GRH flag.
#[cold]
#[inline(never)]
fn scattered_recv<const COPY: bool>(
    e: &impl CqeFields,
    t: &WqTrack,
    op_own: u8,
    qpn: u32,
    wqe_counter: u16,
    wc: &mut impl WcSlot,
) {
    let opc = op_own >> c::CQE_OPCODE_SHIFT;
    let byte_len = e.be32_at(BYTE_CNT);
    let mut status = WcStatus::Success;
    if COPY {
        let mut data = [0u8; 64];
        let n = e.inline_data(&mut data).unwrap_or(0);
        status = t.copy_scattered(wqe_counter, &data[..n]);
    }
    let imm = opc == CqeOpcode::RespWrImm.to_raw() || opc == CqeOpcode::RespSendImm.to_raw();
    let inv = opc == CqeOpcode::RespSendInv.to_raw();
    wc.put(
        Wc {
            wr_id: t.rq_complete(wqe_counter),
            status,
            opcode: WcOpcode::Recv,
            byte_len,
            imm_data: imm_field(e, imm, inv),
            qp_num: qpn,
            wc_flags: if imm { wc_flags::WITH_IMM } else { 0 }
                | if inv { wc_flags::WITH_INV } else { 0 },
            ..Wc::default()
        },
        e,
    );
}

/// `ibv_wc.imm_data` of a receive: the immediate as it came (network
/// order, as verbs keeps it), or the invalidated rkey in host order (the
/// same union), or 0.
#[inline(always)]
fn imm_field(e: &impl CqeFields, imm: bool, inv: bool) -> u32 {
    if imm {
        e.be32_at(IMM).to_be()
    } else if inv {
        e.be32_at(IMM)
    } else {
        0
    }
}

// The responder opcodes, one range: RESP_WR_IMM, RESP_SEND, RESP_SEND_IMM,
// RESP_SEND_INV.
const RESP_FIRST: u8 = CqeOpcode::RespWrImm.to_raw();
const RESP_LAST: u8 = CqeOpcode::RespSendInv.to_raw();
const _: () = assert!(
    CqeOpcode::RespSend.to_raw() == RESP_FIRST + 1
        && CqeOpcode::RespSendImm.to_raw() == RESP_FIRST + 2
        && RESP_LAST == RESP_FIRST + 3
);

/// The work-completion opcode of a requester completion by WQE opcode
/// (libmlx5's `handle_good_req`): one load for any of the byte's 256
/// values (no bound test), where a `match` made a jump table; every other
/// opcode (SEND, SEND with immediate or invalidate, NOP, local
/// invalidate) completes as SEND. UMR WQEs are told apart before (their
/// slot recorded what they did).
const REQ_WC_OPCODE: [WcOpcode; 256] = {
    let mut t = [WcOpcode::Send; 256];
    t[WqeOpcode::RdmaWrite.to_raw() as usize] = WcOpcode::RdmaWrite;
    t[WqeOpcode::RdmaWriteImm.to_raw() as usize] = WcOpcode::RdmaWrite;
    t[WqeOpcode::RdmaRead.to_raw() as usize] = WcOpcode::RdmaRead;
    t[WqeOpcode::AtomicCs.to_raw() as usize] = WcOpcode::CompSwap;
    t[WqeOpcode::AtomicMaskedCs.to_raw() as usize] = WcOpcode::CompSwap;
    t[WqeOpcode::AtomicFa.to_raw() as usize] = WcOpcode::FetchAdd;
    t[WqeOpcode::AtomicMaskedFa.to_raw() as usize] = WcOpcode::FetchAdd;
    t
};

/// The work-completion opcode and byte count of a requester completion
/// for WQE opcode `s_op`: a READ's bytes from the CQE, an atomic's 8.
#[inline(always)]
fn req_opcode(e: &impl CqeFields, s_op: u8) -> (WcOpcode, u32) {
    let op = REQ_WC_OPCODE[usize::from(s_op)];
    let byte_len = match op {
        WcOpcode::RdmaRead => e.be32_at(BYTE_CNT),
        WcOpcode::CompSwap | WcOpcode::FetchAdd => 8,
        _ => 0,
    };
    (op, byte_len)
}

/// An error CQE, or one with an opcode a QP's CQ does not expect.
#[cold]
#[inline(never)]
fn error_cqe_to_wc(
    e: &impl CqeFields,
    t: &WqTrack,
    op: CqeOpcode,
    qpn: u32,
    wqe_counter: u16,
    wc: &mut impl WcSlot,
) {
    let mut w = Wc {
        qp_num: qpn,
        ..Wc::default()
    };
    match op {
        CqeOpcode::ReqErr | CqeOpcode::RespErr => {
            let synd = CqeSyndrome::from_raw(e.u8_at(SYNDROME));
            w.status = WcStatus::from_syndrome(synd);
            w.vendor_err = u32::from(e.u8_at(VENDOR_SYND)) | (u32::from(e.u8_at(SYNDROME)) << 8);
            w.wr_id = if op == CqeOpcode::ReqErr {
                t.sq_complete(wqe_counter)
            } else {
                t.rq_complete(wqe_counter)
            };
        }
        other => {
            tracing::warn!("CQE opcode {other} on QP {qpn:#x}");
            w.status = WcStatus::GeneralErr;
        }
    }
    wc.put(w, e);
}

/// The part of a CQ the QPs that use it share.
pub(crate) struct CqShared {
    pub(crate) cqn: u32,
    ctx: Arc<Ctx>,
    pub(crate) qps: RwLock<HashMap<u32, Arc<WqTrack>>>,
    /// Ethernet RQs polled through this CQ, by the `user_index` their
    /// receive CQEs carry (`crate::uidx`).
    pub(crate) uidx: RwLock<HashMap<u32, Arc<WqTrack>>>,
    pub(crate) gen: AtomicU64,
    pub(crate) arm_sn: AtomicU32,
    /// The ring's memory (a resize replaces it).
    region: std::sync::Mutex<DmaSlice>,
    dbrec: Dbrec,
    uar: Option<Arc<Uar>>,
    /// `ibv_cq.cqe`: entries usable (a resize changes it).
    pub(crate) cqe: AtomicU32,
    /// Bytes per CQE (64 or 128).
    pub(crate) cqe_bytes: usize,
    /// The ring as a QP's destroy or RESET reads it, and the cleanings
    /// filed for the poller (`clean`).
    peek: clean::CqPeek,
}

impl std::fmt::Debug for CqShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqShared").field("cqn", &self.cqn).finish()
    }
}

impl CqShared {
    pub(crate) fn attach(&self, qpn: u32, t: Arc<WqTrack>) {
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(qpn, t);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// The CQEs of QP `qpn`, which the device took out of service, go
    /// before the poller returns any of them (`clean`); a dropped receive
    /// CQE gives its WQE back to `srq`.
    pub(crate) fn clean(&self, qpn: u32, srq: Option<Arc<crate::srq::SrqShared>>) {
        self.peek.request(qpn, srq);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Receive CQEs carrying `user_index` `uidx` go to `t`.
    pub(crate) fn attach_uidx(&self, uidx: u32, t: Arc<WqTrack>) {
        self.uidx
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uidx, t);
    }

    /// Receive CQEs carrying `uidx` are dropped from now on.
    pub(crate) fn detach_uidx(&self, uidx: u32) {
        self.uidx
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uidx);
    }

    pub(crate) fn detach(&self, qpn: u32) {
        self.qps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&qpn);
        self.gen.fetch_add(1, Ordering::Release);
    }
}

impl Drop for CqShared {
    fn drop(&mut self) {
        self.ctx.hca.comp_table().remove(self.cqn);
        let mut inb = [0u8; destroy_cq_in::SIZE_BYTES];
        DestroyCqIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DestroyCq.to_raw())
            .set_cqn(self.cqn);
        if let Err(e) = self.ctx.hca.cmd().exec(&inb, destroy_cq_out::SIZE_BYTES) {
            tracing::warn!("DESTROY_CQ {:#x}: {e}", self.cqn);
            // The device may still write CQEs: the memory stays out of use.
            self.region
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .device_may_still_use();
            self.dbrec.device_may_still_use();
        }
        if let Some(u) = self.uar.take() {
            self.ctx.release_uar(u);
        }
    }
}

/// A CQ's ring as a poller that does not hold the CQ may read it: whether
/// the CQE at a consumer index is there yet, and whether the device
/// failed. A C library's `ibv_poll_cq` tells an empty CQ with it before
/// taking the CQ's lock (an empty poll is most polls of a poll-mode
/// program). It holds the ring's memory, so a resize that replaced the
/// ring leaves a reader of the old one reading memory still there.
#[derive(Debug, Clone)]
pub struct CqProbe {
    ring: DmaRing<{ c::CQE_SIZE }>,
    log_size: u8,
    shift: u8,
    failed: crate::cmd::Cmd,
}

impl CqProbe {
    /// Whether a poll from consumer index `ci` would find a CQE, or the
    /// device failed (a poll then reports the failure): false means the
    /// poll would return nothing.
    #[inline(always)]
    pub fn ready_at(&self, ci: u32) -> bool {
        let idx = (ci << self.shift) | u32::from(self.shift);
        self.ring
            .entry(idx)
            .load_u8_acquire(OP_OWN)
            .is_ok_and(|op_own| c::cqe_is_sw_owned(op_own, ci, self.log_size))
            || self.failed.is_failed()
    }
}

/// CQE compression for a CQ an Ethernet RQ completes to
/// ([`Context::create_cq_compressed`]): the device may write a burst's
/// receive CQEs as one session, a title and mini CQEs carrying the byte
/// count and this one field each, which the receive burst
/// ([`crate::raw_eth::RawPacketQp::rx_burst`], [`crate::rss::Wq::rx_burst`])
/// expands. Fewer bytes over PCIe per packet, as DPDK's mlx5 PMD asks by
/// default; [`Cq::poll`] does not expand sessions (as libmlx5's
/// `ibv_poll_cq` does not): a compressed CQ is for the receive burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqeCompression {
    /// Each packet keeps its RSS hash (`MLX5_CQE_RES_FORMAT_HASH`); its
    /// checksum sum is lost (the good/bad flags are the title's).
    Hash,
    /// Each packet keeps its checksum sum (`MLX5_CQE_FORMAT_CSUM`); its
    /// RSS hash is lost (reads 0).
    Csum,
}

impl CqeCompression {
    /// The CQ context's `mini_cqe_res_format`.
    fn mini_cqe_res_format(self) -> u8 {
        match self {
            Self::Hash => c::MINI_CQE_RES_FORMAT_HASH,
            Self::Csum => c::MINI_CQE_RES_FORMAT_CSUM,
        }
    }
}

/// A completion queue (`struct ibv_cq`).
#[derive(Debug)]
pub struct Cq {
    ring: CqRing,
    pub(crate) shared: Arc<CqShared>,
    cache: Option<(u32, Arc<WqTrack>)>,
    gen: u64,
    /// The command queue, whose failed flag an empty poll reads (two
    /// loads from here instead of five through `shared`).
    cmd: crate::cmd::Cmd,
}

impl Cq {
    pub(crate) fn create(
        ctx: &Context,
        cqe: u32,
        channel: Option<&CompChannel>,
        vector: Option<usize>,
        cqe_bytes: usize,
        compress: Option<CqeCompression>,
    ) -> Result<Self> {
        let c = &ctx.ctx;
        let per = cqe_bytes / c::CQE_SIZE;
        let max = c.hca.caps().max_cq_sz()?;
        if cqe == 0 || cqe >= max {
            return Err(Error::Invalid("CQ size out of range"));
        }
        if compress.is_some() && (per != 1 || !c.hca.caps().gen().cqe_compression()) {
            return Err(Error::NotSupported(
                "CQE compression (64-byte CQEs, the device's cqe_compression)",
            ));
        }
        // One more than asked, as mlx5 does (a full ring cannot be told
        // from an empty one by the index alone).
        let n = (cqe + 1).next_power_of_two();
        let log = n.trailing_zeros() as u8;
        let region = alloc_ring(c, n, cqe_bytes)?;
        let dbrec = c.hca.dma().alloc_dbrec()?;
        let mut ring = CqRing::from_rings(
            region.ring(0, n * per as u32)?,
            dbrec.ring(0)?,
            0,
            c.hca.bar().clone(),
            0,
        );
        if per == 2 {
            ring.set_cqe_128();
        }
        ring.compress = compress;
        let uar = c.alloc_uar()?;
        ring.uar_off = uar.offset();
        let eqn = match c.comp_eqn(vector) {
            Ok(e) => e,
            Err(e) => {
                c.release_uar(uar);
                return Err(e);
            }
        };
        let log_page = region.len().trailing_zeros() - 12;
        let mut inb = vec![0u8; create_cq_in::SIZE_BYTES + 8];
        {
            let mut i = CreateCqIn::new_unchecked(&mut inb[..]);
            i.set_opcode(Opcode::CreateCq.to_raw());
            i.cq_context_mut()
                .set_cqe_sz(if per == 2 {
                    c::CQE_STRIDE_128
                } else {
                    c::CQE_STRIDE_64
                })
                .set_log_cq_size(log)
                .set_uar_page(uar.index())
                .set_c_eqn_or_apu_element(u32::from(eqn))
                .set_log_page_size(log_page as u8)
                .set_dbr_addr(dbrec.iova().0);
            if let Some(f) = compress {
                i.cq_context_mut()
                    .set_cqe_comp_en(true)
                    .set_mini_cqe_res_format(f.mini_cqe_res_format());
            }
            i.set_pas(0, region.iova().0);
        }
        let out = match c.hca.cmd().exec(&inb, create_cq_out::SIZE_BYTES) {
            Ok(o) => o,
            Err(e) => {
                c.release_uar(uar);
                return Err(e);
            }
        };
        let cqn = CreateCqOut::new_unchecked(&out[..]).cqn();
        ring.cqn = cqn;
        let shared = Arc::new(CqShared {
            cqn,
            ctx: c.clone(),
            qps: RwLock::default(),
            uidx: RwLock::default(),
            gen: AtomicU64::new(0),
            arm_sn: AtomicU32::new(0),
            region: std::sync::Mutex::new(region),
            dbrec,
            uar: Some(uar),
            cqe: AtomicU32::new(n - 1),
            cqe_bytes,
            peek: clean::CqPeek::of(&ring),
        });
        if let Some(ch) = channel {
            let ch = ch.inner.clone();
            let weak = Arc::downgrade(&shared);
            c.hca.comp_table().insert(
                cqn,
                Arc::new(move || {
                    if let Some(s) = weak.upgrade() {
                        // The event consumed this arm: the next arm takes
                        // the next sequence number (rdma-core: mlx5_cq_event).
                        s.arm_sn.fetch_add(1, Ordering::AcqRel);
                        ch.notify(s.cqn);
                    }
                }),
            );
        }
        Ok(Self {
            ring,
            cmd: c.hca.cmd().clone(),
            shared,
            cache: None,
            gen: u64::MAX,
        })
    }

    /// The polling ring, for queues that read their CQEs themselves
    /// ([`crate::raw_eth`]).
    pub(crate) fn ring_mut(&mut self) -> &mut CqRing {
        &mut self.ring
    }

    /// The consumer index a poll starts from (for [`CqProbe::ready_at`]).
    #[inline]
    pub fn consumer_index(&self) -> u32 {
        self.ring.ci
    }

    /// The ring as a poller without this CQ may read it ([`CqProbe`]); a
    /// resize replaces the ring, so take a new probe after one.
    pub fn probe(&self) -> CqProbe {
        self.ring.probe(&self.cmd)
    }

    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.shared.cqn
    }

    /// Entries the CQ holds.
    pub fn cqe(&self) -> u32 {
        self.shared.cqe.load(Ordering::Relaxed)
    }

    /// `ibv_req_notify_cq`: an event on the channel for the next completion
    /// (or the next solicited one).
    pub fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        let cmd = if solicited_only {
            CQ_DB_REQ_NOT_SOL
        } else {
            CQ_DB_REQ_NOT
        };
        let sn = self.shared.arm_sn.load(Ordering::Acquire);
        self.ring.arm(sn, cmd)
    }

    /// `ibv_poll_cq`: fills `wc` with up to `wc.len()` completions and
    /// returns how many.
    ///
    /// Once the device failed (health) or vanished, a poll that finds no
    /// completion returns the failure ([`crate::Error::Health`]):
    /// completions the device wrote before are still returned first. The
    /// check costs one atomic load, on empty polls only.
    #[inline]
    pub fn poll(&mut self, wc: &mut [Wc]) -> Result<usize> {
        self.poll_slots(wc)
    }

    /// [`poll`](Self::poll) into memory that need not be initialised,
    /// laid out as [`Wc`] (a C caller's `ibv_wc` array): the first
    /// returned-many entries are written, the rest left alone.
    #[inline]
    pub fn poll_uninit(&mut self, wc: &mut [MaybeUninit<Wc>]) -> Result<usize> {
        self.poll_slots(wc)
    }

    /// [`poll`](Self::poll) that also reads each completion's CQE
    /// timestamp ([`WcStamped`]): for programs that asked for completion
    /// timestamps (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`).
    #[inline]
    pub fn poll_stamped(&mut self, wc: &mut [WcStamped]) -> Result<usize> {
        self.poll_slots(wc)
    }

    /// [`poll_uninit`](Self::poll_uninit) for the C library's
    /// `ibv_poll_cq` (which tells an empty CQ itself before it takes its
    /// lock): inlined into the caller, a one-slot poll's usual completion
    /// in straight-line code, anything else out of line. `None` when
    /// nothing was polled and the device failed ([`failure`](Self::failure)
    /// says why): no [`crate::Error`] in the caller's frame.
    #[inline(always)]
    pub fn poll_uninit_inline(&mut self, wc: &mut [MaybeUninit<Wc>]) -> Option<usize> {
        let n = self.poll_counted(wc);
        if n == 0 && self.cmd.is_failed() {
            return None;
        }
        Some(n)
    }

    #[inline(always)]
    fn poll_slots<S: WcSlot>(&mut self, wc: &mut [S]) -> Result<usize> {
        let n = self.poll_counted(wc);
        if n == 0 && self.cmd.is_failed() {
            if let Some(e) = self.failure() {
                return Err(e);
            }
        }
        Ok(n)
    }

    /// The poll, a failed device aside: the owner byte of the CQE at the
    /// consumer index tested first (an empty poll is that load), then the
    /// poll: into one slot, the usual `ibv_poll_cq(cq, 1, &wc)`, the usual
    /// completion inlined into the caller ([`poll_one_in`](Self::poll_one_in));
    /// anything else out of line.
    #[inline(always)]
    fn poll_counted<S: WcSlot>(&mut self, wc: &mut [S]) -> usize {
        match wc {
            [one] => self.poll_one_in(one),
            [_, _, ..] if self.ring.has_cqe() => self.poll_owned(wc, 1),
            _ => 0,
        }
    }

    /// [`poll_owned_in`](Self::poll_owned_in) into one slot: the CQE at the
    /// consumer index tested and its last 8 bytes read in one load
    /// ([`CqRing::owned_at`]), the usual completion ([`complete_usual`])
    /// in straight-line code, anything else (the QPs changed, another
    /// QP's CQE, an error, a CQE dropped) by the general poll out of line.
    #[inline(always)]
    fn poll_one_in<S: WcSlot>(&mut self, one: &mut S) -> usize {
        let Some((e, tail)) = self.ring.owned_at(0) else {
            return 0;
        };
        let g = self.shared.gen.load(Ordering::Acquire);
        if g != self.gen {
            return self.poll_owned(std::slice::from_mut(one), 0);
        }
        if complete_cached(&self.cache, &e, tail, one) {
            self.ring.consume(1);
            self.ring.update_ci();
            return 1;
        }
        self.poll_owned(std::slice::from_mut(one), 1)
    }

    /// The usual completion alone, into one slot: `true` once the CQE at
    /// the consumer index, software's and the cached QP's usual
    /// completion (`complete_usual`), was written to `one` and consumed;
    /// `false`, with nothing read past the CQE and nothing changed, for
    /// anything else (an empty CQ, the QPs changed, another QP's CQE, an
    /// error): the caller then polls ([`poll_uninit_inline`](Self::poll_uninit_inline)).
    /// For a caller whose own call must stay a leaf: the C library's
    /// `ibv_poll_cq` under its lock.
    #[inline(always)]
    pub fn poll_one_usual(&mut self, one: &mut MaybeUninit<Wc>) -> bool {
        let Some((e, tail)) = self.ring.owned_at(0) else {
            return false;
        };
        if self.shared.gen.load(Ordering::Acquire) != self.gen
            || !complete_cached(&self.cache, &e, tail, one)
        {
            return false;
        }
        self.ring.consume(1);
        self.ring.update_ci();
        true
    }

    /// [`poll_owned_in`](Self::poll_owned_in) out of line, so that an
    /// empty poll (its caller, inlined) saves no registers for it.
    #[inline(never)]
    fn poll_owned<S: WcSlot>(&mut self, wc: &mut [S], known: u32) -> usize {
        self.poll_owned_in(wc, known)
    }

    /// [`poll`](Self::poll) once the first `known` CQEs were seen to be
    /// software's: the QPs' changes first (a destroyed QP's CQEs cleaned,
    /// so nothing is known any more), then CQE after CQE, each after the
    /// first `known` tested as it is read ([`CqRing::owned_at`]: one load
    /// for the test and the fields a requester completion needs), up to
    /// `wc.len()` completions, and the consumer index once.
    #[inline(always)]
    fn poll_owned_in<S: WcSlot>(&mut self, wc: &mut [S], mut known: u32) -> usize {
        // The caller's owner-bit test was an acquire load of one byte: the
        // barrier that orders the CQE's other fields after it.
        vfio::mmio::dma_rmb();
        let g = self.shared.gen.load(Ordering::Acquire);
        if g != self.gen {
            self.generation_changed(g);
            known = 0;
        }
        let (mut n, mut j) = (0, 0u32);
        // The send counter the cached QP's queue is free to, stored once
        // (no release store a CQE, which kept the ring's place in memory).
        let mut sq_end = None;
        while n < wc.len() {
            let (e, tail) = if j < known {
                let e = self.ring.owned_cqe(j);
                (e, e.tail())
            } else {
                match self.ring.owned_at(j) {
                    Some(et) => et,
                    None => break,
                }
            };
            let slot = &mut wc[n];
            let qpn = (tail >> 32) as u32 & c::CQE_QPN_MASK;
            let done = match &self.cache {
                Some((q, t)) if *q == qpn && complete_usual(t, &e, tail, &mut sq_end, slot) => true,
                _ => {
                    free_sq_to(&self.cache, &mut sq_end);
                    self.complete_other(j, slot)
                }
            };
            n += usize::from(done);
            j += 1;
        }
        self.ring.consume(j);
        free_sq_to(&self.cache, &mut sq_end);
        self.ring.update_ci();
        n
    }

    /// [`complete`] of CQE `j` after the consumer index, one
    /// [`complete_usual`] does not decode: another QP's, an error, a UMR's,
    /// scattered data, an SRQ receive (out of line, the CQE found again
    /// from `j`, so that the poll's loop keeps its registers).
    #[inline(never)]
    fn complete_other<S: WcSlot>(&mut self, j: u32, wc: &mut S) -> bool {
        let e = self.ring.owned_cqe(j);
        complete::<true>(&mut self.cache, &self.shared, &e, wc)
    }

    /// Why an empty poll fails once the device did (off the fast path);
    /// `None` while it has not.
    #[cold]
    #[inline(never)]
    pub fn failure(&self) -> Option<crate::Error> {
        self.shared.ctx.hca.cmd().failure()
    }

    /// [`poll`](Self::poll) that hands the bytes scattered to a CQE out in
    /// place (`inline[i]` for `wc[i]`; `len` 0 when the completion had
    /// none) instead of copying them into the receive buffer, or the READ's
    /// or atomic's local buffer (requester scatter), which stay untouched.
    /// `inline` shorter than `wc` polls only as many.
    pub fn poll_inline(
        &mut self,
        wc: &mut [Wc],
        inline: &mut [crate::scatter_cqe::InlineRecv],
    ) -> Result<usize> {
        let g = self.shared.gen.load(Ordering::Acquire);
        if g != self.gen {
            self.generation_changed(g);
        }
        let max = wc.len().min(inline.len());
        let (mut n, mut taken) = (0, 0u32);
        while n < max {
            let Some(e) = self.ring.next_cqe() else {
                break;
            };
            taken += 1;
            let d = &mut inline[n];
            d.len = e.inline_data(&mut d.data).unwrap_or(0) as u8;
            n += usize::from(complete::<false>(
                &mut self.cache,
                &self.shared,
                &e,
                &mut wc[n],
            ));
        }
        if taken > 0 {
            self.ring.update_ci();
        } else if self.cmd.is_failed() {
            if let Some(e) = self.failure() {
                return Err(e);
            }
        }
        Ok(n)
    }

    /// The QPs on the CQ changed: the one-entry cache goes, and the
    /// cleanings filed (a QP destroyed or reset) are carried out.
    #[cold]
    #[inline(never)]
    fn generation_changed(&mut self, g: u64) {
        self.cache = None;
        self.gen = g;
        let cleans = self.shared.peek.take();
        if !cleans.is_empty() {
            let n = self.ring.clean(&cleans);
            tracing::debug!(cqn = self.shared.cqn, dropped = n, "CQ cleaned");
        }
    }

    /// `ibv_destroy_cq`: now, or `Busy` while QPs use the CQ (it is then
    /// destroyed after the last of them).
    pub fn destroy(self) -> Result<()> {
        if Arc::strong_count(&self.shared) > 1 {
            return Err(Error::Busy("QPs still use the CQ"));
        }
        drop(self);
        Ok(())
    }
}

/// Memory for a ring of `n` CQEs of `cqe_bytes`, each INVALID (software's
/// initial value: the device has written none).
fn alloc_ring(ctx: &Ctx, n: u32, cqe_bytes: usize) -> Result<DmaSlice> {
    let region = ctx.hca.dma().alloc_buf(n as usize * cqe_bytes)?;
    for i in 0..n as usize {
        region.write(
            i * cqe_bytes + cqe_bytes - c::CQE_SIZE + OP_OWN,
            &[CqeOpcode::Invalid.to_raw() << c::CQE_OPCODE_SHIFT],
        )?;
    }
    Ok(region)
}

/// The tracking of QP `qpn` on a CQ: the one-entry cache of the last QP
/// seen, else the CQ's table (which refills the cache). No reference count
/// moves on a cache hit.
#[inline(always)]
fn track<'c>(
    cache: &'c mut Option<(u32, Arc<WqTrack>)>,
    shared: &CqShared,
    qpn: u32,
) -> Option<&'c WqTrack> {
    let hit = matches!(cache, Some((q, _)) if *q == qpn);
    if !hit {
        track_miss(cache, shared, qpn)?;
    }
    cache.as_ref().map(|(_, t)| &**t)
}

/// A raw packet QP's receive CQE (found by its user index): decoded as
/// any receive, and `IP_CSUM_OK` where the device checked an IPv4 header
/// and its TCP/UDP checksum good (libmlx5's `get_csum_ok`, for a raw packet
/// QP on a device that checks them).
#[cold]
#[inline(never)]
fn raw_recv_to_wc<const COPY: bool>(
    e: &impl CqeFields,
    tail: u64,
    t: &WqTrack,
    wc: &mut impl WcSlot,
) {
    use mlx5_hw::eth::{CQE_L3_HDR_TYPE_IPV4, CQE_L3_HDR_TYPE_SHIFT, CQE_L3_OK, CQE_L4_OK};
    let mut w = Wc::default();
    cqe_to_wc_as::<COPY>(e, tail, t, &mut w);
    let ok = e.u8_at(cqe64::HDS_IP_EXT.off / 8);
    let l3 = (e.u8_at(cqe64::L4_L3_HDR_TYPE.off / 8) >> CQE_L3_HDR_TYPE_SHIFT) & 0x3;
    if w.status == WcStatus::Success
        && ok & (CQE_L3_OK | CQE_L4_OK) == CQE_L3_OK | CQE_L4_OK
        && l3 == CQE_L3_HDR_TYPE_IPV4
    {
        w.wc_flags |= wc_flags::IP_CSUM_OK;
    }
    wc.put(w, e);
}

/// The queue a receive CQE that names no QP belongs to, if it is an
/// Ethernet RQ's polled through verbs CQs (a raw packet QP's, a WQ's):
/// such a CQE carries the flow tag where others carry the QP number, and
/// names its RQ by `user_index` in `srqn_uidx`, which the CQ's
/// user-index table maps (a namespace of its own, as libmlx5's `uidx`;
/// not the poll's cache, whose keys are QP numbers).
#[cold]
#[inline(never)]
fn by_user_index(shared: &CqShared, e: &impl CqeFields, tail: u64) -> Option<Arc<WqTrack>> {
    let opc = (tail as u8) >> c::CQE_OPCODE_SHIFT;
    let resp = opc.wrapping_sub(RESP_FIRST) <= RESP_LAST - RESP_FIRST
        || opc == CqeOpcode::RespErr.to_raw();
    if !resp {
        return None;
    }
    let uidx = e.be32_at(SRQN) & c::CQE_QPN_MASK;
    shared
        .uidx
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&uidx)
        .cloned()
}

/// [`track`] from the CQ's table, which refills the cache (out of line: a
/// poll's loop keeps no registers for the table's lock and hash).
#[inline(never)]
fn track_miss(cache: &mut Option<(u32, Arc<WqTrack>)>, shared: &CqShared, qpn: u32) -> Option<()> {
    let t = shared
        .qps
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&qpn)
        .cloned()?;
    *cache = Some((qpn, t));
    Some(())
}

/// Frees the cached QP's send queue to the counter a poll's run of its
/// completions left ([`complete_usual`]), if any.
#[inline(always)]
fn free_sq_to(cache: &Option<(u32, Arc<WqTrack>)>, sq_end: &mut Option<u32>) {
    if let (Some(end), Some((_, t))) = (sq_end.take(), cache) {
        t.sq_free_to(end);
    }
}

/// One completion of a CQ that QPs share: finds its QP, then decodes.
#[inline(always)]
fn complete<const COPY: bool>(
    cache: &mut Option<(u32, Arc<WqTrack>)>,
    shared: &CqShared,
    e: &impl CqeFields,
    wc: &mut impl WcSlot,
) -> bool {
    // The last 8 bytes once (the QPN for the look-up, the rest for the
    // decode): two loads of the ring are two volatile loads.
    let tail = e.tail();
    let qpn = (tail >> 32) as u32 & c::CQE_QPN_MASK;
    if let Some(t) = track(cache, shared, qpn) {
        cqe_to_wc_as::<COPY>(e, tail, t, wc);
        return true;
    }
    if let Some(t) = by_user_index(shared, e, tail) {
        raw_recv_to_wc::<COPY>(e, tail, &t, wc);
        return true;
    }
    // A QP destroyed while the poll was under way (its CQEs are otherwise
    // cleaned before the poll): nobody to report to.
    tracing::debug!(
        "CQE for QP {qpn:#x}, which is not on CQ {:#x}: dropped",
        shared.cqn
    );
    false
}
