//! Event queues: CREATE_EQ / DESTROY_EQ / QUERY_EQ, EQE posting and the
//! UAR doorbells that move the consumer index and arm the EQ.
//!
//! The ring lives in driver memory, described by the PAS list. The EQE
//! owner bit firmware writes is `(producer index >> log_eq_size) & 1`, so
//! software, which initializes every owner bit to 1, sees an entry as new
//! when its owner bit equals its own pass parity. An EQ raises its MSI-X
//! vector once per arm: the next EQE (or, at arm time, any EQE beyond the
//! consumer index) fires it and disarms it. An event that finds the EQ
//! full overruns it: the EQ goes to the overflow state and takes no more.

use mlx5_hw::event::{self as ev, EventType};
use mlx5_hw::ifc::{
    create_eq_in, create_eq_out, destroy_eq_in, eqc, eqe, query_eq_in, query_eq_out, Eqe, EqeCmd,
};
use mlx5_hw::status::CmdStatus;
use mlx5_hw::uar::{DB_CI_MASK, EQ_DB_EQN_SHIFT, EQ_DOORBELL_ARM, EQ_DOORBELL_UPDATE_CI};
use zerocopy::FromZeros;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::initseg::rd;
use crate::Inner;

/// First EQ number firmware hands out (as the traced card does).
pub(crate) const FIRST_EQN: u32 = 0x10;
/// EQ context status: OK.
pub(crate) const EQ_STATUS_OK: u8 = 0x0;
/// EQ context status: EQ write failure / overflow.
pub(crate) const EQ_STATUS_OVERFLOW: u8 = 0xa;
/// EQ context st: armed.
const ST_ARMED: u8 = mlx5_hw::event::EQ_STATE_ARMED;
/// EQ context st: fired.
const ST_FIRED: u8 = mlx5_hw::event::EQ_STATE_FIRED;
/// EQE size.
const EQE: u64 = eqe::SIZE_BYTES as u64;

/// One event queue.
#[derive(Debug, Clone)]
pub(crate) struct Eq {
    pub eqn: u8,
    pub log_size: u8,
    pub uar: u32,
    pub intr: u16,
    pub log_page_size: u8,
    pub page_offset: u8,
    pub pas: Vec<u64>,
    pub mask: [u64; 4],
    pub ci: u32,
    pub pi: u32,
    pub armed: bool,
    pub status: u8,
    /// Created by the command now completing: no CMD EQE for it.
    pub born_in_slot: Option<u8>,
}

impl Eq {
    fn subscribed(&self, ty: u8) -> bool {
        self.mask[usize::from(ty / 64)] >> (ty % 64) & 1 != 0
    }

    fn used(&self) -> u32 {
        self.pi.wrapping_sub(self.ci) & DB_CI_MASK
    }

    fn entry_iova(&self, index: u32) -> Option<u64> {
        let off = u64::from(self.page_offset) * EQE + u64::from(index) * EQE;
        let shift = 12 + u32::from(self.log_page_size);
        let page = self.pas.get((off >> shift) as usize)?;
        Some(page + (off & ((1 << shift) - 1)))
    }
}

impl Firmware {
    /// The EQ events of type `ty` go to (the lowest-numbered subscriber).
    pub(crate) fn eq_for(&self, ty: EventType) -> Option<u8> {
        let t = ty.to_raw();
        self.eqs
            .values()
            .find(|e| e.subscribed(t) && e.status == EQ_STATUS_OK)
            .map(|e| e.eqn)
    }

    pub(crate) fn eq_has_room(&self, eqn: u8) -> bool {
        self.eqs
            .get(&eqn)
            .is_some_and(|e| e.used() < 1 << e.log_size)
    }

    /// Writes one EQE (owner byte last) and fires the EQ if armed.
    pub(crate) fn post_eqe(
        &mut self,
        inner: &Inner,
        eqn: u8,
        ty: u8,
        sub: u8,
        data: &[u8; 28],
    ) -> bool {
        let Some(eq) = self.eqs.get_mut(&eqn) else {
            return false;
        };
        if eq.status != EQ_STATUS_OK {
            return false;
        }
        let nent = 1u32 << eq.log_size;
        if eq.used() >= nent {
            tracing::warn!(eqn, ty, "EQ overrun");
            eq.status = EQ_STATUS_OVERFLOW;
            inner.stats().eq_overruns += 1;
            return false;
        }
        let Some(at) = eq.entry_iova(eq.pi & (nent - 1)) else {
            return false;
        };
        let mut e = [0u8; eqe::SIZE_BYTES];
        let mut v = Eqe::new_unchecked(&mut e[..]);
        v.set_event_type(ty)
            .set_event_sub_type(sub)
            .set_owner((eq.pi >> eq.log_size) & 1 != 0);
        v.event_data_mut().into_inner().copy_from_slice(data);
        // Everything before the owner's byte, then that byte last.
        let (body, owner) = e.split_at(ev::EQE_OWNER_OFFSET);
        let dma = &inner.bus.dma;
        if dma.write(at, body).is_err() || dma.write(at + body.len() as u64, owner).is_err() {
            tracing::warn!(eqn, iova = format_args!("{at:#x}"), "EQE write faulted");
            inner.stats().dma_faults += 1;
            eq.status = EQ_STATUS_OVERFLOW;
            return false;
        }
        eq.pi = (eq.pi + 1) & DB_CI_MASK;
        inner.stats().eqes += 1;
        if eq.armed {
            eq.armed = false;
            let v = u32::from(eq.intr);
            inner.msix_signal(v);
        }
        true
    }

