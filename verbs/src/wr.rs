//! Work requests: the types a user builds ([`SendWr`], [`RecvWr`],
//! [`SendOp`], [`Payload`], [`UdDest`], [`send_flags`]), why a post fails
//! ([`PostError`]), and posting them on a [`Qp`] (mlx5_ib's `wr.c`:
//! `ibv_post_send`, `ibv_post_recv`, and the one-WQE fast path
//! [`Qp::post_rdma_write`]). The WQEs themselves are built by
//! [`crate::wqe::SendRing`] and `crate::rq`.
//!
//! Also the `ibv_wr_*` batch API: `wr_start`, an operation (`wr_send`,
//! `wr_rdma_write`, ...), its data (`wr_set_sge`, `wr_set_inline_data`,
//! `wr_set_ud_addr`), and `wr_complete` to ring one doorbell for the whole
//! batch, or `wr_abort` to drop it.
//!
//! A [`WrBatch`] borrows its QP mutably for the batch, so nothing else can
//! post in between; each operation is written into the ring when its data
//! is set, and `wr_abort` winds the producer counter back.

use crate::ah::Ah;
use crate::mr::Sge;
use crate::qp::{Qp, QpState, QpType, MAX_SGE};

/// `IBV_SEND_*` flags.
pub mod send_flags {
    /// IBV_SEND_FENCE.
    pub const FENCE: u32 = 1;
    /// IBV_SEND_SIGNALED.
    pub const SIGNALED: u32 = 1 << 1;
    /// IBV_SEND_SOLICITED.
    pub const SOLICITED: u32 = 1 << 2;
    /// IBV_SEND_INLINE.
    pub const INLINE: u32 = 1 << 3;
}

