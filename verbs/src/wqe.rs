//! The send queue and its WQE builder (rdma-core libmlx5's `mlx5_post_send`
//! and `set_*_seg`, mlx5_ib's `wr.c` segment writers): [`SendRing`] writes
//! send WQEs into the ring and rings the doorbell.
//!
//! Posting a send (PRM "Send Doorbell"):
//! 1. build the WQE in place: control segment (opcode, WQE index, QP
//!    number and size in 16-byte units, fence/completion/solicited bits,
//!    immediate), then remote-address, atomic, datagram, data or inline
//!    segments;
//! 2. [`dma_wmb`]: the WQE is visible before the doorbell record;
//! 3. doorbell record `snd_counter` = producer counter (in 64-byte basic
//!    blocks);
//! 4. [`wmb`]: the record is visible before the UAR write;
//! 5. the first 8 bytes of the last WQE's control segment to the UAR's
//!    BlueFlame register (alternating its two buffers), or, for a single
//!    one-block WQE over a write-combining UAR mapping
//!    ([`vfio::MemType::blueflame`]), the whole WQE as a BlueFlame copy;
//! 6. over a write-combining mapping, [`mmio_flush_writes`] (rdma-core's
//!    `mmio_flush_writes()` after the UAR write in `_mlx5_post_send`).
//!
//! The common WQE, a 1-SGE RDMA WRITE on a connected QP, is built as six
//! words in registers ([`SendRing::write_rdma_write`]); every other one
//! segment by segment in a staging buffer, then copied into the ring.
//! Every number and offset comes from `mlx5_hw::wqe` and the segment views
//! of `mlx5_hw::ifc`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mlx5_hw::ifc::*;
use mlx5_hw::uar::BF_BUF_SIZE;
use mlx5_hw::wqe::{self as w, WqeOpcode};
use vfio::mmio::{dma_wmb, mmio_flush_writes, wmb};
use vfio::{DmaBuffer, DmaRing, Mmio, MmioRing};

use crate::mr::Sge;
use crate::qp::{QpType, MAX_SGE};
use crate::wq::{SqSlot, WqTrack};
use crate::wr::{send_flags, Payload, PostError, SendOp, SendWr};
use crate::{Error, Result};

// The fast path builds segments as words: the offsets it assumes.
const _: () = assert!(
    CTRL_OPMOD_IDX_OPCODE == 0
        && CTRL_QPN_DS == 4
        && CTRL_FM_CE_SE == 11
        && CTRL_SIZE == 16
        && RADDR == 0
        && RKEY == 8
        && RADDR_SIZE == 16
        && DATA_BYTE_COUNT == 0
        && DATA_LKEY == 4
        && DATA_ADDR == 8
);

// Control segment byte offsets, from the layout.
const CTRL_OPMOD_IDX_OPCODE: usize = wqe_ctrl_seg::OPMOD_IDX_OPCODE.off / 8;
const CTRL_QPN_DS: usize = wqe_ctrl_seg::QPN_DS.off / 8;
const CTRL_FM_CE_SE: usize = wqe_ctrl_seg::FM_CE_SE.off / 8;
const CTRL_IMM: usize = wqe_ctrl_seg::IMM.off / 8;
const RADDR: usize = wqe_raddr_seg::RADDR.off / 8;
const RKEY: usize = wqe_raddr_seg::RKEY.off / 8;
const DATA_BYTE_COUNT: usize = wqe_data_seg::BYTE_COUNT.off / 8;
const DATA_LKEY: usize = wqe_data_seg::LKEY.off / 8;
const DATA_ADDR: usize = wqe_data_seg::ADDR.off / 8;
const ATOMIC_SWAP_ADD: usize = wqe_atomic_seg::SWAP_ADD.off / 8;
const ATOMIC_COMPARE: usize = wqe_atomic_seg::COMPARE.off / 8;
pub(crate) const CTRL_SIZE: usize = wqe_ctrl_seg::SIZE_BYTES;
pub(crate) const RADDR_SIZE: usize = wqe_raddr_seg::SIZE_BYTES;
pub(crate) const DATA_SIZE: usize = wqe_data_seg::SIZE_BYTES;
pub(crate) const ATOMIC_SIZE: usize = wqe_atomic_seg::SIZE_BYTES;
pub(crate) const DGRAM_SIZE: usize = wqe_datagram_seg::SIZE_BYTES;
/// The inline segment's header (`byte_count` with [`w::INLINE_SEG`]).
pub(crate) const INLINE_HDR_SIZE: usize = wqe_inline_seg::SIZE_BYTES;
pub(crate) const BB: usize = w::SEND_WQE_BB;
/// The 16-byte unit WQE sizes are counted in (`ds`).
const DS: usize = w::SEND_WQE_DS;
/// A 1-SGE RDMA WRITE: control, remote address and one data segment.
const RDMA_WRITE_DS: u32 = ((CTRL_SIZE + RADDR_SIZE + DATA_SIZE) / DS) as u32;

