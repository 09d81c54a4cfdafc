//! Flow steering: flow tables, flow groups, flow table entries (FTEs) and
//! flow counters (CREATE/DESTROY/MODIFY/QUERY_FLOW_TABLE,
//! CREATE/DESTROY_FLOW_GROUP, SET/DELETE/QUERY_FLOW_TABLE_ENTRY,
//! SET_FLOW_TABLE_ROOT, ALLOC/DEALLOC_FLOW_COUNTER).
//!
//! A flow table has a type (NIC RX, NIC TX, sniffer, RDMA RX/TX: the types
//! whose `ft_support` the flow-table capabilities advertise), a level below
//! `max_ft_level` and `2^log_size` entries (at most `2^log_max_ft_size`).
//! Groups split a table's index range into disjoint ranges with a match
//! criteria; an FTE sits at an index inside its group. Each type has one
//! root table (where packets enter), set by SET_FLOW_TABLE_ROOT. A table's
//! miss path and an FTE's destinations may only go to an existing table of
//! the same type at a deeper level (unless the FTE sets
//! `ignore_flow_level`).
//!
//! Busy objects are refused with bad resource state, as firmware does: a
//! table that still has groups, is another table's miss target or an FTE's
//! destination, or is the root while other tables of its type exist (the
//! root must move first; the last table of a type may go, and the type's
//! root falls back to the default, which is what Linux's fs_core relies
//! on); a group that still has FTEs; a counter an FTE still counts into.
//! NIC RX tables steer raw Ethernet frames
//! ([`crate::transport::steer`], rebuilt after every command that changes
//! them); RoCE is delivered by QP number, never through the tables.
//! QUERY_FLOW_COUNTER reads what the data path counted.

use std::collections::BTreeMap;

use mlx5_hw::bits::BitField;
use mlx5_hw::ifc::{
    alloc_flow_counter_in, alloc_flow_counter_out, create_flow_group_in, create_flow_group_out,
    create_flow_table_in, create_flow_table_out, dealloc_flow_counter_in, delete_fte_in,
    dest_format_struct, destroy_flow_group_in, destroy_flow_table_in, extended_dest_format,
    flow_context, flow_counter_list, flow_table_context, flow_table_nic_cap,
    flow_table_prop_layout, fte_match_param, modify_flow_table_in, query_flow_table_in,
    query_flow_table_out, query_fte_in, query_fte_out, set_flow_table_root_in, set_fte_in,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Fail, Firmware};
use crate::profile::cap_type;

/// `table_miss_action`: go to the default miss behaviour.
const MISS_ACTION_DEF: u8 = 0;
/// `table_miss_action`: go to `table_miss_id`.
const MISS_ACTION_FWD: u8 = 1;
/// MODIFY_FLOW_TABLE `modify_field_select`: the miss table.
const MODIFY_MISS_TABLE_ID: u64 = 1 << 0;
/// SET_FLOW_TABLE_ENTRY op_mod: create / modify an existing entry.
const SET_FTE_CREATE: u16 = 0;
const SET_FTE_MODIFY: u16 = 1;
/// flow_context action bits (mlx5_ifc.h MLX5_FLOW_CONTEXT_ACTION_*).
use mlx5_hw::eth::{
    FLOW_CONTEXT_ACTION_ALLOW as ACTION_ALLOW, FLOW_CONTEXT_ACTION_COUNT as ACTION_COUNT,
    FLOW_CONTEXT_ACTION_DROP as ACTION_DROP, FLOW_CONTEXT_ACTION_FWD_DEST as ACTION_FWD_DEST,
};
/// dest_format_struct destination_type (MLX5_IFC_FLOW_DESTINATION_TYPE_*).
const DEST_VPORT: u64 = 0x0;
const DEST_FLOW_TABLE: u64 = 0x1;
const DEST_TIR: u64 = 0x2;
const DEST_UPLINK: u64 = 0x8;
/// Flow counters handed out per ALLOC_FLOW_COUNTER bulk unit
/// (`flow_counter_bulk` counts units of 128).
const COUNTER_BULK_UNIT: u32 = 128;
/// Flow counter ids are 24 bits wide here (id 0 is never handed out).
const MAX_COUNTER_ID: u32 = 1 << 24;
/// A bulk QUERY_FLOW_COUNTER starts at a multiple of 4 and spans a
/// multiple of 4 ids.
const QUERY_BULK_ALIGN: u32 = 4;

