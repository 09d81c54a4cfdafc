//! CREATE_CQ / DESTROY_CQ / QUERY_CQ / MODIFY_CQ: the CQ context (size,
//! CQE size, UAR page, completion EQ, doorbell record, PAS list), handed to
//! the data path ([`crate::transport::Cq`]).

use std::sync::{Arc, Mutex};

use mlx5_hw::ifc::{
    cmd_hca_cap, cqc, create_cq_in, create_cq_out, destroy_cq_in, modify_cq_in, query_cq_in,
    query_cq_out,
};
use mlx5_hw::init::{page_offset_bytes, page_offset_field};
use mlx5_hw::status::CmdStatus;

use super::uctx::Kind;
use super::{fail, sized, synd, CmdResult, Firmware};
use crate::transport::cq::{CqState, ResizeError};
use crate::transport::cqe_comp::{Compression, MiniFormat};
use crate::transport::qp::Buf;
use crate::transport::{freed, lowest_free, rlock, wlock, Cq};
use crate::{lock, Inner};

const CTX: usize = create_cq_in::CQ_CONTEXT.off / 8;

/// Reads a PAS list of `n` entries at byte `at` of `input`.
pub(crate) fn pas(input: &[u8], at: usize, n: usize) -> Result<Vec<u64>, super::Fail> {
    if input.len() < at + n * 8 {
        return Err(fail(CmdStatus::BadInputLength, synd::BAD_INPUT_LENGTH));
    }
    let v: Vec<u64> = (0..n)
        .map(|i| {
            let b = &input[at + i * 8..at + i * 8 + 8];
            u64::from_be_bytes(b.try_into().unwrap_or([0; 8]))
        })
        .collect();
    if v.iter().any(|p| p & 0xfff != 0) {
        return Err(fail(CmdStatus::BadParameter, synd::BAD_PAS));
    }
    Ok(v)
}

impl Firmware {
    /// Posts the EQEs the data path queued: completion events to the CQ's
    /// EQ, affiliated and CQ error events to the EQ that subscribed.
    pub(super) fn post_rdma_events(&mut self, inner: &Inner) -> bool {
        let events = std::mem::take(&mut *lock(&inner.rdma.events));
        let busy = !events.is_empty();
        for e in events {
            let eqn = match e.eqn {
                Some(n) => Some(n),
                None => self.eq_for(mlx5_hw::event::EventType::from(e.ty)),
            };
            match eqn {
                Some(n) => {
                    self.post_eqe(inner, n, e.ty, e.sub, &e.data);
                }
                None => tracing::debug!(ty = e.ty, "event with no EQ subscribed"),
            }
        }
        busy
    }

