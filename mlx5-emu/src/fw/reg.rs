//! ACCESS_REG: HOST_ENDIANNESS, PAOS, PMTU, PTYS, PPCNT, DTOR, NODE_DESC, on a
//! one-port Ethernet function.

use mlx5_hw::event::EventType;
use mlx5_hw::ifc::EqePortState;
use mlx5_hw::ifc::{
    access_register_in, access_register_out, dtor_reg, paos_reg, pfcc_reg, pmtu_reg, ppcnt_reg,
    ptys_reg,
};
use mlx5_hw::init::{RegisterId, ACCESS_REG_OP_MOD_READ, ACCESS_REG_OP_MOD_WRITE};
use mlx5_hw::status::CmdStatus;
use zerocopy::FromZeros;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::Inner;

/// NODE_DESC: the node description, 64 bytes of text (IB NodeDescription;
/// mlx5_ib reads it at probe and writes it on IB_DEVICE_MODIFY_NODE_DESC).
pub(crate) const NODE_DESC_BYTES: usize = 64;

/// ACCESS_REG op_mod.
const WRITE: u64 = ACCESS_REG_OP_MOD_WRITE as u64;
const READ: u64 = ACCESS_REG_OP_MOD_READ as u64;

/// PAOS status values.
const STATUS_UP: u64 = 1;
const STATUS_DOWN: u64 = 2;

/// PORT_CHANGE subtypes.
const PORT_CHANGE_DOWN: u8 = 1;
const PORT_CHANGE_ACTIVE: u8 = 4;

/// PTYS proto_mask: Ethernet.
const PROTO_ETH: u64 = 1 << 2;

/// DTOR default timeouts, in milliseconds (what firmware advertises).
const DTOR_MS: [(&str, u64); 11] = [
    ("pcie_toggle_to", 2000),
    ("health_poll_to", 2000),
    ("full_crdump_to", 60000),
    ("fw_reset_to", 60000),
    ("flush_on_err_to", 2000),
    ("pci_sync_update_to", 5000),
    ("tear_down_to", 3000),
    ("fsm_reactivate_to", 5000),
    ("reclaim_pages_to", 5000),
    ("reclaim_vfs_pages_to", 120000),
    ("reset_unload_to", 300000),
];

