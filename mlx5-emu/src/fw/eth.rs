//! The Ethernet objects' tables and what their commands share: TISes
//! (fw/tis.rs), TIRs (fw/tir.rs), RQ tables (fw/rqt.rs), SQs (fw/sq.rs), RQs
//! (fw/rq.rs) and the VXLAN UDP ports (fw/vxlan.rs). Firmware keeps each
//! object's context as the driver gave it (QUERY_* returns it, with the
//! state firmware moved) and checks every number it names against the
//! other tables; the data path runs WQEs on SQs
//! ([`crate::transport::eth_sq`]) and receives into RQs on their own rings
//! ([`crate::transport::eth_rx`]) what NIC RX steering sends to TIRs.

use std::collections::BTreeMap;

use mlx5_hw::init::page_offset_bytes;
use mlx5_hw::status::CmdStatus;

use super::{fail, synd, Fail};
use crate::transport::qp::Buf;

/// One object: its context bytes as created (and modified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Obj {
    pub ctx: Vec<u8>,
}

/// The Ethernet objects of a function, by PRM number.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct EthObjects {
    pub tises: BTreeMap<u32, Obj>,
    pub tirs: BTreeMap<u32, Obj>,
    pub rqts: BTreeMap<u32, Obj>,
    pub sqs: BTreeMap<u32, Obj>,
    pub rqs: BTreeMap<u32, Obj>,
    /// UDP ports parsed as VXLAN (ADD_VXLAN_UDP_DPORT).
    pub vxlan_ports: std::collections::BTreeSet<u16>,
    /// The L2 (MPFS) table (fw/l2.rs): MAC and VLAN by table index.
    pub l2_table: BTreeMap<u32, super::l2::L2Entry>,
    /// The data-path counts QUERY_VPORT_COUNTER's `clear` last zeroed
    /// (frames sent, octets sent, frames received).
    pub vport_counter_base: [u64; 3],
    /// The same for PPCNT's `clr` (fw/reg.rs).
    pub ppcnt_base: [u64; 7],
}

impl EthObjects {
    /// Objects alive (a teardown counts them as leaked).
    pub fn objects(&self) -> usize {
        self.tises.len() + self.tirs.len() + self.rqts.len() + self.sqs.len() + self.rqs.len()
    }
}

/// The lowest free number in `first..limit`, or NO_RESOURCES with `synd`.
pub(crate) fn free_number<T>(
    t: &BTreeMap<u32, T>,
    first: u32,
    limit: u32,
    synd: u32,
) -> Result<u32, Fail> {
    (first..limit.max(first + 1))
        .find(|n| !t.contains_key(n))
        .ok_or(fail(CmdStatus::NoResources, synd))
}

/// `1 << log` capped at the 24-bit object-number space.
pub(crate) fn limit(log: u64) -> u32 {
    1u32 << log.clamp(1, 24)
}

/// The object `n` of `t`, or BAD_RESOURCE with `synd` (an unknown number).
pub(crate) fn known<T>(t: &BTreeMap<u32, T>, n: u32, synd: u32) -> Result<&T, Fail> {
    t.get(&n).ok_or(fail(CmdStatus::BadResource, synd))
}

/// The queue-state moves MODIFY_SQ and MODIFY_RQ take: RST->RDY, RST->RST,
/// RDY->RDY, RDY->ERR, RDY->RST, ERR->RST and ERR->RDY (mlx5e's recovery).
pub(crate) fn queue_transition(cur: u64, next: u64) -> Result<(), Fail> {
    use mlx5_hw::eth::{QUEUE_STATE_ERR as ERR, QUEUE_STATE_RDY as RDY, QUEUE_STATE_RST as RST};
    // RST to RST too: mlx5_ib moves a raw packet QP's SQ so at RST2INIT
    // (`modify_raw_packet_qp`: the RQ to RDY, the SQ to RST), which the
    // card accepts (rdma-core's test_flow runs on it).
    let ok = matches!(
        (cur, next),
        (RST, RDY) | (RST, RST) | (RDY, RDY) | (RDY, ERR) | (RDY, RST) | (ERR, RST) | (ERR, RDY)
    );
    if ok {
        Ok(())
    } else {
        Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_TRANSITION))
    }
}

