//! DevX: raw PRM commands under a user context, named as rdma-core's
//! `mlx5dv_devx_*` (`mlx5dv_devx_umem_reg`, `mlx5dv_devx_obj_create`, ...).
//!
//! [`DevxCtx::open`] creates a user context (CREATE_UCTX); every command it
//! sends carries the context's `uid` (`general_obj_in_cmd_hdr.uid`, set as
//! the kernel's DevX sets it), so firmware keeps the objects it creates
//! apart from the driver's own (uid 0) and from other contexts'.
//! [`DevxCtx::umem_reg_buffer`] registers a [`DmaBuffer`] range as a UMEM
//! (CREATE_UMEM with the MTT list of its 4 KiB pages); queues and doorbell
//! records created by raw commands can then lie in it (`cq_umem_id`,
//! `wq_umem_id`, `dbr_umem_id`). [`DevxCtx::obj_create`] runs a raw create
//! command and remembers how to destroy what it made (as the kernel builds
//! the destroy command from the create's output); [`DevxObj::modify`] and
//! [`DevxObj::query`] run raw commands on it; [`DevxCtx::general_cmd`]
//! runs any other command under the uid. Firmware failures come back as
//! [`Error::Cmd`] with the PRM status and syndrome.
//!
//! CQs and QPs created this way are polled and posted to by the verbs data
//! path through [`DevxCq::from_devx`] and [`DevxQp::from_devx`], doorbells
//! on a UAR of the context's ([`DevxCtx::alloc_uar`]).
//!
//! Asynchronous commands (`mlx5dv_devx_obj_query_async`, a completion
//! queue the caller polls) and object event subscription on an event
//! channel of the caller's are in `events.rs` ([`DevxCmdComp`],
//! [`DevxEventChannel`]).

use std::sync::Arc;

use mlx5_hw::devx::{MTT_RD_EN, MTT_WR_EN};
use mlx5_hw::ifc::{
    alloc_pd_out, create_cq_out, create_mkey_out, create_qp_out, create_srq_out, create_uctx_in,
    create_uctx_out, create_umem_in, create_umem_out, dealloc_pd_in, destroy_cq_in,
    destroy_mkey_in, destroy_qp_in, destroy_srq_in, destroy_uctx_in, destroy_uctx_out,
    destroy_umem_in, general_obj_in_cmd_hdr, general_obj_out_cmd_hdr, uctx, umem,
};
use mlx5_hw::opcode::Opcode;
use vfio::{DmaBuffer, Iova};

use crate::device::Context;
use crate::{Error, Result};

mod events;
mod queues;
pub use events::{DevxAsyncCmd, DevxCmdComp, DevxEvent, DevxEventChannel};
pub use queues::{DevxCq, DevxCqRings, DevxQp, DevxQpRings, DevxUar};

/// The page size of the UMEMs this driver registers.
const UMEM_PAGE: u64 = 4096;
/// The output of a destroy command (status, syndrome, reserved).
const DESTROY_OUT: usize = destroy_uctx_out::SIZE_BYTES;

/// A DevX user context (`mlx5dv_devx` on an `ibv_context` opened with
/// `MLX5DV_CONTEXT_FLAGS_DEVX`).
#[derive(Debug)]
pub struct DevxCtx {
    ctx: Context,
    uid: u16,
}

/// A registered UMEM (`struct mlx5dv_devx_umem`).
#[derive(Debug)]
pub struct DevxUmem {
    ctx: Context,
    uid: u16,
    umem_id: u32,
    /// The buffer it holds (none for process memory the caller owns).
    _buf: Option<Arc<DmaBuffer>>,
    iova: Iova,
    map_len: u64,
    done: bool,
}

/// An object created by a raw command (`struct mlx5dv_devx_obj`).
#[derive(Debug)]
pub struct DevxObj {
    ctx: Context,
    uid: u16,
    /// What the create command returned.
    out: Vec<u8>,
    /// The command that destroys it.
    destroy: Vec<u8>,
    done: bool,
}

/// Sets a command's uid (the kernel's DevX does this for every command).
fn with_uid(input: &[u8], uid: u16) -> Result<Vec<u8>> {
    if input.len() < general_obj_in_cmd_hdr::SIZE_BYTES.min(8) {
        return Err(Error::Invalid("DevX command shorter than its header"));
    }
    let mut v = input.to_vec();
    general_obj_in_cmd_hdr::UID.set(&mut v, u64::from(uid));
    Ok(v)
}

fn opcode(input: &[u8]) -> Opcode {
    Opcode::from(general_obj_in_cmd_hdr::OPCODE.get(input) as u16)
}

