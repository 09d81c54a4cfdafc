//! DevX user contexts (CREATE_UCTX / DESTROY_UCTX) and the `uid` every
//! object command carries: an object created under a uid is modified,
//! queried and destroyed only under it (uid 0 is the kernel's, the driver
//! that owns the function); a command naming a uid that does not exist is a
//! bad parameter. Ownership is kept here by object kind and number, beside
//! the object tables, for the commands of [`owned`]; the UMEMs an object
//! uses ([`Devx::uses`]) keep their UMEM from being destroyed.

use std::collections::{BTreeMap, BTreeSet};

use mlx5_hw::bits::BitField;
use mlx5_hw::ifc::{
    alloc_pd_out, alloc_transport_domain_out, create_cq_out, create_mkey_out, create_qp_out,
    create_srq_out, create_uctx_in, create_uctx_out, dealloc_pd_in, dealloc_transport_domain_in,
    destroy_cq_in, destroy_mkey_in, destroy_qp_in, destroy_srq_in, destroy_uctx_in,
    general_obj_in_cmd_hdr, init2init_qp_in, init2rtr_qp_in, modify_cq_in, qp_2err_in, qp_2rst_in,
    query_cq_in, query_mkey_in, query_qp_in, query_srq_in, rst2init_qp_in, rtr2rts_qp_in,
    rts2rts_qp_in, sqd2rts_qp_in, sqerr2rts_qp_in, uctx,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, CmdResult, Fail, Firmware};

/// log2 of the user contexts the model offers (cmd_hca_cap.log_max_uctx).
pub(crate) const LOG_MAX_UCTX: u64 = 8;
/// log2 of the UMEMs the model offers (cmd_hca_cap.log_max_umem).
pub(crate) const LOG_MAX_UMEM: u64 = 12;
/// The user context capabilities firmware grants (cmd_hca_cap.uctx_cap).
pub(crate) const UCTX_CAPS: u64 =
    (mlx5_hw::devx::UCTX_CAP_RAW_TX | mlx5_hw::devx::UCTX_CAP_INTERNAL_DEV_RES) as u64;

/// Syndromes of the DevX checks (stable values; `mlx5_emu::devx_synd`).
pub mod synd {
    /// A command names a uid that no user context has.
    pub const BAD_UID: u32 = 0x1d3c_0002;
    /// The object (or UMEM) belongs to another uid than the command's.
    pub const UID_MISMATCH: u32 = 0x1d3c_0003;
    /// CREATE_UCTX: every context is taken.
    pub const UCTX_EXHAUSTED: u32 = 0x7c70_0001;
    /// CREATE_UCTX: a capability the function does not grant.
    pub const UCTX_BAD_CAP: u32 = 0x7c70_0002;
    /// DESTROY_UCTX: objects (or UMEMs) still live under the uid.
    pub const UCTX_IN_USE: u32 = 0x7c70_0003;
    /// CREATE_UMEM: a bad page size, page offset, count or MTT entry.
    pub const UMEM_BAD_PARAM: u32 = 0x7c71_0001;
    /// CREATE_UMEM: a page the function has not mapped for DMA.
    pub const UMEM_NOT_MAPPED: u32 = 0x7c71_0002;
    /// CREATE_UMEM: every UMEM is taken.
    pub const UMEM_EXHAUSTED: u32 = 0x7c71_0003;
    /// No such UMEM.
    pub const UMEM_UNKNOWN: u32 = 0x7c71_0004;
    /// DESTROY_UMEM: an object still uses it.
    pub const UMEM_IN_USE: u32 = 0x7c71_0005;
    /// A queue or doorbell record reaches past the end of its UMEM.
    pub const UMEM_OUT_OF_RANGE: u32 = 0x7c71_0006;
    /// A queue placed in a UMEM with MTT entries that deny the device
    /// write access.
    pub const UMEM_NO_WRITE: u32 = 0x7c71_0007;
    /// A general object type the function does not support.
    pub const GENERAL_OBJ_BAD_TYPE: u32 = 0x7c72_0001;
}

