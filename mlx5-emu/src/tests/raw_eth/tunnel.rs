//! Tunnelled packets (VXLAN to a port the function registered, GRE) as a
//! TIR that parses tunnels (`tunneled_offload_en`) and one that does not
//! hand them on. The first marks the CQE tunnelled (`tls_outer_l3_tunneled`,
//! Linux's `cqe_is_tunneled`, DPDK's `MLX5_CQE_RX_TUNNEL_PACKET`) with the
//! inner packet's header types and checksum verdicts (what mlx5e takes as
//! CHECKSUM_UNNECESSARY at `csum_level` 1, what DPDK's ptype table reads
//! as the inner L3/L4), and hashes the inner headers where its inner
//! selector names fields; the second sees the outer headers only.

use mlx5_hw::eth::{
    CQE_L3_HDR_TYPE_IPV6, CQE_L4_HDR_TYPE_NONE, CQE_L4_HDR_TYPE_TCP_NO_ACK, CQE_RSS_TCP,
    CQE_RX_OUTER_IPV6, CQE_RX_TUNNEL_PACKET, L3_PROT_TYPE_IPV4,
};
use mlx5_hw::ifc::add_vxlan_udp_dport_in;

use super::*;
use crate::transport::steer::csum_fold;

const VXLAN_PORT: u16 = 4789;
/// The Toeplitz key of the hashing TIR.
const KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// An Ethernet header from A to B of type `ty`.
fn eth(ty: u16) -> Vec<u8> {
    let mut h = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
    h.extend_from_slice(&ty.to_be_bytes());
    h
}

/// An IPv4 header from `src` to `dst` for protocol `proto` carrying
/// `body`, its checksum filled in, then `body`.
fn ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], body: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&((20 + body.len()) as u16).to_be_bytes());
    h[8] = 64;
    h[9] = proto;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let c = !csum_fold(&h, 0);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(body);
    h
}

/// A UDP (`proto` 17) or TCP (6, no flags, no options) segment from
/// `sport` to `dport` carrying `payload`, its checksum over the IPv4
/// pseudo-header of `src` and `dst` filled in (spoilt if `bad`).
fn l4(proto: u8, ips: ([u8; 4], [u8; 4]), ports: (u16, u16), payload: &[u8], bad: bool) -> Vec<u8> {
    let hlen = if proto == 17 { 8 } else { 20 };
    let mut s = vec![0u8; hlen];
    s[0..2].copy_from_slice(&ports.0.to_be_bytes());
    s[2..4].copy_from_slice(&ports.1.to_be_bytes());
    if proto == 17 {
        s[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    } else {
        s[12] = 5 << 4;
        s[14..16].copy_from_slice(&1024u16.to_be_bytes());
    }
    s.extend_from_slice(payload);
    let mut pseudo = ips.0.to_vec();
    pseudo.extend_from_slice(&ips.1);
    let sum = u32::from(csum_fold(&pseudo, 0)) + u32::from(proto) + s.len() as u32;
    let mut c = !csum_fold(&s, sum);
    if c == 0 && proto == 17 {
        c = 0xffff;
    }
    if bad {
        c ^= 0x5555;
    }
    let at = if proto == 17 { 6 } else { 16 };
    s[at..at + 2].copy_from_slice(&c.to_be_bytes());
    s
}

/// The inner IPv4 packet of frame `k`: from 192.168.0.`k` to 192.168.0.200,
/// UDP or TCP (`proto`) to port 5000, its L4 checksum spoilt if `bad`.
fn inner_ip(k: u8, proto: u8, bad: bool) -> Vec<u8> {
    let ips = ([192, 168, 0, k], [192, 168, 0, 200]);
    let seg = l4(proto, ips, (6000 + u16::from(k), 5000), &[k; 24], bad);
    ipv4(proto, ips.0, ips.1, &seg)
}

/// Outer addresses of every tunnel frame.
const OUTER: ([u8; 4], [u8; 4]) = ([10, 0, 0, 1], [10, 0, 0, 2]);

/// A VXLAN frame (VNI 42, outer UDP to [`VXLAN_PORT`] with its checksum)
/// carrying an Ethernet frame with [`inner_ip`]`(k, TCP, bad)`.
fn vxlan_frame(k: u8, bad: bool) -> Vec<u8> {
    let mut body = vec![0x08, 0, 0, 0, 0, 0, 42, 0];
    body.extend(eth(0x0800));
    body.extend(inner_ip(k, 6, bad));
    let udp = l4(17, OUTER, (50000, VXLAN_PORT), &body, false);
    let mut f = eth(0x0800);
    f.extend(ipv4(17, OUTER.0, OUTER.1, &udp));
    f
}

/// A GRE frame (no checksum, key or sequence; protocol IPv4) carrying
/// [`inner_ip`]`(k, UDP, bad)`.
fn gre_frame(k: u8, bad: bool) -> Vec<u8> {
    let mut body = vec![0, 0, 0x08, 0x00];
    body.extend(inner_ip(k, 17, bad));
    let mut f = eth(0x0800);
    f.extend(ipv4(47, OUTER.0, OUTER.1, &body));
    f
}

/// [`gre_frame`] over outer IPv6 (fd00::1 to fd00::2).
fn gre6_frame(k: u8) -> Vec<u8> {
    let mut body = vec![0, 0, 0x08, 0x00];
    body.extend(inner_ip(k, 17, false));
    let mut f = eth(0x86dd);
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(body.len() as u16).to_be_bytes());
    h.extend_from_slice(&[47, 64]);
    for last in [1, 2] {
        h.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last]);
    }
    f.extend(h);
    f.extend(body);
    f
}

