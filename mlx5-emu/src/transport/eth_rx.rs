//! Raw Ethernet on the port: frames an SQ sends ([`super::eth_sq`]) leave
//! on the cable ([`transmit`]) to every other function cabled to it, and
//! a function's port takes each one in ([`receive`]): NIC RX steering
//! ([`super::steer`]) picks RQs, and each RQ scatters the frame into its
//! next receive WQE and completes it with a responder CQE (byte count, L3
//! and L4 header types, checksums good, VLAN, the RSS hash and its type).
//!
//! RoCE shares the port: RoCEv2 packets take the transport's own path by
//! QP number ([`crate::fabric::transmit`]), raw frames this one; what the
//! two carry is counted in the same port counters.
//!
//! An RQ ([`EthRq`], CREATE_RQ with its own ring, fw/rq.rs) is a cyclic
//! ring or a linked list of receive WQEs (a linked list starts each WQE
//! with the next-WQE segment and follows its `next_wqe_index`), its
//! producer counter in the first word of its doorbell record
//! (`MLX5_RCV_DBR`). A WQE is data segments, ended early by the
//! terminating lkey. A frame that finds the RQ in another state than RDY
//! is dropped; one that finds no WQE posted is dropped and counted as
//! `out_of_buffer` in the RQ's Q counter set; one longer than the WQE's
//! buffers, or whose key does not grant the local write, completes with
//! an error CQE and moves the RQ to ERR.
//!
//! A striding RQ (multi-packet WQEs, mlx5e's and DPDK's MPRQ) has WQEs of a
//! next-WQE segment and one data segment whose buffer is 2^n strides of
//! 2^s bytes ([`Striding`]): each frame lands at the next free stride of
//! the head WQE (two bytes in with `two_byte_shift_en`), taking as many
//! strides as it needs, and its CQE names the WQE (`wqe_id`), the
//! first stride (`wqe_counter`: Linux's `mpwrq_get_cqe_stride_index`,
//! DPDK's `strd_idx`) and the strides consumed with the byte count
//! (`byte_cnt`: consumed << 16 | bytes). A frame that does not fit in the
//! WQE's remaining strides ends the WQE with a filler CQE (the rest of its
//! strides, `MPWRQ_CQE_FILLER`) and goes to the next; one larger than a
//! whole WQE is a length error. The WQE counts as consumed once its
//! strides are.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use mlx5_hw::cqe::{CqeOpcode, CqeSyndrome};
use mlx5_hw::eth::{
    CQE_L2_OK, CQE_L3_HDR_TYPE_IPV4, CQE_L3_HDR_TYPE_IPV6, CQE_L3_HDR_TYPE_SHIFT, CQE_L3_OK,
    CQE_L4_HDR_TYPE_SHIFT, CQE_L4_HDR_TYPE_TCP_ACK_AND_DATA, CQE_L4_HDR_TYPE_TCP_NO_ACK,
    CQE_L4_HDR_TYPE_UDP, CQE_L4_OK, CQE_RSS_IPV4, CQE_RSS_IPV6, CQE_RSS_TCP, CQE_RSS_UDP,
    CQE_RX_OUTER_IPV6, CQE_RX_TUNNEL_PACKET, CQE_VLAN_PRESENT, MPWRQ_CQE_FILLER,
    MPWRQ_CQE_STRIDES_SHIFT, QUEUE_STATE_RDY,
};
use mlx5_hw::ifc::wqe_data_seg;
use mlx5_hw::wqe::TERMINATE_SCATTER_LIST_LKEY;
use vfio::IovaMemory;

use super::cq::{Completion, EthCqe};
use super::cqe_comp::Sequel;
use super::lro;
use super::mem::{self, access};
use super::qp::Buf;
use super::requester::{key_error, vendor};
use super::steer::{Delivery, Looped, Parsed, Plan, ETH_HLEN};
use super::{rlock, Cq, Rdma, Table};
use crate::lock;

/// Bytes of the next-WQE segment a linked-list receive WQE starts with
/// (`struct mlx5_wqe_srq_next_seg`).
const NEXT_SEG: usize = mlx5_hw::ifc::wqe_srq_next_seg::SIZE_BYTES;

/// log2 of the largest receive WQE read (a page of data segments).
const MAX_LOG_STRIDE: u8 = 12;

/// A function's raw Ethernet receive side.
#[derive(Debug, Default)]
pub(crate) struct EthRx {
    /// RQs with their own rings, by RQ number.
    pub rqs: RwLock<Table<EthRq>>,
    /// NIC RX steering as the last command left it.
    pub plan: RwLock<Arc<Plan>>,
    /// Flow counters: packets and octets, by counter id.
    pub flow_counts: Mutex<HashMap<u32, [u64; 2]>>,
    /// The vport's local loopback as its NIC vport context sets it.
    pub local_lb: LocalLb,
    /// The plan has a NIC TX root or a transmit sniffer root: sent
    /// frames are matched there first (the flag read per frame, the plan
    /// only when set).
    pub egress: AtomicBool,
    /// LRO sessions open on its RQs (counted under each RQ's ring lock:
    /// opened +1, closed or dropped -1; [`EthRx::flush_lro`]).
    pub lro_open: AtomicU32,
}

