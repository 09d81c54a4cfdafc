//! Regions: `VFIO_USER_DEVICE_GET_REGION_INFO` (size, access flags, the fd
//! to mmap and the sparse-mmap capability naming the parts that may be
//! mapped) and `VFIO_USER_REGION_READ` / `VFIO_USER_REGION_WRITE` (trapped
//! accesses).
//!
//! A region-info reply is `struct vfio_region_info` followed by its
//! capability chain; `cap_offset` and each capability's `next` count from
//! the start of that structure. When the client's `argsz` is too small for
//! the chain, the reply carries the structure alone with `argsz` set to the
//! size needed, and the client asks again.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::function::RegionInfo;
use vfio_bindings::bindings::vfio as sys;

/// Region flag: readable.
pub const REGION_FLAG_READ: u32 = sys::VFIO_REGION_INFO_FLAG_READ;
/// Region flag: writable.
pub const REGION_FLAG_WRITE: u32 = sys::VFIO_REGION_INFO_FLAG_WRITE;
/// Region flag: (parts of it) may be mmapped from the fd of the reply.
pub const REGION_FLAG_MMAP: u32 = sys::VFIO_REGION_INFO_FLAG_MMAP;
/// Region flag: a capability chain follows.
pub const REGION_FLAG_CAPS: u32 = sys::VFIO_REGION_INFO_FLAG_CAPS;
/// Capability id of the sparse-mmap capability.
pub const CAP_SPARSE_MMAP: u16 = sys::VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16;
/// vfio-pci's index of the config-space region.
pub const PCI_CONFIG_REGION_INDEX: u32 = sys::VFIO_PCI_CONFIG_REGION_INDEX;

/// `struct vfio_region_info`: request (index and argsz) and reply head.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct RegionInfoWire {
    /// Request: largest reply payload taken; reply: size of the whole reply payload.
    pub argsz: u32,
    /// `REGION_FLAG_*`.
    pub flags: u32,
    /// Region index.
    pub index: u32,
    /// Offset of the first capability from the start of this structure (0: none).
    pub cap_offset: u32,
    /// Region size in bytes.
    pub size: u64,
    /// Offset in the fd's file where the region starts (for mmap).
    pub offset: u64,
}

/// `struct vfio_info_cap_header`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct CapHeader {
    /// Capability id.
    pub id: u16,
    /// Capability version.
    pub version: u16,
    /// Offset of the next capability from the region info (0: last).
    pub next: u32,
}

/// The head of `struct vfio_region_info_cap_sparse_mmap` (after its cap header).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct SparseMmapHead {
    /// Number of areas that follow.
    pub nr_areas: u32,
    /// Reserved.
    pub reserved: u32,
}

/// `struct vfio_region_sparse_mmap_area`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct SparseArea {
    /// Offset in the region.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

/// The head of REGION_READ / REGION_WRITE requests and replies (data
/// follows a read's reply and a write's request).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct RegionAccess {
    /// Offset in the region.
    pub offset: u64,
    /// Region index.
    pub region: u32,
    /// Bytes transferred.
    pub count: u32,
}

const INFO_SIZE: usize = std::mem::size_of::<RegionInfoWire>();

/// The capability chain of a region with `areas` mappable (one sparse-mmap
/// capability), placed right after the region info.
pub fn sparse_mmap_caps(areas: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + areas.len() * 16);
    b.extend_from_slice(
        CapHeader {
            id: CAP_SPARSE_MMAP,
            version: 1,
            next: 0,
        }
        .as_bytes(),
    );
    b.extend_from_slice(
        SparseMmapHead {
            nr_areas: areas.len() as u32,
            reserved: 0,
        }
        .as_bytes(),
    );
    for &(offset, size) in areas {
        b.extend_from_slice(SparseArea { offset, size }.as_bytes());
    }
    b
}

