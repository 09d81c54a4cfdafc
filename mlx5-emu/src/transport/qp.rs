//! Queue pairs and shared receive queues as the data path sees them: the
//! work-queue buffer geometry (RQ at offset 0, SQ after it, through the
//! PAS list), the doorbell record, the requester and responder state, and
//! taking receive WQEs from an RQ or an SRQ.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vfio::IovaMemory;

use super::mem::{self, access, Extent, Fault, KeyError};
use super::packet::RoceAddr;
use super::{Cq, Rdma};
use crate::fabric::Wire;
use crate::lock;

/// QP states (`qpc.state`, [`mlx5_hw::qp`]'s `QPC_STATE_*`).
pub(crate) mod state {
    pub use mlx5_hw::qp::{
        QPC_STATE_ERR as ERR, QPC_STATE_INIT as INIT, QPC_STATE_RST as RST, QPC_STATE_RTR as RTR,
        QPC_STATE_RTS as RTS, QPC_STATE_SQD as SQD, QPC_STATE_SQER as SQER,
    };
    /// Not a PRM state: the QP was destroyed (cached references see it).
    pub const DESTROYED: u8 = 0xff;
}

/// QP service types (`qpc.st`, [`mlx5_hw::qp`]'s `QPC_ST_*`).
pub(crate) mod st {
    pub use mlx5_hw::qp::{
        QPC_ST_DCI as DCI, QPC_ST_QP1 as QP1, QPC_ST_RC as RC, QPC_ST_REG_UMR as REG_UMR,
        QPC_ST_UC as UC, QPC_ST_UD as UD, QPC_ST_XRC as XRC,
    };
}

/// `qpc.rq_type`.
pub(crate) mod rq_type {
    pub const REGULAR: u8 = 0;
    pub const SRQ: u8 = 1;
    pub const ZERO: u8 = 3;
}

/// A queue buffer in driver memory, described by a PAS list.
#[derive(Debug, Clone, Default)]
pub(crate) struct Buf {
    pub pas: Vec<u64>,
    pub log_page: u32,
    pub offset: u64,
    /// When the pages are contiguous in IOVA space: the buffer's start.
    pub contig: Option<u64>,
}

impl Buf {
    pub(crate) fn new(pas: Vec<u64>, log_page: u32, offset: u64) -> Self {
        let page = 1u64 << log_page;
        let contig = pas
            .iter()
            .enumerate()
            .all(|(i, &p)| p == pas[0] + i as u64 * page)
            .then(|| pas.first().map(|p| p + offset))
            .flatten();
        Self {
            pas,
            log_page,
            offset,
            contig,
        }
    }

    /// The IOVA of byte `off` of the buffer.
    pub(crate) fn addr(&self, off: u64) -> Option<u64> {
        if let Some(b) = self.contig {
            if off < (self.pas.len() as u64) << self.log_page {
                return Some(b + off);
            }
            return None;
        }
        let o = off + self.offset;
        let page = self.pas.get((o >> self.log_page) as usize)?;
        Some(page + (o & ((1 << self.log_page) - 1)))
    }
}

/// The remote end of a connection, and how to address it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Path {
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub dmac: [u8; 6],
    pub hop_limit: u8,
    pub tclass: u8,
    pub flow_label: u32,
    pub udp_sport: u16,
    pub ack_timeout: u8,
    pub pkey_index: u16,
}

/// A WQE waiting at the head of the send queue for a timer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    pub at: Instant,
}

/// Requester state (the send queue), behind `Qp::sq`.
#[derive(Debug, Default)]
pub(crate) struct Sq {
    pub path: Path,
    pub remote_qpn: u32,
    pub mtu: u32,
    pub psn: u32,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub retries_left: u8,
    pub rnr_left: u8,
    pub qkey: u32,
    /// Next WQE (basic-block counter) to execute.
    pub ci: u16,
    pub retry: Option<Retry>,
    pub peer: Option<Peer>,
    pub ext: Vec<Extent>,
    pub inline: Vec<u8>,
    /// RC: messages sent whose (coalesced) ACK has not come yet, oldest
    /// first; empty whenever the worker is not executing the queue.
    pub unacked: VecDeque<Unacked>,
    /// The latest PSN the responses of the last message acknowledged.
    pub acked: Option<u32>,
    /// The last lkey looked up.
    pub lkeys: super::KeyCache,
    /// Counts of the burst in progress, added to the counters at its end
    /// and before any CQE.
    pub tally: Tally,
    /// A DCI's connection and streams.
    pub dc: super::dc::DciState,
    /// The bytes of the READ response or atomic result just answered that
    /// go to its CQE instead of the local buffer (qpc `cs_req`), taken by
    /// its completion.
    pub cqe_data: Option<super::cq::InlineScatter>,
}

