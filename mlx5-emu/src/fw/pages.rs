//! QUERY_PAGES / MANAGE_PAGES and run-time PAGE_REQUEST events.
//!
//! Firmware keeps every page the driver gives (by IOVA) and really needs
//! them: SET_HCA_CAP wants the boot pages, INIT_HCA the boot and init pages.
//! TAKE returns only pages firmware can spare (held minus what the current
//! state needs; after TEARDOWN_HCA, all of them).

use mlx5_hw::event::EventType;
use mlx5_hw::ifc::{
    manage_pages_in, manage_pages_out, query_pages_in, query_pages_out, EqePageReq,
};
use mlx5_hw::init::{ManagePagesOpMod, QueryPagesOpMod, FW_PAGE_SIZE};
use mlx5_hw::status::CmdStatus;
use zerocopy::FromZeros;

use super::{fail, sized, synd, CmdResult, Firmware, HcaState};
use crate::Inner;

/// QUERY_PAGES op_mod: boot pages.
const BOOT_PAGES: u64 = QueryPagesOpMod::BootPages.to_raw() as u64;
/// QUERY_PAGES op_mod: init pages.
const INIT_PAGES: u64 = QueryPagesOpMod::InitPages.to_raw() as u64;
/// QUERY_PAGES op_mod: regular (run-time) pages.
const REGULAR_PAGES: u64 = QueryPagesOpMod::RegularPages.to_raw() as u64;
/// MANAGE_PAGES op_mod: the driver cannot give the pages asked for.
const MANAGE_CANT_GIVE: u64 = ManagePagesOpMod::AllocationFail.to_raw() as u64;
/// MANAGE_PAGES op_mod: give pages.
const MANAGE_GIVE: u64 = ManagePagesOpMod::AllocationSuccess.to_raw() as u64;
/// MANAGE_PAGES op_mod: take pages back.
const MANAGE_TAKE: u64 = ManagePagesOpMod::HcaReturnPages.to_raw() as u64;
/// Most pages one MANAGE_PAGES may carry (what fits a 1 MiB message).
const MAX_PAGES_PER_CMD: u64 = 128 * 1024 - 2;
/// Firmware's page size.
const PAGE: u64 = FW_PAGE_SIZE as u64;

