//! DevX numbers that are not layouts (Linux `mlx5_ifc.h`): user context
//! capabilities and the MTT access bits of a UMEM's page list.

/// `MLX5_UCTX_CAP_RAW_TX`: the context may send raw Ethernet packets.
pub const UCTX_CAP_RAW_TX: u32 = 1 << 0;
/// `MLX5_UCTX_CAP_INTERNAL_DEV_RES`: the context may use internal device
/// resources.
pub const UCTX_CAP_INTERNAL_DEV_RES: u32 = 1 << 1;

/// An MTT entry's read-enable bit (`mtt.rd_en`; `MLX5_IB_MTT_READ`).
pub const MTT_RD_EN: u64 = 1 << 0;
/// An MTT entry's write-enable bit (`mtt.wr_en`; `MLX5_IB_MTT_WRITE`).
pub const MTT_WR_EN: u64 = 1 << 1;
/// The bits of an MTT entry below the page address (`ptag_31_8` starts at
/// bit 8).
pub const MTT_FLAGS_MASK: u64 = 0xff;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtt_bits_are_the_layouts() {
        use crate::ifc::mtt;
        // In a big-endian 64-bit entry, rd_en is bit 0 and wr_en bit 1.
        let mut e = [0u8; 8];
        mtt::RD_EN.set(&mut e, 1);
        assert_eq!(u64::from_be_bytes(e), MTT_RD_EN);
        let mut e = [0u8; 8];
        mtt::WR_EN.set(&mut e, 1);
        assert_eq!(u64::from_be_bytes(e), MTT_WR_EN);
        assert_eq!(mtt::PTAG_31_8.off, 0x20);
    }
}
