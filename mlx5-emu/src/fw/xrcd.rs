//! ALLOC_XRCD / DEALLOC_XRCD: XRC domains, numbers handed out lowest first
//! from 1 up to 2^log_max_xrcd (mlx5_ib allocates two at probe for its
//! device resources when the `xrc` capability is set).

use mlx5_hw::ifc::{alloc_xrcd_in, alloc_xrcd_out, cmd_hca_cap, dealloc_xrcd_in};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::{lock, Inner};

impl Firmware {
    pub(super) fn alloc_xrcd(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            alloc_xrcd_in::SIZE_BYTES,
            alloc_xrcd_out::SIZE_BYTES,
        )?;
        if self.cap(cmd_hca_cap::XRC) == 0 {
            return Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE));
        }
        self.check_uid(alloc_xrcd_in::UID.get(input))?;
        let max = 1u32 << self.cap(cmd_hca_cap::LOG_MAX_XRCD).clamp(1, 24);
        let mut t = lock(&inner.rdma.xrcds);
        let Some(xrcd) = (1..max).find(|x| !t.contains(x)) else {
            return Err(fail(CmdStatus::NoResources, synd::XRCD_EXHAUSTED));
        };
        t.insert(xrcd);
        let mut out = vec![0u8; alloc_xrcd_out::SIZE_BYTES];
        alloc_xrcd_out::XRCD.set(&mut out, u64::from(xrcd));
        Ok(out)
    }

    pub(super) fn dealloc_xrcd(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, dealloc_xrcd_in::SIZE_BYTES, 0x10)?;
        self.check_uid(dealloc_xrcd_in::UID.get(input))?;
        let xrcd = dealloc_xrcd_in::XRCD.get(input) as u32;
        let r = &inner.rdma;
        if !lock(&r.xrcds).contains(&xrcd) {
            return Err(fail(CmdStatus::BadResource, synd::XRCD_UNKNOWN));
        }
        if crate::transport::rlock(&r.srqs)
            .values()
            .any(|s| s.xrcd == xrcd)
        {
            return Err(fail(CmdStatus::BadResourceState, synd::XRCD_IN_USE));
        }
        lock(&r.xrcds).remove(&xrcd);
        Ok(vec![0; 0x10])
    }

    /// A command's `uid`: 0 (the kernel's), a live DevX user context or,
    /// where the function offers DevX, the shared uid; anything else (every
    /// uid but 0 on a ConnectX-4 Lx, log_max_uctx 0) is a bad parameter.
    pub(super) fn check_uid(&self, uid: u64) -> Result<(), super::Fail> {
        if !u16::try_from(uid).is_ok_and(|u| self.uid_exists(u)) {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_UID));
        }
        Ok(())
    }
}
