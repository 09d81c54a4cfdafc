//! BAR0 layout: the initialization segment at offset 0 (`struct
//! mlx5_init_seg`), the MSI-X table and PBA, and UAR pages.
//!
//! BAR0 pages 0-2 hold the initialization segment (0x0000-0x200F). Real
//! ConnectX-4/5 cards put the MSI-X table at 0x2000 and the PBA at 0x3000,
//! overlapping the segment's unused tail (`ieee1588_clk`, `clr_intx`); this
//! model keeps them clear of it, at [`MSIX_TABLE`] (page 4) and
//! [`MSIX_PBA`] (page 5). UAR pages are BAR0 pages `uarn * 4 KiB`, and
//! firmware hands out UARs from [`FIRST_UAR`] (16, as the traced card
//! does), so pages 0-15 are never UARs.

use mlx5_hw::init::{self, NicInterface};
use vfio::{DmaBuffer, RegionInfo};

use crate::Profile;

// Every offset and field of the segment is mlx5-hw's (`mlx5_hw::init`,
// from the generated `InitSeg`), re-exported under the names the model's
// code and its tests use.
pub use mlx5_hw::init::{
    INITIALIZING_BIT, ISEG_CMDIF_REV_FW_SUB as CMDIF_REV_FW_SUB, ISEG_CMDQ_ADDR_H as CMDQ_ADDR_H,
    ISEG_CMDQ_ADDR_L_SZ as CMDQ_ADDR_L_SZ, ISEG_CMD_DBELL as CMD_DBELL,
    ISEG_CMD_EXEC_TO as CMD_EXEC_TO, ISEG_CMD_Q_INIT_TO as CMD_Q_INIT_TO, ISEG_FW_REV as FW_REV,
    ISEG_HEALTH as HEALTH, ISEG_HEALTH_COUNTER as HEALTH_COUNTER,
    ISEG_HEALTH_EXT_SYND as HEALTH_EXT_SYND, ISEG_HEALTH_FW_VER as HEALTH_FW_VER,
    ISEG_HEALTH_HW_ID as HEALTH_HW_ID, ISEG_HEALTH_RFR_SEVERITY as HEALTH_RFR_SEVERITY,
    ISEG_HEALTH_SYND as HEALTH_SYND, ISEG_INITIALIZING as INITIALIZING,
    ISEG_INTERNAL_TIMER_H as INTERNAL_TIMER_H, ISEG_INTERNAL_TIMER_L as INTERNAL_TIMER_L,
    ISEG_SIZE as INIT_SEG_SIZE,
};

/// log2 of the number of command slots: all 32 (`MLX5_MAX_COMMANDS`).
pub const LOG_CMDQ_SIZE: u32 = init::MAX_COMMANDS.trailing_zeros();
/// log2 of the command entry stride: one `mlx5_cmd_layout` (64 bytes).
pub const LOG_CMDQ_STRIDE: u32 = init::CMD_ENTRY_SIZE.trailing_zeros();
/// What the low byte of `cmdq_addr_l_sz` always reads.
pub const CMDQ_SZ_BYTE: u32 = LOG_CMDQ_SIZE << init::LOG_CMDQ_SIZE_SHIFT | LOG_CMDQ_STRIDE;

/// BAR0 offset of the MSI-X table.
pub const MSIX_TABLE: u64 = 0x4000;
/// BAR0 offset of the MSI-X pending-bit array.
pub const MSIX_PBA: u64 = 0x5000;
/// First UAR index firmware allocates.
pub const FIRST_UAR: u32 = 16;

/// The region description of BAR0: all of it mappable but the page(s) of
/// the MSI-X table and PBA (as vfio-pci does); with `trap_control`, also
/// not the init segment's page and the first UAR's page (EQ doorbells), so
/// that a trapping client (QEMU) hands the model every write to them.
pub fn region_info(p: Profile, trap_control: bool) -> RegionInfo {
    let size = p.bar0_size();
    let hole_end = MSIX_PBA + 0x1000;
    let first_uar = u64::from(FIRST_UAR) << 12;
    let mmap_areas = if trap_control {
        vec![
            (0x1000, MSIX_TABLE - 0x1000),
            (hole_end, first_uar - hole_end),
            (first_uar + 0x1000, size - first_uar - 0x1000),
        ]
    } else {
        vec![(0, MSIX_TABLE), (hole_end, size - hole_end)]
    };
    RegionInfo {
        index: 0,
        size,
        read: true,
        write: true,
        mmap_areas,
    }
}

/// Whether `offset .. offset + len` touches the MSI-X table or PBA.
pub fn in_msix(p: Profile, offset: u64, len: usize) -> bool {
    let end = MSIX_PBA + u64::from(p.msix_vectors()).div_ceil(64) * 8;
    offset < end && offset + len as u64 > MSIX_TABLE
}

/// Reads a big-endian dword of BAR0 (0 if out of range).
pub fn rd(bar: &DmaBuffer, off: usize) -> u32 {
    bar.read_u32_be(off).unwrap_or(0)
}

/// Writes a big-endian dword of BAR0 (ignored if out of range).
pub fn wr(bar: &DmaBuffer, off: usize, v: u32) {
    let _ = bar.write_u32_be(off, v);
}