/// Packets and bytes sent to the peer, and messages completed, not yet in
/// the counters (one atomic add per burst instead of three per packet).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub packets: Cell<u64>,
    pub bytes: Cell<u64>,
    pub messages: Cell<u64>,
}

/// The remote end of a connection as the requester last found it.
#[derive(Debug)]
pub(crate) struct Peer {
    /// The function answering to the path's GID.
    pub rdma: Arc<Rdma>,
    /// The remote QP (a hint: the receiver checks it is still that QP).
    pub qp: Option<Arc<Qp>>,
    /// Addressing of the packets.
    pub addr: RoceAddr,
    /// The fabric the sender is cabled to.
    pub wire: Option<Arc<Wire>>,
    /// The peer is across this link, in another process (`rdma` is then
    /// this function, a stand-in never delivered to).
    pub link: Option<Arc<crate::wire::Link>>,
    /// The remote function's memory, taken again at every burst.
    pub mem: Arc<IovaMemory>,
    /// [`super::tables_gen`] when found: any table change (GIDs, QPs,
    /// the cabling) finds it again.
    pub gen: u64,
}

/// An RC message sent and not yet acknowledged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unacked {
    /// Its WQE's index (basic-block counter) and size in basic blocks.
    pub index: u16,
    pub nbb: u16,
    /// Its WQE's opcode, for the CQE.
    pub opcode: u8,
    pub signaled: bool,
    /// Message length.
    pub bytes: u32,
    /// PSNs of its first and last packets.
    pub first_psn: u32,
    pub last_psn: u32,
}

/// A receive in progress (a multi-packet SEND, or a WRITE's target).
#[derive(Debug, Default)]
pub(crate) struct Recv {
    pub wqe: u16,
    pub ext: Vec<Extent>,
    pub cap: u64,
    pub off: u64,
}

/// Responder state, behind `Qp::rq`.
#[derive(Debug, Default)]
pub(crate) struct Rq {
    /// An XRC target's current request: the XRC SRQ its XRCETH named
    /// (checked against the target's domain), whose WQEs, PD and CQ the
    /// message uses instead of the QP's.
    pub xrc: Option<Arc<Srq>>,
    pub qkey: u32,
    pub rre: bool,
    pub rwe: bool,
    pub rae: bool,
    pub epsn: u32,
    pub msn: u32,
    pub min_rnr_nak: u8,
    pub mtu: u32,
    pub remote_qpn: u32,
    /// Receive WQEs consumed (counter).
    pub ci: u16,
    /// The SEND being received (valid while `send_on`).
    pub send: Recv,
    /// Its bytes, when they go to the CQE (qpc `cs_res`).
    pub send_inline: Option<super::cq::InlineScatter>,
    pub send_on: bool,
    /// The RDMA WRITE being received (valid while `write_on`).
    pub write: Recv,
    pub write_on: bool,
    /// UC: drop packets until the next first or only packet.
    pub uc_drop: bool,
    /// RC: packets that asked for an ACK since the last one sent (the
    /// coalesced ACK names `epsn - 1`).
    pub ack_owed: u32,
    /// RC: a PSN sequence error NAK (or an RNR NAK) was sent for `epsn`; no other is
    /// sent until the expected PSN arrives (IBA 9.7.5.2.2: one NAK per
    /// sequence error, so a burst behind a lost packet does not send the
    /// requester back once per packet).
    pub seq_nak: bool,
    /// RC: the last atomic executed, its PSN and the original value, for
    /// a duplicate of it (its acknowledgement was lost).
    pub atomic_done: Option<(u32, u64)>,
    /// The last rkey looked up.
    pub rkeys: super::KeyCache,
}

