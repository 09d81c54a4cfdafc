//! The in-process backend: a device model behind the [`PciFunction`] interface.
//!
//! A device model implements [`DeviceModel`] (the device side: config space,
//! regions, reset) and is given a [`Bus`] when it is made: the [`DmaSpace`]
//! through which it reaches the IOVAs the driver mapped, and the
//! [`Interrupts`] through which it raises MSI-X vectors. Those are the only
//! ways in and out, exactly as for silicon behind an IOMMU:
//!
//! - BAR memory the driver maps is a memfd the model also maps
//!   ([`DeviceModel::region_memory`]); the model notices the driver's stores
//!   by polling it, as a vfio-user server does, and trapped accesses
//!   ([`PciFunction::region_write`]) reach [`DeviceModel::region_write`];
//! - `dma_map` maps the driver's buffer a second time, from its file, into
//!   the model's IOVA space (`vm-memory`); an access to an unmapped IOVA is a
//!   [`DmaFault`], as an IOMMU fault is;
//! - `set_irqs` hands the driver's eventfds to [`Interrupts`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestRegionMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::function::CONFIG_REGION;
use crate::iova_memory::IovaMemory;
use crate::{DmaBuffer, Error, Iova, IovaRange, IrqKind, Mmio, PciFunction, RegionInfo, Result};

/// The device side of an emulated PCI function.
pub trait DeviceModel: Send + Sync + std::fmt::Debug {
    /// A name for logs and tools (`emu:cx4lx`).
    fn name(&self) -> String;
    /// Config-space read.
    fn config_read(&self, offset: u64, buf: &mut [u8]);
    /// Config-space write.
    fn config_write(&self, offset: u64, data: &[u8]);
    /// Region `index`, if the function has it.
    fn region_info(&self, index: u32) -> Option<RegionInfo>;
    /// The shared memory behind region `index`'s mappable areas.
    fn region_memory(&self, index: u32) -> Option<Arc<DmaBuffer>>;
    /// A trapped read of region `index`.
    fn region_read(&self, index: u32, offset: u64, buf: &mut [u8]);
    /// A trapped write of region `index`.
    fn region_write(&self, index: u32, offset: u64, data: &[u8]);
    /// How many vectors of `kind` the function has.
    fn irq_count(&self, kind: IrqKind) -> u32;
    /// Function-level reset.
    fn reset(&self);
    /// The owner let go of the function: stop background work.
    fn shutdown(&self);
}

/// A DMA to an IOVA that is not mapped (an IOMMU fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("IOMMU fault: DMA {dir} of {len} bytes at IOVA {iova:#x} is not mapped")]
pub struct DmaFault {
    /// The faulting IOVA.
    pub iova: u64,
    /// Length of the access.
    pub len: usize,
    /// "read" or "write".
    pub dir: &'static str,
}

