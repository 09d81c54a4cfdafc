//! SET_ROCE_ADDRESS / QUERY_ROCE_ADDRESS: the port's GID table. An entry
//! whose address is all zeros is deleted. The data path sends from these
//! GIDs and accepts packets only for them.

use mlx5_hw::ifc::{
    query_roce_address_in, query_roce_address_out, roce_addr_layout, set_roce_address_in,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::transport::{rlock, wlock, GidEntry, GID_TABLE_LEN};
use crate::Inner;

impl Firmware {
    fn roce_index(&self, index: u64, port: u64) -> Result<usize, super::Fail> {
        if port > 1 {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_BAD_PORT));
        }
        if index as usize >= GID_TABLE_LEN {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_BAD_GID_INDEX));
        }
        Ok(index as usize)
    }

    pub(super) fn set_roce_address(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(input, outlen, set_roce_address_in::SIZE_BYTES, 0x10)?;
        let i = self.roce_index(
            set_roce_address_in::ROCE_ADDRESS_INDEX.get(input),
            set_roce_address_in::VHCA_PORT_NUM.get(input),
        )?;
        let a = &input[set_roce_address_in::ROCE_ADDRESS.off / 8..][..roce_addr_layout::SIZE_BYTES];
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&a[..16]);
        let mac = roce_addr_layout::SOURCE_MAC_47_32.get(a) << 32
            | roce_addr_layout::SOURCE_MAC_31_0.get(a);
        let entry = (gid != [0; 16]).then(|| GidEntry {
            gid,
            mac: mac.to_be_bytes()[2..].try_into().unwrap_or([0; 6]),
            version: roce_addr_layout::ROCE_VERSION.get(a) as u8,
            l3_type: roce_addr_layout::ROCE_L3_TYPE.get(a) as u8,
            vlan: (roce_addr_layout::VLAN_VALID.get(a) != 0)
                .then(|| roce_addr_layout::VLAN_ID.get(a) as u16),
        });
        tracing::debug!(index = i, ?entry, "SET_ROCE_ADDRESS");
        wlock(&inner.rdma.gids)[i] = entry;
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_roce_address(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            query_roce_address_in::SIZE_BYTES,
            query_roce_address_out::SIZE_BYTES,
        )?;
        let i = self.roce_index(
            query_roce_address_in::ROCE_ADDRESS_INDEX.get(input),
            query_roce_address_in::VHCA_PORT_NUM.get(input),
        )?;
        let mut out = vec![0u8; query_roce_address_out::SIZE_BYTES];
        if let Some(e) = rlock(&inner.rdma.gids)[i] {
            let a = &mut out[query_roce_address_out::ROCE_ADDRESS.off / 8..];
            a[..16].copy_from_slice(&e.gid);
            let mut m = [0u8; 8];
            m[2..].copy_from_slice(&e.mac);
            let mac = u64::from_be_bytes(m);
            roce_addr_layout::SOURCE_MAC_47_32.set(a, mac >> 32);
            roce_addr_layout::SOURCE_MAC_31_0.set(a, mac & 0xffff_ffff);
            roce_addr_layout::ROCE_VERSION.set(a, u64::from(e.version));
            roce_addr_layout::ROCE_L3_TYPE.set(a, u64::from(e.l3_type));
            if let Some(v) = e.vlan {
                roce_addr_layout::VLAN_VALID.set(a, 1);
                roce_addr_layout::VLAN_ID.set(a, u64::from(v));
            }
        }
        Ok(out)
    }
}
