//! Flow steering by hand-built commands: every check firmware makes on
//! flow tables, groups, entries and counters, and the object counts.

use mlx5_hw::bits::BitField;
use mlx5_hw::ifc::{
    alloc_flow_counter_in, alloc_flow_counter_out, create_flow_group_in, create_flow_group_out,
    create_flow_table_in, create_flow_table_out, dealloc_flow_counter_in, delete_fte_in,
    dest_format_struct, destroy_flow_group_in, destroy_flow_table_in, flow_context,
    flow_counter_list, flow_table_context, flow_table_nic_cap, flow_table_prop_layout,
    modify_flow_table_in, query_flow_table_in, query_flow_table_out, query_fte_in, query_fte_out,
    query_hca_cap_out, set_flow_table_root_in, set_fte_in,
};
use mlx5_hw::status::CmdStatus;

use super::{cmd_in, Drv};

const NIC_RX: u64 = 0;
const FDB: u64 = 4;

fn status(out: &[u8]) -> u8 {
    out[0]
}

/// A brought-up function and its NIC RX flow-table properties
/// (`max_ft_level`, `log_max_ft_size`), read with QUERY_HCA_CAP.
fn setup() -> (Drv, u64, u64) {
    let mut d = Drv::new();
    d.bring_up();
    // op_mod: type 7 (flow table) << 1 | current.
    let out = d.ok(
        &cmd_in(0x100, 7 << 1 | 1, 16),
        query_hca_cap_out::SIZE_BYTES,
    );
    let page = &out[0x10..];
    let prop = |f: BitField| {
        f.at(flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE.off)
            .get(page)
    };
    assert_eq!(prop(flow_table_prop_layout::FT_SUPPORT), 1);
    let max_level = prop(flow_table_prop_layout::MAX_FT_LEVEL);
    let max_log = prop(flow_table_prop_layout::LOG_MAX_FT_SIZE);
    assert!(max_level >= 2 && max_log >= 4, "{max_level} {max_log}");
    (d, max_level, max_log)
}

/// Sets a NIC RX flow-table capability in the model's current page (what
/// another firmware version would advertise).
fn set_rx_cap(d: &Drv, f: BitField, v: u64) {
    let mut fw = crate::lock(&d.f.model().inner.fw);
    let page = fw.caps.cur.get_mut(&7).expect("flow-table caps");
    f.at(flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE.off)
        .set(page, v);
}

pub(super) fn create_table(
    d: &mut Drv,
    ty: u64,
    level: u64,
    log_size: u64,
    miss: Option<u32>,
) -> Vec<u8> {
    use create_flow_table_in as i;
    let mut inp = cmd_in(0x930, 0, i::SIZE_BYTES);
    i::TABLE_TYPE.set(&mut inp, ty);
    let at = i::FLOW_TABLE_CONTEXT.off;
    flow_table_context::LEVEL.at(at).set(&mut inp, level);
    flow_table_context::LOG_SIZE.at(at).set(&mut inp, log_size);
    if let Some(m) = miss {
        flow_table_context::TABLE_MISS_ACTION
            .at(at)
            .set(&mut inp, 1);
        flow_table_context::TABLE_MISS_ID
            .at(at)
            .set(&mut inp, u64::from(m));
    }
    d.exec(&inp, create_flow_table_out::SIZE_BYTES)
}

fn table(d: &mut Drv, level: u64, log_size: u64) -> u32 {
    let out = create_table(d, NIC_RX, level, log_size, None);
    assert_eq!(status(&out), 0);
    create_flow_table_out::TABLE_ID.get(&out) as u32
}

fn destroy_table(d: &mut Drv, id: u32) -> u8 {
    use destroy_flow_table_in as i;
    let mut inp = cmd_in(0x931, 0, i::SIZE_BYTES);
    i::TABLE_TYPE.set(&mut inp, NIC_RX);
    i::TABLE_ID.set(&mut inp, u64::from(id));
    status(&d.exec(&inp, 16))
}

fn set_root(d: &mut Drv, id: u32) -> u8 {
    use set_flow_table_root_in as i;
    let mut inp = cmd_in(0x92f, 0, i::SIZE_BYTES);
    i::TABLE_TYPE.set(&mut inp, NIC_RX);
    i::TABLE_ID.set(&mut inp, u64::from(id));
    status(&d.exec(&inp, 16))
}

