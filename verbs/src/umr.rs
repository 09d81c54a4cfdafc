//! UMR work requests (`MLX5_OPCODE_UMR`): an mkey modified from a send
//! queue instead of by a firmware command, as mlx5dv posts them on an RC
//! QP and Linux's mlx5_ib on its UMR QP (`mlx5r_umr_*`). A WQE is the
//! control segment (its `imm` names the mkey), the UMR control segment
//! (check-free flags, the mkey mask) and the mkey context segment (the
//! new values of the fields the mask selects), PRM "User-Mode Memory
//! Registration". Every mkey this driver creates is UMR-enabled (`mkc.umr_en`).
//!
//! The driver posts UMRs of its own too, as Linux's `mlx5r_umr` does: a
//! [`UmrEngine`] is a PD, a CQ and a REG_UMR QP (qpc `st` 0xc: it may
//! change keys of any PD), made at the first use and shared by the
//! context; a UMR is posted there under its lock and its CQ polled until
//! it completes. [`Mr::rereg`] (`ibv_rereg_mr`) uses it: in place when the
//! change allows, else by a new key, as `mlx5_ib_rereg_user_mr` decides.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlx5_hw::ifc::{mkc, mkey_seg, wqe_data_seg, wqe_umr_ctrl_seg, Mkc, WqeDataSeg};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::qp::QPC_ST_REG_UMR;
use mlx5_hw::wqe::{self as w, WqeOpcode};
use vfio::clock::Deadline;
use vfio::DmaBuffer;
use zerocopy::{FromZeros, IntoBytes};

use crate::cq::{Cq, WcOpcode, WcStatus};
use crate::device::{Context, Ctx};
use crate::mr::{access, check_access, Mapping, Mr, Placement, MKC_QPN_NONE};
use crate::pd::{Pd, PdInner};
use crate::qp::{attr_mask, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType};
use crate::wqe::CTRL_SIZE;
use crate::wr::PostError;
use crate::{Error, Result};

/// Most MTT entries a UMR of this driver carries inline (256 bytes of
/// translation; a larger one re-registers by a new key).
pub const UMR_INLINE_MTT_MAX: usize = 32;

/// The most translation bytes one pointed UMR writes: the control
/// segment's 16-bit octoword count, less one 64-byte alignment unit
/// (`MLX5_MAX_UMR_CHUNK`).
pub const UMR_XLT_CHUNK: usize = (1 << (16 + 4)) - w::UMR_FLEX_ALIGNMENT;

/// What the UMR checks of the key's state before changing it
/// (`MLX5_UMR_CHECK_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UmrCheck {
    /// Nothing.
    None,
    /// The key must be free (`MLX5_UMR_CHECK_NOT_FREE`: fail if not free).
    Free,
    /// The key must be in use (`MLX5_UMR_CHECK_FREE`: fail if free).
    NotFree,
}

/// One UMR work request: which key, what to check, what to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UmrWr {
    /// The key (index and key byte).
    pub mkey: u32,
    /// The check made first.
    pub check: UmrCheck,
    /// New access rights (`mr::access` bits; local read is always on).
    pub access: Option<u32>,
    /// New protection domain number.
    pub pdn: Option<u32>,
    /// Make the key free (`Some(true)`: invalidate) or in use.
    pub free: Option<bool>,
    /// New start address, length and log2 MTT page size (with the MTT
    /// entries given to the post).
    pub xlt: Option<UmrXlt>,
}

/// The mkey context of a translation change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UmrXlt {
    /// mkc `start_addr`.
    pub start: u64,
    /// mkc `len`.
    pub len: u64,
    /// mkc `log_page_size`.
    pub log_page: u32,
}

impl UmrWr {
    /// A request that changes nothing of `mkey` yet.
    pub fn new(mkey: u32) -> Self {
        Self {
            mkey,
            check: UmrCheck::None,
            access: None,
            pdn: None,
            free: None,
            xlt: None,
        }
    }