/// One flow table.
#[derive(Debug, Clone)]
pub(crate) struct FlowTable {
    pub ty: u8,
    pub level: u8,
    pub log_size: u8,
    pub miss_action: u8,
    pub miss_id: u32,
    /// Groups by id.
    pub groups: BTreeMap<u32, FlowGroup>,
    /// Entries by flow index.
    pub ftes: BTreeMap<u32, Fte>,
}

/// One flow group: an inclusive index range of its table.
#[derive(Debug, Clone)]
pub(crate) struct FlowGroup {
    pub start: u32,
    pub end: u32,
    /// `match_criteria_enable`: which parts of the match parameters count.
    pub enable: u8,
    /// `match_criteria` (an `fte_match_param` of masks), as written.
    pub criteria: Vec<u8>,
}

/// One flow table entry, kept as the driver wrote it (QUERY_FTE returns
/// it) plus what the busy checks need.
#[derive(Debug, Clone)]
pub(crate) struct Fte {
    pub group: u32,
    /// Flow tables this entry forwards to.
    pub tables: Vec<u32>,
    /// TIRs this entry forwards to (fw/tir.rs).
    pub tirs: Vec<u32>,
    /// Flow counters this entry counts into.
    pub counters: Vec<u32>,
    /// The flow_context and its destination list, as written.
    pub context: Vec<u8>,
}

/// Flow steering state of the function.
#[derive(Debug, Clone, Default)]
pub(crate) struct Steering {
    pub tables: BTreeMap<u32, FlowTable>,
    /// Root table per table type.
    pub roots: BTreeMap<u8, u32>,
    /// Flow counter bulks: first id -> number of counters.
    pub counters: BTreeMap<u32, u32>,
    next_group: u32,
}

impl Steering {
    pub(crate) fn groups(&self) -> usize {
        self.tables.values().map(|t| t.groups.len()).sum()
    }

    /// Whether a flow entry forwards to TIR `tirn`.
    pub(crate) fn forwards_to_tir(&self, tirn: u32) -> bool {
        self.tables
            .values()
            .any(|t| t.ftes.values().any(|f| f.tirs.contains(&tirn)))
    }

    pub(crate) fn ftes(&self) -> usize {
        self.tables.values().map(|t| t.ftes.len()).sum()
    }

    /// Objects alive (tables, groups, entries, counters).
    pub(crate) fn objects(&self) -> usize {
        self.tables.len() + self.groups() + self.ftes() + self.counters.len()
    }

    /// Flow counters alive (every id of every bulk).
    pub(crate) fn counter_ids(&self) -> usize {
        self.counters.values().map(|&n| n as usize).sum()
    }

    /// Whether counter `id` belongs to an allocated bulk.
    fn counter_alive(&self, id: u32) -> bool {
        self.counters
            .range(..=id)
            .next_back()
            .is_some_and(|(&base, &n)| id < base + n)
    }

    /// Whether a table other than `id` forwards to table `id`, by
    /// its miss path or from an entry.
    fn referenced(&self, id: u32) -> bool {
        self.tables.iter().any(|(&tid, t)| {
            tid != id
                && ((t.miss_action == MISS_ACTION_FWD && t.miss_id == id)
                    || t.ftes.values().any(|f| f.tables.contains(&id)))
        })
    }
}

/// Place of the flow_table_prop_layout for `ty` in the flow-table
/// capability page, if the NIC page describes that type.
fn prop_of(ty: u8) -> Option<BitField> {
    use flow_table_nic_cap as c;
    Some(match ty {
        0x0 => c::FLOW_TABLE_PROPERTIES_NIC_RECEIVE,
        0x1 => c::FLOW_TABLE_PROPERTIES_NIC_TRANSMIT,
        0x5 => c::FLOW_TABLE_PROPERTIES_NIC_RECEIVE_SNIFFER,
        0x6 => c::FLOW_TABLE_PROPERTIES_NIC_TRANSMIT_SNIFFER,
        0x7 => c::FLOW_TABLE_PROPERTIES_NIC_RECEIVE_RDMA,
        0x8 => c::FLOW_TABLE_PROPERTIES_NIC_TRANSMIT_RDMA,
        _ => return None,
    })
}

/// Reads one flow_table_context of `input` (at bit `at`).
fn ctx(input: &[u8], at: usize, f: BitField) -> u64 {
    f.at(at).get(input)
}

impl Firmware {
    /// A flow-table property of table type `ty` (current capability).
    fn ft_prop(&self, ty: u8, f: BitField) -> Option<u64> {
        let base = prop_of(ty)?;
        Some(self.caps.get(cap_type::FLOW_TABLE, f.at(base.off)))
    }