pub(super) fn create_group(d: &mut Drv, table: u32, start: u32, end: u32) -> (u8, u32) {
    use create_flow_group_in as i;
    let mut inp = cmd_in(0x933, 0, i::SIZE_BYTES);
    i::TABLE_TYPE.set(&mut inp, NIC_RX);
    i::TABLE_ID.set(&mut inp, u64::from(table));
    i::START_FLOW_INDEX.set(&mut inp, u64::from(start));
    i::END_FLOW_INDEX.set(&mut inp, u64::from(end));
    i::MATCH_CRITERIA_ENABLE.set(&mut inp, 1);
    let out = d.exec(&inp, create_flow_group_out::SIZE_BYTES);
    (
        status(&out),
        create_flow_group_out::GROUP_ID.get(&out) as u32,
    )
}

fn destroy_group(d: &mut Drv, table: u32, group: u32) -> u8 {
    use destroy_flow_group_in as i;
    let mut inp = cmd_in(0x934, 0, i::SIZE_BYTES);
    i::TABLE_TYPE.set(&mut inp, NIC_RX);
    i::TABLE_ID.set(&mut inp, u64::from(table));
    i::GROUP_ID.set(&mut inp, u64::from(group));
    status(&d.exec(&inp, 16))
}

/// SET_FLOW_TABLE_ENTRY forwarding to `to` (flow tables) and counting
/// into `counters`.
fn set_fte(d: &mut Drv, table: u32, group: u32, index: u32, to: &[u32], counters: &[u32]) -> u8 {
    use set_fte_in as i;
    let dests = (i::FLOW_CONTEXT.off + flow_context::DESTINATION.off) / 8;
    let mut inp = cmd_in(
        0x936,
        0,
        dests
            + to.len() * dest_format_struct::SIZE_BYTES
            + counters.len() * flow_counter_list::SIZE_BYTES,
    );
    i::TABLE_TYPE.set(&mut inp, NIC_RX);
    i::TABLE_ID.set(&mut inp, u64::from(table));
    i::FLOW_INDEX.set(&mut inp, u64::from(index));
    let fc = i::FLOW_CONTEXT.off;
    flow_context::GROUP_ID
        .at(fc)
        .set(&mut inp, u64::from(group));
    let mut action = 0x1; // allow
    if !to.is_empty() {
        action |= 0x4;
    }
    if !counters.is_empty() {
        action |= 0x8;
    }
    flow_context::ACTION.at(fc).set(&mut inp, action);
    flow_context::DESTINATION_LIST_SIZE
        .at(fc)
        .set(&mut inp, to.len() as u64);
    flow_context::FLOW_COUNTER_LIST_SIZE
        .at(fc)
        .set(&mut inp, counters.len() as u64);
    for (k, &t) in to.iter().enumerate() {
        let e = &mut inp[dests + k * dest_format_struct::SIZE_BYTES..];
        dest_format_struct::DESTINATION_TYPE.set(e, 1);
        dest_format_struct::DESTINATION_ID.set(e, u64::from(t));
    }
    let cl = dests + to.len() * dest_format_struct::SIZE_BYTES;
    for (k, &c) in counters.iter().enumerate() {
        let e = &mut inp[cl + k * flow_counter_list::SIZE_BYTES..];
        flow_counter_list::FLOW_COUNTER_ID.set(e, u64::from(c));
    }
    status(&d.exec(&inp, 16))
}

pub(super) fn delete_fte(d: &mut Drv, table: u32, index: u32) -> u8 {
    use delete_fte_in as i;
    let mut inp = cmd_in(0x938, 0, i::SIZE_BYTES);
    i::TABLE_TYPE.set(&mut inp, NIC_RX);
    i::TABLE_ID.set(&mut inp, u64::from(table));
    i::FLOW_INDEX.set(&mut inp, u64::from(index));
    status(&d.exec(&inp, 16))
}