impl Firmware {
    pub(super) fn access_reg(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            access_register_in::SIZE_BYTES,
            access_register_out::SIZE_BYTES,
        )?;
        let op = access_register_in::OP_MOD.get(input);
        if op != WRITE && op != READ {
            return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_OP_MOD));
        }
        let id = RegisterId::from(access_register_in::REGISTER_ID.get(input) as u16);
        let data = &input[access_register_in::SIZE_BYTES..];
        let size = match id {
            RegisterId::Pmtu => pmtu_reg::SIZE_BYTES,
            RegisterId::Ptys => ptys_reg::SIZE_BYTES,
            RegisterId::Paos => paos_reg::SIZE_BYTES,
            RegisterId::HostEndianness => 0x10,
            RegisterId::Dtor => dtor_reg::SIZE_BYTES,
            RegisterId::NodeDesc => NODE_DESC_BYTES,
            RegisterId::Ppcnt => ppcnt_reg::SIZE_BYTES,
            RegisterId::Pfcc => pfcc_reg::SIZE_BYTES,
            _ => {
                tracing::debug!(register_id = %id, "unknown register");
                return Err(fail(CmdStatus::BadParameter, synd::REG_UNKNOWN));
            }
        };
        if data.len() < size {
            return Err(fail(CmdStatus::BadInputLength, synd::BAD_INPUT_LENGTH));
        }
        if outlen < access_register_out::SIZE_BYTES + size {
            return Err(fail(CmdStatus::BadOutputLength, synd::BAD_OUTPUT_LENGTH));
        }
        let mut reg = data[..size].to_vec();
        match id {
            RegisterId::HostEndianness => {
                if op == WRITE {
                    self.host_endianness = reg[0];
                } else {
                    reg.fill(0);
                    reg[0] = self.host_endianness;
                }
            }
            RegisterId::Dtor => {
                if op == WRITE {
                    return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_OP_MOD));
                }
                reg.fill(0);
                for (name, ms) in DTOR_MS {
                    // default_timeout: to_multiplier (0 = ms) [31:29], to_value [19:0].
                    if let Some(f) = dtor_reg::INFO.fields.iter().find(|f| f.name == name) {
                        mlx5_hw::bits::set_bits(&mut reg, f.bit_off + 12, 20, ms);
                    }
                }
            }
            RegisterId::Paos => self.paos(inner, op, &mut reg)?,
            RegisterId::Ppcnt => self.ppcnt(inner, op, &mut reg)?,
            RegisterId::Pfcc => self.pfcc(op, &mut reg)?,
            RegisterId::NodeDesc => {
                if op == WRITE {
                    self.node_desc.copy_from_slice(&reg);
                }
                reg.copy_from_slice(&self.node_desc);
            }
            RegisterId::Pmtu => {
                check_port(pmtu_reg::LOCAL_PORT.get(&reg))?;
                if op == WRITE {
                    let mtu = pmtu_reg::ADMIN_MTU.get(&reg);
                    if mtu == 0 || mtu > u64::from(self.port.max_mtu) {
                        return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_VALUE));
                    }
                    self.port.admin_mtu = mtu as u16;
                }
                reg.fill(0);
                pmtu_reg::LOCAL_PORT.set(&mut reg, 1);
                pmtu_reg::MAX_MTU.set(&mut reg, u64::from(self.port.max_mtu));
                pmtu_reg::ADMIN_MTU.set(&mut reg, u64::from(self.port.admin_mtu));
                pmtu_reg::OPER_MTU.set(&mut reg, u64::from(self.port.admin_mtu));
            }
            RegisterId::Ptys => {
                check_port(ptys_reg::LOCAL_PORT.get(&reg))?;
                if ptys_reg::PROTO_MASK.get(&reg) & PROTO_ETH == 0 {
                    return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_VALUE));
                }
                if op == WRITE {
                    let admin = ptys_reg::ETH_PROTO_ADMIN.get(&reg) as u32;
                    if admin & !self.port.eth_proto_cap != 0 {
                        return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_VALUE));
                    }
                    self.port.eth_proto_admin = admin;
                }
                reg.fill(0);
                ptys_reg::LOCAL_PORT.set(&mut reg, 1);
                ptys_reg::PROTO_MASK.set(&mut reg, PROTO_ETH);
                ptys_reg::ETH_PROTO_CAPABILITY.set(&mut reg, u64::from(self.port.eth_proto_cap));
                ptys_reg::ETH_PROTO_ADMIN.set(&mut reg, u64::from(self.port.eth_proto_admin));
                ptys_reg::ETH_PROTO_OPER.set(&mut reg, u64::from(self.port.eth_proto_oper));
            }
            _ => {}
        }
        let mut out = vec![0u8; access_register_out::SIZE_BYTES + size];
        out[access_register_out::SIZE_BYTES..].copy_from_slice(&reg);
        Ok(out)
    }

    /// PFCC: the port's flow control. A write sets global pause both
    /// ways unless `pptx_mask_n`/`pprx_mask_n` (Linux's
    /// `mlx5_set_port_pause`), the PFC bits of the priorities in
    /// `prio_mask_tx`/`_rx` (`mlx5_set_port_pfc`), and the stall
    /// watermarks their masks select (`mlx5_set_port_stall_watermark`); a
    /// result with global pause and PFC both on is refused (bad value).
    /// A read reports them.
    fn pfcc(&mut self, op: u64, reg: &mut [u8]) -> Result<(), super::Fail> {
        use pfcc_reg as r;
        check_port(r::LOCAL_PORT.get(reg))?;
        if op == WRITE {
            let mut f = self.port.flow;
            if r::PPTX_MASK_N.get(reg) == 0 {
                f.pause_tx = r::PPTX.get(reg) != 0;
            }
            if r::PPRX_MASK_N.get(reg) == 0 {
                f.pause_rx = r::PPRX.get(reg) != 0;
            }
            let (mtx, mrx) = (
                r::PRIO_MASK_TX.get(reg) as u8,
                r::PRIO_MASK_RX.get(reg) as u8,
            );
            f.pfc_tx = f.pfc_tx & !mtx | r::PFCTX.get(reg) as u8 & mtx;
            f.pfc_rx = f.pfc_rx & !mrx | r::PFCRX.get(reg) as u8 & mrx;
            if r::MINOR_STALL_MASK.get(reg) != 0 {
                f.stall_minor = r::DEVICE_STALL_MINOR_WATERMARK.get(reg) as u16;
            }
            if r::CRITICAL_STALL_MASK.get(reg) != 0 {
                f.stall_critical = r::DEVICE_STALL_CRITICAL_WATERMARK.get(reg) as u16;
            }
            if (f.pause_tx || f.pause_rx) && (f.pfc_tx | f.pfc_rx) != 0 {
                return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_VALUE));
            }
            self.port.flow = f;
        }
        let f = self.port.flow;
        reg.fill(0);
        r::LOCAL_PORT.set(reg, 1);
        r::PPTX.set(reg, u64::from(f.pause_tx));
        r::PPRX.set(reg, u64::from(f.pause_rx));
        r::PFCTX.set(reg, u64::from(f.pfc_tx));
        r::PFCRX.set(reg, u64::from(f.pfc_rx));
        r::DEVICE_STALL_MINOR_WATERMARK.set(reg, u64::from(f.stall_minor));
        r::DEVICE_STALL_CRITICAL_WATERMARK.set(reg, u64::from(f.stall_critical));
        Ok(())
    }

    /// PPCNT: the port's counters, one group at a time. The IEEE 802.3
    /// group counts what the data path moved (every frame, RoCE included:
    /// frames and octets sent, frames received); the other groups the card
    /// keeps read 0 (no errors, pauses or symbol errors on a model's wire).
    /// `clr` (read and clear) zeroes the 802.3 counts.
    fn ppcnt(&mut self, inner: &Inner, op: u64, reg: &mut [u8]) -> Result<(), super::Fail> {
        use mlx5_hw::eth::*;
        use mlx5_hw::ifc::eth_802_3_cntrs_grp_data_layout as g;
        check_port(ppcnt_reg::LOCAL_PORT.get(reg))?;
        let grp = ppcnt_reg::GRP.get(reg);
        let known = [
            PPCNT_GRP_IEEE_802_3,
            PPCNT_GRP_RFC_2863,
            PPCNT_GRP_RFC_2819,
            PPCNT_GRP_RFC_3635,
            PPCNT_GRP_ETHERNET_EXTENDED,
            PPCNT_GRP_PER_PRIORITY,
            PPCNT_GRP_PER_TRAFFIC_CLASS,
            PPCNT_GRP_PHYSICAL_LAYER,
            PPCNT_GRP_PHYSICAL_LAYER_STATISTICAL,
        ];
        if op == WRITE || !known.contains(&grp) {
            return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_VALUE));
        }
        let (clr, prio_tc) = (ppcnt_reg::CLR.get(reg), ppcnt_reg::PRIO_TC.get(reg));
        reg.fill(0);
        ppcnt_reg::LOCAL_PORT.set(reg, 1);
        ppcnt_reg::GRP.set(reg, grp);
        ppcnt_reg::PRIO_TC.set(reg, prio_tc);
        if grp != PPCNT_GRP_IEEE_802_3 {
            return Ok(());
        }
        let c = &inner.rdma.counters;
        // The frames the port's wire to another process dropped (a port
        // with no link drops none): a bad ICRC as a bad frame check
        // sequence, a giant as too long, a frame cut short as a length
        // error, one that is not RoCEv2 or does not parse as an
        // unsupported opcode.
        let w = crate::fabric::link_of(&inner.rdma)
            .map(|l| l.stats())
            .unwrap_or_default();
        let now = [
            c.packets_sent.load(std::sync::atomic::Ordering::Relaxed),
            c.packets_received
                .load(std::sync::atomic::Ordering::Relaxed),
            c.bytes_sent.load(std::sync::atomic::Ordering::Relaxed),
            w.rx_bad_icrc,
            w.rx_giant,
            w.rx_truncated,
            w.rx_malformed,
        ];
        let set = &mut reg[ppcnt_reg::COUNTER_SET.off / 8..];
        for (i, (hi, lo)) in [
            (
                g::A_FRAMES_TRANSMITTED_OK_HIGH,
                g::A_FRAMES_TRANSMITTED_OK_LOW,
            ),
            (g::A_FRAMES_RECEIVED_OK_HIGH, g::A_FRAMES_RECEIVED_OK_LOW),
            (
                g::A_OCTETS_TRANSMITTED_OK_HIGH,
                g::A_OCTETS_TRANSMITTED_OK_LOW,
            ),
            (
                g::A_FRAME_CHECK_SEQUENCE_ERRORS_HIGH,
                g::A_FRAME_CHECK_SEQUENCE_ERRORS_LOW,
            ),
            (
                g::A_FRAME_TOO_LONG_ERRORS_HIGH,
                g::A_FRAME_TOO_LONG_ERRORS_LOW,
            ),
            (
                g::A_IN_RANGE_LENGTH_ERRORS_HIGH,
                g::A_IN_RANGE_LENGTH_ERRORS_LOW,
            ),
            (
                g::A_UNSUPPORTED_OPCODES_RECEIVED_HIGH,
                g::A_UNSUPPORTED_OPCODES_RECEIVED_LOW,
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let v = now[i].wrapping_sub(self.eth.ppcnt_base[i]);
            hi.set(set, v >> 32);
            lo.set(set, v & 0xffff_ffff);
        }
        if clr != 0 {
            self.eth.ppcnt_base = now;
        }
        Ok(())
    }

    fn paos(&mut self, inner: &Inner, op: u64, reg: &mut [u8]) -> Result<(), super::Fail> {
        check_port(paos_reg::LOCAL_PORT.get(reg))?;
        if op == WRITE && paos_reg::ASE.get(reg) == 1 {
            let admin = paos_reg::ADMIN_STATUS.get(reg);
            if admin != STATUS_UP && admin != STATUS_DOWN {
                return Err(fail(CmdStatus::BadParameter, synd::REG_BAD_VALUE));
            }
            self.port.admin_up = admin == STATUS_UP;
            let oper = self.port.admin_up && self.hca == super::HcaState::Initialized;
            if oper != self.port.oper_up {
                self.port.oper_up = oper;
                self.port.eth_proto_oper = if oper { self.port.eth_proto_up } else { 0 };
                if let Some(eqn) = self.eq_for(EventType::PortChange) {
                    let mut d = EqePortState::new_zeroed();
                    d.port = 1 << mlx5_hw::event::EQE_PORT_SHIFT; // port 1
                    let data = zerocopy::transmute!(d);
                    let sub = if oper {
                        PORT_CHANGE_ACTIVE
                    } else {
                        PORT_CHANGE_DOWN
                    };
                    self.post_eqe(inner, eqn, EventType::PortChange.to_raw(), sub, &data);
                }
            }
        }
        for b in reg.iter_mut() {
            *b = 0;
        }
        paos_reg::LOCAL_PORT.set(reg, 1);
        paos_reg::ADMIN_STATUS.set(
            reg,
            if self.port.admin_up {
                STATUS_UP
            } else {
                STATUS_DOWN
            },
        );
        paos_reg::OPER_STATUS.set(
            reg,
            if self.port.oper_up {
                STATUS_UP
            } else {
                STATUS_DOWN
            },
        );
        Ok(())
    }
}

fn check_port(p: u64) -> Result<(), super::Fail> {
    if p == 1 {
        Ok(())
    } else {
        Err(fail(CmdStatus::BadParameter, synd::REG_BAD_PORT))
    }
}
