//! NIC RX flow steering as packets meet it: the tables firmware keeps
//! (fw/flow.rs) and the TIRs and RQ tables they forward to (fw/tir.rs,
//! fw/rqt.rs), compiled into a [`Plan`] that firmware publishes after every
//! command that changes them, so the data path reads one immutable
//! snapshot per packet and never takes the firmware lock.
//!
//! A packet enters at the NIC RX root table. Its headers are written into
//! an `fte_match_param` image, the very layout groups and entries use, so
//! an entry matches when, in every part its group's `match_criteria_enable`
//! names (outer headers, misc parameters, inner headers), the image masked
//! by the group's criteria equals the entry's value masked the same way.
//! Entries are tried in flow-index order; the first that matches decides:
//! it counts into its counters, drops, or forwards to every destination it
//! lists (a TIR: the packet goes to the TIR's RQ, or for an indirect TIR to
//! the RQ its hash picks from the RQ table; a deeper table: the walk goes
//! on there). No entry matching follows the table's miss path, and the
//! default miss drops. A frame an SQ sends meets the NIC TX root the same
//! way ([`Plan::egress`]): an entry counts, drops, or lets it leave (allow,
//! or forward to a deeper NIC TX table), and a miss lets it leave. The
//! sniffer tables, where the function made their roots, see copies: the
//! receive sniffer every frame the port takes in, whatever NIC RX does
//! with it, the transmit sniffer every frame an SQ sends that leaves; each
//! walks them as NIC RX is walked and its TIRs deliver the copy
//! ([`Plan::sniff`]). The outer L2-L4 headers are parsed, and a UDP
//! datagram to a port the function registered as VXLAN
//! (ADD_VXLAN_UDP_DPORT, fw/vxlan.rs) is a tunnel: its VNI goes into the
//! misc parameters (`vxlan_vni`) and the encapsulated frame's L2-L4 headers
//! into the inner headers (RFC 7348: the VXLAN header's I flag set, the
//! inner Ethernet frame after it), as the flow-table caps announce
//! (`outer_vxlan_vni`, `inner_*`); GRE likewise ([`Gre`]). Anything else
//! reads as zero there. A TIR that parses tunnels (`tunneled_offload_en`)
//! hands a tunnelled packet on as one ([`Delivery::tunneled`]): its RSS
//! hash reads the inner headers where the inner selector names fields,
//! and its CQE is marked tunnelled, its header types and checksum bits
//! the inner packet's; other TIRs see the outer headers only.

use std::collections::HashMap;

use mlx5_hw::eth::{
    FLOW_CONTEXT_ACTION_DROP, FLOW_CONTEXT_ACTION_FWD_DEST, FS_FT_NIC_RX, FS_FT_NIC_TX,
    FS_FT_SNIFFER_RX, FS_FT_SNIFFER_TX, MATCH_INNER_HEADERS, MATCH_MISC_PARAMETERS,
    MATCH_OUTER_HEADERS, TIRC_DISP_TYPE_DIRECT, TIRC_SELF_LB_BLOCK_BLOCK_MULTICAST,
    TIRC_SELF_LB_BLOCK_BLOCK_UNICAST,
};
use mlx5_hw::ifc::{
    flow_context, fte_match_param, fte_match_set_lyr_2_4 as l24, fte_match_set_misc, ipv4_layout,
    rq_num, rqtc, tirc,
};

use super::rss::{Flow, Hash};
use crate::fw::eth::EthObjects;
use crate::fw::flow::Steering;

/// The parts of the match parameters the NIC RX pipeline matches.
pub(crate) const MATCHED: u8 = MATCH_OUTER_HEADERS | MATCH_MISC_PARAMETERS | MATCH_INNER_HEADERS;
/// Deepest chain of tables a packet walks (a loop ends here, dropped).
const MAX_DEPTH: u8 = 16;
/// Most tables one packet visits.
const MAX_VISITS: u32 = 256;

/// One entry of a table, ready to match.
#[derive(Debug)]
struct Entry {
    enable: u8,
    mask: Vec<u8>,
    value: Vec<u8>,
    action: u64,
    tables: Vec<u32>,
    tirs: Vec<u32>,
    counters: Vec<u32>,
    /// `flow_context.flow_tag` (0: none).
    flow_tag: u32,
}

#[derive(Debug, Default)]
struct Table {
    /// The miss table (`table_miss_action` forward), else the default (drop).
    miss: Option<u32>,
    /// Entries in flow-index order.
    entries: Vec<Entry>,
}

/// Where a TIR delivers.
#[derive(Debug)]
enum Tir {
    Direct(u32),
    Indirect { rqs: Vec<u32>, hash: Hash },
}

/// A TIR as steering delivers to it: where it sends a packet, and which
/// of its own transport domain's frames it refuses when they loop back.
#[derive(Debug)]
struct PlanTir {
    disp: Tir,
    /// `tirc.transport_domain`.
    td: u32,
    /// `tirc.self_lb_block` (`TIRC_SELF_LB_BLOCK_BLOCK_*`).
    self_lb_block: u64,
    /// Its LRO configuration, if it merges.
    lro: Option<super::lro::Lro>,
    /// `tirc.tunneled_offload_en`: tunnelled packets are parsed and
    /// offloaded by their inner headers.
    tunneled: bool,
}

/// A frame the function sent, looped back to its own NIC RX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Looped {
    /// The transport domain of the sending SQ's TIS.
    pub td: Option<u32>,
    /// Its destination MAC is multicast or broadcast.
    pub multicast: bool,
}

impl PlanTir {
    /// Whether the TIR refuses frame `l` its own domain sent.
    fn blocks(&self, l: Looped) -> bool {
        let bit = if l.multicast {
            TIRC_SELF_LB_BLOCK_BLOCK_MULTICAST
        } else {
            TIRC_SELF_LB_BLOCK_BLOCK_UNICAST
        };
        l.td == Some(self.td) && self.self_lb_block & bit != 0
    }
}