/// The kinds of object whose owner firmware tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Pd,
    Td,
    Mkey,
    Cq,
    Qp,
    Srq,
}

/// What a command does to the object it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Creates it: its number is in the output.
    Create,
    /// Modifies or queries it: its number is in the input.
    Use,
    /// Destroys it: its number is in the input.
    Destroy,
}

/// The commands whose object firmware checks the uid of, with the field
/// that numbers the object (in the output for a create, else the input).
fn owned(op: Opcode) -> Option<(Kind, Role, BitField)> {
    use Opcode as O;
    use Role::{Create, Destroy, Use};
    Some(match op {
        O::AllocPd => (Kind::Pd, Create, alloc_pd_out::PD),
        O::DeallocPd => (Kind::Pd, Destroy, dealloc_pd_in::PD),
        O::AllocTransportDomain => (
            Kind::Td,
            Create,
            alloc_transport_domain_out::TRANSPORT_DOMAIN,
        ),
        O::DeallocTransportDomain => (
            Kind::Td,
            Destroy,
            dealloc_transport_domain_in::TRANSPORT_DOMAIN,
        ),
        O::CreateMkey => (Kind::Mkey, Create, create_mkey_out::MKEY_INDEX),
        O::DestroyMkey => (Kind::Mkey, Destroy, destroy_mkey_in::MKEY_INDEX),
        O::QueryMkey => (Kind::Mkey, Use, query_mkey_in::MKEY_INDEX),
        O::CreateCq => (Kind::Cq, Create, create_cq_out::CQN),
        O::DestroyCq => (Kind::Cq, Destroy, destroy_cq_in::CQN),
        O::QueryCq => (Kind::Cq, Use, query_cq_in::CQN),
        O::ModifyCq => (Kind::Cq, Use, modify_cq_in::CQN),
        O::CreateQp => (Kind::Qp, Create, create_qp_out::QPN),
        O::DestroyQp => (Kind::Qp, Destroy, destroy_qp_in::QPN),
        O::QueryQp => (Kind::Qp, Use, query_qp_in::QPN),
        O::Rst2InitQp => (Kind::Qp, Use, rst2init_qp_in::QPN),
        O::Init2InitQp => (Kind::Qp, Use, init2init_qp_in::QPN),
        O::Init2RtrQp => (Kind::Qp, Use, init2rtr_qp_in::QPN),
        O::Rtr2RtsQp => (Kind::Qp, Use, rtr2rts_qp_in::QPN),
        O::Rts2RtsQp => (Kind::Qp, Use, rts2rts_qp_in::QPN),
        O::Sqerr2RtsQp => (Kind::Qp, Use, sqerr2rts_qp_in::QPN),
        O::SqdRtsQp => (Kind::Qp, Use, sqd2rts_qp_in::QPN),
        O::ToErrQp => (Kind::Qp, Use, qp_2err_in::QPN),
        O::ToRstQp => (Kind::Qp, Use, qp_2rst_in::QPN),
        O::CreateSrq => (Kind::Srq, Create, create_srq_out::SRQN),
        O::DestroySrq => (Kind::Srq, Destroy, destroy_srq_in::SRQN),
        O::QuerySrq => (Kind::Srq, Use, query_srq_in::SRQN),
        _ => return None,
    })
}

/// DevX state: user contexts, UMEMs, owners.
#[derive(Debug, Default)]
pub(crate) struct Devx {
    /// User contexts by uid, with the capabilities each was created with.
    pub uctxs: BTreeMap<u16, u32>,
    /// UMEMs by number.
    pub umems: BTreeMap<u32, super::umem::Umem>,
    /// The uid of every object created under one other than 0.
    pub owners: BTreeMap<(Kind, u32), u16>,
    /// The UMEMs each object's queues or doorbell records lie in.
    pub uses: BTreeMap<(Kind, u32), BTreeSet<u32>>,
}

impl Devx {
    /// The uid that owns an object (0 when created by the kernel).
    pub(crate) fn owner(&self, kind: Kind, n: u32) -> u16 {
        self.owners.get(&(kind, n)).copied().unwrap_or(0)
    }

