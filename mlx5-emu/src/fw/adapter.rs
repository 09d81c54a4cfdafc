//! QUERY_ADAPTER and QUERY_SPECIAL_CONTEXTS.

use mlx5_hw::ifc::{query_adapter_in, query_adapter_out, query_special_contexts_out};

use super::{sized, CmdResult, Firmware};

/// Reserved lkey firmware reports.
pub(crate) const RESD_LKEY: u32 = 0x100;
/// Null mkey firmware reports.
pub(crate) const NULL_MKEY: u32 = 0x200;
/// Dump-fill mkey firmware reports.
pub(crate) const DUMP_FILL_MKEY: u32 = 0x300;
/// Terminate-scatter-list mkey firmware reports.
pub(crate) const TERMINATE_SCATTER_MKEY: u32 = 0x400;

impl Firmware {
    pub(super) fn query_adapter(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_adapter_in::SIZE_BYTES,
            query_adapter_out::SIZE_BYTES,
        )?;
        let mut out = vec![0u8; query_adapter_out::SIZE_BYTES];
        let at = query_adapter_out::QUERY_ADAPTER_STRUCT.off / 8;
        let n = self.caps.adapter.len().min(out.len() - at);
        out[at..at + n].copy_from_slice(&self.caps.adapter[..n]);
        Ok(out)
    }

    pub(super) fn query_special_contexts(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, 0x10, query_special_contexts_out::SIZE_BYTES)?;
        let mut out = vec![0u8; query_special_contexts_out::SIZE_BYTES];
        query_special_contexts_out::DUMP_FILL_MKEY.set(&mut out, u64::from(DUMP_FILL_MKEY));
        query_special_contexts_out::RESD_LKEY.set(&mut out, u64::from(RESD_LKEY));
        query_special_contexts_out::NULL_MKEY.set(&mut out, u64::from(NULL_MKEY));
        query_special_contexts_out::TERMINATE_SCATTER_LIST_MKEY
            .set(&mut out, u64::from(TERMINATE_SCATTER_MKEY));
        query_special_contexts_out::REPEATED_MKEY.set(&mut out, 0);
        Ok(out)
    }
}