fn alloc_counter(d: &mut Drv, bulk: u64) -> (u8, u32) {
    let mut inp = cmd_in(0x939, 0, alloc_flow_counter_in::SIZE_BYTES);
    alloc_flow_counter_in::FLOW_COUNTER_BULK.set(&mut inp, bulk);
    let out = d.exec(&inp, alloc_flow_counter_out::SIZE_BYTES);
    (
        status(&out),
        alloc_flow_counter_out::FLOW_COUNTER_ID.get(&out) as u32,
    )
}

fn dealloc_counter(d: &mut Drv, id: u32) -> u8 {
    let mut inp = cmd_in(0x93a, 0, dealloc_flow_counter_in::SIZE_BYTES);
    dealloc_flow_counter_in::FLOW_COUNTER_ID.set(&mut inp, u64::from(id));
    status(&d.exec(&inp, 16))
}

const BAD_PARAM: u8 = CmdStatus::BadParameter.to_raw();
const BAD_RES: u8 = CmdStatus::BadResource.to_raw();
const BUSY: u8 = CmdStatus::BadResourceState.to_raw();

#[test]
fn table_type_level_and_size_are_checked_against_the_caps() {
    let (mut d, max_level, max_log) = setup();
    // FDB: an e-switch table, which the NIC caps do not offer.
    assert_eq!(status(&create_table(&mut d, FDB, 0, 4, None)), BAD_PARAM);
    assert_eq!(status(&create_table(&mut d, 0xff, 0, 4, None)), BAD_PARAM);
    assert_eq!(
        status(&create_table(&mut d, NIC_RX, max_level, 4, None)),
        BAD_PARAM
    );
    assert_eq!(
        status(&create_table(&mut d, NIC_RX, 0, max_log + 1, None)),
        BAD_PARAM
    );
    let t = table(&mut d, max_level - 1, max_log);
    // QUERY_FLOW_TABLE gives back what was created.
    let mut q = cmd_in(0x932, 0, query_flow_table_in::SIZE_BYTES);
    query_flow_table_in::TABLE_TYPE.set(&mut q, NIC_RX);
    query_flow_table_in::TABLE_ID.set(&mut q, u64::from(t));
    let out = d.ok(&q, query_flow_table_out::SIZE_BYTES);
    let at = query_flow_table_out::FLOW_TABLE_CONTEXT.off;
    assert_eq!(flow_table_context::LEVEL.at(at).get(&out), max_level - 1);
    assert_eq!(flow_table_context::LOG_SIZE.at(at).get(&out), max_log);
    // The same id under another type is not that table.
    query_flow_table_in::TABLE_TYPE.set(&mut q, 1);
    assert_eq!(
        status(&d.exec(&q, query_flow_table_out::SIZE_BYTES)),
        BAD_RES
    );
    assert_eq!(d.f.model().stats().flow_tables, 1);
    assert_eq!(destroy_table(&mut d, t), 0);
    assert_eq!(destroy_table(&mut d, t), BAD_RES);
    assert_eq!(d.f.model().stats().flow_tables, 0);
}

#[test]
fn miss_tables_must_exist_and_be_deeper() {
    let (mut d, _, _) = setup();
    let deep = table(&mut d, 2, 4);
    assert_eq!(
        status(&create_table(&mut d, NIC_RX, 1, 4, Some(deep + 100))),
        BAD_RES
    );
    assert_eq!(
        status(&create_table(&mut d, NIC_RX, 3, 4, Some(deep))),
        BAD_PARAM
    );
    let out = create_table(&mut d, NIC_RX, 1, 4, Some(deep));
    assert_eq!(status(&out), 0);
    let shallow = create_flow_table_out::TABLE_ID.get(&out) as u32;
    // The miss target is busy while a table goes to it.
    assert_eq!(destroy_table(&mut d, deep), BUSY);
    // ConnectX-4 firmware 14.12 does not offer flow_table_modify: the
    // miss path cannot be changed (Linux skips the namespaces that need it).
    use modify_flow_table_in as m;
    let mut inp = cmd_in(0x93c, 0, m::SIZE_BYTES);
    m::TABLE_TYPE.set(&mut inp, NIC_RX);
    m::TABLE_ID.set(&mut inp, u64::from(shallow));
    m::MODIFY_FIELD_SELECT.set(&mut inp, 1);
    assert_eq!(status(&d.exec(&inp, 16)), BAD_PARAM);
    // Where it is offered, going back to the default miss frees the target.
    set_rx_cap(&d, flow_table_prop_layout::FLOW_TABLE_MODIFY, 1);
    d.ok(&inp, 16);
    assert_eq!(destroy_table(&mut d, deep), 0);
    assert_eq!(destroy_table(&mut d, shallow), 0);
}

