//! Device memory (MEMIC): `ibv_alloc_dm`, `ibv_memcpy_to_dm` /
//! `ibv_memcpy_from_dm`, `ibv_reg_dm_mr`, `ibv_free_dm`.
//!
//! What it follows:
//! - allocation as Linux's mlx5_ib (`dm.c` `handle_alloc_dm_memic`,
//!   `mlx5_cmd_alloc_memic`): the length rounded up to 64 bytes
//!   (`MLX5_MEMIC_BASE_SIZE`), the alignment asked for as log2 bytes
//!   turned into the PRM's 64 << n (`MLX5_MEMIC_BASE_ALIGN`), refused past
//!   `log_max_memic_addr_alignment`; ALLOC_MEMIC over the MEMIC window of
//!   BAR0 (`memic_bar_start_addr`, `memic_bar_size`) a page at a time from
//!   its start, NO_RESOURCES (Linux's -EAGAIN) meaning "try from the next
//!   page"; DEALLOC_MEMIC when the last user goes;
//! - access as libmlx5 (`mlx5_access_dm`): through the mapped BAR, in
//!   4-byte stores and loads, offset and length multiples of 4 (else
//!   EINVAL, "HW limitation"), the range inside the allocation (else
//!   EFAULT). Linux maps MEMIC write-combining; a store through a
//!   write-combining mapping is followed by `mmio_flush_writes`, so the
//!   bytes have left the CPU before a later doorbell asks the device to
//!   read them (the same rule as BlueFlame copies); an uncached or
//!   write-back mapping needs none;
//! - registration as mlx5_ib's `mlx5_ib_reg_dm_mr`: access within
//!   `MLX5_IB_DM_MEMIC_ALLOWED_ACCESS`, an mkey of access mode MEMIC whose
//!   `start_addr` is the memory's BAR0 offset plus the offset asked for,
//!   zero-based (work requests address it from 0), the range inside the
//!   allocation as ib_core's `UVERBS_METHOD_REG_DM_MR` checks it;
//! - operation addresses as mlx5_ib's `MLX5_IB_METHOD_DM_MAP_OP_ADDR`
//!   (`mlx5dv_dm_map_op_addr`): refused (NotSupported, Linux's
//!   EOPNOTSUPP) unless `memic_operations` offers the type, MODIFY_MEMIC
//!   op_mod ALLOC for the address, op_mod DEALLOC when the [`DmOp`] goes.
//!   Loads and stores at the address are side effects, not memory: they
//!   go through the function's region access (vfio-pci's pread/pwrite of
//!   the BAR, vfio-user REGION_READ/WRITE, the model's trapped access),
//!   one access each, as wide as asked (1, 2, 4 or 8 bytes where the caps'
//!   size bits allow), aligned to its width and inside the allocation.

use std::sync::Arc;

use mlx5_hw::ifc::DeallocMemicIn;
use mlx5_hw::ifc::{alloc_memic_in, alloc_memic_out, dealloc_memic_in, dealloc_memic_out};
use mlx5_hw::ifc::{create_mkey_in, create_mkey_out};
use mlx5_hw::ifc::{modify_memic_in, modify_memic_out, ModifyMemicIn, ModifyMemicOut};
use mlx5_hw::ifc::{AllocMemicIn, AllocMemicOut, CreateMkeyIn, CreateMkeyOut};
use mlx5_hw::init::{
    MEMIC_OP_ATOMIC_INCREMENT, MEMIC_OP_ATOMIC_TEST_AND_SET, MODIFY_MEMIC_OP_MOD_ALLOC,
    MODIFY_MEMIC_OP_MOD_DEALLOC,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use mlx5_hw::wqe::MKC_ACCESS_MODE_MEMIC;

use crate::device::{Context, Ctx};
use crate::mr::{access, Sge, MKC_QPN_NONE};
use crate::pd::{Pd, PdInner};
use crate::{Error, Result};

/// Allocations are whole 64-byte units (`MLX5_MEMIC_BASE_SIZE`).
pub const MEMIC_BASE_SIZE: u64 = 64;
/// log2 of the alignment the PRM's field counts from (`MLX5_MEMIC_BASE_ALIGN`).
const MEMIC_BASE_ALIGN: u32 = 6;
/// The access a device-memory MR may ask for
/// (`MLX5_IB_DM_MEMIC_ALLOWED_ACCESS`).
pub const DM_ALLOWED_ACCESS: u32 = access::LOCAL_WRITE
    | access::REMOTE_WRITE
    | access::REMOTE_READ
    | access::REMOTE_ATOMIC
    | access::ZERO_BASED;

#[derive(Debug)]
struct DmInner {
    ctx: Arc<Ctx>,
    /// BAR0 offset of the allocation.
    start: u64,
    /// Bytes allocated (the length asked for, rounded up to 64).
    size: u64,
    /// The length asked for: what memcpy may touch.
    len: u64,
}

impl Drop for DmInner {
    fn drop(&mut self) {
        let mut inb = [0u8; dealloc_memic_in::SIZE_BYTES];
        DeallocMemicIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DeallocMemic.to_raw())
            .set_memic_start_addr(self.start)
            .set_memic_size(self.size as u32);
        if let Err(e) = self.ctx.hca.cmd().exec(&inb, dealloc_memic_out::SIZE_BYTES) {
            tracing::warn!("DEALLOC_MEMIC at {:#x}: {e}", self.start);
        }
    }
}