/// What a send work request does (`ibv_wr_opcode` and its fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// IBV_WR_SEND.
    Send,
    /// IBV_WR_SEND_WITH_IMM (immediate in host order).
    SendImm(u32),
    /// IBV_WR_RDMA_WRITE.
    RdmaWrite {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    RdmaWriteImm {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate, host order.
        imm: u32,
    },
    /// IBV_WR_RDMA_READ.
    RdmaRead {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_ATOMIC_CMP_AND_SWP: the old value lands in the (8-byte) SGE.
    AtomicCmpSwp {
        /// Remote address (8-byte aligned).
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Compared with the remote value.
        compare: u64,
        /// Written if equal.
        swap: u64,
    },
    /// IBV_WR_ATOMIC_FETCH_AND_ADD: the old value lands in the SGE.
    AtomicFetchAdd {
        /// Remote address (8-byte aligned).
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Added to the remote value.
        add: u64,
    },
    /// IBV_WR_BIND_MW (made by [`crate::mw::Mw::bind_op`]): a UMR WQE.
    BindMw {
        /// The window's current rkey (the control segment's key).
        mw_rkey: u32,
        /// The rkey the window gets (its key byte).
        rkey: u32,
        /// The window's type.
        ty: crate::mw::MwType,
        /// What it covers.
        bind: crate::mw::MwBind,
    },
    /// IBV_WR_LOCAL_INV of a type-2 window bound on this QP.
    LocalInv {
        /// The rkey to invalidate.
        rkey: u32,
    },
    /// IBV_WR_SEND_WITH_INV: a SEND whose receiver invalidates `rkey`.
    SendInv {
        /// The rkey the responder invalidates.
        rkey: u32,
    },
}

/// Where a UD send goes.
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    /// The address handle.
    pub ah: &'a Ah,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// The payload of a send: gathered from MRs, or copied into the WQE.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// Scatter/gather entries.
    Sges(&'a [Sge]),
    /// Inline bytes (IBV_SEND_INLINE).
    Inline(&'a [u8]),
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Payload.
    pub payload: Payload<'a>,
    /// `IBV_SEND_*` flags (INLINE is implied by [`Payload::Inline`]).
    pub flags: u32,
    /// Destination, for UD.
    pub ud: Option<UdDest<'a>>,
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the data goes.
    pub sg_list: &'a [Sge],
}

/// Why a post failed (the index of the failing WR is returned with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// No room in the queue (ENOMEM).
    #[error("queue full")]
    QueueFull,
    /// The QP's state does not allow posting (EINVAL).
    #[error("QP in state {0:?}")]
    BadState(QpState),
    /// Too many SGEs, or too much inline data (EINVAL).
    #[error("too many SGEs or inline bytes")]
    TooLarge,
    /// The operation does not apply to this QP type, or lacks a UD address (EINVAL).
    #[error("operation not valid on this QP")]
    BadOp,
    /// The device failed (health) or vanished: nothing more is posted (EIO).
    #[error("the device failed")]
    DeviceFailed,
    /// A memory-window bind the driver refuses before the device sees it
    /// (EINVAL / EOPNOTSUPP, as libmlx5).
    #[error("memory window bind refused: {0}")]
    BadBind(&'static str),
    /// An mlx5dv mkey work request the driver refuses (libmlx5's EINVAL:
    /// a setter without `wr_mkey_configure`, one set twice, bad access).
    #[error("mkey work request refused: {0}")]
    BadMkeyWr(&'static str),
}

impl Qp {
    /// `ibv_post_send`: writes every WR, then one doorbell. On failure the
    /// WRs before the failing one are posted (and rung); the index and the
    /// reason come back.
    ///
    /// Inlined into the caller, one WR: a 1-SGE RDMA WRITE on a connected
    /// QP while the ring's room is known goes straight into the ring and
    /// is rung, with no call. A list (or any other WR) goes out of line
    /// (`post_send_list`), so that the one-WR path saves no
    /// registers for the list's loop.
    #[inline(always)]
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), (usize, PostError)> {
        self.send_ready().map_err(|e| (0, e))?;
        if let [wr] = wrs {
            if let (SendOp::RdmaWrite { raddr, rkey }, Payload::Sges([s])) = (wr.op, wr.payload) {
                if self.post_one_rdma_write(wr.wr_id, s, raddr, rkey, wr.flags) {
                    return Ok(());
                }
            }
        }
        self.post_send_list(wrs)
    }

    /// A post of one 1-SGE RDMA WRITE on its own, the state checked: when
    /// the QP takes it directly and the room is known, the WQE and the
    /// doorbell (from the control word just built), with no call, and
    /// `true`; else nothing done and `false` (the caller's general path).
    #[inline(always)]
    pub fn post_one_rdma_write(
        &mut self,
        wr_id: u64,
        sge: &Sge,
        raddr: u64,
        rkey: u32,
        flags: u32,
    ) -> bool {
        if !self.rdma_write_direct || sge.length == 0 || !self.sq.has_known_room() {
            return false;
        }
        let ctrl = self.sq.put_rdma_write(wr_id, raddr, rkey, sge, flags);
        self.sq.ring_one(ctrl);
        true
    }

    /// [`Qp::post_send`] of a list: its leading run of 1-SGE RDMA WRITEs
    /// (while the ring's room is known) straight into the ring by one
    /// loop, from the first other WR on by the general writer.
    #[inline(never)]
    fn post_send_list(
        &mut self,
        wrs: &[SendWr<'_>],
    ) -> std::result::Result<(), (usize, PostError)> {
        let n = if self.rdma_write_direct {
            self.sq.write_rdma_write_run(wrs)
        } else {
            0
        };
        if n < wrs.len() {
            return self.post_send_from(wrs, n);
        }
        self.sq.ring();
        Ok(())
    }

    /// [`Qp::post_send`] from WR `start` on, each by [`Qp::write_send`],
    /// then the doorbell for the whole list.
    #[inline(never)]
    fn post_send_from(
        &mut self,
        wrs: &[SendWr<'_>],
        start: usize,
    ) -> std::result::Result<(), (usize, PostError)> {
        for (i, wr) in wrs.iter().enumerate().skip(start) {
            if let Err(e) = self.write_send(wr) {
                self.sq.ring();
                return Err((i, e));
            }
        }
        self.sq.ring();
        Ok(())
    }

    /// The checks a post makes once per list, before its first WR: the
    /// device alive, the QP in RTS or SQD.
    #[inline]
    pub fn send_ready(&self) -> std::result::Result<(), PostError> {
        if self.cmd.is_failed() {
            return Err(PostError::DeviceFailed);
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return Err(PostError::BadState(self.state));
        }
        Ok(())
    }

    /// One WR of a list after [`Qp::send_ready`], written without its
    /// doorbell (the C ABI's walk of `ibv_send_wr.next`);
    /// [`Qp::ring_send`] rings once for all of them.
    #[inline]
    pub fn write_send(&mut self, wr: &SendWr<'_>) -> std::result::Result<(), PostError> {
        if let Payload::Sges(s) = wr.payload {
            if s.len() > self.cap.max_send_sge as usize {
                return Err(PostError::TooLarge);
            }
        }
        if self.is_dci() {
            // A DCI's WR names its DCT: `post_send_deferred_dc`.
            return Err(PostError::BadOp);
        }
        self.sq
            .write_wr(wr, self.qp_type, self.cap.max_inline_data as usize)
    }

    /// [`Qp::post_send_deferred`] on a DCI ([`Qp::is_dci`]): one WR to the
    /// DCT `dc` names, written without its doorbell ([`Qp::ring_send`]).
    /// `BadOp` on any other QP.
    pub fn post_send_deferred_dc(
        &mut self,
        wr: &SendWr<'_>,
        dc: &crate::dc::DcAv,
    ) -> std::result::Result<(), PostError> {
        self.send_ready()?;
        if !self.is_dci() {
            return Err(PostError::BadOp);
        }
        if let Payload::Sges(s) = wr.payload {
            if s.len() > self.cap.max_send_sge as usize {
                return Err(PostError::TooLarge);
            }
        }
        self.sq
            .write_wr_dc(wr, self.cap.max_inline_data as usize, dc)
    }

    /// A 1-SGE RDMA WRITE after [`Qp::send_ready`], without its doorbell:
    /// the WQE [`Qp::write_send`] writes for the same WR, with no
    /// [`SendWr`] built (the C ABI's fast path from `ibv_send_wr`). `sge`
    /// of length 0 or a UD QP: [`Qp::write_send`].
    #[inline]
    pub fn write_rdma_write(
        &mut self,
        wr_id: u64,
        sge: &Sge,
        raddr: u64,
        rkey: u32,
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        if sge.length == 0 || !self.rdma_write_direct {
            return self.write_rdma_write_general(wr_id, *sge, raddr, rkey, flags);
        }
        self.sq.write_rdma_write(wr_id, raddr, rkey, sge, flags)
    }

    /// [`Qp::write_rdma_write`] through [`Qp::write_send`] (an SGE of
    /// length 0, a UD QP, a QP without send SGEs). Out of line, the SGE by
    /// value: the fast path's caller keeps it in registers, not in memory
    /// for a `Payload::Sges` slice.
    #[cold]
    #[inline(never)]
    fn write_rdma_write_general(
        &mut self,
        wr_id: u64,
        sge: Sge,
        raddr: u64,
        rkey: u32,
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        self.write_send(&SendWr {
            wr_id,
            op: SendOp::RdmaWrite { raddr, rkey },
            payload: Payload::Sges(std::slice::from_ref(&sge)),
            flags,
            ud: None,
        })
    }

    /// One WR of an `ibv_post_send` list, written without its doorbell:
    /// [`Qp::send_ready`] then [`Qp::write_send`]; [`Qp::ring_send`]
    /// rings once for all of them.
    pub fn post_send_deferred(&mut self, wr: &SendWr<'_>) -> std::result::Result<(), PostError> {
        self.send_ready()?;
        self.write_send(wr)
    }

    /// Rings the send doorbell for what [`Qp::post_send_deferred`],
    /// [`Qp::write_send`] and [`Qp::write_rdma_write`] wrote.
    #[inline]
    pub fn ring_send(&mut self) {
        self.sq.ring();
    }

    /// Whether the device failed (then nothing more is posted).
    pub(crate) fn device_failed(&self) -> bool {
        self.cmd.is_failed()
    }

    /// Posts one 1-SGE RDMA WRITE with its doorbell: the fast path.
    #[inline]
    pub fn post_rdma_write(
        &mut self,
        wr_id: u64,
        sge: &Sge,
        raddr: u64,
        rkey: u32,
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        if self.cmd.is_failed() {
            return Err(PostError::DeviceFailed);
        }
        if self.state != QpState::Rts || self.qp_type == QpType::Ud {
            return Err(PostError::BadState(self.state));
        }
        // The one-WR post of `post_send`; else (room to look up, an empty
        // SGE, which takes no data segment) the same WQE as `write_send`.
        if self.post_one_rdma_write(wr_id, sge, raddr, rkey, flags) {
            return Ok(());
        }
        self.write_rdma_write(wr_id, sge, raddr, rkey, flags)?;
        self.sq.ring();
        Ok(())
    }

    /// `ibv_post_send` with SGEs given as raw `(addr, length, lkey)`.
    ///
    /// # Safety
    ///
    /// Every triple lies inside a live MR of this QP's PD with that lkey,
    /// and its memory stays registered until the WR completes.
    #[allow(unsafe_code)] // Raw SGEs the caller vouches for.
    pub unsafe fn post_send_unchecked(
        &mut self,
        wr_id: u64,
        op: SendOp,
        sges: &[(u64, u32, u32)],
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        let mut v = [Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_SGE];
        if sges.len() > MAX_SGE {
            return Err(PostError::TooLarge);
        }
        for (d, &(addr, length, lkey)) in v.iter_mut().zip(sges) {
            // SAFETY: forwarded from this function's contract.
            *d = unsafe { Sge::new_unchecked(addr, length, lkey) };
        }
        let wr = SendWr {
            wr_id,
            op,
            payload: Payload::Sges(&v[..sges.len()]),
            flags,
            ud: None,
        };
        self.post_send(&[wr]).map_err(|(_, e)| e)
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), (usize, PostError)> {
        if self.cmd.is_failed() {
            return Err((0, PostError::DeviceFailed));
        }
        if self.state == QpState::Reset {
            return Err((0, PostError::BadState(self.state)));
        }
        let Some(rq) = &mut self.rq else {
            return Err((0, PostError::BadOp));
        };
        let mut r = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = rq.post(wr) {
                r = Err((i, e));
                break;
            }
        }
        rq.ring();
        r
    }
}

/// One batch of work requests on a QP (`ibv_qp_ex` between `wr_start`
/// and `wr_complete`).
#[derive(Debug)]
pub struct WrBatch<'q> {
    pub(crate) qp: &'q mut Qp,
    start_pc: u32,
    pub(crate) wr_id: u64,
    pub(crate) flags: u32,
    op: Option<SendOp>,
    ud: Option<(Ah, u32, u32)>,
    /// A DCI's target and stream (`mlx5dv_wr_set_dc_addr[_stream]`).
    dc: Option<crate::dc::DcAv>,
    pub(crate) err: Option<PostError>,
    /// An mlx5dv mkey configuration waiting for its setters
    /// ([`crate::mkey`]); boxed, so that the batch every post carries
    /// stays small.
    pub(crate) mkey: Option<Box<crate::mkey::PendingMkey>>,
}

impl Qp {
    /// `ibv_wr_start`.
    #[inline]
    pub fn wr_start(&mut self) -> WrBatch<'_> {
        let start_pc = self.send_ring().pc();
        self.wr_resume(start_pc, WrCarry::default())
    }
}

/// What a `wr_*` batch carries from one call to the next when its caller
/// cannot keep the [`WrBatch`] (the C library's `ibv_qp_ex`, each of whose
/// calls takes the QP's lock anew): an mlx5dv mkey configuration waiting
/// for its setters ([`crate::mkey`]).
#[derive(Debug, Default)]
pub struct WrCarry {
    mkey: Option<Box<crate::mkey::PendingMkey>>,
}

impl WrCarry {
    /// Whether an mkey configuration waits for setters.
    pub fn mkey_pending(&self) -> bool {
        self.mkey.is_some()
    }
}

impl Qp {
    /// A batch picking up what an earlier call left ([`WrBatch::suspend`]),
    /// rewound to `start_pc` (its `wr_start`'s [`SendRing::pc`]) by an
    /// abort.
    ///
    /// [`SendRing::pc`]: crate::wqe::SendRing::pc
    pub fn wr_resume(&mut self, start_pc: u32, carry: WrCarry) -> WrBatch<'_> {
        WrBatch {
            qp: self,
            start_pc,
            wr_id: 0,
            flags: 0,
            op: None,
            ud: None,
            dc: None,
            err: None,
            mkey: carry.mkey,
        }
    }
}