#[test]
fn groups_stay_inside_their_table_and_apart() {
    let (mut d, _, _) = setup();
    let t = table(&mut d, 0, 4);
    assert_eq!(create_group(&mut d, t, 0, 16).0, BAD_PARAM, "past the end");
    assert_eq!(create_group(&mut d, t, 5, 4).0, BAD_PARAM, "start > end");
    assert_eq!(create_group(&mut d, t + 1, 0, 3).0, BAD_RES, "no table");
    let (s, g1) = create_group(&mut d, t, 0, 7);
    assert_eq!(s, 0);
    assert_eq!(create_group(&mut d, t, 7, 9).0, BAD_PARAM, "overlap");
    let (s, g2) = create_group(&mut d, t, 8, 15);
    assert_eq!(s, 0);
    assert_ne!(g1, g2);
    assert_eq!(d.f.model().stats().flow_groups, 2);
    // A table with groups cannot go.
    assert_eq!(destroy_table(&mut d, t), BUSY);
    assert_eq!(destroy_group(&mut d, t, g1), 0);
    assert_eq!(destroy_group(&mut d, t, g1), BAD_RES);
    assert_eq!(destroy_group(&mut d, t, g2), 0);
    assert_eq!(destroy_table(&mut d, t), 0);
}

#[test]
fn entries_sit_in_their_group_and_forward_to_live_deeper_tables() {
    let (mut d, _, _) = setup();
    let t = table(&mut d, 1, 4);
    let shallow = table(&mut d, 0, 4);
    let deep = table(&mut d, 2, 4);
    let (_, g) = create_group(&mut d, t, 0, 3);
    assert_eq!(set_fte(&mut d, t, g, 4, &[], &[]), BAD_PARAM, "outside");
    assert_eq!(set_fte(&mut d, t, g + 1, 0, &[], &[]), BAD_RES, "no group");
    assert_eq!(set_fte(&mut d, t, g, 0, &[deep + 50], &[]), BAD_RES);
    assert_eq!(set_fte(&mut d, t, g, 0, &[shallow], &[]), BAD_PARAM);
    assert_eq!(set_fte(&mut d, t, g, 0, &[deep], &[]), 0);
    assert_eq!(set_fte(&mut d, t, g, 0, &[deep], &[]), BUSY, "twice");
    assert_eq!(d.f.model().stats().ftes, 1);
    // QUERY_FTE returns the entry as written.
    let mut q = cmd_in(0x937, 0, query_fte_in::SIZE_BYTES);
    query_fte_in::TABLE_TYPE.set(&mut q, NIC_RX);
    query_fte_in::TABLE_ID.set(&mut q, u64::from(t));
    let out = d.ok(&q, query_fte_out::SIZE_BYTES + 8);
    let fc = query_fte_out::FLOW_CONTEXT.off;
    assert_eq!(flow_context::GROUP_ID.at(fc).get(&out), u64::from(g));
    assert_eq!(flow_context::DESTINATION_LIST_SIZE.at(fc).get(&out), 1);
    let dest = &out[(fc + flow_context::DESTINATION.off) / 8..];
    assert_eq!(
        dest_format_struct::DESTINATION_ID.get(dest),
        u64::from(deep)
    );
    // Busy: the group has an entry, the deep table is a destination.
    assert_eq!(destroy_group(&mut d, t, g), BUSY);
    assert_eq!(destroy_table(&mut d, deep), BUSY);
    assert_eq!(delete_fte(&mut d, t, 0), 0);
    assert_eq!(delete_fte(&mut d, t, 0), BAD_RES);
    assert_eq!(destroy_group(&mut d, t, g), 0);
    for id in [deep, shallow, t] {
        assert_eq!(destroy_table(&mut d, id), 0);
    }
}