/// The NIC RX and NIC TX pipelines as the last command left them.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    root: Option<u32>,
    /// The NIC TX root table: what the function's SQs send is matched
    /// there ([`Plan::egress`]).
    pub tx_root: Option<u32>,
    /// The receive and transmit sniffers' root tables.
    pub sniffer_rx_root: Option<u32>,
    pub sniffer_tx_root: Option<u32>,
    tables: HashMap<u32, Table>,
    tirs: HashMap<u32, PlanTir>,
    /// The UDP destination ports parsed as VXLAN.
    pub vxlan_ports: Vec<u16>,
}

/// One copy of a packet for an RQ, with the hash that chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub rqn: u32,
    /// The RSS hash (indirect TIRs), 0 otherwise.
    pub hash: u32,
    pub hashed: bool,
    /// The hash read the inner headers of a tunnelled packet.
    pub hashed_inner: bool,
    /// A tunnelled packet through a TIR that parses tunnels: its CQE
    /// describes the inner headers ([`Parsed::inner`]).
    pub tunneled: bool,
    /// The TIR merges TCP segments ([`super::lro`]).
    pub lro: Option<super::lro::Lro>,
    /// The function whose SQ's burst sent the packet, if a local one
    /// (the burst's end closes the LRO sessions it fed).
    pub burst: Option<super::lro::Sender>,
    /// The flow tag of the entries that steered it (the last non-zero
    /// `flow_tag` on its way through the tables; 0: none), which its CQE
    /// carries in `sop_drop_qpn` (mlx5e's `skb->mark`, libmlx5's
    /// `read_flow_tag`, DPDK's MARK).
    pub flow_tag: u32,
}

/// What steering decided for one packet.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub to: Vec<Delivery>,
    /// Flow counters the matching entries count into.
    pub counters: Vec<u32>,
    /// An entry dropped it (else, with no delivery, a table missed).
    pub dropped: bool,
}

impl Plan {
    /// Compiles the function's NIC RX tables and its TIRs.
    pub(crate) fn build(st: &Steering, eth: &EthObjects) -> Self {
        let mut p = Plan {
            root: st.roots.get(&FS_FT_NIC_RX).copied(),
            tx_root: st.roots.get(&FS_FT_NIC_TX).copied(),
            sniffer_rx_root: st.roots.get(&FS_FT_SNIFFER_RX).copied(),
            sniffer_tx_root: st.roots.get(&FS_FT_SNIFFER_TX).copied(),
            vxlan_ports: eth.vxlan_ports.iter().copied().collect(),
            ..Plan::default()
        };
        // Table ids are the function's, whatever the type: every
        // pipeline's tables in one map, each walked from its own root.
        let walked = |t: &crate::fw::flow::FlowTable| {
            [
                FS_FT_NIC_RX,
                FS_FT_NIC_TX,
                FS_FT_SNIFFER_RX,
                FS_FT_SNIFFER_TX,
            ]
            .contains(&t.ty)
        };
        for (&id, t) in st.tables.iter().filter(|(_, t)| walked(t)) {
            let mut table = Table {
                miss: (t.miss_action == 1).then_some(t.miss_id),
                entries: Vec::new(),
            };
            for f in t.ftes.values() {
                let Some(g) = t.groups.get(&f.group) else {
                    continue;
                };
                let v = flow_context::MATCH_VALUE.off / 8;
                table.entries.push(Entry {
                    enable: g.enable,
                    mask: g.criteria.clone(),
                    value: f.context[v..v + fte_match_param::SIZE_BYTES].to_vec(),
                    action: flow_context::ACTION.get(&f.context),
                    tables: f.tables.clone(),
                    tirs: f.tirs.clone(),
                    counters: f.counters.clone(),
                    flow_tag: flow_context::FLOW_TAG.get(&f.context) as u32,
                });
            }
            p.tables.insert(id, table);
        }
        for (&n, t) in &eth.tirs {
            let c = &t.ctx;
            let tir = if tirc::DISP_TYPE.get(c) == TIRC_DISP_TYPE_DIRECT {
                Tir::Direct(tirc::INLINE_RQN.get(c) as u32)
            } else {
                let rqt = tirc::INDIRECT_TABLE.get(c) as u32;
                let rqs = eth.rqts.get(&rqt).map_or_else(Vec::new, |r| {
                    let n = rqtc::RQT_ACTUAL_SIZE.get(&r.ctx) as usize;
                    r.ctx[rqtc::SIZE_BYTES..]
                        .chunks(rq_num::SIZE_BYTES)
                        .take(n)
                        .map(|e| rq_num::RQ_NUM.get(e) as u32)
                        .collect()
                });
                Tir::Indirect {
                    rqs,
                    hash: Hash::of(c),
                }
            };
            p.tirs.insert(
                n,
                PlanTir {
                    disp: tir,
                    td: tirc::TRANSPORT_DOMAIN.get(c) as u32,
                    self_lb_block: tirc::SELF_LB_BLOCK.get(c),
                    lro: super::lro::Lro::of(c),
                    tunneled: tirc::TUNNELED_OFFLOAD_EN.get(c) != 0,
                },
            );
        }
        p
    }

    /// Steers packet `p` (its match image, its flows for the hash);
    /// `looped`: the function sent it itself, and a TIR of the sender's
    /// transport domain that blocks self loopback of its kind takes none.
    pub(crate) fn steer(&self, p: &Parsed, looped: Option<Looped>) -> Verdict {
        self.walk(self.root, p, looped)
    }

    /// Packet `p`'s copy through the receive sniffer (`tx` false) or the
    /// transmit sniffer: where its entries send it (no sniffer root:
    /// nowhere).
    pub(crate) fn sniff(&self, p: &Parsed, tx: bool) -> Verdict {
        let root = if tx {
            self.sniffer_tx_root
        } else {
            self.sniffer_rx_root
        };
        self.walk(root, p, None)
    }

    /// Whether a sniffer root exists: receive (`tx` false) or transmit.
    pub(crate) fn sniffing(&self, tx: bool) -> bool {
        if tx {
            self.sniffer_tx_root.is_some()
        } else {
            self.sniffer_rx_root.is_some()
        }
    }

