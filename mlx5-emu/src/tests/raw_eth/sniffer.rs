//! The sniffer tables (`FS_FT_SNIFFER_RX`, `FS_FT_SNIFFER_TX`, which every
//! profile announces in `flow_table_nic_cap`): B's receive sniffer takes a
//! copy of every frame its port takes in, whatever its NIC RX tables do
//! with it; A's transmit sniffer a copy of every frame its SQ sends.

use mlx5_hw::eth::{FS_FT_SNIFFER_RX, FS_FT_SNIFFER_TX};

use super::*;

/// A root table of type `ty` on `e` whose one entry (a group matching
/// nothing in particular) forwards every frame to TIR `tir`.
fn catch_all(e: &mut Eth, ty: u8, tir: u32) {
    use create_flow_group_in as g;
    use set_fte_in as i;
    let ty = u64::from(ty);
    let table = e.root_table(ty, 1);
    let mut c = cmd_in(0x933, 0, g::SIZE_BYTES);
    g::TABLE_TYPE.set(&mut c, ty);
    g::TABLE_ID.set(&mut c, u64::from(table));
    let group =
        create_flow_group_out::GROUP_ID.get(&e.d.ok(&c, create_flow_group_out::SIZE_BYTES)) as u32;
    let fc = i::FLOW_CONTEXT.off;
    let dests = (fc + flow_context::DESTINATION.off) / 8;
    let mut c = cmd_in(0x936, 0, dests + dest_format_struct::SIZE_BYTES);
    i::TABLE_TYPE.set(&mut c, ty);
    i::TABLE_ID.set(&mut c, u64::from(table));
    flow_context::GROUP_ID.at(fc).set(&mut c, u64::from(group));
    flow_context::ACTION
        .at(fc)
        .set(&mut c, FLOW_CONTEXT_ACTION_FWD_DEST);
    flow_context::DESTINATION_LIST_SIZE.at(fc).set(&mut c, 1);
    dest_format_struct::DESTINATION_TYPE.set(&mut c[dests..], 2);
    dest_format_struct::DESTINATION_ID.set(&mut c[dests..], u64::from(tir));
    assert_eq!(e.d.exec(&c, 16)[0], 0, "SET_FLOW_TABLE_ENTRY");
}

/// The user indices (RQs) of CQEs `0..n` of `e`'s CQ that are receives,
/// and how many are A's send completions.
fn receives(e: &Eth, n: usize) -> (Vec<u32>, usize) {
    let mut rx = Vec::new();
    let mut sends = 0;
    for k in 0..n {
        let c = e.cqe(k);
        if c[63] >> 4 == CqeOpcode::RespSend.to_raw() {
            rx.push(cqe64::SRQN.get(&c) as u32 & 0xff_ffff);
        } else {
            assert_eq!(c[63] >> 4, CqeOpcode::Req.to_raw(), "CQE {k}: {c:02x?}");
            sends += 1;
        }
    }
    (rx, sends)
}

/// A sends UDP to port 1000 (B's NIC RX forwards it to RQ 0) and to port
/// 2000 (no NIC RX rule: dropped). B's receive sniffer puts both in RQ 1,
/// the copy of the first before NIC RX's; A's transmit sniffer puts both
/// in A's own RQ 0.
#[test]
fn the_sniffers_take_a_copy_of_every_frame_in_and_out() {
    let (_fab, mut a, mut b) = pair();
    let blkey = b.rw_mkey();
    let rqs = [b.ready_rq(0), b.ready_rq(1)];
    b.post_recv(0, blkey, 8);
    b.post_recv(1, blkey, 8);
    let tir = b.direct_tir(rqs[0]);
    let t = b.udp_table();
    assert_eq!(b.udp_rule(t, 0, 1000, Some(tir), None), 0);
    let sniff = b.direct_tir(rqs[1]);
    catch_all(&mut b, FS_FT_SNIFFER_RX, sniff);

    let alkey = a.rw_mkey();
    let a_rq = a.ready_rq(0);
    a.post_recv(0, alkey, 8);
    let a_tir = a.direct_tir(a_rq);
    catch_all(&mut a, FS_FT_SNIFFER_TX, a_tir);
    let sqn = a.ready_sq();
    for (k, port) in [1000u16, 2000].into_iter().enumerate() {
        let h = headers(5000, port, 32);
        a.send(sqn, k as u16 * 2, &h, alkey, 0, 32);
    }
    let (b_rx, _) = receives(&b, 3);
    let u = |i: u64| (UIDX + i) as u32;
    assert_eq!(b_rx, [u(1), u(0), u(1)], "B: sniffer, NIC RX, sniffer");
    let (a_rx, sends) = receives(&a, 4);
    assert_eq!(
        (a_rx, sends),
        (vec![u(0), u(0)], 2),
        "A: two copies, two sends"
    );
    let rb = &b.d.f.model().inner.rdma;
    super::super::settle(b.d.f.model());
    assert_eq!(
        rb.counters.dropped.load(Ordering::Relaxed),
        1,
        "port 2000 dropped by NIC RX all the same"
    );
}
