//! The mkey cache: free, UMR-enabled MTT keys made ahead and reused, so a
//! registration is a UMR on the driver's UMR QP instead of a CREATE_MKEY,
//! and a deregistration a UMR instead of a DESTROY_MKEY (Linux's
//! `drivers/infiniband/hw/mlx5/mr.c` mkey cache; PRM "User-Mode Memory
//! Registration").
//!
//! Keys are kept by order: a key of order `o` has room for `2^o` MTT
//! entries (at least 8, the 64 bytes UMR moves at a time,
//! `MLX5_UMR_FLEX_ALIGNMENT`), so a region of `n` entries takes a key of
//! order `ceil(log2(max(n, 8)))`. A key is made free (CREATE_MKEY with
//! `free`, `umr_en`, MTT mode, 4 KiB pages, the UMR QP's PD, as
//! `mlx5_cache_ent` keys); a registration takes one of its order (or
//! makes one: counted in [`MkeyCacheCounts::created`]) and enables it by
//! one UMR that checks it is free (`MLX5_UMR_CHECK_NOT_FREE`) and sets
//! the PD, access, start, length, page size and the MTT inline, as
//! `mlx5r_umr_update_mr_pas` with the enable mask. Deregistration revokes
//! it (`mlx5r_umr_revoke_mr`: free, the UMR QP's PD) before the memory is
//! unmapped, and keeps it for the next registration up to `keep` per
//! order; beyond that, or if the revoke fails, DESTROY_MKEY.
//!
//! Used for regions whose access UMR can set (`mlx5r_umr_can_reconfig`
//! from nothing) and whose MTT fits inline (
//! [`crate::umr::UMR_INLINE_MTT_MAX`]); others take CREATE_MKEY as before.
//!
//! The cache is on while its handle ([`Context::enable_mkey_cache`]) is
//! held (a region taken from it holds it too); it holds the UMR QP, and
//! dropping it destroys the keys it kept.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mlx5_hw::ifc::{create_mkey_in, create_mkey_out, CreateMkeyIn, CreateMkeyOut};
use mlx5_hw::opcode::Opcode;

use crate::device::{Context, Ctx};
use crate::mr::{Placement, MKC_QPN_NONE};
use crate::pd::PdInner;
use crate::umr::{UmrCheck, UmrEngine, UmrWr, UmrXlt, UMR_INLINE_MTT_MAX};
use crate::Result;

/// Smallest order: 8 MTT entries (64 bytes).
const MIN_ORDER: u32 = 3;

/// What the cache did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MkeyCacheCounts {
    /// Keys made by CREATE_MKEY (a registration found none of its order,
    /// or [`MkeyCache::prefill`]).
    pub created: u64,
    /// Registrations that took a kept key (no command).
    pub reused: u64,
    /// Deregistrations that kept their key (no command).
    pub returned: u64,
    /// Keys destroyed (over `keep`, a failed revoke, or the cache dropped).
    pub destroyed: u64,
}

/// The mkey cache of a context.
#[derive(Debug)]
pub struct MkeyCache {
    ctx: Arc<Ctx>,
    engine: Arc<UmrEngine>,
    keep: usize,
    /// Free keys by order.
    free: Mutex<BTreeMap<u32, Vec<u32>>>,
    created: AtomicU64,
    reused: AtomicU64,
    returned: AtomicU64,
    destroyed: AtomicU64,
}

impl Context {
    /// Turns the mkey cache on, keeping up to `keep` free keys per order,
    /// while the handle returned (or a region registered through it)
    /// lives; registrations of this context use it from now on. If it is
    /// on already, its handle.
    pub fn enable_mkey_cache(&self, keep: usize) -> Result<Arc<MkeyCache>> {
        let mut w = self
            .ctx
            .mkey_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = w.upgrade() {
            return Ok(c);
        }
        let c = Arc::new(MkeyCache {
            ctx: self.ctx.clone(),
            engine: self.ctx.umr_engine()?,
            keep,
            free: Mutex::default(),
            created: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            destroyed: AtomicU64::new(0),
        });
        *w = Arc::downgrade(&c);
        Ok(c)
    }
}

/// The order of a key with room for `entries` MTT entries.
pub fn order_of(entries: usize) -> u32 {
    entries
        .max(1 << MIN_ORDER)
        .next_power_of_two()
        .trailing_zeros()
}

impl MkeyCache {
    /// What it did so far.
    pub fn counts(&self) -> MkeyCacheCounts {
        MkeyCacheCounts {
            created: self.created.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            returned: self.returned.load(Ordering::Relaxed),
            destroyed: self.destroyed.load(Ordering::Relaxed),
        }
    }

