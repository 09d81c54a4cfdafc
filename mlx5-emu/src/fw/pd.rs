//! ALLOC_PD / DEALLOC_PD and ALLOC_TRANSPORT_DOMAIN /
//! DEALLOC_TRANSPORT_DOMAIN: numbers handed out lowest first from 1.

use mlx5_hw::ifc::{
    alloc_pd_out, alloc_transport_domain_out, dealloc_pd_in, dealloc_transport_domain_in,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::{lock, Inner};

impl Firmware {
    pub(super) fn alloc_pd(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, 0x10, alloc_pd_out::SIZE_BYTES)?;
        let max = 1u32 << self.cap(mlx5_hw::ifc::cmd_hca_cap::LOG_MAX_PD).min(24);
        let mut pds = lock(&inner.rdma.pds);
        let Some(pd) = (1..max).find(|p| !pds.contains(p)) else {
            return Err(fail(CmdStatus::NoResources, synd::PD_EXHAUSTED));
        };
        pds.insert(pd);
        tracing::debug!(pd, uid = super::uctx::uid_of(input), "ALLOC_PD");
        let mut out = vec![0u8; alloc_pd_out::SIZE_BYTES];
        alloc_pd_out::PD.set(&mut out, u64::from(pd));
        Ok(out)
    }

    pub(super) fn dealloc_pd(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, dealloc_pd_in::SIZE_BYTES, 0x10)?;
        let pd = dealloc_pd_in::PD.get(input) as u32;
        let r = &inner.rdma;
        if !lock(&r.pds).contains(&pd) {
            return Err(fail(CmdStatus::BadResource, synd::PD_UNKNOWN));
        }
        let used = crate::transport::rlock(&r.mkeys)
            .values()
            .any(|k| k.pd == pd)
            || crate::transport::rlock(&r.qps).values().any(|q| q.pd == pd)
            || crate::transport::rlock(&r.srqs)
                .values()
                .any(|s| s.pd == pd);
        if used {
            return Err(fail(CmdStatus::BadResourceState, synd::PD_IN_USE));
        }
        lock(&r.pds).remove(&pd);
        Ok(vec![0; 0x10])
    }

    pub(super) fn alloc_transport_domain(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(input, outlen, 0x10, alloc_transport_domain_out::SIZE_BYTES)?;
        let max = 1u32
            << self
                .cap(mlx5_hw::ifc::cmd_hca_cap::LOG_MAX_TRANSPORT_DOMAIN)
                .clamp(1, 24);
        let mut tds = lock(&inner.rdma.tds);
        let Some(td) = (1..max).find(|p| !tds.contains(p)) else {
            return Err(fail(CmdStatus::NoResources, synd::TD_EXHAUSTED));
        };
        tds.insert(td);
        let mut out = vec![0u8; alloc_transport_domain_out::SIZE_BYTES];
        alloc_transport_domain_out::TRANSPORT_DOMAIN.set(&mut out, u64::from(td));
        Ok(out)
    }

    pub(super) fn dealloc_transport_domain(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(input, outlen, dealloc_transport_domain_in::SIZE_BYTES, 0x10)?;
        let td = dealloc_transport_domain_in::TRANSPORT_DOMAIN.get(input) as u32;
        if !lock(&inner.rdma.tds).remove(&td) {
            return Err(fail(CmdStatus::BadResource, synd::TD_UNKNOWN));
        }
        Ok(vec![0; 0x10])
    }

    /// A general capability's current value.
    pub(crate) fn cap(&self, f: mlx5_hw::bits::BitField) -> u64 {
        self.caps.get(crate::profile::cap_type::GENERAL, f)
    }
}