#[test]
fn the_root_moves_before_its_table_goes() {
    let (mut d, _, _) = setup();
    let a = table(&mut d, 0, 4);
    let b = table(&mut d, 1, 4);
    assert_eq!(set_root(&mut d, b + 10), BAD_RES);
    assert_eq!(set_root(&mut d, a), 0);
    // Another table exists: the root must move first.
    assert_eq!(destroy_table(&mut d, a), BUSY);
    assert_eq!(set_root(&mut d, b), 0);
    assert_eq!(destroy_table(&mut d, a), 0);
    // The last table of the type may go; the root returns to the default
    // and a new table may become root.
    assert_eq!(destroy_table(&mut d, b), 0);
    assert_eq!(d.f.model().stats().flow_tables, 0);
    let c = table(&mut d, 3, 4);
    assert_eq!(set_root(&mut d, c), 0);
    // Without modify_root a root cannot be replaced, only set again.
    let e = table(&mut d, 2, 4);
    set_rx_cap(&d, flow_table_prop_layout::MODIFY_ROOT, 0);
    assert_eq!(set_root(&mut d, e), BAD_PARAM);
    assert_eq!(set_root(&mut d, c), 0);
    assert_eq!(destroy_table(&mut d, e), 0);
    assert_eq!(destroy_table(&mut d, c), 0);
}

#[test]
fn counters_come_in_offered_bulks_and_stay_while_counted() {
    let (mut d, _, _) = setup();
    // ConnectX-4 firmware 14.12 advertises no flow counters.
    assert_eq!(alloc_counter(&mut d, 0).0, CmdStatus::NoResources.to_raw());
    // A firmware that offers 1024 of them, in bulks of 128 and 256.
    {
        use mlx5_hw::ifc::cmd_hca_cap as g;
        let mut fw = crate::lock(&d.f.model().inner.fw);
        let page = fw.caps.cur.get_mut(&0).expect("general caps");
        g::MAX_FLOW_COUNTER_15_0.set(page, 1024);
        g::FLOW_COUNTER_BULK_ALLOC.set(page, 0b11);
    }
    let (s, one) = alloc_counter(&mut d, 0);
    assert_eq!(s, 0);
    let (s, bulk) = alloc_counter(&mut d, 2);
    assert_eq!(s, 0);
    assert_eq!(bulk % 256, 0, "a bulk of 256 starts at a multiple of 256");
    assert_eq!(alloc_counter(&mut d, 3).0, BAD_PARAM, "two sizes at once");
    assert_eq!(alloc_counter(&mut d, 4).0, BAD_PARAM, "not offered");
    assert_eq!(d.f.model().stats().flow_counters, 257);
    let (s, last) = alloc_counter(&mut d, 2);
    assert_eq!(s, 0);
    assert_eq!(dealloc_counter(&mut d, last), 0);
    assert_eq!(alloc_counter(&mut d, 2).0, 0);
    assert_eq!(alloc_counter(&mut d, 2).0, 0);
    assert_eq!(
        alloc_counter(&mut d, 2).0,
        CmdStatus::NoResources.to_raw(),
        "past max_flow_counter"
    );
    let t = table(&mut d, 0, 4);
    let (_, g) = create_group(&mut d, t, 0, 3);
    // NIC RX of firmware 14.12 cannot count (flow_counter 0).
    assert_eq!(set_fte(&mut d, t, g, 1, &[], &[one]), BAD_PARAM);
    set_rx_cap(&d, flow_table_prop_layout::FLOW_COUNTER, 1);
    assert_eq!(set_fte(&mut d, t, g, 1, &[], &[bulk + 100_000]), BAD_RES);
    assert_eq!(set_fte(&mut d, t, g, 1, &[], &[bulk + 5]), 0);
    assert_eq!(dealloc_counter(&mut d, bulk), BUSY);
    assert_eq!(
        dealloc_counter(&mut d, bulk + 5),
        BAD_RES,
        "not a bulk's id"
    );
    assert_eq!(dealloc_counter(&mut d, one), 0);
    assert_eq!(delete_fte(&mut d, t, 1), 0);
    assert_eq!(dealloc_counter(&mut d, bulk), 0);
    assert_eq!(
        d.f.model().stats().flow_counters,
        512,
        "the two later bulks"
    );
}

