//! Raw Ethernet between two cabled functions, by hand-built commands and
//! WQEs: function A sends frames on an SQ, function B's NIC RX flow table
//! steers them (by UDP destination port) to TIRs and their RQs, or drops
//! them, and counts; B's RQs complete with Ethernet receive CQEs. Then
//! RSS over an RQ table, and the refusals.

use std::sync::atomic::Ordering;

use mlx5_hw::bits::BitField;
use mlx5_hw::cqe::{CqeOpcode, CqeSyndrome};
use mlx5_hw::eth::{
    CQE_L3_HDR_TYPE_IPV4, CQE_L3_HDR_TYPE_SHIFT, CQE_L3_OK, CQE_L4_HDR_TYPE_SHIFT,
    CQE_L4_HDR_TYPE_UDP, CQE_L4_OK, CQE_RSS_IPV4, CQE_RSS_UDP, ETH_WQE_L3_CSUM, ETH_WQE_L4_CSUM,
    FLOW_CONTEXT_ACTION_COUNT, FLOW_CONTEXT_ACTION_DROP, FLOW_CONTEXT_ACTION_FWD_DEST,
    HASH_FIELD_SEL_DST_IP, HASH_FIELD_SEL_L4_DPORT, HASH_FIELD_SEL_L4_SPORT, HASH_FIELD_SEL_SRC_IP,
    L4_PROT_TYPE_UDP, MATCH_OUTER_HEADERS, QUEUE_STATE_RDY, QUEUE_STATE_RST, RX_HASH_FN_TOEPLITZ,
    TIRC_DISP_TYPE_DIRECT, TIRC_DISP_TYPE_INDIRECT, TIRC_SELF_LB_BLOCK_BLOCK_MULTICAST,
    TIRC_SELF_LB_BLOCK_BLOCK_UNICAST, WQ_TYPE_CYCLIC,
};
use mlx5_hw::ifc::{
    cmd_hca_cap, cqe64, create_flow_group_in, create_flow_group_out, create_flow_table_in,
    create_flow_table_out, create_mkey_in, create_rq_in, create_tir_in, dest_format_struct,
    flow_context, flow_counter_list, flow_table_context, flow_table_nic_cap,
    flow_table_prop_layout, fte_match_param, fte_match_set_lyr_2_4 as l24, mkc,
    query_flow_counter_in, query_flow_counter_out, rqc, rx_hash_field_select,
    set_flow_table_root_in, set_fte_in, tirc, traffic_counter, wq, wqe_data_seg, wqe_eth_seg,
};
use mlx5_hw::status::CmdStatus;

use super::eth::{num, setup_on, Eth, DATA, DBR_IOVA, RING_IOVA};
use super::{cmd_in, Drv};
use crate::{Fabric, Profile};

mod cqe_comp;
mod sniffer;
mod tunnel;

const BAD_PARAM: u8 = CmdStatus::BadParameter.to_raw();
/// NIC RX flow tables (`FS_FT_NIC_RX`) as the commands' table_type.
const NIC_RX: u64 = mlx5_hw::eth::FS_FT_NIC_RX as u64;
/// Bytes of the headers A sends inline: Ethernet, IPv4, UDP.
const HDRS: usize = 14 + 20 + 8;
/// Bytes of each receive buffer.
const RX_BUF: u64 = 256;
/// Where B's RQ rings are (after the CQ and the SQ ring), and their
/// doorbell records.
const RQ_RING: [u64; 2] = [0x4000, 0x5000];
const RQ_DBR: [u64; 2] = [128, 192];

/// Two cabled functions, each with a UAR, EQ, PD, TD and CQ (the CQ's
/// entries marked invalid).
fn pair() -> (Fabric, Eth, Eth) {
    pair_on(Profile::ConnectX4Lx)
}

/// [`pair`] of `p`.
fn pair_on(p: Profile) -> (Fabric, Eth, Eth) {
    pair_of(Fabric::cabled(2, p))
}

/// [`pair`] of `p` on a clock the test moves (`fw_start` 0: ready at
/// power-on).
fn pair_on_clock(
    p: Profile,
    clock: &std::sync::Arc<vfio::clock::ManualClock>,
) -> (Fabric, Eth, Eth) {
    pair_of(Fabric::cabled_as(
        2,
        &crate::DeviceConfig {
            fw_start: std::time::Duration::ZERO,
            clock: clock.shared(),
            ..crate::DeviceConfig::for_profile(p)
        },
    ))
}

/// Two functions of `fab` set up as [`pair`] does.
fn pair_of(fab: Fabric) -> (Fabric, Eth, Eth) {
    let mut e = [0, 1].map(|i| setup_on(Drv::on(fab.function(i).unwrap())));
    for x in &mut e {
        for i in 0..64 {
            x.bufs[0].write(i * 64 + 63, &[0xf0]).unwrap();
        }
    }
    let [a, b] = e;
    (fab, a, b)
}

impl Eth {
    /// An MTT mkey over 64 KiB of the ring buffer from `DATA`, local read
    /// and write.
    fn rw_mkey(&mut self) -> u32 {
        let pages = 16;
        let mut c = cmd_in(0x200, 0, create_mkey_in::SIZE_BYTES + pages * 8);
        let m = &mut c[create_mkey_in::MEMORY_KEY_MKEY_ENTRY.off / 8..];
        mkc::ACCESS_MODE_1_0.set(m, mlx5_hw::wqe::MKC_ACCESS_MODE_MTT.into());
        mkc::LR.set(m, 1);
        mkc::LW.set(m, 1);
        mkc::QPN.set(m, 0xff_ffff);
        mkc::MKEY_7_0.set(m, 0x44);
        mkc::PD.set(m, u64::from(self.pd));
        mkc::START_ADDR.set(m, RING_IOVA + DATA);
        mkc::LEN.set(m, pages as u64 * 4096);
        mkc::LOG_PAGE_SIZE.set(m, 12);
        mkc::TRANSLATIONS_OCTWORD_SIZE.set(m, pages as u64 / 2);
        create_mkey_in::TRANSLATIONS_OCTWORD_ACTUAL_SIZE.set(&mut c, pages as u64 / 2);
        for p in 0..pages {
            let at = create_mkey_in::SIZE_BYTES + p * 8;
            let pa = RING_IOVA + DATA + p as u64 * 4096;
            c[at..at + 8].copy_from_slice(&pa.to_be_bytes());
        }
        num(&self.d.ok(&c, 16)) << 8 | 0x44
    }