#[inline(always)]
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
fn put_data_seg(b: &mut [u8], o: usize, s: &Sge) {
    put32(b, o + DATA_BYTE_COUNT, s.length);
    put32(b, o + DATA_LKEY, s.lkey);
    put64(b, o + DATA_ADDR, s.addr);
}

/// The send side of a QP: ring memory, producer counter, doorbell record
/// and BlueFlame register. Usable on its own (driver-alone benchmarks).
///
/// Everything the per-WQE path reads is here, by value: the ring's base
/// and mask ([`DmaRing`], checked once), the counter up to which the ring
/// is known to have room (the shared tail is read only when that runs
/// out), and the constant part of a 1-SGE RDMA WRITE's control segment.
#[derive(Debug)]
pub struct SendRing {
    ring: DmaRing<BB>,
    pc: u32,
    /// `pc` may grow to here: the tail when last read, plus the ring size.
    limit: u32,
    cnt: u32,
    /// `pc` at the last doorbell: the WQEs from here on are pending.
    rung: u32,
    /// The first 8 bytes of the last WQE written (the 8-byte doorbell),
    /// in memory order.
    last_ctrl: u64,
    dbrec: DmaRing<4>,
    /// The two BlueFlame buffers, rung in turn; `bf` the next one (a byte,
    /// as its toggle is stored: a wider load after a one-byte store would
    /// miss store forwarding on the next post).
    bf_regs: MmioRing<BF_BUF_SIZE>,
    bf: u8,
    qpn8: u32,
    /// Word 0 of a 1-SGE RDMA WRITE's control segment, WQE index zero.
    rdma_write_ctrl: u64,
    /// `fm_ce_se` bits every WQE gets (CQ_UPDATE with `sq_sig_all`).
    ce_all: u8,
    /// The completion slots of `track`, one per block (held here too: one
    /// indirection less per WQE).
    slots: Arc<[SqSlot]>,
    track: Arc<WqTrack>,
    blueflame: bool,
    /// The UAR mapping is write-combining: flush after the doorbell.
    wc_flush: bool,
}

/// A control segment's first word (`opmod_idx_opcode`, `qpn_ds`) in memory
/// order, WQE index zero: the index is OR-ed in by [`ctrl_idx`].
#[inline(always)]
fn ctrl_word0(opcode: WqeOpcode, qpn_ds: u32) -> u64 {
    let o = w::opmod_idx_opcode(0, 0, opcode).to_be_bytes();
    let q = qpn_ds.to_be_bytes();
    u64::from_ne_bytes([o[0], o[1], o[2], o[3], q[0], q[1], q[2], q[3]])
}

/// WQE index `idx` at its place (bytes 1-2, big-endian) of a control
/// segment's first word in memory order.
#[inline(always)]
fn ctrl_idx(idx: u16) -> u64 {
    let i = idx.to_be_bytes();
    u64::from_ne_bytes([0, i[0], i[1], 0, 0, 0, 0, 0])
}