impl WrBatch<'_> {
    /// Ends this call's share of the batch without ringing: what the next
    /// call needs ([`Qp::wr_resume`]) and the first failure of this one.
    /// An operation begun and not given its data is dropped.
    pub fn suspend(self) -> (WrCarry, Option<PostError>) {
        (WrCarry { mkey: self.mkey }, self.err)
    }

    /// Sets the id and `IBV_SEND_*` flags of the next WR (`qpx->wr_id`,
    /// `qpx->wr_flags`).
    #[inline]
    pub fn wr_id(&mut self, wr_id: u64, flags: u32) -> &mut Self {
        self.wr_id = wr_id;
        self.flags = flags;
        self
    }

    #[inline]
    fn op(&mut self, op: SendOp) -> &mut Self {
        if self.mkey.take().is_some() && self.err.is_none() {
            self.err = Some(PostError::BadMkeyWr("mkey configuration missing setters"));
        }
        self.op = Some(op);
        self
    }

    /// `ibv_wr_send`.
    pub fn send(&mut self) -> &mut Self {
        self.op(SendOp::Send)
    }

    /// `ibv_wr_send_imm` (immediate in host order).
    pub fn send_imm(&mut self, imm: u32) -> &mut Self {
        self.op(SendOp::SendImm(imm))
    }

    /// `ibv_wr_rdma_write`.
    #[inline]
    pub fn rdma_write(&mut self, rkey: u32, raddr: u64) -> &mut Self {
        self.op(SendOp::RdmaWrite { raddr, rkey })
    }

    /// `ibv_wr_rdma_write_imm`.
    pub fn rdma_write_imm(&mut self, rkey: u32, raddr: u64, imm: u32) -> &mut Self {
        self.op(SendOp::RdmaWriteImm { raddr, rkey, imm })
    }

    /// `ibv_wr_rdma_read`.
    pub fn rdma_read(&mut self, rkey: u32, raddr: u64) -> &mut Self {
        self.op(SendOp::RdmaRead { raddr, rkey })
    }

    /// `ibv_wr_atomic_cmp_swp`.
    pub fn atomic_cmp_swp(&mut self, rkey: u32, raddr: u64, compare: u64, swap: u64) -> &mut Self {
        self.op(SendOp::AtomicCmpSwp {
            raddr,
            rkey,
            compare,
            swap,
        })
    }

    /// `ibv_wr_atomic_fetch_add`.
    pub fn atomic_fetch_add(&mut self, rkey: u32, raddr: u64, add: u64) -> &mut Self {
        self.op(SendOp::AtomicFetchAdd { raddr, rkey, add })
    }

    /// `ibv_wr_bind_mw`: a complete WR (no data setter follows).
    pub fn bind_mw(&mut self, mw: &crate::mw::Mw, rkey: u32, bind: crate::mw::MwBind) -> &mut Self {
        self.op(mw.bind_op(rkey, bind)).emit(Payload::Sges(&[]))
    }

    /// `ibv_wr_local_inv`: a complete WR.
    pub fn local_inv(&mut self, rkey: u32) -> &mut Self {
        self.op(SendOp::LocalInv { rkey }).emit(Payload::Sges(&[]))
    }

    /// `ibv_wr_send_inv` (a data setter follows).
    pub fn send_inv(&mut self, rkey: u32) -> &mut Self {
        self.op(SendOp::SendInv { rkey })
    }

    /// `ibv_wr_set_ud_addr` (before the data setter).
    pub fn set_ud_addr(&mut self, ah: &Ah, remote_qpn: u32, remote_qkey: u32) -> &mut Self {
        self.ud = Some((ah.clone(), remote_qpn, remote_qkey));
        self
    }

    /// `mlx5dv_wr_set_dc_addr` (a DCI, before the data setter): the
    /// target DCT `remote_dctn` at `ah`, with its DC access key.
    pub fn set_dc_addr(&mut self, ah: &Ah, remote_dctn: u32, remote_dc_key: u64) -> &mut Self {
        self.set_dc_addr_stream(ah, remote_dctn, remote_dc_key, 0)
    }

    /// `mlx5dv_wr_set_dc_addr_stream`: [`set_dc_addr`](Self::set_dc_addr)
    /// on DCI stream `stream_id`.
    pub fn set_dc_addr_stream(
        &mut self,
        ah: &Ah,
        remote_dctn: u32,
        remote_dc_key: u64,
        stream_id: u16,
    ) -> &mut Self {
        self.dc = Some(crate::dc::DcAv::new(
            ah,
            remote_dctn,
            remote_dc_key,
            stream_id,
        ));
        self
    }

    #[inline(never)]
    fn emit(&mut self, payload: Payload<'_>) -> &mut Self {
        if self.err.is_some() {
            return self;
        }
        let Some(op) = self.op.take() else {
            self.err = Some(PostError::BadOp);
            return self;
        };
        let ud = self.ud.as_ref().map(|(ah, q, k)| UdDest {
            ah,
            remote_qpn: *q,
            remote_qkey: *k,
        });
        let wr = SendWr {
            wr_id: self.wr_id,
            op,
            payload,
            flags: self.flags,
            ud,
        };
        let (t, max_inline) = (self.qp.qp_type(), self.qp.cap().max_inline_data as usize);
        let r = match (self.qp.is_dci(), &self.dc) {
            (true, Some(dc)) => self.qp.send_ring().write_wr_dc(&wr, max_inline, dc),
            (true, None) => Err(PostError::BadOp),
            (false, _) => self.qp.send_ring().write_wr(&wr, t, max_inline),
        };
        if let Err(e) = r {
            self.err = Some(e);
        }
        self
    }

    /// `ibv_wr_set_sge`: completes the current WR with one entry. The
    /// common WR, an RDMA WRITE of a non-empty entry on an RC or UC QP, is
    /// written straight into the ring (the WQE [`SendRing::write_wr`]
    /// writes for it); anything else goes through the general builder.
    ///
    /// [`SendRing::write_wr`]: crate::wqe::SendRing
    #[inline(always)]
    pub fn set_sge(&mut self, sge: Sge) -> &mut Self {
        if let (Some(SendOp::RdmaWrite { raddr, rkey }), None, None) =
            (self.op, &self.err, &self.mkey)
        {
            let q = &mut *self.qp;
            let connected = q.qp_type() != QpType::Ud && !q.is_dci();
            if sge.length != 0 && connected && q.cap().max_send_sge != 0 {
                self.op = None;
                let (wr_id, flags) = (self.wr_id, self.flags);
                if let Err(e) = q
                    .send_ring()
                    .write_rdma_write(wr_id, raddr, rkey, &sge, flags)
                {
                    self.err = Some(e);
                }
                return self;
            }
        }
        self.emit(Payload::Sges(&[sge]))
    }

    /// `ibv_wr_set_sge_list`.
    pub fn set_sge_list(&mut self, sges: &[Sge]) -> &mut Self {
        self.emit(Payload::Sges(sges))
    }

    /// `ibv_wr_set_inline_data`.
    pub fn set_inline_data(&mut self, data: &[u8]) -> &mut Self {
        self.emit(Payload::Inline(data))
    }

    /// `ibv_wr_set_inline_data_list`: the pieces, concatenated.
    pub fn set_inline_data_list(&mut self, pieces: &[&[u8]]) -> &mut Self {
        let v: Vec<u8> = pieces.concat();
        self.emit(Payload::Inline(&v))
    }

    /// `ibv_wr_complete`: one doorbell for the batch; or the first error
    /// (then nothing of the batch is posted). Inlined always, as
    /// [`set_sge`](Self::set_sge): out of line, the whole batch was copied
    /// into it.
    #[inline(always)]
    pub fn complete(mut self) -> std::result::Result<(), PostError> {
        if self.qp.device_failed() {
            self.abort();
            return Err(PostError::DeviceFailed);
        }
        if !matches!(self.qp.state(), QpState::Rts | QpState::Sqd) {
            let s = self.qp.state();
            self.abort();
            return Err(PostError::BadState(s));
        }
        if self.mkey.is_some() && self.err.is_none() {
            self.err = Some(PostError::BadMkeyWr("mkey configuration missing setters"));
        }
        if let Some(e) = self.err {
            self.abort();
            return Err(e);
        }
        self.qp.send_ring().ring();
        Ok(())
    }

    /// `ibv_wr_abort`: nothing of the batch is posted.
    pub fn abort(self) {
        let start = self.start_pc;
        self.qp.send_ring().rewind(start);
    }
}
