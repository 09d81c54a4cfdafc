//! The data encryption key (DEK, general object type 0xc): created with
//! its size (128 or 256 bits), purpose (TLS, IPsec, AES-XTS, MACsec), PD
//! and key (plaintext, or wrapped: `sw_wrapped`), queried back with its
//! state (ready), size, purpose, PD and opaque value but never its key
//! material, destroyed. Announced by the profiles whose firmware lists it
//! (`general_obj_types` bit 0xc, `log_max_dek`: the ConnectX-7). Firmware
//! offers no DEK modification the drivers use (Linux re-creates keys;
//! rdma-core's `mlx5dv_dek_*` creates, queries and destroys), so MODIFY
//! is refused. The model keeps the key; it encrypts nothing.

use std::collections::BTreeMap;

use mlx5_hw::devx::{
    ENCRYPTION_KEY_PURPOSE_AES_XTS, ENCRYPTION_KEY_PURPOSE_IPSEC, ENCRYPTION_KEY_PURPOSE_MACSEC,
    ENCRYPTION_KEY_PURPOSE_TLS, ENCRYPTION_KEY_SIZE_128, ENCRYPTION_KEY_SIZE_256,
    ENCRYPTION_KEY_STATE_READY,
};
use mlx5_hw::ifc::{
    cmd_hca_cap, create_encryption_key_in, encryption_key_obj, general_obj_out_cmd_hdr,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;

use super::uctx::{may_use, synd, uid_of, Kind};
use super::{fail, sized, CmdResult, Firmware};
use crate::{lock, Inner};

/// log2 of the DEKs the model keeps (cmd_hca_cap.log_max_dek).
pub(crate) const LOG_MAX_DEK: u64 = 12;

/// A DEK as created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dek {
    size: u8,
    purpose: u8,
    pd: u32,
    opaque: u64,
    sw_wrapped: bool,
    /// The key field as given (plaintext or wrapped key).
    key: Vec<u8>,
}

/// Where the object starts in the command input and the query output.
const OBJ_IN: usize = create_encryption_key_in::ENCRYPTION_KEY_OBJECT.off / 8;
const OBJ_OUT: usize = general_obj_out_cmd_hdr::SIZE_BYTES;

impl Firmware {
    /// One DEK command (the header's type, uid and ownership checked).
    pub(super) fn dek(
        &mut self,
        inner: &Inner,
        op: Opcode,
        id: u32,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        match op {
            Opcode::CreateGeneralObject => self.create_dek(inner, input, outlen),
            Opcode::QueryGeneralObject => {
                let d = self.devx.deks.get(&id).ok_or(unknown())?;
                let mut out = vec![0u8; OBJ_OUT + encryption_key_obj::SIZE_BYTES];
                general_obj_out_cmd_hdr::OBJ_ID.set(&mut out, u64::from(id));
                let o = &mut out[OBJ_OUT..];
                encryption_key_obj::STATE.set(o, u64::from(ENCRYPTION_KEY_STATE_READY));
                encryption_key_obj::SW_WRAPPED.set(o, u64::from(d.sw_wrapped));
                encryption_key_obj::KEY_SIZE.set(o, u64::from(d.size));
                encryption_key_obj::KEY_PURPOSE.set(o, u64::from(d.purpose));
                encryption_key_obj::PD.set(o, u64::from(d.pd));
                encryption_key_obj::OPAQUE.set(o, d.opaque);
                Ok(out)
            }
            Opcode::ModifyGeneralObject => Err(fail(
                CmdStatus::BadParameter,
                synd::GENERAL_OBJ_NOT_MODIFIABLE,
            )),
            _ => {
                self.devx.deks.remove(&id).ok_or(unknown())?;
                Ok(vec![0; general_obj_out_cmd_hdr::SIZE_BYTES])
            }
        }
    }

    fn create_dek(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_encryption_key_in::SIZE_BYTES,
            general_obj_out_cmd_hdr::SIZE_BYTES,
        )?;
        let o = &input[OBJ_IN..];
        let size = encryption_key_obj::KEY_SIZE.get(o) as u8;
        let purpose = encryption_key_obj::KEY_PURPOSE.get(o) as u8;
        let sizes = [ENCRYPTION_KEY_SIZE_128, ENCRYPTION_KEY_SIZE_256];
        let purposes = [
            ENCRYPTION_KEY_PURPOSE_TLS,
            ENCRYPTION_KEY_PURPOSE_IPSEC,
            ENCRYPTION_KEY_PURPOSE_AES_XTS,
            ENCRYPTION_KEY_PURPOSE_MACSEC,
        ];
        if !sizes.contains(&size) || !purposes.contains(&purpose) {
            return Err(fail(CmdStatus::BadParameter, synd::DEK_BAD_PARAM));
        }
        let pd = encryption_key_obj::PD.get(o) as u32;
        if !lock(&inner.rdma.pds).contains(&pd) {
            return Err(fail(CmdStatus::BadResource, synd::DEK_BAD_PD));
        }
        let owner = self.devx.owners.get(&(Kind::Pd, pd)).copied().unwrap_or(0);
        if !may_use(owner, uid_of(input)) {
            return Err(fail(CmdStatus::BadParameter, synd::REF_UID_MISMATCH));
        }
        let max = 1u32 << self.cap(cmd_hca_cap::LOG_MAX_DEK).min(24);
        let Some(id) = (1..max).find(|i| !self.devx.deks.contains_key(i)) else {
            return Err(fail(CmdStatus::NoResources, synd::DEK_EXHAUSTED));
        };
        let k = encryption_key_obj::KEY;
        let key = o[k.off / 8..(k.off + k.width) / 8].to_vec();
        self.devx.deks.insert(
            id,
            Dek {
                size,
                purpose,
                pd,
                opaque: encryption_key_obj::OPAQUE.get(o),
                sw_wrapped: encryption_key_obj::SW_WRAPPED.get(o) != 0,
                key,
            },
        );
        tracing::debug!(id, size, purpose, pd, "CREATE_GENERAL_OBJECT DEK");
        let mut out = vec![0u8; general_obj_out_cmd_hdr::SIZE_BYTES];
        general_obj_out_cmd_hdr::OBJ_ID.set(&mut out, u64::from(id));
        Ok(out)
    }
}

fn unknown() -> super::Fail {
    fail(CmdStatus::BadResource, synd::GENERAL_OBJ_UNKNOWN)
}

/// The DEKs by number.
pub(crate) type Deks = BTreeMap<u32, Dek>;
