//! DMA memory the device may touch: a buffer, its IOVA and its mapping,
//! released together.

use std::sync::{Arc, Mutex};

use vfio::{DmaBuffer, Iova, IovaAllocator, PciFunction};

use crate::Result;

/// The function's DMA address space as the driver manages it: one IOVA
/// allocator shared by the command queue, EQs and the page supply.
#[derive(Debug)]
pub(crate) struct DmaCtx {
    pub(crate) func: Arc<dyn PciFunction>,
    iova: Mutex<IovaAllocator>,
}

impl DmaCtx {
    pub(crate) fn new(func: Arc<dyn PciFunction>) -> Result<Arc<Self>> {
        let ranges = func.iova_ranges()?;
        Ok(Arc::new(Self {
            func,
            iova: Mutex::new(IovaAllocator::new(&ranges)),
        }))
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
