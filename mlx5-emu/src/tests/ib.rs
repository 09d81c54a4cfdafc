//! What Linux's mlx5_ib asks of firmware at probe and remove, beyond the
//! data path: NODE_DESC, the P_Key table, XRC domains, Q counter sets and
//! congestion statistics.

use mlx5_hw::ifc::{
    access_register_in, alloc_q_counter_out, alloc_xrcd_out, query_cong_statistics_in,
    query_cong_statistics_out, query_hca_vport_pkey_in, query_hca_vport_pkey_out,
    query_q_counter_in, query_q_counter_out,
};
use mlx5_hw::status::CmdStatus;

use super::{be32, cmd_in, Drv};

fn node_desc(d: &mut Drv, op_mod: u16, text: &[u8]) -> Vec<u8> {
    let mut c = cmd_in(0x805, op_mod, access_register_in::SIZE_BYTES + 64);
    access_register_in::REGISTER_ID.set(&mut c, 0x6001);
    c[access_register_in::SIZE_BYTES..][..text.len()].copy_from_slice(text);
    d.exec(&c, 0x10 + 64)
}

#[test]
fn node_desc_reads_the_part_and_keeps_what_the_driver_writes() {
    let mut d = Drv::new();
    d.bring_up();
    let out = node_desc(&mut d, 1, &[]);
    assert_eq!(out[0], 0);
    assert!(out[0x10..].starts_with(b"MT4117 ConnectX4Lx Mellanox Technologies\0"));
    let out = node_desc(&mut d, 0, b"host mlx5_0");
    assert_eq!(out[0], 0);
    let out = node_desc(&mut d, 1, &[]);
    assert!(out[0x10..].starts_with(b"host mlx5_0\0"));
    // A register shorter than 64 bytes is a bad input length.
    let mut c = cmd_in(0x805, 1, access_register_in::SIZE_BYTES + 32);
    access_register_in::REGISTER_ID.set(&mut c, 0x6001);
    assert_eq!(d.exec(&c, 0x10 + 64)[0], CmdStatus::BadInputLength.to_raw());
}

fn pkeys(d: &mut Drv, index: u16, n: usize) -> Vec<u8> {
    let mut c = cmd_in(0x765, 0, query_hca_vport_pkey_in::SIZE_BYTES);
    query_hca_vport_pkey_in::PKEY_INDEX.set(&mut c, u64::from(index));
    d.exec(&c, query_hca_vport_pkey_out::SIZE_BYTES + 4 * n)
}

#[test]
fn pkey_table_has_the_default_key_at_index_0() {
    let mut d = Drv::new();
    // Before INIT_HCA: bad system state.
    d.open();
    d.ok(&cmd_in(0x104, 0, 16), 16);
    assert_eq!(pkeys(&mut d, 0, 1)[0], CmdStatus::BadSystemState.to_raw());
    d.ok(&cmd_in(0x105, 0, 16), 16);
    d.bring_up();
    let one = pkeys(&mut d, 0, 1);
    assert_eq!(one[0], 0);
    assert_eq!(be32(&one, 0x10) & 0xffff, 0xffff);
    // The whole table (0xffff): 128 entries, only the first valid.
    let all = pkeys(&mut d, 0xffff, 128);
    assert_eq!(all[0], 0);
    assert_eq!(be32(&all, 0x10) & 0xffff, 0xffff);
    assert!((1..128).all(|i| be32(&all, 0x10 + 4 * i) == 0));
    assert_eq!(be32(&pkeys(&mut d, 5, 1), 0x10), 0);
    // Past the table; the whole table into a one-entry output.
    assert_eq!(pkeys(&mut d, 128, 1)[0], CmdStatus::BadParameter.to_raw());
    assert_eq!(
        pkeys(&mut d, 0xffff, 1)[0],
        CmdStatus::BadOutputLength.to_raw()
    );
    // Another vport's table: this function manages none.
    let mut c = cmd_in(0x765, 0, query_hca_vport_pkey_in::SIZE_BYTES);
    query_hca_vport_pkey_in::OTHER_VPORT.set(&mut c, 1);
    assert_eq!(d.exec(&c, 0x14)[0], CmdStatus::BadParameter.to_raw());
}