/// What keeps a mapping's memory alive while the device may touch it.
#[derive(Debug, Clone)]
enum Backing {
    /// A driver's buffer (in-process backend).
    Buffer(#[allow(dead_code)] Arc<DmaBuffer>),
    /// Process memory the driver's caller keeps alive until the unmap
    /// (`PciFunction::dma_map_host`).
    Host,
    /// A file another process shared (vfio-user DMA_MAP, a vhost-user
    /// memory table region).
    File(#[allow(dead_code)] Arc<std::fs::File>),
    /// Memory its owner did not share: every access is a message.
    Message(Arc<dyn DmaByMessage>),
    /// Part of a larger mapping of a file (a hugetlbfs file maps only in
    /// whole huge pages): the region is a view into `window`, which lives
    /// until no snapshot holds the region any more (see `DmaSpace::retire`).
    Window {
        region: Arc<GuestRegionMmap>,
        #[allow(dead_code)]
        window: Arc<MmapRegion<()>>,
    },
}

/// Memory a client did not share by fd (vfio-user `DMA_MAP` without one:
/// QEMU's ROM and other regions that have no file), reached one access at a
/// time by messages (`DMA_READ` / `DMA_WRITE`). Such a range is part of the
/// IOVA space for [`DmaSpace::read`], [`DmaSpace::write`] and
/// [`DmaSpace::is_mapped`], not of a [`DmaSpace::memory`] snapshot.
pub trait DmaByMessage: Send + Sync + std::fmt::Debug {
    /// Fills `buf` from `iova`; false when the owner refused or is gone.
    fn read(&self, iova: u64, buf: &mut [u8]) -> bool;
    /// Writes `data` at `iova`; false when the owner refused or is gone.
    fn write(&self, iova: u64, data: &[u8]) -> bool;
}

/// The IOVA space as the device sees it.
///
/// Filled by the in-process backend's `dma_map`, or by a server from the
/// regions its client shares by file descriptor ([`DmaSpace::map_file`]).
#[derive(Debug, Default)]
pub struct DmaSpace {
    /// What the device reaches: every mapping's region and the device's
    /// own memory. Locked after `maps`.
    mem: RwLock<Arc<IovaMemory>>,
    /// The driver's mappings (the device's own memory is in `mem` only).
    maps: Mutex<BTreeMap<u64, (u64, Backing)>>,
    /// Unmapped windows whose regions a snapshot may still hold.
    retired: Mutex<Vec<Backing>>,
}

impl DmaSpace {
    /// Reads `buf.len()` bytes at `iova`.
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> std::result::Result<(), DmaFault> {
        let mem = self.snapshot();
        if mem.read_slice(buf, GuestAddress(iova)).is_ok()
            || self
                .by_message(iova, buf.len())
                .is_some_and(|m| m.read(iova, buf))
        {
            return Ok(());
        }
        Err(DmaFault {
            iova,
            len: buf.len(),
            dir: "read",
        })
    }

    /// Writes `data` at `iova`.
    pub fn write(&self, iova: u64, data: &[u8]) -> std::result::Result<(), DmaFault> {
        let mem = self.snapshot();
        if mem.write_slice(data, GuestAddress(iova)).is_ok()
            || self
                .by_message(iova, data.len())
                .is_some_and(|m| m.write(iova, data))
        {
            return Ok(());
        }
        Err(DmaFault {
            iova,
            len: data.len(),
            dir: "write",
        })
    }

    /// The message-backed mapping holding all of `iova .. iova + len`.
    fn by_message(&self, iova: u64, len: usize) -> Option<Arc<dyn DmaByMessage>> {
        let maps = self.lock_maps();
        let end = iova.checked_add(len as u64)?;
        match maps.range(..=iova).next_back() {
            Some((&s, (l, Backing::Message(m)))) if s + l >= end => Some(m.clone()),
            _ => None,
        }
    }

    /// Maps `len` bytes at `iova` that are reached by messages to `owner`
    /// (the memory was not shared). Unmapped as any other mapping.
    pub fn map_by_message(&self, iova: u64, len: u64, owner: Arc<dyn DmaByMessage>) -> Result<()> {
        region_size(iova, len)?;
        let mut maps = self.lock_maps();
        Self::check_free(&maps, iova, len)?;
        maps.insert(iova, (len, Backing::Message(owner)));
        Ok(())
    }

    /// Refuses a range that wraps or overlaps a mapping.
    fn check_free(maps: &BTreeMap<u64, (u64, Backing)>, iova: u64, len: u64) -> Result<()> {
        let end = iova.checked_add(len).ok_or(Error::Iova {
            iova,
            len,
            why: "range wraps",
        })?;
        let clash = maps
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &(l, _))| s + l > iova);
        if clash {
            return Err(Error::Iova {
                iova,
                len,
                why: "overlaps an existing mapping",
            });
        }
        Ok(())
    }

    /// Reads a big-endian u32 at `iova`.
    pub fn read_u32_be(&self, iova: u64) -> std::result::Result<u32, DmaFault> {
        let mut b = [0u8; 4];
        self.read(iova, &mut b)?;
        Ok(u32::from_be_bytes(b))
    }

