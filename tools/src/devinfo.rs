//! `mlx5 devinfo`: what `ibv_devinfo` prints, from our own bring-up.

use std::fmt::Write;

use mlx5_hw::registry;
use verbs::hca::Hca;
use vfio::pci;

/// IB MTU enum (`enum ibv_mtu`) for an MTU in bytes: the largest ≤ `bytes`.
pub fn ib_mtu(bytes: u32) -> (u32, u32) {
    let mut best = (256, 1);
    for (i, m) in [256u32, 512, 1024, 2048, 4096].iter().enumerate() {
        if *m <= bytes {
            best = (*m, i as u32 + 1);
        }
    }
    best
}

fn guid(g: Option<u64>) -> String {
    let g = g.unwrap_or(0);
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        g >> 48,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// The `ibv_devinfo` text for an open HCA; `verbose` adds capabilities by name.
pub fn render(hca: &Hca, verbose: bool) -> Result<String, String> {
    let e = |e: verbs::Error| e.to_string();
    let func = hca.function();
    let mut cfg = [0u8; 16];
    func.config_read(0, &mut cfg).map_err(|e| e.to_string())?;
    let device_id = u16::from_le_bytes([
        cfg[pci::DEVICE_ID as usize],
        cfg[pci::DEVICE_ID as usize + 1],
    ]);
    let revision = cfg[pci::REVISION_ID as usize];
    let caps = hca.caps();
    let g = caps.gen();
    let id = hca.identity();
    let eth = g.port_type() == 1;
    let mut o = String::new();
    let _ = writeln!(o, "hca_id:\t{}", func.name());
    let _ = writeln!(o, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(o, "\tfw_ver:\t\t\t\t{}", hca.fw_version());
    let _ = writeln!(o, "\tnode_guid:\t\t\t{}", guid(id.node_guid));
    let _ = writeln!(o, "\tsys_image_guid:\t\t\t{}", guid(id.system_image_guid));
    let _ = writeln!(o, "\tvendor_id:\t\t\t0x{:04x}", id.ieee_vendor_id);
    let _ = writeln!(o, "\tvendor_part_id:\t\t\t{device_id}");
    let _ = writeln!(o, "\thw_ver:\t\t\t\t0x{revision:x}");
    if !id.psid.is_empty() {
        let _ = writeln!(o, "\tboard_id:\t\t\t{}", id.psid);
    }
    let ports = g.num_ports().max(1);
    let _ = writeln!(o, "\tphys_port_cnt:\t\t\t{ports}");
    if verbose {
        let _ = writeln!(o, "\tmax_mr_size:\t\t\t0x{:x}", u64::MAX);
        let _ = writeln!(o, "\tmax_qp:\t\t\t\t{}", 1u64 << g.log_max_qp());
        let _ = writeln!(o, "\tmax_qp_wr:\t\t\t{}", max_qp_wr(g.log_max_qp_sz()));
        let _ = writeln!(o, "\tmax_cq:\t\t\t\t{}", 1u64 << g.log_max_cq());
        let _ = writeln!(o, "\tmax_cqe:\t\t\t{}", (1u64 << g.log_max_cq_sz()) - 1);
        let _ = writeln!(o, "\tmax_mr:\t\t\t\t{}", 1u64 << g.log_max_mkey());
        let _ = writeln!(o, "\tmax_pd:\t\t\t\t{}", 1u64 << g.log_max_pd());
        let _ = writeln!(o, "\tmax_srq:\t\t\t{}", 1u64 << g.log_max_srq());
        let _ = writeln!(o, "\tmax_srq_wr:\t\t\t{}", (1u64 << g.log_max_srq_sz()) - 1);
        let _ = writeln!(
            o,
            "\tmax_pkeys:\t\t\t{}",
            1u64 << (g.pkey_table_size() + 7).min(16)
        );
    }
    let (_, vport) = hca.vport_state().map_err(e)?;
    for port in 1..=ports {
        let ps = hca.port_state(port).map_err(e)?;
        let active = vport == 1 && ps.oper_status == 1;
        let (state, num) = if active {
            ("PORT_ACTIVE", 4)
        } else {
            ("PORT_DOWN", 1)
        };
        let (max, max_n) = ib_mtu(u32::from(ps.max_mtu));
        let (act, act_n) = ib_mtu(u32::from(ps.oper_mtu));
        let _ = writeln!(o, "\t\tport:\t{port}");
        let _ = writeln!(o, "\t\t\tstate:\t\t\t{state} ({num})");
        let _ = writeln!(o, "\t\t\tmax_mtu:\t\t{max} ({max_n})");
        let _ = writeln!(o, "\t\t\tactive_mtu:\t\t{act} ({act_n})");
        let _ = writeln!(o, "\t\t\tsm_lid:\t\t\t0");
        let _ = writeln!(o, "\t\t\tport_lid:\t\t0");
        let _ = writeln!(o, "\t\t\tport_lmc:\t\t0x00");
        let _ = writeln!(
            o,
            "\t\t\tlink_layer:\t\t{}",
            if eth { "Ethernet" } else { "InfiniBand" }
        );
        if verbose {
            port_counters(hca, port, &mut o).map_err(e)?;
        }
    }
    if verbose {
        let _ = writeln!(
            o,
            "\tgeneral capabilities (cmd_hca_cap, current, non-zero):"
        );
        if let Some(info) = registry::layout("cmd_hca_cap") {
            for f in registry::decode(info, &caps.general.current) {
                if let Some(v) = f.value.filter(|v| *v != 0) {
                    let _ = writeln!(o, "\t\t{:<40} {v:#x}", f.path);
                }
            }
        }
    }
    Ok(o)
}

/// The largest send WQE Linux's mlx5_ib plans a QP's depth for
/// (`mlx5_ib_calc_max_sq_overhead` + one data segment: an XRC initiator's
/// control and XRC segments with a UMR's control and mkey segments and its
/// inline threshold, 164 bytes, rounded up to a power of two). Driver
/// policy, not a device limit.
const LINUX_MAX_PLANNED_WQE: u64 = 256;

/// `max_qp_wr` as Linux 6.12 reports it (`mlx5_ib_calc_max_qp_wr`): the
/// queue's 64-byte basic blocks (`1 << log_max_qp_sz`) over the largest
/// WQE, so ibv_devinfo and this agree.
fn max_qp_wr(log_max_qp_sz: u8) -> u64 {
    (1u64 << log_max_qp_sz) * mlx5_hw::wqe::SEND_WQE_BB as u64 / LINUX_MAX_PLANNED_WQE
}

/// The port's IEEE 802.3 counters (ACCESS_REG PPCNT, read without
/// clearing): frames and octets, and the frames the port dropped by cause
/// (on the device model's wire: bad ICRC as a bad frame check sequence,
/// over the size limit as too long, cut short as a length error, not
/// RoCEv2 as an unsupported opcode).
fn port_counters(hca: &Hca, port: u8, o: &mut String) -> Result<(), verbs::Error> {
    use mlx5_hw::ifc::eth_802_3_cntrs_grp_data_layout as g;
    use mlx5_hw::ifc::ppcnt_reg;
    let mut r = vec![0u8; ppcnt_reg::SIZE_BYTES];
    ppcnt_reg::LOCAL_PORT.set(&mut r, u64::from(port));
    ppcnt_reg::GRP.set(&mut r, mlx5_hw::eth::PPCNT_GRP_IEEE_802_3);
    let r = hca.access_reg(mlx5_hw::init::RegisterId::Ppcnt, 0, &r, false)?;
    let Some(set) = r.get(ppcnt_reg::COUNTER_SET.off / 8..) else {
        return Ok(());
    };
    if set.len() < g::SIZE_BYTES {
        return Ok(());
    }
    for (name, hi, lo) in [
        (
            "frames_tx",
            g::A_FRAMES_TRANSMITTED_OK_HIGH,
            g::A_FRAMES_TRANSMITTED_OK_LOW,
        ),
        (
            "frames_rx",
            g::A_FRAMES_RECEIVED_OK_HIGH,
            g::A_FRAMES_RECEIVED_OK_LOW,
        ),
        (
            "octets_tx",
            g::A_OCTETS_TRANSMITTED_OK_HIGH,
            g::A_OCTETS_TRANSMITTED_OK_LOW,
        ),
        (
            "fcs_errors",
            g::A_FRAME_CHECK_SEQUENCE_ERRORS_HIGH,
            g::A_FRAME_CHECK_SEQUENCE_ERRORS_LOW,
        ),
        (
            "too_long",
            g::A_FRAME_TOO_LONG_ERRORS_HIGH,
            g::A_FRAME_TOO_LONG_ERRORS_LOW,
        ),
        (
            "length_errors",
            g::A_IN_RANGE_LENGTH_ERRORS_HIGH,
            g::A_IN_RANGE_LENGTH_ERRORS_LOW,
        ),
        (
            "unsupported_opcodes",
            g::A_UNSUPPORTED_OPCODES_RECEIVED_HIGH,
            g::A_UNSUPPORTED_OPCODES_RECEIVED_LOW,
        ),
    ] {
        let v = hi.get(set) << 32 | lo.get(set);
        let _ = writeln!(
            o,
            "\t\t\t{name}:\t{}{v}",
            if name.len() < 13 { "\t" } else { "" }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_enum() {
        assert_eq!(ib_mtu(4096), (4096, 5));
        assert_eq!(ib_mtu(1500), (1024, 3));
        assert_eq!(ib_mtu(9000), (4096, 5));
        assert_eq!(ib_mtu(0), (256, 1));
    }
}
