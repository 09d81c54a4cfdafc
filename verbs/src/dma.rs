//! DMA memory the device may touch: a buffer, its IOVA and its mapping,
//! released together.

use std::sync::{Arc, Mutex};

use vfio::{DmaBuffer, Iova, IovaAllocator, PciFunction};

use crate::buf::{ArenaStats, BufArena, DmaSlice};
use crate::dbrec::{Dbrec, DbrecPool};
use crate::Result;

/// The function's DMA address space as the driver manages it: one IOVA
/// allocator shared by the command queue, the page supply and the
/// queue-memory arena (EQ, CQ, QP and SRQ buffers, doorbell records).
#[derive(Debug)]
pub(crate) struct DmaCtx {
    pub(crate) func: Arc<dyn PciFunction>,
    iova: Mutex<IovaAllocator>,
    pub(crate) bufs: BufArena,
    pub(crate) dbrecs: DbrecPool,
}

impl DmaCtx {
    pub(crate) fn new(func: Arc<dyn PciFunction>) -> Result<Arc<Self>> {
        let ranges = func.iova_ranges()?;
        Ok(Arc::new(Self {
            func,
            iova: Mutex::new(IovaAllocator::new(&ranges)),
            bufs: BufArena::default(),
            dbrecs: DbrecPool::default(),
        }))
    }

    /// A zeroed queue buffer of at least `len` bytes from the arena (a
    /// power of two of at least 4 KiB, its IOVA aligned to its size).
    pub(crate) fn alloc_buf(self: &Arc<Self>, len: usize) -> Result<DmaSlice> {
        let p = self.bufs.alloc(self, len)?;
        Ok(DmaSlice::new(self.clone(), p))
    }

    /// A zeroed doorbell record.
    pub(crate) fn alloc_dbrec(self: &Arc<Self>) -> Result<Dbrec> {
        let r = self.dbrecs.alloc(self)?;
        Ok(Dbrec::new(self.clone(), r))
    }

    /// What the queue-memory arena holds now.
    pub(crate) fn queue_memory(&self) -> ArenaStats {
        let (dbrec_pages, dbrecs) = self.dbrecs.counts();
        ArenaStats {
            dbrec_pages,
            dbrecs,
            ..self.bufs.stats()
        }
    }

    /// Allocates `len` bytes (rounded up to a power of two, at least 4 KiB)
    /// of zeroed DMA memory at an IOVA aligned to its size, with one mapping.
    pub(crate) fn alloc(self: &Arc<Self>, len: usize) -> Result<DmaRegion> {
        let len = len.max(vfio::dma::PAGE_SIZE).next_power_of_two();
        let buf = DmaBuffer::new(len)?;
        let iova = self
            .iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc_aligned(len as u64, len as u64)?;
        if let Err(e) = self.func.dma_map(iova, &buf) {
            self.free_iova(iova, len as u64);
            return Err(e.into());
        }
        Ok(DmaRegion {
            ctx: self.clone(),
            buf,
            iova,
        })
    }

    /// Reserves `len` bytes of IOVA space aligned to `align` (a power of two).
    pub(crate) fn alloc_iova(&self, len: u64, align: u64) -> Result<Iova> {
        Ok(self
            .iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc_aligned(len, align)?)
    }

    pub(crate) fn free_iova(&self, iova: Iova, len: u64) {
        if let Err(e) = self
            .iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free(iova, len)
        {
            tracing::warn!("freeing IOVA {iova:#x}+{len:#x}: {e}");
        }
    }
}

impl Drop for DmaCtx {
    /// Every queue is gone (each holds the context): what is left are
    /// pieces kept out of use after a failed DESTROY, and the function is
    /// closed, so their chunks are unmapped now.
    fn drop(&mut self) {
        self.dbrecs.clear();
        self.bufs.release_all(self);
    }
}

/// A mapped DMA buffer; unmapped and its IOVA freed on drop.
#[derive(Debug)]
pub(crate) struct DmaRegion {
    ctx: Arc<DmaCtx>,
    pub(crate) buf: Arc<DmaBuffer>,
    pub(crate) iova: Iova,
}

impl DmaRegion {
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        let len = self.buf.len() as u64;
        if let Err(e) = self.ctx.func.dma_unmap(self.iova, len) {
            tracing::warn!("dma_unmap({:#x}, {len:#x}): {e}", self.iova);
        }
        self.ctx.free_iova(self.iova, len);
    }
}