    /// Checks a table type: one the capabilities support.
    fn ft_type(&self, ty: u64) -> Result<u8, Fail> {
        let ty = u8::try_from(ty).map_err(|_| fail(CmdStatus::BadParameter, synd::FT_BAD_TYPE))?;
        match self.ft_prop(ty, flow_table_prop_layout::FT_SUPPORT) {
            Some(1) => Ok(ty),
            _ => Err(fail(CmdStatus::BadParameter, synd::FT_BAD_TYPE)),
        }
    }

    /// `other_vport`: this function has no vports to manage (no e-switch).
    fn ft_vport(other_vport: u64) -> Result<(), Fail> {
        if other_vport != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::FT_OTHER_VPORT));
        }
        Ok(())
    }

    /// The table `id` of type `ty`.
    fn ft_table(&self, ty: u8, id: u64) -> Result<&FlowTable, Fail> {
        match u32::try_from(id)
            .ok()
            .and_then(|id| self.steering.tables.get(&id))
        {
            Some(t) if t.ty == ty => Ok(t),
            _ => Err(fail(CmdStatus::BadResource, synd::FT_UNKNOWN)),
        }
    }

    /// Checks a miss path from a table at `level` of type `ty`.
    fn ft_check_miss(&self, ty: u8, level: u8, action: u8, miss_id: u32) -> Result<(), Fail> {
        match action {
            MISS_ACTION_DEF => Ok(()),
            MISS_ACTION_FWD => match self.steering.tables.get(&miss_id) {
                Some(t) if t.ty == ty && t.level > level => Ok(()),
                Some(_) => Err(fail(CmdStatus::BadParameter, synd::FT_BAD_MISS_TABLE)),
                None => Err(fail(CmdStatus::BadResource, synd::FT_BAD_MISS_TABLE)),
            },
            _ => Err(fail(CmdStatus::BadParameter, synd::FT_BAD_MISS_ACTION)),
        }
    }

    pub(super) fn create_flow_table(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use create_flow_table_in as i;
        sized(
            input,
            outlen,
            i::SIZE_BYTES,
            create_flow_table_out::SIZE_BYTES,
        )?;
        Self::ft_vport(i::OTHER_VPORT.get(input))?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        let at = i::FLOW_TABLE_CONTEXT.off;
        let level = ctx(input, at, flow_table_context::LEVEL) as u8;
        let log_size = ctx(input, at, flow_table_context::LOG_SIZE) as u8;
        let prop = |f| self.ft_prop(ty, f).unwrap_or(0);
        if u64::from(level) >= prop(flow_table_prop_layout::MAX_FT_LEVEL) {
            return Err(fail(CmdStatus::BadParameter, synd::FT_BAD_LEVEL));
        }
        if u64::from(log_size) > prop(flow_table_prop_layout::LOG_MAX_FT_SIZE) {
            return Err(fail(CmdStatus::BadParameter, synd::FT_BAD_SIZE));
        }
        // Features the capabilities do not offer.
        if (ctx(input, at, flow_table_context::REFORMAT_EN) != 0
            && prop(flow_table_prop_layout::REFORMAT) == 0)
            || (ctx(input, at, flow_table_context::DECAP_EN) != 0
                && prop(flow_table_prop_layout::DECAP) == 0)
            || (ctx(input, at, flow_table_context::TERMINATION_TABLE) != 0
                && prop(flow_table_prop_layout::TERMINATION_TABLE) == 0)
            || ctx(input, at, flow_table_context::SW_OWNER) != 0
        {
            return Err(fail(CmdStatus::BadParameter, synd::FT_UNSUPPORTED));
        }
        let miss_action = ctx(input, at, flow_table_context::TABLE_MISS_ACTION) as u8;
        let miss_id = ctx(input, at, flow_table_context::TABLE_MISS_ID) as u32;
        self.ft_check_miss(ty, level, miss_action, miss_id)?;
        let max = 1u64 << prop(flow_table_prop_layout::LOG_MAX_FT_NUM).clamp(1, 24);
        let Some(id) = (1..max as u32).find(|n| !self.steering.tables.contains_key(n)) else {
            return Err(fail(CmdStatus::NoResources, synd::FT_EXHAUSTED));
        };
        self.steering.tables.insert(
            id,
            FlowTable {
                ty,
                level,
                log_size,
                miss_action,
                miss_id: if miss_action == MISS_ACTION_FWD {
                    miss_id
                } else {
                    0
                },
                groups: BTreeMap::new(),
                ftes: BTreeMap::new(),
            },
        );
        let mut out = vec![0u8; create_flow_table_out::SIZE_BYTES];
        create_flow_table_out::TABLE_ID.set(&mut out, u64::from(id));
        Ok(out)
    }

    pub(super) fn destroy_flow_table(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use destroy_flow_table_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        Self::ft_vport(i::OTHER_VPORT.get(input))?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        let t = self.ft_table(ty, i::TABLE_ID.get(input))?;
        let id = i::TABLE_ID.get(input) as u32;
        if !t.groups.is_empty() || !t.ftes.is_empty() {
            return Err(fail(CmdStatus::BadResourceState, synd::FT_NOT_EMPTY));
        }
        if self.steering.referenced(id) {
            return Err(fail(CmdStatus::BadResourceState, synd::FT_REFERENCED));
        }
        if self.steering.roots.get(&ty) == Some(&id) {
            let others = self
                .steering
                .tables
                .iter()
                .any(|(&k, t)| k != id && t.ty == ty);
            if others {
                return Err(fail(CmdStatus::BadResourceState, synd::FT_IS_ROOT));
            }
            self.steering.roots.remove(&ty);
        }
        self.steering.tables.remove(&id);
        Ok(vec![0; 0x10])
    }

    pub(super) fn modify_flow_table(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use modify_flow_table_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        Self::ft_vport(i::OTHER_VPORT.get(input))?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        let level = self.ft_table(ty, i::TABLE_ID.get(input))?.level;
        let id = i::TABLE_ID.get(input) as u32;
        let select = i::MODIFY_FIELD_SELECT.get(input);
        if select & !MODIFY_MISS_TABLE_ID != 0 {
            // LAG demux tables are not modelled.
            return Err(fail(CmdStatus::BadParameter, synd::FT_UNSUPPORTED));
        }
        if select & MODIFY_MISS_TABLE_ID != 0 {
            if self.ft_prop(ty, flow_table_prop_layout::FLOW_TABLE_MODIFY) != Some(1) {
                return Err(fail(CmdStatus::BadParameter, synd::FT_UNSUPPORTED));
            }
            let at = i::FLOW_TABLE_CONTEXT.off;
            let action = ctx(input, at, flow_table_context::TABLE_MISS_ACTION) as u8;
            let miss_id = ctx(input, at, flow_table_context::TABLE_MISS_ID) as u32;
            self.ft_check_miss(ty, level, action, miss_id)?;
            if let Some(t) = self.steering.tables.get_mut(&id) {
                t.miss_action = action;
                t.miss_id = if action == MISS_ACTION_FWD {
                    miss_id
                } else {
                    0
                };
            }
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_flow_table(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use query_flow_table_in as i;
        sized(
            input,
            outlen,
            i::SIZE_BYTES,
            query_flow_table_out::SIZE_BYTES,
        )?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        let t = self.ft_table(ty, i::TABLE_ID.get(input))?;
        let mut out = vec![0u8; query_flow_table_out::SIZE_BYTES];
        let at = query_flow_table_out::FLOW_TABLE_CONTEXT.off;
        let set = |out: &mut Vec<u8>, f: BitField, v: u64| f.at(at).set(out, v);
        set(&mut out, flow_table_context::LEVEL, u64::from(t.level));
        set(
            &mut out,
            flow_table_context::LOG_SIZE,
            u64::from(t.log_size),
        );
        set(
            &mut out,
            flow_table_context::TABLE_MISS_ACTION,
            u64::from(t.miss_action),
        );
        set(
            &mut out,
            flow_table_context::TABLE_MISS_ID,
            u64::from(t.miss_id),
        );
        Ok(out)
    }

    pub(super) fn set_flow_table_root(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use set_flow_table_root_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        Self::ft_vport(i::OTHER_VPORT.get(input))?;
        if i::TABLE_OF_OTHER_VPORT.get(input) != 0
            || i::TABLE_ESWITCH_OWNER_VHCA_ID_VALID.get(input) != 0
        {
            return Err(fail(CmdStatus::BadParameter, synd::FT_OTHER_VPORT));
        }
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        match i::OP_MOD.get(input) {
            // Connect.
            0 => {
                self.ft_table(ty, i::TABLE_ID.get(input))?;
                let id = i::TABLE_ID.get(input) as u32;
                // Replacing a root needs modify_root.
                let other = self.steering.roots.get(&ty).is_some_and(|&r| r != id);
                if other && self.ft_prop(ty, flow_table_prop_layout::MODIFY_ROOT) != Some(1) {
                    return Err(fail(CmdStatus::BadParameter, synd::FT_UNSUPPORTED));
                }
                self.steering.roots.insert(ty, id);
            }
            // Disconnect: back to the default.
            1 => {
                if self.ft_prop(ty, flow_table_prop_layout::RESET_ROOT_TO_DEFAULT) != Some(1) {
                    return Err(fail(CmdStatus::BadParameter, synd::FT_UNSUPPORTED));
                }
                self.steering.roots.remove(&ty);
            }
            _ => return Err(fail(CmdStatus::BadParameter, synd::FT_BAD_OP_MOD)),
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn create_flow_group(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use create_flow_group_in as i;
        sized(
            input,
            outlen,
            i::SIZE_BYTES,
            create_flow_group_out::SIZE_BYTES,
        )?;
        Self::ft_vport(i::OTHER_VPORT.get(input))?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        let t = self.ft_table(ty, i::TABLE_ID.get(input))?;
        if i::GROUP_TYPE.get(input) != 0 {
            // Hash-split and range groups are not modelled.
            return Err(fail(CmdStatus::BadParameter, synd::FT_UNSUPPORTED));
        }
        let start = i::START_FLOW_INDEX.get(input) as u32;
        let end = i::END_FLOW_INDEX.get(input) as u32;
        let size = 1u64 << t.log_size;
        if start > end || u64::from(end) >= size {
            return Err(fail(CmdStatus::BadParameter, synd::FG_BAD_RANGE));
        }
        if t.groups.values().any(|g| start <= g.end && g.start <= end) {
            return Err(fail(CmdStatus::BadParameter, synd::FG_OVERLAP));
        }
        let criteria_enable = i::MATCH_CRITERIA_ENABLE.get(input) as u8;
        // Bits 0..=6: outer, misc, inner, misc 2..5; nothing above.
        if criteria_enable & 0x80 != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::FG_BAD_CRITERIA));
        }
        if ty == mlx5_hw::eth::FS_FT_NIC_RX
            && criteria_enable & !crate::transport::steer::MATCHED != 0
        {
            // The NIC RX pipeline matches the outer and inner headers and
            // the misc parameters; misc 2..5 (metadata, MPLS, ...) are not
            // parsed.
            return Err(fail(CmdStatus::BadParameter, synd::FG_BAD_CRITERIA));
        }
        let criteria = input[i::MATCH_CRITERIA.off / 8..][..fte_match_param::SIZE_BYTES].to_vec();
        self.steering.next_group = self.steering.next_group.wrapping_add(1).max(1) & 0xff_ffff;
        let gid = self.steering.next_group.max(1);
        let id = i::TABLE_ID.get(input) as u32;
        if let Some(t) = self.steering.tables.get_mut(&id) {
            t.groups.insert(
                gid,
                FlowGroup {
                    start,
                    end,
                    enable: criteria_enable,
                    criteria,
                },
            );
        }
        let mut out = vec![0u8; create_flow_group_out::SIZE_BYTES];
        create_flow_group_out::GROUP_ID.set(&mut out, u64::from(gid));
        Ok(out)
    }

    pub(super) fn destroy_flow_group(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use destroy_flow_group_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        Self::ft_vport(i::OTHER_VPORT.get(input))?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        let t = self.ft_table(ty, i::TABLE_ID.get(input))?;
        let gid = i::GROUP_ID.get(input) as u32;
        if !t.groups.contains_key(&gid) {
            return Err(fail(CmdStatus::BadResource, synd::FG_UNKNOWN));
        }
        if t.ftes.values().any(|f| f.group == gid) {
            return Err(fail(CmdStatus::BadResourceState, synd::FG_NOT_EMPTY));
        }
        let id = i::TABLE_ID.get(input) as u32;
        if let Some(t) = self.steering.tables.get_mut(&id) {
            t.groups.remove(&gid);
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn set_fte(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use set_fte_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        Self::ft_vport(i::OTHER_VPORT.get(input))?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        let t = self.ft_table(ty, i::TABLE_ID.get(input))?;
        let id = i::TABLE_ID.get(input) as u32;
        let op_mod = i::OP_MOD.get(input) as u16;
        let index = i::FLOW_INDEX.get(input) as u32;
        let fc = i::FLOW_CONTEXT.off;
        let get = |f: BitField| f.at(fc).get(input);
        let gid = get(flow_context::GROUP_ID) as u32;
        let Some(g) = t.groups.get(&gid) else {
            return Err(fail(CmdStatus::BadResource, synd::FG_UNKNOWN));
        };
        if index < g.start || index > g.end {
            return Err(fail(CmdStatus::BadParameter, synd::FTE_BAD_INDEX));
        }
        match (op_mod, t.ftes.get(&index)) {
            (SET_FTE_CREATE, Some(_)) => {
                return Err(fail(CmdStatus::BadResourceState, synd::FTE_EXISTS))
            }
            (SET_FTE_MODIFY, None) => return Err(fail(CmdStatus::BadResource, synd::FTE_UNKNOWN)),
            (SET_FTE_MODIFY, Some(_))
                if self.ft_prop(ty, flow_table_prop_layout::FLOW_MODIFY_EN) != Some(1) =>
            {
                return Err(fail(CmdStatus::BadParameter, synd::FT_UNSUPPORTED))
            }
            (SET_FTE_MODIFY, Some(f)) if f.group != gid => {
                return Err(fail(CmdStatus::BadParameter, synd::FTE_BAD_INDEX))
            }
            (SET_FTE_CREATE | SET_FTE_MODIFY, _) => {}
            _ => return Err(fail(CmdStatus::BadParameter, synd::FT_BAD_OP_MOD)),
        }
        let ignore_level = i::IGNORE_FLOW_LEVEL.get(input) != 0;
        if ignore_level && self.ft_prop(ty, flow_table_prop_layout::IGNORE_FLOW_LEVEL) != Some(1) {
            return Err(fail(CmdStatus::BadParameter, synd::FT_UNSUPPORTED));
        }
        let action = get(flow_context::ACTION);
        let ndest = get(flow_context::DESTINATION_LIST_SIZE) as usize;
        let ncount = get(flow_context::FLOW_COUNTER_LIST_SIZE) as usize;
        let extended = get(flow_context::EXTENDED_DESTINATION) != 0;
        // Allow, drop, forward and count; packet reformat, decap, modify
        // header, VLAN push/pop and the rest are refused: no profile's
        // flow table properties offer them (`reformat`, `decap`,
        // `max_modify_header_actions`, `pop_vlan`, `push_vlan` all 0).
        let known = ACTION_ALLOW | ACTION_DROP | ACTION_FWD_DEST | ACTION_COUNT;
        if action & !known != 0
            || (action & ACTION_FWD_DEST != 0) != (ndest > 0)
            || (action & ACTION_COUNT != 0) != (ncount > 0)
        {
            return Err(fail(CmdStatus::BadParameter, synd::FTE_BAD_ACTION));
        }
        let prop = |f| self.ft_prop(ty, f).unwrap_or(0);
        // A table type counts only where its `flow_counter` property says
        // so, into at most 2^`log_max_flow_counter` counters per entry
        // (the bound Linux's fs_cmd.c checks before it sends the list).
        if ndest > 1usize << prop(flow_table_prop_layout::LOG_MAX_DESTINATION).min(24)
            || (ncount > 0 && prop(flow_table_prop_layout::FLOW_COUNTER) == 0)
            || ncount > 1usize << prop(flow_table_prop_layout::LOG_MAX_FLOW_COUNTER).min(24)
        {
            return Err(fail(CmdStatus::BadParameter, synd::FTE_BAD_DEST));
        }
        // The destination list holds the forward destinations, then the
        // counters, every element of one size: 16 bytes each when
        // `extended_destination` is set, 8 otherwise (a flow_counter_list
        // in the first 8 bytes of its element).
        let stride = if extended {
            extended_dest_format::SIZE_BYTES
        } else {
            dest_format_struct::SIZE_BYTES
        };
        let dests = (fc + flow_context::DESTINATION.off) / 8;
        let need = dests + (ndest + ncount) * stride;
        if input.len() < need {
            return Err(fail(CmdStatus::BadInputLength, synd::BAD_INPUT_LENGTH));
        }
        let mut tables = Vec::new();
        let mut tirs = Vec::new();
        for k in 0..ndest {
            let d = &input[dests + k * stride..];
            let dty = dest_format_struct::DESTINATION_TYPE.get(d);
            let did = dest_format_struct::DESTINATION_ID.get(d) as u32;
            match dty {
                DEST_FLOW_TABLE => match self.steering.tables.get(&did) {
                    Some(to) if to.ty == ty && (ignore_level || to.level > t.level) => {
                        tables.push(did)
                    }
                    Some(_) => return Err(fail(CmdStatus::BadParameter, synd::FTE_BAD_DEST)),
                    None => return Err(fail(CmdStatus::BadResource, synd::FTE_BAD_DEST)),
                },
                // The function's own vport (no e-switch) or the uplink.
                DEST_VPORT if did == 0 => {}
                DEST_UPLINK => {}
                // A TIR of fw/tir.rs (what mlx5e's TTC table forwards to).
                DEST_TIR if self.eth.tirs.contains_key(&did) => tirs.push(did),
                DEST_TIR => return Err(fail(CmdStatus::BadResource, synd::FTE_BAD_DEST)),
                _ => return Err(fail(CmdStatus::BadParameter, synd::FTE_BAD_DEST)),
            }
        }
        let mut counters = Vec::new();
        let clist = dests + ndest * stride;
        for k in 0..ncount {
            let c = &input[clist + k * stride..];
            let cid = flow_counter_list::FLOW_COUNTER_ID.get(c) as u32;
            if !self.steering.counter_alive(cid) {
                return Err(fail(CmdStatus::BadResource, synd::FC_UNKNOWN));
            }
            counters.push(cid);
        }
        let context = input[fc / 8..need].to_vec();
        if let Some(t) = self.steering.tables.get_mut(&id) {
            t.ftes.insert(
                index,
                Fte {
                    group: gid,
                    tables,
                    tirs,
                    counters,
                    context,
                },
            );
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn delete_fte(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use delete_fte_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        Self::ft_vport(i::OTHER_VPORT.get(input))?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        self.ft_table(ty, i::TABLE_ID.get(input))?;
        let id = i::TABLE_ID.get(input) as u32;
        let index = i::FLOW_INDEX.get(input) as u32;
        let removed = self
            .steering
            .tables
            .get_mut(&id)
            .and_then(|t| t.ftes.remove(&index));
        match removed {
            Some(_) => Ok(vec![0; 0x10]),
            None => Err(fail(CmdStatus::BadResource, synd::FTE_UNKNOWN)),
        }
    }

    pub(super) fn query_fte(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use query_fte_in as i;
        sized(input, outlen, i::SIZE_BYTES, query_fte_out::SIZE_BYTES)?;
        let ty = self.ft_type(i::TABLE_TYPE.get(input))?;
        let t = self.ft_table(ty, i::TABLE_ID.get(input))?;
        let Some(f) = t.ftes.get(&(i::FLOW_INDEX.get(input) as u32)) else {
            return Err(fail(CmdStatus::BadResource, synd::FTE_UNKNOWN));
        };
        let at = query_fte_out::FLOW_CONTEXT.off / 8;
        let mut out = vec![
            0u8;
            (at + f.context.len())
                .min(outlen)
                .max(query_fte_out::SIZE_BYTES)
        ];
        let n = f.context.len().min(out.len() - at);
        out[at..at + n].copy_from_slice(&f.context[..n]);
        Ok(out)
    }

    pub(super) fn alloc_flow_counter(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use alloc_flow_counter_in as i;
        use mlx5_hw::ifc::cmd_hca_cap as g;
        sized(
            input,
            outlen,
            i::SIZE_BYTES,
            alloc_flow_counter_out::SIZE_BYTES,
        )?;
        let bulk = i::FLOW_COUNTER_BULK.get(input) as u32;
        let log = i::FLOW_COUNTER_BULK_LOG_SIZE.get(input) as u32;
        // flow_counter_bulk: bit k asks for 128 << k counters, where
        // flow_counter_bulk_alloc offers it; flow_counter_bulk_log_size:
        // 2^log counters, up to log_max_flow_counter_bulk.
        let n = match (bulk, log) {
            (0, 0) => 1,
            (b, 0)
                if b.is_power_of_two()
                    && u64::from(b) & self.cap(g::FLOW_COUNTER_BULK_ALLOC) != 0 =>
            {
                b * COUNTER_BULK_UNIT
            }
            (0, l) if u64::from(l) <= self.cap(g::LOG_MAX_FLOW_COUNTER_BULK).min(23) => 1 << l,
            _ => return Err(fail(CmdStatus::BadParameter, synd::FC_BAD_BULK)),
        };
        // max_flow_counter bounds the counters alive (ConnectX-4 firmware
        // 14.12 advertises none).
        let max = (self.cap(g::MAX_FLOW_COUNTER_31_16) << 16 | self.cap(g::MAX_FLOW_COUNTER_15_0))
            .min(1 << 24) as u32;
        let alive: u32 = self.steering.counters.values().sum();
        if alive + n > max {
            return Err(fail(CmdStatus::NoResources, synd::FC_EXHAUSTED));
        }
        // A bulk is n consecutive ids from a multiple of n (id 0 unused).
        let c = &self.steering.counters;
        let free = |b: u32| {
            c.range(..b + n)
                .next_back()
                .is_none_or(|(&base, &len)| base + len <= b)
        };
        let Some(base) = (1..MAX_COUNTER_ID / n).map(|k| k * n).find(|&b| free(b)) else {
            return Err(fail(CmdStatus::NoResources, synd::FC_EXHAUSTED));
        };
        self.steering.counters.insert(base, n);
        let mut out = vec![0u8; alloc_flow_counter_out::SIZE_BYTES];
        alloc_flow_counter_out::FLOW_COUNTER_ID.set(&mut out, u64::from(base));
        Ok(out)
    }

    /// DEALLOC_FLOW_COUNTER names a bulk by its first id and frees it whole.
    pub(super) fn dealloc_flow_counter(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use dealloc_flow_counter_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        let id = i::FLOW_COUNTER_ID.get(input) as u32;
        let Some(&n) = self.steering.counters.get(&id) else {
            return Err(fail(CmdStatus::BadResource, synd::FC_UNKNOWN));
        };
        let used = self.steering.tables.values().any(|t| {
            t.ftes
                .values()
                .any(|f| f.counters.iter().any(|c| (id..id + n).contains(c)))
        });
        if used {
            return Err(fail(CmdStatus::BadResourceState, synd::FC_IN_USE));
        }
        self.steering.counters.remove(&id);
        Ok(vec![0; 0x10])
    }
}

impl Firmware {
    /// QUERY_FLOW_COUNTER: packets and octets of one counter
    /// (`num_of_counters` 0), or of a bulk of `num_of_counters` ids from
    /// `flow_counter_id`, as the data path counted them (`clear` zeroes
    /// them after the read).
    ///
    /// A bulk query starts at an id aligned to 4 and spans a multiple of 4
    /// ids (mlx5_ifc.h and Linux's fs_counters.c: "first id must be
    /// aligned to 4 when using bulk query"); Linux aligns its range down
    /// from the lowest counter it tracks and up past the highest, so the
    /// range may hold ids no bulk has (id 0 is never one): those read
    /// zero. A range without one allocated counter names nothing (bad
    /// resource), as does a single query of an id no bulk has.
    pub(super) fn query_flow_counter(
        &mut self,
        inner: &crate::Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        use mlx5_hw::ifc::{
            query_flow_counter_in as i, query_flow_counter_out as o, traffic_counter,
        };
        let id = i::FLOW_COUNTER_ID.get(input) as u32;
        let bulk = i::NUM_OF_COUNTERS.get(input) as u32;
        let n = bulk.max(1);
        let need = o::SIZE_BYTES + n as usize * traffic_counter::SIZE_BYTES;
        sized(input, outlen, i::SIZE_BYTES, need)?;
        if bulk > 0 && (id % QUERY_BULK_ALIGN != 0 || bulk % QUERY_BULK_ALIGN != 0) {
            return Err(fail(CmdStatus::BadParameter, synd::FC_BAD_BULK));
        }
        let Some(end) = id.checked_add(n).filter(|&e| e <= MAX_COUNTER_ID) else {
            return Err(fail(CmdStatus::BadParameter, synd::FC_BAD_BULK));
        };
        let alive = |k: u32| self.steering.counter_alive(k);
        let named = if bulk == 0 {
            alive(id)
        } else {
            self.steering
                .counters
                .range(..end)
                .next_back()
                .is_some_and(|(&base, &len)| base + len > id)
        };
        if !named {
            return Err(fail(CmdStatus::BadResource, synd::FC_UNKNOWN));
        }
        let rx = &inner.rdma.eth_rx;
        let mut out = vec![0u8; need];
        for k in (id..end).filter(|&k| alive(k)) {
            let [packets, octets] = rx.flow_count(k);
            let at = o::SIZE_BYTES + (k - id) as usize * traffic_counter::SIZE_BYTES;
            traffic_counter::PACKETS.set(&mut out[at..], packets);
            traffic_counter::OCTETS.set(&mut out[at..], octets);
        }
        if i::CLEAR.get(input) != 0 {
            rx.clear_flow_counts(id, n);
        }
        Ok(out)
    }
}
