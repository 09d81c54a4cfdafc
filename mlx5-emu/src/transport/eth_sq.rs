//! Ethernet send queues (CREATE_SQ, fw/sq.rs) as the data path executes
//! them: mlx5e's TX queues, its ICOSQs and XDP queues.
//!
//! An SQ is a cyclic ring of 64-byte basic blocks with its producer
//! counter at offset 4 of its doorbell record (`MLX5_SND_DBR`), rung like a
//! QP's send queue (the first 8 bytes of the control segment at a UAR send
//! doorbell: index and SQ number), so the worker finds it from the same
//! doorbells and the same sweep ([`super::Rdma::poll`]). In RDY it runs
//! every posted WQE in order: a NOP (mlx5e's ICOSQ posts one to start
//! NAPI, and fills the ring's edge with them) and a SEND with an Ethernet
//! segment (inline L2 headers, then data segments under the local key)
//! complete with a requester CQE naming the WQE's first basic block
//! (`wqe_counter`) when they ask for one (`fm_ce_se`); the frame is
//! counted as sent and leaves on the port to the functions cabled to it
//! ([`super::eth_rx`]), its IPv4/TCP/UDP checksums filled in when
//! `cs_flags` asks, a VLAN tag inserted where the segment asks for it
//! and the profile offers `wqe_vlan_insert`; an LSO WQE's TCP segment leaves cut at its MSS
//! ([`super::lso`]); an enhanced multi-packet send (where the profile
//! offers `enhanced_multi_pkt_send_wqe`) sends one frame per segment
//! under one Ethernet segment ([`empw`]). A WQE that is malformed,
//! of another opcode, or whose local key does not grant the read
//! completes with an error CQE and moves the SQ to ERR; in ERR every
//! posted WQE completes as flushed (mlx5e's recovery waits for that before
//! it moves the SQ back through RST to RDY).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use mlx5_hw::cqe::{CqeOpcode, CqeSyndrome};
use mlx5_hw::eth::{ETH_WQE_INSERT_VLAN, ETH_WQE_SVLAN, QUEUE_STATE_ERR, QUEUE_STATE_RDY};
use mlx5_hw::ifc::{wqe_ctrl_seg, wqe_data_seg, wqe_eth_seg};
use mlx5_hw::wqe::{
    wqebbs_for_ds, WqeOpcode, INLINE_SEG, MPW_DSEG_MAX, OPC_MOD_MPW, SEND_WQE_MAX_SIZE,
    WQE_CTRL_CQ_UPDATE, WQE_CTRL_CQ_UPDATE_AND_EQE,
};
use vfio::IovaMemory;

use super::cq::Completion;
use super::mem::{self, access};
use super::packet::{ETH_ADDRS_LEN, VLAN_HLEN};
use super::qp::Buf;
use super::requester::{key_error, vendor};
use super::steer::{self, ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q};
use super::{eth_rx, Cq, Rdma};
use crate::lock;

/// Bytes of the inline header inside the Ethernet segment itself
/// (`MLX5E_INL_HDR_START_SZ`, its `inline_hdr_start`).
const INLINE_HDR_START: usize = wqe_eth_seg::INLINE_HDR_START.width / 8;
/// Largest frame an SQ sends: a 9 KiB jumbo frame with its headers (the
/// model's port takes no larger).
const MAX_FRAME: u64 = 9216 + 64;
/// Largest segment an LSO WQE carries: 2^`max_lso_cap` (18 in the
/// ConnectX-4 trace the profiles start from) and its headers.
const MAX_LSO: u64 = (1 << 18) + 256;

