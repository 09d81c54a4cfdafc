//! CREATE_TIR / MODIFY_TIR / DESTROY_TIR / QUERY_TIR: transport interface
//! receive objects, where steering delivers: to one RQ (`disp_type`
//! direct, `inline_rqn`) or hashed over an RQ table (indirect,
//! `indirect_table`, `rx_hash_fn` and its fields). MODIFY_TIR changes the
//! groups its bitmask selects (hash, packet merge, self loopback).

use mlx5_hw::eth::{
    RX_HASH_FN_NONE, RX_HASH_FN_TOEPLITZ, TIRC_DISP_TYPE_DIRECT, TIRC_DISP_TYPE_INDIRECT,
};
use mlx5_hw::ifc::{
    cmd_hca_cap, create_tir_in, create_tir_out, destroy_tir_in, modify_tir_bitmask, modify_tir_in,
    per_protocol_networking_offload_caps as eth_cap, query_tir_in, query_tir_out, tirc,
};
use mlx5_hw::status::CmdStatus;

use super::eth::{free_number, known, limit, Obj};
use super::{fail, sized, synd, CmdResult, Fail, Firmware};
use crate::profile::cap_type;
use crate::{lock, Inner};

/// The fields MODIFY_TIR's `hash` bit covers.
const HASH_FIELDS: [mlx5_hw::bits::BitField; 7] = [
    tirc::RX_HASH_SYMMETRIC,
    tirc::TUNNELED_OFFLOAD_EN,
    tirc::INDIRECT_TABLE,
    tirc::RX_HASH_FN,
    tirc::RX_HASH_TOEPLITZ_KEY,
    tirc::RX_HASH_FIELD_SELECTOR_OUTER,
    tirc::RX_HASH_FIELD_SELECTOR_INNER,
];
/// The fields MODIFY_TIR's `packet_merge` bit covers (LRO).
const MERGE_FIELDS: [mlx5_hw::bits::BitField; 3] = [
    tirc::LRO_TIMEOUT_PERIOD_USECS,
    tirc::PACKET_MERGE_MASK,
    tirc::LRO_MAX_IP_PAYLOAD_SIZE,
];

/// Copies `f` (any width, byte-aligned or not) from `from` to `to`.
fn copy_field(f: mlx5_hw::bits::BitField, from: &[u8], to: &mut [u8]) {
    if f.width <= 64 {
        f.set(to, f.get(from));
    } else {
        let (a, n) = (f.off / 8, f.width / 8);
        to[a..a + n].copy_from_slice(&from[a..a + n]);
    }
}

impl Firmware {
    /// The checks a TIR context passes: what it dispatches to exists, the
    /// hash is one firmware computes, LRO only where the card has it.
    fn check_tirc(&self, c: &[u8]) -> Result<(), Fail> {
        match tirc::DISP_TYPE.get(c) {
            TIRC_DISP_TYPE_DIRECT => {
                known(
                    &self.eth.rqs,
                    tirc::INLINE_RQN.get(c) as u32,
                    synd::TIR_BAD_RQ,
                )?;
                if tirc::RX_HASH_FN.get(c) != RX_HASH_FN_NONE {
                    return Err(fail(CmdStatus::BadParameter, synd::TIR_BAD_HASH));
                }
            }
            TIRC_DISP_TYPE_INDIRECT => {
                known(
                    &self.eth.rqts,
                    tirc::INDIRECT_TABLE.get(c) as u32,
                    synd::TIR_BAD_RQT,
                )?;
                if tirc::RX_HASH_FN.get(c) > RX_HASH_FN_TOEPLITZ {
                    return Err(fail(CmdStatus::BadParameter, synd::TIR_BAD_HASH));
                }
                crate::transport::rss::check_fields(c)
                    .map_err(|()| fail(CmdStatus::BadParameter, synd::TIR_BAD_HASH))?;
            }
            _ => return Err(fail(CmdStatus::BadParameter, synd::TIR_BAD_DISP_TYPE)),
        }
        let lro = self.caps.get(cap_type::ETHERNET_OFFLOADS, eth_cap::LRO_CAP);
        if tirc::PACKET_MERGE_MASK.get(c) != 0 && lro == 0 {
            return Err(fail(CmdStatus::BadParameter, synd::TIR_BAD_PARAM));
        }
        if tirc::TLS_EN.get(c) != 0 && self.cap(cmd_hca_cap::TLS_RX) == 0 {
            return Err(fail(CmdStatus::BadParameter, synd::TIR_BAD_PARAM));
        }
        Ok(())
    }