    /// Walks packet `p` through the tables from `root`.
    fn walk(&self, root: Option<u32>, p: &Parsed, looped: Option<Looped>) -> Verdict {
        let img = &p.img[..];
        let mut v = Verdict::default();
        let mut todo = Vec::new();
        if let Some(r) = root {
            todo.push((r, 0, 0));
        }
        let mut visits = 0u32;
        while let Some((id, depth, tag)) = todo.pop() {
            // Forwarding to several tables at once could fan out without
            // end: a packet visits a bounded number of tables.
            visits += 1;
            if visits > MAX_VISITS {
                break;
            }
            let Some(t) = self.tables.get(&id).filter(|_| depth < MAX_DEPTH) else {
                continue;
            };
            let Some(e) = t.entries.iter().find(|e| matches(e, img)) else {
                if let Some(m) = t.miss {
                    todo.push((m, depth + 1, tag));
                }
                continue;
            };
            let tag = if e.flow_tag != 0 { e.flow_tag } else { tag };
            v.counters.extend_from_slice(&e.counters);
            if e.action & FLOW_CONTEXT_ACTION_DROP != 0 {
                v.dropped = true;
                continue;
            }
            if e.action & FLOW_CONTEXT_ACTION_FWD_DEST == 0 {
                continue;
            }
            todo.extend(e.tables.iter().map(|&t| (t, depth + 1, tag)));
            for tirn in &e.tirs {
                let tir = self
                    .tirs
                    .get(tirn)
                    .filter(|t| !looped.is_some_and(|l| t.blocks(l)));
                let lro = tir.and_then(|t| t.lro);
                let inner = p.inner.as_ref().filter(|_| tir.is_some_and(|t| t.tunneled));
                let to = Delivery {
                    rqn: 0,
                    hash: 0,
                    hashed: false,
                    hashed_inner: false,
                    tunneled: inner.is_some(),
                    lro,
                    burst: None,
                    flow_tag: tag,
                };
                match tir.map(|t| &t.disp) {
                    Some(Tir::Direct(rqn)) => v.to.push(Delivery { rqn: *rqn, ..to }),
                    Some(Tir::Indirect { rqs, hash }) if !rqs.is_empty() => {
                        let (h, hashed_inner) = hash.hash(&p.flow, inner.map(|i| &i.flow));
                        v.to.push(Delivery {
                            rqn: rqs[h as usize % rqs.len()],
                            hash: h,
                            hashed: true,
                            hashed_inner,
                            ..to
                        });
                    }
                    _ => {}
                }
            }
        }
        v
    }
}

impl Plan {
    /// Matches a frame the function sends, whose match image is `img`,
    /// in the NIC TX tables: whether an entry dropped it (else it leaves:
    /// an entry that allows or forwards to the wire, or no entry, as a
    /// NIC TX table's miss goes on to the port), and the flow counters the
    /// matching entries count into.
    pub(crate) fn egress(&self, img: &[u8]) -> (bool, Vec<u32>) {
        let mut counters = Vec::new();
        let mut at = self.tx_root;
        let mut depth = 0u8;
        while let Some(id) = at.take() {
            depth += 1;
            let Some(t) = self.tables.get(&id).filter(|_| depth <= MAX_DEPTH) else {
                break;
            };
            let Some(e) = t.entries.iter().find(|e| matches(e, img)) else {
                at = t.miss;
                continue;
            };
            counters.extend_from_slice(&e.counters);
            if e.action & FLOW_CONTEXT_ACTION_DROP != 0 {
                return (true, counters);
            }
            // A forward goes on to the first deeper table it names (a
            // NIC TX destination other than a table is the wire).
            if e.action & FLOW_CONTEXT_ACTION_FWD_DEST != 0 {
                at = e.tables.first().copied();
            }
        }
        (false, counters)
    }
}

/// Whether entry `e` matches the packet image `img`.
fn matches(e: &Entry, img: &[u8]) -> bool {
    let parts = [
        (MATCH_OUTER_HEADERS, fte_match_param::OUTER_HEADERS),
        (MATCH_MISC_PARAMETERS, fte_match_param::MISC_PARAMETERS),
        (MATCH_INNER_HEADERS, fte_match_param::INNER_HEADERS),
    ];
    parts
        .iter()
        .filter(|(bit, _)| e.enable & bit != 0)
        .all(|(_, f)| {
            let r = f.off / 8..(f.off + f.width) / 8;
            img[r.clone()]
                .iter()
                .zip(&e.mask[r.clone()])
                .zip(&e.value[r])
                .all(|((p, m), v)| p & m == v & m)
        })
}

/// A received frame, parsed as far as steering and the CQE need.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// The `fte_match_param` image of its headers.
    pub img: Vec<u8>,
    pub flow: Flow,
    /// The frame carried an 802.1Q tag (its TCI).
    pub vlan: Option<u16>,
    /// IPv4 header checksum good (IPv6: true).
    pub l3_ok: bool,
    /// UDP/TCP checksum good (or none sent).
    pub l4_ok: bool,
    pub tcp_ack: bool,
    /// Where its UDP or TCP header starts.
    pub l4_at: Option<usize>,
    /// The GRE header after its IP header, if it is a GRE packet.
    pub gre: Option<Gre>,
    /// A tunnel's inner packet as the device parses it (VXLAN to a
    /// registered port, GRE: [`tunnel_inner`]).
    pub inner: Option<InnerHeaders>,
}

/// What the device reads of a tunnelled packet's inner headers, for a TIR
/// that parses tunnels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InnerHeaders {
    pub flow: Flow,
    /// Inner IPv4 header checksum good (IPv6: true).
    pub l3_ok: bool,
    /// Inner UDP/TCP checksum good (or none sent).
    pub l4_ok: bool,
    pub tcp_ack: bool,
}