/// The NIC vport context's `disable_uc_local_lb` and `disable_mc_local_lb`
/// (MODIFY_NIC_VPORT_CONTEXT, where the card announces
/// `disable_local_lb_uc`/`_mc`): whether the e-switch hands a frame the
/// function sends back to its own NIC RX. Both clear (loopback on) after
/// reset; Linux's mlx5_core sets both at load
/// (`mlx5_core_set_hca_defaults`) and mlx5_ib clears them while a second
/// user transport domain or a self-loopback raw packet QP exists
/// (`mlx5_ib_enable_lb`).
#[derive(Debug, Default)]
pub(crate) struct LocalLb {
    /// `disable_uc_local_lb`.
    pub uc_disabled: AtomicBool,
    /// The function's permanent MAC (48 bits), set once when it is made.
    pub permanent: AtomicU64,
    /// The MACs of the L2 table (SET_L2_TABLE_ENTRY: mlx5e's unicast
    /// addresses), which the vport answers to beside its permanent one.
    pub l2: RwLock<Vec<u64>>,
    /// `disable_mc_local_lb`.
    pub mc_disabled: AtomicBool,
}

impl EthRx {
    /// Forgets everything (teardown, FLR).
    pub(crate) fn reset(&self) {
        super::wlock(&self.rqs).clear();
        *super::wlock(&self.plan) = Arc::default();
        lock(&self.flow_counts).clear();
        self.lro_open.store(0, Ordering::Release);
        self.egress.store(false, Ordering::Release);
        self.local_lb.uc_disabled.store(false, Ordering::Relaxed);
        super::wlock(&self.local_lb.l2).clear();
        self.local_lb.mc_disabled.store(false, Ordering::Relaxed);
    }

    /// Ends the LRO sessions no segment joined since the last call (one
    /// pass of the function's data path), those a local burst fed
    /// excepted; or, `burst_end`, the sessions that sender's burst fed
    /// (its burst ended). Whether any stays open (the worker stays awake
    /// for it).
    pub(crate) fn flush_lro(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        burst_end: Option<lro::Sender>,
    ) -> bool {
        if self.lro_open.load(Ordering::Acquire) == 0 {
            return false;
        }
        let rqs: Vec<Arc<EthRq>> = super::rlock(&self.rqs).values().cloned().collect();
        let mut open = false;
        for rq in rqs {
            open |= rq.flush_lro(rdma, mem, burst_end);
        }
        open
    }

    /// Packets and octets counter `id` counted (0 when never).
    pub(crate) fn flow_count(&self, id: u32) -> [u64; 2] {
        lock(&self.flow_counts)
            .get(&id)
            .copied()
            .unwrap_or_default()
    }

    /// Zeroes counters `id..id + n`.
    pub(crate) fn clear_flow_counts(&self, id: u32, n: u32) {
        lock(&self.flow_counts).retain(|k, _| !(id..id + n).contains(k));
    }
}

/// One receive queue the data path fills.
#[derive(Debug)]
pub(crate) struct EthRq {
    pub rqn: u32,
    /// What its CQEs carry in `srqn_uidx`: `rqc.user_index` under
    /// cqe_version 1, else 0. (A receive CQE's `sop_drop_qpn` carries the
    /// flow tag of the steering entry that chose the RQ:
    /// [`super::steer::Delivery::flow_tag`], mlx5e's `skb->mark`.)
    pub user_index: u32,
    pub cq: Arc<Cq>,
    /// The PD its data segments' keys must belong to (wq.pd).
    pub pd: u32,
    pub log_size: u8,
    /// log2 of a WQE's bytes (wq.log_wq_stride).
    pub log_stride: u8,
    pub linked_list: bool,
    /// Multi-packet WQEs (a striding RQ), else `None`.
    pub striding: Option<Striding>,
    pub buf: Buf,
    pub dbr: u64,
    /// The Q counter set it counts into (0: none readable).
    pub counter_set: std::sync::atomic::AtomicU32,
    /// VLAN stripping disabled (`rqc.vsd`): a tagged frame lands whole and
    /// its CQE says nothing of the tag. Enabled (0, what the profiles'
    /// `vlan_cap` offers): the C-VLAN tag leaves the frame and rides in
    /// the CQE (`vlan_info`, the VLAN bit of `l4_l3_hdr_type`), the byte
    /// count without it, as mlx5e's `cqe_has_vlan` expects.
    pub vsd: AtomicBool,
    /// `QUEUE_STATE_*`, moved by MODIFY_RQ and by an error CQE.
    pub state: AtomicU8,
    pub ring: Mutex<RqRing>,
}

/// A striding RQ's WQE geometry (`wq.log_wqe_num_of_strides`,
/// `log_wqe_stride_size`, `two_byte_shift_en`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Striding {
    /// log2 of the strides in a WQE.
    pub log_num: u8,
    /// log2 of a stride's bytes.
    pub log_size: u8,
    /// Each frame lands two bytes into its first stride (IP alignment).
    pub shift2: bool,
}