    pub(super) fn create_tir(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use create_tir_in as i;
        sized(input, outlen, i::SIZE_BYTES, create_tir_out::SIZE_BYTES)?;
        self.check_uid(i::UID.get(input))?;
        let c = &input[i::CTX.off / 8..][..tirc::SIZE_BYTES];
        let td = tirc::TRANSPORT_DOMAIN.get(c) as u32;
        // Domain 0 is the firmware's own, as PD 0 is for a WQ: DPDK's mlx5
        // PMD makes its drop TIR at probe with the domain it has not
        // allocated yet (`sh->tdn`, 0 until its first Tx queue).
        if td != 0 && !lock(&inner.rdma.tds).contains(&td) {
            return Err(fail(CmdStatus::BadResource, synd::TIR_BAD_TD));
        }
        self.check_tirc(c)?;
        let max = limit(self.cap(cmd_hca_cap::LOG_MAX_TIR));
        let tirn = free_number(&self.eth.tirs, 1, max, synd::TIR_EXHAUSTED)?;
        self.eth.tirs.insert(tirn, Obj { ctx: c.to_vec() });
        tracing::debug!(tirn, td, "CREATE_TIR");
        let mut out = vec![0u8; create_tir_out::SIZE_BYTES];
        create_tir_out::TIRN.set(&mut out, u64::from(tirn));
        Ok(out)
    }

    pub(super) fn modify_tir(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use modify_tir_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let tirn = i::TIRN.get(input) as u32;
        let mut ctx = known(&self.eth.tirs, tirn, synd::TIR_UNKNOWN)?.ctx.clone();
        let c = &input[i::CTX.off / 8..][..tirc::SIZE_BYTES];
        let m = &input[i::BITMASK.off / 8..][..modify_tir_bitmask::SIZE_BYTES];
        if modify_tir_bitmask::HASH.get(m) != 0 {
            for f in HASH_FIELDS {
                copy_field(f, c, &mut ctx);
            }
        }
        if modify_tir_bitmask::PACKET_MERGE.get(m) != 0 {
            for f in MERGE_FIELDS {
                copy_field(f, c, &mut ctx);
            }
        }
        if modify_tir_bitmask::SELF_LB_EN.get(m) != 0 {
            copy_field(tirc::SELF_LB_BLOCK, c, &mut ctx);
        }
        self.check_tirc(&ctx)?;
        self.eth.tirs.insert(tirn, Obj { ctx });
        Ok(vec![0; 0x10])
    }

    pub(super) fn destroy_tir(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use destroy_tir_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let tirn = i::TIRN.get(input) as u32;
        known(&self.eth.tirs, tirn, synd::TIR_UNKNOWN)?;
        // Firmware keeps a TIR a flow entry still forwards to.
        if self.steering.forwards_to_tir(tirn) {
            return Err(fail(CmdStatus::BadResourceState, synd::TIR_IN_USE));
        }
        self.eth.tirs.remove(&tirn);
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_tir(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use query_tir_out as o;
        sized(input, outlen, query_tir_in::SIZE_BYTES, o::SIZE_BYTES)?;
        let tirn = query_tir_in::TIRN.get(input) as u32;
        let tir = known(&self.eth.tirs, tirn, synd::TIR_UNKNOWN)?;
        let mut out = vec![0u8; o::SIZE_BYTES];
        out[o::TIR_CONTEXT.off / 8..][..tirc::SIZE_BYTES].copy_from_slice(&tir.ctx);
        Ok(out)
    }
}
