//! PCI config space of the function: type-0 header, a 64-bit prefetchable
//! BAR0, and a capability list with PCI Express (FLR capable, a Gen3 x16
//! link), MSI-X and the vendor-specific gateway (`crate::vsc`), at the
//! offsets a ConnectX-4 has them (0x60, 0x9c, 0xc0).
//!
//! Every byte has a write mask: read-only bytes ignore writes, BAR0's low
//! bits below its size read as zero (the sizing protocol: write all ones,
//! read back the size mask and the type flags).

use vfio::pci;
use vfio::DmaBuffer;

use crate::initseg;
use crate::vsc::{self, Gateway};
use crate::Profile;

/// Config-space size (PCIe extended space included).
pub const CONFIG_SIZE: usize = 4096;
/// Mellanox's PCI vendor id.
pub const VENDOR_MELLANOX: u16 = 0x15b3;
/// Class code: network controller, InfiniBand (0x0207), prog-if 0.
pub const CLASS_CODE: u32 = 0x02_0700;
/// Offset of the PCI Express capability.
pub const CAP_PCIE: usize = 0x60;
/// Offset of the MSI-X capability.
pub const CAP_MSIX: usize = 0x9c;
/// Offset of the vendor-specific capability (the VSC gateway).
pub const CAP_VSC: usize = 0xc0;
/// PCI capability id: vendor specific.
pub const CAP_ID_VNDR: u8 = 0x09;
/// PCIe device control register (16 bits) at cap + 8.
pub const PCIE_DEVCTL: usize = 8;
/// Device control: initiate function-level reset.
pub const PCIE_DEVCTL_BCR_FLR: u16 = 1 << 15;
/// Device capabilities: function-level reset capable.
pub const PCIE_DEVCAP_FLR: u32 = 1 << 28;
/// Link capabilities 2: supported link speeds vector bits 1..=3
/// (2.5, 5.0 and 8.0 GT/s), a ConnectX-4's PCIe 3.0 x16 link.
pub const PCIE_LNKCAP2_SLS_2_5_TO_8GT: u32 = 0b1110;

/// What a config write asks of the device.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteEffect {
    /// A function-level reset was initiated.
    pub flr: bool,
    /// MSI-X enable/mask or bus mastering changed: pending vectors may go out.
    pub msix_changed: bool,
}

/// The function's config space.
#[derive(Debug, Clone)]
pub struct ConfigSpace {
    data: Vec<u8>,
    wmask: Vec<u8>,
    profile: Profile,
    vsc: Gateway,
}

impl ConfigSpace {
    /// Power-on config space for `profile`.
    pub fn new(profile: Profile) -> Self {
        let mut c = Self {
            data: vec![0; CONFIG_SIZE],
            wmask: vec![0; CONFIG_SIZE],
            profile,
            vsc: Gateway::new(profile.hw_id()),
        };
        c.reset_function();
        c
    }

    fn put16(&mut self, off: usize, v: u16) {
        self.data[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, off: usize, v: u32) {
        self.data[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn get16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.data[off], self.data[off + 1]])
    }

    fn mask(&mut self, off: usize, m: &[u8]) {
        self.wmask[off..off + m.len()].copy_from_slice(m);
    }

