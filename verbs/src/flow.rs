//! Flow steering the verbs way (`ibv_create_flow`): rules over the
//! Ethernet (MACs, C-VLAN ID, ethertype), IPv4 or IPv6 and TCP or UDP
//! headers of received frames that forward to a raw packet QP
//! ([`crate::raw_eth::RawPacketQp`], its TIR), spread over an RSS QP's
//! queues ([`crate::rss::RssQp`]), or drop. A VXLAN spec (the verbs
//! way: `IBV_FLOW_SPEC_VXLAN_TUNNEL` and `IBV_FLOW_SPEC_INNER` specs)
//! matches the tunnel's VNI and the encapsulated frame's headers, on UDP
//! ports the function parses as VXLAN ([`Context::add_vxlan_udp_dport`]).
//!
//! [`FlowSteering`] owns the function's NIC RX root flow table. As Linux's
//! fs_core does, a rule goes into a flow group whose match criteria are
//! the rule's own mask: rules with the same fields share a group (16
//! entries each, made on first use), and groups earlier in the table win
//! (groups are tried in index order, so the first rule shape made has the
//! highest priority).

use mlx5_hw::eth::{
    FLOW_CONTEXT_ACTION_DROP, FLOW_CONTEXT_ACTION_FWD_DEST, FS_FT_NIC_RX, MATCH_INNER_HEADERS,
    MATCH_MISC_PARAMETERS, MATCH_OUTER_HEADERS,
};
use mlx5_hw::ifc::{
    create_flow_group_in, create_flow_group_out, create_flow_table_in, create_flow_table_out,
    delete_fte_in, dest_format_struct, destroy_flow_group_in, destroy_flow_table_in, flow_context,
    flow_table_context, fte_match_param, fte_match_set_lyr_2_4 as l24, fte_match_set_misc,
    general_obj_in_cmd_hdr, ipv4_layout, set_flow_table_root_in, set_fte_in,
};
use mlx5_hw::opcode::Opcode;

use crate::device::Context;
use crate::raw_eth::RawPacketQp;
use crate::{Error, Result};

/// log2 of the root table's entries.
const LOG_TABLE: u8 = 8;
/// Entries per group.
const GROUP: u32 = 16;
/// `dest_format_struct.destination_type` of a TIR
/// (`MLX5_IFC_FLOW_DESTINATION_TYPE_TIR`).
const DEST_TIR: u64 = mlx5_hw::eth::FLOW_DESTINATION_TYPE_TIR;
/// Output bytes of the commands that return only a status.
const STATUS_OUT: usize = mlx5_hw::ifc::destroy_flow_table_out::SIZE_BYTES;

/// What a rule matches (`ibv_flow_spec_eth`, `_ipv4`, `_ipv6`,
/// `_tcp_udp`): each field set is matched exactly, the others are
/// wildcards. As mlx5_ib's `parse_flow_attr`, IPv4 or IPv6 addresses imply
/// their ethertype and TCP or UDP ports their IP protocol; a spec that
/// asks for two of a kind (IPv4 and IPv6, TCP and UDP, or an ethertype or
/// protocol other than the one implied) is refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowSpec {
    /// Destination MAC.
    pub dmac: Option<[u8; 6]>,
    /// Source MAC.
    pub smac: Option<[u8; 6]>,
    /// The C-VLAN ID of a tagged frame (a frame without the tag does not
    /// match).
    pub vlan_id: Option<u16>,
    /// Ethertype (after any VLAN tag).
    pub ethertype: Option<u16>,
    /// IPv4 source address.
    pub src_ipv4: Option<[u8; 4]>,
    /// IPv4 destination address.
    pub dst_ipv4: Option<[u8; 4]>,
    /// IPv6 source address.
    pub src_ipv6: Option<[u8; 16]>,
    /// IPv6 destination address.
    pub dst_ipv6: Option<[u8; 16]>,
    /// IP protocol (6: TCP, 17: UDP).
    pub ip_protocol: Option<u8>,
    /// UDP source port.
    pub udp_sport: Option<u16>,
    /// UDP destination port.
    pub udp_dport: Option<u16>,
    /// TCP source port.
    pub tcp_sport: Option<u16>,
    /// TCP destination port.
    pub tcp_dport: Option<u16>,
    /// A VXLAN tunnel's VNI (24 bits; RFC 7348): the frame is UDP to a
    /// port the function parses as VXLAN ([`Context::add_vxlan_udp_dport`])
    /// and carries this VNI. Needs the device's `outer_vxlan_vni`.
    pub vxlan_vni: Option<u32>,
    /// The encapsulated frame's headers (with `vxlan_vni`): the fields
    /// above, matched on the inner Ethernet frame (no tunnel in it).
    pub inner: Option<Box<FlowSpec>>,
    /// The bits of the addresses above that must match (verbs' spec
    /// masks: a subnet, a MAC prefix); `None`: all of them. A mask for an
    /// address not given is ignored.
    pub masks: AddrMasks,
}

