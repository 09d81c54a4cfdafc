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

/// `ibv_query_qp_data_in_order`: flags (`IBV_QUERY_QP_DATA_IN_ORDER_*`,
/// libibverbs' values) and the answer's bits.
pub mod data_in_order {
    /// Flag: return the capability bits rather than 0/1.
    pub const RETURN_CAPS: u32 = 1 << 0;
    /// Flag: ask the device alone, whatever the host CPU.
    pub const DEVICE_ONLY: u32 = 1 << 1;
    /// Answer: a whole message's data is written in order.
    pub const WHOLE_MSG: u32 = 1 << 0;
    /// Answer: data is written in order in aligned 128-byte units.
    pub const ALIGNED_128_BYTES: u32 = 1 << 1;
}

impl crate::qp::Qp {
    /// `ibv_query_qp_data_in_order(qp, op, flags)`, computed as rdma-core
    /// computes it: libibverbs' `ibv_query_qp_data_in_order` (unknown
    /// flags give 0; off x86 only `DEVICE_ONLY` asks the device; a
    /// whole-message answer implies 128-byte units; without
    /// `RETURN_CAPS` the answer is 0 or 1) over libmlx5's
    /// `mlx5_query_qp_data_in_order`: 0 unless the device offers
    /// `qp_data_in_order` and the QP is in RTS, then QUERY_QP's
    /// `qpc.data_in_order` gives `WHOLE_MSG`. `op` (an `ibv_wr_opcode`)
    /// does not change mlx5's answer; a failed query answers 0, as
    /// libmlx5's does.
    pub fn query_data_in_order(&self, op: u32, flags: u32) -> u32 {
        use data_in_order::*;
        let _ = op;
        if flags & !(RETURN_CAPS | DEVICE_ONLY) != 0 {
            return 0;
        }
        if !cfg!(any(target_arch = "x86", target_arch = "x86_64")) && flags & DEVICE_ONLY == 0 {
            return 0;
        }
        let mut r = self.device_data_in_order();
        if r & WHOLE_MSG != 0 {
            r |= ALIGNED_128_BYTES;
        }
        if flags & RETURN_CAPS != 0 {
            r
        } else {
            u32::from(r & WHOLE_MSG != 0)
        }
    }

    /// libmlx5's `mlx5_query_qp_data_in_order` (no DCT here).
    fn device_data_in_order(&self) -> u32 {
        use mlx5_hw::ifc::{query_qp_in, query_qp_out, QueryQpIn, QueryQpOut};
        if !self.ctx.hca.caps().gen().qp_data_in_order() || self.state() != crate::qp::QpState::Rts
        {
            return 0;
        }
        let mut inb = vec![0u8; query_qp_in::SIZE_BYTES];
        QueryQpIn::new_unchecked(&mut inb[..])
            .set_opcode(mlx5_hw::opcode::Opcode::QueryQp.to_raw())
            .set_qpn(self.qp_num());
        match self.ctx.hca.cmd().exec(&inb, query_qp_out::SIZE_BYTES) {
            Ok(out) if QueryQpOut::new_unchecked(&out[..]).qpc().data_in_order() => {
                data_in_order::WHOLE_MSG
            }
            _ => 0,
        }
    }
}