/// A 1-SGE RDMA WRITE's three segments (ctrl, raddr, data: ds = 3) as six
/// words in memory order, `ctrl` its control segment's first word: written
/// straight into the ring (the block's last 16 bytes are beyond ds and
/// left alone, as rdma-core does).
#[inline(always)]
fn rdma_write_words(ctrl: u64, fm_ce_se: u8, raddr: u64, rkey: u32, sge: &Sge) -> [u64; 6] {
    let be2 = |hi: u32, lo: u32| ((u64::from(hi) << 32) | u64::from(lo)).to_be();
    [
        ctrl,
        u64::from_ne_bytes([0, 0, 0, fm_ce_se, 0, 0, 0, 0]),
        raddr.to_be(),
        be2(rkey, 0),
        be2(sge.length, sge.lkey),
        sge.addr.to_be(),
    ]
}

/// The `IBV_SEND_*` flags that set `fm_ce_se` bits: FENCE (1), SIGNALED
/// (2), SOLICITED (4), the table's index.
const FM_CE_SE_FLAGS: u32 = send_flags::FENCE | send_flags::SIGNALED | send_flags::SOLICITED;

/// `fm_ce_se` for each combination of [`FM_CE_SE_FLAGS`] (one load per WQE
/// instead of a test and a shift per flag).
const FM_CE_SE: [u8; 8] = {
    let mut t = [0u8; 8];
    let mut i = 0;
    while i < 8 {
        let f = i as u32;
        let mut b = 0;
        if f & send_flags::SIGNALED != 0 {
            b |= w::WQE_CTRL_CQ_UPDATE;
        }
        if f & send_flags::SOLICITED != 0 {
            b |= w::WQE_CTRL_SOLICITED;
        }
        if f & send_flags::FENCE != 0 {
            b |= w::WQE_CTRL_FENCE;
        }
        t[i] = b;
        i += 1;
    }
    t
};

/// A WQE's `fm_ce_se`: the bits every WQE of the ring gets (`ce_all`) and
/// those `IBV_SEND_*` `flags` ask for.
#[inline(always)]
fn fm_ce_se(ce_all: u8, flags: u32) -> u8 {
    ce_all | FM_CE_SE[(flags & FM_CE_SE_FLAGS) as usize]
}