#[test]
fn xrc_domains_alloc_dealloc_and_leak_count() {
    let mut d = Drv::new();
    d.bring_up();
    let a = alloc_xrcd_out::XRCD.get(&d.ok(&cmd_in(0x80e, 0, 16), 16)) as u32;
    let b = alloc_xrcd_out::XRCD.get(&d.ok(&cmd_in(0x80e, 0, 16), 16)) as u32;
    assert_ne!(a, b);
    assert_eq!(d.f.model().stats().xrcds, 2);
    let mut dealloc = cmd_in(0x80f, 0, 16);
    dealloc[8..12].copy_from_slice(&a.to_be_bytes());
    d.ok(&dealloc, 16);
    // Twice: unknown.
    assert_eq!(d.exec(&dealloc, 16)[0], CmdStatus::BadResource.to_raw());
    // A user context's uid without DEVX: bad parameter.
    let mut with_uid = cmd_in(0x80e, 0, 16);
    with_uid[2..4].copy_from_slice(&7u16.to_be_bytes());
    assert_eq!(d.exec(&with_uid, 16)[0], CmdStatus::BadParameter.to_raw());
    assert_eq!(d.f.model().stats().xrcds, 1);
    // The lowest free number comes back.
    let c = alloc_xrcd_out::XRCD.get(&d.ok(&cmd_in(0x80e, 0, 16), 16)) as u32;
    assert_eq!(c, a);
}

fn query_q_counter(d: &mut Drv, id: u32, clear: bool) -> Vec<u8> {
    let mut c = cmd_in(0x773, 0, query_q_counter_in::SIZE_BYTES);
    query_q_counter_in::COUNTER_SET_ID.set(&mut c, u64::from(id));
    query_q_counter_in::CLEAR.set(&mut c, u64::from(clear));
    d.exec(&c, query_q_counter_out::SIZE_BYTES)
}

#[test]
fn q_counter_sets_are_max_qp_cnt_and_checked() {
    let mut d = Drv::new();
    d.bring_up();
    // max_qp_cnt (0xff on the ConnectX-4) sets, numbered from 1.
    let mut ids = vec![];
    for _ in 0..0xff {
        let out = d.ok(&cmd_in(0x771, 0, 16), 16);
        ids.push(alloc_q_counter_out::COUNTER_SET_ID.get(&out) as u32);
    }
    assert_eq!(ids, (1..=0xff).collect::<Vec<u32>>());
    assert_eq!(
        d.exec(&cmd_in(0x771, 0, 16), 16)[0],
        CmdStatus::NoResources.to_raw()
    );
    assert_eq!(d.f.model().stats().q_counters, 0xff);
    let out = query_q_counter(&mut d, 3, false);
    assert_eq!(out[0], 0);
    assert_eq!(query_q_counter_out::OUT_OF_BUFFER.get(&out), 0);
    let mut dealloc = cmd_in(0x772, 0, 16);
    dealloc[8..12].copy_from_slice(&3u32.to_be_bytes());
    d.ok(&dealloc, 16);
    assert_eq!(d.exec(&dealloc, 16)[0], CmdStatus::BadResource.to_raw());
    assert_eq!(
        query_q_counter(&mut d, 3, false)[0],
        CmdStatus::BadResource.to_raw()
    );
    // Aggregation is not a ConnectX-4 capability.
    let mut agg = cmd_in(0x773, 0, query_q_counter_in::SIZE_BYTES);
    query_q_counter_in::COUNTER_SET_ID.set(&mut agg, 4);
    query_q_counter_in::AGGREGATE.set(&mut agg, 1);
    assert_eq!(
        d.exec(&agg, query_q_counter_out::SIZE_BYTES)[0],
        CmdStatus::BadParameter.to_raw()
    );
    assert_eq!(d.f.model().stats().q_counters, 0xfe);
}