impl Firmware {
    pub(super) fn query_pages(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_pages_in::SIZE_BYTES,
            query_pages_out::SIZE_BYTES,
        )?;
        if query_pages_in::FUNCTION_ID.get(input) != 0
            || query_pages_in::EMBEDDED_CPU_FUNCTION.get(input) != 0
        {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_FUNCTION_ID));
        }
        let held = self.pages.len() as u64;
        let boot = u64::from(self.profile.boot_pages());
        let init = u64::from(self.profile.init_pages());
        let n = match query_pages_in::OP_MOD.get(input) {
            BOOT_PAGES => boot.saturating_sub(held),
            INIT_PAGES if matches!(self.hca, HcaState::Enabled) => {
                (boot + init).saturating_sub(held)
            }
            INIT_PAGES => 0,
            REGULAR_PAGES => self.page_demand().saturating_sub(held),
            _ => return Err(fail(CmdStatus::BadParameter, synd::PAGES_BAD_OP_MOD)),
        };
        let mut out = vec![0u8; query_pages_out::SIZE_BYTES];
        query_pages_out::NUM_PAGES.set(&mut out, n);
        Ok(out)
    }

    pub(super) fn manage_pages(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            manage_pages_in::SIZE_BYTES,
            manage_pages_out::SIZE_BYTES,
        )?;
        if manage_pages_in::FUNCTION_ID.get(input) != 0
            || manage_pages_in::EMBEDDED_CPU_FUNCTION.get(input) != 0
        {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_FUNCTION_ID));
        }
        let n = manage_pages_in::INPUT_NUM_ENTRIES.get(input);
        if n > MAX_PAGES_PER_CMD {
            return Err(fail(CmdStatus::BadParameter, synd::PAGES_TOO_MANY));
        }
        match manage_pages_in::OP_MOD.get(input) {
            MANAGE_CANT_GIVE => {
                tracing::warn!("driver cannot give the pages firmware asked for");
                Ok(vec![0; 0x10])
            }
            MANAGE_GIVE => {
                let need = manage_pages_in::SIZE_BYTES + n as usize * 8;
                if input.len() < need {
                    return Err(fail(CmdStatus::BadInputLength, synd::BAD_INPUT_LENGTH));
                }
                let mut fresh = Vec::with_capacity(n as usize);
                for i in 0..n as usize {
                    let at = manage_pages_in::SIZE_BYTES + i * 8;
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&input[at..at + 8]);
                    let iova = u64::from_be_bytes(b);
                    if iova % PAGE != 0 {
                        return Err(fail(CmdStatus::BadParameter, synd::PAGE_MISALIGNED));
                    }
                    if !inner.bus.dma.is_mapped(iova, PAGE) {
                        tracing::debug!(
                            iova = format_args!("{iova:#x}"),
                            "MANAGE_PAGES: page not mapped"
                        );
                        return Err(fail(CmdStatus::BadParameter, synd::PAGE_NOT_MAPPED));
                    }
                    if self.pages.contains(&iova) {
                        return Err(fail(CmdStatus::BadParameter, synd::PAGE_DUPLICATE));
                    }
                    fresh.push(iova);
                }
                let before = fresh.len();
                fresh.sort_unstable();
                fresh.dedup();
                if fresh.len() != before {
                    return Err(fail(CmdStatus::BadParameter, synd::PAGE_DUPLICATE));
                }
                self.pages.extend(fresh);
                Ok(vec![0; 0x10])
            }
            MANAGE_TAKE => {
                // Before INIT_HCA the only TAKE is the driver unwinding a
                // failed bring-up (the kernel's mlx5_reclaim_startup_pages
                // before DISABLE_HCA): firmware gives back the boot pages too.
                let keep = match self.hca {
                    HcaState::Enabled => 0,
                    _ => self.page_demand(),
                };
                let spare = (self.pages.len() as u64).saturating_sub(keep);
                let room = (outlen.saturating_sub(manage_pages_out::SIZE_BYTES) / 8) as u64;
                let k = n.min(spare).min(room);
                let mut out = vec![0u8; manage_pages_out::SIZE_BYTES + k as usize * 8];
                for i in 0..k as usize {
                    let Some(iova) = self.pages.pop_last() else {
                        break;
                    };
                    let at = manage_pages_out::SIZE_BYTES + i * 8;
                    out[at..at + 8].copy_from_slice(&iova.to_be_bytes());
                }
                manage_pages_out::OUTPUT_NUM_ENTRIES.set(&mut out, k);
                Ok(out)
            }
            _ => Err(fail(CmdStatus::BadParameter, synd::PAGES_BAD_OP_MOD)),
        }
    }

    /// Posts queued PAGE_REQUEST events to the EQ that subscribed to them.
    pub(super) fn post_page_requests(&mut self, inner: &Inner) -> bool {
        let storm = inner.faults.take_page_storm();
        for _ in 0..storm {
            self.page_requests.push_back(1);
        }
        if self.page_requests.is_empty() || self.hca != HcaState::Initialized {
            return false;
        }
        let Some(eqn) = self.eq_for(EventType::PageRequest) else {
            return false;
        };
        let mut busy = false;
        while let Some(&n) = self.page_requests.front() {
            if !self.eq_has_room(eqn) {
                break;
            }
            self.page_requests.pop_front();
            // ec_function 0, func_id 0, num_pages (signed).
            let mut d = EqePageReq::new_zeroed();
            d.num_pages.set(n as u32);
            let data = zerocopy::transmute!(d);
            self.extra_demand += i64::from(n);
            self.post_eqe(inner, eqn, EventType::PageRequest.to_raw(), 0, &data);
            busy = true;
        }
        busy
    }
}
