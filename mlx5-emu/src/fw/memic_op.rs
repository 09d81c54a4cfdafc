//! MODIFY_MEMIC: device-memory (MEMIC) operations, the atomics a load or
//! store performs on MEMIC bytes (`mlx5dv_dm_map_op_addr`; Linux's
//! `MLX5_IB_METHOD_DM_MAP_OP_ADDR` sends MODIFY_MEMIC op_mod ALLOC with the
//! allocation's start and `memic_operation_type`, maps the page of the
//! returned `memic_operation_addr` (a BAR0 offset) for the allocation's
//! size, and sends op_mod DEALLOC when the last mapping goes).
//!
//! The caps say which operations exist (`memic_operations`, bit n for
//! type n) and which access sizes each takes (bit n: 2^n bytes). The
//! model's operation addresses: one window per type up to the highest
//! offered, each the size of the MEMIC window, stacked right below it in
//! type order (UAR pages end below them); the allocation at MEMIC offset
//! `o` has operation `k`'s address at window `k` + `o`. The windows are
//! left out of BAR0's mappable areas, so every access arrives trapped
//! (vfio-user REGION_READ/WRITE, in-process `region_read`/`region_write`)
//! and runs under the firmware lock, one at a time: atomic against each
//! other. What each does, as ConnectX-7 does it (the value and the operand
//! both big-endian, the order that card's atomic unit assumes):
//! - atomic increment (type 0): a store adds the stored value to the bytes;
//! - test-and-set (type 1): a load returns the bytes and leaves 1 there.
//!
//! An access that names no mapped operation (outside every allocation,
//! past the allocation's end, an operation not mapped for it, a size the
//! operation does not take, not aligned to its size, a load of the
//! increment or a store to test-and-set) does nothing: a store is
//! dropped, a load reads all ones, as an unclaimed MMIO read does. Each
//! is logged.

use mlx5_hw::ifc::{device_mem_cap, modify_memic_in, modify_memic_out};
use mlx5_hw::init::{
    MEMIC_OP_ATOMIC_INCREMENT, MEMIC_OP_ATOMIC_TEST_AND_SET, MODIFY_MEMIC_OP_MOD_ALLOC,
    MODIFY_MEMIC_OP_MOD_DEALLOC,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::{lock, Inner};

impl Firmware {
    /// `memic_operations` (0 without MEMIC).
    fn memic_ops(&self) -> u32 {
        if self.memic_window().is_none() {
            return 0;
        }
        self.dm_cap(device_mem_cap::MEMIC_OPERATIONS) as u32
    }

    /// The operation windows of BAR0 together, `(start, len)`; `None`
    /// where no operation is offered.
    pub(crate) fn memic_op_windows(&self) -> Option<(u64, u64)> {
        let (start, len) = self.memic_window()?;
        let n = u64::from(32 - self.memic_ops().leading_zeros());
        if n == 0 {
            return None;
        }
        let all = n.checked_mul(len)?;
        Some((start.checked_sub(all)?, all))
    }

    pub(super) fn modify_memic(
        &mut self,
        _inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            modify_memic_in::SIZE_BYTES,
            modify_memic_out::SIZE_BYTES,
        )?;
        let Some((win, win_len)) = self.memic_window() else {
            return Err(fail(CmdStatus::BadOperation, synd::MEMIC_UNSUPPORTED));
        };
        let op_mod = modify_memic_in::OP_MOD.get(input) as u16;
        if op_mod != MODIFY_MEMIC_OP_MOD_ALLOC && op_mod != MODIFY_MEMIC_OP_MOD_DEALLOC {
            return Err(fail(CmdStatus::BadParameter, synd::MEMIC_BAD_OP_MOD));
        }
        let op = modify_memic_in::MEMIC_OPERATION_TYPE.get(input);
        if op >= 32 || self.memic_ops() >> op & 1 == 0 {
            return Err(fail(CmdStatus::BadParameter, synd::MEMIC_BAD_OPERATION));
        }
        let op = op as u8;
        let start = modify_memic_in::MEMIC_START_ADDR.get(input);
        if !self.memic.allocs.contains_key(&start) {
            return Err(fail(CmdStatus::BadParameter, synd::MEMIC_UNKNOWN));
        }
        let mut out = vec![0u8; modify_memic_out::SIZE_BYTES];
        if op_mod == MODIFY_MEMIC_OP_MOD_DEALLOC {
            if !self.memic.ops.remove(&(start, op)) {
                return Err(fail(CmdStatus::BadParameter, synd::MEMIC_OP_NOT_MAPPED));
            }
            return Ok(out);
        }
        let Some((base, _)) = self.memic_op_windows() else {
            return Err(fail(CmdStatus::BadParameter, synd::MEMIC_BAD_OPERATION));
        };
        // Mapping twice is mapping once (Linux maps a type once per
        // allocation and hands the same address out again).
        self.memic.ops.insert((start, op));
        let addr = base + u64::from(op) * win_len + (start - win);
        modify_memic_out::MEMIC_OPERATION_ADDR.set(&mut out, addr);
        tracing::debug!(
            start = format_args!("{start:#x}"),
            op,
            addr = format_args!("{addr:#x}"),
            "MODIFY_MEMIC map"
        );
        Ok(out)
    }

    /// What an access of `len` bytes at BAR0 `offset` (inside the
    /// operation windows) reaches: the operation type and the BAR0 offset
    /// of the bytes, or why nothing.
    pub(crate) fn memic_op_target(
        &self,
        offset: u64,
        len: usize,
    ) -> Result<(u8, u64), &'static str> {
        let (win, win_len) = self.memic_window().ok_or("no MEMIC")?;
        let (base, all) = self.memic_op_windows().ok_or("no MEMIC operations")?;
        let rel = offset
            .checked_sub(base)
            .filter(|&r| r < all)
            .ok_or("outside the operation windows")?;
        let op = (rel / win_len) as u8;
        let at = win + rel % win_len;
        let sizes = match op {
            MEMIC_OP_ATOMIC_INCREMENT => device_mem_cap::MEMIC_ATOMIC_INCREMENT_SIZE_SUP,
            MEMIC_OP_ATOMIC_TEST_AND_SET => device_mem_cap::MEMIC_ATOMIC_TEST_AND_SET_SIZE_SUP,
            _ => return Err("an operation the model does not perform"),
        };
        if self.memic_ops() >> op & 1 == 0 {
            return Err("an operation not offered");
        }
        if !len.is_power_of_two() || len > 8 || self.dm_cap(sizes) >> len.trailing_zeros() & 1 == 0
        {
            return Err("an access size the operation does not take");
        }
        if at % len as u64 != 0 {
            return Err("an access not aligned to its size");
        }
        let (&start, _) = self
            .memic
            .allocs
            .range(..=at)
            .next_back()
            .filter(|&(&s, &n)| at + len as u64 <= s + n)
            .ok_or("outside every allocation")?;
        if !self.memic.ops.contains(&(start, op)) {
            return Err("an operation not mapped for this allocation");
        }
        Ok((op, at))
    }
}