/// One queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub st: u8,
    pub pd: u32,
    pub scq: Arc<Cq>,
    pub rcq: Arc<Cq>,
    pub srq: Option<Arc<Srq>>,
    pub rq_type: u8,
    pub log_rq_size: u8,
    pub log_rq_stride: u8,
    pub log_sq_size: u8,
    pub sq_offset: u64,
    pub buf: Buf,
    pub dbr: u64,
    pub uar: u32,
    /// `qpc.user_index` where the function reports `cqe_version` 1: every
    /// CQE of the QP carries it in `srqn_uidx` (libmlx5 finds the QP, and
    /// through it the SRQ, by this index; Linux's kernel QPs give
    /// 0xffffff and find their SRQ from the QP). None: version 0, the
    /// field holds the SRQ number of a receive from an SRQ.
    pub cqe_uidx: Option<u32>,
    pub state: AtomicU8,
    /// The Q counter set the QP counts in (qpc.counter_set_id; 0: the default set).
    pub counter_set: std::sync::atomic::AtomicU32,
    pub sq: Mutex<Sq>,
    pub rq: Mutex<Rq>,
    /// A DCT's connection (transport/dc.rs), not a QP of the driver's.
    pub dct_conn: bool,
    /// A DCI's `log_num_dci_stream_channels` (0: no streams) and
    /// `log_num_dci_errored_streams`.
    pub log_dci_streams: u8,
    pub log_dci_errored: u8,
    /// qpc `cs_req` / `cs_res`: scatter of read responses / received
    /// SENDs to the CQE (`mlx5_hw::qp::REQ_SCAT_*`, `RES_SCAT_*`).
    pub cs_req: u8,
    pub cs_res: u8,
    /// `qpc.block_lb_mc`: a multicast datagram it sends does not come
    /// back to its own function's QPs (mlx5_ib's
    /// `IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK`).
    pub block_lb_mc: bool,
    /// An XRC QP's domain (`qpc.xrcd`): a target takes requests only for
    /// XRC SRQs of this domain. 0 for other QPs.
    pub xrcd: u32,
    /// `qpc.no_sq`: no send queue (an XRC target): nothing of its doorbell
    /// record or queue memory is read for sending (Linux gives an XRC
    /// target no doorbell record).
    pub no_sq: bool,
}

impl Qp {
    /// What its CQEs carry in `srqn_uidx` (see `cqe_uidx`).
    pub(crate) fn cqe_srqn(&self) -> u32 {
        self.cqe_uidx
            .unwrap_or_else(|| self.srq.as_ref().map_or(0, |s| s.srqn))
    }

    /// What a receive CQE of the message in `rq` carries in `srqn_uidx`:
    /// an XRC target's the XRC SRQ's (its user index or number), others'
    /// [`cqe_srqn`](Self::cqe_srqn).
    pub(crate) fn recv_srqn(&self, rq: &Rq) -> u32 {
        match &rq.xrc {
            Some(s) => s.cqe_uidx.unwrap_or(s.srqn),
            None => self.cqe_srqn(),
        }
    }

    /// The CQ a receive of the message in `rq` completes on: an XRC
    /// target's the XRC SRQ's, others' the QP's receive CQ.
    pub(crate) fn recv_cq<'a>(&'a self, rq: &'a Rq) -> &'a Arc<super::cq::Cq> {
        rq.xrc
            .as_ref()
            .and_then(|s| s.xrc_cq.as_ref())
            .unwrap_or(&self.rcq)
    }

    /// The SRQ receives of the message in `rq` come from, if any.
    pub(crate) fn recv_srq<'a>(&'a self, rq: &'a Rq) -> Option<&'a Arc<Srq>> {
        rq.xrc.as_ref().or(self.srq.as_ref())
    }

    /// The PD a request of the message in `rq` accesses memory under: an
    /// XRC target's the XRC SRQ's, others' the QP's.
    pub(crate) fn access_pd(&self, rq: &Rq) -> u32 {
        rq.xrc.as_ref().map_or(self.pd, |s| s.pd)
    }

    pub(crate) fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub(crate) fn set_state(&self, s: u8) {
        self.state.store(s, Ordering::Release);
    }

    pub(crate) fn destroyed(&self) {
        self.set_state(state::DESTROYED);
    }

    /// Moves the QP to ERR (as hardware does on a completion error); the
    /// worker flushes what is posted.
    pub(crate) fn to_error(&self, rdma: &Rdma) {
        let s = self.state();
        if s != state::DESTROYED && s != state::RST {
            self.set_state(state::ERR);
            rdma.attend(self.qpn);
        }
    }

    pub(crate) fn sq_entries(&self) -> u32 {
        1 << self.log_sq_size
    }

    /// IOVA of send basic block `index` (counter, wraps).
    pub(crate) fn sq_bb(&self, index: u16) -> Option<u64> {
        let i = u64::from(index) & (u64::from(self.sq_entries()) - 1);
        self.buf.addr(self.sq_offset + i * 64)
    }

