//! Doorbell records, packed in pages.
//!
//! Each QP, CQ and SRQ has a doorbell record: a few big-endian counters in
//! host memory the device reads (`dbr_addr` in its context). As Linux's
//! `mlx5_db_alloc` and rdma-core's `dbrec.c` do, records are one cache line
//! each ([`DBREC_SIZE`], so two queues' counters never share a line), 64 to
//! a 4 KiB page, and the pages are pieces of the queue-memory arena
//! ([`crate::buf`]). A page goes back to the arena when its last record
//! does; a record whose queue could not be destroyed stays taken until the
//! function is closed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vfio::{DmaBuffer, DmaRing, Iova};

use crate::buf::{zero, Piece};
use crate::dma::DmaCtx;
use crate::{Error, Result};

/// Bytes per doorbell record: a cache line (the records of a QP or CQ take
/// 8 of them).
pub const DBREC_SIZE: usize = 64;
const PAGE: usize = 4096;
const PER_PAGE: usize = PAGE / DBREC_SIZE;
const _: () = assert!(PER_PAGE == 64, "one u64 bitmap per page");

#[derive(Debug)]
struct Page {
    piece: Piece,
    /// Bit `i`: record `i` is taken.
    used: u64,
}

/// The pages of records, by IOVA.
#[derive(Debug, Default)]
pub(crate) struct DbrecPool {
    pages: Mutex<BTreeMap<u64, Page>>,
}

impl DbrecPool {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Page>> {
        self.pages.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A zeroed record, from a page with room or a new page.
    pub(crate) fn alloc(&self, dma: &DmaCtx) -> Result<Piece> {
        let mut pages = self.lock();
        if let Some(p) = pages.values_mut().find(|p| p.used != u64::MAX) {
            return Ok(p.take());
        }
        let piece = dma.bufs.alloc(dma, PAGE)?;
        let mut p = Page { piece, used: 0 };
        let r = p.take();
        pages.insert(p.piece.iova.0, p);
        Ok(r)
    }

    /// Gives record `r` back (zeroed), or keeps it taken when `quarantine`;
    /// an empty page goes back to the arena.
    pub(crate) fn free(&self, dma: &DmaCtx, r: &Piece, quarantine: bool) {
        if quarantine {
            return;
        }
        let mut pages = self.lock();
        let page = r.iova.0 & !(PAGE as u64 - 1);
        let Some(p) = pages.get_mut(&page) else {
            tracing::warn!("freeing doorbell record {:#x}: no page holds it", r.iova);
            return;
        };
        let bit = 1u64 << ((r.iova.0 - page) as usize / DBREC_SIZE);
        if p.used & bit == 0 {
            tracing::warn!("doorbell record {:#x} freed twice", r.iova);
            return;
        }
        p.used &= !bit;
        if p.used == 0 {
            if let Some(p) = pages.remove(&page) {
                drop(pages);
                dma.bufs.free(dma, &p.piece, false);
            }
        } else if let Err(e) = zero(&r.buf, r.offset, DBREC_SIZE) {
            tracing::warn!("zeroing doorbell record {:#x}: {e}", r.iova);
        }
    }

    /// (pages, records taken).
    pub(crate) fn counts(&self) -> (usize, usize) {
        let pages = self.lock();
        let recs = pages.values().map(|p| p.used.count_ones() as usize).sum();
        (pages.len(), recs)
    }

    /// Forgets every page (the arena unmaps its chunks next).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }
}

impl Page {
    fn take(&mut self) -> Piece {
        let i = (!self.used).trailing_zeros() as usize;
        self.used |= 1 << i;
        Piece {
            buf: self.piece.buf.clone(),
            offset: self.piece.offset + i * DBREC_SIZE,
            len: DBREC_SIZE,
            iova: Iova(self.piece.iova.0 + (i * DBREC_SIZE) as u64),
        }
    }
}

/// One queue's doorbell record, given back on drop.
#[derive(Debug)]
pub(crate) struct Dbrec {
    dma: Arc<DmaCtx>,
    rec: Piece,
    keep: AtomicBool,
}

impl Dbrec {
    pub(crate) fn new(dma: Arc<DmaCtx>, rec: Piece) -> Self {
        Self {
            dma,
            rec,
            keep: AtomicBool::new(false),
        }
    }

    /// The device's address of the record (`dbr_addr`), 64-byte aligned.
    pub(crate) fn iova(&self) -> Iova {
        self.rec.iova
    }

    /// The buffer the record lies in.
    pub(crate) fn buf(&self) -> &Arc<DmaBuffer> {
        &self.rec.buf
    }

    /// Where the record starts in [`buf`](Self::buf).
    pub(crate) fn offset(&self) -> usize {
        self.rec.offset
    }

    /// The counter(s) at `off` of the record, as a one-entry ring.
    pub(crate) fn ring<const S: usize>(&self, off: usize) -> Result<DmaRing<S>> {
        if off.checked_add(S).is_none_or(|e| e > DBREC_SIZE) {
            return Err(Error::Vfio(vfio::Error::OutOfBounds {
                what: "doorbell record",
                offset: off as u64,
                len: S as u64,
                size: DBREC_SIZE as u64,
            }));
        }
        Ok(DmaRing::new(
            self.rec.buf.clone(),
            self.rec.offset + off,
            1,
        )?)
    }

    /// The queue's DESTROY failed: the device may still read or write the
    /// record, so it is never handed out again.
    pub(crate) fn device_may_still_use(&self) {
        self.keep.store(true, Ordering::Relaxed);
    }
}

impl Drop for Dbrec {
    fn drop(&mut self) {
        let keep = self.keep.load(Ordering::Relaxed);
        self.dma.dbrecs.free(&self.dma, &self.rec, keep);
    }
}
