//! What the driver relies on from a [`PciFunction`], checked the same way on
//! every backend: the in-process device model on the host, and the kernel
//! backend in the guest (`kernel-vfio-guest`). The driver's bring-up
//! (`verbs::hca::Hca::open`) uses exactly these behaviours, so a backend
//! that passes them runs it unchanged.

use std::sync::Arc;

use vfio::function::CONFIG_REGION;
use vfio::{pci, DmaBuffer, Error, Iova, IovaAllocator, IrqKind, PciFunction};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// One named check and its outcome.
pub type Outcome = (&'static str, Result<(), String>);

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn e2s(e: Error) -> String {
    e.to_string()
}

/// Runs every contract check on `f` and names each.
pub fn check(f: &dyn PciFunction) -> Vec<Outcome> {
    vec![
        ("contract_bar0_maps_whole_from_offset_0", bar0_whole(f)),
        ("contract_config_region_is_config_space", config_region(f)),
        ("contract_command_register_enables", command_register(f)),
        ("contract_dma_map_unmap_exact", dma_exact(f)),
        ("contract_dma_refusals", dma_refusals(f)),
        ("contract_backend_holds_mapped_buffers", holds_buffers(f)),
        ("contract_irq_attach_detach", irqs(f)),
    ]
}

/// `Hca::open` maps BAR0 and reads the init segment at BAR offsets.
fn bar0_whole(f: &dyn PciFunction) -> Result<(), String> {
    let info = f.region_info(0).map_err(e2s)?;
    let bar = f.map_region(0).map_err(e2s)?;
    ensure(bar.bar_offset() == 0, || {
        format!("mapping starts at BAR offset {:#x}", bar.bar_offset())
    })?;
    ensure(bar.len() as u64 == info.size, || {
        format!("mapped {:#x} of {:#x} bytes", bar.len(), info.size)
    })?;
    // A mapped read and a trapped read of the same register agree.
    let mapped = bar.read32_be(0).map_err(e2s)?;
    let mut b = [0u8; 4];
    f.region_read(0, 0, &mut b).map_err(e2s)?;
    ensure(u32::from_be_bytes(b) == mapped, || {
        format!("trapped read {b:x?} != mapped read {mapped:#x}")
    })
}

fn config_region(f: &dyn PciFunction) -> Result<(), String> {
    let mut a = [0u8; 4];
    let mut b = [0u8; 4];
    f.config_read(pci::VENDOR_ID, &mut a).map_err(e2s)?;
    f.region_read(CONFIG_REGION, pci::VENDOR_ID, &mut b)
        .map_err(e2s)?;
    ensure(a == b && a != [0xff; 4] && a != [0; 4], || {
        format!("config_read {a:x?} vs region_read {b:x?}")
    })
}

fn command_register(f: &dyn PciFunction) -> Result<(), String> {
    let mut b = [0u8; 2];
    f.config_read(pci::COMMAND, &mut b).map_err(e2s)?;
    let want = u16::from_le_bytes(b) | pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER;
    f.config_write(pci::COMMAND, &want.to_le_bytes())
        .map_err(e2s)?;
    f.config_read(pci::COMMAND, &mut b).map_err(e2s)?;
    let got = u16::from_le_bytes(b);
    ensure(
        got & (pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER)
            == pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER,
        || format!("COMMAND reads {got:#x} after writing {want:#x}"),
    )
}

fn allocator(f: &dyn PciFunction) -> Result<IovaAllocator, String> {
    let ranges = f.iova_ranges().map_err(e2s)?;
    ensure(!ranges.is_empty(), || "no usable IOVA ranges".into())?;
    Ok(IovaAllocator::new(&ranges))
}

fn dma_exact(f: &dyn PciFunction) -> Result<(), String> {
    let mut a = allocator(f)?;
    let before = f.dma_mappings();
    let buf = DmaBuffer::new(16384).map_err(e2s)?;
    let iova = a.alloc(16384).map_err(e2s)?;
    f.dma_map(iova, &buf).map_err(e2s)?;
    ensure(f.dma_mappings() == before + 1, || {
        "mapping count did not grow".into()
    })?;
    let partial = f.dma_unmap(iova, 8192);
    ensure(matches!(partial, Err(Error::Iova { .. })), || {
        format!("unmapping half a mapping gave {partial:?}")
    })?;
    ensure(f.dma_mappings() == before + 1, || {
        "a refused unmap changed the count".into()
    })?;
    f.dma_unmap(iova, 16384).map_err(e2s)?;
    ensure(f.dma_mappings() == before, || {
        "mapping count did not shrink".into()
    })?;
    let again = f.dma_unmap(iova, 16384);
    ensure(matches!(again, Err(Error::Iova { .. })), || {
        format!("unmapping twice gave {again:?}")
    })
}

fn dma_refusals(f: &dyn PciFunction) -> Result<(), String> {
    let mut a = allocator(f)?;
    let buf = DmaBuffer::new(8192).map_err(e2s)?;
    let iova = a.alloc(8192).map_err(e2s)?;
    let unaligned = f.dma_map(Iova(iova.0 + 512), &buf);
    ensure(matches!(unaligned, Err(Error::Iova { .. })), || {
        format!("unaligned map gave {unaligned:?}")
    })?;
    f.dma_map(iova, &buf).map_err(e2s)?;
    let other = DmaBuffer::new(4096).map_err(e2s)?;
    let overlap = f.dma_map(Iova(iova.0 + 4096), &other);
    let overlap_ok = matches!(overlap, Err(Error::Iova { .. }));
    f.dma_unmap(iova, 8192).map_err(e2s)?;
    ensure(overlap_ok, || format!("overlapping map gave {overlap:?}"))?;
    // The first address past every usable range.
    let ranges = f.iova_ranges().map_err(e2s)?;
    let beyond = ranges.iter().map(|r| r.last).max().unwrap_or(0);
    if let Some(out) = beyond.checked_add(1) {
        let r = f.dma_map(Iova(out), &other);
        ensure(matches!(r, Err(Error::Iova { .. })), || {
            format!("map past the usable ranges at {out:#x} gave {r:?}")
        })?;
    }
    Ok(())
}

fn holds_buffers(f: &dyn PciFunction) -> Result<(), String> {
    let mut a = allocator(f)?;
    let buf = DmaBuffer::new(4096).map_err(e2s)?;
    let iova = a.alloc(4096).map_err(e2s)?;
    let alone = Arc::strong_count(&buf);
    f.dma_map(iova, &buf).map_err(e2s)?;
    let held = Arc::strong_count(&buf);
    f.dma_unmap(iova, 4096).map_err(e2s)?;
    let after = Arc::strong_count(&buf);
    ensure(held > alone && after == alone, || {
        format!("strong counts alone {alone}, mapped {held}, unmapped {after}")
    })
}

fn irqs(f: &dyn PciFunction) -> Result<(), String> {
    let kind = if f.irq_count(IrqKind::MsiX).map_err(e2s)? > 0 {
        IrqKind::MsiX
    } else {
        IrqKind::Msi
    };
    let n = f.irq_count(kind).map_err(e2s)?;
    ensure(n > 0, || "neither MSI-X nor MSI".into())?;
    let fd = EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?;
    let past = f.set_irqs(kind, n, &[Some(&fd)]);
    ensure(matches!(past, Err(Error::NoVector { .. })), || {
        format!("{kind:?} vector {n} of {n} gave {past:?}")
    })?;
    // All at once, detach all, then once more (the driver's open/close cycle).
    let fds: Vec<EventFd> = (0..n.min(4))
        .map(|_| EventFd::new(EFD_NONBLOCK))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let refs: Vec<Option<&EventFd>> = fds.iter().map(Some).collect();
    for _ in 0..2 {
        f.set_irqs(kind, 0, &refs).map_err(e2s)?;
        f.set_irqs(kind, 0, &[]).map_err(e2s)?;
    }
    Ok(())
}