/// Ethertypes and IP protocols the parser knows.
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
pub(crate) use mlx5_hw::eth::{ETH_P_8021AD, ETH_P_8021Q};
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
pub(crate) use super::packet::ETH_HLEN;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The one's-complement sum of `b` folded to 16 bits, from `sum`.
pub(crate) fn csum_fold(b: &[u8], mut sum: u32) -> u16 {
    for c in b.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Parses `f` (at least [`ETH_HLEN`] bytes); UDP to one of `vxlan_ports`
/// is a VXLAN tunnel whose inner frame is parsed too.
pub(crate) fn parse(f: &[u8], vxlan_ports: &[u16]) -> Parsed {
    let mut img = vec![0u8; fte_match_param::SIZE_BYTES];
    let mut p = parsed_empty();
    let o = fte_match_param::OUTER_HEADERS.off;
    let l4 = parse_l2_to_l4(f, 0, o, &mut img, &mut p);
    let misc = fte_match_param::MISC_PARAMETERS.off;
    if let (Some(_), Some(vni)) = (&l4, vxlan_vni(f, &p, vxlan_ports)) {
        fte_match_set_misc::VXLAN_VNI
            .at(misc)
            .set(&mut img, u64::from(vni));
    }
    if let Some(g) = &p.gre {
        use fte_match_set_misc as m;
        m::GRE_C_PRESENT.at(misc).set(&mut img, u64::from(g.csum));
        m::GRE_K_PRESENT
            .at(misc)
            .set(&mut img, u64::from(g.key.is_some()));
        m::GRE_S_PRESENT.at(misc).set(&mut img, u64::from(g.seq));
        m::GRE_PROTOCOL.at(misc).set(&mut img, u64::from(g.proto));
        m::GRE_KEY
            .at(misc)
            .set(&mut img, u64::from(g.key.unwrap_or(0)));
    }
    // The inner packet's headers, for matching and for the TIRs that
    // parse tunnels.
    if let Some(inner) = tunnel_inner(f, &p, vxlan_ports) {
        let o = fte_match_param::INNER_HEADERS.off;
        let mut q = parsed_empty();
        inner.parse(f, o, &mut img, &mut q);
        p.inner = Some(InnerHeaders {
            flow: q.flow,
            l3_ok: q.l3_ok,
            l4_ok: q.l4_ok,
            tcp_ack: q.tcp_ack,
        });
    }
    p.img = img;
    p
}

/// IP protocol number of GRE (RFC 2784).
pub(crate) const IPPROTO_GRE: u8 = 47;
/// GRE protocol: Transparent Ethernet Bridging, an Ethernet frame
/// (Linux's `gretap`).
const ETH_P_TEB: u16 = 0x6558;

/// A GRE header (RFC 2784 with RFC 2890's key and sequence number;
/// version 0, no routing), as the device's parser reads it
/// (`tunnel_stateless_gre`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gre {
    /// The checksum field is present (C).
    pub csum: bool,
    /// The key (K), if present.
    pub key: Option<u32>,
    /// A sequence number is present (S).
    pub seq: bool,
    /// The protocol of what it carries (an ethertype).
    pub proto: u16,
    /// Where what it carries starts.
    pub payload: usize,
}

impl Gre {
    /// The GRE header at `at` of `f`; `None` for another version, a
    /// routing header (RFC 1701) or a header past the frame's end.
    pub(crate) fn at(f: &[u8], at: usize) -> Option<Self> {
        const C: u16 = 0x8000;
        const R: u16 = 0x4000;
        const K: u16 = 0x2000;
        const S: u16 = 0x1000;
        const VERSION: u16 = 0x7;
        let h = f.get(at..at + 4)?;
        let flags = be16(h, 0);
        if flags & (R | VERSION) != 0 {
            return None;
        }
        let mut next = at + 4 + if flags & C != 0 { 4 } else { 0 };
        let key = if flags & K != 0 {
            let k = f.get(next..next + 4)?;
            next += 4;
            Some(u32::from_be_bytes([k[0], k[1], k[2], k[3]]))
        } else {
            None
        };
        if flags & S != 0 {
            next += 4;
        }
        (next <= f.len()).then_some(Self {
            csum: flags & C != 0,
            key,
            seq: flags & S != 0,
            proto: be16(h, 2),
            payload: next,
        })
    }
}

/// Where a tunnel's inner packet starts in a frame, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Inner {
    pub at: usize,
    /// `None`: an Ethernet frame (VXLAN, GRE's TEB); else an IP packet
    /// of this ethertype (GRE carrying IPv4 or IPv6).
    pub ip: Option<u16>,
}

impl Inner {
    /// Its L2 (if any) to L4 headers into the `fte_match_set_lyr_2_4` at
    /// bit `o` of `img`; where its L4 part is.
    fn parse(&self, f: &[u8], o: usize, img: &mut [u8], p: &mut Parsed) -> Option<L4At> {
        let Some(ty) = self.ip else {
            return parse_l2_to_l4(f, self.at, o, img, p);
        };
        l24::ETHERTYPE.at(o).set(img, u64::from(ty));
        let l4 = match ty {
            ETH_P_IP => parse_ipv4(f, self.at, o, img, p),
            ETH_P_IPV6 => parse_ipv6(f, self.at, o, img, p),
            _ => None,
        }?;
        parse_l4(f, &l4, o, img, p);
        Some(l4)
    }
}

/// The inner packet of a tunnel the device parses: VXLAN (UDP to one of
/// `vxlan_ports`, the I flag set) carrying an Ethernet frame, or GRE
/// carrying an Ethernet frame (TEB), IPv4 or IPv6.
pub(crate) fn tunnel_inner(f: &[u8], p: &Parsed, vxlan_ports: &[u16]) -> Option<Inner> {
    if let (Some(l4), Some(_)) = (p.l4_at, vxlan_vni(f, p, vxlan_ports)) {
        let at = l4 + UDP_HLEN + VXLAN_HLEN;
        return (f.len() >= at + ETH_HLEN).then_some(Inner { at, ip: None });
    }
    let g = p.gre?;
    match g.proto {
        ETH_P_TEB => (f.len() >= g.payload + ETH_HLEN).then_some(Inner {
            at: g.payload,
            ip: None,
        }),
        ETH_P_IP | ETH_P_IPV6 => Some(Inner {
            at: g.payload,
            ip: Some(g.proto),
        }),
        _ => None,
    }
}