    /// Whether any object uses UMEM `id`.
    pub(crate) fn umem_in_use(&self, id: u32) -> bool {
        self.uses.values().any(|s| s.contains(&id))
    }
}

/// A command's uid (general_obj_in_cmd_hdr.uid: bits 16..32 of the first
/// dword of every object command).
pub(crate) fn uid_of(input: &[u8]) -> u16 {
    if input.len() < general_obj_in_cmd_hdr::UID.off / 8 + 2 {
        return 0;
    }
    general_obj_in_cmd_hdr::UID.get(input) as u16
}

impl Firmware {
    /// Before a command runs: a uid other than 0 must be a live user
    /// context, and an object the command modifies, queries or destroys
    /// must belong to the command's uid.
    pub(super) fn devx_check(&self, op: Opcode, input: &[u8]) -> Result<(), Fail> {
        if matches!(op, Opcode::CreateUctx | Opcode::DestroyUctx) {
            return Ok(());
        }
        let uid = uid_of(input);
        if uid != 0 && !self.devx.uctxs.contains_key(&uid) {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_UID));
        }
        if let Some((kind, role, f)) = owned(op) {
            if role != Role::Create && input.len() * 8 >= f.off + f.width {
                let n = f.get(input) as u32;
                if self.devx.owner(kind, n) != uid {
                    return Err(fail(CmdStatus::BadParameter, synd::UID_MISMATCH));
                }
            }
        }
        Ok(())
    }

    /// After a command succeeded: records the owner of what it created,
    /// forgets what it destroyed.
    pub(super) fn devx_done(&mut self, op: Opcode, input: &[u8], out: &[u8]) {
        let Some((kind, role, f)) = owned(op) else {
            return;
        };
        match role {
            Role::Create if out.len() * 8 >= f.off + f.width => {
                let n = f.get(out) as u32;
                let uid = uid_of(input);
                if uid != 0 {
                    self.devx.owners.insert((kind, n), uid);
                }
            }
            Role::Destroy => {
                let n = f.get(input) as u32;
                self.devx.owners.remove(&(kind, n));
                self.devx.uses.remove(&(kind, n));
            }
            _ => {}
        }
    }

    pub(super) fn create_uctx(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_uctx_in::SIZE_BYTES,
            create_uctx_out::SIZE_BYTES,
        )?;
        if !self.devx_supported() {
            return Err(fail(CmdStatus::BadOperation, super::synd::BAD_OPCODE));
        }
        let at = create_uctx_in::UCTX.off / 8;
        let cap = uctx::CAP.get(&input[at..at + uctx::SIZE_BYTES]) as u32;
        if u64::from(cap) & !UCTX_CAPS != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::UCTX_BAD_CAP));
        }
        let max = 1u32 << self.cap(mlx5_hw::ifc::cmd_hca_cap::LOG_MAX_UCTX).min(16);
        let Some(uid) = (1..max.min(0x1_0000))
            .map(|u| u as u16)
            .find(|u| !self.devx.uctxs.contains_key(u))
        else {
            return Err(fail(CmdStatus::NoResources, synd::UCTX_EXHAUSTED));
        };
        self.devx.uctxs.insert(uid, cap);
        tracing::debug!(uid, cap, "CREATE_UCTX");
        let mut out = vec![0u8; create_uctx_out::SIZE_BYTES];
        create_uctx_out::UID.set(&mut out, u64::from(uid));
        Ok(out)
    }

    pub(super) fn destroy_uctx(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, destroy_uctx_in::SIZE_BYTES, 0x10)?;
        if !self.devx_supported() {
            return Err(fail(CmdStatus::BadOperation, super::synd::BAD_OPCODE));
        }
        let uid = destroy_uctx_in::UID.get(input) as u16;
        if !self.devx.uctxs.contains_key(&uid) {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_UID));
        }
        let used = self.devx.owners.values().any(|&u| u == uid)
            || self.devx.umems.values().any(|m| m.uid == uid);
        if used {
            return Err(fail(CmdStatus::BadResourceState, synd::UCTX_IN_USE));
        }
        self.devx.uctxs.remove(&uid);
        Ok(vec![0; 0x10])
    }
}