/// Where a checked `wq`'s ring and doorbell record lie, and the UMEMs
/// they are in ([`super::Firmware::check_wq`]).
pub(super) struct WqMem {
    pub buf: Buf,
    pub dbr: u64,
    pub umems: Vec<u32>,
}

impl super::Firmware {
    /// The checks a `wq` (the ring of an SQ or RQ) passes at creation: its
    /// PD (0 or one allocated), size, the UAR page when `uar` (an SQ rings
    /// one), and where its ring and doorbell record lie: the pages right
    /// after the input's fixed part (`pas_at`) and `dbr_addr`, or (DevX, as
    /// DPDK's mlx5 PMD makes its queues) `wq_umem_id` at `wq_umem_offset`
    /// and `dbr_umem_id` at `dbr_addr`, each UMEM the command's uid may
    /// use and long enough.
    pub(super) fn check_wq(
        &self,
        inner: &crate::Inner,
        input: &[u8],
        wq_at: usize,
        pas_at: usize,
        uar: bool,
    ) -> Result<WqMem, Fail> {
        use mlx5_hw::ifc::{cmd_hca_cap, wq};
        let w = &input[wq_at..wq_at + wq::SIZE_BYTES];
        // PD 0 is firmware's own (mlx5e's drop RQ names no PD).
        let pd = wq::PD.get(w) as u32;
        if pd != 0 && !crate::lock(&inner.rdma.pds).contains(&pd) {
            return Err(fail(CmdStatus::BadResource, synd::WQ_BAD_PD));
        }
        if uar && !self.uars.contains(&(wq::UAR_PAGE.get(w) as u32)) {
            return Err(fail(CmdStatus::BadResource, synd::WQ_BAD_UAR));
        }
        let log_sz = wq::LOG_WQ_SZ.get(w);
        if log_sz > self.cap(cmd_hca_cap::LOG_MAX_WQ_SZ) {
            return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_SIZE));
        }
        let ring = (1u64 << log_sz) << wq::LOG_WQ_STRIDE.get(w);
        let uid = super::uctx::uid_of(input);
        let dma = &inner.bus.dma;
        let mut umems = Vec::new();
        let buf = if wq::WQ_UMEM_VALID.get(w) != 0 {
            let id = wq::WQ_UMEM_ID.get(w) as u32;
            umems.push(id);
            self.umem_wq_ring(uid, id, wq::WQ_UMEM_OFFSET.get(w), ring)?
        } else {
            let log_page = 12 + wq::LOG_WQ_PG_SZ.get(w) as u32;
            let offset = page_offset_bytes(wq::PAGE_OFFSET.get(w), log_page);
            let npas = (offset + ring).div_ceil(1 << log_page) as usize;
            let pas = super::cq::pas(input, pas_at, npas)?;
            if pas.iter().any(|p| !dma.is_mapped(*p, 1)) {
                return Err(fail(CmdStatus::BadParameter, synd::WQ_NOT_MAPPED));
            }
            Buf::new(pas, log_page, offset)
        };
        let dbr = if wq::DBR_UMEM_VALID.get(w) != 0 {
            let id = wq::DBR_UMEM_ID.get(w) as u32;
            umems.push(id);
            self.umem_wq_dbr(uid, id, wq::DBR_ADDR.get(w))?
        } else {
            let dbr = wq::DBR_ADDR.get(w);
            if !dma.is_mapped(dbr, 8) {
                return Err(fail(CmdStatus::BadParameter, synd::WQ_NOT_MAPPED));
            }
            dbr
        };
        Ok(WqMem { buf, dbr, umems })
    }
}