#[test]
fn objects_left_at_teardown_count_as_leaked() {
    let (mut d, _, _) = setup();
    let t = table(&mut d, 0, 4);
    create_group(&mut d, t, 0, 3);
    table(&mut d, 1, 4);
    d.ok(&cmd_in(0x103, 0, 16), 16);
    let s = d.f.model().stats();
    assert_eq!((s.flow_tables, s.flow_groups), (0, 0));
    assert_eq!(s.leaked_at_teardown, 3);
}

/// A brought-up ConnectX-7 function (flow counters offered).
fn setup_cx7() -> Drv {
    let mut d = Drv::with(crate::DeviceConfig {
        profile: crate::Profile::ConnectX7,
        ..crate::DeviceConfig::default()
    });
    d.bring_up();
    d
}

/// ALLOC_FLOW_COUNTER of 2^`log` counters (`flow_counter_bulk_log_size`,
/// what DevX users such as mlx5dv_dr and DPDK ask for).
fn alloc_log(d: &mut Drv, log: u64) -> (u8, u32) {
    let mut inp = cmd_in(0x939, 0, alloc_flow_counter_in::SIZE_BYTES);
    alloc_flow_counter_in::FLOW_COUNTER_BULK_LOG_SIZE.set(&mut inp, log);
    let out = d.exec(&inp, alloc_flow_counter_out::SIZE_BYTES);
    (
        status(&out),
        alloc_flow_counter_out::FLOW_COUNTER_ID.get(&out) as u32,
    )
}

/// QUERY_FLOW_COUNTER of `n` counters from `id` (`n` 0: one), clearing
/// them if `clear`: the status and (packets, octets) of each.
fn query_counters(d: &mut Drv, id: u32, n: u16, clear: bool) -> (u8, Vec<(u64, u64)>) {
    use mlx5_hw::ifc::{query_flow_counter_in as i, query_flow_counter_out as o, traffic_counter};
    let mut inp = cmd_in(0x93b, 0, i::SIZE_BYTES);
    i::FLOW_COUNTER_ID.set(&mut inp, u64::from(id));
    i::NUM_OF_COUNTERS.set(&mut inp, u64::from(n));
    i::CLEAR.set(&mut inp, u64::from(clear));
    let k = usize::from(n.max(1));
    let out = d.exec(&inp, o::SIZE_BYTES + k * traffic_counter::SIZE_BYTES);
    let stats = (0..k)
        .map(|j| {
            let s = out.get(o::SIZE_BYTES + j * traffic_counter::SIZE_BYTES..);
            s.map_or((0, 0), |s| {
                (
                    traffic_counter::PACKETS.get(s),
                    traffic_counter::OCTETS.get(s),
                )
            })
        })
        .collect();
    (status(&out), stats)
}

/// What the data path counted into counter `id` (packets, octets), set by
/// hand: the query side is under test here.
fn counted(d: &Drv, id: u32, v: [u64; 2]) {
    crate::lock(&d.f.model().inner.rdma.eth_rx.flow_counts).insert(id, v);
}

#[test]
fn counter_bulks_by_log_size_up_to_the_cap_and_freed_whole() {
    let mut d = setup_cx7();
    let (s, one) = alloc_log(&mut d, 0);
    assert_eq!((s, one), (0, 1), "one counter, the first id");
    let (s, four) = alloc_log(&mut d, 2);
    assert_eq!(s, 0);
    assert_eq!(four % 4, 0, "a bulk of 4 starts at a multiple of 4");
    // log_max_flow_counter_bulk is 23: the largest bulk is given, a
    // larger one refused.
    let (s, big) = alloc_log(&mut d, 23);
    assert_eq!(s, 0);
    assert_eq!(big, 1 << 23);
    assert_eq!(
        alloc_log(&mut d, 24).0,
        BAD_PARAM,
        "past log_max_flow_counter_bulk"
    );
    // Bulks by flow_counter_bulk need flow_counter_bulk_alloc, which the
    // profiles leave at the trace's 0.
    assert_eq!(alloc_counter(&mut d, 1).0, BAD_PARAM);
    assert_eq!(d.f.model().stats().flow_counters, 1 + 4 + (1 << 23));
    // A bulk is freed by its first id only, and whole.
    assert_eq!(dealloc_counter(&mut d, four + 1), BAD_RES, "inside a bulk");
    assert_eq!(dealloc_counter(&mut d, 77_777), BAD_RES, "no such counter");
    assert_eq!(dealloc_counter(&mut d, four), 0);
    assert_eq!(dealloc_counter(&mut d, four), BAD_RES, "freed already");
    assert_eq!(dealloc_counter(&mut d, big), 0);
    assert_eq!(d.f.model().stats().flow_counters, 1);
    // The ids come back.
    assert_eq!(alloc_log(&mut d, 2), (0, four));
    assert_eq!(dealloc_counter(&mut d, one), 0);
}

