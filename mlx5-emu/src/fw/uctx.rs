//! DevX user contexts (CREATE_UCTX / DESTROY_UCTX) and the `uid` every
//! object command carries: an object created under a uid is modified,
//! queried and destroyed only under it or under uid 0 (the kernel's, the
//! driver that owns the function, which firmware trusts with every uid's
//! objects, as Linux relies on); a command naming a uid that does not exist is a
//! bad parameter. Ownership is kept here by object kind and number, beside
//! the object tables, for the commands of [`owned`]; the UMEMs an object
//! uses ([`Devx::uses`]) keep their UMEM from being destroyed.

use std::collections::{BTreeMap, BTreeSet};

use mlx5_hw::bits::BitField;
use mlx5_hw::devx::SHARED_RESOURCE_UID;
use mlx5_hw::ifc::{
    alloc_pd_out, alloc_q_counter_out, alloc_transport_domain_out, alloc_uar_out, alloc_xrcd_out,
    cqc, create_cq_in, create_cq_out, create_mkey_in, create_mkey_out, create_qp_in, create_qp_out,
    create_rmp_out, create_rq_out, create_rqt_out, create_sq_out, create_srq_in, create_srq_out,
    create_tir_out, create_tis_out, create_uctx_in, create_uctx_out, create_xrc_srq_in,
    create_xrc_srq_out, dealloc_pd_in, dealloc_q_counter_in, dealloc_transport_domain_in,
    dealloc_uar_in, dealloc_xrcd_in, destroy_cq_in, destroy_mkey_in, destroy_qp_in, destroy_rmp_in,
    destroy_rq_in, destroy_rqt_in, destroy_sq_in, destroy_srq_in, destroy_tir_in, destroy_tis_in,
    destroy_uctx_in, destroy_xrc_srq_in, general_obj_in_cmd_hdr, init2init_qp_in, init2rtr_qp_in,
    mkc, modify_cq_in, modify_rmp_in, modify_rq_in, modify_rqt_in, modify_sq_in, modify_tir_in,
    modify_tis_in, qp_2err_in, qp_2rst_in, qpc, query_cq_in, query_mkey_in, query_q_counter_in,
    query_qp_in, query_rmp_in, query_rq_in, query_rqt_in, query_sq_in, query_srq_in, query_tir_in,
    query_tis_in, rst2init_qp_in, rtr2rts_qp_in, rts2rts_qp_in, sqd2rts_qp_in, sqerr2rts_qp_in,
    srqc, uctx, xrc_srqc,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::qp::{QPC_ST_DCI, QPC_ST_XRC};
use mlx5_hw::status::CmdStatus;

use crate::transport::qp::rq_type;

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
    /// A new object names one (PD, CQ, SRQ, UAR, XRC domain, Q counter)
    /// that belongs to another uid than the command's and is not shared.
    pub const REF_UID_MISMATCH: u32 = 0x1d3c_0004;
    /// A general object type the function does not support.
    pub const GENERAL_OBJ_BAD_TYPE: u32 = 0x7c72_0001;
    /// No general object of that type and number.
    pub const GENERAL_OBJ_UNKNOWN: u32 = 0x7c72_0002;
    /// MODIFY_GENERAL_OBJECT of a type firmware does not modify.
    pub const GENERAL_OBJ_NOT_MODIFIABLE: u32 = 0x7c72_0003;
    /// CREATE of a DEK: a key size or purpose firmware does not know.
    pub const DEK_BAD_PARAM: u32 = 0x7c73_0001;
    /// CREATE of a DEK: no such PD.
    pub const DEK_BAD_PD: u32 = 0x7c73_0002;
    /// CREATE of a DEK: every DEK is taken.
    pub const DEK_EXHAUSTED: u32 = 0x7c73_0003;
}

/// The kinds of object whose owner firmware tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Pd,
    Td,
    Mkey,
    Cq,
    Qp,
    /// SRQs, XRC SRQs and RMPs: one number space.
    Srq,
    Uar,
    Xrcd,
    QCounter,
    Tis,
    Tir,
    Rqt,
    Sq,
    Rq,
    /// A general object (CREATE_GENERAL_OBJECT), by type and number.
    General(u16),
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
    use Role::{Create, Destroy, Use};
    let (kind, role, field) = owned_rdma(op).or_else(|| owned_eth(op))?;
    let role = match role {
        0 => Create,
        1 => Use,
        _ => Destroy,
    };
    Some((kind, role, field))
}