/// Where an RQ's ring stands.
#[derive(Debug, Default)]
pub(crate) struct RqRing {
    /// WQEs consumed (compared with the producer counter).
    pub consumed: u16,
    /// The index of the next WQE (a linked list follows its links).
    pub head: u16,
    /// A striding RQ: the head WQE's next free stride.
    pub stride: u32,
    /// An open LRO session at that stride ([`lro`]).
    pub lro: Option<lro::Session>,
}

impl EthRq {
    /// Back to RST: the ring restarts at 0 (an open LRO session is
    /// dropped uncompleted, as the WQE it was filling).
    pub(crate) fn reset(&self, rx: &EthRx) {
        let mut r = lock(&self.ring);
        if r.lro.take().is_some() {
            rx.lro_open.fetch_sub(1, Ordering::AcqRel);
        }
        *r = RqRing::default();
    }

    /// Takes `frame` into the next WQE and completes it.
    fn deliver(&self, rdma: &Rdma, mem: &IovaMemory, frame: &[u8], p: &Parsed, d: Delivery) {
        if u64::from(self.state.load(Ordering::Acquire)) != QUEUE_STATE_RDY {
            rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(rqn = self.rqn, "RQ not ready: dropped");
            return;
        }
        // With stripping on (`vsd` clear), a C-VLAN tag leaves the frame
        // for the CQE.
        let stripped;
        let (frame, vlan) = match p.vlan {
            Some(tci) if !self.vsd.load(Ordering::Relaxed) => {
                stripped = strip_vlan(frame);
                (&stripped[..], Some(tci))
            }
            _ => (frame, None),
        };
        if let Some(st) = self.striding {
            return self.deliver_striding(rdma, mem, frame, vlan, p, d, st);
        }
        let mut ring = lock(&self.ring);
        let pi = mem::load_be32(mem, self.dbr).map_or(ring.consumed, |v| v as u16);
        if pi == ring.consumed {
            drop(ring);
            return self.out_of_buffer(rdma);
        }
        let at = ring.head;
        let c = match self.scatter(rdma, mem, at, frame) {
            Ok(next) => {
                ring.head = next;
                Completion {
                    opcode: CqeOpcode::RespSend.to_raw(),
                    qpn: d.flow_tag,
                    srqn: self.user_index,
                    wqe_counter: at,
                    byte_cnt: frame.len() as u32,
                    l3: hdr_types(p, &d, vlan),
                    eth: Some(eth_cqe(p, d, vlan, frame)),
                    ..Completion::default()
                }
            }
            Err((synd, vendor)) => {
                tracing::debug!(rqn = self.rqn, at, vendor, "RQ WQE failed");
                self.state
                    .store(mlx5_hw::eth::QUEUE_STATE_ERR as u8, Ordering::Release);
                rdma.counters.error_cqes.fetch_add(1, Ordering::Relaxed);
                Completion {
                    opcode: CqeOpcode::RespErr.to_raw(),
                    qpn: self.rqn,
                    srqn: self.user_index,
                    wqe_counter: at,
                    error: Some((synd.to_raw(), vendor)),
                    ..Completion::default()
                }
            }
        };
        ring.consumed = ring.consumed.wrapping_add(1);
        drop(ring);
        self.cq.push_rx(rdma, mem, &c, self.sequel(), d.burst);
    }

