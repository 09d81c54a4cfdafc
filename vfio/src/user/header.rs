//! The 16-byte header every vfio-user message starts with, and the command
//! numbers.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | message ID (echoed in the reply) |
//! | 2 | 2 | command |
//! | 4 | 4 | message size, header included |
//! | 8 | 4 | flags: type `[3:0]` (0 command, 1 reply), no_reply `[4]`, error `[5]` |
//! | 12 | 4 | errno of an error reply |
//!
//! All integers are in the host's byte order (the protocol runs between
//! processes of one host).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Size of the header in bytes.
pub const HEADER_SIZE: usize = 16;

/// Flags: the message-type field.
pub const FLAG_TYPE_MASK: u32 = 0xf;
/// Message type: a command.
pub const TYPE_COMMAND: u32 = 0;
/// Message type: a reply.
pub const TYPE_REPLY: u32 = 1;
/// Flags: the sender wants no reply to this command.
pub const FLAG_NO_REPLY: u32 = 1 << 4;
/// Flags: this reply reports an error (`error` holds the errno).
pub const FLAG_ERROR: u32 = 1 << 5;

/// The message header (`struct vfio_user_header`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct Header {
    /// Message ID, chosen by the sender of a command and echoed in its reply.
    pub id: u16,
    /// Command number ([`Command`]).
    pub command: u16,
    /// Size of the whole message, header included, in bytes.
    pub size: u32,
    /// Type, no_reply and error flags.
    pub flags: u32,
    /// errno of an error reply (may be 0 even then).
    pub error: u32,
}

impl Header {
    /// A command header for `command` with `payload` bytes after it.
    pub fn command(id: u16, command: Command, payload: usize) -> Self {
        Self {
            id,
            command: command as u16,
            size: (HEADER_SIZE + payload) as u32,
            flags: TYPE_COMMAND,
            error: 0,
        }
    }

    /// The header of the reply to `self` with `payload` bytes after it.
    pub fn reply(&self, payload: usize) -> Self {
        Self {
            id: self.id,
            command: self.command,
            size: (HEADER_SIZE + payload) as u32,
            flags: TYPE_REPLY,
            error: 0,
        }
    }

    /// The header of an error reply to `self` (no payload: the protocol
    /// allows none after an error).
    pub fn error_reply(&self, errno: i32) -> Self {
        Self {
            id: self.id,
            command: self.command,
            size: HEADER_SIZE as u32,
            flags: TYPE_REPLY | FLAG_ERROR,
            error: errno as u32,
        }
    }

    /// Whether this is a reply (otherwise a command).
    pub fn is_reply(&self) -> bool {
        self.flags & FLAG_TYPE_MASK == TYPE_REPLY
    }

    /// Whether the sender of this command wants no reply.
    pub fn no_reply(&self) -> bool {
        self.flags & FLAG_NO_REPLY != 0
    }

    /// The errno of an error reply, if this is one (`EIO` when the peer set
    /// the error flag but left the errno 0).
    pub fn errno(&self) -> Option<i32> {
        if self.flags & FLAG_ERROR == 0 {
            return None;
        }
        Some(match self.error {
            0 => libc::EIO,
            e => e as i32,
        })
    }

    /// Bytes after the header, as the size field says (0 if it says less
    /// than a header).
    pub fn payload_len(&self) -> usize {
        (self.size as usize).saturating_sub(HEADER_SIZE)
    }

    /// The header's name of its command, for logs and errors.
    pub fn command_name(&self) -> &'static str {
        Command::from_raw(self.command).map_or("unknown command", Command::name)
    }
}

