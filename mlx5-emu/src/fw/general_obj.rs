//! CREATE / MODIFY / QUERY / DESTROY_GENERAL_OBJECT: one header
//! (`general_obj_in_cmd_hdr`: uid, obj_type, obj_id) and a dispatch by
//! object type. A type the function supports has its bit in
//! cmd_hca_cap.general_obj_types; the model supports none yet, so every
//! type is answered as firmware answers an unsupported one.

use mlx5_hw::ifc::{cmd_hca_cap, general_obj_in_cmd_hdr, general_obj_out_cmd_hdr};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;

use super::uctx::synd;
use super::{fail, sized, CmdResult, Firmware};

impl Firmware {
    /// Whether the function offers DevX (user contexts and UMEMs).
    pub(super) fn devx_supported(&self) -> bool {
        self.cap(cmd_hca_cap::LOG_MAX_UCTX) != 0
    }

    pub(super) fn general_obj(&mut self, op: Opcode, input: &[u8], outlen: usize) -> CmdResult {
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
        // No type is advertised, so none reaches here.
        Err(fail(CmdStatus::BadParameter, synd::GENERAL_OBJ_BAD_TYPE))
    }
}