/// Collects the sparse-mmap areas of a reply's capability chain. `caps` is
/// everything after the region info; offsets count from the region info.
/// Unknown capabilities are skipped; a chain that points outside `caps`,
/// goes backwards or claims more areas than fit is an error.
pub fn parse_sparse_areas(info: &RegionInfoWire, caps: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    let mut areas = Vec::new();
    if info.flags & REGION_FLAG_CAPS == 0 {
        return Ok(areas);
    }
    let mut at = info.cap_offset as usize;
    let mut last = 0usize;
    while at != 0 {
        if at <= last || at < INFO_SIZE {
            return Err(format!("capability offset {at:#x} does not advance"));
        }
        last = at;
        let rel = &caps
            .get(at - INFO_SIZE..)
            .ok_or("capability outside the reply")?;
        let (hdr, rest) = CapHeader::read_from_prefix(rel)
            .map_err(|_| format!("capability at {at:#x} is truncated"))?;
        if hdr.id == CAP_SPARSE_MMAP {
            let (head, mut rest) = SparseMmapHead::read_from_prefix(rest)
                .map_err(|_| format!("sparse-mmap capability at {at:#x} is truncated"))?;
            for _ in 0..head.nr_areas {
                let (a, r) = SparseArea::read_from_prefix(rest).map_err(|_| {
                    format!(
                        "sparse-mmap capability at {at:#x} claims {} areas that do not fit",
                        head.nr_areas
                    )
                })?;
                areas.push((a.offset, a.size));
                rest = r;
            }
        }
        at = hdr.next as usize;
    }
    Ok(areas)
}

/// The [`RegionInfo`] a region-info reply describes. A mappable region
/// without a sparse-mmap capability may be mapped whole.
pub fn region_info_of(info: &RegionInfoWire, areas: Vec<(u64, u64)>) -> RegionInfo {
    let mmap = info.flags & REGION_FLAG_MMAP != 0;
    let mmap_areas = match (mmap, areas.is_empty()) {
        (false, _) => Vec::new(),
        (true, true) => vec![(0, info.size)],
        (true, false) => areas,
    };
    RegionInfo {
        index: info.index,
        size: info.size,
        read: info.flags & REGION_FLAG_READ != 0,
        write: info.flags & REGION_FLAG_WRITE != 0,
        mmap_areas,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_chain_round_trip_and_bad_chains() {
        let areas = [(0u64, 0x4000u64), (0x6000, 0x1000)];
        let caps = sparse_mmap_caps(&areas);
        let info = RegionInfoWire {
            argsz: (INFO_SIZE + caps.len()) as u32,
            flags: REGION_FLAG_READ | REGION_FLAG_WRITE | REGION_FLAG_MMAP | REGION_FLAG_CAPS,
            index: 0,
            cap_offset: INFO_SIZE as u32,
            size: 0x8000,
            offset: 0,
        };
        assert_eq!(parse_sparse_areas(&info, &caps).unwrap(), areas.to_vec());
        let r = region_info_of(&info, areas.to_vec());
        assert!(r.read && r.write && r.mmap_areas.len() == 2);
        // Claims three areas, carries two.
        let mut bad = caps.clone();
        bad[8] = 3;
        assert!(parse_sparse_areas(&info, &bad).is_err());
        // Points at itself.
        let mut cyc = caps.clone();
        cyc[4..8].copy_from_slice(&(INFO_SIZE as u32).to_ne_bytes());
        assert!(parse_sparse_areas(&info, &cyc).is_err());
        // Points past the end.
        let far = RegionInfoWire {
            cap_offset: 4096,
            ..info
        };
        assert!(parse_sparse_areas(&far, &caps).is_err());
        // Mappable without a capability: the whole region.
        let whole = RegionInfoWire {
            flags: REGION_FLAG_READ | REGION_FLAG_MMAP,
            ..info
        };
        assert_eq!(region_info_of(&whole, vec![]).mmap_areas, vec![(0, 0x8000)]);
    }
}