    /// Writes a big-endian u32 at `iova`.
    pub fn write_u32_be(&self, iova: u64, v: u32) -> std::result::Result<(), DmaFault> {
        self.write(iova, &v.to_be_bytes())
    }

    /// Whether every byte of `iova .. iova + len` is mapped.
    pub fn is_mapped(&self, iova: u64, len: u64) -> bool {
        let maps = self.lock_maps();
        let end = iova.saturating_add(len);
        let mut at = iova;
        while at < end {
            match maps.range(..=at).next_back() {
                Some((&s, &(l, _))) if s + l > at => at = s + l,
                _ => return false,
            }
        }
        true
    }

    /// How many mappings exist.
    pub fn mappings(&self) -> usize {
        self.lock_maps().len()
    }

    /// The IOVA space as it is now: a device model that moves data in
    /// bulk takes it once per batch and copies between two spaces without
    /// a bounce buffer (`get_slice` + `copy_to_volatile_slice`). Later maps
    /// and unmaps do not change a snapshot already taken.
    pub fn memory(&self) -> Arc<IovaMemory> {
        self.snapshot()
    }

    fn snapshot(&self) -> Arc<IovaMemory> {
        match self.mem.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn lock_maps(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (u64, Backing)>> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn map(&self, iova: u64, buf: &Arc<DmaBuffer>) -> Result<()> {
        self.insert(
            iova,
            buf.len() as u64,
            buf.file().clone(),
            0,
            Backing::Buffer(buf.clone()),
        )
    }

    /// Maps `len` bytes of `file` from `file_offset` at `iova`: how a server
    /// takes memory its client shares by descriptor (vfio-user `DMA_MAP`, a
    /// vhost-user memory-table region). The file stays open until
    /// [`unmap`](Self::unmap) or [`clear`](Self::clear).
    pub fn map_file(
        &self,
        iova: u64,
        len: u64,
        file: Arc<std::fs::File>,
        file_offset: u64,
    ) -> Result<()> {
        self.insert(iova, len, file.clone(), file_offset, Backing::File(file))
    }

    fn insert(
        &self,
        iova: u64,
        len: u64,
        file: Arc<std::fs::File>,
        file_offset: u64,
        keep: Backing,
    ) -> Result<()> {
        let size = region_size(iova, len)?;
        let page = crate::host_memory::file_page_size(&file) as u64;
        if page > 4096 && (file_offset | len) % page != 0 {
            return self.insert_window(iova, len, file, file_offset, page);
        }
        let region = MmapRegion::<()>::from_file(FileOffset::from_arc(file, file_offset), size)
            .map_err(|e| Error::Os {
                op: "mmap(DMA memory, device side)",
                source: std::io::Error::other(e.to_string()),
            })?;
        self.insert_region(iova, len, region, keep)
    }

    /// Maps `len` bytes of a hugetlbfs file from `file_offset`, which are
    /// not whole `page`s: the whole pages around them are mapped (a
    /// hugetlb mapping starts and ends on its pages) and the range is a
    /// view into that window.
    fn insert_window(
        &self,
        iova: u64,
        len: u64,
        file: Arc<std::fs::File>,
        file_offset: u64,
        page: u64,
    ) -> Result<()> {
        let size = region_size(iova, len)?;
        let start = file_offset - file_offset % page;
        let end = file_offset
            .checked_add(len)
            .map(|e| e.next_multiple_of(page))
            .ok_or(Error::Iova {
                iova,
                len,
                why: "file offset wraps",
            })?;
        let os = |e: vm_memory::mmap::MmapRegionError| Error::Os {
            op: "mmap(DMA memory, device side)",
            source: std::io::Error::other(e.to_string()),
        };
        let window = Arc::new(
            MmapRegion::<()>::from_file(FileOffset::from_arc(file, start), (end - start) as usize)
                .map_err(os)?,
        );
        let at = window.as_ptr().wrapping_add((file_offset - start) as usize);
        // SAFETY: `at .. at + size` lies inside `window` (start <= offset,
        // offset + len <= end), which the region's Backing::Window keeps
        // mapped until no snapshot holds the region (`retire`); `build_raw`
        // neither owns nor unmaps it.
        let view = unsafe {
            MmapRegion::<()>::build_raw(
                at,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
        }
        .map_err(os)?;
        let region = Arc::new(GuestRegionMmap::new(view, GuestAddress(iova)).ok_or(
            Error::Iova {
                iova,
                len,
                why: "does not fit the address space",
            },
        )?);
        let keep = Backing::Window {
            region: region.clone(),
            window,
        };
        self.insert_arc(iova, len, region, keep)
    }

    /// Keeps the windows of unmapped regions until no snapshot holds
    /// their regions (then only the backing does).
    fn retire(&self, gone: impl IntoIterator<Item = Backing>) {
        let mut r = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        r.extend(
            gone.into_iter()
                .filter(|b| matches!(b, Backing::Window { .. })),
        );
        r.retain(|b| matches!(b, Backing::Window { region, .. } if Arc::strong_count(region) > 1));
    }

    /// Maps host memory of this process at `iova`.
    ///
    /// # Safety
    ///
    /// As [`PciFunction::dma_map_host`]: the memory stays mapped until the
    /// unmap and is accessed only volatilely.
    unsafe fn map_host(&self, iova: u64, addr: u64, len: u64) -> Result<()> {
        let size = region_size(iova, len)?;
        // SAFETY: the caller guarantees `addr .. addr + len` is mapped
        // read/write memory of this process until the unmap; `build_raw`
        // does not take ownership of (nor unmap) it.
        let region = unsafe {
            MmapRegion::<()>::build_raw(
                addr as *mut u8,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
        }
        .map_err(|e| Error::Os {
            op: "wrap host memory for DMA",
            source: std::io::Error::other(e.to_string()),
        })?;
        self.insert_region(iova, len, region, Backing::Host)
    }

    fn insert_region(
        &self,
        iova: u64,
        len: u64,
        region: MmapRegion<()>,
        keep: Backing,
    ) -> Result<()> {
        let region = GuestRegionMmap::new(region, GuestAddress(iova)).ok_or(Error::Iova {
            iova,
            len,
            why: "does not fit the address space",
        })?;
        self.insert_arc(iova, len, Arc::new(region), keep)
    }

    fn insert_arc(
        &self,
        iova: u64,
        len: u64,
        region: Arc<GuestRegionMmap>,
        keep: Backing,
    ) -> Result<()> {
        self.retire([]);
        let mut maps = self.lock_maps();
        Self::check_free(&maps, iova, len)?;
        let mut mem = self.mem.write().unwrap_or_else(|p| p.into_inner());
        if mem.overlaps(iova, len) {
            return Err(Error::Iova {
                iova,
                len,
                why: "overlaps an existing mapping",
            });
        }
        *mem = Arc::new(mem.with(region));
        maps.insert(iova, (len, keep));
        Ok(())
    }

    /// Unmaps the mapping that starts at `iova` and is `len` bytes long.
    pub fn unmap(&self, iova: u64, len: u64) -> Result<()> {
        let mut maps = self.lock_maps();
        match maps.get(&iova) {
            Some((l, Backing::Message(_))) if *l == len => {
                maps.remove(&iova);
                return Ok(());
            }
            Some(&(l, _)) if l == len => {}
            _ => {
                return Err(Error::Iova {
                    iova,
                    len,
                    why: "no mapping starts there with that length",
                })
            }
        }
        let mut mem = self.mem.write().unwrap_or_else(|p| p.into_inner());
        *mem = Arc::new(mem.without([iova]));
        drop(mem);
        let gone = maps.remove(&iova).map(|(_, b)| b);
        drop(maps);
        self.retire(gone);
        Ok(())
    }

    /// Unmaps every mapping that lies wholly inside `iova .. iova + len`,
    /// as the kernel's type1 IOMMU answers VFIO_IOMMU_UNMAP_DMA: a range
    /// holding no mapping unmaps nothing and succeeds (QEMU invalidates a
    /// whole IOMMU address space in power-of-two pieces that way), one
    /// that would split a mapping is refused and unmaps nothing. Returns
    /// the bytes unmapped.
    pub fn unmap_within(&self, iova: u64, len: u64) -> Result<u64> {
        // Inclusive last address: QEMU unmaps up to the top of the 64-bit
        // space (0xfef00000 + 0xffffffff01100000 ends at 2^64).
        if len == 0 {
            return Ok(0);
        }
        let last = iova.checked_add(len - 1).ok_or(Error::Iova {
            iova,
            len,
            why: "does not fit the address space",
        })?;
        let mut maps = self.lock_maps();
        let mut inside = Vec::new();
        for (&start, &(l, _)) in maps.range(..=last) {
            let end = start.saturating_add(l.saturating_sub(1));
            if end < iova {
                continue;
            }
            if start < iova || end > last {
                return Err(Error::Iova {
                    iova,
                    len,
                    why: "would split a mapping",
                });
            }
            inside.push((start, l));
        }
        if inside.is_empty() {
            return Ok(0);
        }
        // Only the mappings go: the device's own memory stays (a client's
        // DMA_UNMAP to the top of the space, as QEMU sends at reset, must
        // not take the MEMIC away).
        {
            let mut mem = self.mem.write().unwrap_or_else(|p| p.into_inner());
            *mem = Arc::new(mem.without(inside.iter().map(|&(start, _)| start)));
        }
        let gone: Vec<Backing> = inside
            .iter()
            .filter_map(|(start, _)| maps.remove(start).map(|(_, b)| b))
            .collect();
        drop(maps);
        self.retire(gone);
        Ok(inside.iter().map(|&(_, l)| l).sum())
    }

    /// Places `len` bytes of the device's own memory (`file` from
    /// `file_offset`: a model's BAR memory, say) at `iova`, an address the
    /// driver's IOVA ranges do not reach, so the device's DMA engine reaches
    /// it as it reaches host memory (on-device memory such as mlx5's
    /// MEMIC). Not a driver mapping: [`mappings`](Self::mappings) does not
    /// count it and [`clear`](Self::clear) keeps it.
    pub fn map_device_memory(
        &self,
        iova: u64,
        len: u64,
        file: Arc<std::fs::File>,
        file_offset: u64,
    ) -> Result<()> {
        let size = region_size(iova, len)?;
        let region = MmapRegion::<()>::from_file(FileOffset::from_arc(file, file_offset), size)
            .map_err(|e| Error::Os {
                op: "mmap(device memory)",
                source: std::io::Error::other(e.to_string()),
            })?;
        let region = Arc::new(GuestRegionMmap::new(region, GuestAddress(iova)).ok_or(
            Error::Iova {
                iova,
                len,
                why: "does not fit the address space",
            },
        )?);
        let maps = self.lock_maps();
        let mut mem = self.mem.write().unwrap_or_else(|p| p.into_inner());
        if mem.overlaps(iova, len) || Self::check_free(&maps, iova, len).is_err() {
            return Err(Error::Iova {
                iova,
                len,
                why: "overlaps an existing mapping",
            });
        }
        *mem = Arc::new(mem.with(region));
        Ok(())
    }

    /// Unmaps everything (the owner let go of the function); the device's
    /// own memory stays.
    pub fn clear(&self) {
        let mut maps = self.lock_maps();
        let mut mem = self.mem.write().unwrap_or_else(|p| p.into_inner());
        *mem = Arc::new(mem.without(maps.keys().copied()));
        drop(mem);
        let gone = std::mem::take(&mut *maps);
        drop(maps);
        self.retire(gone.into_values().map(|(_, b)| b));
    }
}

/// The size of a mapping of `len` bytes at `iova` as the host maps it:
/// neither empty nor larger than the address space.
fn region_size(iova: u64, len: u64) -> Result<usize> {
    if len == 0 {
        return Err(Error::Iova {
            iova,
            len,
            why: "empty range",
        });
    }
    usize::try_from(len).map_err(|_| Error::Iova {
        iova,
        len,
        why: "larger than the address space",
    })
}

/// Interrupt vectors as the device raises them.
#[derive(Debug, Default)]
pub struct Interrupts {
    vectors: Mutex<BTreeMap<(IrqKind, u32), EventFd>>,
}

impl Interrupts {
    /// Raises vector `vector` of `kind`; false if nothing is attached to it.
    pub fn signal(&self, kind: IrqKind, vector: u32) -> bool {
        let v = self.vectors.lock().unwrap_or_else(|p| p.into_inner());
        match v.get(&(kind, vector)) {
            Some(fd) => fd.write(1).is_ok(),
            None => false,
        }
    }

    /// How many eventfds are attached.
    pub fn attached(&self) -> usize {
        self.vectors.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// How many eventfds are attached to vectors of `kind`.
    pub fn attached_of(&self, kind: IrqKind) -> usize {
        let v = self.vectors.lock().unwrap_or_else(|p| p.into_inner());
        v.keys().filter(|(k, _)| *k == kind).count()
    }

    /// Routes vectors `start ..` of `kind` to (duplicates of) `fds`; `None`
    /// detaches a vector, an empty `fds` detaches every vector of `kind`.
    /// A server calls this with the eventfds its client sent.
    pub fn set(&self, kind: IrqKind, start: u32, fds: &[Option<&EventFd>]) -> Result<()> {
        let mut v = self.vectors.lock().unwrap_or_else(|p| p.into_inner());
        if fds.is_empty() {
            v.retain(|(k, _), _| *k != kind);
            return Ok(());
        }
        for (i, fd) in fds.iter().enumerate() {
            let key = (kind, start + i as u32);
            match fd {
                Some(fd) => {
                    let dup = fd.try_clone().map_err(|e| Error::Os {
                        op: "dup(eventfd)",
                        source: e,
                    })?;
                    v.insert(key, dup);
                }
                None => {
                    v.remove(&key);
                }
            }
        }
        Ok(())
    }
}

/// What a device model is given to reach the outside: DMA and interrupts.
#[derive(Debug, Clone)]
pub struct Bus {
    /// The IOVA space.
    pub dma: Arc<DmaSpace>,
    /// The interrupt vectors.
    pub irqs: Arc<Interrupts>,
}

impl Bus {
    /// An empty IOVA space and no vectors attached: what a server builds a
    /// device model on before its client maps anything.
    pub fn new() -> Self {
        Self {
            dma: Arc::new(DmaSpace::default()),
            irqs: Arc::new(Interrupts::default()),
        }
    }
}

impl Default for Bus {
    fn default() -> Self {
        Self::new()
    }
}

/// An in-process device model owned as a [`PciFunction`].
#[derive(Debug)]
pub struct EmulatedFunction<M: DeviceModel> {
    name: String,
    model: Arc<M>,
    bus: Bus,
}

impl<M: DeviceModel> EmulatedFunction<M> {
    /// Makes the model with a fresh bus and wraps it.
    pub fn new(make: impl FnOnce(Bus) -> M) -> Self {
        let bus = Bus::new();
        let model = Arc::new(make(bus.clone()));
        Self {
            name: model.name(),
            model,
            bus,
        }
    }

    /// The model, for tests that inspect or steer it (fault injection).
    pub fn model(&self) -> &Arc<M> {
        &self.model
    }

    /// The bus, for tests that count mappings and eventfds.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }
}

/// The config-space offset of capability `id`, walking the list.
pub(crate) fn find_capability(model: &dyn DeviceModel, id: u8) -> Option<u64> {
    let mut b = [0u8; 1];
    model.config_read(crate::pci::CAPABILITIES_POINTER, &mut b);
    let mut at = u64::from(b[0] & !3);
    for _ in 0..48 {
        if at == 0 {
            return None;
        }
        let mut hdr = [0u8; 2];
        model.config_read(at, &mut hdr);
        if hdr[0] == id {
            return Some(at);
        }
        at = u64::from(hdr[1] & !3);
    }
    None
}

/// Sets or clears MSI-X enable in the function's config space, as vfio-pci
/// does when vectors are attached or all released (the in-process backend
/// and the vfio-user server both play vfio-pci's part).
pub(crate) fn set_msix_enable(model: &dyn DeviceModel, on: bool) {
    let Some(cap) = find_capability(model, crate::pci::CAP_ID_MSIX) else {
        return;
    };
    let off = cap + crate::pci::MSIX_MSG_CTRL;
    let mut b = [0u8; 2];
    model.config_read(off, &mut b);
    let mut ctrl = u16::from_le_bytes(b);
    if on {
        ctrl |= crate::pci::MSIX_CTRL_ENABLE;
    } else {
        ctrl &= !crate::pci::MSIX_CTRL_ENABLE;
    }
    model.config_write(off, &ctrl.to_le_bytes());
}

impl<M: DeviceModel> Drop for EmulatedFunction<M> {
    fn drop(&mut self) {
        self.model.shutdown();
        // As vfio-pci does when the device is released: nothing stays mapped.
        self.bus.dma.clear();
        let _ = self.bus.irqs.set(IrqKind::MsiX, 0, &[]);
    }
}

impl<M: DeviceModel> PciFunction for EmulatedFunction<M> {
    fn name(&self) -> &str {
        &self.name
    }

    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.model.config_read(offset, buf);
        Ok(())
    }

    fn config_write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.model.config_write(offset, data);
        Ok(())
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo> {
        self.model.region_info(index).ok_or(Error::NoRegion(index))
    }

    fn region_read(&self, index: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        if index == CONFIG_REGION {
            return self.config_read(offset, buf);
        }
        let info = self.region_info(index)?;
        bounds(&info, offset, buf.len())?;
        self.model.region_read(index, offset, buf);
        Ok(())
    }

    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<()> {
        if index == CONFIG_REGION {
            return self.config_write(offset, data);
        }
        let info = self.region_info(index)?;
        bounds(&info, offset, data.len())?;
        self.model.region_write(index, offset, data);
        Ok(())
    }

    fn map_region(&self, index: u32) -> Result<Mmio> {
        let mem = self
            .model
            .region_memory(index)
            .ok_or(Error::NotMappable(index))?;
        let region =
            MmapRegion::<()>::from_file(FileOffset::from_arc(mem.file().clone(), 0), mem.len())
                .map_err(|e| Error::Os {
                    op: "mmap(BAR)",
                    source: std::io::Error::other(e.to_string()),
                })?;
        // The model's BAR is ordinary memory (a memfd its worker scans).
        Ok(Mmio::with_type(region, 0, crate::MemType::WriteBack))
    }

    fn irq_count(&self, kind: IrqKind) -> Result<u32> {
        Ok(self.model.irq_count(kind))
    }

    fn set_irqs(&self, kind: IrqKind, start: u32, fds: &[Option<&EventFd>]) -> Result<()> {
        let count = self.model.irq_count(kind);
        if !fds.is_empty() && start as u64 + fds.len() as u64 > count as u64 {
            return Err(Error::NoVector {
                kind,
                vector: start,
                count,
            });
        }
        if fds.is_empty() && self.bus.irqs.attached_of(kind) == 0 {
            // vfio-pci's vfio_pci_set_msi_trigger: disabling an index that
            // is not enabled is EINVAL (a second detach, say).
            return Err(Error::Os {
                op: "VFIO_DEVICE_SET_IRQS (disable an index not enabled)",
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        self.bus.irqs.set(kind, start, fds)?;
        if kind == IrqKind::MsiX {
            // vfio-pci enables MSI-X in the function's config space when
            // vectors are attached and disables it when they are all
            // released; the driver never writes that bit itself.
            set_msix_enable(&*self.model, self.bus.irqs.attached_of(IrqKind::MsiX) > 0);
        }
        Ok(())
    }

    fn iova_ranges(&self) -> Result<Vec<IovaRange>> {
        // What an x86 IOMMU offers: everything below 2^48 but the MSI window.
        Ok(vec![
            IovaRange {
                start: 0,
                last: 0xfedf_ffff,
            },
            IovaRange {
                start: 0xfef0_0000,
                last: (1 << 48) - 1,
            },
        ])
    }

    fn dma_map(&self, iova: Iova, buf: &Arc<DmaBuffer>) -> Result<()> {
        if iova.0 % 4096 != 0 {
            return Err(Error::Iova {
                iova: iova.0,
                len: buf.len() as u64,
                why: "not 4 KiB aligned",
            });
        }
        let in_range = self
            .iova_ranges()?
            .iter()
            .any(|r| iova.0 >= r.start && iova.0.saturating_add(buf.len() as u64 - 1) <= r.last);
        if !in_range {
            return Err(Error::Iova {
                iova: iova.0,
                len: buf.len() as u64,
                why: "outside the usable IOVA ranges",
            });
        }
        self.bus.dma.map(iova.0, buf)
    }

    unsafe fn dma_map_host(&self, iova: Iova, addr: u64, len: u64) -> Result<()> {
        if iova.0 % 4096 != 0 || addr % 4096 != 0 || len % 4096 != 0 {
            return Err(Error::Iova {
                iova: iova.0,
                len,
                why: "host mapping not 4 KiB aligned",
            });
        }
        let in_range = self
            .iova_ranges()?
            .iter()
            .any(|r| iova.0 >= r.start && len > 0 && iova.0.saturating_add(len - 1) <= r.last);
        if !in_range {
            return Err(Error::Iova {
                iova: iova.0,
                len,
                why: "outside the usable IOVA ranges",
            });
        }
        // SAFETY: forwarded from this method's own contract.
        unsafe { self.bus.dma.map_host(iova.0, addr, len) }
    }

    fn dma_unmap(&self, iova: Iova, len: u64) -> Result<()> {
        self.bus.dma.unmap(iova.0, len)
    }

    fn dma_mappings(&self) -> usize {
        self.bus.dma.mappings()
    }

    fn reset(&self) -> Result<()> {
        self.model.reset();
        Ok(())
    }
}

fn bounds(info: &RegionInfo, offset: u64, len: usize) -> Result<()> {
    if offset.checked_add(len as u64).is_none_or(|e| e > info.size) {
        return Err(Error::OutOfBounds {
            what: "region",
            offset,
            len: len as u64,
            size: info.size,
        });
    }
    Ok(())
}

#[cfg(test)]
mod device_memory_tests {
    use std::sync::Arc;

    use vm_memory::{Bytes, GuestAddress};

    use super::DmaSpace;
    use crate::DmaBuffer;

    /// A client's unmap of everything above an address (QEMU's reset unmaps
    /// to 2^64) leaves the device's own memory reachable, as clear() does.
    #[test]
    fn unmap_within_keeps_the_device_memory() {
        let dma = DmaSpace::default();
        let host = DmaBuffer::new(4096).unwrap();
        dma.map_file(0x1000, 4096, host.file().clone(), 0).unwrap();
        let dev = DmaBuffer::new(4096).unwrap();
        dev.write(0, &[0x5a; 8]).unwrap();
        let at = 1u64 << 56;
        dma.map_device_memory(at, 4096, dev.file().clone(), 0)
            .unwrap();
        assert_eq!(dma.unmap_within(0x1000, u64::MAX - 0xfff).unwrap(), 4096);
        let mem: Arc<_> = dma.memory();
        let mut b = [0u8; 8];
        mem.read_slice(&mut b, GuestAddress(at)).unwrap();
        assert_eq!(b, [0x5a; 8]);
        assert!(mem.read_slice(&mut b, GuestAddress(0x1000)).is_err());
    }
}