/// One Ethernet send queue.
#[derive(Debug)]
pub(crate) struct EthSq {
    pub sqn: u32,
    /// The CQ its completions go to (sqc.cqn).
    pub cq: Arc<Cq>,
    /// The protection domain its data segments' keys must belong to (wq.pd).
    pub pd: u32,
    /// log2 of its basic blocks.
    pub log_size: u8,
    pub buf: Buf,
    /// Doorbell record: the producer counter is at +4.
    pub dbr: u64,
    /// `QUEUE_STATE_*`, moved by MODIFY_SQ and by an error CQE.
    pub state: AtomicU8,
    /// The device inserts VLAN tags (`wqe_vlan_insert`): an Ethernet
    /// segment whose `insert.type` has `ETH_WQE_INSERT_VLAN` is obeyed;
    /// without it those bytes are an inline header size (too long).
    pub vlan_insert: bool,
    /// The device runs legacy multi-packet send WQEs (`multi_pkt_send_wqe`,
    /// and the SQ was made with `allow_multi_pkt_send_wqe`, as mlx5_ib
    /// makes a raw packet QP's SQ where the cap is offered).
    pub mpw: bool,
    /// The device runs enhanced multi-packet send WQEs
    /// (`enhanced_multi_pkt_send_wqe`, ConnectX-5 and later); without it
    /// their opcode is a local QP operation error.
    pub empw: bool,
    /// It takes UMR WQEs (`sqc.reg_umr`, where the card offers
    /// `reg_umr_sq`: mlx5e's internal control SQ maps its striding RQs'
    /// pages by UMR); without it their opcode is a local QP operation
    /// error.
    pub reg_umr: bool,
    /// The transport domain of its TIS (none without one).
    pub td: Option<u32>,
    /// Where the ring stands.
    pub ring: Mutex<Ring>,
}

/// The SQ's position in its ring.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    /// The next basic block to execute.
    pub ci: u16,
    /// The producer counter the doorbell record held when the SQ went back
    /// to RST: the counters restart at 0 there but the driver rewrites the
    /// record only when it posts again (mlx5e's recovery), so until then
    /// the record is stale and only a doorbell makes the SQ read it.
    pub stale: Option<u16>,
}

/// What became of one WQE.
enum Outcome {
    /// Done: bytes and frames sent (0 and 0 for a NOP).
    Done(u32, u32),
    /// Failed: CQE syndrome and vendor syndrome.
    Error(CqeSyndrome, u8),
}

impl EthSq {
    /// The SQ's state (`QUEUE_STATE_*`).
    pub(crate) fn state(&self) -> u64 {
        u64::from(self.state.load(Ordering::Acquire))
    }

    fn bb(&self, i: u16) -> Option<u64> {
        let mask = (1u32 << self.log_size) - 1;
        self.buf.addr(u64::from(u32::from(i) & mask) * 64)
    }

    /// Back to RST: the ring restarts at 0 and the doorbell record counts
    /// as stale until it moves or a doorbell rings.
    pub(crate) fn reset(&self, mem: &IovaMemory) {
        let mut r = lock(&self.ring);
        r.ci = 0;
        r.stale = self.pi(mem);
    }

    /// The producer counter in the doorbell record.
    fn pi(&self, mem: &IovaMemory) -> Option<u16> {
        mem::load_be32(mem, self.dbr + 4).ok().map(|v| v as u16)
    }
}

