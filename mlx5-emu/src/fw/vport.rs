//! Vport queries: QUERY_VPORT_STATE, QUERY_HCA_VPORT_CONTEXT,
//! QUERY_HCA_VPORT_GID, QUERY_NIC_VPORT_CONTEXT and MODIFY_NIC_VPORT_CONTEXT
//! (roce_en, mtu, and the local loopback bits where the card offers them),
//! for the function's own vport on port 1.

use std::sync::atomic::Ordering;

use mlx5_hw::ifc::{
    cmd_hca_cap, hca_vport_context, modify_nic_vport_context_in, modify_nic_vport_field_select,
    nic_vport_context, pkey, query_hca_vport_context_in, query_hca_vport_context_out,
    query_hca_vport_gid_in, query_hca_vport_gid_out, query_hca_vport_pkey_in,
    query_hca_vport_pkey_out, query_nic_vport_context_in, query_nic_vport_context_out,
    query_vport_state_in, query_vport_state_out,
};
use mlx5_hw::init;
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::Inner;

/// The default P_Key: full membership of the default partition.
const DEFAULT_PKEY: u64 = 0xffff;

/// Vport state: up.
const VPORT_UP: u64 = init::VPORT_STATE_UP as u64;
/// Vport state: down.
const VPORT_DOWN: u64 = init::VPORT_STATE_DOWN as u64;
/// Admin state: follow the uplink.
const VPORT_FOLLOW: u64 = init::VPORT_ADMIN_STATE_AUTO as u64;
/// IB port state: active / down.
const PORT_ACTIVE: u64 = 4;
const PORT_DOWN: u64 = 1;
/// Physical port state: LinkUp / Disabled.
const PHYS_LINK_UP: u64 = 5;
const PHYS_DISABLED: u64 = 3;

/// EUI-64 from the MAC: the node/port/system GUID.
pub(crate) fn guid(mac: u64) -> u64 {
    let oui = mac >> 24;
    let nic = mac & 0xff_ffff;
    (oui ^ 0x02_0000) << 40 | 0xfffe << 24 | nic
}