    /// The UMR control and mkey context segments (after the control
    /// segment) into `wqe`, then `mtt` inline (padded to an octoword);
    /// their length. `wide`: the device takes 6-bit page sizes
    /// (`umr_log_entity_size_5`).
    fn write_segments(&self, wqe: &mut [u8], mtt: &[u64], wide: bool) -> usize {
        let mut flags = match self.check {
            UmrCheck::None => 0,
            UmrCheck::Free => w::UMR_CHECK_NOT_FREE,
            UmrCheck::NotFree => w::UMR_CHECK_FREE,
        };
        let mut mask = 0u64;
        let seg_at = wqe_umr_ctrl_seg::SIZE_BYTES;
        let seg = &mut wqe[seg_at..seg_at + mkey_seg::SIZE_BYTES];
        mkc::QPN.set(seg, u64::from(MKC_QPN_NONE));
        let mut m = Mkc::new_unchecked(&mut *seg);
        if let Some(a) = self.access {
            mask |= w::MKEY_MASK_LR
                | w::MKEY_MASK_LW
                | w::MKEY_MASK_RR
                | w::MKEY_MASK_RW
                | w::MKEY_MASK_A;
            m.set_lr(true)
                .set_lw(a & access::LOCAL_WRITE != 0)
                .set_rr(a & access::REMOTE_READ != 0)
                .set_rw(a & access::REMOTE_WRITE != 0)
                .set_a(a & access::REMOTE_ATOMIC != 0);
        }
        if let Some(pd) = self.pdn {
            mask |= w::MKEY_MASK_PD;
            m.set_pd(pd);
        }
        if let Some(f) = self.free {
            mask |= w::MKEY_MASK_FREE;
            m.set_free(f);
        }
        if let Some(x) = self.xlt {
            // Linux's `get_umr_update_translation_mask`.
            mask |= w::MKEY_MASK_LEN | w::MKEY_MASK_PAGE_SIZE | w::MKEY_MASK_START_ADDR;
            if wide {
                mask |= w::MKEY_MASK_PAGE_SIZE_5;
            }
            m.set_start_addr(x.start)
                .set_len(x.len)
                .set_log_page_size(x.log_page as u8);
        }
        let mut n = wqe_umr_ctrl_seg::SIZE_BYTES + mkey_seg::SIZE_BYTES;
        if !mtt.is_empty() {
            flags |= w::UMR_INLINE;
            let octs = mtt.len().div_ceil(2);
            wqe_umr_ctrl_seg::XLT_OCTOWORDS.set(&mut wqe[..], octs as u64);
            for (i, e) in mtt.iter().enumerate() {
                wqe[n + 8 * i..n + 8 * i + 8].copy_from_slice(&e.to_be_bytes());
            }
            n += octs * 16;
        }
        wqe_umr_ctrl_seg::FLAGS.set(&mut wqe[..], u64::from(flags));
        wqe_umr_ctrl_seg::MKEY_MASK.set(&mut wqe[..], mask);
        n
    }
}

impl Mr {
    /// The UMR that changes this region's access rights in place (the
    /// `IBV_REREG_MR_CHANGE_ACCESS` of `ibv_rereg_mr`, as mlx5 does it
    /// when the key is UMR-enabled), checked as registration checks them.
    pub fn rereg_access_wr(&self, new_access: u32) -> crate::Result<UmrWr> {
        if new_access & !access::SUPPORTED != 0 {
            return Err(crate::Error::Invalid("unsupported access flags"));
        }
        if new_access & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0
            && new_access & access::LOCAL_WRITE == 0
        {
            return Err(crate::Error::Invalid(
                "REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE",
            ));
        }
        Ok(UmrWr {
            check: UmrCheck::NotFree,
            access: Some(new_access),
            ..UmrWr::new(self.lkey())
        })
    }
}