    /// The SQ producer counter in the doorbell record.
    pub(crate) fn sq_pi(&self, mem: &IovaMemory) -> Result<u16, Fault> {
        mem::load_be32(mem, self.dbr + 4).map(|v| v as u16)
    }

    /// The RQ producer counter in the doorbell record.
    pub(crate) fn rq_pi(&self, mem: &IovaMemory) -> Result<u16, Fault> {
        mem::load_be32(mem, self.dbr).map(|v| v as u16)
    }

    /// Whether the QP's receive side takes packets.
    pub(crate) fn receives(&self) -> bool {
        matches!(
            self.state(),
            state::RTR | state::RTS | state::SQER | state::SQD
        )
    }
}

/// One shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub srqn: u32,
    pub pd: u32,
    pub log_size: u8,
    pub log_stride: u8,
    pub buf: Buf,
    pub dbr: u64,
    pub cqn: u32,
    /// The XRC domain of an XRC SRQ (CREATE_XRC_SRQ); 0 for a basic SRQ.
    pub xrcd: u32,
    /// Which command made it: its destroy, query and modify are that
    /// kind's own.
    pub kind: SrqKind,
    /// An XRC SRQ's CQ (`xrc_srqc.cqn`): receives through it complete
    /// there, whichever XRC target took them.
    pub xrc_cq: Option<Arc<super::cq::Cq>>,
    /// `xrc_srqc.user_index` where the function reports `cqe_version` 1:
    /// its receives' CQEs carry it in `srqn_uidx` (libmlx5 finds the SRQ
    /// by it); None: they carry the SRQ number.
    pub cqe_uidx: Option<u32>,
    pub st: Mutex<SrqState>,
}

/// The three objects that are SRQs to the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SrqKind {
    /// CREATE_SRQ.
    Basic,
    /// CREATE_XRC_SRQ.
    Xrc,
    /// CREATE_RMP.
    Rmp,
}

/// SRQ consumer state.
#[derive(Debug, Default)]
pub(crate) struct SrqState {
    /// Next WQE index (the linked list's head).
    pub head: u16,
    /// WQEs consumed.
    pub ci: u16,
    /// Limit event armed at this many WQEs (ARM_RQ), 0 = not armed.
    pub lwm: u16,
    pub error: bool,
}

/// Why no receive WQE could be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecvError {
    /// None posted.
    Empty,
    /// A scatter entry's lkey refused (index of the WQE).
    Key(u16, KeyError),
    /// The queue's memory is not mapped.
    Fault(u16),
    /// A scatter entry's page is not present (ODP): the WQE stays posted.
    PageFault(u16),
}

/// Terminator lkey of a receive scatter list (`MLX5_INVALID_LKEY`).
const TERMINATE_LKEY: u32 = mlx5_hw::wqe::TERMINATE_SCATTER_LIST_LKEY;

/// Resolves the data segments at `at` (`n` of them) into `out`; returns
/// the total capacity.
fn scatter(
    rdma: &Rdma,
    mem: &IovaMemory,
    pd: u32,
    at: u64,
    n: usize,
    out: &mut Vec<Extent>,
) -> Result<u64, RecvFail> {
    out.clear();
    let mut cap = 0u64;
    let mut seg = [0u8; 16];
    for i in 0..n {
        mem::read(mem, at + i as u64 * 16, &mut seg).map_err(|_| RecvFail::Fault)?;
        let bc = u32::from_be_bytes([seg[0], seg[1], seg[2], seg[3]]);
        let lkey = u32::from_be_bytes([seg[4], seg[5], seg[6], seg[7]]);
        let addr = u64::from_be_bytes([
            seg[8], seg[9], seg[10], seg[11], seg[12], seg[13], seg[14], seg[15],
        ]);
        if lkey == TERMINATE_LKEY {
            break;
        }
        let len = if bc == 0 {
            1u64 << 31
        } else {
            u64::from(bc & 0x7fff_ffff)
        };
        if lkey == rdma.resd_lkey {
            mem::push(out, addr, len);
        } else {
            let k = rdma.mkey(lkey).ok_or(RecvFail::Key(KeyError::Invalid))?;
            k.resolve(pd, access::LW, addr, len, out).map_err(|e| {
                tracing::debug!(
                    lkey = format_args!("{lkey:#x}"),
                    addr = format_args!("{addr:#x}"),
                    len,
                    pd,
                    ?e,
                    key = ?(k.pd, k.access, k.free, k.start, k.len, k.log_page, k.mtt.len()),
                    "receive scatter refused"
                );
                RecvFail::Key(e)
            })?;
        }
        cap += len;
    }
    Ok(cap)
}