/// An FTE at `index` of table `t` for outer ethertype `to.0`, IP protocol
/// `to.1` (and UDP port `to.2`) forwarding to every TIR of `tirs`.
fn rule_to_tirs(b: &mut Eth, t: (u32, u32), index: u32, to: (u16, u8, u16), tirs: &[u32]) {
    use set_fte_in as i;
    let fc = i::FLOW_CONTEXT.off;
    let dests = (fc + flow_context::DESTINATION.off) / 8;
    let mut c = cmd_in(
        0x936,
        0,
        dests + tirs.len() * dest_format_struct::SIZE_BYTES,
    );
    i::TABLE_TYPE.set(&mut c, NIC_RX);
    i::TABLE_ID.set(&mut c, u64::from(t.0));
    i::FLOW_INDEX.set(&mut c, u64::from(index));
    flow_context::GROUP_ID.at(fc).set(&mut c, u64::from(t.1));
    flow_context::ACTION
        .at(fc)
        .set(&mut c, FLOW_CONTEXT_ACTION_FWD_DEST);
    flow_context::DESTINATION_LIST_SIZE
        .at(fc)
        .set(&mut c, tirs.len() as u64);
    for (n, tir) in tirs.iter().enumerate() {
        let d = &mut c[dests + n * dest_format_struct::SIZE_BYTES..];
        dest_format_struct::DESTINATION_TYPE.set(d, 2);
        dest_format_struct::DESTINATION_ID.set(d, u64::from(*tir));
    }
    let o = fc + flow_context::MATCH_VALUE.off + fte_match_param::OUTER_HEADERS.off;
    l24::ETHERTYPE.at(o).set(&mut c, u64::from(to.0));
    l24::IP_PROTOCOL.at(o).set(&mut c, u64::from(to.1));
    l24::UDP_DPORT.at(o).set(&mut c, u64::from(to.2));
    assert_eq!(b.d.exec(&c, 16)[0], 0, "SET_FLOW_TABLE_ENTRY");
}

/// An indirect TIR over `rqtn` parsing tunnels, hashing the inner IPv4
/// source and destination (the outer selector names the outer ones).
fn tunnel_tir(b: &mut Eth, rqtn: u32) -> u32 {
    let mut c = cmd_in(0x900, 0, create_tir_in::SIZE_BYTES);
    let x = &mut c[create_tir_in::CTX.off / 8..];
    tirc::TRANSPORT_DOMAIN.set(x, u64::from(b.td));
    tirc::DISP_TYPE.set(x, TIRC_DISP_TYPE_INDIRECT);
    tirc::INDIRECT_TABLE.set(x, u64::from(rqtn));
    tirc::RX_HASH_FN.set(x, RX_HASH_FN_TOEPLITZ);
    tirc::TUNNELED_OFFLOAD_EN.set(x, 1);
    let k = tirc::RX_HASH_TOEPLITZ_KEY.off / 8;
    x[k..k + 40].copy_from_slice(&KEY);
    for s in [
        tirc::RX_HASH_FIELD_SELECTOR_OUTER.off,
        tirc::RX_HASH_FIELD_SELECTOR_INNER.off,
    ] {
        rx_hash_field_select::L3_PROT_TYPE
            .at(s)
            .set(x, L3_PROT_TYPE_IPV4);
        rx_hash_field_select::SELECTED_FIELDS
            .at(s)
            .set(x, HASH_FIELD_SEL_SRC_IP | HASH_FIELD_SEL_DST_IP);
    }
    num(&b.d.ok(&c, 16))
}

/// The CQE's (tunnelled byte, L3 type, L4 type, checksum bits).
fn verdict(c: &[u8]) -> (u8, u8, u8, u8) {
    let types = cqe64::L4_L3_HDR_TYPE.get(c) as u8;
    (
        cqe64::TLS_OUTER_L3_TUNNELED.get(c) as u8,
        types >> CQE_L3_HDR_TYPE_SHIFT & 0x3,
        types >> CQE_L4_HDR_TYPE_SHIFT & 0x7,
        cqe64::HDS_IP_EXT.get(c) as u8 & (CQE_L3_OK | CQE_L4_OK),
    )
}