#[test]
fn congestion_statistics_are_zero_without_congestion() {
    let (mut d, clock) = Drv::manual();
    d.bring_up();
    let c = cmd_in(0x826, 0, query_cong_statistics_in::SIZE_BYTES);
    let out = d.ok(&c, query_cong_statistics_out::SIZE_BYTES);
    for f in [
        query_cong_statistics_out::RP_CNP_HANDLED_LOW,
        query_cong_statistics_out::RP_CNP_IGNORED_LOW,
        query_cong_statistics_out::NP_ECN_MARKED_ROCE_PACKETS_LOW,
        query_cong_statistics_out::NP_CNP_SENT_LOW,
    ] {
        assert_eq!(f.get(&out), 0);
    }
    // The sample carries the HCA clock (ns since power-on), which moves
    // with the model's clock and only with it.
    let stamp = |out: &[u8]| {
        query_cong_statistics_out::TIME_STAMP_HIGH.get(out) << 32
            | query_cong_statistics_out::TIME_STAMP_LOW.get(out)
    };
    let t0 = stamp(&out);
    assert_eq!(stamp(&d.ok(&c, query_cong_statistics_out::SIZE_BYTES)), t0);
    clock.advance(std::time::Duration::from_millis(2));
    let t1 = stamp(&d.ok(&c, query_cong_statistics_out::SIZE_BYTES));
    assert_eq!(t1 - t0, 2_000_000);
    // A short output is answered truncated, as firmware answers drivers
    // built against shorter layouts.
    let short = d.exec(&c, 0x20);
    let full = d.ok(&c, query_cong_statistics_out::SIZE_BYTES);
    assert_eq!(short.len(), 0x20);
    assert_eq!(short[0], CmdStatus::Ok.to_raw());
    assert_eq!(short[..], full[..0x20]);
}

#[test]
fn xrc_domains_and_q_counter_sets_left_at_teardown_count_as_leaked() {
    let mut d = Drv::new();
    d.bring_up();
    d.ok(&cmd_in(0x80e, 0, 16), 16);
    d.ok(&cmd_in(0x771, 0, 16), 16);
    d.ok(&cmd_in(0x771, 0, 16), 16);
    d.ok(&cmd_in(0x103, 0, 16), 16);
    let s = d.f.model().stats();
    assert_eq!((s.xrcds, s.q_counters), (0, 0), "firmware forgot them");
    assert_eq!(s.leaked_at_teardown, 3);
}

/// PTYS as mlx5_ib's query_port reads it for the rate: the traced
/// ConnectX-4 Lx's port runs 25GBASE-CR once the HCA is up and offers no
/// 40/100G; a ConnectX-5's trains to 100GBASE-CR4.
#[test]
fn ptys_reports_the_cards_link_protocols() {
    use crate::fw::PortState;
    use crate::Profile;
    use mlx5_hw::ifc::ptys_reg;
    let mut d = Drv::new();
    d.bring_up();
    let mut c = cmd_in(
        0x805,
        1,
        access_register_in::SIZE_BYTES + ptys_reg::SIZE_BYTES,
    );
    access_register_in::REGISTER_ID.set(&mut c, 0x5004);
    let reg = &mut c[access_register_in::SIZE_BYTES..];
    ptys_reg::LOCAL_PORT.set(reg, 1);
    ptys_reg::PROTO_MASK.set(reg, 1 << 2);
    let out = d.exec(&c, 0x10 + ptys_reg::SIZE_BYTES);
    assert_eq!(out[0], 0);
    let reg = &out[0x10..];
    assert_eq!(ptys_reg::ETH_PROTO_OPER.get(reg), 1 << 27, "25GBASE-CR");
    let cap = ptys_reg::ETH_PROTO_CAPABILITY.get(reg);
    assert_eq!(cap & (1 << 20 | 1 << 6), 0, "no 40/100G on a ConnectX-4 Lx");
    let cx5 = PortState::power_on(Profile::ConnectX5);
    assert_eq!(cx5.eth_proto_up, 1 << 20, "100GBASE-CR4");
    assert_ne!(cx5.eth_proto_cap & cx5.eth_proto_up, 0);
}

