//! MAD_IFC: firmware's subnet management agent (SMA) and performance
//! management agent (PMA) answer a MAD about the port, from the port's
//! state as the rest of the model keeps it. SMP GETs (LID-routed or
//! directed-route): NodeDescription (the NODE_DESC register's text),
//! NodeInfo (a one-port channel adapter, the EUI-64 GUIDs of the MAC, 128
//! P_Keys, the PCI device ID, Mellanox's vendor ID), PortInfo (the PAOS/
//! PTYS state: active or down, physical state, width and lane speed of the
//! trained protocol, the MTU; LID 0 and no subnet manager: an Ethernet
//! port is not in an IB subnet), GUIDInfo (block 0: the port GUID) and the
//! P_KeyTable (0xffff at index 0). PMA GETs: ClassPortInfo (extended
//! counters supported), PortCounters and PortCountersExtended from the
//! data-path counters. Anything else is answered in the MAD's status as an
//! agent answers it (unsupported method or attribute, bad version,
//! invalid attribute value) with command status OK; a bad port is a
//! command error. Linux's mlx5_ib sends MAD_IFC only on InfiniBand ports
//! (on Ethernet it reads the vport queries and counters instead), so what
//! real firmware answers on an Ethernet port is taken as this: the same
//! agents, with the Ethernet port's state.

use std::sync::atomic::Ordering;

use mlx5_hw::ifc::{cmd_hca_cap, mad_ifc_in, mad_ifc_out};
use mlx5_hw::mad::{self as m, class_port_info as cpi, node_info as ni, port_info as pi};
use mlx5_hw::status::CmdStatus;

use super::eth_proto::{CR2_50G, CR4_100G, CR4_40G, CR_10G, CR_25G};
use super::vport::guid;
use super::{fail, sized, CmdResult, Firmware};
use crate::Inner;

/// Syndromes of MAD_IFC's command checks.
pub(crate) mod synd {
    /// A port the function does not have.
    pub const MAD_BAD_PORT: u32 = 0x7d10_0001;
}

/// Mellanox's IEEE OUI (NodeInfo.VendorID).
const VENDOR_ID: u32 = 0x02c9;

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

