//! QUERY_HCA_CAP / SET_HCA_CAP.
//!
//! op_mod = cap type << 1 | (1: current, 0: max). SET is allowed only
//! before INIT_HCA, once the boot pages are in; each field the driver
//! changes must fit what max allows (a one-bit field may be set only where
//! max has it; a wider field may not exceed max), else bad parameter.

use std::sync::atomic::Ordering;

use mlx5_hw::ifc::{atomic_caps, cmd_hca_cap, query_hca_cap_in, query_hca_cap_out, set_hca_cap_in};
use mlx5_hw::init;
use mlx5_hw::registry::{FieldType, LayoutInfo};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware, HcaState};
use crate::profile::{cap_type, CAP_PAGE_SIZE};
use crate::Inner;

/// Offset of the capability page in QUERY output and SET input.
const CAP_OFF: usize = mlx5_hw::ifc::query_hca_cap_out::CAPABILITY.off / 8;
const _: () = assert!(CAP_OFF == mlx5_hw::ifc::set_hca_cap_in::CAPABILITY.off / 8);

fn layout_of(ty: u16) -> Option<&'static LayoutInfo> {
    use mlx5_hw::ifc::*;
    Some(match ty {
        cap_type::GENERAL => &cmd_hca_cap::INFO,
        cap_type::GENERAL_2 => &cmd_hca_cap_2::INFO,
        cap_type::ODP => &odp_cap::INFO,
        cap_type::ATOMIC => &atomic_caps::INFO,
        cap_type::ROCE => &roce_cap::INFO,
        cap_type::DEV_MEM => &device_mem_cap::INFO,
        _ => return None,
    })
}

/// Checks `new` against `max` field by field where it differs from `cur`;
/// the name of the first field that does not fit.
fn check_against_max(
    info: &LayoutInfo,
    cur: &[u8],
    new: &[u8],
    max: &[u8],
    base: usize,
) -> Result<(), &'static str> {
    for f in info.fields {
        if f.is_reserved() {
            continue;
        }
        let off = base + f.bit_off;
        match f.ty {
            FieldType::Layout(name) => {
                if let Some(sub) = mlx5_hw::registry::layouts()
                    .iter()
                    .find(|l| l.name.ends_with(name) || l.name == name)
                {
                    check_against_max(sub, cur, new, max, off)?;
                }
            }
            FieldType::Bits if f.width <= 64 => {
                let get = |b: &[u8]| mlx5_hw::bits::get_bits(b, off, f.width);
                let v = get(new);
                if v == get(cur) {
                    continue;
                }
                let m = get(max);
                let ok = if f.width == 1 {
                    v == 0 || m == 1
                } else {
                    v <= m
                };
                if !ok {
                    return Err(f.name);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

impl Firmware {
    pub(super) fn query_hca_cap(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_hca_cap_in::SIZE_BYTES,
            query_hca_cap_out::SIZE_BYTES,
        )?;
        if query_hca_cap_in::OTHER_FUNCTION.get(input) != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_FUNCTION_ID));
        }
        let op_mod = query_hca_cap_in::OP_MOD.get(input) as u16;
        let ty = op_mod >> 1;
        let pages = if op_mod & 1 == 1 {
            &self.caps.cur
        } else {
            &self.caps.max
        };
        let Some(page) = pages.get(&ty) else {
            return Err(fail(CmdStatus::BadParameter, synd::CAP_BAD_TYPE));
        };
        let mut out = vec![0u8; query_hca_cap_out::SIZE_BYTES];
        out[CAP_OFF..CAP_OFF + CAP_PAGE_SIZE].copy_from_slice(page);
        Ok(out)
    }

    pub(super) fn set_hca_cap(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, set_hca_cap_in::SIZE_BYTES, 0x10)?;
        if set_hca_cap_in::OTHER_FUNCTION.get(input) != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_FUNCTION_ID));
        }
        if self.hca != HcaState::Enabled {
            return Err(fail(CmdStatus::BadSystemState, synd::CAP_AFTER_INIT));
        }
        if (self.pages.len() as u64) < u64::from(self.profile.boot_pages()) {
            return Err(fail(
                CmdStatus::BadSystemState,
                synd::CAP_WITHOUT_BOOT_PAGES,
            ));
        }
        let ty = (set_hca_cap_in::OP_MOD.get(input) >> 1) as u16;
        let (Some(cur), Some(max), Some(info)) = (
            self.caps.cur.get(&ty),
            self.caps.max.get(&ty),
            layout_of(ty),
        ) else {
            return Err(fail(CmdStatus::BadParameter, synd::CAP_BAD_TYPE));
        };
        let new = &input[CAP_OFF..CAP_OFF + CAP_PAGE_SIZE];
        if let Err(field) = check_against_max(info, cur, new, max, 0) {
            tracing::debug!(ty, field, "SET_HCA_CAP beyond max");
            return Err(fail(CmdStatus::BadParameter, synd::CAP_EXCEEDS_MAX));
        }
        let mut page = if ty == cap_type::ATOMIC {
            // Of the atomic page firmware takes the requester endianness
            // mode only; the rest is what the card does (Linux sends it
            // zero: handle_hca_cap_atomic starts from an empty page).
            let mode = atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE;
            let mut p = cur.clone();
            mode.set(&mut p, mode.get(new));
            p
        } else {
            new.to_vec()
        };
        // Reserved bits keep firmware's values.
        keep_reserved(info, cur, &mut page, 0);
        if ty == cap_type::GENERAL {
            self.checksums = cmd_hca_cap::CMDIF_CHECKSUM.get(&page) != 0;
        }
        if ty == cap_type::ATOMIC {
            let mode = atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE.get(&page);
            inner.rdma.host_endian_atomics.store(
                mode == u64::from(init::ATOMIC_REQ_MODE_HOST_ENDIANNESS),
                Ordering::Release,
            );
        }
        self.caps.cur.insert(ty, page);
        Ok(vec![0; 0x10])
    }
}

fn keep_reserved(info: &LayoutInfo, cur: &[u8], page: &mut [u8], base: usize) {
    for f in info.fields {
        let off = base + f.bit_off;
        if f.is_reserved() && matches!(f.ty, FieldType::Bits) {
            let mut at = 0;
            while at < f.width {
                let w = (f.width - at).min(64);
                let v = mlx5_hw::bits::get_bits(cur, off + at, w);
                mlx5_hw::bits::set_bits(page, off + at, w, v);
                at += w;
            }
        }
    }
}