/// Executes (RDY) or flushes (ERR) what was posted on `sq`; true if any
/// WQE was taken. `rung`: a doorbell of this SQ was seen (else the sweep
/// reads the doorbell record for a lost one).
pub(crate) fn run(rdma: &Rdma, sq: &EthSq, mem: &IovaMemory, rung: bool) -> bool {
    let state = sq.state();
    if state != QUEUE_STATE_RDY && state != QUEUE_STATE_ERR {
        return false;
    }
    let Some(pi) = sq.pi(mem) else {
        return false;
    };
    let mut ring = lock(&sq.ring);
    if ring.stale.is_some_and(|s| s == pi && !rung) {
        return false;
    }
    ring.stale = None;
    let ci = &mut ring.ci;
    let mut busy = false;
    let mut wqe = [0u8; SEND_WQE_MAX_SIZE];
    while *ci != pi {
        busy = true;
        let at = *ci;
        if sq.state() == QUEUE_STATE_ERR {
            if !flush_one(rdma, sq, mem, at, pi, ci) {
                break;
            }
            continue;
        }
        let (nbb, head, outcome) = match read_wqe(sq, mem, at, pi, &mut wqe) {
            Ok((nbb, len)) => (nbb, wqe, execute(rdma, sq, mem, &wqe[..len])),
            Err(v) => (1, wqe, Outcome::Error(CqeSyndrome::LocalQpOpErr, v)),
        };
        let fm = wqe_ctrl_seg::FM_CE_SE.get(&head) as u8 & 0x0c;
        let opcode = head[3];
        let c = match outcome {
            Outcome::Done(bytes, frames) => {
                rdma.counters
                    .packets_sent
                    .fetch_add(u64::from(frames), Ordering::Relaxed);
                rdma.counters
                    .bytes_sent
                    .fetch_add(u64::from(bytes), Ordering::Relaxed);
                (fm == WQE_CTRL_CQ_UPDATE || fm == WQE_CTRL_CQ_UPDATE_AND_EQE).then_some(
                    Completion {
                        opcode: CqeOpcode::Req.to_raw(),
                        qpn: sq.sqn,
                        wqe_counter: at,
                        s_wqe_opcode: opcode,
                        ..Completion::default()
                    },
                )
            }
            Outcome::Error(synd, vendor) => {
                tracing::debug!(sqn = sq.sqn, at, opcode, vendor, "SQ WQE failed");
                sq.state.store(QUEUE_STATE_ERR as u8, Ordering::Release);
                rdma.counters.error_cqes.fetch_add(1, Ordering::Relaxed);
                Some(Completion {
                    opcode: CqeOpcode::ReqErr.to_raw(),
                    qpn: sq.sqn,
                    wqe_counter: at,
                    s_wqe_opcode: opcode,
                    error: Some((synd.to_raw(), vendor)),
                    ..Completion::default()
                })
            }
        };
        *ci = at.wrapping_add(nbb);
        if let Some(c) = c {
            if !sq.cq.push(rdma, mem, &c) {
                // The CQ overran (or is in error): the WQE ran, its CQE is
                // lost, and the SQ goes to ERR (as a QP whose CQ overran
                // does) rather than run it again.
                tracing::debug!(sqn = sq.sqn, at, "CQ refused the CQE: SQ to ERR");
                sq.state.store(QUEUE_STATE_ERR as u8, Ordering::Release);
                break;
            }
        }
    }
    drop(ring);
    if busy {
        eth_rx::end_burst(rdma);
    }
    busy
}

/// Completes the WQE at `at` as flushed (the flush CQE lost where the CQ
/// takes no more: it is in error); false when the WQE cannot be read.
fn flush_one(rdma: &Rdma, sq: &EthSq, mem: &IovaMemory, at: u16, pi: u16, ci: &mut u16) -> bool {
    let mut b = [0u8; 16];
    let Some(addr) = sq.bb(at) else {
        return false;
    };
    if mem::read(mem, addr, &mut b).is_err() {
        return false;
    }
    let ds = (wqe_ctrl_seg::QPN_DS.get(&b) & 0x3f) as usize;
    // A WQE claiming more blocks than were posted ends at the producer
    // counter: the flush never runs past it.
    let nbb = (wqebbs_for_ds(ds).max(1) as u16).min(pi.wrapping_sub(at));
    let c = Completion {
        opcode: CqeOpcode::ReqErr.to_raw(),
        qpn: sq.sqn,
        wqe_counter: at,
        s_wqe_opcode: b[3],
        error: Some((CqeSyndrome::WrFlushErr.to_raw(), vendor::FLUSH)),
        ..Completion::default()
    };
    sq.cq.push(rdma, mem, &c);
    *ci = at.wrapping_add(nbb);
    true
}