enum RecvFail {
    Key(KeyError),
    Fault,
}

impl Qp {
    /// Takes the next receive WQE (RQ or SRQ) and resolves its scatter list
    /// into `recv`.
    pub(crate) fn take_recv(
        &self,
        rdma: &Rdma,
        rq: &mut Rq,
        mem: &IovaMemory,
        recv: &mut Recv,
    ) -> Result<(), RecvError> {
        if let Some(srq) = self.recv_srq(rq) {
            return srq.take(rdma, mem, recv);
        }
        if self.rq_type != rq_type::REGULAR {
            return Err(RecvError::Empty);
        }
        let pi = self.rq_pi(mem).map_err(|_| RecvError::Fault(rq.ci))?;
        if pi == rq.ci {
            return Err(RecvError::Empty);
        }
        let index = rq.ci;
        let stride = 1u64 << self.log_rq_stride;
        let i = u64::from(index) & ((1u64 << self.log_rq_size) - 1);
        let at = self.buf.addr(i * stride).ok_or(RecvError::Fault(index))?;
        let n = (stride / 16) as usize;
        rq.ci = rq.ci.wrapping_add(1);
        recv.wqe = index;
        recv.off = 0;
        match scatter(rdma, mem, self.pd, at, n, &mut recv.ext) {
            Ok(cap) => {
                recv.cap = cap;
                Ok(())
            }
            Err(RecvFail::Key(KeyError::NotPresent)) => {
                // Not consumed: taken again once the fault is resolved.
                rq.ci = index;
                Err(RecvError::PageFault(index))
            }
            Err(RecvFail::Key(k)) => Err(RecvError::Key(index, k)),
            Err(RecvFail::Fault) => Err(RecvError::Fault(index)),
        }
    }
}

impl Srq {
    fn take(&self, rdma: &Rdma, mem: &IovaMemory, recv: &mut Recv) -> Result<(), RecvError> {
        let mut st = lock(&self.st);
        if st.error {
            return Err(RecvError::Empty);
        }
        let pi = mem::load_be32(mem, self.dbr).map_err(|_| RecvError::Fault(st.head))? as u16;
        let avail = pi.wrapping_sub(st.ci);
        if avail == 0 {
            return Err(RecvError::Empty);
        }
        let index = st.head;
        let stride = 16u64 << self.log_stride;
        let i = u64::from(index) & ((1u64 << self.log_size) - 1);
        let at = self.buf.addr(i * stride).ok_or(RecvError::Fault(index))?;
        let mut next = [0u8; 16];
        mem::read(mem, at, &mut next).map_err(|_| RecvError::Fault(index))?;
        recv.wqe = index;
        recv.off = 0;
        // The scatter list is resolved before the WQE is taken off the
        // list (under the SRQ's lock: no other QP takes it meanwhile), so
        // that a page fault (ODP) leaves it posted, at the head, for the
        // resume (PRM page-fault type RMP).
        let n = (stride / 16) as usize - 1;
        let res = match scatter(rdma, mem, self.pd, at + 16, n, &mut recv.ext) {
            Ok(cap) => {
                recv.cap = cap;
                Ok(())
            }
            Err(RecvFail::Key(KeyError::NotPresent)) => return Err(RecvError::PageFault(index)),
            Err(RecvFail::Key(k)) => Err(RecvError::Key(index, k)),
            Err(RecvFail::Fault) => Err(RecvError::Fault(index)),
        };
        st.head = u16::from_be_bytes([next[2], next[3]]);
        st.ci = st.ci.wrapping_add(1);
        if st.lwm != 0 && avail - 1 < st.lwm {
            st.lwm = 0;
            rdma.qp_event(mlx5_hw::event::EventType::SrqRqLimit, self.srqn, true);
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::state;

    #[test]
    fn qp_states_are_what_qpc_state_reports() {
        // mlx5_ifc.h's MLX5_QPC_STATE_*.
        let s = [
            state::RST,
            state::INIT,
            state::RTR,
            state::RTS,
            state::SQER,
            state::SQD,
            state::ERR,
        ];
        assert_eq!(s, [0, 1, 2, 3, 4, 7, 6]);
    }
}