/// Device memory (`struct ibv_dm`): bytes of the adapter's own memory,
/// reached by MMIO through BAR0 and by the device's DMA through an MR
/// ([`Pd::reg_dm_mr`]).
#[derive(Debug)]
pub struct Dm {
    inner: Arc<DmInner>,
}

impl Context {
    /// The largest device-memory allocation (`ibv_device_attr_ex`'s
    /// `max_dm_size`, mlx5_ib's `max_memic_size`); 0 without MEMIC.
    pub fn max_dm_size(&self) -> u64 {
        self.ctx
            .hca
            .caps()
            .device_mem()
            .filter(|d| d.memic())
            .map_or(0, |d| u64::from(d.max_memic_size()))
    }

    /// `ibv_alloc_dm`: `length` bytes of device memory aligned to
    /// `2^log_align` bytes (at least 64).
    pub fn alloc_dm(&self, length: u64, log_align: u32) -> Result<Dm> {
        let c = &self.ctx;
        let caps = c.hca.caps();
        let Some(dm) = caps.device_mem().filter(|d| d.memic()) else {
            return Err(Error::NotSupported("device memory (MEMIC)"));
        };
        if length == 0 || length > u64::from(dm.max_memic_size()) {
            return Err(Error::Invalid("device memory length"));
        }
        let size = length.next_multiple_of(MEMIC_BASE_SIZE);
        let align = log_align.saturating_sub(MEMIC_BASE_ALIGN);
        if align > u32::from(dm.log_max_memic_addr_alignment()) {
            return Err(Error::Invalid("device memory alignment"));
        }
        let (win, win_len) = (dm.memic_bar_start_addr(), u64::from(dm.memic_bar_size()));
        let page = vfio::dma::PAGE_SIZE as u64;
        let range = size.next_multiple_of(page);
        let mut inb = [0u8; alloc_memic_in::SIZE_BYTES];
        AllocMemicIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::AllocMemic.to_raw())
            .set_range_size(range as u32)
            .set_memic_size(size as u32)
            .set_log_memic_addr_alignment(align as u8);
        let mut at = 0;
        while at + range <= win_len {
            AllocMemicIn::new_unchecked(&mut inb[..]).set_range_start_addr(win + at);
            match c.hca.cmd().exec(&inb, alloc_memic_out::SIZE_BYTES) {
                Ok(out) => {
                    let start = AllocMemicOut::new_unchecked(&out[..]).memic_start_addr();
                    return Ok(Dm {
                        inner: Arc::new(DmInner {
                            ctx: c.clone(),
                            start,
                            size,
                            len: length,
                        }),
                    });
                }
                Err(Error::Cmd {
                    status: CmdStatus::NoResources,
                    ..
                }) => at += page,
                Err(e) => return Err(e),
            }
        }
        Err(Error::QueueFull("device memory (MEMIC) exhausted"))
    }
}

impl Dm {
    /// Bytes usable (the length asked for).
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Never: an allocation has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The memory's offset in BAR0.
    pub fn bar_offset(&self) -> u64 {
        self.inner.start
    }

