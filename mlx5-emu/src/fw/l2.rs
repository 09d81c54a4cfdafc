//! SET_L2_TABLE_ENTRY / DELETE_L2_TABLE_ENTRY: the L2 table of the port's
//! multi-physical-function switch (MPFS), where mlx5e's lib/mpfs.c puts
//! every unicast MAC its netdev answers to, at an index of its choosing
//! below `1 << log_max_l2_table`; and QUERY_VPORT_COUNTER, the function's
//! own vport traffic (mlx5e's "vport" statistics group).

use std::sync::atomic::Ordering;

use mlx5_hw::ifc::{
    cmd_hca_cap, delete_l2_table_entry_in, delete_l2_table_entry_out, mac_address_layout,
    query_vport_counter_in, query_vport_counter_out, set_l2_table_entry_in, set_l2_table_entry_out,
    traffic_counter,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::Inner;

/// One L2 table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct L2Entry {
    /// The MAC address (48 bits).
    pub mac: u64,
    /// The VLAN it is bound to, if `vlan_valid`.
    pub vlan: Option<u16>,
}

impl Firmware {
    /// The table's size: `1 << log_max_l2_table`.
    fn l2_table_size(&self) -> u32 {
        1u32 << self.cap(cmd_hca_cap::LOG_MAX_L2_TABLE).min(24)
    }

    /// The L2 table's MACs to the data path (the vport's unicast
    /// addresses for its local loopback, `transport::eth_rx::LocalLb`).
    fn publish_l2(&self, inner: &Inner) {
        let macs = self.eth.l2_table.values().map(|e| e.mac).collect();
        *crate::transport::wlock(&inner.rdma.eth_rx.local_lb.l2) = macs;
    }

    pub(super) fn set_l2_table_entry(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        use set_l2_table_entry_in as i;
        sized(
            input,
            outlen,
            i::SIZE_BYTES,
            set_l2_table_entry_out::SIZE_BYTES,
        )?;
        let index = i::TABLE_INDEX.get(input) as u32;
        if index >= self.l2_table_size() {
            return Err(fail(CmdStatus::BadParameter, synd::L2_BAD_INDEX));
        }
        let m = &input[i::MAC_ADDRESS.off / 8..][..mac_address_layout::SIZE_BYTES];
        let mac = mac_address_layout::MAC_ADDR_47_32.get(m) << 32
            | mac_address_layout::MAC_ADDR_31_0.get(m);
        let vlan = (i::VLAN_VALID.get(input) != 0).then(|| i::VLAN.get(input) as u16);
        let entry = L2Entry { mac, vlan };
        // One MAC (and VLAN) at one index: the switch forwards it once.
        let elsewhere = |(&n, e): (&u32, &L2Entry)| n != index && *e == entry;
        if self.eth.l2_table.iter().any(elsewhere) {
            return Err(fail(CmdStatus::BadParameter, synd::L2_DUPLICATE));
        }
        tracing::debug!(
            index,
            mac = format_args!("{mac:012x}"),
            ?vlan,
            "SET_L2_TABLE_ENTRY"
        );
        self.eth.l2_table.insert(index, entry);
        self.publish_l2(inner);
        Ok(vec![0; set_l2_table_entry_out::SIZE_BYTES])
    }

    pub(super) fn delete_l2_table_entry(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        use delete_l2_table_entry_in as i;
        sized(
            input,
            outlen,
            i::SIZE_BYTES,
            delete_l2_table_entry_out::SIZE_BYTES,
        )?;
        let index = i::TABLE_INDEX.get(input) as u32;
        if index >= self.l2_table_size() {
            return Err(fail(CmdStatus::BadParameter, synd::L2_BAD_INDEX));
        }
        if self.eth.l2_table.remove(&index).is_none() {
            return Err(fail(CmdStatus::BadParameter, synd::L2_UNKNOWN));
        }
        self.publish_l2(inner);
        Ok(vec![0; delete_l2_table_entry_out::SIZE_BYTES])
    }

    /// QUERY_VPORT_COUNTER of the function's own vport: every frame the
    /// port moves (RoCE included) is an Ethernet unicast frame; errors,
    /// broadcast, multicast and IB counts stay 0, as do received octets
    /// (the data path does not count them). `clear` zeroes what it read.
    pub(super) fn query_vport_counter(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        use query_vport_counter_in as i;
        use query_vport_counter_out as o;
        sized(input, outlen, i::SIZE_BYTES, o::SIZE_BYTES)?;
        // No e-switch: only the function's own vport.
        if i::OTHER_VPORT.get(input) != 0 || i::VPORT_NUMBER.get(input) != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_COUNTER_BAD_VPORT));
        }
        let c = &inner.rdma.counters;
        let now = [
            c.packets_sent.load(Ordering::Relaxed),
            c.bytes_sent.load(Ordering::Relaxed),
            c.packets_received.load(Ordering::Relaxed),
        ];
        let base = self.eth.vport_counter_base;
        let d: Vec<u64> = now
            .iter()
            .zip(base)
            .map(|(n, b)| n.wrapping_sub(b))
            .collect();
        let mut out = vec![0u8; o::SIZE_BYTES];
        let tx = &mut out[o::TRANSMITTED_ETH_UNICAST.off / 8..];
        traffic_counter::PACKETS.set(tx, d[0]);
        traffic_counter::OCTETS.set(tx, d[1]);
        let rx = &mut out[o::RECEIVED_ETH_UNICAST.off / 8..];
        traffic_counter::PACKETS.set(rx, d[2]);
        if i::CLEAR.get(input) != 0 {
            self.eth.vport_counter_base = now;
        }
        Ok(out)
    }
}