/// Which bits of a [`FlowSpec`]'s addresses are matched (`None`: every
/// bit), as the masks of `ibv_flow_spec_eth`, `_ipv4` and `_ipv6`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddrMasks {
    /// Of `dmac`.
    pub dmac: Option<[u8; 6]>,
    /// Of `smac`.
    pub smac: Option<[u8; 6]>,
    /// Of `src_ipv4`.
    pub src_ipv4: Option<[u8; 4]>,
    /// Of `dst_ipv4`.
    pub dst_ipv4: Option<[u8; 4]>,
    /// Of `src_ipv6`.
    pub src_ipv6: Option<[u8; 16]>,
    /// Of `dst_ipv6`.
    pub dst_ipv6: Option<[u8; 16]>,
}

/// Ethertypes and IP protocols a spec's fields imply.
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// Where matching frames go.
#[derive(Debug, Clone, Copy)]
pub enum FlowAction<'a> {
    /// To the QP's receive queue.
    Queue(&'a RawPacketQp),
    /// Spread over the RSS QP's work queues by its hash.
    Rss(&'a crate::rss::RssQp),
    /// Nowhere (`IBV_FLOW_SPEC_ACTION_DROP`).
    Drop,
}

/// A rule in the table: its flow index.
#[derive(Debug, PartialEq, Eq)]
pub struct Flow {
    index: u32,
}

/// One group: its mask and its index range's use.
#[derive(Debug)]
struct Group {
    mask: Vec<u8>,
    id: u32,
    start: u32,
    used: Vec<bool>,
}

/// The function's NIC RX root table and its groups.
#[derive(Debug)]
pub struct FlowSteering {
    ctx: Context,
    table: u32,
    groups: Vec<Group>,
}

fn cmd(op: Opcode, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    general_obj_in_cmd_hdr::OPCODE.set(&mut v, u64::from(op.to_raw()));
    v
}

impl FlowSpec {
    /// The ethertype and IP protocol to match: the spec's own, or those
    /// its addresses and ports imply; an error when they disagree.
    fn implied(&self) -> Result<(Option<u16>, Option<u8>)> {
        let v4 = self.src_ipv4.is_some() || self.dst_ipv4.is_some();
        let v6 = self.src_ipv6.is_some() || self.dst_ipv6.is_some();
        let udp = self.udp_sport.is_some() || self.udp_dport.is_some();
        let tcp = self.tcp_sport.is_some() || self.tcp_dport.is_some();
        if v4 && v6 {
            return Err(Error::Invalid("flow spec: IPv4 and IPv6 addresses"));
        }
        if udp && tcp {
            return Err(Error::Invalid("flow spec: TCP and UDP ports"));
        }
        let ty = match (v4, v6) {
            (true, _) => Some(ETH_P_IP),
            (_, true) => Some(ETH_P_IPV6),
            _ => None,
        };
        let proto = match (tcp, udp) {
            (true, _) => Some(IPPROTO_TCP),
            (_, true) => Some(IPPROTO_UDP),
            _ => None,
        };
        let agree =
            |own: Option<u64>, implied: Option<u64>| own.zip(implied).is_none_or(|(a, b)| a == b);
        if !agree(self.ethertype.map(u64::from), ty.map(u64::from)) {
            return Err(Error::Invalid("flow spec: ethertype against its addresses"));
        }
        if !agree(self.ip_protocol.map(u64::from), proto.map(u64::from)) {
            return Err(Error::Invalid("flow spec: IP protocol against its ports"));
        }
        Ok((self.ethertype.or(ty), self.ip_protocol.or(proto)))
    }

    /// The spec as (mask, value) `fte_match_param` images and the parts
    /// they use (`match_criteria_enable`).
    fn images(&self) -> Result<(Vec<u8>, Vec<u8>, u8)> {
        let mut m = vec![0u8; fte_match_param::SIZE_BYTES];
        let mut v = m.clone();
        self.headers(fte_match_param::OUTER_HEADERS.off, &mut m, &mut v)?;
        let mut parts = MATCH_OUTER_HEADERS;
        if let Some(vni) = self.vxlan_vni {
            if vni >> 24 != 0 {
                return Err(Error::Invalid("flow spec: a VXLAN VNI is 24 bits"));
            }
            let f = fte_match_set_misc::VXLAN_VNI.at(fte_match_param::MISC_PARAMETERS.off);
            f.set(&mut m, u64::MAX >> (64 - f.width));
            f.set(&mut v, u64::from(vni));
            parts |= MATCH_MISC_PARAMETERS;
        }
        if let Some(inner) = &self.inner {
            if self.vxlan_vni.is_none() {
                return Err(Error::Invalid("flow spec: inner headers without a tunnel"));
            }
            if inner.vxlan_vni.is_some() || inner.inner.is_some() {
                return Err(Error::Invalid("flow spec: a tunnel inside a tunnel"));
            }
            inner.headers(fte_match_param::INNER_HEADERS.off, &mut m, &mut v)?;
            parts |= MATCH_INNER_HEADERS;
        }
        Ok((m, v, parts))
    }

    /// The spec's L2-L4 fields into the `fte_match_set_lyr_2_4` at bit `o`
    /// of the mask and value images.
    fn headers(&self, o: usize, m: &mut [u8], v: &mut [u8]) -> Result<()> {
        let (ethertype, ip_protocol) = self.implied()?;
        // A field matched on the bits of `mask` (the value masked too: the
        // device compares the masked packet with it).
        let mut put_masked = |f: mlx5_hw::bits::BitField, val: Option<u64>, mask: u64| {
            if let Some(x) = val {
                let mask = mask & (u64::MAX >> (64 - f.width));
                f.at(o).set(m, mask);
                f.at(o).set(v, x & mask);
            }
        };
        let mac = |a: [u8; 6]| {
            let mut b = [0u8; 8];
            b[2..].copy_from_slice(&a);
            u64::from_be_bytes(b)
        };
        let ms = &self.masks;
        for (a, mask, hi, lo) in [
            (self.dmac, ms.dmac, l24::DMAC_47_16, l24::DMAC_15_0),
            (self.smac, ms.smac, l24::SMAC_47_16, l24::SMAC_15_0),
        ] {
            let (x, k) = (a.map(mac), mac(mask.unwrap_or([0xff; 6])));
            put_masked(hi, x.map(|x| x >> 16), k >> 16);
            put_masked(lo, x.map(|x| x & 0xffff), k & 0xffff);
        }
        let mut put = |f: mlx5_hw::bits::BitField, val: Option<u64>| put_masked(f, val, u64::MAX);
        put(l24::CVLAN_TAG, self.vlan_id.map(|_| 1));
        put(l24::FIRST_VID, self.vlan_id.map(|id| u64::from(id & 0xfff)));
        put(l24::ETHERTYPE, ethertype.map(u64::from));
        put(l24::IP_PROTOCOL, ip_protocol.map(u64::from));
        put(l24::UDP_SPORT, self.udp_sport.map(u64::from));
        put(l24::UDP_DPORT, self.udp_dport.map(u64::from));
        put(l24::TCP_SPORT, self.tcp_sport.map(u64::from));
        put(l24::TCP_DPORT, self.tcp_dport.map(u64::from));
        let ip = |a: [u8; 4]| u64::from(u32::from_be_bytes(a));
        for (f, a, mask) in [
            (l24::SRC_IPV4_SRC_IPV6, self.src_ipv4, ms.src_ipv4),
            (l24::DST_IPV4_DST_IPV6, self.dst_ipv4, ms.dst_ipv4),
        ] {
            let k = ip(mask.unwrap_or([0xff; 4]));
            put_masked(ipv4_layout::IPV4.at(f.off), a.map(ip), k);
        }
        // IPv6 addresses: the whole 128-bit fields, byte for byte.
        for (f, a, mask) in [
            (l24::SRC_IPV4_SRC_IPV6, self.src_ipv6, ms.src_ipv6),
            (l24::DST_IPV4_DST_IPV6, self.dst_ipv6, ms.dst_ipv6),
        ] {
            if let Some(a) = a {
                let k = mask.unwrap_or([0xff; 16]);
                let at = (o + f.off) / 8;
                for (i, (mb, vb)) in m[at..at + 16]
                    .iter_mut()
                    .zip(&mut v[at..at + 16])
                    .enumerate()
                {
                    *mb = k[i];
                    *vb = a[i] & k[i];
                }
            }
        }
        Ok(())
    }
}

impl Context {
    /// ADD_VXLAN_UDP_DPORT: UDP datagrams to `port` are parsed as VXLAN
    /// (their VNI and inner headers match flow specs); 4789 is IANA's.
    /// Needs `tunnel_stateless_vxlan`; the device holds a few ports
    /// (`max_vxlan_udp_ports`).
    pub fn add_vxlan_udp_dport(&self, port: u16) -> Result<()> {
        self.vxlan_udp_dport(Opcode::AddVxlanUdpDport, port)
    }

    /// DELETE_VXLAN_UDP_DPORT: `port` is plain UDP again.
    pub fn delete_vxlan_udp_dport(&self, port: u16) -> Result<()> {
        self.vxlan_udp_dport(Opcode::DeleteVxlanUdpDport, port)
    }

    fn vxlan_udp_dport(&self, op: Opcode, port: u16) -> Result<()> {
        use mlx5_hw::ifc::{add_vxlan_udp_dport_in as add, delete_vxlan_udp_dport_in as del};
        let (len, field) = match op {
            Opcode::AddVxlanUdpDport => (add::SIZE_BYTES, add::VXLAN_UDP_PORT),
            _ => (del::SIZE_BYTES, del::VXLAN_UDP_PORT),
        };
        let mut c = cmd(op, len);
        field.set(&mut c, u64::from(port));
        self.ctx.hca.cmd().exec(&c, STATUS_OUT)?;
        Ok(())
    }

    /// Whether NIC RX flow tables match a VXLAN VNI
    /// (`flow_table_properties_nic_receive.ft_field_support.outer_vxlan_vni`,
    /// what mlx5_ib checks before a tunnel spec). Queried when asked.
    fn vxlan_flow_match(&self) -> Result<bool> {
        use mlx5_hw::ifc::{
            flow_table_fields_supported as ff, flow_table_nic_cap, flow_table_prop_layout,
        };
        let page =
            crate::caps::query_cap(self.ctx.hca.cmd(), crate::caps::CapType::FlowTable, true)?;
        let at = flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE.off
            + flow_table_prop_layout::FT_FIELD_SUPPORT.off;
        Ok(ff::OUTER_VXLAN_VNI.at(at).get(&page[..]) != 0)
    }

    /// A NIC RX flow table of 256 entries made the function's root: what
    /// [`FlowSteering::create_flow`] adds rules to.
    pub fn flow_steering(&self) -> Result<FlowSteering> {
        let hca = &self.ctx.hca;
        let mut i = cmd(Opcode::CreateFlowTable, create_flow_table_in::SIZE_BYTES);
        create_flow_table_in::TABLE_TYPE.set(&mut i, u64::from(FS_FT_NIC_RX));
        flow_table_context::LOG_SIZE
            .at(create_flow_table_in::FLOW_TABLE_CONTEXT.off)
            .set(&mut i, u64::from(LOG_TABLE));
        let out = hca.cmd().exec(&i, create_flow_table_out::SIZE_BYTES)?;
        let table = create_flow_table_out::TABLE_ID.get(&out) as u32;
        let s = FlowSteering {
            ctx: self.clone(),
            table,
            groups: Vec::new(),
        };
        let mut i = cmd(Opcode::SetFlowTableRoot, set_flow_table_root_in::SIZE_BYTES);
        set_flow_table_root_in::TABLE_TYPE.set(&mut i, u64::from(FS_FT_NIC_RX));
        set_flow_table_root_in::TABLE_ID.set(&mut i, u64::from(table));
        hca.cmd().exec(&i, STATUS_OUT)?;
        Ok(s)
    }
}

impl FlowSteering {
    /// `ibv_create_flow`: a rule for `spec` doing `action`.
    pub fn create_flow(&mut self, spec: &FlowSpec, action: FlowAction<'_>) -> Result<Flow> {
        self.create_flow_tagged(spec, action, 0)
    }

    /// [`create_flow`](Self::create_flow) with a flow tag
    /// (`IBV_FLOW_SPEC_ACTION_TAG`): the packets it steers carry `tag` in
    /// their completions ([`crate::raw_eth::RxPkt::flow_tag`], verbs'
    /// `ibv_wc_read_flow_tag`). At most 24 bits (mlx5's
    /// `MLX5_FLOW_TAG_MASK`); 0 is no tag.
    pub fn create_flow_tagged(
        &mut self,
        spec: &FlowSpec,
        action: FlowAction<'_>,
        tag: u32,
    ) -> Result<Flow> {
        if tag > mlx5_hw::cqe::CQE_QPN_MASK {
            return Err(Error::Invalid("flow tag wider than 24 bits"));
        }
        // A QP polled through verbs CQs is found by its receive CQEs'
        // user index only when their QP-number field (the tag) names no
        // QP: a tag could name another.
        if tag != 0 && matches!(action, FlowAction::Queue(q) if q.is_polled()) {
            return Err(Error::Invalid(
                "flow tag toward a raw packet QP polled through verbs CQs",
            ));
        }
        let (mask, value, parts) = spec.images()?;
        if spec.vxlan_vni.is_some() && !self.ctx.vxlan_flow_match()? {
            return Err(Error::NotSupported(
                "flow spec: VXLAN (no outer_vxlan_vni in the NIC RX flow-table caps)",
            ));
        }
        self.insert(&mask, &value, parts, action, tag)
    }

    /// A rule given in the device's own format (mlx5dv's matcher and
    /// flow: `fte_match_param` images of the mask and the value, as long
    /// as the caller's, the rest zero; `criteria` its
    /// `match_criteria_enable`, which parts the mask covers) doing
    /// `action`. The value is masked before it goes (the device compares
    /// the masked packet with it).
    pub fn create_flow_matched(
        &mut self,
        mask: &[u8],
        value: &[u8],
        criteria: u8,
        action: FlowAction<'_>,
    ) -> Result<Flow> {
        let full = fte_match_param::SIZE_BYTES;
        if mask.len() > full || value.len() > full {
            return Err(Error::Invalid("flow match: longer than fte_match_param"));
        }
        if criteria & !(MATCH_OUTER_HEADERS | MATCH_MISC_PARAMETERS | MATCH_INNER_HEADERS) != 0 {
            return Err(Error::NotSupported(
                "flow match: criteria beyond outer, misc and inner headers",
            ));
        }
        let mut m = vec![0u8; full];
        m[..mask.len()].copy_from_slice(mask);
        let mut v = vec![0u8; full];
        for (o, (x, k)) in v.iter_mut().zip(value.iter().zip(&m)) {
            *o = x & k;
        }
        self.insert(&m, &v, criteria, action, 0)
    }

    /// Sets a rule of `mask`/`value` (whole `fte_match_param` images) in
    /// the group of `mask`, tagged `tag`, doing `action`.
    fn insert(
        &mut self,
        mask: &[u8],
        value: &[u8],
        parts: u8,
        action: FlowAction<'_>,
        tag: u32,
    ) -> Result<Flow> {
        let g = self.group_for(mask, parts)?;
        let group = &mut self.groups[g];
        let Some(slot) = group.used.iter().position(|u| !u) else {
            return Err(Error::Invalid("flow group full"));
        };
        let index = group.start + slot as u32;
        let (gid, table) = (group.id, self.table);
        let fc = set_fte_in::FLOW_CONTEXT.off;
        let dests = (fc + flow_context::DESTINATION.off) / 8;
        let mut i = cmd(
            Opcode::SetFlowTableEntry,
            dests + dest_format_struct::SIZE_BYTES,
        );
        set_fte_in::TABLE_TYPE.set(&mut i, u64::from(FS_FT_NIC_RX));
        set_fte_in::TABLE_ID.set(&mut i, u64::from(table));
        set_fte_in::FLOW_INDEX.set(&mut i, u64::from(index));
        flow_context::GROUP_ID.at(fc).set(&mut i, u64::from(gid));
        flow_context::FLOW_TAG.at(fc).set(&mut i, u64::from(tag));
        let tir = match action {
            FlowAction::Queue(qp) => Some(qp.tirn()),
            FlowAction::Rss(qp) => Some(qp.tirn()),
            FlowAction::Drop => None,
        };
        match tir {
            Some(tirn) => {
                flow_context::ACTION
                    .at(fc)
                    .set(&mut i, FLOW_CONTEXT_ACTION_FWD_DEST);
                flow_context::DESTINATION_LIST_SIZE.at(fc).set(&mut i, 1);
                dest_format_struct::DESTINATION_TYPE.set(&mut i[dests..], DEST_TIR);
                dest_format_struct::DESTINATION_ID.set(&mut i[dests..], u64::from(tirn));
            }
            None => {
                flow_context::ACTION
                    .at(fc)
                    .set(&mut i, FLOW_CONTEXT_ACTION_DROP);
            }
        }
        let at = (fc + flow_context::MATCH_VALUE.off) / 8;
        i[at..at + value.len()].copy_from_slice(value);
        self.ctx.ctx.hca.cmd().exec(&i, STATUS_OUT)?;
        self.groups[g].used[slot] = true;
        Ok(Flow { index })
    }

    /// `ibv_destroy_flow`.
    pub fn destroy_flow(&mut self, f: Flow) -> Result<()> {
        let mut i = cmd(Opcode::DeleteFlowTableEntry, delete_fte_in::SIZE_BYTES);
        delete_fte_in::TABLE_TYPE.set(&mut i, u64::from(FS_FT_NIC_RX));
        delete_fte_in::TABLE_ID.set(&mut i, u64::from(self.table));
        delete_fte_in::FLOW_INDEX.set(&mut i, u64::from(f.index));
        self.ctx.ctx.hca.cmd().exec(&i, STATUS_OUT)?;
        for g in &mut self.groups {
            if (g.start..g.start + GROUP).contains(&f.index) {
                g.used[(f.index - g.start) as usize] = false;
            }
        }
        Ok(())
    }

    /// The group whose criteria are `mask`, made if none is.
    fn group_for(&mut self, mask: &[u8], parts: u8) -> Result<usize> {
        if let Some(g) = self.groups.iter().position(|g| g.mask == mask) {
            return Ok(g);
        }
        let start = self.groups.len() as u32 * GROUP;
        if start + GROUP > 1 << LOG_TABLE {
            return Err(Error::Invalid("flow table full"));
        }
        let mut i = cmd(Opcode::CreateFlowGroup, create_flow_group_in::SIZE_BYTES);
        create_flow_group_in::TABLE_TYPE.set(&mut i, u64::from(FS_FT_NIC_RX));
        create_flow_group_in::TABLE_ID.set(&mut i, u64::from(self.table));
        create_flow_group_in::START_FLOW_INDEX.set(&mut i, u64::from(start));
        create_flow_group_in::END_FLOW_INDEX.set(&mut i, u64::from(start + GROUP - 1));
        create_flow_group_in::MATCH_CRITERIA_ENABLE.set(&mut i, u64::from(parts));
        let at = create_flow_group_in::MATCH_CRITERIA.off / 8;
        i[at..at + mask.len()].copy_from_slice(mask);
        let out = self
            .ctx
            .ctx
            .hca
            .cmd()
            .exec(&i, create_flow_group_out::SIZE_BYTES)?;
        self.groups.push(Group {
            mask: mask.to_vec(),
            id: create_flow_group_out::GROUP_ID.get(&out) as u32,
            start,
            used: vec![false; GROUP as usize],
        });
        Ok(self.groups.len() - 1)
    }

    /// Deletes every rule, group and the table (the root goes back to the
    /// default).
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let hca = &self.ctx.ctx.hca;
        for g in std::mem::take(&mut self.groups) {
            for (k, _) in g.used.iter().enumerate().filter(|(_, u)| **u) {
                let mut i = cmd(Opcode::DeleteFlowTableEntry, delete_fte_in::SIZE_BYTES);
                delete_fte_in::TABLE_TYPE.set(&mut i, u64::from(FS_FT_NIC_RX));
                delete_fte_in::TABLE_ID.set(&mut i, u64::from(self.table));
                delete_fte_in::FLOW_INDEX.set(&mut i, u64::from(g.start + k as u32));
                hca.cmd().exec(&i, STATUS_OUT)?;
            }
            let mut i = cmd(Opcode::DestroyFlowGroup, destroy_flow_group_in::SIZE_BYTES);
            destroy_flow_group_in::TABLE_TYPE.set(&mut i, u64::from(FS_FT_NIC_RX));
            destroy_flow_group_in::TABLE_ID.set(&mut i, u64::from(self.table));
            destroy_flow_group_in::GROUP_ID.set(&mut i, u64::from(g.id));
            hca.cmd().exec(&i, STATUS_OUT)?;
        }
        if self.table != 0 {
            let mut i = cmd(Opcode::DestroyFlowTable, destroy_flow_table_in::SIZE_BYTES);
            destroy_flow_table_in::TABLE_TYPE.set(&mut i, u64::from(FS_FT_NIC_RX));
            destroy_flow_table_in::TABLE_ID.set(&mut i, u64::from(self.table));
            hca.cmd().exec(&i, STATUS_OUT)?;
            self.table = 0;
        }
        Ok(())
    }
}

impl Drop for FlowSteering {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!(error = %e, "flow steering teardown");
        }
    }
}