    /// Where `[offset, offset + len)` is in BAR0, after libmlx5's checks.
    fn bar_range(&self, offset: u64, len: usize) -> Result<usize> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.inner.len) {
            return Err(Error::Fault("past the device memory"));
        }
        if offset % 4 != 0 || len % 4 != 0 {
            return Err(Error::Invalid(
                "device memory access not 4-byte aligned in offset and length",
            ));
        }
        Ok((self.inner.start + offset) as usize)
    }

    /// `ibv_memcpy_to_dm`: `data` into the memory at `offset`.
    pub fn memcpy_to_dm(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.bar_range(offset, data.len())?;
        let bar = self.inner.ctx.hca.bar();
        for (i, w) in data.chunks_exact(4).enumerate() {
            let v = u32::from_be_bytes([w[0], w[1], w[2], w[3]]);
            bar.write32_be(at + 4 * i, v)?;
        }
        if bar.mem_type().needs_flush() {
            vfio::mmio::mmio_flush_writes();
        }
        Ok(())
    }

    /// `ibv_memcpy_from_dm`: the memory at `offset` into `out`.
    pub fn memcpy_from_dm(&self, out: &mut [u8], offset: u64) -> Result<()> {
        let at = self.bar_range(offset, out.len())?;
        let bar = self.inner.ctx.hca.bar();
        for (i, w) in out.chunks_exact_mut(4).enumerate() {
            w.copy_from_slice(&bar.read32_be(at + 4 * i)?.to_be_bytes());
        }
        Ok(())
    }

    /// `ibv_free_dm`: refused (`Busy`) while MRs or operation addresses
    /// ([`DmOp`]) over it exist.
    pub fn free(self) -> Result<()> {
        match Arc::try_unwrap(self.inner) {
            Ok(i) => {
                drop(i);
                Ok(())
            }
            Err(inner) => {
                std::mem::forget(Dm { inner });
                Err(Error::Busy(
                    "MRs or operation addresses over the device memory exist",
                ))
            }
        }
    }
}

impl Dm {
    /// `mlx5dv_dm_map_op_addr`: the address where loads and stores perform
    /// operation `op` (`MEMIC_OP_*`) on this memory.
    pub fn map_op_addr(&self, op: u8) -> Result<DmOp> {
        let c = &self.inner.ctx;
        let caps = c.hca.caps();
        let offered = caps.device_mem().map_or(0, |d| d.memic_operations());
        if op >= 32 || offered >> op & 1 == 0 {
            return Err(Error::NotSupported("device memory operation"));
        }
        let out = modify_memic(&self.inner, MODIFY_MEMIC_OP_MOD_ALLOC, op)?;
        Ok(DmOp {
            dm: self.inner.clone(),
            op,
            addr: ModifyMemicOut::new_unchecked(&out[..]).memic_operation_addr(),
        })
    }
}

fn modify_memic(dm: &DmInner, op_mod: u16, op: u8) -> Result<Vec<u8>> {
    let mut inb = [0u8; modify_memic_in::SIZE_BYTES];
    ModifyMemicIn::new_unchecked(&mut inb[..])
        .set_opcode(Opcode::ModifyMemic.to_raw())
        .set_op_mod(op_mod)
        .set_memic_operation_type(op)
        .set_memic_start_addr(dm.start);
    dm.ctx.hca.cmd().exec(&inb, modify_memic_out::SIZE_BYTES)
}

/// An operation address of device memory ([`Dm::map_op_addr`]); unmapped
/// (MODIFY_MEMIC DEALLOC) when dropped. Holds the memory.
#[derive(Debug)]
pub struct DmOp {
    dm: Arc<DmInner>,
    op: u8,
    addr: u64,
}

impl DmOp {
    /// The operation's BAR0 offset (for the memory's byte 0).
    pub fn bar_offset(&self) -> u64 {
        self.addr
    }

    /// Checks one access of `len` bytes at `offset`; its BAR0 offset.
    fn at(&self, offset: u64, len: usize) -> Result<u64> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|e| e > self.dm.len)
        {
            return Err(Error::Fault("past the device memory"));
        }
        let caps = self.dm.ctx.hca.caps();
        let sizes = caps.device_mem().map_or(0, |d| match self.op {
            MEMIC_OP_ATOMIC_INCREMENT => d.memic_atomic_increment_size_sup(),
            MEMIC_OP_ATOMIC_TEST_AND_SET => d.memic_atomic_test_and_set_size_sup(),
            _ => 0xf,
        });
        if !len.is_power_of_two() || len > 8 || sizes >> len.trailing_zeros() & 1 == 0 {
            return Err(Error::Invalid("device memory operation access size"));
        }
        if offset % len as u64 != 0 {
            return Err(Error::Invalid("device memory operation access not aligned"));
        }
        Ok(self.addr + offset)
    }

    /// One store of `data` (1, 2, 4 or 8 bytes) at `offset` of the memory:
    /// the operation's store (atomic increment: adds `data`).
    pub fn store(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.at(offset, data.len())?;
        Ok(self.dm.ctx.hca.function().region_write(0, at, data)?)
    }

    /// One load of `out.len()` bytes at `offset` of the memory: the
    /// operation's load (test-and-set: the old bytes, 1 left there).
    pub fn load(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let at = self.at(offset, out.len())?;
        Ok(self.dm.ctx.hca.function().region_read(0, at, out)?)
    }
}

