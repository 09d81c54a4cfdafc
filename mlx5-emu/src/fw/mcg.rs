//! ATTACH_TO_MCG / DETACH_FROM_MCG: a UD QP joins or leaves a multicast
//! group (what mlx5_ib sends for `ibv_attach_mcast`, and so for rdma_cm's
//! `rdma_join_multicast` over RoCE). A UD SEND to a multicast GID
//! (transport/requester.rs) reaches every function of the cable, its own
//! included, and each delivers a copy to the QPs of its group
//! (transport/responder.rs). Bounds from the caps: `log_max_mcg` groups,
//! `max_qp_mcg` QPs a group. Attaching a QP twice is one membership;
//! detaching one that is not a member, or naming a GID that is not
//! multicast (`ff00::/8`, or IPv4-mapped `224.0.0.0/4` for RoCE v2 over
//! IPv4) or a QP that is not UD, is a bad parameter.

use mlx5_hw::ifc::{attach_to_mcg_in, cmd_hca_cap, detach_from_mcg_in};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Fail, Firmware};
use crate::transport::qp::st;
use crate::transport::Rdma;
use crate::{lock, Inner};

/// The GID of an ATTACH_TO_MCG or DETACH_FROM_MCG input.
fn mgid(input: &[u8]) -> [u8; 16] {
    let at = attach_to_mcg_in::MULTICAST_GID.off / 8;
    let mut g = [0u8; 16];
    g.copy_from_slice(&input[at..at + 16]);
    g
}

/// The QP and group a command names, checked: a UD QP of this function and
/// a multicast GID.
fn member(r: &Rdma, qpn: u32, g: &[u8; 16]) -> Result<(), Fail> {
    let Some(qp) = r.qp(qpn) else {
        return Err(fail(CmdStatus::BadResource, synd::QP_UNKNOWN));
    };
    if qp.st != st::UD || !mlx5_hw::qp::is_multicast_gid(g) {
        return Err(fail(CmdStatus::BadParameter, synd::MCG_BAD_PARAM));
    }
    Ok(())
}

impl Firmware {
    /// The QP and group an ATTACH_TO_MCG or DETACH_FROM_MCG names (the
    /// two inputs are laid out alike), checked.
    fn mcg_input(
        &self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> Result<(u32, [u8; 16]), Fail> {
        use attach_to_mcg_in as i;
        const _: () = assert!(i::SIZE_BYTES == detach_from_mcg_in::SIZE_BYTES);
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let (qpn, g) = (i::QPN.get(input) as u32, mgid(input));
        member(&inner.rdma, qpn, &g)?;
        Ok((qpn, g))
    }

    pub(super) fn attach_to_mcg(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        let (qpn, g) = self.mcg_input(inner, input, outlen)?;
        let groups = 1usize << self.cap(cmd_hca_cap::LOG_MAX_MCG).min(24);
        let per_group = self.cap(cmd_hca_cap::MAX_QP_MCG) as usize;
        let mut m = lock(&inner.rdma.mcgs);
        if !m.contains_key(&g) && m.len() >= groups {
            return Err(fail(CmdStatus::NoResources, synd::MCG_EXHAUSTED));
        }
        let qps = m.entry(g).or_default();
        if !qps.contains(&qpn) && qps.len() >= per_group {
            return Err(fail(CmdStatus::NoResources, synd::MCG_EXHAUSTED));
        }
        qps.insert(qpn);
        tracing::debug!(qpn, mgid = ?g, "ATTACH_TO_MCG");
        Ok(vec![0; 0x10])
    }

    pub(super) fn detach_from_mcg(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        let (qpn, g) = self.mcg_input(inner, input, outlen)?;
        let mut m = lock(&inner.rdma.mcgs);
        let Some(qps) = m.get_mut(&g) else {
            return Err(fail(CmdStatus::BadParameter, synd::MCG_BAD_PARAM));
        };
        if !qps.remove(&qpn) {
            return Err(fail(CmdStatus::BadParameter, synd::MCG_BAD_PARAM));
        }
        if qps.is_empty() {
            m.remove(&g);
        }
        Ok(vec![0; 0x10])
    }
}

/// QP `qpn` is destroyed: it leaves every group.
pub(super) fn forget_qp(r: &Rdma, qpn: u32) {
    let mut m = lock(&r.mcgs);
    m.retain(|_, qps| {
        qps.remove(&qpn);
        !qps.is_empty()
    });
}