    /// Counts a frame that found no WQE posted (the Q counter set's
    /// `out_of_buffer`) and drops it.
    fn out_of_buffer(&self, rdma: &Rdma) {
        let id = self.counter_set.load(Ordering::Relaxed);
        tracing::trace!(rqn = self.rqn, counter_set = id, "no WQE posted: dropped");
        if let Some(s) = lock(&rdma.q_counters).get(&id) {
            s.out_of_buffer.fetch_add(1, Ordering::Relaxed);
        }
        rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// A striding RQ takes `frame` (module docs; `vlan`: the tag stripped
    /// from it): at the head WQE's next free stride, or, where it does not
    /// fit, after a filler CQE in the next WQE.
    #[allow(clippy::too_many_arguments)]
    fn deliver_striding(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        frame: &[u8],
        vlan: Option<u16>,
        p: &Parsed,
        d: Delivery,
        st: Striding,
    ) {
        let total = 1u32 << st.log_num;
        let lead = if st.shift2 { 2 } else { 0 };
        let need = (frame.len() as u64 + lead).div_ceil(1 << st.log_size) as u32;
        let mut cqes = Vec::with_capacity(2);
        let mut ring = lock(&self.ring);
        // A TCP segment its TIR lets the device merge (LRO).
        let seg = d
            .lro
            .and_then(|cfg| lro::segment(frame, p, cfg).map(|s| (s, cfg)));
        if let Some(mut sess) = ring.lro.take() {
            let used = lead + u64::from(sess.bytes);
            let room = (u64::from(total - sess.first) << st.log_size).saturating_sub(used);
            match &seg {
                Some((s, _)) if sess.takes(s, room) => {
                    let data = &frame[s.payload()];
                    if self
                        .place(rdma, mem, sess.at, sess.first, used, data, st)
                        .is_ok()
                    {
                        sess.join(s, frame, d.burst);
                        if d.burst.is_some() {
                            note_held();
                        }
                        if sess.ended() {
                            self.close_lro(rdma, mem, &mut ring, &sess, st, &mut cqes);
                        } else {
                            ring.lro = Some(sess);
                        }
                        drop(ring);
                        return self.push_all(rdma, mem, &cqes, d.burst);
                    }
                    // What was merged completes; the frame goes on alone
                    // (and fails there as it would have).
                    self.close_lro(rdma, mem, &mut ring, &sess, st, &mut cqes);
                }
                _ => self.close_lro(rdma, mem, &mut ring, &sess, st, &mut cqes),
            }
        }
        let pi = mem::load_be32(mem, self.dbr).map_or(ring.consumed, |v| v as u16);
        if pi == ring.consumed {
            drop(ring);
            self.push_all(rdma, mem, &cqes, d.burst);
            return self.out_of_buffer(rdma);
        }
        if need > total || frame.len() > 0xffff {
            let at = ring.head;
            self.fail_wqe(
                rdma,
                &mut ring,
                at,
                (CqeSyndrome::LocalLengthErr, vendor::LENGTH),
                &mut cqes,
            );
        } else {
            if need > total - ring.stride {
                // The rest of this WQE is skipped: a filler CQE, then the
                // next WQE (if one is posted).
                let (at, first) = (ring.head, ring.stride);
                let left = total - first;
                cqes.push(Completion {
                    opcode: CqeOpcode::RespSend.to_raw(),
                    qpn: d.flow_tag,
                    srqn: self.user_index,
                    wqe_counter: first as u16,
                    wqe_id: at,
                    byte_cnt: MPWRQ_CQE_FILLER | left << MPWRQ_CQE_STRIDES_SHIFT,
                    ..Completion::default()
                });
                self.next_wqe(mem, &mut ring);
            }
            if pi == ring.consumed {
                drop(ring);
                self.push_all(rdma, mem, &cqes, d.burst);
                return self.out_of_buffer(rdma);
            }
            let (at, first) = (ring.head, ring.stride);
            match self.place(rdma, mem, at, first, lead, frame, st) {
                Ok(()) => {
                    let c = Completion {
                        opcode: CqeOpcode::RespSend.to_raw(),
                        qpn: d.flow_tag,
                        srqn: self.user_index,
                        wqe_counter: first as u16,
                        wqe_id: at,
                        byte_cnt: need << MPWRQ_CQE_STRIDES_SHIFT | frame.len() as u32,
                        l3: hdr_types(p, &d, vlan),
                        eth: Some(eth_cqe(p, d, vlan, frame)),
                        ..Completion::default()
                    };
                    match seg {
                        // A session opens on it; its CQE waits.
                        Some((s, cfg)) if !s.psh => {
                            ring.lro = Some(lro::Session::start(
                                &s,
                                frame,
                                cfg,
                                at,
                                first,
                                c,
                                d.burst,
                                rdma.clock.now(),
                            ));
                            if d.burst.is_some() {
                                note_held();
                            }
                            rdma.eth_rx.lro_open.fetch_add(1, Ordering::AcqRel);
                        }
                        _ => {
                            cqes.push(c);
                            ring.stride = first + need;
                            if ring.stride == total {
                                self.next_wqe(mem, &mut ring);
                            }
                        }
                    }
                }
                Err(e) => self.fail_wqe(rdma, &mut ring, at, e, &mut cqes),
            }
        }
        drop(ring);
        self.push_all(rdma, mem, &cqes, d.burst);
    }

    /// LRO session `sess` ends: its CQE, and the strides it took.
    fn close_lro(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        ring: &mut RqRing,
        sess: &lro::Session,
        st: Striding,
        cqes: &mut Vec<Completion>,
    ) {
        rdma.eth_rx.lro_open.fetch_sub(1, Ordering::AcqRel);
        let lead = if st.shift2 { 2 } else { 0 };
        let strides = (lead + u64::from(sess.bytes)).div_ceil(1 << st.log_size) as u32;
        cqes.push(sess.completion(strides));
        ring.stride = sess.first + strides;
        if ring.stride >= 1 << st.log_num {
            self.next_wqe(mem, ring);
        }
    }

    /// Ends this RQ's LRO session if no segment joined it since the last
    /// call (the device's LRO timeout, counted in passes of the
    /// function's data path); whether one stays open.
    /// `burst_end`: a local sender's burst ended, and the session it fed
    /// closes now.
    fn flush_lro(&self, rdma: &Rdma, mem: &IovaMemory, burst_end: Option<lro::Sender>) -> bool {
        let Some(st) = self.striding else {
            return false;
        };
        let mut ring = lock(&self.ring);
        let Some(sess) = ring.lro.as_mut() else {
            return false;
        };
        if !sess.closes(burst_end, || rdma.clock.now()) {
            return true;
        }
        let mut cqes = Vec::with_capacity(1);
        if let Some(sess) = ring.lro.take() {
            self.close_lro(rdma, mem, &mut ring, &sess, st, &mut cqes);
        }
        drop(ring);
        self.push_all(rdma, mem, &cqes, None);
        false
    }

    /// The head WQE is used up: the ring moves to the next one.
    fn next_wqe(&self, mem: &IovaMemory, ring: &mut RqRing) {
        let at = ring.head;
        ring.head = if self.linked_list {
            let mask = (1u32 << self.log_size) - 1;
            self.buf
                .addr(u64::from(u32::from(at) & mask) << self.log_stride)
                .and_then(|a| mem::load_be32(mem, a).ok())
                .map_or(at.wrapping_add(1), |w| {
                    mlx5_hw::ifc::wqe_srq_next_seg::NEXT_WQE_INDEX.get(&w.to_be_bytes()) as u16
                })
        } else {
            at.wrapping_add(1)
        };
        ring.consumed = ring.consumed.wrapping_add(1);
        ring.stride = 0;
    }

    /// WQE `at` failed with `e`: an error CQE (naming the WQE in both
    /// `wqe_counter`, as an error CQE does, and `wqe_id`, where mlx5e's
    /// striding RQ looks for it) and the RQ to ERR.
    fn fail_wqe(
        &self,
        rdma: &Rdma,
        ring: &mut RqRing,
        at: u16,
        e: (CqeSyndrome, u8),
        cqes: &mut Vec<Completion>,
    ) {
        tracing::debug!(rqn = self.rqn, at, vendor = e.1, "RQ WQE failed");
        self.state
            .store(mlx5_hw::eth::QUEUE_STATE_ERR as u8, Ordering::Release);
        rdma.counters.error_cqes.fetch_add(1, Ordering::Relaxed);
        ring.consumed = ring.consumed.wrapping_add(1);
        cqes.push(Completion {
            opcode: CqeOpcode::RespErr.to_raw(),
            qpn: self.rqn,
            srqn: self.user_index,
            wqe_counter: at,
            wqe_id: at,
            error: Some((e.0.to_raw(), e.1)),
            ..Completion::default()
        });
    }

    /// How the reader of a compressed session works out this RQ's WQE
    /// counters ([`super::cqe_comp`]); none for a linked list, whose next
    /// WQE its link names.
    fn sequel(&self) -> Option<Sequel> {
        if self.striding.is_some() {
            Some(Sequel::Striding)
        } else if self.linked_list {
            None
        } else {
            Some(Sequel::Cyclic)
        }
    }

    /// Completes `cqes` in order (`held`: the burst that delivered them).
    fn push_all(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        cqes: &[Completion],
        held: Option<lro::Sender>,
    ) {
        for c in cqes {
            if !self.cq.push_rx(rdma, mem, c, self.sequel(), held) {
                break;
            }
        }
    }

    /// Writes `frame` into strides `first..` of striding WQE `at` (`lead`
    /// bytes in): the WQE's data segment, read through its key, which must
    /// grant the local write over the whole stride range it covers.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        at: u16,
        first: u32,
        lead: u64,
        frame: &[u8],
        st: Striding,
    ) -> Result<(), (CqeSyndrome, u8)> {
        let mask = (1u32 << self.log_size) - 1;
        let fault = (CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT);
        let addr = self
            .buf
            .addr(u64::from(u32::from(at) & mask) << self.log_stride)
            .ok_or(fault)?;
        let mut seg = [0u8; NEXT_SEG + wqe_data_seg::SIZE_BYTES];
        mem::read(mem, addr, &mut seg).map_err(|_| fault)?;
        let s = &seg[NEXT_SEG..];
        let span = (1u64 << st.log_num) << st.log_size;
        if (wqe_data_seg::BYTE_COUNT.get(s)) < span {
            return Err((CqeSyndrome::LocalLengthErr, vendor::LENGTH));
        }
        let key = wqe_data_seg::LKEY.get(s) as u32;
        let k = rdma
            .mkey(key)
            .ok_or((CqeSyndrome::LocalProtErr, vendor::BAD_LKEY))?;
        let start = wqe_data_seg::ADDR.get(s) + (u64::from(first) << st.log_size) + lead;
        let mut ext = Vec::new();
        k.resolve(self.pd, access::LW, start, frame.len() as u64, &mut ext)
            .map_err(|e| (CqeSyndrome::LocalProtErr, key_error(e)))?;
        crate::fabric::Payload::Bytes(frame)
            .copy_to(mem, &ext, 0)
            .map_err(|_| (CqeSyndrome::LocalProtErr, vendor::NO_ACCESS))
    }

