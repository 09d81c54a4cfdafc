//! The vendor-specific capability's gateway (VSC, PCI capability id 0x09,
//! 0x18 bytes): config-space access to the device's internal address
//! spaces, for crdump and the software-reset semaphore when the command
//! interface may be dead. Registers, by offset in the capability:
//!
//! - 0x04 control: bits 15:0 the space the gateway addresses; bits 31:29
//!   the status, non-zero once the device accepted the space (0: not
//!   supported); bit 28: the space's size is valid (read it from 0x10).
//! - 0x08 counter: a value that changes on every read, a unique ticket.
//! - 0x0c semaphore: 0 when free; writing the ticket when free takes it
//!   (read back the ticket: it is yours); writing 0 frees it.
//! - 0x10 address: bits 29:0 the address, bit 31 the flag. Writing an
//!   address with flag 0 reads the space: data lands in 0x14, the flag
//!   becomes 1 and the address moves to the next readable one (what
//!   Linux's block read walks by). Writing flag 1 writes 0x14 to the
//!   space and the flag returns to 0. Bit 30 (syndrome) reports a bad
//!   access.
//! - 0x14 data.
//!
//! Spaces modelled: 0x7 (crspace scan: configuration registers, read
//! only; zeros except the hardware id, size `CRSPACE_SIZE`) and 0xa (the
//! semaphore domain: one 32-bit lock per address, taken by writing a
//! non-zero owner id while free, released by writing 0). Linux uses the
//! crspace size at probe to enable crdump, and both spaces for crdump and
//! the software-reset semaphore (health.c, diag/crdump.c).

use std::collections::BTreeMap;

/// Capability length in bytes (what `lspci` shows as `Len=18`).
pub const VSC_LEN: u8 = 0x18;
/// Register offsets inside the capability.
pub const VSC_CTRL: usize = 0x4;
/// Counter register.
pub const VSC_COUNTER: usize = 0x8;
/// Semaphore register.
pub const VSC_SEMAPHORE: usize = 0xc;
/// Address register.
pub const VSC_ADDR: usize = 0x10;
/// Data register.
pub const VSC_DATA: usize = 0x14;
/// Space: crspace scan (Linux `MLX5_VSC_SPACE_SCAN_CRSPACE`).
pub const SPACE_SCAN_CRSPACE: u16 = 0x7;
/// Space: the semaphore domain (Linux `MLX5_SEMAPHORE_SPACE_DOMAIN`).
pub const SPACE_SEMAPHORE: u16 = 0xa;
/// Bytes of crspace the scan space covers. ConnectX-4's configuration
/// space ends below 1 MiB (its hardware id register is at 0xf0014).
pub const CRSPACE_SIZE: u32 = 0x10_0000;
/// crspace address of the hardware id register (device id in bits 15:0).
pub const CRSPACE_HW_ID: u32 = 0xf_0014;

const FLAG: u32 = 1 << 31;
const SYNDROME: u32 = 1 << 30;
const ADDR_MASK: u32 = (1 << 30) - 1;
const STATUS_OK: u32 = 1 << 29;
const SIZE_VALID: u32 = 1 << 28;

/// The gateway's state.
#[derive(Debug, Clone, Default)]
pub struct Gateway {
    ctrl: u32,
    counter: u32,
    semaphore: u32,
    addr: u32,
    data: u32,
    hw_id: u32,
    /// The semaphore domain's locks by address.
    locks: BTreeMap<u32, u32>,
}

impl Gateway {
    /// A gateway of a device whose hardware id register reads `hw_id`.
    pub fn new(hw_id: u32) -> Self {
        Self {
            hw_id,
            ..Self::default()
        }
    }

    /// The space the gateway addresses.
    pub fn space(&self) -> u16 {
        self.ctrl as u16
    }

    /// The semaphore register (0: free).
    pub fn semaphore(&self) -> u32 {
        self.semaphore
    }

    /// Tickets the counter handed out (reads of the counter register).
    pub fn tickets(&self) -> u32 {
        self.counter
    }

    /// The semaphore-domain locks held: `(address, owner)`.
    pub fn locks(&self) -> Vec<(u32, u32)> {
        self.locks.iter().map(|(&a, &o)| (a, o)).collect()
    }

    /// Reads register `reg` (a dword offset inside the capability).
    pub fn read(&mut self, reg: usize) -> u32 {
        match reg {
            VSC_CTRL => self.ctrl,
            VSC_COUNTER => {
                self.counter = self.counter.wrapping_add(1).max(1);
                self.counter
            }
            VSC_SEMAPHORE => self.semaphore,
            VSC_ADDR => self.addr,
            VSC_DATA => self.data,
            _ => 0,
        }
    }

    /// Writes register `reg`.
    pub fn write(&mut self, reg: usize, v: u32) {
        match reg {
            VSC_CTRL => self.select(v as u16),
            VSC_SEMAPHORE if v == 0 || self.semaphore == 0 => self.semaphore = v,
            VSC_ADDR => self.access(v),
            VSC_DATA => self.data = v,
            // The counter is read-only.
            _ => {}
        }
    }