    /// RQ `i` (ring `RQ_RING[i]`), cyclic, 64 WQEs of one data segment, in
    /// RDY.
    fn ready_rq(&mut self, i: usize) -> u32 {
        let rqn = self.rq_in_rst(i);
        assert_eq!(self.modify(0x909, rqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
        rqn
    }

    /// [`Self::ready_rq`] left in RST.
    fn rq_in_rst(&mut self, i: usize) -> u32 {
        let mut c = cmd_in(0x908, 0, create_rq_in::SIZE_BYTES + 8);
        let x = &mut c[create_rq_in::CTX.off / 8..];
        rqc::CQN.set(x, u64::from(self.cqn));
        rqc::USER_INDEX.set(x, UIDX + i as u64);
        let w = &mut x[rqc::WQ.off / 8..];
        wq::WQ_TYPE.set(w, WQ_TYPE_CYCLIC);
        wq::PD.set(w, u64::from(self.pd));
        wq::DBR_ADDR.set(w, DBR_IOVA + RQ_DBR[i]);
        wq::LOG_WQ_STRIDE.set(w, 4);
        wq::LOG_WQ_SZ.set(w, 6);
        let at = create_rq_in::SIZE_BYTES;
        c[at..].copy_from_slice(&(RING_IOVA + RQ_RING[i]).to_be_bytes());
        num(&self.d.ok(&c, 16))
    }

    /// Posts `n` receive WQEs on RQ `i`: buffers of [`RX_BUF`] bytes from
    /// `DATA + 0x4000 * (i + 1)`; the producer counter to `n`.
    fn post_recv(&mut self, i: usize, lkey: u32, n: u16) {
        for k in 0..u64::from(n) {
            let mut s = [0u8; 16];
            wqe_data_seg::BYTE_COUNT.set(&mut s, RX_BUF);
            wqe_data_seg::LKEY.set(&mut s, u64::from(lkey));
            wqe_data_seg::ADDR.set(&mut s, rx_buf(i, k));
            self.bufs[0]
                .write((RQ_RING[i] + k * 16) as usize, &s)
                .unwrap();
        }
        self.bufs[1]
            .write_u32_be(RQ_DBR[i] as usize, u32::from(n))
            .unwrap();
    }

    /// A direct TIR to `rqn`.
    fn direct_tir(&mut self, rqn: u32) -> u32 {
        num(&self.tir(TIRC_DISP_TYPE_DIRECT, rqn, 0))
    }

    /// A direct TIR to `rqn` of this function's transport domain that
    /// blocks its own SQs' frames as `self_lb_block` says.
    fn self_lb_tir(&mut self, rqn: u32, self_lb_block: u64) -> u32 {
        let mut c = cmd_in(0x900, 0, create_tir_in::SIZE_BYTES);
        let x = &mut c[create_tir_in::CTX.off / 8..];
        tirc::TRANSPORT_DOMAIN.set(x, u64::from(self.td));
        tirc::DISP_TYPE.set(x, TIRC_DISP_TYPE_DIRECT);
        tirc::INLINE_RQN.set(x, u64::from(rqn));
        tirc::SELF_LB_BLOCK.set(x, self_lb_block);
        num(&self.d.ok(&c, 16))
    }

    /// The NIC RX root table (level 0, 16 entries) with one group over
    /// ethertype, IP protocol and UDP destination port.
    fn udp_table(&mut self) -> (u32, u32) {
        let table = self.root_table(NIC_RX, 4);
        let (s, group) = self.group(table, MATCH_OUTER_HEADERS.into());
        assert_eq!(s, 0);
        (table, group)
    }

    /// CREATE_FLOW_TABLE of type `ty` (2^`log_size` entries, level 0),
    /// made that type's root by SET_FLOW_TABLE_ROOT: its id.
    fn root_table(&mut self, ty: u64, log_size: u64) -> u32 {
        let mut c = cmd_in(0x930, 0, create_flow_table_in::SIZE_BYTES);
        create_flow_table_in::TABLE_TYPE.set(&mut c, ty);
        flow_table_context::LOG_SIZE
            .at(create_flow_table_in::FLOW_TABLE_CONTEXT.off)
            .set(&mut c, log_size);
        let out = self.d.ok(&c, create_flow_table_out::SIZE_BYTES);
        let table = create_flow_table_out::TABLE_ID.get(&out) as u32;
        let mut c = cmd_in(0x92f, 0, set_flow_table_root_in::SIZE_BYTES);
        set_flow_table_root_in::TABLE_TYPE.set(&mut c, ty);
        set_flow_table_root_in::TABLE_ID.set(&mut c, u64::from(table));
        self.d.ok(&c, 16);
        table
    }

    /// CREATE_FLOW_GROUP over indices 0..15 of `table`, its criteria
    /// enabled by `enable`, masking ethertype, IP protocol and UDP dport.
    fn group(&mut self, table: u32, enable: u64) -> (u8, u32) {
        use create_flow_group_in as i;
        let mut c = cmd_in(0x933, 0, i::SIZE_BYTES);
        i::TABLE_TYPE.set(&mut c, NIC_RX);
        i::TABLE_ID.set(&mut c, u64::from(table));
        i::END_FLOW_INDEX.set(&mut c, 15);
        i::MATCH_CRITERIA_ENABLE.set(&mut c, enable);
        let o = i::MATCH_CRITERIA.off + fte_match_param::OUTER_HEADERS.off;
        l24::ETHERTYPE.at(o).set(&mut c, 0xffff);
        l24::IP_PROTOCOL.at(o).set(&mut c, 0xff);
        l24::UDP_DPORT.at(o).set(&mut c, 0xffff);
        let out = self.d.exec(&c, create_flow_group_out::SIZE_BYTES);
        (out[0], create_flow_group_out::GROUP_ID.get(&out) as u32)
    }

    /// An FTE at `index` for IPv4/UDP to `dport`: forwarding to `tir`, or
    /// dropping (`None`); counting into `counter` if any.
    fn udp_rule(
        &mut self,
        t: (u32, u32),
        index: u32,
        dport: u16,
        tir: Option<u32>,
        counter: Option<u32>,
    ) -> u8 {
        self.ip_rule(t, index, (17, dport), tir, counter)
    }

    /// [`Self::udp_rule`] for IP protocol `to.0` and UDP port `to.1` (0
    /// for any other protocol's frames: the image has no UDP port).
    fn ip_rule(
        &mut self,
        t: (u32, u32),
        index: u32,
        to: (u8, u16),
        tir: Option<u32>,
        counter: Option<u32>,
    ) -> u8 {
        self.tagged_rule(t, index, to, tir, counter, 0)
    }

    /// [`Self::ip_rule`] with `flow_context.flow_tag` `tag`.
    fn tagged_rule(
        &mut self,
        t: (u32, u32),
        index: u32,
        to: (u8, u16),
        tir: Option<u32>,
        counter: Option<u32>,
        tag: u32,
    ) -> u8 {
        use set_fte_in as i;
        let (proto, dport) = to;
        let fc = i::FLOW_CONTEXT.off;
        let dests = (fc + flow_context::DESTINATION.off) / 8;
        let mut c = cmd_in(0x936, 0, dests + 2 * dest_format_struct::SIZE_BYTES);
        i::TABLE_TYPE.set(&mut c, NIC_RX);
        i::TABLE_ID.set(&mut c, u64::from(t.0));
        i::FLOW_INDEX.set(&mut c, u64::from(index));
        let f = |b: BitField| b.at(fc);
        f(flow_context::GROUP_ID).set(&mut c, u64::from(t.1));
        f(flow_context::FLOW_TAG).set(&mut c, u64::from(tag));
        let mut action = if tir.is_some() {
            FLOW_CONTEXT_ACTION_FWD_DEST
        } else {
            FLOW_CONTEXT_ACTION_DROP
        };
        let mut at = dests;
        if let Some(tirn) = tir {
            f(flow_context::DESTINATION_LIST_SIZE).set(&mut c, 1);
            dest_format_struct::DESTINATION_TYPE.set(&mut c[at..], 2);
            dest_format_struct::DESTINATION_ID.set(&mut c[at..], u64::from(tirn));
            at += dest_format_struct::SIZE_BYTES;
        }
        if let Some(id) = counter {
            action |= FLOW_CONTEXT_ACTION_COUNT;
            f(flow_context::FLOW_COUNTER_LIST_SIZE).set(&mut c, 1);
            flow_counter_list::FLOW_COUNTER_ID.set(&mut c[at..], u64::from(id));
        }
        f(flow_context::ACTION).set(&mut c, action);
        let o = fc + flow_context::MATCH_VALUE.off + fte_match_param::OUTER_HEADERS.off;
        l24::ETHERTYPE.at(o).set(&mut c, 0x0800);
        l24::IP_PROTOCOL.at(o).set(&mut c, u64::from(proto));
        l24::UDP_DPORT.at(o).set(&mut c, u64::from(dport));
        self.d.exec(&c, 16)[0]
    }

    /// Flow counters on: 1024 of them, usable by NIC RX entries (what a
    /// newer firmware than the ConnectX-4's advertises); one allocated.
    fn counter(&mut self) -> u32 {
        {
            let mut fw = crate::lock(&self.d.f.model().inner.fw);
            let g = fw.caps.cur.get_mut(&0).expect("general caps");
            cmd_hca_cap::MAX_FLOW_COUNTER_15_0.set(g, 1024);
            let ft = fw.caps.cur.get_mut(&7).expect("flow-table caps");
            flow_table_prop_layout::FLOW_COUNTER
                .at(flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE.off)
                .set(ft, 1);
        }
        use mlx5_hw::ifc::{alloc_flow_counter_in, alloc_flow_counter_out};
        let c = cmd_in(0x939, 0, alloc_flow_counter_in::SIZE_BYTES);
        let out = self.d.ok(&c, alloc_flow_counter_out::SIZE_BYTES);
        alloc_flow_counter_out::FLOW_COUNTER_ID.get(&out) as u32
    }

    /// QUERY_FLOW_COUNTER: (packets, octets).
    fn flow_count(&mut self, id: u32) -> (u64, u64) {
        self.flow_count_clear(id, false)
    }

    /// QUERY_FLOW_COUNTER, zeroing the counter after the read if `clear`.
    fn flow_count_clear(&mut self, id: u32, clear: bool) -> (u64, u64) {
        let mut c = cmd_in(0x93b, 0, query_flow_counter_in::SIZE_BYTES);
        query_flow_counter_in::CLEAR.set(&mut c, u64::from(clear));
        query_flow_counter_in::FLOW_COUNTER_ID.set(&mut c, u64::from(id));
        let n = query_flow_counter_out::SIZE_BYTES + traffic_counter::SIZE_BYTES;
        let out = self.d.ok(&c, n);
        let s = &out[query_flow_counter_out::SIZE_BYTES..];
        (
            traffic_counter::PACKETS.get(s),
            traffic_counter::OCTETS.get(s),
        )
    }

    /// Sends on SQ `sqn` at WQE `idx` the frame of `hdrs` (inline) and
    /// `len` payload bytes at `DATA + off` (under `lkey`), with the
    /// checksum offloads.
    fn send(&mut self, sqn: u32, idx: u16, hdrs: &[u8], lkey: u32, off: u64, len: u32) {
        let s = send_segs(hdrs, lkey, off, len);
        self.post(sqn, idx, 0x0a, &s, true);
    }

    /// Sends on SQ `sqn` at WQE `idx` the `len` bytes at `DATA + off` as
    /// the whole frame (no inline headers), asking the device to insert
    /// the VLAN tag `insert` (`wqe_eth_seg.insert`: type, TCI).
    fn send_insert(
        &mut self,
        sqn: u32,
        idx: u16,
        insert: (u16, u16),
        lkey: u32,
        off: u64,
        len: u32,
    ) {
        let mut s = vec![0u8; wqe_eth_seg::SIZE_BYTES + wqe_data_seg::SIZE_BYTES];
        wqe_eth_seg::CS_FLAGS.set(&mut s, u64::from(ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM));
        wqe_eth_seg::INLINE_HDR_SZ.set(&mut s, u64::from(insert.0));
        wqe_eth_seg::INLINE_HDR_START.set(&mut s, u64::from(insert.1));
        let d = &mut s[wqe_eth_seg::SIZE_BYTES..];
        wqe_data_seg::BYTE_COUNT.set(d, u64::from(len));
        wqe_data_seg::LKEY.set(d, u64::from(lkey));
        wqe_data_seg::ADDR.set(d, RING_IOVA + DATA + off);
        self.post(sqn, idx, 0x0a, &s, true);
    }

    /// A TIS and an SQ in RDY.
    fn ready_sq(&mut self) -> u32 {
        self.ready_sq_with(false)
    }

    /// [`Self::ready_sq`], allowing legacy multi-packet sends if `mpw`.
    fn ready_sq_with(&mut self, mpw: bool) -> u32 {
        let tisn = num(&self.tis(self.td));
        let sqn = num(&self.sq_with(tisn, 6, mpw));
        assert_eq!(self.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
        sqn
    }
}

/// The IOVA of receive buffer `k` of RQ `i`.
fn rx_buf(i: usize, k: u64) -> u64 {
    RING_IOVA + DATA + 0x4000 * (i as u64 + 1) + k * RX_BUF
}

/// Ethernet + IPv4 + UDP headers from 10.0.0.1:`sport` to 10.0.0.2:`dport`
/// for `payload` bytes, checksums left to the offload.
fn headers(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    let mut h = vec![0u8; HDRS];
    h[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    h[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    h[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut h[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + 8 + payload) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let udp = &mut h[34..42];
    udp[0..2].copy_from_slice(&sport.to_be_bytes());
    udp[2..4].copy_from_slice(&dport.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    h
}

/// The user index the tests give RQ `i` (`rqc.user_index`; the striding
/// RQ's is `UIDX + 8`), which its CQEs carry in `srqn_uidx`.
const UIDX: u64 = 0x40;

/// The RQ whose CQEs carry user index `uidx` (the one RQ of `b` made with
/// it).
fn rq_of_uidx(b: &Eth, uidx: u32) -> u32 {
    let rx = &b.d.f.model().inner.rdma.eth_rx;
    let rqs = crate::transport::rlock(&rx.rqs);
    let found: Vec<u32> = rqs
        .values()
        .filter(|r| r.user_index == uidx)
        .map(|r| r.rqn)
        .collect();
    assert_eq!(found.len(), 1, "user index {uidx:#x}: RQs {found:?}");
    found[0]
}

/// B's receive CQE `n`, checked as an Ethernet receive of IPv4/UDP with
/// good checksums (a VLAN tag stripped or not) whose `sop_drop_qpn` holds
/// the flow tag (none: 0): the RQ its user index names, its byte count.
fn rx_cqe(b: &Eth, n: usize) -> (u32, u32, Vec<u8>) {
    let c = b.cqe(n);
    assert_eq!(
        c[63] >> 4,
        CqeOpcode::RespSend.to_raw(),
        "CQE {n}: {c:02x?}"
    );
    let types = cqe64::L4_L3_HDR_TYPE.get(&c) as u8 & !mlx5_hw::eth::CQE_VLAN_PRESENT;
    assert_eq!(
        types,
        CQE_L4_HDR_TYPE_UDP << CQE_L4_HDR_TYPE_SHIFT
            | CQE_L3_HDR_TYPE_IPV4 << CQE_L3_HDR_TYPE_SHIFT
    );
    let ok = cqe64::HDS_IP_EXT.get(&c) as u8;
    assert_eq!(
        ok & (CQE_L3_OK | CQE_L4_OK),
        CQE_L3_OK | CQE_L4_OK,
        "checksums"
    );
    assert_eq!(cqe64::SOP_DROP_QPN.get(&c) & 0xff_ffff, 0, "no flow tag");
    let qpn = rq_of_uidx(b, cqe64::SRQN.get(&c) as u32 & 0xff_ffff);
    (qpn, cqe64::BYTE_CNT.get(&c) as u32, c)
}

#[test]
fn frames_cross_the_cable_steered_by_udp_port_dropped_and_counted() {
    let (_fab, mut a, mut b) = pair();
    // B: two RQs with 8 buffers each behind direct TIRs; port 1000 to the
    // first, 2000 to the second, 3000 dropped; two counters.
    let blkey = b.rw_mkey();
    let rqs = [b.ready_rq(0), b.ready_rq(1)];
    b.post_recv(0, blkey, 8);
    b.post_recv(1, blkey, 8);
    let tirs = rqs.map(|r| b.direct_tir(r));
    let t = b.udp_table();
    let (c_fwd, c_drop) = (b.counter(), b.counter());
    assert_eq!(b.udp_rule(t, 0, 1000, Some(tirs[0]), Some(c_fwd)), 0);
    assert_eq!(b.udp_rule(t, 1, 2000, Some(tirs[1]), None), 0);
    assert_eq!(b.udp_rule(t, 2, 3000, None, Some(c_drop)), 0);
    // A: payloads of 100 + k bytes, each byte its frame's number.
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    let ports = [1000u16, 2000, 3000, 1000, 4000, 2000, 3000, 1000];
    for (k, &dport) in ports.iter().enumerate() {
        let len = 100 + k;
        a.bufs[0]
            .write(DATA as usize + k * 512, &vec![k as u8; len])
            .unwrap();
        let h = headers(5000 + k as u16, dport, len);
        a.send(sqn, k as u16 * 2, &h, alkey, k as u64 * 512, len as u32);
    }
    // A completes all eight sends.
    for k in 0..ports.len() {
        let c = a.cqe(k);
        assert_eq!(c[63] >> 4, CqeOpcode::Req.to_raw(), "send {k}");
    }
    // B received frames 0, 1, 3, 5, 7, in order, each on its RQ, intact.
    let mut next = [0u64; 2];
    for (n, k) in [0usize, 1, 3, 5, 7].into_iter().enumerate() {
        let (qpn, bytes, c) = rx_cqe(&b, n);
        let q = usize::from(ports[k] == 2000);
        assert_eq!(qpn, rqs[q], "frame {k} on its RQ");
        let len = 100 + k;
        assert_eq!(bytes as usize, HDRS + len);
        assert_eq!(u64::from(u16::from_be_bytes([c[60], c[61]])), next[q]);
        let mut got = vec![0u8; HDRS + len];
        let at = rx_buf(q, next[q]) - RING_IOVA;
        b.bufs[0].read(at as usize, &mut got).unwrap();
        next[q] += 1;
        assert_eq!(&got[HDRS..], &vec![k as u8; len][..], "frame {k} payload");
        assert_eq!(
            &got[34..36],
            &(5000 + k as u16).to_be_bytes(),
            "frame {k} sport"
        );
        assert_eq!(&got[..12], &headers(0, 0, 0)[..12], "MACs");
        // check_sum: the one's-complement sum from the IP header on, as
        // mlx5e hands it to the stack (CHECKSUM_COMPLETE).
        let mut sum: u32 = got[14..]
            .chunks(2)
            .map(|w| u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0)))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(
            cqe64::CHECK_SUM.get(&c),
            u64::from(sum),
            "frame {k} check_sum"
        );
    }
    super::settle(b.d.f.model());
    assert_eq!(
        b.bufs[0].load_u8_acquire(5 * 64 + 63).unwrap() >> 4,
        0xf,
        "no sixth CQE"
    );
    // Counters: the forward rule saw 3 frames, the drop rule 2; the port
    // took 8 and dropped 3 (two by rule, one missed every entry).
    let octets = |ks: &[usize]| ks.iter().map(|k| (HDRS + 100 + k) as u64).sum::<u64>();
    assert_eq!(b.flow_count(c_fwd), (3, octets(&[0, 3, 7])));
    assert_eq!(b.flow_count_clear(c_drop, true), (2, octets(&[2, 6])));
    assert_eq!(b.flow_count(c_drop), (0, 0), "cleared by the last read");
    let rc = &b.d.f.model().inner.rdma.counters;
    assert_eq!(rc.packets_received.load(Ordering::Relaxed), 8);
    assert_eq!(rc.dropped.load(Ordering::Relaxed), 3);
    let ac = &a.d.f.model().inner.rdma.counters;
    assert_eq!(ac.packets_sent.load(Ordering::Relaxed), 8);
}

/// An RQ bound to a Q counter set by MODIFY_RQ at RST2RDY (as mlx5_ib
/// binds a verbs WQ where `modify_rq_counter_set_id` is offered: ConnectX-5
/// and later) counts in the set's `out_of_buffer` each frame steered to it
/// while it had no WQE posted; ConnectX-4 Lx (14.12) does not offer the bit.
#[test]
fn an_rq_bound_to_a_q_counter_set_counts_frames_it_had_no_wqe_for() {
    use mlx5_hw::eth::MODIFY_RQ_BITMASK_RQ_COUNTER_SET_ID;
    use mlx5_hw::ifc::{
        alloc_q_counter_out, modify_rq_in, query_q_counter_in, query_q_counter_out,
    };
    let offered = |p: Profile| {
        let caps = p.caps();
        caps.get(
            crate::cap_type::GENERAL,
            cmd_hca_cap::MODIFY_RQ_COUNTER_SET_ID,
        )
    };
    assert_eq!(offered(Profile::ConnectX4Lx), 0, "14.12 of the trace");
    assert_eq!(offered(Profile::ConnectX7), 1);
    let (_fab, mut a, mut b) = pair_on(Profile::ConnectX7);
    let set = alloc_q_counter_out::COUNTER_SET_ID.get(&b.d.ok(&cmd_in(0x771, 0, 16), 16));
    let rqn = b.rq_in_rst(0);
    let mut c = cmd_in(0x909, 0, modify_rq_in::SIZE_BYTES);
    modify_rq_in::RQ_STATE.set(&mut c, QUEUE_STATE_RST);
    modify_rq_in::RQN.set(&mut c, u64::from(rqn));
    modify_rq_in::MODIFY_BITMASK.set(&mut c, MODIFY_RQ_BITMASK_RQ_COUNTER_SET_ID);
    let x = modify_rq_in::CTX.off;
    rqc::STATE.at(x).set(&mut c, QUEUE_STATE_RDY);
    rqc::COUNTER_SET_ID.at(x).set(&mut c, set);
    assert_eq!(b.d.exec(&c, 16)[0], 0);
    let blkey = b.rw_mkey();
    b.post_recv(0, blkey, 2);
    let tir = b.direct_tir(rqn);
    let t = b.udp_table();
    assert_eq!(b.udp_rule(t, 0, 1000, Some(tir), None), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    for k in 0..5u16 {
        a.send(sqn, k * 2, &headers(5000, 1000, 64), alkey, 0, 64);
        assert_eq!(a.cqe(usize::from(k))[63] >> 4, CqeOpcode::Req.to_raw());
    }
    for n in 0..2 {
        assert_eq!(rx_cqe(&b, n).0, rqn);
    }
    let mut q = cmd_in(0x773, 0, query_q_counter_in::SIZE_BYTES);
    query_q_counter_in::COUNTER_SET_ID.set(&mut q, set);
    let out = b.d.ok(&q, query_q_counter_out::SIZE_BYTES);
    assert_eq!(
        query_q_counter_out::OUT_OF_BUFFER.get(&out),
        3,
        "5 frames, 2 WQEs"
    );
}

impl Eth {
    /// SET_FLOW_TABLE_ENTRY at `index` of `t` (`op_mod` 0 create, 1 modify)
    /// for IPv4/UDP to `dport`, in the shape Linux's fs_cmd.c writes: the
    /// forward destinations (`tirs`) first, then the counters, each an
    /// element of the destination list (16 bytes with `extended`, else 8);
    /// `action` FWD_DEST where there are destinations, COUNT where there
    /// are counters; `modify_enable_mask` what fs_core says changed.
    #[allow(clippy::too_many_arguments)]
    fn linux_fte(
        &mut self,
        t: (u32, u32),
        index: u32,
        op_mod: u16,
        dport: u16,
        tirs: &[u32],
        counters: &[u32],
        extended: bool,
    ) -> u8 {
        use mlx5_hw::ifc::extended_dest_format;
        use set_fte_in as i;
        let stride = if extended {
            extended_dest_format::SIZE_BYTES
        } else {
            dest_format_struct::SIZE_BYTES
        };
        let fc = i::FLOW_CONTEXT.off;
        let dests = (fc + flow_context::DESTINATION.off) / 8;
        let mut c = cmd_in(
            0x936,
            op_mod,
            dests + (tirs.len() + counters.len()) * stride,
        );
        i::TABLE_TYPE.set(&mut c, NIC_RX);
        i::TABLE_ID.set(&mut c, u64::from(t.0));
        i::FLOW_INDEX.set(&mut c, u64::from(index));
        if op_mod == 1 {
            // action, destination list, flow counters (MLX5_SET_FTE_MODIFY_ENABLE_MASK_*).
            i::MODIFY_ENABLE_MASK.set(&mut c, 0b1011);
        }
        let f = |b: BitField| b.at(fc);
        f(flow_context::GROUP_ID).set(&mut c, u64::from(t.1));
        f(flow_context::EXTENDED_DESTINATION).set(&mut c, u64::from(extended));
        let mut action = 0;
        if !tirs.is_empty() {
            action |= FLOW_CONTEXT_ACTION_FWD_DEST;
            f(flow_context::DESTINATION_LIST_SIZE).set(&mut c, tirs.len() as u64);
        }
        if !counters.is_empty() {
            action |= FLOW_CONTEXT_ACTION_COUNT;
            f(flow_context::FLOW_COUNTER_LIST_SIZE).set(&mut c, counters.len() as u64);
        }
        f(flow_context::ACTION).set(&mut c, action);
        for (k, &tirn) in tirs.iter().enumerate() {
            let e = &mut c[dests + k * stride..];
            dest_format_struct::DESTINATION_TYPE.set(e, 2);
            dest_format_struct::DESTINATION_ID.set(e, u64::from(tirn));
        }
        for (k, &id) in counters.iter().enumerate() {
            let e = &mut c[dests + (tirs.len() + k) * stride..];
            flow_counter_list::FLOW_COUNTER_ID.set(e, u64::from(id));
        }
        let o = fc + flow_context::MATCH_VALUE.off + fte_match_param::OUTER_HEADERS.off;
        l24::ETHERTYPE.at(o).set(&mut c, 0x0800);
        l24::IP_PROTOCOL.at(o).set(&mut c, 17);
        l24::UDP_DPORT.at(o).set(&mut c, u64::from(dport));
        self.d.exec(&c, 16)[0]
    }

    /// ALLOC_FLOW_COUNTER of one counter, as the profile offers them.
    fn alloc_counter(&mut self) -> u32 {
        use mlx5_hw::ifc::{alloc_flow_counter_in, alloc_flow_counter_out};
        let c = cmd_in(0x939, 0, alloc_flow_counter_in::SIZE_BYTES);
        let out = self.d.ok(&c, alloc_flow_counter_out::SIZE_BYTES);
        alloc_flow_counter_out::FLOW_COUNTER_ID.get(&out) as u32
    }
}

/// The entries Linux writes once flow counters exist (ConnectX-7 profile,
/// no capability poked): fs_core makes an entry forwarding to a TIR, then
/// a rule counting the same match joins it (SET_FLOW_TABLE_ENTRY modify:
/// the TIR, then the counter, action FWD_DEST | COUNT), then leaves it
/// again (modify: the TIR alone, COUNT cleared), as mlx5_ib does for a
/// flow with a DevX counter beside its raw packet QP. Every frame reaches
/// the RQ; the counter counts exactly those sent while it was listed. An
/// entry of 16-byte elements (`extended_destination`) counts the same.
#[test]
fn a_counter_beside_a_tir_counts_and_forwards_in_linuxs_entry_shapes() {
    let (_fab, mut a, mut b) = pair_on(Profile::ConnectX7);
    let blkey = b.rw_mkey();
    let rqs = [b.ready_rq(0), b.ready_rq(1)];
    b.post_recv(0, blkey, 16);
    b.post_recv(1, blkey, 16);
    let tirs = rqs.map(|r| b.direct_tir(r));
    let t = b.udp_table();
    let (c1, c2) = (b.alloc_counter(), b.alloc_counter());
    assert_eq!(b.linux_fte(t, 0, 0, 1000, &[tirs[0]], &[], false), 0);
    assert_eq!(b.linux_fte(t, 1, 0, 2000, &[tirs[1]], &[c2], true), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    let mut sent = 0u16;
    let mut send = |a: &mut Eth, dport: u16, n: u16| {
        for _ in 0..n {
            a.send(sqn, sent * 2, &headers(5000, dport, 64), alkey, 0, 64);
            assert_eq!(a.cqe(usize::from(sent))[63] >> 4, CqeOpcode::Req.to_raw());
            sent += 1;
        }
    };
    // Forward only: 2 frames.
    send(&mut a, 1000, 2);
    // The counting rule joins: 3 frames forwarded and counted.
    assert_eq!(b.linux_fte(t, 0, 1, 1000, &[tirs[0]], &[c1], false), 0);
    send(&mut a, 1000, 3);
    // It leaves: 1 frame forwarded, not counted.
    assert_eq!(b.linux_fte(t, 0, 1, 1000, &[tirs[0]], &[], false), 0);
    send(&mut a, 1000, 1);
    // The extended entry: 4 frames forwarded and counted.
    send(&mut a, 2000, 4);
    let mut on = [0usize; 2];
    for n in 0..10 {
        let (qpn, bytes, _) = rx_cqe(&b, n);
        let q = rqs.iter().position(|&r| r == qpn).expect("one of B's RQs");
        assert_eq!(bytes as usize, HDRS + 64);
        on[q] += 1;
    }
    assert_eq!(on, [6, 4], "every frame on its entry's RQ");
    let octets = |n: u64| n * (HDRS + 64) as u64;
    assert_eq!(b.flow_count(c1), (3, octets(3)));
    assert_eq!(b.flow_count(c2), (4, octets(4)));
    // No longer listed, the counter may go; c2 is still counted into.
    use mlx5_hw::ifc::dealloc_flow_counter_in as dealloc;
    let mut d = cmd_in(0x93a, 0, dealloc::SIZE_BYTES);
    dealloc::FLOW_COUNTER_ID.set(&mut d, u64::from(c1));
    assert_eq!(b.d.exec(&d, 16)[0], 0);
    dealloc::FLOW_COUNTER_ID.set(&mut d, u64::from(c2));
    assert_eq!(
        b.d.exec(&d, 16)[0],
        CmdStatus::BadResourceState.to_raw(),
        "an entry counts into it"
    );
    let rc = &b.d.f.model().inner.rdma.counters;
    assert_eq!(rc.dropped.load(Ordering::Relaxed), 0);
}

/// Local loopback: a multicast frame a function sends comes back to its
/// own NIC RX too, where a TIR of the sending SQ's transport domain
/// refuses it if its `self_lb_block` covers multicast (as mlx5e's TIRs
/// do) and one that blocks only unicast takes it; a unicast frame to
/// another MAC does not come back. Only the copy an RQ took counts.
#[test]
fn multicast_loops_back_to_the_sender_unless_its_tir_blocks_it() {
    let (_fab, mut a, _b) = pair();
    let lkey = a.rw_mkey();
    let rqs = [a.ready_rq(0), a.ready_rq(1)];
    a.post_recv(0, lkey, 8);
    a.post_recv(1, lkey, 8);
    let blocking = a.self_lb_tir(rqs[0], TIRC_SELF_LB_BLOCK_BLOCK_MULTICAST);
    let open = a.self_lb_tir(rqs[1], TIRC_SELF_LB_BLOCK_BLOCK_UNICAST);
    let t = a.udp_table();
    assert_eq!(a.udp_rule(t, 0, 1000, Some(blocking), None), 0);
    assert_eq!(a.udp_rule(t, 1, 2000, Some(open), None), 0);
    let sqn = a.ready_sq();
    let multicast = |dport| {
        let mut h = headers(5000, dport, 64);
        h[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0, 0, 1]);
        h
    };
    let frames = [multicast(1000), multicast(2000), headers(5000, 2000, 64)];
    for (k, h) in frames.iter().enumerate() {
        a.send(sqn, k as u16 * 2, h, lkey, k as u64 * 512, 64);
    }
    // A's one CQ: three sends and the one frame RQ 1 took back.
    let (mut sends, mut received) = (0, Vec::new());
    for n in 0..4 {
        let c = a.cqe(n);
        if c[63] >> 4 == CqeOpcode::Req.to_raw() {
            sends += 1;
        } else {
            let (rqn, bytes, _) = rx_cqe(&a, n);
            received.push((rqn, bytes as usize));
        }
    }
    assert_eq!((sends, received), (3, vec![(rqs[1], HDRS + 64)]));
    super::settle(a.d.f.model());
    assert_eq!(
        a.bufs[0].load_u8_acquire(4 * 64 + 63).unwrap() >> 4,
        0xf,
        "no fifth CQE"
    );
    let ac = &a.d.f.model().inner.rdma.counters;
    assert_eq!(ac.packets_received.load(Ordering::Relaxed), 1);
    assert_eq!(ac.dropped.load(Ordering::Relaxed), 0);
}

/// The vport's local loopback under MODIFY_NIC_VPORT_CONTEXT: on a card
/// announcing `disable_local_lb_uc`/`_mc` (ConnectX-5 and later), a vport
/// context with `disable_mc_local_lb` set keeps a function's multicast
/// sends off its own NIC RX, QUERY_NIC_VPORT_CONTEXT reports both bits,
/// and clearing them (mlx5_ib's `mlx5_ib_enable_lb`) brings the loopback
/// back; 14.12 of the trace announces neither and refuses the selection.
#[test]
fn a_vport_with_local_loopback_disabled_does_not_hear_its_own_multicast() {
    use mlx5_hw::ifc::{
        modify_nic_vport_context_in as mod_in, modify_nic_vport_field_select as sel,
        nic_vport_context as nvc, query_nic_vport_context_in, query_nic_vport_context_out as q_out,
    };
    let lb = |e: &mut Eth, disabled: bool| {
        let mut c = cmd_in(0x755, 0, mod_in::SIZE_BYTES);
        let fs = mod_in::FIELD_SELECT.off / 8;
        sel::DISABLE_UC_LOCAL_LB.set(&mut c[fs..], 1);
        sel::DISABLE_MC_LOCAL_LB.set(&mut c[fs..], 1);
        let x = &mut c[mod_in::NIC_VPORT_CONTEXT.off / 8..];
        nvc::DISABLE_UC_LOCAL_LB.set(x, u64::from(disabled));
        nvc::DISABLE_MC_LOCAL_LB.set(x, u64::from(disabled));
        e.d.exec(&c, 16)[0]
    };
    let queried = |e: &mut Eth| {
        let c = cmd_in(0x754, 0, query_nic_vport_context_in::SIZE_BYTES);
        let out = e.d.ok(&c, q_out::SIZE_BYTES);
        let x = &out[q_out::NIC_VPORT_CONTEXT.off / 8..];
        (
            nvc::DISABLE_UC_LOCAL_LB.get(x),
            nvc::DISABLE_MC_LOCAL_LB.get(x),
        )
    };
    let (_fab, mut old, _) = pair_on(Profile::ConnectX4Lx);
    assert_eq!(lb(&mut old, true), BAD_PARAM, "14.12 announces neither");
    assert_eq!(queried(&mut old), (0, 0));

    let (_fab, mut a, _b) = pair_on(Profile::ConnectX7);
    assert_eq!(queried(&mut a), (0, 0), "loopback on after reset");
    let lkey = a.rw_mkey();
    let rq = a.ready_rq(0);
    a.post_recv(0, lkey, 8);
    let open = a.self_lb_tir(rq, TIRC_SELF_LB_BLOCK_BLOCK_UNICAST);
    let t = a.udp_table();
    assert_eq!(a.udp_rule(t, 0, 2000, Some(open), None), 0);
    let sqn = a.ready_sq();
    let mut h = headers(5000, 2000, 64);
    h[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0, 0, 1]);
    // Disabled, as mlx5_core leaves it at load: the send completes and
    // nothing comes back.
    assert_eq!(lb(&mut a, true), 0);
    assert_eq!(queried(&mut a), (1, 1));
    a.send(sqn, 0, &h, lkey, 0, 64);
    assert_eq!(a.cqe(0)[63] >> 4, CqeOpcode::Req.to_raw());
    super::settle(a.d.f.model());
    assert_eq!(a.bufs[0].load_u8_acquire(64 + 63).unwrap() >> 4, 0xf);
    // Enabled again: the next multicast send comes back to the RQ.
    assert_eq!(lb(&mut a, false), 0);
    assert_eq!(queried(&mut a), (0, 0));
    a.send(sqn, 2, &h, lkey, 512, 64);
    let mut received = Vec::new();
    for n in 1..3 {
        if a.cqe(n)[63] >> 4 != CqeOpcode::Req.to_raw() {
            received.push(rx_cqe(&a, n).0);
        }
    }
    assert_eq!(received, vec![rq]);
}

/// Unicast local loopback: a frame a function sends to a unicast address
/// of its own (its permanent MAC, or one its L2 table holds: mlx5e's
/// SET_L2_TABLE_ENTRY) comes back to its own NIC RX unless the vport
/// context's `disable_uc_local_lb` is set; one to another MAC, or to an
/// L2 entry deleted since, does not.
#[test]
fn a_unicast_to_an_own_mac_loops_back_unless_disabled() {
    use mlx5_hw::ifc::{
        delete_l2_table_entry_in, mac_address_layout, modify_nic_vport_context_in as mod_in,
        modify_nic_vport_field_select as sel, nic_vport_context as nvc, set_l2_table_entry_in,
    };
    let (_fab, mut a, _b) = pair_on(Profile::ConnectX7);
    let lkey = a.rw_mkey();
    let rq = a.ready_rq(0);
    a.post_recv(0, lkey, 16);
    let tir = a.self_lb_tir(rq, 0);
    let t = a.udp_table();
    assert_eq!(a.udp_rule(t, 0, 2000, Some(tir), None), 0);
    let sqn = a.ready_sq();
    let own = a.d.f.model().config().mac;
    const EXTRA: u64 = 0x02aa_bbcc_dd01;
    let to = |mac: u64| {
        let mut h = headers(5000, 2000, 64);
        h[..6].copy_from_slice(&mac.to_be_bytes()[2..]);
        h
    };
    let l2 = |e: &mut Eth, set: bool| {
        let op = if set { 0x829 } else { 0x82b };
        let mut c = cmd_in(op, 0, set_l2_table_entry_in::SIZE_BYTES);
        if set {
            let m = &mut c[set_l2_table_entry_in::MAC_ADDRESS.off / 8..];
            mac_address_layout::MAC_ADDR_47_32.set(m, EXTRA >> 32);
            mac_address_layout::MAC_ADDR_31_0.set(m, EXTRA & 0xffff_ffff);
        }
        let index = if set {
            set_l2_table_entry_in::TABLE_INDEX
        } else {
            delete_l2_table_entry_in::TABLE_INDEX
        };
        index.set(&mut c, 3);
        e.d.exec(&c, 16)[0]
    };
    let uc_lb_off = |e: &mut Eth| {
        let mut c = cmd_in(0x755, 0, mod_in::SIZE_BYTES);
        sel::DISABLE_UC_LOCAL_LB.set(&mut c[mod_in::FIELD_SELECT.off / 8..], 1);
        nvc::DISABLE_UC_LOCAL_LB.set(&mut c[mod_in::NIC_VPORT_CONTEXT.off / 8..], 1);
        e.d.exec(&c, 16)[0]
    };
    // (destination MAC, comes back), each after what the step before set.
    let mut steps = Vec::new();
    steps.push((own, true));
    steps.push((0x0200_0000_0002, false));
    assert_eq!(l2(&mut a, true), 0);
    steps.push((EXTRA, true));
    let mut idx = 0u16;
    let mut cqes = 0usize;
    let mut run = |a: &mut Eth, mac: u64, back: bool| {
        a.send(sqn, idx, &to(mac), lkey, u64::from(idx) * 256, 64);
        idx += 2;
        let want = if back { 2 } else { 1 };
        let mut got = Vec::new();
        for n in cqes..cqes + want {
            got.push(a.cqe(n)[63] >> 4);
        }
        cqes += want;
        super::settle(a.d.f.model());
        assert_eq!(
            a.bufs[0].load_u8_acquire(cqes * 64 + 63).unwrap() >> 4,
            0xf,
            "{mac:012x}: nothing more"
        );
        got.sort_unstable();
        let mut expect = vec![CqeOpcode::Req.to_raw()];
        if back {
            expect.push(CqeOpcode::RespSend.to_raw());
            expect.sort_unstable();
        }
        assert_eq!(got, expect, "{mac:012x}");
    };
    for (mac, back) in steps {
        run(&mut a, mac, back);
    }
    assert_eq!(l2(&mut a, false), 0);
    run(&mut a, EXTRA, false);
    assert_eq!(uc_lb_off(&mut a), 0);
    run(&mut a, own, false);
}

/// An SQ made with `reg_umr` (ConnectX-5 and later offer `reg_umr_sq`)
/// maps pages into a free, UMR-enabled MTT key as mlx5e maps its striding
/// RQs' pages from its control SQ: a UMR WQE with inline MTT entries at a
/// translation offset that also clears `free`. The refusals: `reg_umr`
/// where 14.12 does not offer it, a UMR on an SQ made without it (a local
/// QP operation error), and a key of another PD.
#[test]
fn a_reg_umr_sq_maps_pages_into_a_key_as_mlx5e_does_for_striding_rqs() {
    use crate::transport::mem::access;
    use mlx5_hw::ifc::{create_mkey_in, mkc, sqc, wqe_umr_ctrl_seg as uc};
    use mlx5_hw::wqe::{WqeOpcode, MKEY_MASK_FREE, UMR_INLINE, UMR_TRANSLATION_OFFSET_EN};
    let (_fab, mut old, _) = pair_on(Profile::ConnectX4Lx);
    let tisn = tisn_of(&mut old);
    let reg_umr = |x: &mut [u8]| sqc::REG_UMR.set(x, 1);
    assert_eq!(
        old.sq_ctx(tisn, 6, reg_umr)[0],
        BAD_PARAM,
        "14.12: no reg_umr_sq"
    );

    let (_fab, mut a, mut b) = pair_on(Profile::ConnectX7);
    // Two pages, free, every entry on a filler page (mlx5e_create_umr_mkey).
    let filler = RING_IOVA + DATA;
    let key = |a: &mut Eth, pd: u32| {
        let mut c = cmd_in(0x200, 0, create_mkey_in::SIZE_BYTES + 16);
        let m = &mut c[create_mkey_in::MEMORY_KEY_MKEY_ENTRY.off / 8..];
        mkc::FREE.set(m, 1);
        mkc::UMR_EN.set(m, 1);
        mkc::LW.set(m, 1);
        mkc::LR.set(m, 1);
        mkc::ACCESS_MODE_1_0.set(m, mlx5_hw::wqe::MKC_ACCESS_MODE_MTT.into());
        mkc::QPN.set(m, 0xff_ffff);
        mkc::PD.set(m, u64::from(pd));
        mkc::LEN.set(m, 2 << 12);
        mkc::LOG_PAGE_SIZE.set(m, 12);
        mkc::TRANSLATIONS_OCTWORD_SIZE.set(m, 1);
        create_mkey_in::TRANSLATIONS_OCTWORD_ACTUAL_SIZE.set(&mut c, 1);
        let at = create_mkey_in::SIZE_BYTES;
        c[at..at + 8].copy_from_slice(&filler.to_be_bytes());
        c[at + 8..at + 16].copy_from_slice(&filler.to_be_bytes());
        num(&a.d.ok(&c, 16)) << 8
    };
    let pd = a.pd;
    let mkey = key(&mut a, pd);
    let page = |i: u64| RING_IOVA + DATA + 0x8000 + i * 0x1000;
    // mlx5e_build_umr_wqe: offset and inline, the mask clears `free`;
    // entries write-enabled only (MLX5_EN_WR).
    let mut umr = vec![0u8; uc::SIZE_BYTES + mlx5_hw::ifc::mkey_seg::SIZE_BYTES + 16];
    uc::FLAGS.set(&mut umr, u64::from(UMR_TRANSLATION_OFFSET_EN | UMR_INLINE));
    uc::XLT_OCTOWORDS.set(&mut umr, 1);
    uc::MKEY_MASK.set(&mut umr, MKEY_MASK_FREE);
    let xlt = uc::SIZE_BYTES + mlx5_hw::ifc::mkey_seg::SIZE_BYTES;
    umr[xlt..xlt + 8].copy_from_slice(&(page(0) | 2).to_be_bytes());
    umr[xlt + 8..xlt + 16].copy_from_slice(&(page(1) | 2).to_be_bytes());
    let rdma = &a.d.f.model().inner.rdma;
    let mut ext = Vec::new();
    assert!(
        rdma.mkey(mkey)
            .unwrap()
            .resolve(a.pd, access::LW, 0x1010, 16, &mut ext)
            .is_err(),
        "free until the UMR"
    );
    let tisn = tisn_of(&mut a);
    let sqn = num(&a.sq_ctx(tisn, 6, reg_umr));
    assert_eq!(a.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
    a.post_imm(sqn, 0, WqeOpcode::Umr.to_raw(), mkey, &umr);
    let c = a.cqe(0);
    assert_eq!(
        (c[63] >> 4, c[56]),
        (CqeOpcode::Req.to_raw(), WqeOpcode::Umr.to_raw())
    );
    let k = a.d.f.model().inner.rdma.mkey(mkey).unwrap();
    ext.clear();
    k.resolve(a.pd, access::LW, 0x1010, 16, &mut ext).unwrap();
    assert_eq!(
        (ext.len(), ext[0].iova, ext[0].len),
        (1, page(1) + 0x10, 16)
    );
    // A key of another PD: a local protection error.
    let pd2 = num(&a.d.ok(&cmd_in(0x800, 0, 16), 16));
    let other = key(&mut a, pd2);
    a.post_imm(sqn, 3, WqeOpcode::Umr.to_raw(), other, &umr);
    let c = a.cqe(1);
    assert_eq!(
        (c[63] >> 4, c[55]),
        (
            CqeOpcode::ReqErr.to_raw(),
            CqeSyndrome::LocalProtErr.to_raw()
        )
    );
    // An SQ made without reg_umr (B's, its own ring): the opcode is
    // refused.
    let (pd, tisn) = (b.pd, tisn_of(&mut b));
    let mkey = key(&mut b, pd);
    let plain = num(&b.sq_ctx(tisn, 6, |_| {}));
    assert_eq!(b.modify(0x905, plain, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
    b.post_imm(plain, 0, WqeOpcode::Umr.to_raw(), mkey, &umr);
    let c = b.cqe(0);
    assert_eq!(
        (c[63] >> 4, c[55]),
        (
            CqeOpcode::ReqErr.to_raw(),
            CqeSyndrome::LocalQpOpErr.to_raw()
        )
    );
}

/// A TIS of `e`'s transport domain.
fn tisn_of(e: &mut Eth) -> u32 {
    num(&e.tis(e.td))
}

#[test]
fn rss_spreads_by_toeplitz_over_the_rq_table() {
    let (_fab, mut a, mut b) = pair();
    let blkey = b.rw_mkey();
    let rqs = [b.ready_rq(0), b.ready_rq(1)];
    b.post_recv(0, blkey, 32);
    b.post_recv(1, blkey, 32);
    let rqtn = num(&b.rqt(0x916, 0, 2, &rqs));
    let key: [u8; 40] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x6d);
    let mut c = cmd_in(0x900, 0, create_tir_in::SIZE_BYTES);
    let x = &mut c[create_tir_in::CTX.off / 8..];
    tirc::TRANSPORT_DOMAIN.set(x, u64::from(b.td));
    tirc::DISP_TYPE.set(x, TIRC_DISP_TYPE_INDIRECT);
    tirc::INDIRECT_TABLE.set(x, u64::from(rqtn));
    tirc::RX_HASH_FN.set(x, RX_HASH_FN_TOEPLITZ);
    let k = tirc::RX_HASH_TOEPLITZ_KEY.off / 8;
    x[k..k + 40].copy_from_slice(&key);
    let s = tirc::RX_HASH_FIELD_SELECTOR_OUTER.off;
    rx_hash_field_select::L4_PROT_TYPE
        .at(s)
        .set(x, L4_PROT_TYPE_UDP);
    let fields = HASH_FIELD_SEL_SRC_IP
        | HASH_FIELD_SEL_DST_IP
        | HASH_FIELD_SEL_L4_SPORT
        | HASH_FIELD_SEL_L4_DPORT;
    rx_hash_field_select::SELECTED_FIELDS.at(s).set(x, fields);
    let tirn = num(&b.d.ok(&c, 16));
    let t = b.udp_table();
    assert_eq!(b.udp_rule(t, 0, 7000, Some(tirn), None), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    let n = 16u16;
    for k in 0..n {
        let h = headers(40000 + k * 7, 7000, 64);
        a.send(sqn, k * 2, &h, alkey, 0, 64);
    }
    let mut seen = [0usize; 2];
    for k in 0..n {
        let (qpn, _, c) = rx_cqe(&b, usize::from(k));
        let mut input = vec![10, 0, 0, 1, 10, 0, 0, 2];
        input.extend_from_slice(&(40000 + k * 7).to_be_bytes());
        input.extend_from_slice(&7000u16.to_be_bytes());
        let h = crate::transport::rss::toeplitz(&key, &input);
        assert_eq!(cqe64::RSS_HASH_RESULT.get(&c) as u32, h, "frame {k}");
        assert_eq!(
            cqe64::RSS_HASH_TYPE.get(&c) as u8,
            CQE_RSS_IPV4 | CQE_RSS_UDP
        );
        let q = h as usize % 2;
        assert_eq!(qpn, rqs[q], "frame {k} on the RQ its hash picks");
        seen[q] += 1;
    }
    assert!(seen[0] > 0 && seen[1] > 0, "both RQs used: {seen:?}");
}

#[test]
fn refusals_bad_hash_fields_unsupported_match_short_frame_small_buffer() {
    let (_fab, mut a, mut b) = pair();
    let blkey = b.rw_mkey();
    let rq = b.ready_rq(0);
    // A TIR hashing a field no selector knows, or ports with the SPI.
    let rqtn = num(&b.rqt(0x916, 0, 1, &[rq]));
    for fields in [
        1u64 << 5,
        HASH_FIELD_SEL_L4_DPORT | mlx5_hw::eth::HASH_FIELD_SEL_IPSEC_SPI,
    ] {
        let mut c = cmd_in(0x900, 0, create_tir_in::SIZE_BYTES);
        let x = &mut c[create_tir_in::CTX.off / 8..];
        tirc::TRANSPORT_DOMAIN.set(x, u64::from(b.td));
        tirc::DISP_TYPE.set(x, TIRC_DISP_TYPE_INDIRECT);
        tirc::INDIRECT_TABLE.set(x, u64::from(rqtn));
        tirc::RX_HASH_FN.set(x, RX_HASH_FN_TOEPLITZ);
        rx_hash_field_select::SELECTED_FIELDS
            .at(tirc::RX_HASH_FIELD_SELECTOR_OUTER.off)
            .set(x, fields);
        assert_eq!(b.d.exec(&c, 16)[0], BAD_PARAM, "fields {fields:#x}");
    }
    // A NIC RX group matching misc parameters 2 (metadata registers): not
    // parsed, refused.
    let t = b.udp_table();
    assert_eq!(b.group(t.0, 1 << 3).0, BAD_PARAM);
    // A frame shorter than an Ethernet header: an error CQE on A's SQ.
    let tir = b.direct_tir(rq);
    assert_eq!(b.udp_rule(t, 0, 9, Some(tir), None), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    a.send(sqn, 0, &[0xaa; 4], alkey, 0, 6);
    let c = a.cqe(0);
    assert_eq!(c[63] >> 4, CqeOpcode::ReqErr.to_raw());
    assert_eq!(c[55], CqeSyndrome::LocalLengthErr.to_raw());
    assert_eq!(a.sq_state(sqn), mlx5_hw::eth::QUEUE_STATE_ERR);
    // A frame longer than the receive buffer: an error CQE on B's RQ.
    assert_eq!(
        a.modify(0x905, sqn, mlx5_hw::eth::QUEUE_STATE_ERR, QUEUE_STATE_RST),
        0
    );
    assert_eq!(a.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
    b.post_recv(0, blkey, 1);
    let h = headers(1, 9, 300);
    a.send(sqn, 0, &h, alkey, 0, 300);
    let c = b.cqe(0);
    assert_eq!(c[63] >> 4, CqeOpcode::RespErr.to_raw());
    assert_eq!(c[55], CqeSyndrome::LocalLengthErr.to_raw());
    let rx = &b.d.f.model().inner.rdma.eth_rx;
    let state = crate::transport::rlock(&rx.rqs)[&rq]
        .state
        .load(Ordering::Relaxed);
    assert_eq!(u64::from(state), mlx5_hw::eth::QUEUE_STATE_ERR);
}

/// VLAN insertion by the device (`wqe_eth_seg.insert`, `wqe_vlan_insert`):
/// on ConnectX-5 a frame sent with no inline headers gets the C-VLAN tag
/// the segment names after its MAC addresses (B's RQ strips it into the
/// CQE, so the frame arrives as sent and the CQE carries the TCI); on
/// ConnectX-4 Lx, which does not offer it, those bytes are an inline
/// header size far past the WQE: a local length error.
#[test]
fn vlan_insert_by_the_device_where_offered() {
    use mlx5_hw::eth::{CQE_VLAN_PRESENT, ETH_WQE_INSERT_VLAN};
    const TCI: u16 = 0x6123;
    const LEN: usize = 64;
    for p in [Profile::ConnectX5, Profile::ConnectX4Lx] {
        let (_fab, mut a, b, rq, alkey, sqn) = udp_path(p, 8, false);
        let mut frame = headers(5000, 1000, LEN);
        frame.extend((0..LEN).map(|i| i as u8));
        a.bufs[0].write(DATA as usize, &frame).unwrap();
        let n = frame.len() as u32;
        a.send_insert(sqn, 0, (ETH_WQE_INSERT_VLAN, TCI), alkey, 0, n);
        let c = a.cqe(0);
        if p == Profile::ConnectX4Lx {
            assert_eq!(c[63] >> 4, CqeOpcode::ReqErr.to_raw(), "{p:?}: {c:02x?}");
            assert_eq!(c[55], CqeSyndrome::LocalLengthErr.to_raw(), "{p:?}");
            continue;
        }
        assert_eq!(c[63] >> 4, CqeOpcode::Req.to_raw(), "{p:?}: {c:02x?}");
        let (qpn, bytes, c) = rx_cqe(&b, 0);
        assert_eq!(
            (qpn, bytes),
            (rq, n),
            "the tag stripped: its bytes not counted"
        );
        assert_ne!(cqe64::L4_L3_HDR_TYPE.get(&c) as u8 & CQE_VLAN_PRESENT, 0);
        assert_eq!(cqe64::VLAN_INFO.get(&c) as u16, TCI);
        let mut got = vec![0u8; frame.len()];
        let at = rx_buf(0, 0) - RING_IOVA;
        b.bufs[0].read(at as usize, &mut got).unwrap();
        assert_eq!(got[42..], frame[42..], "payload");
        assert_eq!(got[..12], frame[..12], "MACs");
        assert_eq!(got[12..14], frame[12..14], "ethertype after the tag");
    }
}

/// An S-VLAN insert (`ETH_WQE_INSERT_VLAN | ETH_WQE_SVLAN`) on ConnectX-5:
/// the frame leaves with an 802.1ad tag (TPID 0x88a8) and the TCI after its
/// MAC addresses, the rest as sent; read off a link to a datagram socket,
/// where the port's frames also go.
#[test]
fn svlan_insert_leaves_with_an_802_1ad_tag() {
    use crate::wire::{LinkOptions, LinkSpec};
    use mlx5_hw::eth::{ETH_WQE_INSERT_VLAN, ETH_WQE_SVLAN};
    use std::os::unix::net::UnixDatagram;
    const TCI: u16 = 0x2abc;
    let dir = std::env::temp_dir();
    let tag = format!("svlan-{}", std::process::id());
    let (mine, theirs) = (dir.join(format!("{tag}.m")), dir.join(format!("{tag}.t")));
    let _ = std::fs::remove_file(&theirs);
    let peer = UnixDatagram::bind(&theirs).unwrap();
    peer.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let (fab, mut a, _b) = pair_on(Profile::ConnectX5);
    let spec = format!("dgram,local={},remote={}", mine.display(), theirs.display());
    fab.connect(&LinkSpec::parse(&spec).unwrap(), &LinkOptions::default())
        .unwrap();
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    let mut frame = headers(5000, 1000, 32);
    frame.extend([0x5a; 32]);
    a.bufs[0].write(DATA as usize, &frame).unwrap();
    let insert = (ETH_WQE_INSERT_VLAN | ETH_WQE_SVLAN, TCI);
    a.send_insert(sqn, 0, insert, alkey, 0, frame.len() as u32);
    let c = a.cqe(0);
    assert_eq!(c[63] >> 4, CqeOpcode::Req.to_raw(), "{c:02x?}");
    let mut got = vec![0u8; 2048];
    let n = peer.recv(&mut got).unwrap();
    got.truncate(n);
    assert_eq!(n, frame.len() + 4);
    assert_eq!(got[..12], frame[..12], "MACs");
    assert_eq!(got[12..16], [0x88, 0xa8, 0x2a, 0xbc], "802.1ad tag");
    // After the tag, the frame as sent but for the checksums, which the
    // device filled in over the untagged frame before inserting the tag.
    let untagged: Vec<u8> = got[..12].iter().chain(&got[16..]).copied().collect();
    assert_eq!(untagged[12..24], frame[12..24], "ethertype, IP header");
    assert_eq!(untagged[26..40], frame[26..40], "addresses, ports");
    assert_eq!(untagged[42..], frame[42..], "payload");
    assert!(ipv4_csum_ok(&untagged[14..34]), "IP checksum filled in");
    assert_ne!(untagged[40..42], [0, 0], "UDP checksum filled in");
    drop(fab);
    let _ = std::fs::remove_file(&theirs);
    let _ = std::fs::remove_file(&mine);
}

/// Whether an IPv4 header's checksum is right (the ones' complement sum
/// of its 16-bit words is 0xffff).
fn ipv4_csum_ok(h: &[u8]) -> bool {
    let mut sum: u32 = h
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

/// A data segment of `len` bytes at `DATA + off` under `lkey`.
fn dseg(len: usize, lkey: u32, off: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    wqe_data_seg::BYTE_COUNT.set(&mut d, len as u64);
    wqe_data_seg::LKEY.set(&mut d, u64::from(lkey));
    wqe_data_seg::ADDR.set(&mut d, RING_IOVA + DATA + off);
    d
}

/// An inline data segment carrying `frame` (`byte_count` with
/// `INLINE_SEG`, the bytes after it, padded to 16 bytes).
fn inline_seg(frame: &[u8]) -> Vec<u8> {
    let bc = frame.len() as u32 | mlx5_hw::wqe::INLINE_SEG;
    let mut s = bc.to_be_bytes().to_vec();
    s.extend_from_slice(frame);
    s.resize((4 + frame.len()).next_multiple_of(16), 0);
    s
}

/// Two cabled functions of `p`: B's RQ 0 behind a UDP port-1000 rule with
/// `bufs` buffers posted, A's MTT key and an SQ in RDY (allowing legacy
/// multi-packet sends if `mpw`): (fabric, A, B, the RQ, A's lkey, the SQ).
fn udp_path(p: Profile, bufs: u16, mpw: bool) -> (Fabric, Eth, Eth, u32, u32, u32) {
    let (fab, mut a, mut b) = pair_on(p);
    let blkey = b.rw_mkey();
    let rq = b.ready_rq(0);
    b.post_recv(0, blkey, bufs);
    let tir = b.direct_tir(rq);
    let t = b.udp_table();
    assert_eq!(b.udp_rule(t, 0, 1000, Some(tir), None), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq_with(mpw);
    (fab, a, b, rq, alkey, sqn)
}

/// On two cabled functions of `p` ([`udp_path`], 16 buffers), A's SQ ready and an eMPW WQE posted there with the
/// Ethernet segment `eth` (checksums asked) then `segs(A's lkey)`. A's CQE
/// for it, and B.
fn empw_on(
    p: Profile,
    eth: &[u8],
    segs: impl FnOnce(&mut Eth, u32) -> Vec<u8>,
) -> (Vec<u8>, Eth, u32, Fabric) {
    let (fab, mut a, b, rq, alkey, sqn) = udp_path(p, 16, false);
    let mut s = eth.to_vec();
    wqe_eth_seg::CS_FLAGS.set(&mut s, u64::from(ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM));
    s.extend(segs(&mut a, alkey));
    let op = mlx5_hw::wqe::WqeOpcode::EnhancedMpsw.to_raw();
    a.post(sqn, 0, op, &s, true);
    (a.cqe(0), b, rq, fab)
}

/// A UDP frame to port 1000 of `n` payload bytes, numbered `k`.
fn udp_frame(k: usize, n: usize) -> Vec<u8> {
    let mut f = headers(5000 + k as u16, 1000, n);
    f.extend((0..n).map(|i| (i * 3 + k) as u8));
    f
}

/// Enhanced multi-packet send (ENHANCED_MPSW, mlx5e's TX MPWQE and DPDK's
/// eMPW) on ConnectX-5: one WQE, one Ethernet segment asking for the
/// checksums, two empty inline segments (padding, as DPDK's eMPW starts
/// its data at the next block), three frames (by data segment, inline, by
/// data segment) arrive at B in order, intact but for the checksums the device filled
/// in; A gets one CQE for the WQE.
#[test]
fn enhanced_multi_packet_send_sends_a_frame_per_segment() {
    let frames: Vec<Vec<u8>> = [64, 30, 200]
        .iter()
        .enumerate()
        .map(|(k, &n)| udp_frame(k, n))
        .collect();
    let eth = [0u8; wqe_eth_seg::SIZE_BYTES];
    let (c, b, rq, _fab) = empw_on(Profile::ConnectX5, &eth, |a, lkey| {
        a.bufs[0].write(DATA as usize, &frames[0]).unwrap();
        a.bufs[0].write(DATA as usize + 0x800, &frames[2]).unwrap();
        // DPDK's padding first: two empty inline segments, no frame.
        let mut s = [inline_seg(&[]), inline_seg(&[])].concat();
        s.extend(dseg(frames[0].len(), lkey, 0));
        s.extend(inline_seg(&frames[1]));
        s.extend(dseg(frames[2].len(), lkey, 0x800));
        s
    });
    assert_eq!(c[63] >> 4, CqeOpcode::Req.to_raw(), "{c:02x?}");
    assert_eq!(cqe64::WQE_COUNTER.get(&c), 0);
    for (k, f) in frames.iter().enumerate() {
        let (qpn, bytes, _) = rx_cqe(&b, k);
        assert_eq!((qpn, bytes as usize), (rq, f.len()), "frame {k}");
        let mut got = vec![0u8; f.len()];
        let at = rx_buf(0, k as u64) - RING_IOVA;
        b.bufs[0].read(at as usize, &mut got).unwrap();
        assert_eq!(got[..24], f[..24], "frame {k}");
        assert_eq!(got[26..40], f[26..40], "frame {k}");
        assert_eq!(got[HDRS..], f[HDRS..], "frame {k}");
        assert!(ipv4_csum_ok(&got[14..34]), "frame {k}: IP checksum");
        assert_ne!(got[40..42], [0, 0], "frame {k}: UDP checksum");
    }
}

/// What fails an eMPW WQE (each a local error CQE for it, the SQ in ERR):
/// the opcode where the profile does not offer it (ConnectX-4 Lx: a local
/// QP operation error); a frame shorter than an Ethernet header (a length
/// error, after the good frame before it left); inline headers in the
/// Ethernet segment (a malformed WQE: eMPW has none); an inline frame
/// claiming more bytes than the WQE holds (a length error).
#[test]
fn enhanced_multi_packet_send_refusals() {
    let f = udp_frame(0, 64);
    let plain = [0u8; wqe_eth_seg::SIZE_BYTES];
    let one = |a: &mut Eth, lkey: u32| {
        a.bufs[0].write(DATA as usize, &f).unwrap();
        dseg(f.len(), lkey, 0).to_vec()
    };
    let err = |c: &[u8]| {
        assert_eq!(c[63] >> 4, CqeOpcode::ReqErr.to_raw(), "{c:02x?}");
        c[55]
    };
    let (c, ..) = empw_on(Profile::ConnectX4Lx, &plain, one);
    assert_eq!(err(&c), CqeSyndrome::LocalQpOpErr.to_raw(), "no eMPW");

    let (c, b, rq, _fab) = empw_on(Profile::ConnectX5, &plain, |a, lkey| {
        let mut s = one(a, lkey);
        s.extend(inline_seg(&f[..10]));
        s
    });
    assert_eq!(err(&c), CqeSyndrome::LocalLengthErr.to_raw(), "short frame");
    let (qpn, bytes, _) = rx_cqe(&b, 0);
    assert_eq!((qpn, bytes as usize), (rq, f.len()), "the frame before it");

    let mut with_headers = plain;
    wqe_eth_seg::INLINE_HDR_SZ.set(&mut with_headers, 2);
    let (c, ..) = empw_on(Profile::ConnectX5, &with_headers, one);
    assert_eq!(
        err(&c),
        CqeSyndrome::LocalQpOpErr.to_raw(),
        "inline headers"
    );

    let (c, ..) = empw_on(Profile::ConnectX5, &plain, |_, _| {
        let mut s = inline_seg(&f[..28]);
        s[..4].copy_from_slice(&(500 | mlx5_hw::wqe::INLINE_SEG).to_be_bytes());
        s
    });
    assert_eq!(
        err(&c),
        CqeSyndrome::LocalLengthErr.to_raw(),
        "past the WQE"
    );
}

impl Eth {
    /// A cyclic striding RQ on ring `RQ_RING[0]` in RDY: 4 WQEs of a
    /// next-WQE and a data segment (32 bytes), each 8 strides of 64 bytes
    /// (`log_wqe_num_of_strides` 10: 2^3, the extended range, which this
    /// turns on in the caps).
    fn striding_rq(&mut self) -> u32 {
        use mlx5_hw::eth::WQ_TYPE_CYCLIC_STRIDING_RQ;
        {
            let mut fw = crate::lock(&self.d.f.model().inner.fw);
            let g = fw.caps.cur.get_mut(&0).expect("general caps");
            cmd_hca_cap::EXT_STRIDE_NUM_RANGE.set(g, 1);
        }
        let mut c = cmd_in(0x908, 0, create_rq_in::SIZE_BYTES + 8);
        let x = &mut c[create_rq_in::CTX.off / 8..];
        rqc::CQN.set(x, u64::from(self.cqn));
        rqc::USER_INDEX.set(x, UIDX + 8);
        let w = &mut x[rqc::WQ.off / 8..];
        wq::WQ_TYPE.set(w, WQ_TYPE_CYCLIC_STRIDING_RQ);
        wq::PD.set(w, u64::from(self.pd));
        wq::DBR_ADDR.set(w, DBR_IOVA + RQ_DBR[0]);
        wq::LOG_WQ_STRIDE.set(w, 5);
        wq::LOG_WQ_SZ.set(w, 2);
        wq::LOG_WQE_NUM_OF_STRIDES.set(w, 10);
        wq::LOG_WQE_STRIDE_SIZE.set(w, 0);
        let at = create_rq_in::SIZE_BYTES;
        c[at..].copy_from_slice(&(RING_IOVA + RQ_RING[0]).to_be_bytes());
        let rqn = num(&self.d.ok(&c, 16));
        assert_eq!(self.modify(0x909, rqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
        rqn
    }

    /// Posts the striding RQ's 4 WQEs: WQE k's 512 bytes at
    /// [`STRIDED`] + 512 k.
    fn post_striding(&mut self, lkey: u32) {
        for k in 0..4u64 {
            let mut s = [0u8; 32];
            wqe_data_seg::BYTE_COUNT.at(128).set(&mut s, 512);
            wqe_data_seg::LKEY.at(128).set(&mut s, u64::from(lkey));
            wqe_data_seg::ADDR
                .at(128)
                .set(&mut s, RING_IOVA + STRIDED + k * 512);
            self.bufs[0]
                .write((RQ_RING[0] + k * 32) as usize, &s)
                .unwrap();
        }
        self.bufs[1].write_u32_be(RQ_DBR[0] as usize, 4).unwrap();
    }
}

/// Where the striding RQ's WQE buffers start (in B's ring buffer, inside
/// its MTT key).
const STRIDED: u64 = DATA + 0x4000;

/// A striding RQ (multi-packet WQEs: mlx5e's and DPDK's MPRQ) on B: frames
/// of 100 and 200 bytes take strides 0-1 and 2-5 of WQE 0; one of 150 does
/// not fit in the 2 left, so a filler CQE ends WQE 0 (strides 6-7) and it
/// lands at stride 0 of WQE 1; one of 600 (10 strides) is larger than a
/// WQE: a length error CQE naming WQE 1, the RQ in ERR. The CQEs carry
/// the WQE (`wqe_id`), the first stride (`wqe_counter`) and `consumed <<
/// 16 | bytes`, as mlx5e reads them (`cqe->wqe_id`,
/// `mpwrq_get_cqe_stride_index`, `mpwrq_get_cqe_byte_cnt` and
/// `_consumed_strides`) and DPDK's MPRQ burst (`strd_idx` from
/// `wqe_counter`).
#[test]
fn striding_rq_places_frames_by_stride_with_fillers() {
    use mlx5_hw::eth::{MPWRQ_CQE_FILLER, MPWRQ_CQE_STRIDES_SHIFT};
    let (_fab, mut a, mut b) = pair_on(Profile::ConnectX5);
    let blkey = b.rw_mkey();
    let rq = b.striding_rq();
    b.post_striding(blkey);
    let tir = b.direct_tir(rq);
    let t = b.udp_table();
    assert_eq!(b.udp_rule(t, 0, 1000, Some(tir), None), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    let frames: Vec<Vec<u8>> = [100usize, 200, 150, 600]
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let mut f = headers(6000 + k as u16, 1000, n - HDRS);
            f.extend((0..n - HDRS).map(|i| (i + 5 * k) as u8));
            f
        })
        .collect();
    for (k, f) in frames.iter().enumerate() {
        // Each send WQE is two blocks (42 header bytes inline).
        a.bufs[0].write(DATA as usize, &f[HDRS..]).unwrap();
        a.send(
            sqn,
            2 * k as u16,
            &f[..HDRS],
            alkey,
            0,
            (f.len() - HDRS) as u32,
        );
        a.cqe(k);
    }
    // (WQE, first stride, byte_cnt) of each CQE; the frames' places.
    let want = [
        (0, 0, 2 << MPWRQ_CQE_STRIDES_SHIFT | 100),
        (0, 2, 4 << MPWRQ_CQE_STRIDES_SHIFT | 200),
        (0, 6, MPWRQ_CQE_FILLER | 2 << MPWRQ_CQE_STRIDES_SHIFT),
        (1, 0, 3 << MPWRQ_CQE_STRIDES_SHIFT | 150),
    ];
    for (n, &(wqe, id, bc)) in want.iter().enumerate() {
        let c = b.cqe(n);
        assert_eq!(
            c[63] >> 4,
            CqeOpcode::RespSend.to_raw(),
            "CQE {n}: {c:02x?}"
        );
        let got = (
            cqe64::WQE_ID.get(&c),
            cqe64::WQE_COUNTER.get(&c),
            cqe64::BYTE_CNT.get(&c) as u32,
        );
        assert_eq!(got, (wqe, id, bc), "CQE {n}");
    }
    for (k, at) in [(0usize, 0u64), (1, 2 * 64), (2, 512)] {
        let f = &frames[k];
        let mut got = vec![0u8; f.len()];
        b.bufs[0].read((STRIDED + at) as usize, &mut got).unwrap();
        assert_eq!(got[HDRS..], f[HDRS..], "frame {k} at stride offset {at}");
        assert_eq!(got[..24], f[..24], "frame {k}");
    }
    let c = b.cqe(4);
    assert_eq!(c[63] >> 4, CqeOpcode::RespErr.to_raw(), "{c:02x?}");
    assert_eq!(c[55], CqeSyndrome::LocalLengthErr.to_raw());
    assert_eq!((cqe64::WQE_ID.get(&c), cqe64::WQE_COUNTER.get(&c)), (1, 1));
    let rx = &b.d.f.model().inner.rdma.eth_rx;
    let state = crate::transport::rlock(&rx.rqs)[&rq]
        .state
        .load(Ordering::Relaxed);
    assert_eq!(u64::from(state), mlx5_hw::eth::QUEUE_STATE_ERR);
}

/// The segments of a SEND of `hdrs` inline, then the `len` bytes at
/// `DATA + off` under `lkey`; L3 and L4 checksums asked.
fn send_segs(hdrs: &[u8], lkey: u32, off: u64, len: u32) -> Vec<u8> {
    let inl = wqe_eth_seg::SIZE_BYTES + (hdrs.len() - 2).next_multiple_of(16);
    let mut s = vec![0u8; inl + wqe_data_seg::SIZE_BYTES];
    wqe_eth_seg::CS_FLAGS.set(&mut s, u64::from(ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM));
    wqe_eth_seg::INLINE_HDR_SZ.set(&mut s, hdrs.len() as u64);
    let start = wqe_eth_seg::INLINE_HDR_START.off / 8;
    s[start..start + hdrs.len()].copy_from_slice(hdrs);
    let d = &mut s[inl..];
    wqe_data_seg::BYTE_COUNT.set(d, u64::from(len));
    wqe_data_seg::LKEY.set(d, u64::from(lkey));
    wqe_data_seg::ADDR.set(d, RING_IOVA + DATA + off);
    s
}

/// Ethernet, IPv4 (TTL `ttl`) and TCP headers (no options) of a segment
/// from 10.0.0.1:`sport` to 10.0.0.2:8000 with sequence number `seq`,
/// `flags`, acknowledgement `1000 + seq` and window `seq % 4096`, for
/// `payload` bytes; checksums left to the offload.
fn tcp_headers(sport: u16, seq: u32, flags: u8, ttl: u8, payload: usize) -> Vec<u8> {
    let mut h = headers(0, 0, 0);
    h.truncate(34);
    h[16..18].copy_from_slice(&((20 + 20 + payload) as u16).to_be_bytes());
    h[22] = ttl;
    h[23] = 6;
    let mut t = [0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&8000u16.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&(1000 + seq).to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&((seq % 4096) as u16).to_be_bytes());
    h.extend_from_slice(&t);
    h
}

/// LRO on a striding RQ behind a TIR with `lro_enable_mask` IPv4: three
/// in-order segments of one flow (the last with PSH) land as one packet,
/// the first's headers then the three payloads back to back, with one
/// CQE as mlx5e's `mlx5e_lro_update_hdr` reads it (3 segments in `srqn`'s
/// top byte, PSH, the least TTL, the last window and ACK, `check_sum` over
/// the payload only); a segment no other follows in its burst completes
/// alone at the burst's end; a segment of another flow ends the open
/// session first.
#[test]
fn lro_merges_a_flows_in_order_segments_into_one_striding_cqe() {
    use mlx5_hw::eth::{MPWRQ_CQE_STRIDES_SHIFT, TIRC_PACKET_MERGE_MASK_IPV4_LRO};
    const ACK: u8 = 0x10;
    const PSH: u8 = 0x08;
    // The TIR's 32 us timer on a clock that stands still: only the
    // segments and bursts end sessions here.
    let clock = vfio::clock::ManualClock::new();
    let (_fab, mut a, mut b) = pair_on_clock(Profile::ConnectX7, &clock);
    let blkey = b.rw_mkey();
    let rq = b.striding_rq();
    b.post_striding(blkey);
    let mut c = cmd_in(0x900, 0, create_tir_in::SIZE_BYTES);
    let x = &mut c[create_tir_in::CTX.off / 8..];
    tirc::TRANSPORT_DOMAIN.set(x, u64::from(b.td));
    tirc::DISP_TYPE.set(x, TIRC_DISP_TYPE_DIRECT);
    tirc::INLINE_RQN.set(x, u64::from(rq));
    tirc::PACKET_MERGE_MASK.set(x, TIRC_PACKET_MERGE_MASK_IPV4_LRO);
    tirc::LRO_MAX_IP_PAYLOAD_SIZE.set(x, 4);
    tirc::LRO_TIMEOUT_PERIOD_USECS.set(x, 32);
    let tir = num(&b.d.ok(&c, 16));
    let t = b.udp_table();
    assert_eq!(b.ip_rule(t, 0, (6, 0), Some(tir), None), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    // (sport, seq, flags, ttl): 50-byte payloads, byte i of segment k is
    // k * 7 + i.
    let segs = [
        (7000u16, 1u32, ACK, 64u8),
        (7000, 51, ACK, 60),
        (7000, 101, ACK | PSH, 62),
        (7000, 151, ACK, 64),
        (7000, 201, ACK, 64),
        (7001, 1, ACK, 64),
    ];
    let payload = |k: usize| (0..50).map(|i| (k * 7 + i) as u8).collect::<Vec<_>>();
    let wqe = |a: &mut Eth, k: usize| {
        let (sport, seq, flags, ttl) = segs[k];
        a.bufs[0]
            .write(DATA as usize + k * 512, &payload(k))
            .unwrap();
        let h = tcp_headers(sport, seq, flags, ttl, 50);
        send_segs(&h, alkey, k as u64 * 512, 50)
    };
    // Bursts (one doorbell each): segments 0-2, then 3 alone, then 4-5.
    let mut idx = 0;
    for burst in [0..3, 3..4, 4..6] {
        let n = burst.len() as u16;
        let w: Vec<Vec<u8>> = burst.map(|k| wqe(&mut a, k)).collect();
        a.post_burst(sqn, idx, 0x0a, &w);
        idx += 2 * n;
        a.cqe(usize::from(idx / 2 - 1));
    }
    // CQE 0: segments 0-2 in strides 0-2 of WQE 0 (154 bytes).
    let c = b.cqe(0);
    assert_eq!(c[63] >> 4, CqeOpcode::RespSend.to_raw(), "{c:02x?}");
    let merged = 54 + 150;
    let field = |c: &[u8], f: BitField| f.get(c);
    assert_eq!(
        field(&c, cqe64::BYTE_CNT) as u32,
        4 << MPWRQ_CQE_STRIDES_SHIFT | merged
    );
    assert_eq!(
        (field(&c, cqe64::WQE_ID), field(&c, cqe64::WQE_COUNTER)),
        (0, 0)
    );
    assert_eq!(field(&c, cqe64::SRQN) >> 24, 3, "lro_num_seg");
    assert_eq!(field(&c, cqe64::TCPPSH_ABORT_DUPACK) >> 6 & 1, 1, "PSH");
    assert_eq!(field(&c, cqe64::MIN_TTL), 60);
    assert_eq!(field(&c, cqe64::TCP_WIN), 101);
    assert_eq!(field(&c, cqe64::ACK_SEQ_NUM), 1101);
    let mut got = vec![0u8; merged as usize];
    b.bufs[0].read(STRIDED as usize, &mut got).unwrap();
    // The first's headers as sent, less the checksums the offload filled.
    let mut hdrs = got[..54].to_vec();
    hdrs[24..26].fill(0);
    hdrs[50..52].fill(0);
    assert_eq!(
        hdrs,
        tcp_headers(7000, 1, ACK, 64, 50),
        "the first's headers"
    );
    let data: Vec<u8> = (0..3).flat_map(payload).collect();
    assert_eq!(got[54..], data[..], "the payloads back to back");
    let mut sum: u32 = data
        .chunks(2)
        .map(|w| u32::from(w[0]) << 8 | u32::from(w[1]))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    assert_eq!(field(&c, cqe64::CHECK_SUM), u64::from(sum), "payload sum");
    // Segment 3 alone, its burst ended: an ordinary CQE at stride 4.
    let c = b.cqe(1);
    assert_eq!(
        field(&c, cqe64::BYTE_CNT) as u32,
        2 << MPWRQ_CQE_STRIDES_SHIFT | 104
    );
    assert_eq!(
        (field(&c, cqe64::WQE_ID), field(&c, cqe64::WQE_COUNTER)),
        (0, 4)
    );
    assert_eq!(field(&c, cqe64::SRQN) >> 24, 0);
    // Segment 4 (strides 6-7 of WQE 0) ended by segment 5 of another flow,
    // which completes at its burst's end in WQE 1.
    let c = b.cqe(2);
    assert_eq!(
        field(&c, cqe64::BYTE_CNT) as u32,
        2 << MPWRQ_CQE_STRIDES_SHIFT | 104
    );
    assert_eq!(
        (field(&c, cqe64::WQE_ID), field(&c, cqe64::WQE_COUNTER)),
        (0, 6)
    );
    let c = b.cqe(3);
    assert_eq!(
        field(&c, cqe64::BYTE_CNT) as u32,
        2 << MPWRQ_CQE_STRIDES_SHIFT | 104
    );
    assert_eq!(
        (field(&c, cqe64::WQE_ID), field(&c, cqe64::WQE_COUNTER)),
        (1, 0)
    );
    let mut got = vec![0u8; 104];
    b.bufs[0].read((STRIDED + 512) as usize, &mut got).unwrap();
    assert_eq!(&got[34..36], &7001u16.to_be_bytes());
    assert_eq!(got[54..], payload(5)[..]);
}

/// A legacy multi-packet send (ConnectX-4 Lx's MPW, the LSO opcode with
/// `OPC_MOD_MPW`, as DPDK's `mlx5_tx_burst_mpw` posts it) on an SQ made
/// with `allow_multi_pkt_send_wqe` (or not, `allow`): the Ethernet
/// segment's `mss` is `len`, the checksums asked, then `segs(A, lkey)`.
/// A's CQE, B, B's RQ.
fn mpw_on(
    allow: bool,
    len: usize,
    segs: impl FnOnce(&mut Eth, u32) -> Vec<u8>,
) -> (Vec<u8>, Eth, u32, Fabric) {
    let (fab, mut a, b, rq, alkey, sqn) = udp_path(Profile::ConnectX4Lx, 16, allow);
    let mut s = vec![0u8; wqe_eth_seg::SIZE_BYTES];
    wqe_eth_seg::CS_FLAGS.set(&mut s, u64::from(ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM));
    wqe_eth_seg::MSS.set(&mut s, len as u64);
    s.extend(segs(&mut a, alkey));
    let mut w = s;
    w.resize(w.len().next_multiple_of(16), 0);
    let lso = mlx5_hw::wqe::WqeOpcode::Lso.to_raw();
    a.post_opmod(sqn, 0, mlx5_hw::wqe::OPC_MOD_MPW, lso, &w, true);
    (a.cqe(0), b, rq, fab)
}

/// Legacy MPW: three 100-byte frames by data segment, then two 80-byte
/// frames back to back in one inline segment, each arriving at B intact
/// with its checksums filled in; bytes that do not make whole frames are a
/// length error, and an SQ made without `allow_multi_pkt_send_wqe` refuses
/// the opcode.
#[test]
fn legacy_multi_packet_send_by_pointer_and_inline() {
    let by_ptr: Vec<Vec<u8>> = (0..3).map(|k| udp_frame(k, 100 - HDRS)).collect();
    let (c, b, rq, _fab) = mpw_on(true, 100, |a, lkey| {
        let mut s = Vec::new();
        for (k, f) in by_ptr.iter().enumerate() {
            a.bufs[0].write(DATA as usize + k * 0x200, f).unwrap();
            s.extend(dseg(f.len(), lkey, k as u64 * 0x200));
        }
        s
    });
    assert_eq!(c[63] >> 4, CqeOpcode::Req.to_raw(), "{c:02x?}");
    let inline: Vec<Vec<u8>> = (0..2).map(|k| udp_frame(k + 3, 80 - HDRS)).collect();
    let (c2, b2, rq2, _fab2) = mpw_on(true, 80, |_, _| {
        let all: Vec<u8> = inline.concat();
        let mut s = (all.len() as u32 | mlx5_hw::wqe::INLINE_SEG)
            .to_be_bytes()
            .to_vec();
        s.extend(all);
        s
    });
    assert_eq!(c2[63] >> 4, CqeOpcode::Req.to_raw(), "{c2:02x?}");
    for (b, rq, frames) in [(&b, rq, &by_ptr), (&b2, rq2, &inline)] {
        for (k, f) in frames.iter().enumerate() {
            let (qpn, bytes, _) = rx_cqe(b, k);
            assert_eq!((qpn, bytes as usize), (rq, f.len()), "frame {k}");
            let mut got = vec![0u8; f.len()];
            let at = rx_buf(0, k as u64) - RING_IOVA;
            b.bufs[0].read(at as usize, &mut got).unwrap();
            assert_eq!(got[HDRS..], f[HDRS..], "frame {k}");
            assert!(ipv4_csum_ok(&got[14..34]), "frame {k}: IP checksum");
        }
    }
    let (c, ..) = mpw_on(true, 100, |a, lkey| {
        a.bufs[0]
            .write(DATA as usize, &udp_frame(0, 150 - HDRS))
            .unwrap();
        dseg(150, lkey, 0).to_vec()
    });
    assert_eq!(c[63] >> 4, CqeOpcode::ReqErr.to_raw(), "{c:02x?}");
    assert_eq!(
        c[55],
        CqeSyndrome::LocalLengthErr.to_raw(),
        "not whole frames"
    );
    let (c, ..) = mpw_on(false, 100, |a, lkey| {
        a.bufs[0].write(DATA as usize, &by_ptr[0]).unwrap();
        dseg(100, lkey, 0).to_vec()
    });
    assert_eq!(c[63] >> 4, CqeOpcode::ReqErr.to_raw(), "{c:02x?}");
    assert_eq!(
        c[55],
        CqeSyndrome::LocalQpOpErr.to_raw(),
        "not allowed on this SQ"
    );
}

/// A steering entry's `flow_tag` reaches the CQE's `sop_drop_qpn` (mlx5e's
/// `skb->mark`, libmlx5's `read_flow_tag`, DPDK's MARK), and the RQ is
/// named by its user index in `srqn_uidx` (cqe_version 1): frames to
/// port 1000 tagged 0x1234, to port 1001 untagged (0). The frames are 58
/// bytes: they arrive padded to Ethernet's 60.
#[test]
fn a_flow_tag_reaches_the_cqe_beside_the_rqs_user_index() {
    let (_fab, mut a, mut b) = pair();
    let blkey = b.rw_mkey();
    let rq = b.ready_rq(0);
    b.post_recv(0, blkey, 8);
    let tir = b.direct_tir(rq);
    let t = b.udp_table();
    assert_eq!(b.tagged_rule(t, 0, (17, 1000), Some(tir), None, 0x1234), 0);
    assert_eq!(b.udp_rule(t, 1, 1001, Some(tir), None), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    for (k, dport) in [1000u16, 1001].into_iter().enumerate() {
        let h = headers(5000, dport, 16);
        a.bufs[0].write(DATA as usize, &[7u8; 16]).unwrap();
        a.send(sqn, 2 * k as u16, &h, alkey, 0, 16);
        a.cqe(k);
        let c = b.cqe(k);
        // 58 bytes sent, 60 on the wire: padded (`pad_tx_eth_packet`).
        assert_eq!(cqe64::BYTE_CNT.get(&c), 60, "a runt leaves padded");
        let mut tail = [0xffu8; 18];
        b.bufs[0]
            .read((rx_buf(0, k as u64) - RING_IOVA) as usize + 42, &mut tail)
            .unwrap();
        assert_eq!(tail[..16], [7u8; 16], "the payload");
        assert_eq!(tail[16..], [0, 0], "the padding");
        assert_eq!(
            (
                cqe64::SOP_DROP_QPN.get(&c) as u32 & 0xff_ffff,
                cqe64::SRQN.get(&c) as u32 & 0xff_ffff
            ),
            (if dport == 1000 { 0x1234 } else { 0 }, UIDX as u32),
            "dport {dport}"
        );
    }
}

/// SET_FLOW_TABLE_ENTRY refuses actions no profile's flow table
/// properties offer (BAD_PARAM): packet reformat (0x10), decap (0x20),
/// modify header (0x40), VLAN pop (0x80) and push (0x100), each beside a
/// forward to a TIR that alone is taken.
#[test]
fn flow_entries_with_actions_the_caps_do_not_offer_are_refused() {
    use set_fte_in as i;
    let (_fab, _a, mut b) = pair();
    let rq = b.ready_rq(0);
    let tir = b.direct_tir(rq);
    let t = b.udp_table();
    let fte = |b: &mut Eth, extra: u64| {
        let fc = i::FLOW_CONTEXT.off;
        let dests = (fc + flow_context::DESTINATION.off) / 8;
        let mut c = cmd_in(0x936, 0, dests + dest_format_struct::SIZE_BYTES);
        i::TABLE_TYPE.set(&mut c, NIC_RX);
        i::TABLE_ID.set(&mut c, u64::from(t.0));
        flow_context::GROUP_ID.at(fc).set(&mut c, u64::from(t.1));
        flow_context::ACTION
            .at(fc)
            .set(&mut c, FLOW_CONTEXT_ACTION_FWD_DEST | extra);
        flow_context::DESTINATION_LIST_SIZE.at(fc).set(&mut c, 1);
        dest_format_struct::DESTINATION_TYPE.set(&mut c[dests..], 2);
        dest_format_struct::DESTINATION_ID.set(&mut c[dests..], u64::from(tir));
        b.d.exec(&c, 16)[0]
    };
    for extra in [0x10u64, 0x20, 0x40, 0x80, 0x100] {
        assert_eq!(fte(&mut b, extra), BAD_PARAM, "action {extra:#x}");
    }
    assert_eq!(fte(&mut b, 0), 0);
}

/// NIC TX steering: A's NIC TX root drops UDP to port 1001 and allows the
/// rest; of a frame to each port, only port 1000's reaches B, the other
/// dropped at A's port (A's `dropped`). No NIC TX root: both leave.
#[test]
fn a_nic_tx_entry_drops_what_it_matches_before_the_port() {
    use create_flow_group_in as g;
    use set_fte_in as i;
    const NIC_TX: u64 = mlx5_hw::eth::FS_FT_NIC_TX as u64;
    let (_fab, mut a, mut b) = pair();
    let blkey = b.rw_mkey();
    let rq = b.ready_rq(0);
    b.post_recv(0, blkey, 8);
    let tir = b.direct_tir(rq);
    let t = b.udp_table();
    for (k, port) in [1000u16, 1001].into_iter().enumerate() {
        assert_eq!(b.udp_rule(t, k as u32, port, Some(tir), None), 0);
    }
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    let mut idx = 0u16;
    let mut send = |a: &mut Eth, port: u16| {
        let h = headers(5000, port, 32);
        a.send(sqn, idx, &h, alkey, 0, 32);
        a.cqe(usize::from(idx / 2));
        idx += 2;
    };
    send(&mut a, 1001);
    let rb = &b.d.f.model().inner.rdma;
    crate::tests::until("B's first frame", || {
        rb.counters.packets_received.load(Ordering::Acquire) == 1
    });
    // A's NIC TX root: a group over the UDP port, port 1001 dropped,
    // port 1000 allowed.
    let table = a.root_table(NIC_TX, 2);
    let mut c = cmd_in(0x933, 0, g::SIZE_BYTES);
    g::TABLE_TYPE.set(&mut c, NIC_TX);
    g::TABLE_ID.set(&mut c, u64::from(table));
    g::END_FLOW_INDEX.set(&mut c, 3);
    g::MATCH_CRITERIA_ENABLE.set(&mut c, MATCH_OUTER_HEADERS.into());
    let o = g::MATCH_CRITERIA.off + fte_match_param::OUTER_HEADERS.off;
    l24::UDP_DPORT.at(o).set(&mut c, 0xffff);
    let group =
        create_flow_group_out::GROUP_ID.get(&a.d.ok(&c, create_flow_group_out::SIZE_BYTES)) as u32;
    for (index, port, action) in [(0u64, 1001u64, FLOW_CONTEXT_ACTION_DROP), (1, 1000, 0x1)] {
        let fc = i::FLOW_CONTEXT.off;
        let mut c = cmd_in(0x936, 0, (fc + flow_context::DESTINATION.off) / 8);
        i::TABLE_TYPE.set(&mut c, NIC_TX);
        i::TABLE_ID.set(&mut c, u64::from(table));
        i::FLOW_INDEX.set(&mut c, index);
        flow_context::GROUP_ID.at(fc).set(&mut c, u64::from(group));
        flow_context::ACTION.at(fc).set(&mut c, action);
        let v = fc + flow_context::MATCH_VALUE.off + fte_match_param::OUTER_HEADERS.off;
        l24::UDP_DPORT.at(v).set(&mut c, port);
        assert_eq!(a.d.exec(&c, 16)[0], 0, "port {port}");
    }
    send(&mut a, 1001);
    send(&mut a, 1000);
    crate::tests::until("B's second frame", || {
        rb.counters.packets_received.load(Ordering::Acquire) == 2
    });
    let (_, bytes, c) = rx_cqe(&b, 1);
    assert_eq!(bytes, 42 + 32);
    assert_eq!(cqe64::SRQN.get(&c), UIDX);
    let udp_dport = |n: usize| {
        let mut h = [0u8; 2];
        b.bufs[0]
            .read((rx_buf(0, n as u64) - RING_IOVA) as usize + 36, &mut h)
            .unwrap();
        u16::from_be_bytes(h)
    };
    assert_eq!(
        (udp_dport(0), udp_dport(1)),
        (1001, 1000),
        "the dropped one never came"
    );
    let ra = &a.d.f.model().inner.rdma;
    assert_eq!(ra.counters.dropped.load(Ordering::Relaxed), 1);
    assert_eq!(rb.counters.packets_received.load(Ordering::Relaxed), 2);
}
