//! DevX numbers that are not layouts (Linux `mlx5_ifc.h`): user context
//! capabilities and the MTT access bits of a UMEM's page list.

/// `MLX5_UCTX_CAP_RAW_TX`: the context may send raw Ethernet packets.
pub const UCTX_CAP_RAW_TX: u32 = 1 << 0;
/// `MLX5_UCTX_CAP_INTERNAL_DEV_RES`: the context may use internal device
/// resources.
pub const UCTX_CAP_INTERNAL_DEV_RES: u32 = 1 << 1;

/// `MLX5_SHARED_RESOURCE_UID`: the uid of objects every user context may
/// use (the kernel creates its Q counters and some flow tables under it
/// when the function offers DevX); managed by uid 0.
pub const SHARED_RESOURCE_UID: u16 = 0xffff;

/// `MLX5_GENERAL_OBJECT_TYPES_ENCRYPTION_KEY`: the DEK's general object
/// type (its bit in `cmd_hca_cap.general_obj_types` is
/// `MLX5_HCA_CAP_GENERAL_OBJECT_TYPES_ENCRYPTION_KEY`).
pub const GENERAL_OBJECT_TYPES_ENCRYPTION_KEY: u16 = 0xc;

/// `encryption_key_obj.state`: ready (`MLX5_ENCRYPTION_KEY_OBJ_STATE_READY`).
pub const ENCRYPTION_KEY_STATE_READY: u8 = 0x0;
/// `encryption_key_obj.key_size`: 128 bits
/// (`MLX5_GENERAL_OBJECT_TYPE_ENCRYPTION_KEY_KEY_SIZE_128`).
pub const ENCRYPTION_KEY_SIZE_128: u8 = 0x0;
/// `encryption_key_obj.key_size`: 256 bits.
pub const ENCRYPTION_KEY_SIZE_256: u8 = 0x1;
/// `encryption_key_obj.key_purpose`: TLS
/// (`MLX5_GENERAL_OBJECT_TYPE_ENCRYPTION_KEY_PURPOSE_TLS`).
pub const ENCRYPTION_KEY_PURPOSE_TLS: u8 = 0x1;
/// `encryption_key_obj.key_purpose`: IPsec.
pub const ENCRYPTION_KEY_PURPOSE_IPSEC: u8 = 0x2;
/// `encryption_key_obj.key_purpose`: AES-XTS (rdma-core's
/// `MLX5_ENCRYPTION_KEY_OBJ_KEY_PURPOSE_AES_XTS`, mlx5dv_dek_create).
pub const ENCRYPTION_KEY_PURPOSE_AES_XTS: u8 = 0x3;
/// `encryption_key_obj.key_purpose`: MACsec.
pub const ENCRYPTION_KEY_PURPOSE_MACSEC: u8 = 0x4;

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