/// [`owned`] for the verbs objects (role 0 create, 1 use, 2 destroy).
fn owned_rdma(op: Opcode) -> Option<(Kind, u8, BitField)> {
    use Opcode as O;
    Some(match op {
        O::AllocPd => (Kind::Pd, 0, alloc_pd_out::PD),
        O::DeallocPd => (Kind::Pd, 2, dealloc_pd_in::PD),
        O::AllocTransportDomain => (Kind::Td, 0, alloc_transport_domain_out::TRANSPORT_DOMAIN),
        O::DeallocTransportDomain => (Kind::Td, 2, dealloc_transport_domain_in::TRANSPORT_DOMAIN),
        O::CreateMkey => (Kind::Mkey, 0, create_mkey_out::MKEY_INDEX),
        O::DestroyMkey => (Kind::Mkey, 2, destroy_mkey_in::MKEY_INDEX),
        O::QueryMkey => (Kind::Mkey, 1, query_mkey_in::MKEY_INDEX),
        O::CreateCq => (Kind::Cq, 0, create_cq_out::CQN),
        O::DestroyCq => (Kind::Cq, 2, destroy_cq_in::CQN),
        O::QueryCq => (Kind::Cq, 1, query_cq_in::CQN),
        O::ModifyCq => (Kind::Cq, 1, modify_cq_in::CQN),
        O::CreateQp => (Kind::Qp, 0, create_qp_out::QPN),
        O::DestroyQp => (Kind::Qp, 2, destroy_qp_in::QPN),
        O::QueryQp => (Kind::Qp, 1, query_qp_in::QPN),
        O::Rst2InitQp => (Kind::Qp, 1, rst2init_qp_in::QPN),
        O::Init2InitQp => (Kind::Qp, 1, init2init_qp_in::QPN),
        O::Init2RtrQp => (Kind::Qp, 1, init2rtr_qp_in::QPN),
        O::Rtr2RtsQp => (Kind::Qp, 1, rtr2rts_qp_in::QPN),
        O::Rts2RtsQp => (Kind::Qp, 1, rts2rts_qp_in::QPN),
        O::Sqerr2RtsQp => (Kind::Qp, 1, sqerr2rts_qp_in::QPN),
        O::SqdRtsQp => (Kind::Qp, 1, sqd2rts_qp_in::QPN),
        O::ToErrQp => (Kind::Qp, 1, qp_2err_in::QPN),
        O::ToRstQp => (Kind::Qp, 1, qp_2rst_in::QPN),
        O::CreateSrq => (Kind::Srq, 0, create_srq_out::SRQN),
        O::DestroySrq => (Kind::Srq, 2, destroy_srq_in::SRQN),
        O::QuerySrq => (Kind::Srq, 1, query_srq_in::SRQN),
        O::CreateXrcSrq => (Kind::Srq, 0, create_xrc_srq_out::XRC_SRQN),
        O::DestroyXrcSrq => (Kind::Srq, 2, destroy_xrc_srq_in::XRC_SRQN),
        O::CreateRmp => (Kind::Srq, 0, create_rmp_out::RMPN),
        O::DestroyRmp => (Kind::Srq, 2, destroy_rmp_in::RMPN),
        O::ModifyRmp => (Kind::Srq, 1, modify_rmp_in::RMPN),
        O::QueryRmp => (Kind::Srq, 1, query_rmp_in::RMPN),
        O::AllocUar => (Kind::Uar, 0, alloc_uar_out::UAR),
        O::DeallocUar => (Kind::Uar, 2, dealloc_uar_in::UAR),
        O::AllocXrcd => (Kind::Xrcd, 0, alloc_xrcd_out::XRCD),
        O::DeallocXrcd => (Kind::Xrcd, 2, dealloc_xrcd_in::XRCD),
        O::AllocQCounter => (Kind::QCounter, 0, alloc_q_counter_out::COUNTER_SET_ID),
        O::DeallocQCounter => (Kind::QCounter, 2, dealloc_q_counter_in::COUNTER_SET_ID),
        O::QueryQCounter => (Kind::QCounter, 1, query_q_counter_in::COUNTER_SET_ID),
        _ => return None,
    })
}