    pub(super) fn create_cq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_cq_in::SIZE_BYTES,
            create_cq_out::SIZE_BYTES,
        )?;
        let c = &input[CTX..CTX + cqc::SIZE_BYTES];
        let (log_size, stride) = self.cq_geometry(c)?;
        let comp = self.cq_compression(c, stride)?;
        let uar = cqc::UAR_PAGE.get(c) as u32;
        if !self.uars.contains(&uar) {
            return Err(fail(CmdStatus::BadResource, synd::CQ_BAD_UAR));
        }
        let eqn = cqc::C_EQN_OR_APU_ELEMENT.get(c) as u32;
        if eqn > 0xff || !self.eqs.contains_key(&(eqn as u8)) {
            return Err(fail(CmdStatus::BadResource, synd::CQ_BAD_EQ));
        }
        let (buf, dbr, umems) = self.cq_memory(inner, input, stride << log_size)?;
        let max = 1u32 << self.cap(cmd_hca_cap::LOG_MAX_CQ).clamp(1, 24);
        let mut t = wlock(&inner.rdma.cqs);
        let Some(cqn) = lowest_free(&inner.rdma.cq_floor, 1, max, |n| t.contains_key(&n)) else {
            return Err(fail(CmdStatus::NoResources, synd::CQ_EXHAUSTED));
        };
        let armed = cqc::ST.get(c) as u8 == mlx5_hw::cqe::CQ_STATE_ARMED;
        tracing::debug!(cqn, log_size, eqn, uar, "CREATE_CQ");
        t.insert(
            cqn,
            Arc::new(Cq {
                cqn,
                eqn: eqn as u8,
                uar,
                dbr,
                comp,
                st: Mutex::new(CqState {
                    log_size,
                    stride,
                    buf,
                    armed: armed.then_some(false),
                    period: cqc::CQ_PERIOD.get(c) as u16,
                    max_count: cqc::CQ_MAX_COUNT.get(c) as u16,
                    period_from_cqe: cqc::CQ_PERIOD_MODE.get(c)
                        == u64::from(mlx5_hw::cqe::CQ_PERIOD_MODE_START_FROM_CQE),
                    sol_breaks: cqc::SCQE_BREAK_MODERATION_EN.get(c) != 0,
                    ..CqState::default()
                }),
            }),
        );
        drop(t);
        self.umem_used_by(Kind::Cq, cqn, &umems);
        inner.rdma.track_uar(uar, false);
        let mut out = vec![0u8; create_cq_out::SIZE_BYTES];
        create_cq_out::CQN.set(&mut out, u64::from(cqn));
        Ok(out)
    }

    /// A CQ context's `log_cq_size` and entry size (64 or 128 bytes),
    /// checked against the caps.
    fn cq_geometry(&self, c: &[u8]) -> Result<(u8, u64), super::Fail> {
        let log_size = cqc::LOG_CQ_SIZE.get(c) as u8;
        if u64::from(log_size) > self.cap(cmd_hca_cap::LOG_MAX_CQ_SZ) {
            return Err(fail(CmdStatus::BadParameter, synd::CQ_BAD_SIZE));
        }
        let stride = match cqc::CQE_SZ.get(c) as u8 {
            mlx5_hw::cqe::CQE_STRIDE_64 => 64,
            mlx5_hw::cqe::CQE_STRIDE_128 | mlx5_hw::cqe::CQE_STRIDE_128_PAD => 128,
            _ => return Err(fail(CmdStatus::BadParameter, synd::CQ_BAD_CQE_SIZE)),
        };
        Ok((log_size, stride))
    }

    /// A CQ context's CQE compression (`cqe_comp_en`), checked against
    /// the caps: `cqe_compression` for 64-byte CQEs,
    /// `cqe_compression_128` for 128-byte ones, the basic layout unless
    /// `enhanced_cqe_compression`, a mini CQE format the model writes
    /// (the stride index one only with `mini_cqe_resp_stride_index`).
    fn cq_compression(&self, c: &[u8], stride: u64) -> Result<Option<Compression>, super::Fail> {
        if cqc::CQE_COMP_EN.get(c) == 0 {
            return Ok(None);
        }
        let bad = || fail(CmdStatus::BadParameter, synd::CQ_BAD_COMPRESSION);
        let offered = if stride == 128 {
            cmd_hca_cap::CQE_COMPRESSION_128
        } else {
            cmd_hca_cap::CQE_COMPRESSION
        };
        if self.cap(offered) == 0 {
            return Err(bad());
        }
        let layout = cqc::CQE_COMPRESSION_LAYOUT.get(c) as u8;
        if layout != mlx5_hw::cqe::CQE_COMPRESS_LAYOUT_BASIC {
            // The enhanced layout (`enhanced_cqe_compression`) is later
            // firmware's: no profile offers it.
            return Err(bad());
        }
        let format = MiniFormat::from_raw(cqc::MINI_CQE_RES_FORMAT.get(c) as u8).ok_or_else(bad)?;
        if format == MiniFormat::CsumStridx
            && self.cap(cmd_hca_cap::MINI_CQE_RESP_STRIDE_INDEX) == 0
        {
            return Err(bad());
        }
        let max = (self.cap(cmd_hca_cap::CQE_COMPRESSION_MAX_NUM) as u32).max(2);
        Ok(Some(Compression { format, max }))
    }

    /// Where a new CQ's `bytes` of CQEs and its doorbell record lie: the
    /// command's PAS list and `dbr_addr`, or (DevX) `cq_umem_id` at
    /// `cq_umem_offset` and `dbr_umem_id` at `dbr_addr`; and the UMEMs used.
    fn cq_memory(
        &self,
        inner: &Inner,
        input: &[u8],
        bytes: u64,
    ) -> Result<(Buf, u64, Vec<u32>), super::Fail> {
        let c = &input[CTX..CTX + cqc::SIZE_BYTES];
        let uid = super::uctx::uid_of(input);
        let mut umems = Vec::new();
        let buf = if create_cq_in::CQ_UMEM_VALID.get(input) != 0 {
            let id = create_cq_in::CQ_UMEM_ID.get(input) as u32;
            umems.push(id);
            self.umem_buf(uid, id, create_cq_in::CQ_UMEM_OFFSET.get(input), bytes)?
        } else {
            let log_page = 12 + cqc::LOG_PAGE_SIZE.get(c) as u32;
            let offset = page_offset_bytes(cqc::PAGE_OFFSET.get(c), log_page);
            let npas = (offset + bytes).div_ceil(1 << log_page) as usize;
            let pas = pas(input, create_cq_in::SIZE_BYTES, npas)?;
            if pas.iter().any(|p| !inner.bus.dma.is_mapped(*p, 1)) {
                return Err(fail(CmdStatus::BadParameter, synd::CQ_NOT_MAPPED));
            }
            Buf::new(pas, log_page, offset)
        };
        let dbr = if cqc::DBR_UMEM_VALID.get(c) != 0 {
            let id = cqc::DBR_UMEM_ID.get(c) as u32;
            umems.push(id);
            self.umem_dbr(uid, id, cqc::DBR_ADDR.get(c))?
        } else {
            let dbr = cqc::DBR_ADDR.get(c);
            if !inner.bus.dma.is_mapped(dbr, 8) {
                return Err(fail(CmdStatus::BadParameter, synd::CQ_NOT_MAPPED));
            }
            dbr
        };
        Ok((buf, dbr, umems))
    }

    pub(super) fn destroy_cq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, destroy_cq_in::SIZE_BYTES, 0x10)?;
        let cqn = destroy_cq_in::CQN.get(input) as u32;
        let r = &inner.rdma;
        if !rlock(&r.cqs).contains_key(&cqn) {
            return Err(fail(CmdStatus::BadResource, synd::CQ_UNKNOWN));
        }
        let used = rlock(&r.qps)
            .values()
            .any(|q| q.scq.cqn == cqn || q.rcq.cqn == cqn);
        // SQs and RQs (fw/sq.rs, fw/rq.rs) complete to it.
        let on_it = |o: &super::eth::Obj, f: mlx5_hw::bits::BitField| f.get(&o.ctx) as u32 == cqn;
        let queues = self
            .eth
            .sqs
            .values()
            .any(|o| on_it(o, mlx5_hw::ifc::sqc::CQN))
            || self
                .eth
                .rqs
                .values()
                .any(|o| on_it(o, mlx5_hw::ifc::rqc::CQN));
        if used || queues {
            return Err(fail(CmdStatus::BadResourceState, synd::CQ_IN_USE));
        }
        if let Some(cq) = wlock(&r.cqs).remove(&cqn) {
            // CQEs it was gathering for a compression session go with it.
            cq.drop_session(r);
            cq.drop_timer(r);
        }
        freed(&r.cq_floor, cqn);
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_cq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_cq_in::SIZE_BYTES,
            query_cq_out::SIZE_BYTES,
        )?;
        let cqn = query_cq_in::CQN.get(input) as u32;
        let Some(cq) = rlock(&inner.rdma.cqs).get(&cqn).cloned() else {
            return Err(fail(CmdStatus::BadResource, synd::CQ_UNKNOWN));
        };
        let room = outlen.saturating_sub(query_cq_out::SIZE_BYTES) / 8;
        let st = lock(&cq.st);
        let n = st.buf.pas.len().min(room);
        let mut out = vec![0u8; query_cq_out::SIZE_BYTES + n * 8];
        let at = query_cq_out::CQ_CONTEXT.off / 8;
        {
            let c = &mut out[at..at + cqc::SIZE_BYTES];
            cqc::STATUS.set(c, if st.error { 9 } else { 0 });
            cqc::CQE_SZ.set(c, if st.stride == 128 { 1 } else { 0 });
            if let Some(comp) = cq.comp {
                cqc::CQE_COMP_EN.set(c, 1);
                cqc::MINI_CQE_RES_FORMAT.set(c, u64::from(comp.format.to_raw()));
            }
            cqc::ST.set(
                c,
                u64::from(if st.armed.is_some() {
                    mlx5_hw::cqe::CQ_STATE_ARMED
                } else {
                    mlx5_hw::cqe::CQ_STATE_FIRED
                }),
            );
            // A queue in a UMEM: the offset within its page.
            cqc::PAGE_OFFSET.set(c, page_offset_field(st.buf.offset, st.buf.log_page));
            cqc::LOG_CQ_SIZE.set(c, u64::from(st.log_size));
            cqc::UAR_PAGE.set(c, u64::from(cq.uar));
            cqc::CQ_PERIOD.set(c, u64::from(st.period));
            cqc::CQ_MAX_COUNT.set(c, u64::from(st.max_count));
            cqc::C_EQN_OR_APU_ELEMENT.set(c, u64::from(cq.eqn));
            cqc::LOG_PAGE_SIZE.set(c, u64::from(st.buf.log_page - 12));
            cqc::CONSUMER_COUNTER.set(c, u64::from(st.ci));
            cqc::PRODUCER_COUNTER.set(c, u64::from(st.pi & 0xff_ffff));
            cqc::DBR_ADDR.set(c, cq.dbr);
        }
        for (i, p) in st.buf.pas.iter().take(n).enumerate() {
            let a = query_cq_out::SIZE_BYTES + i * 8;
            out[a..a + 8].copy_from_slice(&p.to_be_bytes());
        }
        Ok(out)
    }

    pub(super) fn modify_cq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, modify_cq_in::SIZE_BYTES, 0x10)?;
        let cqn = modify_cq_in::CQN.get(input) as u32;
        let Some(cq) = rlock(&inner.rdma.cqs).get(&cqn).cloned() else {
            return Err(fail(CmdStatus::BadResource, synd::CQ_UNKNOWN));
        };
        let sel = modify_cq_in::MODIFY_FIELD_SELECT_RESIZE_FIELD_SELECT.get(input) as u32;
        let at = modify_cq_in::CQ_CONTEXT.off / 8;
        let c = &input[at..at + cqc::SIZE_BYTES];
        match modify_cq_in::OP_MOD.get(input) as u16 {
            0 => {
                let mut st = lock(&cq.st);
                if sel & mlx5_hw::cqe::CQ_MODIFY_PERIOD != 0 {
                    st.period = cqc::CQ_PERIOD.get(c) as u16;
                }
                if sel & mlx5_hw::cqe::CQ_MODIFY_COUNT != 0 {
                    st.max_count = cqc::CQ_MAX_COUNT.get(c) as u16;
                }
            }
            mlx5_hw::cqe::CQ_OPMOD_RESIZE => self.resize_cq(inner, &cq, input, sel)?,
            _ => return Err(fail(CmdStatus::BadParameter, synd::CQ_RESIZE)),
        }
        Ok(vec![0; 0x10])
    }

    /// MODIFY_CQ's resize: the new ring from the context (`log_cq_size`,
    /// `cqe_sz`, `log_page_size` and `page_offset` as `sel` selects them)
    /// and the PAS list after it; [`Cq::resize`] switches to it.
    fn resize_cq(&self, inner: &Inner, cq: &Cq, input: &[u8], sel: u32) -> Result<(), super::Fail> {
        use mlx5_hw::cqe::{
            MODIFY_CQ_MASK_LOG_SIZE, MODIFY_CQ_MASK_PG_OFFSET, MODIFY_CQ_MASK_PG_SIZE,
        };
        let at = modify_cq_in::CQ_CONTEXT.off / 8;
        let c = &input[at..at + cqc::SIZE_BYTES];
        if sel & MODIFY_CQ_MASK_LOG_SIZE == 0 || modify_cq_in::CQ_UMEM_VALID.get(input) != 0 {
            // A resize names the new size; a new ring in a UMEM (DevX) is
            // not modelled.
            return Err(fail(CmdStatus::BadParameter, synd::CQ_RESIZE));
        }
        let (log_size, stride) = self.cq_geometry(c)?;
        let old_page = lock(&cq.st).buf.log_page;
        let log_page = if sel & MODIFY_CQ_MASK_PG_SIZE != 0 {
            12 + cqc::LOG_PAGE_SIZE.get(c) as u32
        } else {
            old_page
        };
        let offset = if sel & MODIFY_CQ_MASK_PG_OFFSET != 0 {
            page_offset_bytes(cqc::PAGE_OFFSET.get(c), log_page)
        } else {
            0
        };
        let npas = (offset + (stride << log_size)).div_ceil(1 << log_page) as usize;
        let pas = pas(input, modify_cq_in::PAS.off / 8, npas)?;
        if pas.iter().any(|p| !inner.bus.dma.is_mapped(*p, 1)) {
            return Err(fail(CmdStatus::BadParameter, synd::CQ_NOT_MAPPED));
        }
        let mem = inner.rdma.dma.memory();
        cq.resize(
            &inner.rdma,
            &mem,
            log_size,
            stride,
            Buf::new(pas, log_page, offset),
        )
        .map_err(|e| match e {
            ResizeError::InError => fail(CmdStatus::BadResourceState, synd::CQ_RESIZE),
            ResizeError::TooSmall => fail(CmdStatus::BadParameter, synd::CQ_BAD_SIZE),
            ResizeError::Fault => fail(CmdStatus::BadParameter, synd::CQ_NOT_MAPPED),
        })
    }
}