impl Qp {
    /// Posts one UMR WQE (an RC QP, as mlx5dv's `wr_*` mkey operations);
    /// `flags` are `send_flags`. It completes like any WQE: a refused one
    /// with an error CQE (`LOC_PROT_ERR` for the key's state or PD,
    /// `LOC_QP_OP_ERR` for a malformed request).
    pub fn post_umr(
        &mut self,
        wr_id: u64,
        wr: &UmrWr,
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        if self.device_failed() {
            return Err(PostError::DeviceFailed);
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return Err(PostError::BadState(self.state));
        }
        if self.qp_type != QpType::Rc {
            return Err(PostError::BadOp);
        }
        let mut wqe = [0u8; CTRL_SIZE + wqe_umr_ctrl_seg::SIZE_BYTES + mkey_seg::SIZE_BYTES];
        if wr.xlt.is_some() {
            return Err(PostError::BadOp);
        }
        let n = wr.write_segments(&mut wqe[CTRL_SIZE..], &[], false);
        let pc = self.sq.pc();
        let r = self.sq.commit_with_ctrl(
            &mut wqe[..CTRL_SIZE + n],
            WqeOpcode::Umr,
            wr.mkey,
            flags,
            wr_id,
        );
        if r.is_ok() {
            self.sq.set_wc_opcode(pc, WcOpcode::Umr);
        }
        self.sq.ring();
        r
    }
}

