//! ADD_VXLAN_UDP_DPORT / DELETE_VXLAN_UDP_DPORT: the UDP destination ports
//! the NIC parses as VXLAN (mlx5_core adds IANA's 4789 at probe when the
//! card has `tunnel_stateless_vxlan`). Up to `max_vxlan_udp_ports` of them
//! (4 where the card reports 0: "usually 4", lib/vxlan.c); adding a port
//! held already succeeds (4789 is the hardware's default, and Linux adds it
//! again). Steering parses UDP to these ports as VXLAN (transport/steer.rs:
//! the VNI and the inner headers match).

use mlx5_hw::ifc::{
    add_vxlan_udp_dport_in, delete_vxlan_udp_dport_in,
    per_protocol_networking_offload_caps as eth_cap,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::profile::cap_type;

/// Ports firmware holds when the card reports no `max_vxlan_udp_ports`.
const DEFAULT_MAX_PORTS: u64 = 4;

impl Firmware {
    fn vxlan_supported(&self) -> bool {
        self.caps
            .get(cap_type::ETHERNET_OFFLOADS, eth_cap::TUNNEL_STATELESS_VXLAN)
            != 0
    }

    pub(super) fn add_vxlan_udp_dport(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use add_vxlan_udp_dport_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        if !self.vxlan_supported() {
            return Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE));
        }
        let port = i::VXLAN_UDP_PORT.get(input) as u16;
        let max = match self
            .caps
            .get(cap_type::ETHERNET_OFFLOADS, eth_cap::MAX_VXLAN_UDP_PORTS)
        {
            0 => DEFAULT_MAX_PORTS,
            n => n,
        };
        if self.eth.vxlan_ports.contains(&port) {
            return Ok(vec![0; 0x10]);
        }
        if self.eth.vxlan_ports.len() as u64 >= max {
            return Err(fail(CmdStatus::NoResources, synd::VXLAN_PORTS_EXHAUSTED));
        }
        self.eth.vxlan_ports.insert(port);
        Ok(vec![0; 0x10])
    }

    pub(super) fn delete_vxlan_udp_dport(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use delete_vxlan_udp_dport_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        if !self.vxlan_supported() {
            return Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE));
        }
        if !self
            .eth
            .vxlan_ports
            .remove(&(i::VXLAN_UDP_PORT.get(input) as u16))
        {
            return Err(fail(CmdStatus::BadParameter, synd::VXLAN_PORT_UNKNOWN));
        }
        Ok(vec![0; 0x10])
    }
}