impl Firmware {
    pub(super) fn mad_ifc(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            mad_ifc_in::SIZE_BYTES,
            mad_ifc_out::SIZE_BYTES,
        )?;
        if mad_ifc_in::PORT.get(input) != 1 {
            return Err(fail(CmdStatus::BadParameter, synd::MAD_BAD_PORT));
        }
        let at = mad_ifc_in::MAD.off / 8;
        let mad = &input[at..at + m::MAD_SIZE];
        let mut resp = [0u8; m::MAD_SIZE];
        // The response keeps the request's header (TID, attribute).
        resp[..m::DATA].copy_from_slice(&mad[..m::DATA]);
        let class = mad[m::HDR_MGMT_CLASS];
        let status = if mad[m::HDR_BASE_VERSION] != m::BASE_VERSION
            || mad[m::HDR_CLASS_VERSION] != m::CLASS_VERSION_1
        {
            m::STATUS_BAD_VERSION
        } else if mad[m::HDR_METHOD] != m::METHOD_GET {
            m::STATUS_UNSUPPORTED_METHOD
        } else {
            let attr = u16::from_be_bytes([mad[m::HDR_ATTR_ID], mad[m::HDR_ATTR_ID + 1]]);
            let modifier = u32::from_be_bytes(
                mad[m::HDR_ATTR_MOD..m::HDR_ATTR_MOD + 4]
                    .try_into()
                    .unwrap_or_default(),
            );
            let data = &mut resp[m::DATA..];
            match class {
                m::CLASS_SUBN_LID_ROUTED | m::CLASS_SUBN_DIRECTED_ROUTE => {
                    self.smp_get(attr, modifier, data)
                }
                m::CLASS_PERF_MGMT => self.pma_get(inner, attr, mad, data),
                _ => m::STATUS_UNSUPPORTED_METHOD,
            }
        };
        resp[m::HDR_METHOD] = m::METHOD_GET_RESP;
        let d = if class == m::CLASS_SUBN_DIRECTED_ROUTE {
            m::STATUS_DIRECTION
        } else {
            0
        };
        put16(&mut resp, m::HDR_STATUS, status | d);
        if status != 0 {
            resp[m::DATA..].fill(0);
        }
        let mut out = vec![0u8; mad_ifc_out::SIZE_BYTES];
        let o = mad_ifc_out::RESPONSE_MAD_PACKET.off / 8;
        out[o..o + m::MAD_SIZE].copy_from_slice(&resp);
        Ok(out)
    }

    /// An SMP GET of `attr`: the MAD status (0 when answered into `data`).
    fn smp_get(&self, attr: u16, modifier: u32, data: &mut [u8]) -> u16 {
        let g = guid(self.mac);
        match attr {
            m::ATTR_NODE_DESC => {
                let n = self.node_desc.len().min(m::SMP_DATA_SIZE);
                data[..n].copy_from_slice(&self.node_desc[..n]);
            }
            m::ATTR_NODE_INFO => {
                data[ni::BASE_VERSION] = m::BASE_VERSION;
                data[ni::CLASS_VERSION] = m::CLASS_VERSION_1;
                data[ni::NODE_TYPE] = ni::NODE_TYPE_CA;
                data[ni::NUM_PORTS] = 1;
                put64(data, ni::SYS_IMAGE_GUID, g);
                put64(data, ni::NODE_GUID, g);
                put64(data, ni::PORT_GUID, g);
                put16(data, ni::PARTITION_CAP, self.pkeys() as u16);
                put16(data, ni::DEVICE_ID, self.profile.device_id());
                put32(data, ni::LOCAL_PORT_VENDOR_ID, 1 << 24 | VENDOR_ID);
            }
            m::ATTR_PORT_INFO if modifier <= 1 => self.port_info(data),
            m::ATTR_GUID_INFO if modifier == 0 => put64(data, 0, g),
            m::ATTR_PKEY_TABLE if (modifier as usize) * m::PKEYS_PER_BLOCK < self.pkeys() => {
                if modifier == 0 {
                    put16(data, 0, 0xffff);
                }
            }
            m::ATTR_PORT_INFO | m::ATTR_GUID_INFO | m::ATTR_PKEY_TABLE => {
                return m::STATUS_INVALID_ATTRIB_VALUE
            }
            _ => return m::STATUS_UNSUPPORTED_METHOD_ATTRIB,
        }
        0
    }

    /// The P_Key table's size: `2^(pkey_table_size + 7)`.
    fn pkeys(&self) -> usize {
        1 << (self.cap(cmd_hca_cap::PKEY_TABLE_SIZE).min(9) + 7)
    }

    /// PortInfo from the port's state (PAOS, PTYS, the vport MTU).
    fn port_info(&self, data: &mut [u8]) {
        let p = &self.port;
        put32(data, pi::CAP_MASK, pi::CAP_CM | pi::CAP_EXT_SPEEDS);
        data[pi::LOCAL_PORT_NUM] = 1;
        let (state, phys) = if p.oper_up {
            (pi::STATE_ACTIVE, pi::PHYS_LINK_UP)
        } else if p.admin_up {
            (pi::STATE_DOWN, pi::PHYS_POLLING)
        } else {
            (pi::STATE_DOWN, pi::PHYS_DISABLED)
        };
        // The trained protocol as lanes of a width and speed (as Linux's
        // translate_eth_proto_oper reports RoCE ports).
        let (width, speed, ext) = match p.eth_proto_oper {
            x if x & CR4_100G != 0 => (pi::WIDTH_4X, 0, pi::SPEED_EXT_EDR),
            x if x & CR2_50G != 0 => (pi::WIDTH_2X, 0, pi::SPEED_EXT_EDR),
            x if x & CR_25G != 0 => (pi::WIDTH_1X, 0, pi::SPEED_EXT_EDR),
            x if x & CR4_40G != 0 => (pi::WIDTH_4X, pi::SPEED_QDR, 0),
            x if x & CR_10G != 0 => (pi::WIDTH_1X, pi::SPEED_QDR, 0),
            _ => (0, 0, 0),
        };
        let widths = pi::WIDTH_1X | pi::WIDTH_4X | pi::WIDTH_2X;
        data[pi::LINK_WIDTH_ENABLED] = widths;
        data[pi::LINK_WIDTH_SUPPORTED] = widths;
        data[pi::LINK_WIDTH_ACTIVE] = width;
        data[pi::SPEED_SUP_PORT_STATE] = pi::SPEED_QDR << 4 | state;
        data[pi::PHYS_STATE_DOWN_DEF] = phys << 4 | pi::PHYS_POLLING;
        data[pi::SPEED_ACTIVE_ENABLED] = speed << 4 | pi::SPEED_QDR;
        let mtu = match self.vport_mtu {
            x if x >= 4096 => pi::MTU_4096,
            x if x >= 2048 => pi::MTU_2048,
            _ => pi::MTU_1024,
        };
        data[pi::MTU_SMSL] = mtu << 4;
        data[pi::VL_CAP_INIT_TYPE] = 1 << 4;
        data[pi::INIT_REPLY_MTU_CAP] = pi::MTU_4096;
        data[pi::OPER_VLS] = 1 << 4;
        data[pi::GUID_CAP] = 1;
        data[pi::SPEED_EXT_ACTIVE_SUP] = ext << 4 | pi::SPEED_EXT_EDR;
        put64(data, pi::GID_PREFIX, 0xfe80_0000_0000_0000);
    }

    /// A PMA GET of `attr`: the MAD status.
    fn pma_get(&self, inner: &Inner, attr: u16, mad: &[u8], data: &mut [u8]) -> u16 {
        let c = &inner.rdma.counters;
        let (tx_b, rx_b) = (
            c.bytes_sent.load(Ordering::Relaxed),
            c.bytes_received.load(Ordering::Relaxed),
        );
        let (tx_p, rx_p) = (
            c.packets_sent.load(Ordering::Relaxed),
            c.packets_received.load(Ordering::Relaxed),
        );
        let sat = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let select = mad[m::DATA + m::port_counters::PORT_SELECT];
        match attr {
            m::ATTR_CLASS_PORT_INFO => {
                data[cpi::BASE_VERSION] = m::BASE_VERSION;
                data[cpi::CLASS_VERSION] = m::CLASS_VERSION_1;
                put16(data, cpi::CAP_MASK, cpi::CAP_EXT_WIDTH);
                data[cpi::RESP_TIME] = 18;
            }
            m::ATTR_PORT_COUNTERS => {
                use m::port_counters as pc;
                data[pc::PORT_SELECT] = select;
                put32(data, pc::XMIT_DATA, sat(tx_b / 4));
                put32(data, pc::RCV_DATA, sat(rx_b / 4));
                put32(data, pc::XMIT_PACKETS, sat(tx_p));
                put32(data, pc::RCV_PACKETS, sat(rx_p));
            }
            m::ATTR_PORT_COUNTERS_EXT => {
                use m::port_counters_ext as pe;
                data[pe::PORT_SELECT] = select;
                put64(data, pe::XMIT_DATA, tx_b / 4);
                put64(data, pe::RCV_DATA, rx_b / 4);
                put64(data, pe::XMIT_PACKETS, tx_p);
                put64(data, pe::RCV_PACKETS, rx_p);
                put64(data, pe::UNICAST_XMIT_PACKETS, tx_p);
                put64(data, pe::UNICAST_RCV_PACKETS, rx_p);
            }
            _ => return m::STATUS_UNSUPPORTED_METHOD_ATTRIB,
        }
        0
    }
}
