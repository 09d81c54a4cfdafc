//! The virtio_pcidev message, as Linux's `include/uapi/linux/virtio_pcidev.h`
//! defines it: a 16-byte header (`op`, `bar`, `reserved`, `size`, `addr`,
//! all in the CPU's byte order) followed by data.
//!
//! - On the command queue the driver sends config-space and BAR reads
//!   (header only, with a device-writable buffer of `size` bytes for the
//!   answer), writes (header and `size` bytes, posted: no answer) and memsets
//!   (header and one byte).
//! - On the irq queue the driver posts empty buffers; the device fills one
//!   with an `MSI` message (the 32-bit MSI data it would have written to the
//!   MSI address) or `INT` (legacy pin) to interrupt.

/// Bytes of the header.
pub const HEADER_LEN: usize = 16;
/// Bytes of an MSI message on the irq queue (header and 32-bit data).
pub const MSI_MESSAGE_LEN: usize = HEADER_LEN + 4;

/// `enum virtio_pcidev_ops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `VIRTIO_PCIDEV_OP_CFG_READ`: read config space (1, 2, 4 or 8 bytes).
    CfgRead,
    /// `VIRTIO_PCIDEV_OP_CFG_WRITE`: write config space.
    CfgWrite,
    /// `VIRTIO_PCIDEV_OP_MMIO_READ`: read a BAR, any size.
    MmioRead,
    /// `VIRTIO_PCIDEV_OP_MMIO_WRITE`: write a BAR, any size.
    MmioWrite,
    /// `VIRTIO_PCIDEV_OP_MMIO_MEMSET`: fill `size` bytes of a BAR with one byte.
    MmioMemset,
    /// `VIRTIO_PCIDEV_OP_INT`: legacy INTx (addr 1-4 is the pin).
    Int,
    /// `VIRTIO_PCIDEV_OP_MSI`: an MSI(-X) write.
    Msi,
    /// `VIRTIO_PCIDEV_OP_PME`: PME# wake-up.
    Pme,
    /// Any other value (0 is `VIRTIO_PCIDEV_OP_RESERVED`).
    Unknown(u8),
}

impl From<u8> for Op {
    fn from(v: u8) -> Self {
        match v {
            1 => Op::CfgRead,
            2 => Op::CfgWrite,
            3 => Op::MmioRead,
            4 => Op::MmioWrite,
            5 => Op::MmioMemset,
            6 => Op::Int,
            7 => Op::Msi,
            8 => Op::Pme,
            other => Op::Unknown(other),
        }
    }
}

impl From<Op> for u8 {
    fn from(op: Op) -> u8 {
        match op {
            Op::CfgRead => 1,
            Op::CfgWrite => 2,
            Op::MmioRead => 3,
            Op::MmioWrite => 4,
            Op::MmioMemset => 5,
            Op::Int => 6,
            Op::Msi => 7,
            Op::Pme => 8,
            Op::Unknown(v) => v,
        }
    }
}

/// `struct virtio_pcidev_msg` without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The operation.
    pub op: Op,
    /// BAR index (BAR reads, writes and memsets).
    pub bar: u8,
    /// Bytes to read or write.
    pub size: u32,
    /// Config-space offset, offset in the BAR, or the MSI address.
    pub addr: u64,
}

impl Header {
    /// Parses the first [`HEADER_LEN`] bytes of `b`; `None` if it is shorter.
    pub fn parse(b: &[u8]) -> Option<Header> {
        let b: &[u8; HEADER_LEN] = b.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Header {
            op: Op::from(b[0]),
            bar: b[1],
            size: u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
            addr: u64::from_ne_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        })
    }

    /// The header's bytes.
    pub fn emit(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.op.into();
        b[1] = self.bar;
        b[4..8].copy_from_slice(&self.size.to_ne_bytes());
        b[8..16].copy_from_slice(&self.addr.to_ne_bytes());
        b
    }
}

/// The irq-queue message for an MSI-X vector whose table entry holds
/// `address` and `data`: the 32-bit write the function would have made.
pub fn msi_message(address: u64, data: u32) -> [u8; MSI_MESSAGE_LEN] {
    let mut m = [0u8; MSI_MESSAGE_LEN];
    let hdr = Header {
        op: Op::Msi,
        bar: 0,
        size: 4,
        addr: address,
    };
    m[..HEADER_LEN].copy_from_slice(&hdr.emit());
    m[HEADER_LEN..].copy_from_slice(&data.to_le_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_short_input() {
        let h = Header {
            op: Op::MmioRead,
            bar: 0,
            size: 4,
            addr: 0x1010,
        };
        let b = h.emit();
        assert_eq!(b[0], 3);
        assert_eq!(Header::parse(&b), Some(h));
        assert_eq!(Header::parse(&b[..15]), None);
        for v in 0..=255u8 {
            assert_eq!(u8::from(Op::from(v)), v);
        }
        assert_eq!(Op::from(0), Op::Unknown(0));
    }

    #[test]
    fn msi_message_carries_the_table_data() {
        let m = msi_message(0xa0000, 0x2a);
        let h = Header::parse(&m).expect("header");
        assert_eq!(h.op, Op::Msi);
        assert_eq!(h.size, 4);
        assert_eq!(h.addr, 0xa0000);
        assert_eq!(&m[HEADER_LEN..], &0x2au32.to_le_bytes());
    }
}