impl Qp {
    /// Posts the UMR that changes `mr`'s access rights in place
    /// ([`Mr::rereg_access_wr`]) and records them as the MR's
    /// ([`Mr::access`]) once posted: WRs posted after it see the new
    /// rights, as the device executes them in order. A refused UMR
    /// completes in error and leaves the key as it was (then the MR says
    /// what was asked: re-register it).
    pub fn post_rereg_access(
        &mut self,
        wr_id: u64,
        mr: &Mr,
        new_access: u32,
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        let wr = mr
            .rereg_access_wr(new_access)
            .map_err(|_| PostError::BadMkeyWr("access flags"))?;
        self.post_umr(wr_id, &wr, flags)?;
        mr.inner
            .access
            .store(new_access, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}

/// Send WQEs of the UMR QP (one is in flight at a time).
const UMR_QP_WRS: u32 = 8;
/// How long a UMR of the driver may take before it is given up on.
const UMR_TIMEOUT: Duration = Duration::from_secs(10);
/// Polls of the UMR CQ spun before pausing between them.
const UMR_SPINS: u32 = 4096;
/// The pause between polls after that.
const UMR_POLL_PAUSE: Duration = Duration::from_micros(20);

/// The driver's own UMR QP (Linux's `mlx5r_umr` resources: a PD, a CQ and
/// a REG_UMR QP), shared by a context while anything holds it.
#[derive(Debug)]
pub struct UmrEngine {
    q: Mutex<UmrQp>,
    ctx: Arc<Ctx>,
    /// The PD's DMA key (`UmrQp::dma_key`).
    dma_lkey: u32,
    /// Its PD's number: the PD of the mkey cache's free keys.
    pub(crate) pdn: u32,
    /// 6-bit page sizes (`umr_log_entity_size_5`).
    wide: bool,
}

#[derive(Debug)]
struct UmrQp {
    qp: Qp,
    cq: Cq,
    /// The PD's DMA key, through which a UMR reads a translation it
    /// points at; dropped before the PD.
    _dma_key: DmaKey,
    _pd: Pd,
    posted: u64,
}

/// A PA key over the whole IOVA space (`MLX5_MKC_ACCESS_MODE_PA`,
/// `length64`, local read and write): Linux's `mlx5_ib_get_dma_mr`, the
/// `local_dma_lkey` of the UMR PD that `mlx5r_umr_update_xlt` points its
/// translation buffers through.
#[derive(Debug)]
struct DmaKey {
    ctx: Arc<Ctx>,
    lkey: u32,
}

impl DmaKey {
    fn create(ctx: &Arc<Ctx>, pdn: u32) -> Result<Self> {
        use mlx5_hw::ifc::{create_mkey_in, create_mkey_out, CreateMkeyIn, CreateMkeyOut};
        let mut inb = vec![0u8; create_mkey_in::SIZE_BYTES];
        {
            let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
            c.set_opcode(Opcode::CreateMkey.to_raw());
            c.memory_key_mkey_entry_mut()
                .set_access_mode_1_0(w::MKC_ACCESS_MODE_PA)
                .set_lr(true)
                .set_lw(true)
                .set_length64(true)
                .set_qpn(MKC_QPN_NONE)
                .set_pd(pdn);
        }
        let out = ctx.hca.cmd().exec(&inb, create_mkey_out::SIZE_BYTES)?;
        Ok(Self {
            ctx: ctx.clone(),
            lkey: CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8,
        })
    }
}

impl Drop for DmaKey {
    fn drop(&mut self) {
        if let Err(e) = crate::mr::destroy_mkey(&self.ctx, self.lkey) {
            tracing::warn!("DESTROY_MKEY of the UMR DMA key {:#x}: {e}", self.lkey);
        }
    }
}

impl UmrEngine {
    /// PD, CQ, REG_UMR QP, and the QP through RST2INIT (port 1), INIT2RTR
    /// (256-byte MTU, as Linux sets for it) and RTR2RTS.
    fn create(ctx: &Arc<Ctx>) -> Result<Self> {
        let c = Context { ctx: ctx.clone() };
        let pd = c.alloc_pd()?;
        let cq = c.create_cq(2 * UMR_QP_WRS, None, None)?;
        let attr = QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: UMR_QP_WRS,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline_data: (UMR_INLINE_MTT_MAX * 8) as u32,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
        };
        let mut qp = Qp::create_st(&pd.inner, &attr, QPC_ST_REG_UMR)?;
        rst2rts(&mut qp)?;
        let wide = ctx
            .hca
            .caps()
            .gen2()
            .is_some_and(|g| g.umr_log_entity_size_5());
        let dma_key = DmaKey::create(ctx, pd.pdn())?;
        Ok(Self {
            ctx: ctx.clone(),
            dma_lkey: dma_key.lkey,
            pdn: pd.pdn(),
            q: Mutex::new(UmrQp {
                qp,
                cq,
                _dma_key: dma_key,
                _pd: pd,
                posted: 0,
            }),
            wide,
        })
    }

    /// Posts `wr` (no translation entries) on the UMR QP and waits for
    /// its completion: a key of any PD may be changed this way.
    pub fn post(&self, wr: &UmrWr) -> Result<()> {
        self.post_wait(wr, &[])
    }

    /// Posts `wr` with `mtt` inline and waits for its completion; a
    /// failed one is [`Error::WorkCompletion`] (the QP is then brought
    /// back to RTS, as `mlx5r_umr_recover`).
    pub(crate) fn post_wait(&self, wr: &UmrWr, mtt: &[u64]) -> Result<()> {
        self.post_at(wr, mtt, None)
    }

    /// Writes translation words `words` (MTT entries, or two words per
    /// KLM/KSM entry: `per_entry`) into `mkey` from entry `entry` on
    /// (`MLX5_UMR_TRANSLATION_OFFSET_EN`), nothing else of the key
    /// changing, in UMRs of at most [`UMR_INLINE_MTT_MAX`] words: what
    /// on-demand paging maps and invalidates pages with
    /// (`mlx5r_umr_update_xlt`). The control segment names the place in
    /// octowords ([`w::UMR_OCTOWORD`]: MTT entry `2n` is offset `n`), so an
    /// MTT write starts at an even entry (callers align to 8, 64 bytes, as
    /// Linux does); an odd one is refused.
    pub(crate) fn write_xlt(
        &self,
        mkey: u32,
        entry: u64,
        words: &[u64],
        per_entry: usize,
    ) -> Result<()> {
        let per_entry = per_entry.max(1);
        let entry_bytes = w::MTT_ENTRY_BYTES * per_entry as u64;
        let step = UMR_INLINE_MTT_MAX - UMR_INLINE_MTT_MAX % per_entry;
        for (i, c) in words.chunks(step).enumerate() {
            let at = entry + (i * step / per_entry) as u64;
            let bytes = at * entry_bytes;
            if bytes % w::UMR_OCTOWORD != 0 {
                return Err(Error::Invalid(
                    "UMR translation offset not on an octoword (an odd MTT entry)",
                ));
            }
            self.post_at(&UmrWr::new(mkey), c, Some(bytes / w::UMR_OCTOWORD))?;
        }
        Ok(())
    }

    /// Posts `wr` with `mtt` inline, at translation offset `offset` (in
    /// octowords) when given, and waits for its completion.
    fn post_at(&self, wr: &UmrWr, mtt: &[u64], offset: Option<u64>) -> Result<()> {
        if mtt.len() > UMR_INLINE_MTT_MAX {
            return Err(Error::Invalid("UMR translation over the inline limit"));
        }
        let mut wqe = [0u8; CTRL_SIZE
            + wqe_umr_ctrl_seg::SIZE_BYTES
            + mkey_seg::SIZE_BYTES
            + 8 * UMR_INLINE_MTT_MAX];
        let n = wr.write_segments(&mut wqe[CTRL_SIZE..], mtt, self.wide);
        if let Some(off) = offset {
            set_xlt_offset(&mut wqe[CTRL_SIZE..], off);
        }
        self.commit_wait(wr.mkey, &mut wqe[..CTRL_SIZE + n])
    }

    /// Writes `xlt` (translation entries, whole octowords) into `mkey`
    /// from octoword `offset` on, nothing else of the key changing, the
    /// device reading the entries from a buffer the UMR points at through
    /// the PD's DMA key (`MLX5_UMR_INLINE` clear), in chunks of at most
    /// [`UMR_XLT_CHUNK`] bytes: `mlx5r_umr_update_xlt`, for translations
    /// too large to write inline (the implicit ODP key's 2 MiB of KSM
    /// entries).
    pub(crate) fn write_xlt_pointed(&self, mkey: u32, offset: u64, xlt: &[u8]) -> Result<()> {
        if xlt.len() as u64 % w::UMR_OCTOWORD != 0 {
            return Err(Error::Invalid("UMR translation not in whole octowords"));
        }
        let chunk = xlt.len().min(UMR_XLT_CHUNK);
        let buf = self.ctx.hca.dma().alloc_buf(chunk.max(1))?;
        for (i, c) in xlt.chunks(UMR_XLT_CHUNK).enumerate() {
            buf.write(0, c)?;
            let mut wqe = [0u8; CTRL_SIZE
                + wqe_umr_ctrl_seg::SIZE_BYTES
                + mkey_seg::SIZE_BYTES
                + wqe_data_seg::SIZE_BYTES];
            let n = UmrWr::new(mkey).write_segments(&mut wqe[CTRL_SIZE..], &[], self.wide);
            let seg = &mut wqe[CTRL_SIZE..];
            let octs = c.len() as u64 / w::UMR_OCTOWORD;
            wqe_umr_ctrl_seg::XLT_OCTOWORDS.set(seg, octs);
            set_xlt_offset(seg, offset + (i * UMR_XLT_CHUNK) as u64 / w::UMR_OCTOWORD);
            let mut d = WqeDataSeg::new_zeroed();
            d.byte_count.set(c.len() as u32);
            d.lkey.set(self.dma_lkey);
            d.addr.set(buf.iova().0);
            seg[n..n + wqe_data_seg::SIZE_BYTES].copy_from_slice(d.as_bytes());
            self.commit_wait(mkey, &mut wqe[..CTRL_SIZE + n + wqe_data_seg::SIZE_BYTES])?;
        }
        Ok(())
    }

    /// Commits the UMR WQE `wqe` (control segment first) on `mkey`, rings
    /// and waits for its completion; a failed one is
    /// [`Error::WorkCompletion`] and the QP goes back to RTS.
    fn commit_wait(&self, mkey: u32, wqe: &mut [u8]) -> Result<()> {
        let mut g = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let q = &mut *g;
        q.posted += 1;
        let wr_id = q.posted;
        let sq = &mut q.qp.sq;
        let pc = sq.pc();
        sq.commit_with_ctrl(
            wqe,
            WqeOpcode::Umr,
            mkey,
            crate::wr::send_flags::SIGNALED,
            wr_id,
        )
        .map_err(|_| Error::QueueFull("UMR QP"))?;
        sq.set_wc_opcode(pc, WcOpcode::Umr);
        sq.ring();
        let wc = wait_one(&q.qp, &mut q.cq)?;
        if wc.status == WcStatus::Success && wc.wr_id == wr_id {
            return Ok(());
        }
        tracing::warn!(?wc, "UMR of mkey {mkey:#x} failed");
        if let Err(e) = recover(&mut q.qp) {
            tracing::warn!("UMR QP recovery: {e}");
        }
        Err(Error::WorkCompletion {
            what: "UMR",
            status: wc.status,
            vendor_err: wc.vendor_err,
        })
    }
}

/// Sets a UMR control segment's translation offset (octowords) and
/// `MLX5_UMR_TRANSLATION_OFFSET_EN`.
fn set_xlt_offset(c: &mut [u8], off: u64) {
    let flags = wqe_umr_ctrl_seg::FLAGS.get(c) | u64::from(w::UMR_TRANSLATION_OFFSET_EN);
    wqe_umr_ctrl_seg::FLAGS.set(c, flags);
    wqe_umr_ctrl_seg::XLT_OFFSET.set(c, off & 0xffff);
    wqe_umr_ctrl_seg::XLT_OFFSET_47_16.set(c, off >> 16);
}

/// RST2INIT, INIT2RTR, RTR2RTS of the UMR QP (`mlx5r_umr_qp_rst2rts`).
fn rst2rts(qp: &mut Qp) -> Result<()> {
    let init = QpAttr {
        port_num: 1,
        ..QpAttr::default()
    };
    qp.transition_raw(
        Opcode::Rst2InitQp,
        QpState::Init,
        &init,
        attr_mask::PORT | attr_mask::PKEY_INDEX,
    )?;
    let rtr = QpAttr {
        path_mtu: 1,
        ..QpAttr::default()
    };
    qp.transition_raw(Opcode::Init2RtrQp, QpState::Rtr, &rtr, attr_mask::PATH_MTU)?;
    qp.transition_raw(Opcode::Rtr2RtsQp, QpState::Rts, &QpAttr::default(), 0)
}

/// A UMR failed: the QP is in ERR; back through RESET to RTS.
fn recover(qp: &mut Qp) -> Result<()> {
    qp.transition_raw(Opcode::ToRstQp, QpState::Reset, &QpAttr::default(), 0)?;
    rst2rts(qp)
}

/// The one completion of the UMR QP's CQ, polled until it comes (spun,
/// then paced), or a timeout on the driver's clock.
fn wait_one(qp: &Qp, cq: &mut Cq) -> Result<crate::cq::Wc> {
    let mut wc = [crate::cq::Wc::default()];
    for _ in 0..UMR_SPINS {
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        // The device may be a thread of this process (the model) that
        // needs the CPU this poll would spin on.
        std::thread::yield_now();
    }
    let d = Deadline::after(qp.ctx.hca.cmd().0.clock(), UMR_TIMEOUT, "UMR completion");
    loop {
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        if d.passed() {
            return Err(Error::Timeout {
                what: "UMR completion",
                after: d.waited(),
            });
        }
        d.pause(UMR_POLL_PAUSE);
    }
}

impl Ctx {
    /// The context's UMR QP, made at the first call (and again after the
    /// last holder let it go).
    pub(crate) fn umr_engine(self: &Arc<Self>) -> Result<Arc<UmrEngine>> {
        let mut w = self.umr.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = w.upgrade() {
            return Ok(e);
        }
        let e = Arc::new(UmrEngine::create(self)?);
        *w = Arc::downgrade(&e);
        Ok(e)
    }
}

impl Context {
    /// The context's UMR QP (made now if nothing holds it): what
    /// re-registration posts on; holding it keeps it.
    pub fn umr_engine(&self) -> Result<Arc<UmrEngine>> {
        self.ctx.umr_engine()
    }
}

/// `IBV_REREG_MR_*` flags of [`Mr::rereg`], with libibverbs' values.
pub mod rereg_flags {
    /// IBV_REREG_MR_CHANGE_TRANSLATION: new memory.
    pub const CHANGE_TRANSLATION: u32 = 1;
    /// IBV_REREG_MR_CHANGE_PD.
    pub const CHANGE_PD: u32 = 1 << 1;
    /// IBV_REREG_MR_CHANGE_ACCESS.
    pub const CHANGE_ACCESS: u32 = 1 << 2;
    /// IBV_REREG_MR_FLAGS_SUPPORTED.
    pub const SUPPORTED: u32 = CHANGE_TRANSLATION | CHANGE_PD | CHANGE_ACCESS;
}

/// The new memory of a `CHANGE_TRANSLATION` re-registration.
#[derive(Debug, Clone, Copy)]
pub enum ReregMemory<'a> {
    /// `len` bytes of a buffer from `offset` (as [`Pd::reg_mr_buffer`]).
    Buffer {
        /// The buffer (the MR holds it from then on).
        buf: &'a Arc<DmaBuffer>,
        /// Offset of the region in it.
        offset: usize,
        /// Length of the region.
        len: usize,
    },
}