impl Drop for DmOp {
    fn drop(&mut self) {
        if let Err(e) = modify_memic(&self.dm, MODIFY_MEMIC_OP_MOD_DEALLOC, self.op) {
            tracing::warn!(
                "MODIFY_MEMIC unmap of op {} at {:#x}: {e}",
                self.op,
                self.dm.start
            );
        }
    }
}

/// A memory region over device memory (`ibv_reg_dm_mr`): zero-based,
/// addressed from 0 by work requests.
#[derive(Debug)]
pub struct DmMr {
    pd: Arc<PdInner>,
    _dm: Arc<DmInner>,
    mkey: u32,
    len: u64,
    /// DESTROY_MKEY ran ([`DmMr::dereg`]).
    done: bool,
}

impl Pd {
    /// `ibv_reg_dm_mr(pd, dm, offset, length, access)`: `access` must hold
    /// `ZERO_BASED` (verbs requires it) and nothing outside
    /// [`DM_ALLOWED_ACCESS`]; `offset + length` inside the allocation.
    pub fn reg_dm_mr(&self, dm: &Dm, offset: u64, length: u64, acc: u32) -> Result<DmMr> {
        if acc & !DM_ALLOWED_ACCESS != 0 || acc & access::ZERO_BASED == 0 {
            return Err(Error::Invalid("device memory MR access flags"));
        }
        crate::mr::check_access(acc & !access::ZERO_BASED)?;
        // As ib_core's UVERBS_METHOD_REG_DM_MR: against the length asked
        // for (not the 64-byte units allocated); an empty MR is allowed.
        let asked = dm.inner.len;
        if offset > asked || length > asked - offset {
            return Err(Error::Invalid("device memory MR past the allocation"));
        }
        let pd = &self.inner;
        let mut inb = vec![0u8; create_mkey_in::SIZE_BYTES];
        {
            let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
            c.set_opcode(Opcode::CreateMkey.to_raw());
            let (ro_w, ro_r) = crate::ordering::mkc_relaxed_bits(&pd.ctx, acc);
            c.memory_key_mkey_entry_mut()
                .set_access_mode_1_0(MKC_ACCESS_MODE_MEMIC & 3)
                .set_access_mode_4_2(MKC_ACCESS_MODE_MEMIC >> 2)
                .set_lr(true)
                .set_lw(acc & access::LOCAL_WRITE != 0)
                .set_rr(acc & access::REMOTE_READ != 0)
                .set_rw(acc & access::REMOTE_WRITE != 0)
                .set_a(acc & access::REMOTE_ATOMIC != 0)
                .set_relaxed_ordering_write(ro_w)
                .set_relaxed_ordering_read(ro_r)
                .set_qpn(MKC_QPN_NONE)
                .set_pd(pd.pdn)
                .set_start_addr(dm.inner.start + offset)
                .set_len(length);
        }
        let out = pd.ctx.hca.cmd().exec(&inb, create_mkey_out::SIZE_BYTES)?;
        Ok(DmMr {
            pd: pd.clone(),
            _dm: dm.inner.clone(),
            mkey: CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8,
            len: length,
            done: false,
        })
    }
}

impl DmMr {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.mkey
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.mkey
    }

    /// Bytes registered.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never: a registration has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An SGE of `len` bytes from `offset` (zero-based), checked against
    /// the region.
    pub fn sge(&self, offset: u64, len: u32) -> Result<Sge> {
        if offset
            .checked_add(u64::from(len))
            .is_none_or(|e| e > self.len)
        {
            return Err(Error::Invalid("SGE outside its MR"));
        }
        Ok(Sge {
            addr: offset,
            length: len,
            lkey: self.mkey,
        })
    }

    /// QUERY_MKEY of the region's key.
    pub fn query_mkey(&self) -> Result<crate::mkey_query::MkeyAttr> {
        crate::mkey_query::query_mkey(&self.pd.ctx, self.mkey)
    }
}

impl DmMr {
    /// `ibv_dereg_mr`: DESTROY_MKEY, its failure returned (a drop logs it).
    pub fn dereg(mut self) -> Result<()> {
        self.done = true;
        self.destroy_mkey()
    }

    fn destroy_mkey(&self) -> Result<()> {
        crate::mr::destroy_mkey(&self.pd.ctx, self.mkey)
    }
}

impl Drop for DmMr {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = self.destroy_mkey() {
            tracing::warn!("DESTROY_MKEY {:#x} (device memory MR): {e}", self.mkey);
        }
    }
}
