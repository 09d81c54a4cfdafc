//! Protection domains: ALLOC_PD / DEALLOC_PD (`ibv_alloc_pd`, `ibv_dealloc_pd`).
//!
//! Every memory key, QP and SRQ names its PD; the device refuses an access
//! whose QP and mkey are in different PDs. A [`Pd`] is `Send + Sync`; the
//! objects made in it keep it alive, so DEALLOC_PD runs only after the last
//! of them is gone (verbs' EBUSY becomes "later", and nothing leaks).

use std::sync::Arc;

use mlx5_hw::ifc::{alloc_pd_in, alloc_pd_out, dealloc_pd_in, dealloc_pd_out};
use mlx5_hw::ifc::{AllocPdIn, AllocPdOut, DeallocPdIn};
use mlx5_hw::opcode::Opcode;

use crate::device::{Context, Ctx};
use crate::{Error, Result};

#[derive(Debug)]
pub(crate) struct PdInner {
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) pdn: u32,
    /// The DevX user context that owns it (0: the driver's).
    uid: u16,
    done: std::sync::atomic::AtomicBool,
}

impl PdInner {
    fn dealloc(&self) -> Result<()> {
        if self.done.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        let mut inb = [0u8; dealloc_pd_in::SIZE_BYTES];
        DeallocPdIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DeallocPd.to_raw())
            .set_uid(self.uid)
            .set_pd(self.pdn);
        self.ctx
            .hca
            .cmd()
            .exec(&inb, dealloc_pd_out::SIZE_BYTES)
            .map(|_| ())
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if let Err(e) = self.dealloc() {
            tracing::warn!("DEALLOC_PD {:#x}: {e}", self.pdn);
        }
    }
}

/// A protection domain (`struct ibv_pd`).
#[derive(Debug, Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl Pd {
    /// ALLOC_PD.
    pub(crate) fn alloc(ctx: &Context) -> Result<Self> {
        Self::alloc_uid(ctx, 0)
    }

    /// ALLOC_PD under DevX user context `uid` (as the kernel allocates a
    /// PD of a DevX-enabled user context: raw commands of that context
    /// may then name it).
    pub(crate) fn alloc_uid(ctx: &Context, uid: u16) -> Result<Self> {
        let mut inb = [0u8; alloc_pd_in::SIZE_BYTES];
        AllocPdIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::AllocPd.to_raw())
            .set_uid(uid);
        let out = ctx.ctx.hca.cmd().exec(&inb, alloc_pd_out::SIZE_BYTES)?;
        let pdn = AllocPdOut::new_checked(&out[..])
            .map_err(|_| Error::BadOutput {
                opcode: Opcode::AllocPd,
                what: "short outbox",
            })?
            .pd();
        Ok(Self {
            inner: Arc::new(PdInner {
                ctx: ctx.ctx.clone(),
                pdn,
                uid,
                done: Default::default(),
            }),
        })
    }

    /// The PD number.
    pub fn pdn(&self) -> u32 {
        self.inner.pdn
    }

    /// The context.
    pub fn context(&self) -> Context {
        Context {
            ctx: self.inner.ctx.clone(),
        }
    }

    /// `ibv_dealloc_pd`: DEALLOC_PD now, or `Busy` if MRs, QPs, SRQs or
    /// AHs still use the PD (it is then deallocated after the last of them).
    pub fn dealloc(self) -> Result<()> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => inner.dealloc(),
            Err(_) => Err(Error::Busy("objects still use the PD")),
        }
    }
}