pub(crate) use super::packet::{UDP_HLEN, VXLAN_HLEN};
/// The VXLAN header's I flag: the VNI is valid.
const VXLAN_FLAG_I: u8 = 0x08;

/// The VNI of a VXLAN packet: UDP to one of `ports`, the I flag set.
fn vxlan_vni(f: &[u8], p: &Parsed, ports: &[u16]) -> Option<u32> {
    if p.flow.udp != Some(true) || !ports.contains(&p.flow.dport) {
        return None;
    }
    let at = p.l4_at? + UDP_HLEN;
    let h = f.get(at..at + VXLAN_HLEN)?;
    (h[0] & VXLAN_FLAG_I != 0).then(|| u32::from_be_bytes([0, h[4], h[5], h[6]]))
}

/// The Ethernet header at `at` of `f`: the ethertype (after up to two
/// VLAN tags, 802.1ad or 802.1Q, that the frame carries whole), where the
/// L3 header starts, and the first tag's TCI if it is an 802.1Q one (the
/// tag an RQ strips); `None` when `f` is shorter than an Ethernet header
/// there.
pub(crate) fn l2(f: &[u8], at: usize) -> Option<(u16, usize, Option<u16>)> {
    let (ty, l3, tags) = vlan_tags(f, at)?;
    let cvlan = tags[0].filter(|t| t.0 == ETH_P_8021Q).map(|t| t.1);
    Some((ty, l3, cvlan))
}

/// A VLAN tag: its TPID (802.1Q or 802.1ad) and TCI.
type Tag = (u16, u16);

/// The Ethernet header at `at` of `f`: the ethertype after its VLAN tags,
/// where the L3 header starts, and up to two tags in order (an S-tag then
/// a C-tag in 802.1ad QinQ).
fn vlan_tags(f: &[u8], at: usize) -> Option<(u16, usize, [Option<Tag>; 2])> {
    let mut ty = be16(f.get(at..at + ETH_HLEN)?, 12);
    let mut l3 = at + ETH_HLEN;
    let mut tags = [None; 2];
    for t in &mut tags {
        if ty != ETH_P_8021Q && ty != ETH_P_8021AD {
            break;
        }
        let Some(h) = f.get(l3..l3 + 4) else {
            break;
        };
        *t = Some((ty, be16(h, 0)));
        ty = be16(h, 2);
        l3 += 4;
    }
    Some((ty, l3, tags))
}

/// The Ethernet frame at `at` of `f`: its L2 headers (an 802.1Q tag
/// included), then IPv4 or IPv6 and UDP or TCP, written into the
/// `fte_match_set_lyr_2_4` at bit `o` of `img`; `p` gets the flow, VLAN
/// and checksum verdicts. Where its L4 part is, if it has one.
fn parse_l2_to_l4(f: &[u8], at: usize, o: usize, img: &mut [u8], p: &mut Parsed) -> Option<L4At> {
    let e = f.get(at..at + ETH_HLEN)?;
    let set = |img: &mut [u8], fld: mlx5_hw::bits::BitField, v: u64| fld.at(o).set(img, v);
    set(
        img,
        l24::DMAC_47_16,
        u64::from(u32::from_be_bytes([e[0], e[1], e[2], e[3]])),
    );
    set(img, l24::DMAC_15_0, u64::from(be16(e, 4)));
    set(
        img,
        l24::SMAC_47_16,
        u64::from(u32::from_be_bytes([e[6], e[7], e[8], e[9]])),
    );
    set(img, l24::SMAC_15_0, u64::from(be16(e, 10)));
    let (ty, l3, tags) = vlan_tags(f, at)?;
    if let Some((tpid, tci)) = tags[0] {
        if tpid == ETH_P_8021Q {
            p.vlan = Some(tci);
            set(img, l24::CVLAN_TAG, 1);
        } else {
            set(img, l24::SVLAN_TAG, 1);
        }
        set(img, l24::FIRST_PRIO, u64::from(tci >> 13));
        set(img, l24::FIRST_CFI, u64::from(tci >> 12 & 1));
        set(img, l24::FIRST_VID, u64::from(tci & 0xfff));
    }
    if let Some((tpid, tci)) = tags[1] {
        // The second tag goes to the misc parameters, outer or inner.
        use fte_match_set_misc as m;
        let outer = o == fte_match_param::OUTER_HEADERS.off;
        let (cvlan, svlan, prio, cfi, vid) = if outer {
            let f = (m::OUTER_SECOND_CVLAN_TAG, m::OUTER_SECOND_SVLAN_TAG);
            (
                f.0,
                f.1,
                m::OUTER_SECOND_PRIO,
                m::OUTER_SECOND_CFI,
                m::OUTER_SECOND_VID,
            )
        } else {
            let f = (m::INNER_SECOND_CVLAN_TAG, m::INNER_SECOND_SVLAN_TAG);
            (
                f.0,
                f.1,
                m::INNER_SECOND_PRIO,
                m::INNER_SECOND_CFI,
                m::INNER_SECOND_VID,
            )
        };
        let misc = fte_match_param::MISC_PARAMETERS.off;
        let kind = if tpid == ETH_P_8021Q { cvlan } else { svlan };
        kind.at(misc).set(img, 1);
        prio.at(misc).set(img, u64::from(tci >> 13));
        cfi.at(misc).set(img, u64::from(tci >> 12 & 1));
        vid.at(misc).set(img, u64::from(tci & 0xfff));
    }
    set(img, l24::ETHERTYPE, u64::from(ty));
    let l4 = match ty {
        ETH_P_IP => parse_ipv4(f, l3, o, img, p),
        ETH_P_IPV6 => parse_ipv6(f, l3, o, img, p),
        _ => None,
    }?;
    parse_l4(f, &l4, o, img, p);
    Some(l4)
}