/// The command that destroys what `create` made (its output `out`), for
/// the create commands DevX objects come from.
fn destroy_cmd(create: &[u8], out: &[u8], uid: u16) -> Result<Vec<u8>> {
    use Opcode as O;
    let (op, len, field, n) = match opcode(create) {
        O::CreateCq => (
            O::DestroyCq,
            destroy_cq_in::SIZE_BYTES,
            destroy_cq_in::CQN,
            create_cq_out::CQN.get(out),
        ),
        O::CreateQp => (
            O::DestroyQp,
            destroy_qp_in::SIZE_BYTES,
            destroy_qp_in::QPN,
            create_qp_out::QPN.get(out),
        ),
        O::CreateSrq => (
            O::DestroySrq,
            destroy_srq_in::SIZE_BYTES,
            destroy_srq_in::SRQN,
            create_srq_out::SRQN.get(out),
        ),
        O::CreateMkey => (
            O::DestroyMkey,
            destroy_mkey_in::SIZE_BYTES,
            destroy_mkey_in::MKEY_INDEX,
            create_mkey_out::MKEY_INDEX.get(out),
        ),
        O::AllocPd => (
            O::DeallocPd,
            dealloc_pd_in::SIZE_BYTES,
            dealloc_pd_in::PD,
            alloc_pd_out::PD.get(out),
        ),
        O::CreateGeneralObject => {
            let mut d = vec![0u8; general_obj_in_cmd_hdr::SIZE_BYTES];
            general_obj_in_cmd_hdr::OPCODE.set(&mut d, u64::from(O::DestroyGeneralObject.to_raw()));
            general_obj_in_cmd_hdr::UID.set(&mut d, u64::from(uid));
            general_obj_in_cmd_hdr::OBJ_TYPE
                .set(&mut d, general_obj_in_cmd_hdr::OBJ_TYPE.get(create));
            general_obj_in_cmd_hdr::OBJ_ID.set(&mut d, general_obj_out_cmd_hdr::OBJ_ID.get(out));
            return Ok(d);
        }
        _ => return Err(Error::Invalid("not a DevX object create command")),
    };
    let mut d = vec![0u8; len];
    general_obj_in_cmd_hdr::OPCODE.set(&mut d, u64::from(op.to_raw()));
    general_obj_in_cmd_hdr::UID.set(&mut d, u64::from(uid));
    field.set(&mut d, n);
    Ok(d)
}