/// PFCC as mlx5e reads and writes it (`ethtool -a`/`-A`, `ethtool -S`'s
/// per-priority counters, DCB): global pause on both ways from power-on;
/// `mlx5_set_port_pause` turns it off, `mlx5_set_port_pfc` (every
/// priority in the masks) turns PFC on for priority 3; a write leaving
/// global pause and PFC both on is refused and changes nothing; a priority
/// outside the write's mask keeps its bit.
#[test]
fn pfcc_keeps_global_pause_and_pfc_apart() {
    use mlx5_hw::ifc::pfcc_reg as r;
    let mut d = Drv::new();
    d.bring_up();
    let mut pfcc = |op: u16, edit: &dyn Fn(&mut [u8])| {
        let mut c = cmd_in(0x805, op, access_register_in::SIZE_BYTES + r::SIZE_BYTES);
        access_register_in::REGISTER_ID.set(&mut c, 0x5007);
        let reg = &mut c[access_register_in::SIZE_BYTES..];
        r::LOCAL_PORT.set(reg, 1);
        edit(reg);
        let out = d.exec(&c, 0x10 + r::SIZE_BYTES);
        let reg = out.get(0x10..).unwrap_or_default().to_vec();
        let got = |f: mlx5_hw::bits::BitField| {
            if reg.len() >= r::SIZE_BYTES {
                f.get(&reg)
            } else {
                0
            }
        };
        (
            out[0],
            [got(r::PPTX), got(r::PPRX), got(r::PFCTX), got(r::PFCRX)],
        )
    };
    const READ: u16 = 1;
    const WRITE: u16 = 0;
    assert_eq!(
        pfcc(READ, &|_| {}),
        (0, [1, 1, 0, 0]),
        "pause on at power-on"
    );
    // PFC while global pause is on: refused, nothing changed.
    let pfc3 = |reg: &mut [u8]| {
        r::PPTX_MASK_N.set(reg, 1);
        r::PPRX_MASK_N.set(reg, 1);
        r::PFCTX.set(reg, 1 << 3);
        r::PFCRX.set(reg, 1 << 3);
        r::PRIO_MASK_TX.set(reg, 0xff);
        r::PRIO_MASK_RX.set(reg, 0xff);
    };
    let refused = CmdStatus::BadParameter.to_raw();
    assert_eq!(pfcc(WRITE, &pfc3).0, refused);
    assert_eq!(pfcc(READ, &|_| {}), (0, [1, 1, 0, 0]));
    // Pause off (mlx5_set_port_pause writes both bits, nothing else).
    assert_eq!(pfcc(WRITE, &|_| {}), (0, [0, 0, 0, 0]));
    assert_eq!(pfcc(WRITE, &pfc3), (0, [0, 0, 1 << 3, 1 << 3]));
    // Priority 5 on, masked to it alone: 3 stays.
    let pfc5 = |reg: &mut [u8]| {
        r::PPTX_MASK_N.set(reg, 1);
        r::PPRX_MASK_N.set(reg, 1);
        r::PFCTX.set(reg, 0xff);
        r::PRIO_MASK_TX.set(reg, 1 << 5);
    };
    assert_eq!(pfcc(WRITE, &pfc5), (0, [0, 0, 1 << 3 | 1 << 5, 1 << 3]));
    // Another port: refused.
    assert_eq!(pfcc(READ, &|reg| r::LOCAL_PORT.set(reg, 2)).0, refused);
}