/// The IPv4 header at `at`: its fields into `img`; the L4 protocol, where
/// its header starts and the pseudo-header sum, if it is not a fragment.
fn parse_ipv4(f: &[u8], at: usize, o: usize, img: &mut [u8], p: &mut Parsed) -> Option<L4At> {
    let h = f.get(at..at + 20)?;
    let ihl = usize::from(h[0] & 0xf) * 4;
    let hdr = f.get(at..at + ihl.max(20))?;
    let set = |img: &mut [u8], fld: mlx5_hw::bits::BitField, v: u64| fld.at(o).set(img, v);
    set(img, l24::IP_VERSION, 4);
    set(img, l24::IPV4_IHL, u64::from(h[0] & 0xf));
    set(img, l24::IP_DSCP, u64::from(h[1] >> 2));
    set(img, l24::IP_ECN, u64::from(h[1] & 3));
    let frag = be16(h, 6) & 0x3fff != 0;
    set(img, l24::FRAG, u64::from(frag));
    set(img, l24::TTL_HOPLIMIT, u64::from(h[8]));
    set(img, l24::IP_PROTOCOL, u64::from(h[9]));
    let src = ipv4_layout::IPV4.at(o + l24::SRC_IPV4_SRC_IPV6.off);
    let dst = ipv4_layout::IPV4.at(o + l24::DST_IPV4_DST_IPV6.off);
    src.set(
        img,
        u64::from(u32::from_be_bytes([h[12], h[13], h[14], h[15]])),
    );
    dst.set(
        img,
        u64::from(u32::from_be_bytes([h[16], h[17], h[18], h[19]])),
    );
    p.flow.ipv6 = Some(false);
    p.flow.src_ip[12..].copy_from_slice(&h[12..16]);
    p.flow.dst_ip[12..].copy_from_slice(&h[16..20]);
    p.l3_ok = ihl >= 20 && csum_fold(hdr, 0) == 0xffff;
    let total = usize::from(be16(h, 2));
    let l4_len = total.checked_sub(ihl)?;
    let pseudo = csum_fold(&h[12..20], 0);
    let sum = u32::from(pseudo) + u32::from(h[9]) + l4_len as u32;
    (!frag).then_some(L4At {
        proto: h[9],
        at: at + ihl,
        end: at + ihl + l4_len,
        pseudo: sum,
    })
}

/// The IPv6 header at `at` (no extension headers are walked).
fn parse_ipv6(f: &[u8], at: usize, o: usize, img: &mut [u8], p: &mut Parsed) -> Option<L4At> {
    let h = f.get(at..at + 40)?;
    let set = |img: &mut [u8], fld: mlx5_hw::bits::BitField, v: u64| fld.at(o).set(img, v);
    set(img, l24::IP_VERSION, 6);
    let tc = (be16(h, 0) >> 4) as u8;
    set(img, l24::IP_DSCP, u64::from(tc >> 2));
    set(img, l24::IP_ECN, u64::from(tc & 3));
    set(img, l24::IP_PROTOCOL, u64::from(h[6]));
    set(img, l24::TTL_HOPLIMIT, u64::from(h[7]));
    let s = (o + l24::SRC_IPV4_SRC_IPV6.off) / 8;
    img[s..s + 16].copy_from_slice(&h[8..24]);
    let d = (o + l24::DST_IPV4_DST_IPV6.off) / 8;
    img[d..d + 16].copy_from_slice(&h[24..40]);
    p.flow.ipv6 = Some(true);
    p.flow.src_ip.copy_from_slice(&h[8..24]);
    p.flow.dst_ip.copy_from_slice(&h[24..40]);
    p.l3_ok = true;
    let len = u32::from(be16(h, 4));
    let sum = u32::from(csum_fold(&h[8..40], 0)) + u32::from(h[6]) + len;
    Some(L4At {
        proto: h[6],
        at: at + 40,
        end: at + 40 + len as usize,
        pseudo: sum,
    })
}

/// Where an IP packet's L4 part is.
struct L4At {
    proto: u8,
    at: usize,
    /// Where the IP packet ends (its length field).
    end: usize,
    /// The pseudo-header's sum.
    pseudo: u32,
}

/// The UDP or TCP header `l`.
fn parse_l4(f: &[u8], l: &L4At, o: usize, img: &mut [u8], p: &mut Parsed) {
    let (proto, at, pseudo) = (l.proto, l.at, l.pseudo);
    let body = f.get(at..l.end);
    let set = |img: &mut [u8], fld: mlx5_hw::bits::BitField, v: u64| fld.at(o).set(img, v);
    let Some(h) = f.get(at..at + 8) else {
        return;
    };
    let (sp, dp) = (be16(h, 0), be16(h, 2));
    match proto {
        IPPROTO_UDP => {
            set(img, l24::UDP_SPORT, u64::from(sp));
            set(img, l24::UDP_DPORT, u64::from(dp));
            p.flow.udp = Some(true);
            p.l4_ok = be16(h, 6) == 0 || body.is_some_and(|b| csum_fold(b, pseudo) == 0xffff);
        }
        IPPROTO_TCP => {
            let Some(t) = f.get(at..at + 20) else {
                return;
            };
            set(img, l24::TCP_SPORT, u64::from(sp));
            set(img, l24::TCP_DPORT, u64::from(dp));
            set(img, l24::TCP_FLAGS, u64::from(be16(t, 12) & 0x1ff));
            p.flow.udp = Some(false);
            p.tcp_ack = t[13] & 0x10 != 0;
            p.l4_ok = body.is_some_and(|b| csum_fold(b, pseudo) == 0xffff);
        }
        IPPROTO_GRE => {
            p.gre = Gre::at(f, at);
            return;
        }
        _ => return,
    }
    p.flow.sport = sp;
    p.flow.dport = dp;
    p.l4_at = Some(at);
}

