//! CREATE / MODIFY / QUERY / DESTROY_GENERAL_OBJECT: one header
//! (`general_obj_in_cmd_hdr`: uid, obj_type, obj_id) and a dispatch by
//! object type. A type the function supports has its bit in
//! cmd_hca_cap.general_obj_types (a type beyond bit 63 or without its bit
//! is BAD_PARAMETER `GENERAL_OBJ_BAD_TYPE`); the model implements the DEK
//! (fw/dek.rs), listed by the profiles whose firmware has it. Objects are
//! numbered per type from 1, owned by the uid that created them (modified,
//! queried and destroyed only under it, as every DevX object) and keep
//! their user context alive.

use mlx5_hw::devx::GENERAL_OBJECT_TYPES_ENCRYPTION_KEY as DEK;
use mlx5_hw::ifc::{cmd_hca_cap, general_obj_in_cmd_hdr, general_obj_out_cmd_hdr};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;

use super::uctx::{may_manage, synd, uid_of, Kind};
use super::{fail, sized, CmdResult, Firmware};
use crate::Inner;

impl Firmware {
    /// Whether the function offers DevX (user contexts and UMEMs).
    pub(super) fn devx_supported(&self) -> bool {
        self.cap(cmd_hca_cap::LOG_MAX_UCTX) != 0
    }

    pub(super) fn general_obj(
        &mut self,
        inner: &Inner,
        op: Opcode,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        if !self.devx_supported() {
            return Err(fail(CmdStatus::BadOperation, super::synd::BAD_OPCODE));
        }
        sized(
            input,
            outlen,
            general_obj_in_cmd_hdr::SIZE_BYTES,
            general_obj_out_cmd_hdr::SIZE_BYTES,
        )?;
        let ty = general_obj_in_cmd_hdr::OBJ_TYPE.get(input);
        let supported = self.cap(cmd_hca_cap::GENERAL_OBJ_TYPES);
        if ty >= 64 || supported & (1 << ty) == 0 {
            tracing::debug!(op = ?op, ty, "general object type not supported");
            return Err(fail(CmdStatus::BadParameter, synd::GENERAL_OBJ_BAD_TYPE));
        }
        let ty = ty as u16;
        let uid = uid_of(input);
        let id = general_obj_in_cmd_hdr::OBJ_ID.get(input) as u32;
        if op != Opcode::CreateGeneralObject {
            let Some(&owner) = self.devx.owners.get(&(Kind::General(ty), id)) else {
                return Err(fail(CmdStatus::BadResource, synd::GENERAL_OBJ_UNKNOWN));
            };
            if !may_manage(owner, uid) {
                return Err(fail(CmdStatus::BadParameter, synd::UID_MISMATCH));
            }
        }
        let out = match ty {
            DEK => self.dek(inner, op, id, input, outlen)?,
            // general_obj_types lists only the types above.
            _ => return Err(fail(CmdStatus::BadParameter, synd::GENERAL_OBJ_BAD_TYPE)),
        };
        match op {
            Opcode::CreateGeneralObject => {
                let id = general_obj_out_cmd_hdr::OBJ_ID.get(&out) as u32;
                self.devx.owners.insert((Kind::General(ty), id), uid);
            }
            Opcode::DestroyGeneralObject => {
                self.devx.owners.remove(&(Kind::General(ty), id));
            }
            _ => {}
        }
        Ok(out)
    }
}