/// Whether MSI-X vector `v`'s table entry is masked (vector control bit 0;
/// the table is little-endian, as PCI is).
pub fn vector_masked(bar: &DmaBuffer, v: u32) -> bool {
    let mut b = [0u8; 4];
    let at = MSIX_TABLE as usize + v as usize * 16 + 12;
    bar.read(at, &mut b).is_ok() && b[0] & 1 != 0
}

/// Pending bit of vector `v`.
pub fn pba(bar: &DmaBuffer, v: u32) -> bool {
    let mut b = [0u8; 1];
    bar.read(MSIX_PBA as usize + v as usize / 8, &mut b).is_ok() && b[0] >> (v % 8) & 1 != 0
}

/// Sets or clears the pending bit of vector `v`.
pub fn set_pba(bar: &DmaBuffer, v: u32, on: bool) {
    let at = MSIX_PBA as usize + v as usize / 8;
    let mut b = [0u8; 1];
    if bar.read(at, &mut b).is_ok() {
        let m = 1u8 << (v % 8);
        b[0] = if on { b[0] | m } else { b[0] & !m };
        let _ = bar.write(at, &b);
    }
}

/// Writes the power-on initialization segment (with `initializing` set)
/// and clears the MSI-X table (vfio-pci owns it, so its entries come out
/// of reset unmasked: enabling MSI-X in config space is enough).
pub fn power_on(bar: &DmaBuffer, p: Profile, exec_to_ms: u32, init_to_ms: u32) {
    let _ = bar.fill(0, (MSIX_PBA + 0x1000) as usize, 0);
    let (maj, min, sub) = p.fw_version();
    wr(
        bar,
        FW_REV,
        u32::from(min) << init::FW_REV_MINOR_SHIFT | u32::from(maj),
    );
    wr(
        bar,
        CMDIF_REV_FW_SUB,
        u32::from(init::CMDIF_REV) << init::CMDIF_REV_SHIFT | u32::from(sub),
    );
    wr(bar, CMDQ_ADDR_L_SZ, CMDQ_SZ_BYTE);
    // nic_interface_supported: a bit per state, full driver and disabled.
    let supported = 1 << NicInterface::FullDriver.to_raw() | 1 << NicInterface::Disabled.to_raw();
    wr(
        bar,
        INITIALIZING,
        INITIALIZING_BIT | supported << init::NIC_INTERFACE_SUPPORTED_SHIFT,
    );
    wr(
        bar,
        HEALTH_FW_VER,
        u32::from(maj) << 24 | u32::from(min) << 16 | u32::from(sub),
    );
    wr(bar, HEALTH_HW_ID, u32::from(p.device_id()));
    // Timeouts: unit field [31:29] = 0 (milliseconds), value [19:0].
    wr(bar, CMD_EXEC_TO, exec_to_ms & 0xf_ffff);
    wr(bar, CMD_Q_INIT_TO, init_to_ms & 0xf_ffff);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_on_segment() {
        let bar = DmaBuffer::new(0x10000).unwrap();
        power_on(&bar, Profile::ConnectX4Lx, 60_000, 2_000);
        assert_eq!(rd(&bar, FW_REV), 12 << 16 | 14);
        assert_eq!(rd(&bar, CMDIF_REV_FW_SUB), 5 << 16 | 1220);
        assert_eq!(rd(&bar, CMDQ_ADDR_L_SZ) & 0xff, 0x56);
        assert_ne!(rd(&bar, INITIALIZING) & INITIALIZING_BIT, 0);
        assert_eq!(rd(&bar, CMD_EXEC_TO), 60_000);
        assert!(!vector_masked(&bar, 3));
        set_pba(&bar, 9, true);
        assert!(pba(&bar, 9) && !pba(&bar, 8));
        set_pba(&bar, 9, false);
        assert!(!pba(&bar, 9));
    }

    #[test]
    fn msix_hole() {
        let r = region_info(Profile::ConnectX4Lx, false);
        assert_eq!(r.size, 32 << 20);
        assert_eq!(r.mmap_areas[0], (0, 0x4000));
        assert!(in_msix(Profile::ConnectX4Lx, 0x4000 + 16 * 5, 4));
        assert!(!in_msix(Profile::ConnectX4Lx, 0x18, 4));
        assert!((FIRST_UAR as u64) << 12 >= MSIX_PBA + 0x1000);
    }

    #[test]
    fn control_pages_trapped_data_path_uars_mapped() {
        let r = region_info(Profile::ConnectX4Lx, true);
        let mapped = |off: u64| r.mmap_areas.iter().any(|&(s, l)| off >= s && off < s + l);
        // The command doorbell (init segment) and the first UAR's EQ
        // doorbell (offset 0x40) are trapped; MSI-X too, as always.
        assert!(!mapped(CMD_DBELL as u64));
        assert!(!mapped(((FIRST_UAR as u64) << 12) + 0x40));
        assert!(!mapped(MSIX_TABLE));
        // The next UAR (data-path doorbells of later ALLOC_UARs) and the
        // rest of the BAR stay mapped.
        assert!(mapped(((FIRST_UAR as u64 + 1) << 12) + 0x20));
        assert!(mapped(0x1000));
        assert!(mapped(r.size - 1));
        assert!(!mapped(r.size));
    }
}