/// Fills in the checksums an Ethernet segment's `cs_flags` asks for: the
/// IPv4 header's (`MLX5_ETH_WQE_L3_CSUM`), the TCP or UDP one
/// (`MLX5_ETH_WQE_L4_CSUM`), and in a tunnelled packet (VXLAN: UDP to one
/// of `vxlan_ports`; GRE carrying an Ethernet frame, IPv4 or IPv6: as the
/// device's parser finds them, [`tunnel_inner`]) the inner packet's
/// (`MLX5_ETH_WQE_L3_INNER_CSUM`, `MLX5_ETH_WQE_L4_INNER_CSUM`: what mlx5e
/// asks for an encapsulated SKB), inner first since the outer L4 checksum
/// covers them (a GRE checksum, when present, is left as sent). A frame that is not IP, or too short for the headers it
/// claims, is sent as it is.
pub(crate) fn offload_checksums(f: &mut [u8], cs_flags: u8, vxlan_ports: &[u16]) {
    use mlx5_hw::eth::{
        ETH_WQE_L3_CSUM, ETH_WQE_L3_INNER_CSUM, ETH_WQE_L4_CSUM, ETH_WQE_L4_INNER_CSUM,
    };
    if cs_flags & (ETH_WQE_L3_INNER_CSUM | ETH_WQE_L4_INNER_CSUM) != 0 && f.len() >= ETH_HLEN {
        let p = parse(f, vxlan_ports);
        if let Some(inner) = tunnel_inner(f, &p, vxlan_ports) {
            let l3 = match inner.ip {
                Some(ty) => Some((ty, inner.at)),
                None => l2(f, inner.at).map(|(ty, l3, _)| (ty, l3)),
            };
            if let Some((ty, l3)) = l3 {
                fill_checksums(
                    f,
                    ty,
                    l3,
                    cs_flags & ETH_WQE_L3_INNER_CSUM != 0,
                    cs_flags & ETH_WQE_L4_INNER_CSUM != 0,
                );
            }
        }
    }
    if let Some((ty, l3, _)) = l2(f, 0) {
        fill_checksums(
            f,
            ty,
            l3,
            cs_flags & ETH_WQE_L3_CSUM != 0,
            cs_flags & ETH_WQE_L4_CSUM != 0,
        );
    }
}