#[test]
fn a_bulk_query_spans_an_aligned_range_with_holes() {
    let mut d = setup_cx7();
    // Counters 1, 2, 3, then 2 freed: Linux's fs_counters.c queries its
    // counters 1 and 3 as the aligned range 0..4 (id 0 is never one).
    let ids: Vec<u32> = (0..3).map(|_| alloc_log(&mut d, 0).1).collect();
    assert_eq!(ids, [1, 2, 3]);
    counted(&d, 1, [5, 500]);
    counted(&d, 2, [9, 900]);
    counted(&d, 3, [7, 700]);
    assert_eq!(dealloc_counter(&mut d, 2), 0);
    let (s, got) = query_counters(&mut d, 0, 4, false);
    assert_eq!(s, 0);
    assert_eq!(got, [(0, 0), (5, 500), (0, 0), (7, 700)], "holes read zero");
    // Wider than what is allocated: still answered, zeros past the end.
    let (s, got) = query_counters(&mut d, 0, 8, false);
    assert_eq!(s, 0);
    assert_eq!(got[1..4], [(5, 500), (0, 0), (7, 700)]);
    assert!(got[4..].iter().all(|&c| c == (0, 0)));
    // A single query names one allocated counter.
    assert_eq!(query_counters(&mut d, 3, 0, false), (0, vec![(7, 700)]));
    assert_eq!(query_counters(&mut d, 2, 0, false).0, BAD_RES, "freed");
    assert_eq!(query_counters(&mut d, 0, 0, false).0, BAD_RES, "id 0");
    // Refusals: a bulk off the alignment of 4, a range with no counter,
    // one past the id space.
    assert_eq!(query_counters(&mut d, 1, 4, false).0, BAD_PARAM);
    assert_eq!(query_counters(&mut d, 0, 3, false).0, BAD_PARAM);
    assert_eq!(query_counters(&mut d, 8, 4, false).0, BAD_RES);
    assert_eq!(query_counters(&mut d, (1 << 24) - 4, 8, false).0, BAD_PARAM);
    // clear zeroes what the bulk read.
    let (s, got) = query_counters(&mut d, 0, 4, true);
    assert_eq!((s, got[3]), (0, (7, 700)));
    assert_eq!(query_counters(&mut d, 3, 0, false), (0, vec![(0, 0)]));
}

#[test]
fn entries_count_into_live_counters_one_each() {
    let mut d = setup_cx7();
    let t = table(&mut d, 0, 4);
    let (_, g) = create_group(&mut d, t, 0, 3);
    let (_, c) = alloc_log(&mut d, 0);
    let (_, c2) = alloc_log(&mut d, 0);
    assert_eq!(
        set_fte(&mut d, t, g, 0, &[], &[c + 1000]),
        BAD_RES,
        "unknown counter"
    );
    // log_max_flow_counter 0: one counter an entry.
    assert_eq!(set_fte(&mut d, t, g, 0, &[], &[c, c2]), BAD_PARAM);
    assert_eq!(set_fte(&mut d, t, g, 0, &[], &[c]), 0);
    assert_eq!(dealloc_counter(&mut d, c), BUSY);
    assert_eq!(delete_fte(&mut d, t, 0), 0);
    assert_eq!(dealloc_counter(&mut d, c), 0);
    assert_eq!(dealloc_counter(&mut d, c2), 0);
}