    /// Free keys kept now, all orders.
    pub fn kept(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    /// Makes `n` free keys of order `order` now (Linux fills its cache
    /// entries ahead of use the same way), kept up to `keep`.
    pub fn prefill(&self, order: u32, n: usize) -> Result<()> {
        for _ in 0..n {
            let k = self.create(order)?;
            self.keep_or_destroy(order, k);
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Vec<u32>>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// CREATE_MKEY of a free MTT key of `order`, in the UMR QP's PD.
    fn create(&self, order: u32) -> Result<u32> {
        let mut inb = vec![0u8; create_mkey_in::SIZE_BYTES];
        {
            let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
            c.set_opcode(Opcode::CreateMkey.to_raw());
            c.memory_key_mkey_entry_mut()
                .set_access_mode_1_0(mlx5_hw::wqe::MKC_ACCESS_MODE_MTT)
                .set_free(true)
                .set_umr_en(true)
                .set_lr(true)
                .set_qpn(MKC_QPN_NONE)
                .set_pd(self.engine.pdn)
                .set_translations_octword_size(1 << (order - 1))
                .set_log_page_size(mlx5_hw::wqe::MKC_MIN_LOG_PAGE_SIZE as u8);
        }
        let out = self.ctx.hca.cmd().exec(&inb, create_mkey_out::SIZE_BYTES)?;
        self.created.fetch_add(1, Ordering::Relaxed);
        Ok(CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8)
    }

    fn destroy(&self, mkey: u32) -> Result<()> {
        match crate::mr::destroy_mkey(&self.ctx, mkey) {
            Ok(_) => {
                self.destroyed.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                tracing::warn!("DESTROY_MKEY of cached mkey {mkey:#x}: {e}");
                Err(e)
            }
        }
    }

    fn keep_or_destroy(&self, order: u32, mkey: u32) -> bool {
        let mut f = self.lock();
        let v = f.entry(order).or_default();
        if v.len() < self.keep {
            v.push(mkey);
            return true;
        }
        drop(f);
        // A free key reaches no memory: a failure only leaks the key.
        let _ = self.destroy(mkey);
        false
    }

    /// Whether a region of `access` over `at` goes through the cache.
    pub(crate) fn fits(&self, access: u32, at: &Placement) -> bool {
        at.layout.entries <= UMR_INLINE_MTT_MAX && crate::umr::can_reconfig(&self.ctx, 0, access)
    }

    /// A key for the region `addr .. addr + len` of `pd` with `access`
    /// over `at`: a kept one (or a new one) enabled by UMR. The key, its
    /// MTT room, and the UMR QP (the region holds it).
    pub(crate) fn take(
        &self,
        pd: &PdInner,
        addr: u64,
        len: u64,
        access: u32,
        at: &Placement,
    ) -> Result<(u32, usize, Arc<UmrEngine>)> {
        let n = at.layout.entries;
        let order = order_of(n);
        let kept = self.lock().get_mut(&order).and_then(Vec::pop);
        let mkey = match kept {
            Some(k) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                k
            }
            None => self.create(order)?,
        };
        let wr = UmrWr {
            check: UmrCheck::Free,
            access: Some(access),
            pdn: Some(pd.pdn),
            free: Some(false),
            xlt: Some(UmrXlt {
                start: addr,
                len,
                log_page: at.layout.log_page,
            }),
            ..UmrWr::new(mkey)
        };
        let mtt: Vec<u64> = (0..n).map(|i| at.mtt(i)).collect();
        if let Err(e) = self.engine.post_wait(&wr, &mtt) {
            // Refused: the key is as it was, free; a failure only leaks it.
            let _ = self.destroy(mkey);
            return Err(e);
        }
        Ok((mkey, 1 << order, self.engine.clone()))
    }

    /// A region's key back (before its memory is unmapped): revoked by
    /// UMR (free, the UMR QP's PD) and kept, or destroyed. An error: the
    /// key may still reach the memory (neither worked).
    pub(crate) fn give_back(&self, mkey: u32, room: usize) -> Result<()> {
        let wr = UmrWr {
            check: UmrCheck::NotFree,
            pdn: Some(self.engine.pdn),
            free: Some(true),
            ..UmrWr::new(mkey)
        };
        if let Err(e) = self.engine.post(&wr) {
            tracing::warn!("revoking cached mkey {mkey:#x}: {e}");
            return self.destroy(mkey);
        }
        if self.keep_or_destroy(order_of(room), mkey) {
            self.returned.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Drop for MkeyCache {
    fn drop(&mut self) {
        let all: Vec<u32> = std::mem::take(&mut *self.lock())
            .into_values()
            .flatten()
            .collect();
        for k in all {
            // Free keys: a failure only leaks the key.
            let _ = self.destroy(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_start_at_eight_entries() {
        assert_eq!(order_of(1), 3);
        assert_eq!(order_of(8), 3);
        assert_eq!(order_of(9), 4);
        assert_eq!(order_of(32), 5);
    }
}