/// `data` (1-8 bytes) as a big-endian number.
fn be_value(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[8 - data.len()..].copy_from_slice(data);
    u64::from_be_bytes(b)
}

impl Inner {
    /// Whether BAR0 `offset` lies in the MEMIC operation windows.
    pub(crate) fn in_memic_op_windows(&self, offset: u64) -> bool {
        self.memic_ops
            .is_some_and(|(s, l)| offset >= s && offset - s < l)
    }

    /// A trapped store to the operation windows.
    pub(crate) fn memic_op_store(&self, offset: u64, data: &[u8]) {
        let fw = lock(&self.fw);
        let why = match fw.memic_op_target(offset, data.len()) {
            Ok((MEMIC_OP_ATOMIC_INCREMENT, at)) => {
                let n = data.len();
                let mut cur = [0u8; 8];
                if self.bar.read(at as usize, &mut cur[..n]).is_ok() {
                    let sum = be_value(&cur[..n]).wrapping_add(be_value(data));
                    let _ = self.bar.write(at as usize, &sum.to_be_bytes()[8 - n..]);
                }
                return;
            }
            Ok(_) => "a store to an operation that stores nothing",
            Err(why) => why,
        };
        tracing::warn!(
            offset = format_args!("{offset:#x}"),
            len = data.len(),
            "MEMIC operation store dropped: {why}"
        );
    }

    /// A trapped load from the operation windows (all ones where it
    /// names no load).
    pub(crate) fn memic_op_load(&self, offset: u64, buf: &mut [u8]) {
        buf.fill(0xff);
        let fw = lock(&self.fw);
        let why = match fw.memic_op_target(offset, buf.len()) {
            Ok((MEMIC_OP_ATOMIC_TEST_AND_SET, at)) => {
                let n = buf.len();
                if self.bar.read(at as usize, buf).is_ok() {
                    let _ = self.bar.write(at as usize, &1u64.to_be_bytes()[8 - n..]);
                } else {
                    buf.fill(0xff);
                }
                return;
            }
            Ok(_) => "a load of an operation that loads nothing",
            Err(why) => why,
        };
        tracing::warn!(
            offset = format_args!("{offset:#x}"),
            len = buf.len(),
            "MEMIC operation load reads ones: {why}"
        );
    }
}

/// `areas` (offset, len) less `hole` (start, len).
pub(crate) fn carve(areas: &[(u64, u64)], hole: (u64, u64)) -> Vec<(u64, u64)> {
    let (hs, he) = (hole.0, hole.0 + hole.1);
    let mut out = Vec::with_capacity(areas.len() + 1);
    for &(o, l) in areas {
        let e = o + l;
        if e <= hs || o >= he {
            out.push((o, l));
            continue;
        }
        if o < hs {
            out.push((o, hs - o));
        }
        if e > he {
            out.push((he, e - he));
        }
    }
    out
}