impl Firmware {
    fn own_vport(&self, other: u64, port: u64) -> Result<(), super::Fail> {
        if other != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_OTHER));
        }
        if port > 1 {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_BAD_PORT));
        }
        Ok(())
    }

    pub(super) fn query_vport_state(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_vport_state_in::SIZE_BYTES,
            query_vport_state_out::SIZE_BYTES,
        )?;
        self.own_vport(query_vport_state_in::OTHER_VPORT.get(input), 1)?;
        let mut out = vec![0u8; query_vport_state_out::SIZE_BYTES];
        query_vport_state_out::ADMIN_STATE.set(&mut out, VPORT_FOLLOW);
        query_vport_state_out::STATE.set(
            &mut out,
            if self.port.oper_up {
                VPORT_UP
            } else {
                VPORT_DOWN
            },
        );
        Ok(out)
    }

    pub(super) fn query_hca_vport_context(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_hca_vport_context_in::SIZE_BYTES,
            query_hca_vport_context_out::SIZE_BYTES,
        )?;
        self.own_vport(
            query_hca_vport_context_in::OTHER_VPORT.get(input),
            query_hca_vport_context_in::PORT_NUM.get(input),
        )?;
        let mut out = vec![0u8; query_hca_vport_context_out::SIZE_BYTES];
        let ctx = &mut out[query_hca_vport_context_out::HCA_VPORT_CONTEXT.off / 8..];
        let up = self.port.oper_up;
        hca_vport_context::PORT_PHYSICAL_STATE
            .set(ctx, if up { PHYS_LINK_UP } else { PHYS_DISABLED });
        hca_vport_context::PORT_STATE.set(ctx, if up { PORT_ACTIVE } else { PORT_DOWN });
        hca_vport_context::VPORT_STATE.set(ctx, if up { PORT_ACTIVE } else { PORT_DOWN });
        hca_vport_context::VPORT_STATE_POLICY.set(ctx, VPORT_FOLLOW);
        hca_vport_context::SYSTEM_IMAGE_GUID.set(ctx, guid(self.mac));
        hca_vport_context::PORT_GUID.set(ctx, guid(self.mac));
        hca_vport_context::NODE_GUID.set(ctx, guid(self.mac));
        hca_vport_context::HAS_RAW.set(ctx, 1);
        Ok(out)
    }

    pub(super) fn query_hca_vport_gid(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_hca_vport_gid_in::SIZE_BYTES,
            query_hca_vport_gid_out::SIZE_BYTES,
        )?;
        self.own_vport(
            query_hca_vport_gid_in::OTHER_VPORT.get(input),
            query_hca_vport_gid_in::PORT_NUM.get(input),
        )?;
        let index = query_hca_vport_gid_in::GID_INDEX.get(input);
        // GID table: index 0 is the link-local GID; 0xffff asks for all.
        let all = index == 0xffff;
        if !all && index != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_BAD_GID_INDEX));
        }
        let mut out = vec![0u8; query_hca_vport_gid_out::SIZE_BYTES + 16];
        query_hca_vport_gid_out::GIDS_NUM.set(&mut out, 1);
        let at = query_hca_vport_gid_out::SIZE_BYTES;
        out[at..at + 8].copy_from_slice(&0xfe80_0000_0000_0000u64.to_be_bytes());
        out[at + 8..at + 16].copy_from_slice(&guid(self.mac).to_be_bytes());
        if outlen < out.len() {
            out.truncate(outlen);
        }
        Ok(out)
    }

    /// The P_Key table: `2^(pkey_table_size + 7)` entries (128 on the
    /// ConnectX-4); on an Ethernet port only entry 0 is valid, the default
    /// full-membership key 0xffff, the rest read 0. Index 0xffff asks for
    /// the whole table.
    pub(super) fn query_hca_vport_pkey(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_hca_vport_pkey_in::SIZE_BYTES,
            query_hca_vport_pkey_out::SIZE_BYTES + pkey::SIZE_BYTES,
        )?;
        self.own_vport(
            query_hca_vport_pkey_in::OTHER_VPORT.get(input),
            query_hca_vport_pkey_in::PORT_NUM.get(input),
        )?;
        let len = 128u64 << self.cap(cmd_hca_cap::PKEY_TABLE_SIZE).min(5);
        let index = query_hca_vport_pkey_in::PKEY_INDEX.get(input);
        let (first, n) = match index {
            0xffff => (0, len),
            i if i < len => (i, 1),
            _ => return Err(fail(CmdStatus::BadParameter, synd::VPORT_BAD_PKEY_INDEX)),
        };
        let head = query_hca_vport_pkey_out::SIZE_BYTES;
        if outlen < head + n as usize * pkey::SIZE_BYTES {
            return Err(fail(CmdStatus::BadOutputLength, synd::BAD_OUTPUT_LENGTH));
        }
        let mut out = vec![0u8; head + n as usize * pkey::SIZE_BYTES];
        for i in 0..n {
            let at = head + i as usize * pkey::SIZE_BYTES;
            let key = if first + i == 0 { DEFAULT_PKEY } else { 0 };
            pkey::PKEY.set(&mut out[at..at + pkey::SIZE_BYTES], key);
        }
        Ok(out)
    }

    pub(super) fn query_nic_vport_context(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            query_nic_vport_context_in::SIZE_BYTES,
            query_nic_vport_context_out::SIZE_BYTES,
        )?;
        self.own_vport(query_nic_vport_context_in::OTHER_VPORT.get(input), 1)?;
        let mut out = vec![0u8; query_nic_vport_context_out::SIZE_BYTES];
        let ctx = &mut out[query_nic_vport_context_out::NIC_VPORT_CONTEXT.off / 8..];
        nic_vport_context::ROCE_EN.set(ctx, u64::from(self.roce_en));
        nic_vport_context::MTU.set(ctx, u64::from(self.vport_mtu));
        let lb = &inner.rdma.eth_rx.local_lb;
        nic_vport_context::DISABLE_UC_LOCAL_LB
            .set(ctx, u64::from(lb.uc_disabled.load(Ordering::Relaxed)));
        nic_vport_context::DISABLE_MC_LOCAL_LB
            .set(ctx, u64::from(lb.mc_disabled.load(Ordering::Relaxed)));
        nic_vport_context::SYSTEM_IMAGE_GUID.set(ctx, guid(self.mac));
        nic_vport_context::PORT_GUID.set(ctx, guid(self.mac));
        nic_vport_context::NODE_GUID.set(ctx, guid(self.mac));
        let mac_at = nic_vport_context::PERMANENT_ADDRESS.off / 8;
        // mac_address_layout: 16 reserved bits, mac_addr_47_32, mac_addr_31_0.
        ctx[mac_at + 2..mac_at + 8].copy_from_slice(&self.mac.to_be_bytes()[2..]);
        Ok(out)
    }

    /// MODIFY_NIC_VPORT_CONTEXT: the fields `field_select` names. A local
    /// loopback bit on a card that does not announce it
    /// (`disable_local_lb_uc`/`_mc`: 14.12 of the trace) is refused, as
    /// Linux never selects it there (`mlx5_nic_vport_update_local_lb`).
    pub(super) fn modify_nic_vport_context(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(input, outlen, modify_nic_vport_context_in::SIZE_BYTES, 0x10)?;
        self.own_vport(modify_nic_vport_context_in::OTHER_VPORT.get(input), 1)?;
        let fs = modify_nic_vport_context_in::FIELD_SELECT;
        let sel = &input[fs.off / 8..];
        let ctx = &input[modify_nic_vport_context_in::NIC_VPORT_CONTEXT.off / 8..];
        if modify_nic_vport_field_select::ROCE_EN.get(sel) == 1 {
            self.roce_en = nic_vport_context::ROCE_EN.get(ctx) == 1;
        }
        if modify_nic_vport_field_select::MTU.get(sel) == 1 {
            let mtu = nic_vport_context::MTU.get(ctx);
            if mtu == 0 || mtu > u64::from(self.port.max_mtu) {
                return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_VALUE));
            }
            self.vport_mtu = mtu as u16;
        }
        let lb = &inner.rdma.eth_rx.local_lb;
        for (select, cap, field, bit) in [
            (
                modify_nic_vport_field_select::DISABLE_UC_LOCAL_LB,
                cmd_hca_cap::DISABLE_LOCAL_LB_UC,
                nic_vport_context::DISABLE_UC_LOCAL_LB,
                &lb.uc_disabled,
            ),
            (
                modify_nic_vport_field_select::DISABLE_MC_LOCAL_LB,
                cmd_hca_cap::DISABLE_LOCAL_LB_MC,
                nic_vport_context::DISABLE_MC_LOCAL_LB,
                &lb.mc_disabled,
            ),
        ] {
            if select.get(sel) == 1 {
                if self.cap(cap) == 0 {
                    return Err(fail(
                        CmdStatus::BadParameter,
                        synd::VPORT_LOCAL_LB_NOT_SUPPORTED,
                    ));
                }
                bit.store(field.get(ctx) == 1, Ordering::Relaxed);
            }
        }
        Ok(vec![0; 0x10])
    }
}
