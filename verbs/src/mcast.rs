//! Multicast groups: `ibv_attach_mcast` / `ibv_detach_mcast`, a UD QP
//! joining or leaving the group of a multicast GID (ATTACH_TO_MCG /
//! DETACH_FROM_MCG, PRM "Multicast Group"). A UD SEND to the group's GID
//! with remote QPN 0xFFFFFF ([`MULTICAST_QPN`]) then reaches every QP in it,
//! on this port and the ports it is cabled to. Refused as Linux's
//! `ib_attach_mcast` refuses: a GID that is not multicast
//! ([`mlx5_hw::qp::is_multicast_gid`]) or a QP that is not UD (EINVAL),
//! before the device is asked. A UD QP made with
//! [`Pd::create_qp_blocking_mcast_loopback`] sends its multicast to the
//! other ports only (`qpc.block_lb_mc`).

use mlx5_hw::ifc::{
    attach_to_mcg_in, attach_to_mcg_out, detach_from_mcg_in, detach_from_mcg_out, AttachToMcgIn,
    DetachFromMcgIn,
};
use mlx5_hw::opcode::Opcode;

use crate::device::Gid;
use crate::pd::Pd;
use crate::qp::{Qp, QpInitAttr, QpType};
use crate::{Error, Result};

/// The remote QP number of a UD SEND to a multicast group.
pub use mlx5_hw::qp::MULTICAST_QPN;

impl Pd {
    /// `ibv_create_qp_ex` with `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`: a UD
    /// QP whose multicast SENDs do not come back to this function's own
    /// QPs in the group (`qpc.block_lb_mc`, as mlx5_ib sets it for
    /// `IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK`). Refused for another
    /// type (EINVAL) and where the device lacks `block_lb_mc`.
    pub fn create_qp_blocking_mcast_loopback(&self, attr: &QpInitAttr<'_>) -> Result<Qp> {
        if attr.qp_type != QpType::Ud {
            return Err(Error::Invalid("multicast loopback blocking needs a UD QP"));
        }
        if !self.inner.ctx.hca.caps().gen().block_lb_mc() {
            return Err(Error::NotSupported(
                "multicast loopback blocking (no block_lb_mc)",
            ));
        }
        Qp::create_tuned(&self.inner, attr, attr.qp_type.st(), 0, false, |q| {
            mlx5_hw::ifc::qpc::BLOCK_LB_MC.set(q, 1);
        })
    }
}

impl Qp {
    /// `ibv_attach_mcast`: this UD QP joins the group of `gid`.
    pub fn attach_mcast(&self, gid: &Gid) -> Result<()> {
        self.mcast_check(gid)?;
        let mut inb = [0u8; attach_to_mcg_in::SIZE_BYTES];
        AttachToMcgIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::AttachToMcg.to_raw())
            .set_qpn(self.qp_num())
            .multicast_gid_mut()
            .copy_from_slice(gid);
        self.mcg_exec(&inb, attach_to_mcg_out::SIZE_BYTES)
    }

    /// `ibv_detach_mcast`: this UD QP leaves the group of `gid`.
    pub fn detach_mcast(&self, gid: &Gid) -> Result<()> {
        self.mcast_check(gid)?;
        let mut inb = [0u8; detach_from_mcg_in::SIZE_BYTES];
        DetachFromMcgIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DetachFromMcg.to_raw())
            .set_qpn(self.qp_num())
            .multicast_gid_mut()
            .copy_from_slice(gid);
        self.mcg_exec(&inb, detach_from_mcg_out::SIZE_BYTES)
    }

    fn mcg_exec(&self, inb: &[u8], outlen: usize) -> Result<()> {
        self.ctx.hca.cmd().exec(inb, outlen).map(drop)
    }

    fn mcast_check(&self, gid: &Gid) -> Result<()> {
        if !mlx5_hw::qp::is_multicast_gid(gid) {
            return Err(Error::Invalid("not a multicast GID"));
        }
        if self.qp_type() != QpType::Ud {
            return Err(Error::Invalid("multicast needs a UD QP"));
        }
        Ok(())
    }
}