/// How [`Mr::rereg`] made the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rereg {
    /// By a UMR on the same key (lkey and rkey unchanged).
    InPlace,
    /// By a new key (CREATE_MKEY, then DESTROY_MKEY of the old one): new
    /// lkey and rkey, as mlx5 gives when UMR cannot make the change.
    Recreated,
}

/// Whether UMR may change access `cur` into `target` on this device
/// (mlx5_ib's `mlx5r_umr_can_reconfig`).
pub(crate) fn can_reconfig(ctx: &Ctx, cur: u32, target: u32) -> bool {
    let g = ctx.hca.caps().gen();
    let diffs = cur ^ target;
    if diffs & access::REMOTE_ATOMIC != 0 && g.atomic() && g.umr_modify_atomic_disabled() {
        return false;
    }
    if diffs & access::RELAXED_ORDERING != 0
        && ((g.relaxed_ordering_write() && !g.relaxed_ordering_write_umr())
            || (g.relaxed_ordering_read() && !g.relaxed_ordering_read_umr()))
    {
        return false;
    }
    true
}

impl Mr {
    /// `ibv_rereg_mr`: a new translation (`CHANGE_TRANSLATION`, `mem`),
    /// PD (`CHANGE_PD`, `pd`) and/or access (`CHANGE_ACCESS`, `new_access`)
    /// for this region, as `mlx5_ib_rereg_user_mr` makes them: by a UMR on
    /// the context's UMR QP when the device can change the access that
    /// way (`mlx5r_umr_can_reconfig`) and a new translation fits the
    /// entries the key was made with (`can_use_umr_rereg_pas`), else by a
    /// new key. Refused (`Busy`) while other handles of the MR exist; on
    /// an error the region is as it was.
    pub fn rereg(
        &mut self,
        flags: u32,
        pd: Option<&Pd>,
        mem: Option<ReregMemory<'_>>,
        new_access: u32,
    ) -> Result<Rereg> {
        use rereg_flags::*;
        if flags == 0 || flags & !SUPPORTED != 0 {
            return Err(Error::Invalid("rereg flags"));
        }
        let new_pd = if flags & CHANGE_PD != 0 {
            let p = pd.ok_or(Error::Invalid("CHANGE_PD without a PD"))?;
            if !Arc::ptr_eq(&p.inner.ctx, &self.inner.pd.ctx) {
                return Err(Error::Invalid("a PD of another context"));
            }
            p.inner.clone()
        } else {
            self.inner.pd.clone()
        };
        let acc = if flags & CHANGE_ACCESS != 0 {
            check_access(new_access)?;
            new_access
        } else {
            self.access()
        };
        let new_mem = match (flags & CHANGE_TRANSLATION != 0, mem) {
            (false, _) => None,
            (true, None) => return Err(Error::Invalid("CHANGE_TRANSLATION without memory")),
            (true, Some(ReregMemory::Buffer { buf, offset, len })) => {
                Some((Mapping::of_buffer(buf, offset, len)?, len as u64))
            }
        };
        if Arc::strong_count(&self.inner) > 1 || Arc::weak_count(&self.inner) > 0 {
            return Err(Error::Busy("other handles of the MR exist"));
        }
        let ctx = self.inner.pd.ctx.clone();
        let umr_ok = can_reconfig(&ctx, self.access(), acc);
        let Some(((addr, m), len)) = new_mem else {
            if !umr_ok {
                let (addr, len) = (self.inner.addr, self.inner.len);
                return self.recreate(&new_pd, addr, len, acc, None, self.mapping());
            }
            let wr = UmrWr {
                check: UmrCheck::NotFree,
                access: Some(acc),
                pdn: Some(new_pd.pdn),
                ..UmrWr::new(self.lkey())
            };
            self.umr(&ctx, &wr, &[], new_pd, acc, None)?;
            return Ok(Rereg::InPlace);
        };
        let at = Placement::map(&ctx, addr, len, &m)?;
        let n = at.layout.entries;
        if !umr_ok || n > self.inner.xlt_room || n > UMR_INLINE_MTT_MAX {
            return self.recreate(&new_pd, addr, len, acc, Some(at), m);
        }
        let wr = UmrWr {
            check: UmrCheck::NotFree,
            access: Some(acc),
            pdn: Some(new_pd.pdn),
            xlt: Some(UmrXlt {
                start: addr,
                len,
                log_page: at.layout.log_page,
            }),
            ..UmrWr::new(self.lkey())
        };
        let mtt: Vec<u64> = (0..n).map(|i| at.mtt(i)).collect();
        if let Err(e) = self.umr(&ctx, &wr, &mtt, new_pd, acc, Some((addr, len, at, m))) {
            at.unmap(&ctx);
            return Err(e);
        }
        Ok(Rereg::InPlace)
    }