/// Reads the WQE at `at` into `buf`: its basic blocks and length in bytes
/// (ds × 16). It must name this SQ and its own index, and end at or
/// before the producer counter `pi`.
fn read_wqe(
    sq: &EthSq,
    mem: &IovaMemory,
    at: u16,
    pi: u16,
    buf: &mut [u8; SEND_WQE_MAX_SIZE],
) -> Result<(u16, usize), u8> {
    let first = sq.bb(at).ok_or(vendor::WQE_FAULT)?;
    mem::read(mem, first, &mut buf[..64]).map_err(|_| vendor::WQE_FAULT)?;
    let w0 = wqe_ctrl_seg::OPMOD_IDX_OPCODE.get(&buf[..]) as u32;
    let w1 = wqe_ctrl_seg::QPN_DS.get(&buf[..]) as u32;
    let ds = (w1 & 0x3f) as usize;
    let nbb = wqebbs_for_ds(ds).max(1);
    if ds == 0 || (w0 >> 8) as u16 != at || w1 >> 8 != sq.sqn {
        tracing::debug!(sqn = sq.sqn, at, w0, w1, "malformed SQ WQE");
        return Err(vendor::WQE_FAULT);
    }
    if nbb > usize::from(pi.wrapping_sub(at)) {
        return Err(vendor::WQE_FAULT);
    }
    for i in 1..nbb {
        let a = sq.bb(at.wrapping_add(i as u16)).ok_or(vendor::WQE_FAULT)?;
        mem::read(mem, a, &mut buf[i * 64..(i + 1) * 64]).map_err(|_| vendor::WQE_FAULT)?;
    }
    Ok((nbb as u16, ds * 16))
}

/// Runs one WQE (`w`: its `ds` × 16 bytes).
fn execute(rdma: &Rdma, sq: &EthSq, mem: &IovaMemory, w: &[u8]) -> Outcome {
    match WqeOpcode::from(w[3]) {
        WqeOpcode::Nop => Outcome::Done(0, 0),
        WqeOpcode::Umr if sq.reg_umr => umr(rdma, sq, mem, w),
        WqeOpcode::Send => send(rdma, sq, mem, w, false),
        WqeOpcode::Lso if w[0] == OPC_MOD_MPW => match sq.mpw {
            true => legacy_mpw(rdma, sq, mem, w),
            false => Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::OPCODE),
        },
        WqeOpcode::Lso => send(rdma, sq, mem, w, true),
        WqeOpcode::EnhancedMpsw if sq.empw => empw(rdma, sq, mem, w),
        _ => Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::OPCODE),
    }
}

/// The Ethernet segment's inline header size, or, where the device
/// inserts VLAN tags and `insert.type` asks for it, none and the 4-byte
/// tag to insert after the MAC addresses (`mlx5_wqe_eth_seg`'s union).
fn inline_or_insert(sq: &EthSq, eth: &[u8]) -> (usize, Option<[u8; VLAN_HLEN]>) {
    let sz_or_type = wqe_eth_seg::INLINE_HDR_SZ.get(eth) as u16;
    if !sq.vlan_insert || sz_or_type & ETH_WQE_INSERT_VLAN == 0 {
        return (usize::from(sz_or_type), None);
    }
    let tpid = if sz_or_type & ETH_WQE_SVLAN != 0 {
        ETH_P_8021AD
    } else {
        ETH_P_8021Q
    };
    let tci = wqe_eth_seg::INLINE_HDR_START.get(eth) as u16;
    let [a, b] = tpid.to_be_bytes();
    let [c, d] = tci.to_be_bytes();
    (0, Some([a, b, c, d]))
}

