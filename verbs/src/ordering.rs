//! Ordering attributes of memory and queues: relaxed ordering of memory
//! keys (`IBV_ACCESS_RELAXED_ORDERING`) and, in `data_in_order`, which
//! work requests' data the device writes in order.
//!
//! Relaxed ordering follows mlx5_ib's `set_mkc_access_pd_addr_fields`
//! (Linux 6.12 `drivers/infiniband/hw/mlx5/mr.c`): the access flag is one
//! of verbs' optional flags, so it is never refused; it sets mkc
//! `relaxed_ordering_write` when the general caps offer
//! `relaxed_ordering_write`, and `relaxed_ordering_read` when they offer
//! `relaxed_ordering_read`, or `relaxed_ordering_read_pci_enabled` while
//! the function's PCIe device control has relaxed ordering enabled
//! (`pcie_relaxed_ordering_enabled`). Where neither is offered (the
//! ConnectX-4 Lx) the flag is dropped silently, as rdma-core drops
//! optional access flags a device lacks.

use vfio::pci;
use vfio::PciFunction;

use crate::device::Ctx;
use crate::mr::access::RELAXED_ORDERING;

/// The mkc relaxed-ordering bits `(write, read)` for verbs access flags
/// `access` on this device.
pub(crate) fn mkc_relaxed_bits(ctx: &Ctx, access: u32) -> (bool, bool) {
    if access & RELAXED_ORDERING == 0 {
        return (false, false);
    }
    let g = ctx.hca.caps().gen();
    let write = g.relaxed_ordering_write();
    let read = g.relaxed_ordering_read()
        || (g.relaxed_ordering_read_pci_enabled()
            && pcie_relaxed_ordering_enabled(ctx.hca.function().as_ref()));
    (write, read)
}

/// Whether the function's PCI Express device control enables relaxed
/// ordering (Linux's `pcie_relaxed_ordering_enabled`). A function without
/// a PCI Express capability, or whose config space cannot be read, does
/// not.
pub fn pcie_relaxed_ordering_enabled(f: &dyn PciFunction) -> bool {
    let Some(cap) = find_capability(f, pci::CAP_ID_EXP) else {
        return false;
    };
    let mut b = [0u8; 2];
    if f.config_read(cap + pci::PCIE_DEVCTL, &mut b).is_err() {
        return false;
    }
    u16::from_le_bytes(b) & pci::PCIE_DEVCTL_RELAX_EN != 0
}

/// Offset of the first capability `id` in the standard capability list,
/// walking at most 48 entries (what fits in 256 bytes), so a looping list
/// ends.
fn find_capability(f: &dyn PciFunction, id: u8) -> Option<u64> {
    let mut b = [0u8; 1];
    f.config_read(pci::CAPABILITIES_POINTER, &mut b).ok()?;
    let mut at = u64::from(b[0] & !3);
    for _ in 0..48 {
        if at < 0x40 {
            return None;
        }
        let mut h = [0u8; 2];
        f.config_read(at, &mut h).ok()?;
        if h[0] == id {
            return Some(at);
        }
        at = u64::from(h[1] & !3);
    }
    None
}