    /// Back to the power-on values (FLR).
    pub fn reset_function(&mut self) {
        let p = self.profile;
        self.data.fill(0);
        self.wmask.fill(0);
        self.put16(pci::VENDOR_ID as usize, VENDOR_MELLANOX);
        self.put16(pci::DEVICE_ID as usize, p.device_id());
        self.put16(pci::STATUS as usize, pci::STATUS_CAP_LIST);
        self.put32(
            pci::REVISION_ID as usize,
            CLASS_CODE << 8 | u32::from(p.revision()),
        );
        self.data[pci::HEADER_TYPE as usize] = 0;
        self.put32(
            pci::BAR0 as usize,
            pci::BAR_MEM_TYPE_64 | pci::BAR_MEM_PREFETCH,
        );
        self.put16(pci::SUBSYSTEM_VENDOR_ID as usize, VENDOR_MELLANOX);
        self.put16(pci::SUBSYSTEM_ID as usize, p.subsystem_id());
        self.data[pci::CAPABILITIES_POINTER as usize] = CAP_PCIE as u8;
        self.data[0x3d] = 1; // interrupt pin INTA
                             // COMMAND: I/O, memory, bus master, parity, SERR, INTx disable.
        self.mask(pci::COMMAND as usize, &[0x47, 0x05]);
        self.mask(0x3c, &[0xff]); // interrupt line
                                  // BAR0 (64-bit): address bits down to the BAR size.
        let size_mask = !(p.bar0_size() - 1);
        self.mask(pci::BAR0 as usize, &(size_mask as u32 & !0xf).to_le_bytes());
        self.mask(
            pci::BAR0 as usize + 4,
            &((size_mask >> 32) as u32).to_le_bytes(),
        );

        // PCI Express capability v2, endpoint.
        let e = CAP_PCIE;
        self.data[e] = pci::CAP_ID_EXP;
        self.data[e + 1] = CAP_MSIX as u8;
        self.put16(e + 2, 0x0002);
        // Device capabilities: max payload 512 B, FLR.
        self.put32(e + 4, 0x2 | PCIE_DEVCAP_FLR);
        // Device control: max payload 128, max read request 512; all but
        // the FLR bit writable (FLR is handled, then reads back as 0).
        self.put16(e + PCIE_DEVCTL, 0x2810);
        self.mask(e + PCIE_DEVCTL, &[0xff, 0xff]);
        // Link capabilities: 8 GT/s, x16; link status: same, trained.
        let link = 0x3 | 16 << 4;
        self.put32(e + 0xc, link);
        self.put16(e + 0x12, link as u16);
        self.mask(e + 0x10, &[0xff, 0xff]);
        // Device capabilities 2 / control 2.
        self.put32(e + 0x24, 0x0000_001f);
        self.mask(e + 0x28, &[0xff, 0xff]);
        // Link capabilities 2: supported link speeds vector 2.5, 5 and 8
        // GT/s (PCIe 3.0). Linux takes a device's speeds from this vector;
        // without it an 8 GT/s link is "Unknown" (it synthesizes only 2.5
        // and 5 GT/s from the link capabilities register).
        self.put32(e + 0x2c, PCIE_LNKCAP2_SLS_2_5_TO_8GT);
        // Link control 2: target link speed 8 GT/s (writable).
        self.put16(e + 0x30, 0x3);
        self.mask(e + 0x30, &[0xff, 0xff]);

        // MSI-X: table and PBA in BAR0 (see initseg::MSIX_TABLE/MSIX_PBA).
        let m = CAP_MSIX;
        self.data[m] = pci::CAP_ID_MSIX;
        self.data[m + 1] = CAP_VSC as u8;
        self.put16(
            m + pci::MSIX_MSG_CTRL as usize,
            (p.msix_vectors() - 1) as u16,
        );
        self.mask(m + pci::MSIX_MSG_CTRL as usize, &[0x00, 0xc0]);
        self.put32(m + pci::MSIX_TABLE as usize, initseg::MSIX_TABLE as u32);
        self.put32(m + pci::MSIX_PBA as usize, initseg::MSIX_PBA as u32);

        // Vendor-specific: the gateway's registers live in `self.vsc`,
        // chip state that a function-level reset leaves alone (a lock
        // another function holds stays held).
        self.data[CAP_VSC] = CAP_ID_VNDR;
        self.data[CAP_VSC + 1] = 0;
        self.data[CAP_VSC + 2] = vsc::VSC_LEN;
    }

    /// The gateway register (offset inside the capability) a config dword
    /// at `at` is, if it is one.
    fn vsc_reg(at: usize) -> Option<usize> {
        let r = at.checked_sub(CAP_VSC)?;
        (vsc::VSC_CTRL..vsc::VSC_LEN as usize)
            .contains(&r)
            .then_some(r & !3)
    }