/// A SEND: the Ethernet segment (its inline headers, its checksum
/// offloads), then data segments whose bytes are read through their local
/// keys; the frame they make leaves on the port ([`eth_rx::transmit`]).
/// A frame shorter than an Ethernet header is a length error. `lso`: the
/// LSO opcode, the frame cut at the segment's MSS first ([`lso`]).
fn send(rdma: &Rdma, sq: &EthSq, mem: &IovaMemory, w: &[u8], lso: bool) -> Outcome {
    let ctrl = wqe_ctrl_seg::SIZE_BYTES;
    let Some(eth) = w.get(ctrl..ctrl + wqe_eth_seg::SIZE_BYTES) else {
        return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
    };
    let (ihs, insert) = inline_or_insert(sq, eth);
    let cs_flags = wqe_eth_seg::CS_FLAGS.get(eth) as u8;
    let mss = wqe_eth_seg::MSS.get(eth) as usize;
    let limit = if lso { MAX_LSO } else { MAX_FRAME };
    // The headers past the two bytes in the segment run on in 16-byte units.
    let data_at =
        ctrl + wqe_eth_seg::SIZE_BYTES + ihs.saturating_sub(INLINE_HDR_START).next_multiple_of(16);
    if data_at > w.len() {
        return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
    }
    let inl = ctrl + wqe_eth_seg::INLINE_HDR_START.off / 8;
    let mut frame = w[inl..inl + ihs].to_vec();
    let mut ext = Vec::new();
    for d in w[data_at..].chunks_exact(wqe_data_seg::SIZE_BYTES) {
        if let Err(e) = gather(rdma, sq, mem, d, limit, &mut frame, &mut ext) {
            return e;
        }
    }
    if frame.len() < ETH_HLEN {
        return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
    }
    let out = |f: &mut Vec<u8>| leave(rdma, sq, f, cs_flags, insert);
    if !lso {
        return Outcome::Done(out(&mut frame), 1);
    }
    // A tunnel's inner TCP segment is found by the VXLAN ports.
    let plan = super::rlock(&rdma.eth_rx.plan).clone();
    let Some(frames) = super::lso::segment(&frame, mss, &plan.vxlan_ports) else {
        return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
    };
    if frames.iter().any(|f| f.len() as u64 > MAX_FRAME) {
        return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
    }
    let n = frames.len() as u32;
    let bytes = frames.into_iter().map(|mut f| out(&mut f)).sum();
    Outcome::Done(bytes, n)
}

/// Appends the bytes of data segment `d` (read through its local key,
/// which must grant local read in the SQ's PD) to `frame`, which may not
/// grow past `limit`. A zero byte count adds nothing.
fn gather(
    rdma: &Rdma,
    sq: &EthSq,
    mem: &IovaMemory,
    d: &[u8],
    limit: u64,
    frame: &mut Vec<u8>,
    ext: &mut Vec<mem::Extent>,
) -> Result<(), Outcome> {
    let len = wqe_data_seg::BYTE_COUNT.get(d);
    if len == 0 {
        return Ok(());
    }
    let key = wqe_data_seg::LKEY.get(d) as u32;
    let Some(k) = rdma.mkey(key) else {
        return Err(Outcome::Error(CqeSyndrome::LocalProtErr, vendor::BAD_LKEY));
    };
    ext.clear();
    if let Err(e) = k.resolve(sq.pd, access::LR, wqe_data_seg::ADDR.get(d), len, ext) {
        return Err(Outcome::Error(CqeSyndrome::LocalProtErr, key_error(e)));
    }
    if frame.len() as u64 + len > limit {
        return Err(Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH));
    }
    for x in ext.iter() {
        let at = frame.len();
        frame.resize(at + x.len as usize, 0);
        if mem::read(mem, x.iova, &mut frame[at..]).is_err() {
            return Err(Outcome::Error(CqeSyndrome::LocalProtErr, vendor::DMA_FAULT));
        }
    }
    Ok(())
}

