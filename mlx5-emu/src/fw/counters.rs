//! ALLOC_Q_COUNTER / DEALLOC_Q_COUNTER / QUERY_Q_COUNTER: queue counter
//! sets. A set is an 8-bit id; firmware has `max_qp_cnt` of them besides
//! set 0 (the function's default set, never handed out), lowest first. QPs
//! bind to a set through qpc.counter_set_id (fw/qp.rs); the transport
//! counts into it what it knows ([`QCounterSet`]); the other PRM counters
//! read 0 because the model has no such events (no ODP, DCT, CNPs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mlx5_hw::bits::BitField;
use mlx5_hw::ifc::{
    alloc_q_counter_in, alloc_q_counter_out, cmd_hca_cap, dealloc_q_counter_in, query_q_counter_in,
    query_q_counter_out,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::transport::QCounterSet;
use crate::{lock, Inner};

/// One counter of a set.
type Counter = fn(&QCounterSet) -> &AtomicU64;

/// The counters a set keeps, and where QUERY_Q_COUNTER reports each.
const REPORTED: [(BitField, Counter); 2] = [
    (query_q_counter_out::OUT_OF_BUFFER, |c| &c.out_of_buffer),
    (query_q_counter_out::RNR_NAK_RETRY_ERR, |c| {
        &c.rnr_nak_retry_err
    }),
];

impl Firmware {
    pub(super) fn alloc_q_counter(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            alloc_q_counter_in::SIZE_BYTES,
            alloc_q_counter_out::SIZE_BYTES,
        )?;
        self.check_uid(alloc_q_counter_in::UID.get(input))?;
        let max = self.cap(cmd_hca_cap::MAX_QP_CNT).min(0xff) as u32;
        let mut t = lock(&inner.rdma.q_counters);
        let Some(id) = (1..=max).find(|x| !t.contains_key(x)) else {
            return Err(fail(CmdStatus::NoResources, synd::Q_COUNTER_EXHAUSTED));
        };
        t.insert(id, Arc::new(QCounterSet::default()));
        let mut out = vec![0u8; alloc_q_counter_out::SIZE_BYTES];
        alloc_q_counter_out::COUNTER_SET_ID.set(&mut out, u64::from(id));
        Ok(out)
    }

    pub(super) fn dealloc_q_counter(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(input, outlen, dealloc_q_counter_in::SIZE_BYTES, 0x10)?;
        let id = dealloc_q_counter_in::COUNTER_SET_ID.get(input) as u32;
        let r = &inner.rdma;
        if !lock(&r.q_counters).contains_key(&id) {
            return Err(fail(CmdStatus::BadResource, synd::Q_COUNTER_UNKNOWN));
        }
        if crate::transport::rlock(&r.qps)
            .values()
            .any(|q| q.counter_set.load(Ordering::Relaxed) == id)
        {
            return Err(fail(CmdStatus::BadResourceState, synd::Q_COUNTER_IN_USE));
        }
        lock(&r.q_counters).remove(&id);
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_q_counter(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            query_q_counter_in::SIZE_BYTES,
            query_q_counter_out::SIZE_BYTES,
        )?;
        if query_q_counter_in::OTHER_VPORT.get(input) != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_OTHER));
        }
        if query_q_counter_in::AGGREGATE.get(input) != 0
            && self.cap(cmd_hca_cap::Q_COUNTER_AGGREGATION) == 0
        {
            return Err(fail(
                CmdStatus::BadParameter,
                synd::Q_COUNTER_NO_AGGREGATION,
            ));
        }
        let id = query_q_counter_in::COUNTER_SET_ID.get(input) as u32;
        let Some(set) = lock(&inner.rdma.q_counters).get(&id).cloned() else {
            return Err(fail(CmdStatus::BadResource, synd::Q_COUNTER_UNKNOWN));
        };
        let clear = query_q_counter_in::CLEAR.get(input) != 0;
        let mut out = vec![0u8; query_q_counter_out::SIZE_BYTES];
        for (field, counter) in REPORTED {
            let c = counter(&set);
            let v = if clear {
                c.swap(0, Ordering::Relaxed)
            } else {
                c.load(Ordering::Relaxed)
            };
            field.set(&mut out, v.min(u64::from(u32::MAX)));
        }
        Ok(out)
    }
}