    /// Scatters `frame` into WQE `at`; the index of the WQE after it.
    fn scatter(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        at: u16,
        frame: &[u8],
    ) -> Result<u16, (CqeSyndrome, u8)> {
        let mask = (1u32 << self.log_size) - 1;
        let fault = (CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT);
        // A receive WQE is at most a page of data segments.
        if self.log_stride > MAX_LOG_STRIDE {
            return Err(fault);
        }
        let size = 1usize << self.log_stride;
        let addr = self
            .buf
            .addr(u64::from(u32::from(at) & mask) << self.log_stride)
            .ok_or(fault)?;
        let mut wqe = vec![0u8; size];
        mem::read(mem, addr, &mut wqe).map_err(|_| fault)?;
        let (next, segs) = if self.linked_list {
            let n = mlx5_hw::ifc::wqe_srq_next_seg::NEXT_WQE_INDEX.get(&wqe) as u16;
            (n, wqe.get(NEXT_SEG..).unwrap_or_default())
        } else {
            (at.wrapping_add(1), &wqe[..])
        };
        let mut off = 0usize;
        let mut ext = Vec::new();
        for s in segs.chunks_exact(wqe_data_seg::SIZE_BYTES) {
            let key = wqe_data_seg::LKEY.get(s) as u32;
            if off == frame.len() || key == TERMINATE_SCATTER_LIST_LKEY {
                break;
            }
            let n = (wqe_data_seg::BYTE_COUNT.get(s) as usize).min(frame.len() - off);
            if n == 0 {
                continue;
            }
            let k = rdma
                .mkey(key)
                .ok_or((CqeSyndrome::LocalProtErr, vendor::BAD_LKEY))?;
            ext.clear();
            k.resolve(
                self.pd,
                access::LW,
                wqe_data_seg::ADDR.get(s),
                n as u64,
                &mut ext,
            )
            .map_err(|e| (CqeSyndrome::LocalProtErr, key_error(e)))?;
            crate::fabric::Payload::Bytes(&frame[off..off + n])
                .copy_to(mem, &ext, 0)
                .map_err(|_| (CqeSyndrome::LocalProtErr, vendor::NO_ACCESS))?;
            off += n;
        }
        if off < frame.len() {
            return Err((CqeSyndrome::LocalLengthErr, vendor::LENGTH));
        }
        Ok(next)
    }
}