    /// Posts `wr` on the UMR QP; once it completed, the region takes the
    /// new PD, access and (with `new`) address, length and memory, whose
    /// old mapping goes.
    fn umr(
        &mut self,
        ctx: &Arc<Ctx>,
        wr: &UmrWr,
        mtt: &[u64],
        pd: Arc<PdInner>,
        acc: u32,
        new: Option<(u64, u64, Placement, Mapping)>,
    ) -> Result<()> {
        let engine = ctx.umr_engine()?;
        engine.post_wait(wr, mtt)?;
        let inner = Arc::get_mut(&mut self.inner).ok_or(Error::Busy("MR handles"))?;
        inner.pd = pd;
        *inner.access.get_mut() = acc;
        inner.umr = Some(engine);
        if let Some((addr, len, at, m)) = new {
            let old = std::mem::replace(&mut inner.at, at);
            old.unmap(ctx);
            inner.addr = addr;
            inner.len = len;
            inner.backing = m.backing;
            inner.buf_offset = m.buf_offset;
        }
        Ok(())
    }

    /// A new key over `m` (mapped at `at` already, or mapped now); the
    /// old key and mapping go once it exists.
    fn recreate(
        &mut self,
        pd: &Arc<PdInner>,
        addr: u64,
        len: u64,
        acc: u32,
        at: Option<Placement>,
        m: Mapping,
    ) -> Result<Rereg> {
        let new = match at {
            Some(at) => Mr::with_placement(pd, addr, len, acc, at, m)?,
            None => Mr::register(pd, addr, len, acc, m)?,
        };
        let old = std::mem::replace(self, new);
        if let Err(e) = old.dereg() {
            tracing::warn!("re-registration: the old key: {e}");
        }
        Ok(Rereg::Recreated)
    }
}