/// The IPv4 header checksum (`l3_csum`) and the TCP or UDP checksum
/// (`l4_csum`) of the IP packet of ethertype `ty` at `l3` of `f`.
fn fill_checksums(f: &mut [u8], ty: u16, l3: usize, l3_csum: bool, l4_csum: bool) {
    if !(l3_csum || l4_csum) {
        return;
    }
    let (mut img, mut p) = (vec![0u8; fte_match_param::SIZE_BYTES], parsed_empty());
    let l4 = match ty {
        ETH_P_IP => {
            let ihl = usize::from(f.get(l3).copied().unwrap_or(0) & 0xf) * 4;
            if l3_csum && ihl >= 20 && f.len() >= l3 + ihl {
                f[l3 + 10..l3 + 12].fill(0);
                let c = !csum_fold(&f[l3..l3 + ihl], 0);
                f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            }
            parse_ipv4(f, l3, fte_match_param::OUTER_HEADERS.off, &mut img, &mut p)
        }
        ETH_P_IPV6 => parse_ipv6(f, l3, fte_match_param::OUTER_HEADERS.off, &mut img, &mut p),
        _ => None,
    };
    let Some(l) = l4.filter(|_| l4_csum) else {
        return;
    };
    let at = match l.proto {
        IPPROTO_UDP => l.at + 6,
        IPPROTO_TCP => l.at + 16,
        _ => return,
    };
    if l.end > f.len() || at + 2 > l.end {
        return;
    }
    f[at..at + 2].fill(0);
    let mut c = !csum_fold(&f[l.at..l.end], l.pseudo);
    if c == 0 && l.proto == IPPROTO_UDP {
        c = 0xffff;
    }
    f[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

fn parsed_empty() -> Parsed {
    Parsed {
        img: Vec::new(),
        flow: Flow::default(),
        vlan: None,
        l3_ok: false,
        l4_ok: false,
        tcp_ack: false,
        l4_at: None,
        gre: None,
        inner: None,
    }
}

/// What a successful command `op` (its output `out`) changes here: the
/// plan is built again when it touched what [`Plan::build`] reads; a new
/// bulk of flow counters starts from zero.
pub(crate) fn after(
    op: mlx5_hw::opcode::Opcode,
    out: &[u8],
    st: &Steering,
    eth: &EthObjects,
    rdma: &super::Rdma,
) {
    if affects(op) {
        let plan = Plan::build(st, eth);
        rdma.eth_rx.egress.store(
            plan.tx_root.is_some() || plan.sniffing(true),
            std::sync::atomic::Ordering::Release,
        );
        *super::wlock(&rdma.eth_rx.plan) = std::sync::Arc::new(plan);
    }
    if op == mlx5_hw::opcode::Opcode::AllocFlowCounter {
        let base = mlx5_hw::ifc::alloc_flow_counter_out::FLOW_COUNTER_ID.get(out) as u32;
        let n = st.counters.get(&base).copied().unwrap_or(0);
        crate::lock(&rdma.eth_rx.flow_counts).retain(|id, _| !(base..base + n).contains(id));
    }
}

/// Whether a successful `op` changes what [`Plan::build`] reads (flow
/// tables, groups, entries, roots, TIRs, RQ tables).
fn affects(op: mlx5_hw::opcode::Opcode) -> bool {
    use mlx5_hw::opcode::Opcode as O;
    matches!(
        op,
        O::CreateFlowTable
            | O::DestroyFlowTable
            | O::ModifyFlowTable
            | O::SetFlowTableRoot
            | O::CreateFlowGroup
            | O::DestroyFlowGroup
            | O::SetFlowTableEntry
            | O::DeleteFlowTableEntry
            | O::CreateTir
            | O::ModifyTir
            | O::DestroyTir
            | O::CreateRqt
            | O::ModifyRqt
            | O::DestroyRqt
            | O::AddVxlanUdpDport
            | O::DeleteVxlanUdpDport
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5_hw::ifc::fte_match_set_misc as misc;

    /// Ethernet, IPv4 (GRE), a GRE header of `flags` and `proto` (the
    /// checksum, key 0x0a0b0c0d and sequence words as the flags say), then
    /// `inner`.
    fn gre(flags: u16, proto: u16, inner: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 34];
        f[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        f[14] = 0x45;
        f[23] = IPPROTO_GRE;
        f.extend(flags.to_be_bytes());
        f.extend(proto.to_be_bytes());
        for (bit, word) in [(0x8000, 0u32), (0x2000, 0x0a0b_0c0d), (0x1000, 77)] {
            if flags & bit != 0 {
                f.extend(word.to_be_bytes());
            }
        }
        let len = (f.len() - 14 + inner.len()) as u16;
        f[16..18].copy_from_slice(&len.to_be_bytes());
        f.extend_from_slice(inner);
        f
    }

    /// An IPv4 TCP packet from port 1234 to 80 (no Ethernet header).
    fn tcp_packet() -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&40u16.to_be_bytes());
        p[9] = IPPROTO_TCP;
        p[20..22].copy_from_slice(&1234u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[32] = 5 << 4;
        p
    }

    /// VLAN tags as the parser reads them for matching: a C-tag alone
    /// (`cvlan_tag`, `first_*`: the tag an RQ strips), an S-tag then a
    /// C-tag (802.1ad QinQ: `svlan_tag`, `first_*` the S-tag's, the
    /// C-tag in the misc parameters' `outer_second_*`), the IP header
    /// found after both.
    #[test]
    fn an_s_tag_and_a_second_tag_are_matched_and_skipped() {
        let m = fte_match_param::MISC_PARAMETERS.off;
        let o = fte_match_param::OUTER_HEADERS.off;
        let ip = tcp_packet();
        let frame = |tags: &[(u16, u16)]| {
            let mut f = vec![0u8; 12];
            for &(tpid, tci) in tags {
                f.extend(tpid.to_be_bytes());
                f.extend(tci.to_be_bytes());
            }
            f.extend(ETH_P_IP.to_be_bytes());
            f.extend(&ip);
            f
        };
        let p = parse(&frame(&[(ETH_P_8021Q, 0x2005)]), &[]);
        let get = |p: &Parsed, fld: mlx5_hw::bits::BitField, at: usize| fld.at(at).get(&p.img);
        assert_eq!(p.vlan, Some(0x2005));
        assert_eq!(
            (get(&p, l24::CVLAN_TAG, o), get(&p, l24::SVLAN_TAG, o)),
            (1, 0)
        );
        assert_eq!(
            (get(&p, l24::FIRST_PRIO, o), get(&p, l24::FIRST_VID, o)),
            (1, 5)
        );
        let p = parse(
            &frame(&[(ETH_P_8021AD, 0x4064), (ETH_P_8021Q, 0x0007)]),
            &[],
        );
        assert_eq!(p.vlan, None, "an S-tag first: nothing to strip");
        assert_eq!(
            (get(&p, l24::CVLAN_TAG, o), get(&p, l24::SVLAN_TAG, o)),
            (0, 1)
        );
        assert_eq!(
            (get(&p, l24::FIRST_PRIO, o), get(&p, l24::FIRST_VID, o)),
            (2, 100)
        );
        assert_eq!(get(&p, misc::OUTER_SECOND_CVLAN_TAG, m), 1);
        assert_eq!(get(&p, misc::OUTER_SECOND_VID, m), 7);
        assert_eq!(get(&p, l24::ETHERTYPE, o), u64::from(ETH_P_IP));
        assert_eq!(get(&p, l24::TCP_DPORT, o), 80);
    }

    /// GRE (`tunnel_stateless_gre`) as the parser reads it for matching:
    /// the C, K and S flags, the protocol and the key into the misc
    /// parameters, and the inner packet's headers (an IP packet, or an
    /// Ethernet frame after TEB) into the inner headers; a GRE header with
    /// routing or of another version is not parsed.
    #[test]
    fn gre_fills_the_misc_parameters_and_the_inner_headers() {
        let m = fte_match_param::MISC_PARAMETERS.off;
        let i = fte_match_param::INNER_HEADERS.off;
        let f = gre(0xb000, ETH_P_IP, &tcp_packet());
        let p = parse(&f, &[]);
        let get = |fld: mlx5_hw::bits::BitField, at: usize| fld.at(at).get(&p.img);
        assert_eq!(
            (
                get(misc::GRE_C_PRESENT, m),
                get(misc::GRE_K_PRESENT, m),
                get(misc::GRE_S_PRESENT, m)
            ),
            (1, 1, 1)
        );
        assert_eq!(get(misc::GRE_PROTOCOL, m), u64::from(ETH_P_IP));
        assert_eq!(get(misc::GRE_KEY, m), 0x0a0b_0c0d);
        assert_eq!(get(l24::IP_PROTOCOL, i), u64::from(IPPROTO_TCP));
        assert_eq!(get(l24::TCP_DPORT, i), 80);
        assert_eq!(get(l24::ETHERTYPE, i), u64::from(ETH_P_IP));
        // An Ethernet frame inside (gretap), no flags.
        let mut eth = vec![0u8; 14];
        eth[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        eth[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        eth.extend(tcp_packet());
        let f = gre(0, ETH_P_TEB, &eth);
        let p = parse(&f, &[]);
        let get = |fld: mlx5_hw::bits::BitField, at: usize| fld.at(at).get(&p.img);
        assert_eq!(get(misc::GRE_K_PRESENT, m), 0);
        assert_eq!(get(misc::GRE_PROTOCOL, m), u64::from(ETH_P_TEB));
        assert_eq!(get(l24::DMAC_15_0, i), 9);
        assert_eq!(get(l24::TCP_SPORT, i), 1234);
        // Routing (R) or version 1: not GRE as the device parses it.
        for flags in [0x4000, 0x0001] {
            let p = parse(&gre(flags, ETH_P_IP, &tcp_packet()), &[]);
            assert_eq!(p.gre, None, "flags {flags:#x}");
            assert_eq!(l24::IP_PROTOCOL.at(i).get(&p.img), 0);
        }
    }
}
