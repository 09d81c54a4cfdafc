//! The `ibv_wr_*` batch API: `wr_start`, an operation (`wr_send`,
//! `wr_rdma_write`, ...), its data (`wr_set_sge`, `wr_set_inline_data`,
//! `wr_set_ud_addr`), and `wr_complete` to ring one doorbell for the whole
//! batch, or `wr_abort` to drop it.
//!
//! A [`WrBatch`] borrows its QP mutably for the batch, so nothing else can
//! post in between; each operation is written into the ring when its data
//! is set, and `wr_abort` winds the producer counter back.

use crate::ah::Ah;
use crate::mr::Sge;
use crate::qp::{Payload, PostError, Qp, QpState, SendOp, SendWr, UdDest};

/// One batch of work requests on a QP (`ibv_qp_ex` between `wr_start`
/// and `wr_complete`).
#[derive(Debug)]
pub struct WrBatch<'q> {
    qp: &'q mut Qp,
    start_pc: u32,
    wr_id: u64,
    flags: u32,
    op: Option<SendOp>,
    ud: Option<(Ah, u32, u32)>,
    err: Option<PostError>,
}

impl Qp {
    /// `ibv_wr_start`.
    pub fn wr_start(&mut self) -> WrBatch<'_> {
        let start_pc = self.send_ring().pc();
        WrBatch {
            qp: self,
            start_pc,
            wr_id: 0,
            flags: 0,
            op: None,
            ud: None,
            err: None,
        }
    }
}

impl WrBatch<'_> {
    /// Sets the id and `IBV_SEND_*` flags of the next WR (`qpx->wr_id`,
    /// `qpx->wr_flags`).
    pub fn wr_id(&mut self, wr_id: u64, flags: u32) -> &mut Self {
        self.wr_id = wr_id;
        self.flags = flags;
        self
    }

    fn op(&mut self, op: SendOp) -> &mut Self {
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

    /// `ibv_wr_set_ud_addr` (before the data setter).
    pub fn set_ud_addr(&mut self, ah: &Ah, remote_qpn: u32, remote_qkey: u32) -> &mut Self {
        self.ud = Some((ah.clone(), remote_qpn, remote_qkey));
        self
    }

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
        if let Err(e) = self.qp.send_ring().write_wr(&wr, t, max_inline) {
            self.err = Some(e);
        }
        self
    }

    /// `ibv_wr_set_sge`: completes the current WR with one entry.
    pub fn set_sge(&mut self, sge: Sge) -> &mut Self {
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
    /// (then nothing of the batch is posted).
    pub fn complete(self) -> std::result::Result<(), PostError> {
        if self.qp.device_failed() {
            self.abort();
            return Err(PostError::DeviceFailed);
        }
        if !matches!(self.qp.state(), QpState::Rts | QpState::Sqd) {
            let s = self.qp.state();
            self.abort();
            return Err(PostError::BadState(s));
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