impl DevxCtx {
    /// Opens a user context asking for `caps` (MLX5_UCTX_CAP_*), as
    /// `mlx5dv_open_device` with `MLX5DV_CONTEXT_FLAGS_DEVX` does.
    pub fn open(ctx: &Context, caps: u32) -> Result<Self> {
        if !supported(ctx) {
            return Err(Error::Invalid(
                "the function offers no DevX (log_max_uctx 0)",
            ));
        }
        let mut c = vec![0u8; create_uctx_in::SIZE_BYTES];
        general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(Opcode::CreateUctx.to_raw()));
        let at = create_uctx_in::UCTX.off / 8;
        uctx::CAP.set(&mut c[at..], u64::from(caps));
        let out = ctx.hca().cmd().exec(&c, create_uctx_out::SIZE_BYTES)?;
        let uid = create_uctx_out::UID.get(&out) as u16;
        Ok(Self {
            ctx: ctx.clone(),
            uid,
        })
    }

    /// The context's uid.
    pub fn uid(&self) -> u16 {
        self.uid
    }

    /// `mlx5dv_devx_umem_reg` over `len` bytes of `buf` from `offset`:
    /// the buffer is mapped for DMA and its pages registered; the UMEM
    /// holds the buffer. `write`: the device may write (queues, doorbell
    /// records).
    pub fn umem_reg_buffer(
        &self,
        buf: &Arc<DmaBuffer>,
        offset: usize,
        len: usize,
        write: bool,
    ) -> Result<DevxUmem> {
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > buf.len()) {
            return Err(Error::Invalid("UMEM range outside the buffer"));
        }
        let dma = self.ctx.hca().dma();
        let map_len = (buf.len() as u64).next_multiple_of(UMEM_PAGE);
        let iova = dma.alloc_iova(map_len, UMEM_PAGE)?;
        if let Err(e) = dma.func.dma_map(iova, buf) {
            dma.free_iova(iova, map_len);
            return Err(e.into());
        }
        let first = offset as u64 / UMEM_PAGE;
        let last = (offset + len - 1) as u64 / UMEM_PAGE;
        let at = Iova(iova.0 + first * UMEM_PAGE);
        let pages = last - first + 1;
        let page_offset = offset as u64 % UMEM_PAGE;
        self.create_umem(
            at,
            pages,
            page_offset,
            write,
            iova,
            map_len,
            Some(buf.clone()),
        )
    }

    /// `mlx5dv_devx_umem_reg` over `len` bytes of process memory at
    /// `addr`: its pages are mapped for DMA (one IOVA range) and
    /// registered. `write`: the device may write.
    ///
    /// # Safety
    ///
    /// `addr .. addr + len` stays mapped while the UMEM is registered and
    /// is touched only through volatile or atomic accesses (the device
    /// reads and writes it concurrently).
    #[allow(unsafe_code)] // Process memory the caller vouches for.
    pub unsafe fn umem_reg_host(&self, addr: *mut u8, len: usize, write: bool) -> Result<DevxUmem> {
        let a = addr as u64;
        let end = a
            .checked_add(len as u64)
            .and_then(|e| e.checked_next_multiple_of(UMEM_PAGE))
            .ok_or(Error::Invalid("UMEM range wraps"))?;
        if len == 0 || addr.is_null() {
            return Err(Error::Invalid("empty UMEM"));
        }
        let start = a & !(UMEM_PAGE - 1);
        let map_len = end - start;
        let dma = self.ctx.hca().dma();
        let iova = dma.alloc_iova(map_len, UMEM_PAGE)?;
        // SAFETY: forwarded from this function's contract.
        if let Err(e) = unsafe { dma.func.dma_map_host(iova, start, map_len) } {
            dma.free_iova(iova, map_len);
            return Err(e.into());
        }
        let pages = map_len / UMEM_PAGE;
        self.create_umem(iova, pages, a - start, write, iova, map_len, None)
    }

    /// CREATE_UMEM of `pages` 4 KiB pages mapped from `at`, the memory
    /// starting `page_offset` into the first; the mapping (`iova`,
    /// `map_len`) is undone if firmware refuses.
    #[allow(clippy::too_many_arguments)]
    fn create_umem(
        &self,
        at: Iova,
        pages: u64,
        page_offset: u64,
        write: bool,
        iova: Iova,
        map_len: u64,
        buf: Option<Arc<DmaBuffer>>,
    ) -> Result<DevxUmem> {
        let dma = self.ctx.hca().dma();
        let n = pages as usize;
        let mut c = vec![0u8; create_umem_in::SIZE_BYTES + 8 * n];
        general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(Opcode::CreateUmem.to_raw()));
        general_obj_in_cmd_hdr::UID.set(&mut c, u64::from(self.uid));
        let u = &mut c[create_umem_in::UMEM.off / 8..];
        umem::PAGE_OFFSET.set(u, page_offset);
        umem::NUM_OF_MTT.set(u, pages);
        let flags = MTT_RD_EN | if write { MTT_WR_EN } else { 0 };
        for i in 0..n {
            let e = (at.0 + i as u64 * UMEM_PAGE) | flags;
            let off = umem::MTT.off / 8 + 8 * i;
            u[off..off + 8].copy_from_slice(&e.to_be_bytes());
        }
        let out = match self.ctx.hca().cmd().exec(&c, create_umem_out::SIZE_BYTES) {
            Ok(o) => o,
            Err(e) => {
                if let Err(e2) = dma.func.dma_unmap(iova, map_len) {
                    tracing::warn!("dma_unmap after a failed CREATE_UMEM: {e2}");
                }
                dma.free_iova(iova, map_len);
                return Err(e);
            }
        };
        Ok(DevxUmem {
            ctx: self.ctx.clone(),
            uid: self.uid,
            umem_id: create_umem_out::UMEM_ID.get(&out) as u32,
            _buf: buf,
            iova,
            map_len,
            done: false,
        })
    }

    /// A PD of this user context (ALLOC_PD under its uid), as the kernel
    /// allocates `ibv_alloc_pd` of a context opened with
    /// `MLX5DV_CONTEXT_FLAGS_DEVX`: raw commands of this context may name
    /// it (`qpc.pd`, `mkc.pd`), and the verbs use it as any PD.
    pub fn alloc_pd(&self) -> Result<crate::pd::Pd> {
        crate::pd::Pd::alloc_uid(&self.ctx, self.uid)
    }

    /// `mlx5dv_devx_query_eqn`: the EQ number of completion vector
    /// `vector` (`cqc.c_eqn` of a CQ made by a raw command); a vector the
    /// context does not have is `EINVAL`, as `mlx5_comp_eqn_get` answers.
    pub fn query_eqn(&self, vector: u32) -> Result<u32> {
        self.ctx.ctx.comp_eqn(Some(vector as usize)).map(u32::from)
    }

    /// `mlx5dv_devx_obj_create`: runs the raw create command `input` under
    /// the context's uid; the object remembers how to destroy itself.
    pub fn obj_create(&self, input: &[u8], outlen: usize) -> Result<DevxObj> {
        let c = with_uid(input, self.uid)?;
        let out = self.ctx.hca().cmd().exec(&c, outlen)?;
        let destroy = match destroy_cmd(&c, &out, self.uid) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("DevX create of an object it cannot destroy: {e}");
                return Err(e);
            }
        };
        Ok(DevxObj {
            ctx: self.ctx.clone(),
            uid: self.uid,
            out,
            destroy,
            done: false,
        })
    }

    /// `mlx5dv_devx_general_cmd`: any command, under the context's uid.
    pub fn general_cmd(&self, input: &[u8], outlen: usize) -> Result<Vec<u8>> {
        self.ctx
            .hca()
            .cmd()
            .exec(&with_uid(input, self.uid)?, outlen)
    }

    /// Destroys the user context (DESTROY_UCTX); firmware refuses while
    /// objects or UMEMs live under it.
    pub fn close(self) -> Result<()> {
        let mut c = vec![0u8; destroy_uctx_in::SIZE_BYTES];
        general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(Opcode::DestroyUctx.to_raw()));
        destroy_uctx_in::UID.set(&mut c, u64::from(self.uid));
        self.ctx.hca().cmd().exec(&c, DESTROY_OUT).map(|_| ())
    }
}