    fn select(&mut self, space: u16) {
        self.ctrl = u32::from(space);
        match space {
            SPACE_SCAN_CRSPACE => {
                self.ctrl |= STATUS_OK | SIZE_VALID;
                self.addr = CRSPACE_SIZE;
            }
            SPACE_SEMAPHORE => self.ctrl |= STATUS_OK,
            _ => {}
        }
    }

    /// The address register after a refused access: the syndrome bit,
    /// and the flag where the access completes (a read sets it, a write
    /// clears it).
    fn refused(a: u32, write: bool) -> u32 {
        let flag = if write { 0 } else { FLAG };
        a | SYNDROME | flag
    }

    fn access(&mut self, v: u32) {
        let a = v & ADDR_MASK;
        let write = v & FLAG != 0;
        let ok = self.ctrl & STATUS_OK != 0 && a % 4 == 0;
        match (self.space(), write) {
            _ if !ok => self.addr = Self::refused(a, write),
            (SPACE_SCAN_CRSPACE, false) if a < CRSPACE_SIZE => {
                self.data = if a == CRSPACE_HW_ID { self.hw_id } else { 0 };
                self.addr = FLAG | (a + 4);
            }
            (SPACE_SEMAPHORE, false) => {
                self.data = self.locks.get(&a).copied().unwrap_or(0);
                self.addr = FLAG | (a + 4);
            }
            (SPACE_SEMAPHORE, true) => {
                let held = self.locks.get(&a).copied().unwrap_or(0);
                if self.data == 0 {
                    self.locks.remove(&a);
                } else if held == 0 {
                    self.locks.insert(a, self.data);
                }
                self.addr = a;
            }
            // Read past the space's end, or a write to read-only crspace.
            (_, w) => self.addr = Self::refused(a, w),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux's mlx5_vsc_gw_lock: counter into the semaphore, read back.
    fn lock(g: &mut Gateway) -> bool {
        if g.read(VSC_SEMAPHORE) != 0 {
            return false;
        }
        let c = g.read(VSC_COUNTER);
        g.write(VSC_SEMAPHORE, c);
        g.read(VSC_SEMAPHORE) == c
    }

    #[test]
    fn semaphore_has_one_owner() {
        let mut g = Gateway::new(0x209);
        assert!(lock(&mut g));
        // A second owner finds it taken, and its ticket does not stick.
        assert!(!lock(&mut g));
        let c = g.read(VSC_COUNTER);
        let held = g.read(VSC_SEMAPHORE);
        g.write(VSC_SEMAPHORE, c);
        assert_eq!(g.read(VSC_SEMAPHORE), held);
        g.write(VSC_SEMAPHORE, 0);
        assert!(lock(&mut g));
    }

    #[test]
    fn crspace_is_supported_with_its_size_and_reads_walk() {
        let mut g = Gateway::new(0x209);
        g.write(VSC_CTRL, u32::from(SPACE_SCAN_CRSPACE));
        let ctrl = g.read(VSC_CTRL);
        assert_ne!(ctrl >> 29, 0, "space not accepted");
        assert_ne!(ctrl & SIZE_VALID, 0);
        assert_eq!(g.read(VSC_ADDR) & ADDR_MASK, CRSPACE_SIZE);
        // A read: flag set, data in place, address moved on.
        g.write(VSC_ADDR, CRSPACE_HW_ID);
        let a = g.read(VSC_ADDR);
        assert_ne!(a & FLAG, 0);
        assert_eq!(a & ADDR_MASK, CRSPACE_HW_ID + 4);
        assert_eq!(g.read(VSC_DATA), 0x209);
        // Past the end: syndrome.
        g.write(VSC_ADDR, CRSPACE_SIZE);
        assert_ne!(g.read(VSC_ADDR) & SYNDROME, 0);
        // An unknown space is refused (status 0).
        g.write(VSC_CTRL, 0x3);
        assert_eq!(g.read(VSC_CTRL) >> 29, 0);
    }

    #[test]
    fn semaphore_domain_locks_per_address() {
        let mut g = Gateway::new(0x209);
        g.write(VSC_CTRL, u32::from(SPACE_SEMAPHORE));
        assert_ne!(g.read(VSC_CTRL) >> 29, 0);
        // Linux's mlx5_vsc_sem_set_space: gw_write(id), gw_read == id.
        let set = |g: &mut Gateway, id: u32| {
            g.write(VSC_DATA, id);
            g.write(VSC_ADDR, 0x20 | FLAG);
            assert_eq!(g.read(VSC_ADDR) & FLAG, 0, "write flag not cleared");
            g.write(VSC_ADDR, 0x20);
            assert_ne!(g.read(VSC_ADDR) & FLAG, 0, "read flag not set");
            g.read(VSC_DATA)
        };
        assert_eq!(set(&mut g, 7), 7);
        assert_eq!(set(&mut g, 9), 7, "a held lock changed owner");
        assert_eq!(set(&mut g, 0), 0);
        assert_eq!(set(&mut g, 9), 9);
    }
}