/// [`owned`] for the Ethernet objects (TIS, TIR, RQT, SQ, RQ), which
/// Linux creates under the uid of the PD of a raw packet QP.
fn owned_eth(op: Opcode) -> Option<(Kind, u8, BitField)> {
    use Opcode as O;
    Some(match op {
        O::CreateTis => (Kind::Tis, 0, create_tis_out::TISN),
        O::ModifyTis => (Kind::Tis, 1, modify_tis_in::TISN),
        O::QueryTis => (Kind::Tis, 1, query_tis_in::TISN),
        O::DestroyTis => (Kind::Tis, 2, destroy_tis_in::TISN),
        O::CreateTir => (Kind::Tir, 0, create_tir_out::TIRN),
        O::ModifyTir => (Kind::Tir, 1, modify_tir_in::TIRN),
        O::QueryTir => (Kind::Tir, 1, query_tir_in::TIRN),
        O::DestroyTir => (Kind::Tir, 2, destroy_tir_in::TIRN),
        O::CreateRqt => (Kind::Rqt, 0, create_rqt_out::RQTN),
        O::ModifyRqt => (Kind::Rqt, 1, modify_rqt_in::RQTN),
        O::QueryRqt => (Kind::Rqt, 1, query_rqt_in::RQTN),
        O::DestroyRqt => (Kind::Rqt, 2, destroy_rqt_in::RQTN),
        O::CreateSq => (Kind::Sq, 0, create_sq_out::SQN),
        O::ModifySq => (Kind::Sq, 1, modify_sq_in::SQN),
        O::QuerySq => (Kind::Sq, 1, query_sq_in::SQN),
        O::DestroySq => (Kind::Sq, 2, destroy_sq_in::SQN),
        O::CreateRq => (Kind::Rq, 0, create_rq_out::RQN),
        O::ModifyRq => (Kind::Rq, 1, modify_rq_in::RQN),
        O::QueryRq => (Kind::Rq, 1, query_rq_in::RQN),
        O::DestroyRq => (Kind::Rq, 2, destroy_rq_in::RQN),
        _ => return None,
    })
}

/// The objects a command names that firmware checks the uid of: what a
/// new object will use (PD, CQs, SRQ, UAR, XRC domain) and the Q counter
/// a QP is bound to. EQs (`c_eqn`) are the function's, usable by every
/// uid; UMEMs are checked where they are resolved (fw/umem.rs).
fn refs(op: Opcode, input: &[u8]) -> Vec<(Kind, BitField)> {
    use Opcode as O;
    let at = |base: BitField, f: BitField| BitField::new(base.off + f.off, f.width);
    match op {
        O::CreateMkey => vec![(Kind::Pd, at(create_mkey_in::MEMORY_KEY_MKEY_ENTRY, mkc::PD))],
        O::CreateCq => vec![(Kind::Uar, at(create_cq_in::CQ_CONTEXT, cqc::UAR_PAGE))],
        O::CreateQp => {
            let q = create_qp_in::QPC;
            let mut v = vec![
                (Kind::Pd, at(q, qpc::PD)),
                (Kind::Cq, at(q, qpc::CQN_SND)),
                (Kind::Cq, at(q, qpc::CQN_RCV)),
                (Kind::Uar, at(q, qpc::UAR_PAGE)),
            ];
            // The SRQ a QP receives on. A DCI or an XRC initiator has no
            // receive side: Linux names its own default SRQ there for a
            // user's (create_dci, rq_type SRQ), which firmware ignores.
            let (rqt, stf) = (at(q, qpc::RQ_TYPE), at(q, qpc::ST));
            let receives = input.len() * 8 >= rqt.off + rqt.width
                && !matches!(stf.get(input) as u8, QPC_ST_DCI | QPC_ST_XRC);
            if receives && rqt.get(input) as u8 == rq_type::SRQ {
                v.push((Kind::Srq, at(q, qpc::SRQN_RMPN_XRQN)));
            }
            v
        }
        O::Rst2InitQp => vec![(Kind::QCounter, at(rst2init_qp_in::QPC, qpc::COUNTER_SET_ID))],
        O::CreateSrq => vec![(Kind::Pd, at(create_srq_in::SRQ_CONTEXT_ENTRY, srqc::PD))],
        O::CreateXrcSrq => {
            let x = create_xrc_srq_in::XRC_SRQ_CONTEXT_ENTRY;
            vec![
                (Kind::Pd, at(x, xrc_srqc::PD)),
                (Kind::Cq, at(x, xrc_srqc::CQN)),
                (Kind::Xrcd, at(x, xrc_srqc::XRCD)),
            ]
        }
        _ => Vec::new(),
    }
}

/// Whether an object owned by `owner` may be named by a command under
/// `uid`: its own uid's, or a shared one (`MLX5_SHARED_RESOURCE_UID`); uid
/// 0, the function's own driver, names any (Linux's mlx5_ib registers a
/// device-memory MR of a user PD with CREATE_MKEY under uid 0,
/// `mlx5_ib_get_dm_mr`, and real firmware takes it).
pub(super) fn may_use(owner: u16, uid: u16) -> bool {
    uid == 0 || owner == uid || owner == SHARED_RESOURCE_UID
}

