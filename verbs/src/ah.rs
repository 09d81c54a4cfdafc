//! Address handles (`ibv_create_ah`): the 48-byte address vector a UD send
//! WQE carries in its datagram segment (`struct mlx5_av`), built once.
//!
//! RoCE v2: the AV holds the destination MAC, GID, hop limit, traffic
//! class, flow label, the source GID index and the UDP source port; the
//! remote QP number and Q_Key are filled per WQE. `Ah` is `Send + Sync`.

use std::sync::Arc;

use mlx5_hw::ifc::av;

use crate::pd::{Pd, PdInner};
use crate::qp::AhAttr;
use crate::{Error, Result};

/// The UDP source port of a flow between two QPs (RoCE v2 entropy), as
/// rdma-core derives it: from the flow label or the QP numbers, in the
/// range 0xc000..=0xffff.
pub fn udp_sport(lqpn: u32, rqpn: u32) -> u16 {
    let fl = (lqpn.wrapping_mul(rqpn)) ^ (lqpn >> 12) ^ rqpn;
    0xc000 | ((fl ^ (fl >> 14)) & 0x3fff) as u16
}

/// An address handle (`struct ibv_ah`).
#[derive(Debug, Clone)]
pub struct Ah {
    pub(crate) av: [u8; 48],
    _pd: Arc<PdInner>,
}

impl Pd {
    /// `ibv_create_ah`.
    pub fn create_ah(&self, a: &AhAttr) -> Result<Ah> {
        let ctx = &self.inner.ctx;
        if a.port_num != 1 {
            return Err(Error::Invalid("port number"));
        }
        if ctx.gid(a.sgid_index.into()).is_none() {
            return Err(Error::Invalid("source GID index names no GID"));
        }
        let dmac = match a.dmac {
            Some(m) => m,
            None => crate::device::mac_of_link_local_gid(&a.dgid)
                .or_else(|| crate::device::mac_of_multicast_gid(&a.dgid))
                .ok_or(Error::Invalid("no destination MAC for a routable GID"))?,
        };
        let mut b = [0u8; 48];
        let o = |f: mlx5_hw::bits::BitField| f.off / 8;
        // RoCE: priority in stat_rate_sl bits 3:1 (rdma-core: sl << 1).
        b[o(av::STAT_RATE_SL)] = (a.sl & 7) << 1;
        b[o(av::RLID)..o(av::RLID) + 2].copy_from_slice(&udp_sport(0, 0).to_be_bytes());
        b[o(av::RMAC)..o(av::RMAC) + 6].copy_from_slice(&dmac);
        b[o(av::TCLASS)] = a.traffic_class;
        b[o(av::HOP_LIMIT)] = a.hop_limit.max(1);
        // grh_gid_fl: GRH present (bit 30), source GID index 27:20, flow label.
        let gf = (1u32 << 30) | (u32::from(a.sgid_index) << 20) | (a.flow_label & 0xf_ffff);
        b[o(av::GRH_GID_FL)..o(av::GRH_GID_FL) + 4].copy_from_slice(&gf.to_be_bytes());
        b[o(av::RGID)..o(av::RGID) + 16].copy_from_slice(&a.dgid);
        Ok(Ah {
            av: b,
            _pd: self.inner.clone(),
        })
    }
}

impl Ah {
    /// The address vector bytes (remote QPN and Q_Key left zero).
    pub fn av(&self) -> &[u8; 48] {
        &self.av
    }
}