/// The device's own steps on each frame that leaves: checksums over the
/// frame as posted, then the tag it inserts (so an S-VLAN tag, which its
/// parser would not look past, hides nothing); then the port. Its length.
fn leave(
    rdma: &Rdma,
    sq: &EthSq,
    f: &mut Vec<u8>,
    cs_flags: u8,
    insert: Option<[u8; VLAN_HLEN]>,
) -> u32 {
    // The VXLAN ports only where inner checksums are asked (the parser
    // finds the inner frame by them).
    let inner = mlx5_hw::eth::ETH_WQE_L3_INNER_CSUM | mlx5_hw::eth::ETH_WQE_L4_INNER_CSUM;
    let plan = (cs_flags & inner != 0).then(|| super::rlock(&rdma.eth_rx.plan).clone());
    let ports = plan.as_ref().map_or(&[][..], |p| &p.vxlan_ports[..]);
    steer::offload_checksums(f, cs_flags, ports);
    if let Some(tag) = insert {
        f.splice(ETH_ADDRS_LEN..ETH_ADDRS_LEN, tag);
    }
    // A frame shorter than Ethernet's minimum leaves padded with zeros
    // (`pad_tx_eth_packet`, which every profile announces: mlx5e sends
    // runts and leaves the padding to the device).
    if f.len() < super::packet::ETH_ZLEN {
        f.resize(super::packet::ETH_ZLEN, 0);
    }
    // The NIC TX tables, where the function made a root: a matching entry
    // counts the frame and may drop it here. Then the transmit sniffer's
    // copy of what leaves.
    if rdma.eth_rx.egress.load(Ordering::Acquire) {
        let plan = super::rlock(&rdma.eth_rx.plan).clone();
        let p = steer::parse(f, &plan.vxlan_ports);
        let (dropped, counters) = plan.egress(&p.img);
        eth_rx::count_flows(rdma, &counters, f.len());
        if dropped {
            rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(sqn = sq.sqn, len = f.len(), "dropped by a NIC TX entry");
            return f.len() as u32;
        }
        if plan.sniffing(true) {
            eth_rx::sniffed(rdma, f, &p, plan.sniff(&p, true));
        }
    }
    eth_rx::transmit(rdma, f, sq.td);
    f.len() as u32
}

/// A UMR WQE (`sq.reg_umr`): the mkey its control segment names is
/// modified as on a QP ([`super::umr`]), within the SQ's protection domain.
fn umr(rdma: &Rdma, sq: &EthSq, mem: &IovaMemory, w: &[u8]) -> Outcome {
    let by = super::umr::Poster {
        qpn: sq.sqn,
        pd: sq.pd,
        privileged: false,
    };
    let mkey = wqe_ctrl_seg::IMM.get(w) as u32;
    match super::umr::execute(rdma, by, mem, mkey, w, w.len()) {
        Ok(()) => Outcome::Done(0, 0),
        Err((synd, v)) => {
            tracing::debug!(
                sqn = sq.sqn,
                mkey = format_args!("{mkey:#x}"),
                ?synd,
                vendor = v,
                "UMR refused"
            );
            Outcome::Error(synd, v)
        }
    }
}

/// The Ethernet segment of a multi-packet send WQE `w` (eMPW or legacy
/// MPW) and the VLAN tag it has the device insert: the segment must be
/// there (else a length error) and carry no inline headers (else a
/// malformed WQE: the packets are whole in their segments).
fn multi_packet_eth_seg<'w>(
    sq: &EthSq,
    w: &'w [u8],
) -> Result<(&'w [u8], Option<[u8; VLAN_HLEN]>), Outcome> {
    let ctrl = wqe_ctrl_seg::SIZE_BYTES;
    let Some(eth) = w.get(ctrl..ctrl + wqe_eth_seg::SIZE_BYTES) else {
        return Err(Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH));
    };
    match inline_or_insert(sq, eth) {
        (0, insert) => Ok((eth, insert)),
        _ => Err(Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT)),
    }
}