/// `frame` without its 802.1Q tag (the 4 bytes after the MAC addresses).
fn strip_vlan(frame: &[u8]) -> Vec<u8> {
    use super::packet::{ETH_ADDRS_LEN, VLAN_HLEN};
    let mut f = Vec::with_capacity(frame.len().saturating_sub(VLAN_HLEN));
    f.extend_from_slice(&frame[..ETH_ADDRS_LEN]);
    f.extend_from_slice(frame.get(ETH_ADDRS_LEN + VLAN_HLEN..).unwrap_or_default());
    f
}

/// The CQE's `l4_l3_hdr_type` byte for `p` delivered as `d` (a tunnelled
/// packet's inner L3 and L4 types); `vlan`: the tag stripped.
fn hdr_types(p: &Parsed, d: &Delivery, vlan: Option<u16>) -> u8 {
    let (flow, tcp_ack) = match (&p.inner, d.tunneled) {
        (Some(i), true) => (&i.flow, i.tcp_ack),
        _ => (&p.flow, p.tcp_ack),
    };
    let l3 = match flow.ipv6 {
        Some(false) => CQE_L3_HDR_TYPE_IPV4,
        Some(true) => CQE_L3_HDR_TYPE_IPV6,
        None => 0,
    };
    let l4 = match flow.udp {
        Some(true) => CQE_L4_HDR_TYPE_UDP,
        Some(false) if tcp_ack => CQE_L4_HDR_TYPE_TCP_ACK_AND_DATA,
        Some(false) => CQE_L4_HDR_TYPE_TCP_NO_ACK,
        None => 0,
    };
    l4 << CQE_L4_HDR_TYPE_SHIFT
        | l3 << CQE_L3_HDR_TYPE_SHIFT
        | if vlan.is_some() { CQE_VLAN_PRESENT } else { 0 }
}