    /// A command finished: tell the CMD EQ, if the driver has one.
    pub(crate) fn command_completed(&mut self, inner: &Inner, slot: u8) {
        let t = EventType::Cmd.to_raw();
        let target = self
            .eqs
            .values()
            .find(|e| e.subscribed(t) && e.status == EQ_STATUS_OK && e.born_in_slot.is_none())
            .map(|e| e.eqn);
        for e in self.eqs.values_mut() {
            e.born_in_slot = None;
        }
        if let Some(eqn) = target {
            let mut d = EqeCmd::new_zeroed();
            d.vector.set(1u32 << slot);
            self.post_eqe(inner, eqn, t, 0, &zerocopy::transmute!(d));
        }
    }

    /// Reads the EQ doorbells of every UAR page that has EQs.
    pub(super) fn poll_eq_doorbells(&mut self, inner: &Inner) -> bool {
        let mut busy = false;
        // Trapped writes first, each exactly as written (the register in
        // BAR memory holds only the last of them).
        let trapped = std::mem::take(&mut *crate::lock(&inner.trapped_doorbells));
        for (at, v) in trapped {
            let (uar, off) = ((at >> 12) as u32, (at & 0xfff) as usize);
            if off != EQ_DOORBELL_UPDATE_CI && off != EQ_DOORBELL_ARM {
                continue;
            }
            self.eq_db_last.insert((uar, off), v);
            busy = true;
            self.eq_doorbell(inner, uar, v, off == EQ_DOORBELL_ARM);
        }
        let uars: Vec<u32> = {
            let mut v: Vec<u32> = self.eqs.values().map(|e| e.uar).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        for uar in uars {
            // CI-only first: a driver that writes both writes the arm last.
            for off in [EQ_DOORBELL_UPDATE_CI, EQ_DOORBELL_ARM] {
                let v = rd(&inner.bar, ((uar as usize) << 12) + off);
                let last = self.eq_db_last.entry((uar, off)).or_insert(0);
                if v == *last {
                    continue;
                }
                *last = v;
                busy = true;
                self.eq_doorbell(inner, uar, v, off == EQ_DOORBELL_ARM);
            }
        }
        busy
    }

    fn eq_doorbell(&mut self, inner: &Inner, uar: u32, v: u32, arm: bool) {
        let eqn = (v >> EQ_DB_EQN_SHIFT) as u8;
        let ci = v & DB_CI_MASK;
        let Some(eq) = self.eqs.get_mut(&eqn) else {
            tracing::debug!(uar, eqn, "doorbell for no EQ");
            return;
        };
        if eq.uar != uar {
            tracing::debug!(uar, eqn, "EQ doorbell on a UAR page not the EQ's");
            return;
        }
        if ci.wrapping_sub(eq.ci) & DB_CI_MASK > eq.pi.wrapping_sub(eq.ci) & DB_CI_MASK {
            tracing::warn!(eqn, ci, pi = eq.pi, "consumer index beyond producer index");
        }
        eq.ci = ci;
        if arm {
            eq.armed = true;
            if eq.used() != 0 {
                eq.armed = false;
                let v = u32::from(eq.intr);
                inner.msix_signal(v);
            }
        }
    }

    pub(super) fn create_eq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_eq_in::SIZE_BYTES,
            create_eq_out::SIZE_BYTES,
        )?;
        let at = create_eq_in::EQ_CONTEXT_ENTRY.off / 8;
        let ctx = &input[at..at + eqc::SIZE_BYTES];
        let log_size = eqc::LOG_EQ_SIZE.get(ctx) as u8;
        let max_log = self.caps.get(
            crate::profile::cap_type::GENERAL,
            mlx5_hw::ifc::cmd_hca_cap::LOG_MAX_EQ_SZ,
        );
        if u64::from(log_size) > max_log {
            return Err(fail(CmdStatus::BadParameter, synd::EQ_BAD_SIZE));
        }
        let uar = eqc::UAR_PAGE.get(ctx) as u32;
        if !self.uars.contains(&uar) {
            return Err(fail(CmdStatus::BadResource, synd::EQ_BAD_UAR));
        }
        let intr = eqc::INTR.get(ctx) as u16;
        if u32::from(intr) >= self.profile.msix_vectors() {
            return Err(fail(CmdStatus::BadParameter, synd::EQ_BAD_INTR));
        }
        let log_page_size = eqc::LOG_PAGE_SIZE.get(ctx) as u8;
        if log_page_size > 18 {
            return Err(fail(CmdStatus::BadParameter, synd::EQ_BAD_PAGE_SIZE));
        }
        let page_offset = eqc::PAGE_OFFSET.get(ctx) as u8;
        let bytes = (u64::from(page_offset) + (1u64 << log_size)) * EQE;
        let npas = bytes.div_ceil(4096 << log_page_size) as usize;
        if input.len() < create_eq_in::SIZE_BYTES + npas * 8 {
            return Err(fail(CmdStatus::BadParameter, synd::EQ_BAD_PAS));
        }
        let view = mlx5_hw::ifc::CreateEqIn::new_unchecked(input);
        let pas: Vec<u64> = (0..npas).map(|i| view.pas(i)).collect();
        if pas.iter().any(|p| p & 0xfff != 0) {
            return Err(fail(CmdStatus::BadParameter, synd::EQ_BAD_PAS));
        }
        let max_eqs = 1u32
            << self.caps.get(
                crate::profile::cap_type::GENERAL,
                mlx5_hw::ifc::cmd_hca_cap::LOG_MAX_EQ,
            );
        let Some(eqn) = (FIRST_EQN..max_eqs.min(256)).find(|n| !self.eqs.contains_key(&(*n as u8)))
        else {
            return Err(fail(CmdStatus::NoResources, synd::EQ_EXHAUSTED));
        };
        let eqn = eqn as u8;
        let mask = [0, 1, 2, 3].map(|i| view.event_bitmask(i));
        let armed = eqc::ST.get(ctx) as u8 == ST_ARMED;
        tracing::debug!(
            eqn,
            log_size,
            uar,
            intr,
            mask = format_args!("{:#x}", mask[0]),
            "CREATE_EQ"
        );
        let _ = inner;
        self.eqs.insert(
            eqn,
            Eq {
                eqn,
                log_size,
                uar,
                intr,
                log_page_size,
                page_offset,
                pas,
                mask,
                ci: 0,
                pi: 0,
                armed,
                status: EQ_STATUS_OK,
                born_in_slot: Some(0xff),
            },
        );
        let mut out = vec![0u8; create_eq_out::SIZE_BYTES];
        create_eq_out::EQ_NUMBER.set(&mut out, u64::from(eqn));
        Ok(out)
    }

    pub(super) fn destroy_eq(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, destroy_eq_in::SIZE_BYTES, 0x10)?;
        let eqn = destroy_eq_in::EQ_NUMBER.get(input) as u8;
        if self.eqs.remove(&eqn).is_none() {
            return Err(fail(CmdStatus::BadResource, synd::EQ_UNKNOWN));
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_eq(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_eq_in::SIZE_BYTES,
            query_eq_out::SIZE_BYTES,
        )?;
        let eqn = query_eq_in::EQ_NUMBER.get(input) as u8;
        let Some(eq) = self.eqs.get(&eqn) else {
            return Err(fail(CmdStatus::BadResource, synd::EQ_UNKNOWN));
        };
        let room = outlen.saturating_sub(query_eq_out::SIZE_BYTES) / 8;
        let npas = eq.pas.len().min(room);
        let mut out = vec![0u8; query_eq_out::SIZE_BYTES + npas * 8];
        {
            let at = query_eq_out::EQ_CONTEXT_ENTRY.off / 8;
            let ctx = &mut out[at..at + eqc::SIZE_BYTES];
            eqc::STATUS.set(ctx, u64::from(eq.status));
            eqc::ST.set(ctx, u64::from(if eq.armed { ST_ARMED } else { ST_FIRED }));
            eqc::PAGE_OFFSET.set(ctx, u64::from(eq.page_offset));
            eqc::LOG_EQ_SIZE.set(ctx, u64::from(eq.log_size));
            eqc::UAR_PAGE.set(ctx, u64::from(eq.uar));
            eqc::INTR.set(ctx, u64::from(eq.intr));
            eqc::LOG_PAGE_SIZE.set(ctx, u64::from(eq.log_page_size));
            eqc::CONSUMER_COUNTER.set(ctx, u64::from(eq.ci));
            eqc::PRODUCER_COUNTER.set(ctx, u64::from(eq.pi));
        }
        query_eq_out::EVENT_BITMASK.set(&mut out, eq.mask[0]);
        for (i, p) in eq.pas.iter().take(npas).enumerate() {
            let at = query_eq_out::SIZE_BYTES + i * 8;
            out[at..at + 8].copy_from_slice(&p.to_be_bytes());
        }
        Ok(out)
    }
}