/// An enhanced multi-packet send (ENHANCED_MPSW: mlx5e's TX MPWQE, DPDK's
/// eMPW): one Ethernet segment whose offloads (checksums, VLAN insertion)
/// apply to every packet and which carries no inline headers, then one
/// segment per frame, each a whole frame: a data segment read through its
/// key, or an inline data segment (`byte_count` with [`INLINE_SEG`], the
/// frame's bytes after it, padded to 16 bytes). The frames leave in order;
/// the first bad one (shorter than an Ethernet header, longer than the
/// port takes, past the WQE, a key that does not grant the read) fails
/// the WQE, after those before it have left. Inline headers in the
/// Ethernet segment are a malformed WQE (the PRM's eMPW has none).
fn empw(rdma: &Rdma, sq: &EthSq, mem: &IovaMemory, w: &[u8]) -> Outcome {
    let (eth, insert) = match multi_packet_eth_seg(sq, w) {
        Ok(e) => e,
        Err(o) => return o,
    };
    let cs_flags = wqe_eth_seg::CS_FLAGS.get(eth) as u8;
    let (mut bytes, mut frames) = (0, 0);
    let mut at = wqe_ctrl_seg::SIZE_BYTES + wqe_eth_seg::SIZE_BYTES;
    let mut frame = Vec::new();
    let mut ext = Vec::new();
    while at < w.len() {
        frame.clear();
        let seg = &w[at..];
        let bc = wqe_data_seg::BYTE_COUNT.get(seg) as u32;
        if bc & INLINE_SEG != 0 {
            let len = (bc & !INLINE_SEG) as usize;
            let Some(data) = seg.get(4..4 + len) else {
                return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
            };
            at += (4 + len).next_multiple_of(16);
            if len == 0 {
                // Padding (DPDK's eMPW starts its data at the next block
                // behind two empty inline segments): no frame.
                continue;
            }
            frame.extend_from_slice(data);
        } else {
            if let Err(e) = gather(rdma, sq, mem, seg, MAX_FRAME, &mut frame, &mut ext) {
                return e;
            }
            at += wqe_data_seg::SIZE_BYTES;
        }
        if frame.len() < ETH_HLEN || frame.len() as u64 > MAX_FRAME {
            return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
        }
        bytes += leave(rdma, sq, &mut frame, cs_flags, insert);
        frames += 1;
    }
    Outcome::Done(bytes, frames)
}

/// A legacy multi-packet send (ConnectX-4 Lx's MPW: the LSO opcode with
/// `OPC_MOD_MPW`, DPDK's `mlx5_tx_burst_mpw`): the Ethernet segment's `mss`
/// is every packet's length (its offloads apply to each; no inline
/// headers); then either data segments whose bytes, taken in order, make
/// packets of that length (one each, or one packet over several), or one
/// inline data segment holding the packets back to back. At most
/// `MPW_DSEG_MAX` packets or data segments; bytes that do not make whole
/// packets are a length error.
fn legacy_mpw(rdma: &Rdma, sq: &EthSq, mem: &IovaMemory, w: &[u8]) -> Outcome {
    let (eth, insert) = match multi_packet_eth_seg(sq, w) {
        Ok(e) => e,
        Err(o) => return o,
    };
    let ctrl = wqe_ctrl_seg::SIZE_BYTES;
    let cs_flags = wqe_eth_seg::CS_FLAGS.get(eth) as u8;
    let len = wqe_eth_seg::MSS.get(eth) as usize;
    if len < ETH_HLEN || len as u64 > MAX_FRAME {
        return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
    }
    let segs = &w[ctrl + wqe_eth_seg::SIZE_BYTES..];
    let mut bytes = Vec::new();
    let bc = segs
        .get(..4)
        .map_or(0, |b| wqe_data_seg::BYTE_COUNT.get(b) as u32);
    if bc & INLINE_SEG != 0 {
        let n = (bc & !INLINE_SEG) as usize;
        let Some(data) = segs.get(4..4 + n) else {
            return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
        };
        bytes.extend_from_slice(data);
    } else {
        let ds = segs.chunks_exact(wqe_data_seg::SIZE_BYTES);
        if ds.len() > MPW_DSEG_MAX {
            return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
        }
        let mut ext = Vec::new();
        let limit = (MPW_DSEG_MAX * len) as u64;
        for d in ds {
            if let Err(e) = gather(rdma, sq, mem, d, limit, &mut bytes, &mut ext) {
                return e;
            }
        }
    }
    if bytes.is_empty() || bytes.len() % len != 0 || bytes.len() / len > MPW_DSEG_MAX {
        return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
    }
    let (mut sent, mut frames) = (0, 0);
    for p in bytes.chunks_exact(len) {
        sent += leave(rdma, sq, &mut p.to_vec(), cs_flags, insert);
        frames += 1;
    }
    Outcome::Done(sent, frames)
}
