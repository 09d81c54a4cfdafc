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

use vfio::{DmaBuffer, RegionInfo};

use crate::Profile;

/// `fw_rev`: [31:16] minor, [15:0] major.
pub const FW_REV: usize = 0x000;
/// `cmdif_rev_fw_sub`: [31:16] command interface revision, [15:0] subminor.
pub const CMDIF_REV_FW_SUB: usize = 0x004;
/// Command queue address, bits 63:32.
pub const CMDQ_ADDR_H: usize = 0x010;
/// Command queue address bits 31:12, nic_interface [9:8], log size [7:4], log stride [3:0].
pub const CMDQ_ADDR_L_SZ: usize = 0x014;
/// Command doorbell: bit i rings slot i.
pub const CMD_DBELL: usize = 0x018;
/// bit 31: firmware initializing; [26:24] nic_interface_supported.
pub const INITIALIZING: usize = 0x1fc;
/// The health buffer (64 bytes).
pub const HEALTH: usize = 0x200;
/// Health buffer: `fw_ver`.
pub const HEALTH_FW_VER: usize = HEALTH + 0x30;
/// Health buffer: `hw_id`.
pub const HEALTH_HW_ID: usize = HEALTH + 0x34;
/// Health buffer: `rfr_severity`.
pub const HEALTH_RFR_SEVERITY: usize = HEALTH + 0x38;
/// Health buffer: `synd`.
pub const HEALTH_SYND: usize = HEALTH + 0x3d;
/// Health buffer: `ext_synd` (be16).
pub const HEALTH_EXT_SYND: usize = HEALTH + 0x3e;
/// Advertised command execution timeout, in milliseconds.
pub const CMD_EXEC_TO: usize = 0xff8;
/// Advertised command-queue initialization timeout, in milliseconds.
pub const CMD_Q_INIT_TO: usize = 0xffc;
/// Free-running HCA clock, high dword.
pub const INTERNAL_TIMER_H: usize = 0x1000;
/// Free-running HCA clock, low dword.
pub const INTERNAL_TIMER_L: usize = 0x1004;
/// [31:24] health syndrome, [23:0] counter firmware increments while alive.
pub const HEALTH_COUNTER: usize = 0x1010;
/// Size of the initialization segment.
pub const INIT_SEG_SIZE: usize = 0x2010;

/// `initializing` bit.
pub const INITIALIZING_BIT: u32 = 1 << 31;
/// Command interface revision the model speaks.
pub const CMDIF_REV: u32 = 5;
/// log2 of the number of command slots (32).
pub const LOG_CMDQ_SIZE: u32 = 5;
/// log2 of the command entry stride (64 bytes).
pub const LOG_CMDQ_STRIDE: u32 = 6;
/// What the low byte of `cmdq_addr_l_sz` always reads.
pub const CMDQ_SZ_BYTE: u32 = LOG_CMDQ_SIZE << 4 | LOG_CMDQ_STRIDE;
/// Shift of `nic_interface` in `cmdq_addr_l_sz`.
pub const NIC_IFC_SHIFT: u32 = 8;
/// nic_interface: full driver.
pub const NIC_IFC_FULL_DRIVER: u32 = 0;
/// nic_interface: disabled (fast teardown done).
pub const NIC_IFC_DISABLED: u32 = 1;
/// nic_interface: no DRAM NIC.
pub const NIC_IFC_NO_DRAM_NIC: u32 = 2;
/// nic_interface: software reset.
pub const NIC_IFC_SW_RESET: u32 = 7;

/// BAR0 offset of the MSI-X table.
pub const MSIX_TABLE: u64 = 0x4000;
/// BAR0 offset of the MSI-X pending-bit array.
pub const MSIX_PBA: u64 = 0x5000;
/// First UAR index firmware allocates.
pub const FIRST_UAR: u32 = 16;

/// The region description of BAR0: all of it mappable but the page(s) of
/// the MSI-X table and PBA (as vfio-pci does).
pub fn region_info(p: Profile) -> RegionInfo {
    let size = p.bar0_size();
    let hole_end = MSIX_PBA + 0x1000;
    RegionInfo {
        index: 0,
        size,
        read: true,
        write: true,
        mmap_areas: vec![(0, MSIX_TABLE), (hole_end, size - hole_end)],
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
    wr(bar, FW_REV, u32::from(min) << 16 | u32::from(maj));
    wr(bar, CMDIF_REV_FW_SUB, CMDIF_REV << 16 | u32::from(sub));
    wr(bar, CMDQ_ADDR_L_SZ, CMDQ_SZ_BYTE);
    // nic_interface_supported: full driver and disabled (bits 24, 25).
    wr(bar, INITIALIZING, INITIALIZING_BIT | 0x3 << 24);
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
        let r = region_info(Profile::ConnectX4Lx);
        assert_eq!(r.size, 32 << 20);
        assert_eq!(r.mmap_areas[0], (0, 0x4000));
        assert!(in_msix(Profile::ConnectX4Lx, 0x4000 + 16 * 5, 4));
        assert!(!in_msix(Profile::ConnectX4Lx, 0x18, 4));
        assert!((FIRST_UAR as u64) << 12 >= MSIX_PBA + 0x1000);
    }
}