/// vfio-user command numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Command {
    /// Version and capability negotiation; the first message of a session.
    Version = 1,
    /// Share client memory for DMA (an fd by SCM_RIGHTS).
    DmaMap = 2,
    /// Withdraw a DMA mapping.
    DmaUnmap = 3,
    /// Device flags, region and IRQ-type counts.
    DeviceGetInfo = 4,
    /// One region: size, flags, capabilities (sparse mmap), an fd to mmap.
    DeviceGetRegionInfo = 5,
    /// ioeventfd/ioregionfd sub-regions (not served here).
    DeviceGetRegionIoFds = 6,
    /// One interrupt type: count and flags.
    DeviceGetIrqInfo = 7,
    /// Attach, detach or trigger interrupt eventfds.
    DeviceSetIrqs = 8,
    /// A trapped region read.
    RegionRead = 9,
    /// A trapped region write.
    RegionWrite = 10,
    /// Server to client: read client memory by message.
    DmaRead = 11,
    /// Server to client: write client memory by message.
    DmaWrite = 12,
    /// Function-level reset.
    DeviceReset = 13,
    /// Several small region writes in one message (not served here).
    RegionWriteMulti = 15,
    /// Device features (migration; not served here).
    DeviceFeature = 16,
    /// Migration data out (not served here).
    MigDataRead = 17,
    /// Migration data in (not served here).
    MigDataWrite = 18,
}

impl Command {
    /// The command with number `raw`, if the protocol has one.
    pub fn from_raw(raw: u16) -> Option<Self> {
        use Command::*;
        Some(match raw {
            1 => Version,
            2 => DmaMap,
            3 => DmaUnmap,
            4 => DeviceGetInfo,
            5 => DeviceGetRegionInfo,
            6 => DeviceGetRegionIoFds,
            7 => DeviceGetIrqInfo,
            8 => DeviceSetIrqs,
            9 => RegionRead,
            10 => RegionWrite,
            11 => DmaRead,
            12 => DmaWrite,
            13 => DeviceReset,
            15 => RegionWriteMulti,
            16 => DeviceFeature,
            17 => MigDataRead,
            18 => MigDataWrite,
            _ => return None,
        })
    }

    /// The specification's name (`VFIO_USER_DMA_MAP`).
    pub fn name(self) -> &'static str {
        use Command::*;
        match self {
            Version => "VFIO_USER_VERSION",
            DmaMap => "VFIO_USER_DMA_MAP",
            DmaUnmap => "VFIO_USER_DMA_UNMAP",
            DeviceGetInfo => "VFIO_USER_DEVICE_GET_INFO",
            DeviceGetRegionInfo => "VFIO_USER_DEVICE_GET_REGION_INFO",
            DeviceGetRegionIoFds => "VFIO_USER_DEVICE_GET_REGION_IO_FDS",
            DeviceGetIrqInfo => "VFIO_USER_DEVICE_GET_IRQ_INFO",
            DeviceSetIrqs => "VFIO_USER_DEVICE_SET_IRQS",
            RegionRead => "VFIO_USER_REGION_READ",
            RegionWrite => "VFIO_USER_REGION_WRITE",
            DmaRead => "VFIO_USER_DMA_READ",
            DmaWrite => "VFIO_USER_DMA_WRITE",
            DeviceReset => "VFIO_USER_DEVICE_RESET",
            RegionWriteMulti => "VFIO_USER_REGION_WRITE_MULTI",
            DeviceFeature => "VFIO_USER_DEVICE_FEATURE",
            MigDataRead => "VFIO_USER_MIG_DATA_READ",
            MigDataWrite => "VFIO_USER_MIG_DATA_WRITE",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bytes_and_flags() {
        let h = Header::command(7, Command::RegionWrite, 20);
        assert_eq!(h.as_bytes().len(), HEADER_SIZE);
        assert_eq!(h.size, 36);
        assert!(!h.is_reply() && !h.no_reply() && h.errno().is_none());
        let r = h.reply(16);
        assert!(r.is_reply() && r.id == 7 && r.command == 10 && r.payload_len() == 16);
        let e = h.error_reply(libc::EINVAL);
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert_eq!(e.size as usize, HEADER_SIZE);
        let back = Header::read_from_bytes(e.as_bytes()).unwrap();
        assert_eq!(back, e);
        for raw in 0..32 {
            if let Some(c) = Command::from_raw(raw) {
                assert_eq!(c as u16, raw);
                assert!(c.name().starts_with("VFIO_USER_"));
            }
        }
        assert!(Command::from_raw(14).is_none());
    }
}
