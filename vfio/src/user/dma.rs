//! DMA messages: `VFIO_USER_DMA_MAP` / `VFIO_USER_DMA_UNMAP` (client to
//! server: share or withdraw client memory, by fd), and `VFIO_USER_DMA_READ`
//! / `VFIO_USER_DMA_WRITE` (server to client: reach client memory by message
//! when no fd was shared).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// DMA_MAP flags: the device may read the memory.
pub const DMA_MAP_READ: u32 = 1 << 0;
/// DMA_MAP flags: the device may write the memory.
pub const DMA_MAP_WRITE: u32 = 1 << 1;
/// DMA_UNMAP flags: unmap everything (address and size 0), as VFIO's
/// `VFIO_DMA_UNMAP_FLAG_ALL`.
pub const DMA_UNMAP_ALL: u32 = vfio_bindings::bindings::vfio::VFIO_DMA_UNMAP_FLAG_ALL;

/// `struct vfio_user_dma_map`: the DMA_MAP request (the fd travels by
/// SCM_RIGHTS; the reply has no payload).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct DmaMap {
    /// Size of this structure (32).
    pub argsz: u32,
    /// [`DMA_MAP_READ`] | [`DMA_MAP_WRITE`].
    pub flags: u32,
    /// Offset of the memory in the fd's file.
    pub offset: u64,
    /// IOVA where the device sees it.
    pub address: u64,
    /// Length in bytes.
    pub size: u64,
}

/// `struct vfio_user_dma_unmap`: the DMA_UNMAP request, echoed as its reply.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct DmaUnmap {
    /// Largest reply payload the client takes (at least 24).
    pub argsz: u32,
    /// 0 or [`DMA_UNMAP_ALL`].
    pub flags: u32,
    /// IOVA of a mapping, exactly as mapped.
    pub address: u64,
    /// Its length, exactly as mapped.
    pub size: u64,
}

/// The head of DMA_READ / DMA_WRITE requests and replies (data follows a
/// read's reply and a write's request).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct DmaAccess {
    /// Client IOVA.
    pub address: u64,
    /// Bytes to transfer.
    pub count: u64,
}