impl SendRing {
    /// A send queue of `2^log_cnt` 64-byte blocks at `base` of `buf`, its
    /// counter at `dbrec_off` of `dbrec` (the `snd_counter` dword), ringing
    /// BlueFlame register `bf_off` of `uar`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        buf: Arc<DmaBuffer>,
        base: usize,
        log_cnt: u32,
        dbrec: Arc<DmaBuffer>,
        dbrec_off: usize,
        uar: Arc<Mmio>,
        bf_off: usize,
        track: Arc<WqTrack>,
    ) -> Result<Self> {
        let cnt = 1u32 << log_cnt;
        let (Ok(ring), Ok(dbrec)) = (
            DmaRing::new(buf, base, cnt),
            DmaRing::new(dbrec, dbrec_off, 1),
        ) else {
            return Err(Error::Invalid("send ring outside its buffers"));
        };
        if track.sq.len() < cnt as usize {
            return Err(Error::Invalid("tracking smaller than the ring"));
        }
        uar.write64_raw(bf_off, [0; 8])?;
        let mem = uar.mem_type();
        let Ok(bf_regs) = MmioRing::new(uar, bf_off & !BF_BUF_SIZE, 2) else {
            return Err(Error::Invalid("BlueFlame registers outside the UAR"));
        };
        let qpn8 = track.qpn() << w::WQE_CTRL_QPN_SHIFT;
        let _ = track.send_dbrec.set(dbrec.clone());
        Ok(Self {
            ring,
            pc: 0,
            limit: cnt,
            cnt,
            rung: 0,
            last_ctrl: 0,
            dbrec,
            bf_regs,
            bf: u8::from(bf_off & BF_BUF_SIZE != 0),
            qpn8,
            rdma_write_ctrl: ctrl_word0(WqeOpcode::RdmaWrite, qpn8 | RDMA_WRITE_DS),
            ce_all: 0,
            slots: track.sq.clone(),
            track,
            blueflame: mem.blueflame(),
            wc_flush: mem.needs_flush(),
        })
    }

    /// Asks for a single one-block WQE to go by BlueFlame copy rather than
    /// the 8-byte doorbell; granted only over a write-combining UAR mapping
    /// (the default there, as rdma-core's `prefer_bf`), never over an
    /// uncached one (rdma-core's `MLX5_SHUT_UP_BF`). Returns whether
    /// BlueFlame is now in use.
    pub fn set_blueflame(&mut self, on: bool) -> bool {
        self.blueflame = on && self.bf_regs.mmio().mem_type().blueflame();
        self.blueflame
    }

    /// Whether a lone one-block WQE is rung by BlueFlame copy.
    pub fn blueflame(&self) -> bool {
        self.blueflame
    }

    /// Every WQE requests a completion.
    pub fn set_sig_all(&mut self, on: bool) {
        self.ce_all = if on { w::WQE_CTRL_CQ_UPDATE } else { 0 };
    }

    /// Blocks free now.
    #[inline(always)]
    pub fn free(&self) -> u32 {
        let tail = self.track.sq_tail.load(Ordering::Acquire);
        self.cnt - self.pc.wrapping_sub(tail)
    }

    /// Whether `nbb` blocks fit: first against the room known from the last
    /// look at the tail, then (rarely) by reading the tail again.
    #[inline(always)]
    fn room_for(&mut self, nbb: u32) -> bool {
        self.limit.wrapping_sub(self.pc) >= nbb || self.reload_limit(nbb)
    }

    #[cold]
    #[inline(never)]
    fn reload_limit(&mut self, nbb: u32) -> bool {
        // Acquire: the CQ freed these blocks after the device was done with them.
        let tail = self.track.sq_tail.load(Ordering::Acquire);
        self.limit = tail.wrapping_add(self.cnt);
        self.limit.wrapping_sub(self.pc) >= nbb
    }

    /// The producer counter (in blocks).
    pub fn pc(&self) -> u32 {
        self.pc
    }

    /// Forgets every WQE written since producer counter `pc` (not rung yet).
    pub fn rewind(&mut self, pc: u32) {
        self.pc = pc;
        self.rung = pc;
    }

    /// Back to an empty ring at counter 0, as the device starts the queue
    /// again after a transition to RESET; the doorbell record too.
    pub(crate) fn reset(&mut self) {
        self.rewind(0);
        self.track.sq_tail.store(0, Ordering::Release);
        self.limit = self.cnt;
        self.dbrec.store_u32_be_at::<0>(0, 0);
    }

    /// The QP number the WQEs carry.
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn8 >> w::WQE_CTRL_QPN_SHIFT
    }

    #[inline(always)]
    fn fm_ce_se(&self, flags: u32) -> u8 {
        fm_ce_se(self.ce_all, flags)
    }

    /// Writes one 1-SGE RDMA WRITE (one block) and leaves the doorbell for
    /// [`ring`](Self::ring). The fast path: no state check.
    #[inline(always)]
    pub fn write_rdma_write(
        &mut self,
        wr_id: u64,
        raddr: u64,
        rkey: u32,
        sge: &Sge,
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        if !self.room_for(1) {
            return Err(PostError::QueueFull);
        }
        self.put_rdma_write(wr_id, raddr, rkey, sge, flags);
        Ok(())
    }

    /// Whether the room known from the last look at the tail holds one
    /// more block: a post of one WR then writes it by
    /// [`put_rdma_write`](Self::put_rdma_write) with no call (when not,
    /// the caller's general path reads the tail again).
    /// [`write_rdma_write_run`](Self::write_rdma_write_run) is the same
    /// for a list, whose set-up one WR would not earn back.
    #[inline(always)]
    pub(crate) fn has_known_room(&self) -> bool {
        self.limit != self.pc
    }

    /// The leading run of `wrs` that are 1-SGE RDMA WRITEs of a non-empty
    /// entry, as many as the room known from the last look at the tail
    /// holds, written as [`write_rdma_write`](Self::write_rdma_write)
    /// writes each: how many. The post loop's common case, with no call
    /// and the ring's state in registers across the run (stored once at
    /// its end); the caller's general path takes the WR it stopped at.
    #[inline(always)]
    pub(crate) fn write_rdma_write_run(&mut self, wrs: &[SendWr<'_>]) -> usize {
        let (ring, slots) = (&self.ring, &*self.slots);
        let (ctrl0, ce_all) = (self.rdma_write_ctrl, self.ce_all);
        let start = self.pc;
        let room = self.limit.wrapping_sub(start) as usize;
        let mut pc = start;
        for wr in &wrs[..wrs.len().min(room)] {
            let (SendOp::RdmaWrite { raddr, rkey }, Payload::Sges([sge])) = (wr.op, wr.payload)
            else {
                break;
            };
            if sge.length == 0 {
                break;
            }
            let ctrl = ctrl0 | ctrl_idx(pc as u16);
            let fm = fm_ce_se(ce_all, wr.flags);
            ring.store_words_at::<0, 6>(pc, &rdma_write_words(ctrl, fm, raddr, rkey, sge));
            if let Some(s) = slots.get(ring.slot(pc) as usize) {
                s.set(wr.wr_id, pc.wrapping_add(1));
            }
            pc = pc.wrapping_add(1);
        }
        if pc != start {
            self.last_ctrl = ctrl0 | ctrl_idx(pc.wrapping_sub(1) as u16);
            self.pc = pc;
        }
        pc.wrapping_sub(start) as usize
    }

    /// The one block of a 1-SGE RDMA WRITE at the producer counter, which
    /// has room for it.
    #[inline(always)]
    pub(crate) fn put_rdma_write(
        &mut self,
        wr_id: u64,
        raddr: u64,
        rkey: u32,
        sge: &Sge,
        flags: u32,
    ) -> u64 {
        let pc = self.pc;
        let ctrl = self.rdma_write_ctrl | ctrl_idx(pc as u16);
        let words = rdma_write_words(ctrl, self.fm_ce_se(flags), raddr, rkey, sge);
        self.ring.store_words_at::<0, 6>(pc, &words);
        self.last_ctrl = ctrl;
        self.pc = pc.wrapping_add(1);
        if let Some(s) = self.slots.get(self.ring.slot(pc) as usize) {
            s.set(wr_id, self.pc);
        }
        ctrl
    }

    /// Writes a WQE of any size (`wqe.len()` a multiple of 16), wrapping
    /// around the ring end block by block.
    /// Fills the control segment at the start of `wqe` (opcode, index,
    /// size, completion flags from `flags`, `imm`) and writes the WQE into
    /// the ring; the doorbell is left for [`ring`](Self::ring).
    pub(crate) fn commit_with_ctrl(
        &mut self,
        wqe: &mut [u8],
        opcode: WqeOpcode,
        imm: u32,
        flags: u32,
        wr_id: u64,
    ) -> std::result::Result<(), PostError> {
        let ds = wqe.len().div_ceil(DS) as u8;
        put32(
            wqe,
            CTRL_OPMOD_IDX_OPCODE,
            w::opmod_idx_opcode(0, self.pc as u16, opcode),
        );
        put32(wqe, CTRL_QPN_DS, self.qpn8 | u32::from(ds));
        wqe[CTRL_FM_CE_SE] = self.fm_ce_se(flags);
        put32(wqe, CTRL_IMM, imm);
        self.commit(wqe, wr_id)
    }

    /// [`commit_with_ctrl`](Self::commit_with_ctrl) of a UMR WQE of
    /// mlx5dv's mkey configuration: with the initiator small fence unless
    /// `IBV_SEND_FENCE` asks for more (libmlx5's `fm_cache`), so it waits
    /// for the reads and atomics before it that may use the key.
    pub(crate) fn commit_umr(
        &mut self,
        wqe: &mut [u8],
        mkey: u32,
        flags: u32,
        wr_id: u64,
    ) -> std::result::Result<(), PostError> {
        let ds = wqe.len().div_ceil(DS) as u8;
        put32(
            wqe,
            CTRL_OPMOD_IDX_OPCODE,
            w::opmod_idx_opcode(0, self.pc as u16, WqeOpcode::Umr),
        );
        put32(wqe, CTRL_QPN_DS, self.qpn8 | u32::from(ds));
        let mut fm = self.fm_ce_se(flags);
        if flags & send_flags::FENCE == 0 {
            fm |= w::WQE_CTRL_INITIATOR_SMALL_FENCE;
        }
        wqe[CTRL_FM_CE_SE] = fm;
        put32(wqe, CTRL_IMM, mkey);
        self.commit(wqe, wr_id)
    }

    /// Records the `ibv_wc_opcode` the UMR WQE written at `pc` completes
    /// with (BIND_MW, LOCAL_INV, mlx5dv's UMR).
    pub(crate) fn set_wc_opcode(&self, pc: u32, op: crate::cq::WcOpcode) {
        if let Some(s) = self.slots.get(self.ring.slot(pc) as usize) {
            s.set_wc_op(op as u8);
        }
    }

    fn commit(&mut self, wqe: &[u8], wr_id: u64) -> std::result::Result<(), PostError> {
        let nbb = wqe.len().div_ceil(BB) as u32;
        if !self.room_for(nbb) {
            return Err(PostError::QueueFull);
        }
        let start = self.pc;
        for (i, c) in wqe.chunks_exact(DS).enumerate() {
            let (a, b) = c.split_at(8);
            let words = [
                u64::from_ne_bytes(a.try_into().unwrap_or_default()),
                u64::from_ne_bytes(b.try_into().unwrap_or_default()),
            ];
            let bb = start.wrapping_add((i / w::SEND_WQEBB_NUM_DS) as u32);
            // The 16-byte chunk's place in its 64-byte block, each offset a
            // constant the store is checked against when compiled.
            match i % w::SEND_WQEBB_NUM_DS {
                0 => self.ring.store_words_at::<0, 2>(bb, &words),
                1 => self.ring.store_words_at::<DS, 2>(bb, &words),
                2 => self.ring.store_words_at::<{ 2 * DS }, 2>(bb, &words),
                _ => self.ring.store_words_at::<{ 3 * DS }, 2>(bb, &words),
            }
        }
        self.pc = self.pc.wrapping_add(nbb);
        if let Some(s) = self.slots.get(self.ring.slot(start) as usize) {
            s.set(wr_id, self.pc);
        }
        if let Some(c) = wqe.first_chunk::<8>() {
            self.last_ctrl = u64::from_ne_bytes(*c);
        }
        Ok(())
    }

    /// Rings the doorbell for everything written since the last ring
    /// (BlueFlame when it is a single one-block WQE).
    #[inline(always)]
    pub fn ring(&mut self) {
        let n = self.pc.wrapping_sub(self.rung);
        if n == 0 {
            return;
        }
        self.ring_blocks(n == 1, self.last_ctrl);
    }

    /// [`ring`](Self::ring) right after [`put_rdma_write`](Self::put_rdma_write)
    /// wrote the one block since the last ring, whose control word the
    /// caller holds: no count of blocks, no reload of the word.
    #[inline(always)]
    pub(crate) fn ring_one(&mut self, ctrl: u64) {
        self.ring_blocks(true, ctrl);
    }

    /// The doorbell for the blocks since the last ring, `one` when they are
    /// a single one-block WQE, `ctrl` the last WQE's first 8 bytes.
    #[inline(always)]
    fn ring_blocks(&mut self, one: bool, ctrl: u64) {
        // 2. The WQEs are in memory before the record says so (a compiler
        // barrier on x86-64, where stores are not reordered with stores).
        dma_wmb();
        // 3. Doorbell record: the send counter, 16 bits (PRM "Send Doorbell").
        self.dbrec
            .store_u32_be_at::<0>(0, u32::from(self.pc as u16));
        // 4. The record before the UAR write (Linux `wmb()`, as mlx5e's
        // `mlx5e_notify_hw` and mlx5_ib's post_send).
        wmb();
        // 5. BlueFlame copy of a lone one-block WQE (read back from the
        // ring, as rdma-core copies it), else the 8-byte doorbell: the
        // first 8 bytes of the last WQE's control segment, kept when it
        // was written.
        if self.blueflame && one {
            let block = self.ring.load_words_at::<0, 8>(self.rung);
            self.bf_regs
                .write_block64_at::<0>(u32::from(self.bf), &block);
        } else {
            self.bf_regs
                .write64_at::<0>(u32::from(self.bf), ctrl.to_ne_bytes());
        }
        // 6. Out of the write-combining buffers before anything later, and
        // before the next post may take the other BlueFlame buffer
        // (rdma-core's `mmio_flush_writes()` after the copy or doorbell in
        // `_mlx5_post_send`); an uncached store needs none.
        if self.wc_flush {
            mmio_flush_writes();
        }
        self.bf ^= 1;
        self.rung = self.pc;
    }

    /// Builds and writes one WQE for `wr`; the doorbell is left for
    /// [`ring`](Self::ring). Inlined into each post loop, so that the
    /// common WRITE goes from the caller's WR to the ring in registers
    /// (the general builder is a call).
    #[inline(always)]
    pub(crate) fn write_wr(
        &mut self,
        wr: &SendWr<'_>,
        qp_type: QpType,
        max_inline: usize,
    ) -> std::result::Result<(), PostError> {
        // The common case, a 1-SGE RDMA WRITE on a connected QP, is one
        // block built in registers (the same WQE as below builds).
        if let (SendOp::RdmaWrite { raddr, rkey }, Payload::Sges([s]), false) =
            (wr.op, wr.payload, qp_type == QpType::Ud)
        {
            if s.length != 0 {
                return self.write_rdma_write(wr.wr_id, raddr, rkey, s, wr.flags);
            }
        }
        self.write_wr_general(wr, qp_type, max_inline)
    }

    /// [`write_wr`](Self::write_wr) for any WR: the WQE built segment by
    /// segment, then copied into the ring.
    #[inline(never)]
    pub(crate) fn write_wr_general(
        &mut self,
        wr: &SendWr<'_>,
        qp_type: QpType,
        max_inline: usize,
    ) -> std::result::Result<(), PostError> {
        self.write_wr_to(wr, qp_type, max_inline, None)
    }

    /// [`write_wr_general`](Self::write_wr_general) on a DCI: the WQE
    /// names its target in the datagram segment (`dc`: the address vector
    /// with the DCT number and DC access key) and its stream in the control
    /// segment (rdma-core's `mlx5_send_wr_set_dc_addr_stream`).
    pub(crate) fn write_wr_dc(
        &mut self,
        wr: &SendWr<'_>,
        max_inline: usize,
        dc: &crate::dc::DcAv,
    ) -> std::result::Result<(), PostError> {
        self.write_wr_to(wr, QpType::Rc, max_inline, Some(dc))
    }

    fn write_wr_to(
        &mut self,
        wr: &SendWr<'_>,
        qp_type: QpType,
        max_inline: usize,
        dc: Option<&crate::dc::DcAv>,
    ) -> std::result::Result<(), PostError> {
        let mut wqe = [0u8; w::SEND_WQE_MAX_SIZE];
        let (opcode, imm, raddr, atomic) = match wr.op {
            SendOp::BindMw { .. } | SendOp::LocalInv { .. } => {
                return self.write_mw_wr(wr, qp_type);
            }
            SendOp::SendInv { rkey } => (WqeOpcode::SendInval, Some(rkey), None, None),
            SendOp::Send => (WqeOpcode::Send, None, None, None),
            SendOp::SendImm(i) => (WqeOpcode::SendImm, Some(i), None, None),
            SendOp::RdmaWrite { raddr, rkey } => {
                (WqeOpcode::RdmaWrite, None, Some((raddr, rkey)), None)
            }
            SendOp::RdmaWriteImm { raddr, rkey, imm } => (
                WqeOpcode::RdmaWriteImm,
                Some(imm),
                Some((raddr, rkey)),
                None,
            ),
            SendOp::RdmaRead { raddr, rkey } => {
                (WqeOpcode::RdmaRead, None, Some((raddr, rkey)), None)
            }
            SendOp::AtomicCmpSwp {
                raddr,
                rkey,
                compare,
                swap,
            } => (
                WqeOpcode::AtomicCs,
                None,
                Some((raddr, rkey)),
                Some((swap, compare)),
            ),
            SendOp::AtomicFetchAdd { raddr, rkey, add } => (
                WqeOpcode::AtomicFa,
                None,
                Some((raddr, rkey)),
                Some((add, 0)),
            ),
        };
        // What each transport may do (IB spec: UC has no reads or atomics,
        // UD only sends).
        let ok = match qp_type {
            QpType::Rc => true,
            QpType::Uc => !matches!(
                opcode,
                WqeOpcode::RdmaRead | WqeOpcode::AtomicCs | WqeOpcode::AtomicFa
            ),
            QpType::Ud => matches!(opcode, WqeOpcode::Send | WqeOpcode::SendImm),
        };
        if !ok || (qp_type == QpType::Ud && wr.ud.is_none()) {
            return Err(PostError::BadOp);
        }
        let mut at = put_dgram(&mut wqe, qp_type, wr, dc);
        if let Some((ra, rk)) = raddr {
            put64(&mut wqe, at + RADDR, ra);
            put32(&mut wqe, at + RKEY, rk);
            at += RADDR_SIZE;
        }
        if let Some((sa, cmp)) = atomic {
            put64(&mut wqe, at + ATOMIC_SWAP_ADD, sa);
            put64(&mut wqe, at + ATOMIC_COMPARE, cmp);
            at += ATOMIC_SIZE;
            if let Payload::Sges(s) = wr.payload {
                if s.len() != 1 || s[0].length != 8 {
                    return Err(PostError::BadOp);
                }
            } else {
                return Err(PostError::BadOp);
            }
        }
        match wr.payload {
            Payload::Sges(sges) => {
                if sges.len() > MAX_SGE {
                    return Err(PostError::TooLarge);
                }
                for s in sges {
                    // Zero-length entries are skipped, as mlx5 does.
                    if s.length == 0 {
                        continue;
                    }
                    put_data_seg(&mut wqe, at, s);
                    at += DATA_SIZE;
                }
            }
            Payload::Inline(data) => {
                if data.len() > max_inline || opcode == WqeOpcode::RdmaRead || atomic.is_some() {
                    return Err(PostError::TooLarge);
                }
                if !data.is_empty() {
                    put32(&mut wqe, at, w::INLINE_SEG | data.len() as u32);
                    let d = at + INLINE_HDR_SIZE;
                    wqe[d..d + data.len()].copy_from_slice(data);
                    at += (INLINE_HDR_SIZE + data.len()).next_multiple_of(DS);
                }
            }
        }
        if at > w::SEND_WQE_MAX_SIZE {
            return Err(PostError::TooLarge);
        }
        let ds = (at / DS) as u8;
        put32(
            &mut wqe,
            CTRL_OPMOD_IDX_OPCODE,
            w::opmod_idx_opcode(0, self.pc as u16, opcode),
        );
        put32(&mut wqe, CTRL_QPN_DS, self.qpn8 | u32::from(ds));
        wqe[CTRL_FM_CE_SE] = self.fm_ce_se(wr.flags);
        if let Some(i) = imm {
            put32(&mut wqe, CTRL_IMM, i);
        }
        self.commit(&wqe[..at.next_multiple_of(DS)], wr.wr_id)
    }
}