/// The Ethernet part of the CQE: checksums, RSS, the VLAN tag stripped.
/// A tunnelled packet delivered as one ([`Delivery::tunneled`]) is marked
/// so (and whether its outer L3 header is IPv6); its L3 and L4 bits then
/// say that its inner headers' checksums are good and its outer ones too
/// (the outer IPv4 header's, a VXLAN datagram's UDP checksum if it sent
/// one), which is what mlx5e's CHECKSUM_UNNECESSARY at `csum_level` 1
/// takes them for.
fn eth_cqe(p: &Parsed, d: Delivery, vlan: Option<u16>, frame: &[u8]) -> EthCqe {
    let mut ok = CQE_L2_OK;
    let mut tunneled = 0;
    let (ip, l4, l3_ok, l4_ok) = match (&p.inner, d.tunneled) {
        (Some(i), true) => {
            tunneled = CQE_RX_TUNNEL_PACKET;
            if p.flow.ipv6 == Some(true) {
                tunneled |= CQE_RX_OUTER_IPV6;
            }
            let outer_ok = p.l3_ok && (p.flow.udp.is_none() || p.l4_ok);
            (
                i.flow.ipv6.is_some(),
                i.flow.udp.is_some(),
                outer_ok && i.l3_ok,
                outer_ok && i.l3_ok && i.l4_ok,
            )
        }
        _ => (
            p.flow.ipv6.is_some(),
            p.flow.udp.is_some(),
            p.l3_ok,
            p.l4_ok,
        ),
    };
    if ip && l3_ok {
        ok |= CQE_L3_OK;
    }
    if l4 && l4_ok {
        ok |= CQE_L4_OK;
    }
    let hashed = match (&p.inner, d.hashed_inner) {
        (Some(i), true) => &i.flow,
        _ => &p.flow,
    };
    let mut ht = 0;
    if d.hashed {
        ht |= match hashed.ipv6 {
            Some(false) => CQE_RSS_IPV4,
            Some(true) => CQE_RSS_IPV6,
            None => 0,
        };
        ht |= match hashed.udp {
            Some(true) => CQE_RSS_UDP,
            Some(false) => CQE_RSS_TCP,
            None => 0,
        };
    }
    EthCqe {
        hds_ip_ext: ok,
        rss_hash_type: ht,
        rss_hash_result: d.hash,
        vlan_info: vlan.unwrap_or(0),
        check_sum: l3_sum(frame),
        tunneled,
    }
}

/// The CQE's `check_sum` of a frame as it lands: the one's-complement sum
/// (folded, not inverted) of its bytes from the IP header to its end,
/// past any VLAN tags left in it (mlx5e hands it to the stack as
/// CHECKSUM_COMPLETE, adding a left tag's bytes and taking off tail
/// padding itself: `mlx5e_skb_csum_fixup`); 0 for a frame that is not IP.
fn l3_sum(frame: &[u8]) -> u16 {
    use super::packet::{ETH_ADDRS_LEN, VLAN_HLEN};
    use super::steer::{ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6};
    let mut at = ETH_ADDRS_LEN;
    while let Some(t) = frame.get(at..at + 2) {
        match u16::from_be_bytes([t[0], t[1]]) {
            ETH_P_8021Q | ETH_P_8021AD => at += VLAN_HLEN,
            ETH_P_IP | ETH_P_IPV6 => return super::steer::csum_fold(&frame[at + 2..], 0),
            _ => return 0,
        }
    }
    0
}

/// Sends `frame` from `src`'s port (an SQ of transport domain `td`) onto
/// its cable: every other function there takes it in, and the link to
/// another process carries it ([`crate::wire`]). Neither: the frame is
/// lost at the port. Its own port may take it back ([`loop_back`]).
pub(crate) fn transmit(src: &Rdma, frame: &[u8], td: Option<u32>) {
    loop_back(src, frame, td);
    let wire = crate::fabric::wire_of(src);
    let peers = wire.as_ref().map(|w| w.peers(src)).unwrap_or_default();
    let link = wire.and_then(|w| w.link());
    if peers.is_empty() && link.is_none() {
        src.counters.dropped.fetch_add(1, Ordering::Relaxed);
    }
    let me = Some(lro::Sender::of(src));
    for dst in peers {
        receive_from(&dst, frame, None, me);
    }
    if let Some(l) = link {
        l.send_frame(frame.to_vec());
    }
}

/// The vport's local loopback: a frame the function sends to a multicast
/// or broadcast address comes back to its own NIC RX as well (the
/// e-switch delivers it to the vport as to any other) unless the vport
/// context's `disable_mc_local_lb` is set, and one to a unicast address
/// of its own (its permanent MAC or one of its L2 table) unless
/// `disable_uc_local_lb` is ([`LocalLb`]; the frame still goes to the
/// cable too). There a TIR of the sending SQ's transport domain refuses it
/// if its `self_lb_block` covers the kind (mlx5e's TIRs block both, so a
/// netdev never hears itself; a raw packet QP's TIR of another context
/// takes what a first context sends, as rdma-core's flow tests expect,
/// mlx5_ib having turned the loopback on for the second context).
/// A copy no RQ takes is not counted.
fn loop_back(src: &Rdma, frame: &[u8], td: Option<u32>) {
    let Some(dmac) = frame.get(..6) else {
        return;
    };
    let multicast = dmac[0] & 1 != 0;
    let lb = &src.eth_rx.local_lb;
    let back = if multicast {
        !lb.mc_disabled.load(Ordering::Relaxed)
    } else {
        !lb.uc_disabled.load(Ordering::Relaxed) && {
            let mut m = [0u8; 8];
            m[2..].copy_from_slice(dmac);
            let mac = u64::from_be_bytes(m);
            lb.permanent.load(Ordering::Relaxed) == mac || rlock(&lb.l2).contains(&mac)
        }
    };
    if back {
        receive_from(
            src,
            frame,
            Some(Looped { td, multicast }),
            Some(lro::Sender::of(src)),
        );
    }
}

/// `dst`'s port takes in `frame`: steering, then each RQ it picked.
pub(crate) fn receive(dst: &Rdma, frame: &[u8]) {
    receive_from(dst, frame, None, None);
}