    /// Reads config space at `offset` (bytes past the end read as 0xff).
    /// Reading a gateway register may act (the counter moves), once per
    /// dword the access touches.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) {
        let mut vsc_dword: Option<(usize, [u8; 4])> = None;
        for (i, b) in buf.iter_mut().enumerate() {
            let at = offset as usize + i;
            if let Some(reg) = Self::vsc_reg(at) {
                let v = match vsc_dword {
                    Some((r, v)) if r == reg => v,
                    _ => {
                        let v = self.vsc.read(reg).to_le_bytes();
                        vsc_dword = Some((reg, v));
                        v
                    }
                };
                *b = v[at & 3];
                continue;
            }
            *b = self.data.get(at).copied().unwrap_or(0xff);
        }
    }

    /// Writes config space at `offset` through the write masks.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> WriteEffect {
        let before_cmd = self.command();
        let before_msix = self.msix_ctrl();
        // Gateway registers: whole dwords (a partial write keeps the
        // register's other bytes).
        let mut vsc_writes: Vec<(usize, [u8; 4])> = Vec::new();
        for (i, v) in data.iter().enumerate() {
            let at = offset as usize + i;
            if let Some(reg) = Self::vsc_reg(at) {
                if vsc_writes.last().is_none_or(|w| w.0 != reg) {
                    let cur = if reg == vsc::VSC_COUNTER || reg == vsc::VSC_SEMAPHORE {
                        [0; 4]
                    } else {
                        self.vsc.read(reg).to_le_bytes()
                    };
                    vsc_writes.push((reg, cur));
                }
                if let Some(w) = vsc_writes.last_mut() {
                    w.1[at & 3] = *v;
                }
                continue;
            }
            if at >= CONFIG_SIZE {
                break;
            }
            let m = self.wmask[at];
            self.data[at] = (self.data[at] & !m) | (v & m);
        }
        for (reg, v) in vsc_writes {
            self.vsc.write(reg, u32::from_le_bytes(v));
        }
        let mut effect = WriteEffect::default();
        let devctl = CAP_PCIE + PCIE_DEVCTL;
        if self.get16(devctl) & PCIE_DEVCTL_BCR_FLR != 0 {
            let v = self.get16(devctl) & !PCIE_DEVCTL_BCR_FLR;
            self.put16(devctl, v);
            effect.flr = true;
        }
        effect.msix_changed = before_cmd != self.command() || before_msix != self.msix_ctrl();
        effect
    }

    /// The vendor-specific gateway.
    pub fn vsc(&self) -> &Gateway {
        &self.vsc
    }

    /// The COMMAND register.
    pub fn command(&self) -> u16 {
        self.get16(pci::COMMAND as usize)
    }

    /// Whether the function may master the bus (DMA, MSI-X messages).
    pub fn bus_master(&self) -> bool {
        self.command() & pci::COMMAND_BUS_MASTER != 0
    }

    /// MSI-X message control.
    pub fn msix_ctrl(&self) -> u16 {
        self.get16(CAP_MSIX + pci::MSIX_MSG_CTRL as usize)
    }

    /// Whether vector `v` may be sent now: bus master, MSI-X enabled, the
    /// function not masked, the vector's table entry not masked.
    pub fn msix_deliverable(&self, bar: &DmaBuffer, v: u32) -> bool {
        let ctrl = self.msix_ctrl();
        self.bus_master()
            && ctrl & pci::MSIX_CTRL_ENABLE != 0
            && ctrl & pci::MSIX_CTRL_MASKALL == 0
            && v < self.profile.msix_vectors()
            && !initseg::vector_masked(bar, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r32(c: &mut ConfigSpace, off: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn identity_and_class() {
        let mut c = ConfigSpace::new(Profile::ConnectX4);
        assert_eq!(r32(&mut c, 0), 0x1013_15b3);
        assert_eq!(r32(&mut c, 8) >> 8, 0x020700);
        assert_eq!(r32(&mut c, 0x2c), 0x0008_15b3);
        let mut c = ConfigSpace::new(Profile::ConnectX7);
        assert_eq!(r32(&mut c, 0) >> 16, 0x1021);
    }

    #[test]
    fn bar_sizing() {
        let mut c = ConfigSpace::new(Profile::ConnectX4);
        assert_eq!(r32(&mut c, 0x10), 0xc);
        c.write(0x10, &[0xff; 4]);
        c.write(0x14, &[0xff; 4]);
        assert_eq!(r32(&mut c, 0x10), 0xfe00_000c);
        assert_eq!(r32(&mut c, 0x14), 0xffff_ffff);
        let size = !(u64::from(r32(&mut c, 0x14)) << 32 | u64::from(r32(&mut c, 0x10) & !0xf)) + 1;
        assert_eq!(size, 32 << 20);
        c.write(0x10, &0xf000_0000u32.to_le_bytes());
        assert_eq!(r32(&mut c, 0x10), 0xf000_000c);
    }

    #[test]
    fn capability_list() {
        let mut c = ConfigSpace::new(Profile::ConnectX4);
        assert_ne!(r32(&mut c, 4) >> 16 & u32::from(pci::STATUS_CAP_LIST), 0);
        let mut p = [0u8; 1];
        c.read(0x34, &mut p);
        let mut ids = vec![];
        let mut at = p[0] as u64;
        while at != 0 {
            let v = r32(&mut c, at);
            ids.push((at, v as u8));
            at = u64::from((v >> 8) as u8);
        }
        assert_eq!(ids, vec![(0x60, 0x10), (0x9c, 0x11), (0xc0, 0x09)]);
        let ctrl = r32(&mut c, 0x9c) >> 16;
        assert_eq!(ctrl & 0x7ff, 63);
        assert_eq!(r32(&mut c, 0x9c + 4), initseg::MSIX_TABLE as u32);
        // Table size is read-only; enable and mask are writable.
        let e = c.write(0x9e, &0xc000u16.to_le_bytes());
        assert!(e.msix_changed);
        assert_eq!(r32(&mut c, 0x9c) >> 16, 0xc03f);
        // COMMAND: bus master sticks, reserved bits don't.
        c.write(4, &[0xff, 0xff]);
        assert_eq!(c.command(), 0x0547);
        assert!(c.bus_master());
    }

    #[test]
    fn flr_bit_is_self_clearing() {
        let mut c = ConfigSpace::new(Profile::ConnectX4);
        let e = c.write((CAP_PCIE + PCIE_DEVCTL) as u64, &0xa810u16.to_le_bytes());
        assert!(e.flr);
        assert_eq!(c.get16(CAP_PCIE + PCIE_DEVCTL), 0x2810);
    }

    #[test]
    fn pcie_link_reads_as_gen3_x16_the_linux_way() {
        let mut c = ConfigSpace::new(Profile::ConnectX4);
        let e = CAP_PCIE as u64;
        let lnkcap = r32(&mut c, e + 0xc);
        let lnkcap2 = r32(&mut c, e + 0x2c);
        let lnksta = r32(&mut c, e + 0x10) >> 16;
        // pcie_get_supported_speeds: the vector, capped at the max speed.
        let speeds = lnkcap2 & 0xfe & ((2u32 << (lnkcap & 0xf)) - 1);
        assert_eq!(31 - speeds.leading_zeros(), 3, "8 GT/s supported");
        assert_eq!(lnkcap >> 4 & 0x3f, 16, "x16 capable");
        assert_eq!((lnksta & 0xf, lnksta >> 4 & 0x3f), (3, 16), "trained");
    }

    #[test]
    fn vendor_gateway_through_config_space() {
        let mut c = ConfigSpace::new(Profile::ConnectX4);
        // Found the way pci_find_capability(PCI_CAP_ID_VNDR) finds it.
        let mut at = u64::from(r32(&mut c, 0x34) as u8);
        while at != 0 && r32(&mut c, at) as u8 != CAP_ID_VNDR {
            at = u64::from((r32(&mut c, at) >> 8) as u8);
        }
        assert_eq!(at, CAP_VSC as u64);
        assert_eq!(r32(&mut c, at) >> 16 & 0xff, u32::from(vsc::VSC_LEN));
        let reg = |r: usize| at + r as u64;
        // mlx5_vsc_gw_lock: semaphore free, counter into it, read back.
        assert_eq!(r32(&mut c, reg(vsc::VSC_SEMAPHORE)), 0);
        let ticket = r32(&mut c, reg(vsc::VSC_COUNTER));
        c.write(reg(vsc::VSC_SEMAPHORE), &ticket.to_le_bytes());
        assert_eq!(r32(&mut c, reg(vsc::VSC_SEMAPHORE)), ticket);
        assert_ne!(r32(&mut c, reg(vsc::VSC_COUNTER)), ticket);
        // mlx5_vsc_gw_set_space(crspace) with its size.
        c.write(
            reg(vsc::VSC_CTRL),
            &u32::from(vsc::SPACE_SCAN_CRSPACE).to_le_bytes(),
        );
        let ctrl = r32(&mut c, reg(vsc::VSC_CTRL));
        assert_ne!(ctrl >> 29, 0);
        assert_eq!(
            r32(&mut c, reg(vsc::VSC_ADDR)) & 0x3fff_ffff,
            vsc::CRSPACE_SIZE
        );
        // A function-level reset leaves the chip's semaphore held.
        c.write((CAP_PCIE + PCIE_DEVCTL) as u64, &0xa810u16.to_le_bytes());
        c.reset_function();
        assert_eq!(r32(&mut c, reg(vsc::VSC_SEMAPHORE)), ticket);
        // Unlock.
        c.write(reg(vsc::VSC_SEMAPHORE), &0u32.to_le_bytes());
        assert_eq!(r32(&mut c, reg(vsc::VSC_SEMAPHORE)), 0);
    }
}