/// Whether a command under `uid` may modify, query or destroy an object
/// owned by `owner`: its own; uid 0 (the kernel) any (Linux's
/// `mlx5_core_qp_query` sends QUERY_QP of a user's QP without its uid, and
/// real firmware answers it).
pub(super) fn may_manage(owner: u16, uid: u16) -> bool {
    uid == 0 || owner == uid
}

/// DevX state: user contexts, UMEMs, owners.
#[derive(Debug, Default)]
pub(crate) struct Devx {
    /// User contexts by uid, with the capabilities each was created with.
    pub uctxs: BTreeMap<u16, u32>,
    /// UMEMs by number.
    pub umems: BTreeMap<u32, super::umem::Umem>,
    /// The uid of every live object of the kinds [`owned`] names.
    pub owners: BTreeMap<(Kind, u32), u16>,
    /// The UMEMs each object's queues or doorbell records lie in.
    pub uses: BTreeMap<(Kind, u32), BTreeSet<u32>>,
    /// Data encryption keys (general objects of type 0xc, fw/dek.rs).
    pub deks: super::dek::Deks,
}

impl Devx {
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
    /// Whether `uid` may be named by a command: 0, the shared uid (when
    /// the function offers DevX) or a live user context.
    pub(super) fn uid_exists(&self, uid: u16) -> bool {
        uid == 0
            || self.devx.uctxs.contains_key(&uid)
            || (uid == SHARED_RESOURCE_UID && self.devx_supported())
    }

    /// Before a command runs: its uid must exist, an object it modifies,
    /// queries or destroys must be its uid's (uid 0 also manages shared
    /// ones), and the objects a new object uses its uid's or shared ones.
    /// Objects the model does not know are left to the command's own
    /// checks (BAD_RESOURCE).
    pub(super) fn devx_check(&self, op: Opcode, input: &[u8]) -> Result<(), Fail> {
        if matches!(op, Opcode::CreateUctx | Opcode::DestroyUctx) {
            return Ok(());
        }
        let uid = uid_of(input);
        if !self.uid_exists(uid) {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_UID));
        }
        let fits = |f: BitField| input.len() * 8 >= f.off + f.width;
        if let Some((kind, role, f)) = owned(op) {
            if role != Role::Create && fits(f) {
                let n = f.get(input) as u32;
                if let Some(&owner) = self.devx.owners.get(&(kind, n)) {
                    if !may_manage(owner, uid) {
                        return Err(fail(CmdStatus::BadParameter, synd::UID_MISMATCH));
                    }
                }
            }
        }
        for (kind, f) in refs(op, input) {
            if !fits(f) {
                continue;
            }
            let n = f.get(input) as u32;
            if let Some(&owner) = self.devx.owners.get(&(kind, n)) {
                if !may_use(owner, uid) {
                    tracing::debug!(?op, ?kind, n, owner, uid, "names another uid's object");
                    return Err(fail(CmdStatus::BadParameter, synd::REF_UID_MISMATCH));
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
                self.devx.owners.insert((kind, n), uid_of(input));
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

#[cfg(test)]
mod tests {
    use mlx5_hw::bits::BitField;
    use mlx5_hw::ifc::{create_qp_in, qpc};
    use mlx5_hw::opcode::Opcode;
    use mlx5_hw::qp::{QPC_ST_DCI, QPC_ST_RC, QPC_ST_XRC};

    use super::{refs, Kind};
    use crate::transport::qp::rq_type;

    /// A DCI or XRC QP names no SRQ firmware checks; an RC QP on an SRQ does.
    #[test]
    fn only_a_receiving_qp_names_its_srq() {
        let at = |f: BitField| BitField::new(create_qp_in::QPC.off + f.off, f.width);
        let mut q = vec![0u8; create_qp_in::SIZE_BYTES];
        at(qpc::RQ_TYPE).set(&mut q, u64::from(rq_type::SRQ));
        at(qpc::SRQN_RMPN_XRQN).set(&mut q, 2);
        for (st, srq) in [(QPC_ST_RC, true), (QPC_ST_DCI, false), (QPC_ST_XRC, false)] {
            at(qpc::ST).set(&mut q, u64::from(st));
            let named = refs(Opcode::CreateQp, &q)
                .iter()
                .any(|(k, _)| *k == Kind::Srq);
            assert_eq!(named, srq, "st {st}");
        }
    }
}