thread_local! {
    /// A local SQ's burst on this thread fed an LRO session or a CQE
    /// compression session (frames are delivered on the sender's
    /// thread): only then does its end look for sessions to close.
    static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A session was opened or joined by a frame of this thread's burst.
pub(crate) fn note_held() {
    HELD.with(|f| f.set(true));
}

/// Whether this thread's burst fed a session since the last call.
fn take_held() -> bool {
    HELD.with(|f| f.replace(false))
}

/// A local SQ's burst ended: the LRO sessions ([`super::lro`]) and CQE
/// compression sessions ([`super::cqe_comp`]) its frames fed on the ports
/// it reaches (its cable's other functions, its own by loopback) close.
pub(crate) fn end_burst(src: &Rdma) {
    // Most bursts fed no session: nothing to look up.
    if !take_held() {
        return;
    }
    let wire = crate::fabric::wire_of(src);
    let peers = wire.as_ref().map(|w| w.peers(src)).unwrap_or_default();
    let me = Some(lro::Sender::of(src));
    for dst in peers.iter().map(|d| &**d).chain([src]) {
        flush_held(dst, &dst.dma.memory(), me);
    }
}

/// Closes `dst`'s sessions that `burst_end`'s burst fed, or (`None`) those
/// idle since the last pass of its data path: LRO sessions first (their
/// CQEs go to the CQs after what those hold), then CQE compression
/// sessions. Whether any stays open (the worker stays awake for it).
pub(crate) fn flush_held(dst: &Rdma, mem: &IovaMemory, burst_end: Option<lro::Sender>) -> bool {
    let mut open = dst.eth_rx.flush_lro(dst, mem, burst_end);
    if dst.cq_sessions.load(Ordering::Acquire) != 0 {
        let cqs: Vec<Arc<Cq>> = rlock(&dst.cqs).values().cloned().collect();
        for cq in cqs {
            open |= cq.flush_session(dst, mem, burst_end);
        }
    }
    open
}

/// One frame of `len` bytes counted into flow counters `ids` (packets and
/// octets) of `rdma`.
pub(crate) fn count_flows(rdma: &Rdma, ids: &[u32], len: usize) {
    if ids.is_empty() {
        return;
    }
    let mut fc = lock(&rdma.eth_rx.flow_counts);
    for id in ids {
        let e = fc.entry(*id).or_default();
        e[0] += 1;
        e[1] += len as u64;
    }
}

/// [`receive`] of a frame from the wire (`looped` none) or one the
/// function sent itself ([`loop_back`]); `burst`: a local SQ's burst sent
/// it, and which function's ([`end_burst`]).
fn receive_from(dst: &Rdma, frame: &[u8], looped: Option<Looped>, burst: Option<lro::Sender>) {
    let c = &dst.counters;
    if frame.len() < ETH_HLEN {
        if looped.is_none() {
            c.packets_received.fetch_add(1, Ordering::Relaxed);
            c.bytes_received
                .fetch_add(frame.len() as u64, Ordering::Relaxed);
            c.dropped.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    let plan = rlock(&dst.eth_rx.plan).clone();
    let p = super::steer::parse(frame, &plan.vxlan_ports);
    if plan.sniffing(false) {
        sniffed(dst, frame, &p, plan.sniff(&p, false));
    }
    let v = plan.steer(&p, looped);
    if looped.is_some() && v.to.is_empty() {
        return;
    }
    c.packets_received.fetch_add(1, Ordering::Relaxed);
    c.bytes_received
        .fetch_add(frame.len() as u64, Ordering::Relaxed);
    count_flows(dst, &v.counters, frame.len());
    if v.to.is_empty() {
        c.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(
            len = frame.len(),
            dmac = ?&frame[..6],
            ethertype = ?&frame[12..14],
            "no steering rule took the frame: dropped"
        );
        return;
    }
    deliver_all(dst, frame, &p, v.to, burst);
}

/// `frame` (parsed as `p`) into each RQ of `to`; `burst`: the local SQ's
/// burst that sent it.
fn deliver_all(
    dst: &Rdma,
    frame: &[u8],
    p: &super::steer::Parsed,
    to: Vec<super::steer::Delivery>,
    burst: Option<lro::Sender>,
) {
    let mem = dst.dma.memory();
    for mut d in to {
        d.burst = burst;
        let rq = rlock(&dst.eth_rx.rqs).get(&d.rqn).cloned();
        match rq {
            Some(rq) => rq.deliver(dst, &mem, frame, p, d),
            None => {
                dst.counters.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(rqn = d.rqn, "steered to no RQ: dropped");
            }
        }
    }
}

/// A sniffer's copy of `frame` (parsed as `p`) on `rdma`, as its sniffer
/// tables decided ([`super::steer::Plan::sniff`]): counted, and into the
/// RQs they name.
pub(crate) fn sniffed(
    rdma: &Rdma,
    frame: &[u8],
    p: &super::steer::Parsed,
    v: super::steer::Verdict,
) {
    count_flows(rdma, &v.counters, frame.len());
    deliver_all(rdma, frame, p, v.to, None);
}