/// VXLAN (inner TCP) and GRE (inner UDP) frames, good and with a spoilt
/// inner checksum, each to both TIRs: through the tunnel-parsing TIR the
/// CQE says tunnelled (outer IPv4), gives the inner types, L3/L4 OK only
/// where the inner checksums are good, and the RQ and hash the inner
/// addresses pick (an outer IPv6 header marked as such); through the other TIR the CQE gives the outer types
/// and checksums (the outer UDP of a VXLAN frame is good even where the
/// inner TCP's is not; GRE has no L4 the device reads).
#[test]
fn a_tir_that_parses_tunnels_reports_and_hashes_the_inner_packet() {
    let (_fab, mut a, mut b) = pair();
    let mut c = cmd_in(0x827, 0, add_vxlan_udp_dport_in::SIZE_BYTES);
    add_vxlan_udp_dport_in::VXLAN_UDP_PORT.set(&mut c, u64::from(VXLAN_PORT));
    b.d.ok(&c, 16);
    let blkey = b.rw_mkey();
    let rqs = [b.ready_rq(0), b.ready_rq(1)];
    b.post_recv(0, blkey, 32);
    b.post_recv(1, blkey, 32);
    let rqtn = num(&b.rqt(0x916, 0, 2, &rqs));
    let parsing = tunnel_tir(&mut b, rqtn);
    let plain = b.direct_tir(rqs[0]);
    let t = b.udp_table();
    rule_to_tirs(&mut b, t, 0, (0x0800, 17, VXLAN_PORT), &[parsing, plain]);
    rule_to_tirs(&mut b, t, 1, (0x0800, 47, 0), &[parsing, plain]);
    rule_to_tirs(&mut b, t, 2, (0x86dd, 47, 0), &[parsing, plain]);

    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    // (frame, inner L4 type, inner checksum good, outer L4 type, outer
    // L4 checksum bit, outer IPv6).
    let mut sent = Vec::new();
    for k in 1..=6u8 {
        let bad = k % 3 == 0;
        sent.push((
            vxlan_frame(k, bad),
            CQE_L4_HDR_TYPE_TCP_NO_ACK,
            !bad,
            CQE_L4_HDR_TYPE_UDP,
            CQE_L4_OK,
            false,
        ));
        sent.push((
            gre_frame(k, bad),
            CQE_L4_HDR_TYPE_UDP,
            !bad,
            CQE_L4_HDR_TYPE_NONE,
            0,
            false,
        ));
    }
    let k = sent.len() / 2 + 1;
    sent.push((
        gre6_frame(k as u8),
        CQE_L4_HDR_TYPE_UDP,
        true,
        CQE_L4_HDR_TYPE_NONE,
        0,
        true,
    ));
    for (n, (f, ..)) in sent.iter().enumerate() {
        let off = n as u64 * 512;
        a.bufs[0].write(DATA as usize + off as usize, f).unwrap();
        let mut s = vec![0u8; wqe_eth_seg::SIZE_BYTES];
        s.extend_from_slice(&dseg(f.len(), alkey, off));
        a.post(sqn, n as u16, 0x0a, &s, true);
    }
    let mut seen = [0usize; 2];
    for (n, (f, inner_l4, good, outer_l4, outer_ok, v6)) in sent.iter().enumerate() {
        let k = (n / 2 + 1) as u8;
        let (tunneled, outer_l3) = if *v6 {
            (
                CQE_RX_TUNNEL_PACKET | CQE_RX_OUTER_IPV6,
                CQE_L3_HDR_TYPE_IPV6,
            )
        } else {
            (CQE_RX_TUNNEL_PACKET, CQE_L3_HDR_TYPE_IPV4)
        };
        // Through the TIR that parses tunnels.
        let c = b.cqe(2 * n);
        assert_eq!(
            c[63] >> 4,
            CqeOpcode::RespSend.to_raw(),
            "frame {n}: {c:02x?}"
        );
        let ok = if *good {
            CQE_L3_OK | CQE_L4_OK
        } else {
            CQE_L3_OK
        };
        assert_eq!(
            verdict(&c),
            (tunneled, CQE_L3_HDR_TYPE_IPV4, *inner_l4, ok),
            "frame {n} through the tunnel-parsing TIR"
        );
        assert_eq!(cqe64::BYTE_CNT.get(&c) as usize, f.len());
        let h = crate::transport::rss::toeplitz(&KEY, &[192, 168, 0, k, 192, 168, 0, 200]);
        assert_eq!(
            cqe64::RSS_HASH_RESULT.get(&c) as u32,
            h,
            "frame {n}: inner hash"
        );
        let l4_type = if *inner_l4 == CQE_L4_HDR_TYPE_UDP {
            CQE_RSS_UDP
        } else {
            CQE_RSS_TCP
        };
        assert_eq!(cqe64::RSS_HASH_TYPE.get(&c) as u8, CQE_RSS_IPV4 | l4_type);
        let q = h as usize % 2;
        assert_eq!(
            rq_of_uidx(&b, cqe64::SRQN.get(&c) as u32 & 0xff_ffff),
            rqs[q]
        );
        seen[q] += 1;
        // Through the TIR that does not.
        let c = b.cqe(2 * n + 1);
        assert_eq!(
            verdict(&c),
            (0, outer_l3, *outer_l4, CQE_L3_OK | outer_ok),
            "frame {n} through the plain TIR"
        );
    }
    assert!(seen[0] > 0 && seen[1] > 0, "both RQs used: {seen:?}");
}