/// The datagram segment after the control segment of `wqe`: a UD WR's
/// address vector with its remote QPN and Q_Key, or a DCI's (`dc`: the
/// DCT number and DC access key in place; its stream in the control
/// segment). Returns where the next segment starts.
fn put_dgram(
    wqe: &mut [u8],
    qp_type: QpType,
    wr: &SendWr<'_>,
    dc: Option<&crate::dc::DcAv>,
) -> usize {
    let at = CTRL_SIZE;
    if let (QpType::Ud, Some(d)) = (qp_type, wr.ud) {
        let seg = &mut wqe[at..at + DGRAM_SIZE];
        seg.copy_from_slice(&d.ah.av);
        put32(
            seg,
            av::DQP_DCT.off / 8,
            w::EXTENDED_UD_AV | (d.remote_qpn & 0xff_ffff),
        );
        // The UD Q_Key is the upper half of `dc_key`.
        put32(seg, av::DC_KEY.off / 8, d.remote_qkey);
        return at + DGRAM_SIZE;
    }
    if let Some(d) = dc {
        wqe[at..at + DGRAM_SIZE].copy_from_slice(&d.av);
        let s = wqe_ctrl_seg::DCI_STREAM_CHANNEL_ID.off / 8;
        wqe[s..s + 2].copy_from_slice(&d.stream.to_be_bytes());
        return at + DGRAM_SIZE;
    }
    at
}