impl DevxUmem {
    /// `umem_id`, for `cq_umem_id`, `wq_umem_id`, `dbr_umem_id`.
    pub fn umem_id(&self) -> u32 {
        self.umem_id
    }

    /// `mlx5dv_devx_umem_dereg`: DESTROY_UMEM, then the DMA mapping goes.
    /// On a firmware refusal (an object still uses it) the UMEM is kept,
    /// registered, and may be deregistered again.
    pub fn dereg(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        let mut c = vec![0u8; destroy_umem_in::SIZE_BYTES];
        general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(Opcode::DestroyUmem.to_raw()));
        general_obj_in_cmd_hdr::UID.set(&mut c, u64::from(self.uid));
        destroy_umem_in::UMEM_ID.set(&mut c, u64::from(self.umem_id));
        self.ctx.hca().cmd().exec(&c, DESTROY_OUT)?;
        self.done = true;
        let dma = self.ctx.hca().dma();
        if let Err(e) = dma.func.dma_unmap(self.iova, self.map_len) {
            tracing::warn!("dma_unmap of a UMEM: {e}");
        }
        dma.free_iova(self.iova, self.map_len);
        Ok(())
    }
}

impl Drop for DevxUmem {
    fn drop(&mut self) {
        if let Err(e) = self.dereg() {
            tracing::warn!(umem = self.umem_id, "DESTROY_UMEM at drop: {e}");
        }
    }
}

impl DevxObj {
    /// What the create command returned (e.g. `create_cq_out.cqn`).
    pub fn create_out(&self) -> &[u8] {
        &self.out
    }

    /// The opcode of the command that destroys it (what kind it is).
    pub fn destroy_opcode(&self) -> Option<Opcode> {
        (self.destroy.len() >= 2).then(|| opcode(&self.destroy))
    }

    /// `mlx5dv_devx_obj_modify`: a raw modify command on the object.
    pub fn modify(&self, input: &[u8], outlen: usize) -> Result<Vec<u8>> {
        self.ctx
            .hca()
            .cmd()
            .exec(&with_uid(input, self.uid)?, outlen)
    }

    /// `mlx5dv_devx_obj_query`: a raw query command on the object.
    pub fn query(&self, input: &[u8], outlen: usize) -> Result<Vec<u8>> {
        self.modify(input, outlen)
    }

    /// `mlx5dv_devx_obj_destroy`; on a firmware refusal the object is kept
    /// (and destroyed again at drop).
    pub fn destroy(mut self) -> Result<()> {
        self.destroy_in_place()
    }

    /// The destroy command, keeping the object on a firmware refusal
    /// (another object still uses it: destroy that first, then this
    /// again); after success it is gone and dropping it does nothing.
    pub fn destroy_in_place(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.ctx.hca().cmd().exec(&self.destroy, DESTROY_OUT)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for DevxObj {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_in_place() {
            tracing::warn!("DevX object destroy at drop: {e}");
        }
    }
}

/// Whether the function offers DevX (cmd_hca_cap.log_max_uctx).
pub fn supported(ctx: &Context) -> bool {
    ctx.hca().caps().gen().log_max_uctx() != 0
}
