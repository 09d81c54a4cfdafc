//! One side's resources (perftest's `ctx_init` / `ctx_connect`): a
//! context, a PD, a send and a receive CQ, one buffer with one MR holding
//! a region per QP, the QPs, and the RESET -> INIT -> RTR -> RTS moves
//! towards the peer's addresses.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::time::Duration;

use verbs::ah::Ah;
use verbs::channel::CompChannel;
use verbs::cq::{Cq, Wc, WcStatus};
use verbs::dc::{DcAv, Dci, DciInitAttr, DciPath, Dct, DctInitAttr};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr};
use verbs::pd::Pd;
use verbs::qp::{required_mask, AhAttr, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType};
use verbs::srq::Srq;
use vfio::{DmaBuffer, PciFunction};

use super::exchange::Dest;
use super::params::{Conn, Params, Verb};

/// perftest's `DEF_QKEY`.
pub const QKEY: u32 = 0x1111_1111;
/// perftest's `DC_KEY`: the DC access key of every DCT.
pub const DC_KEY: u64 = 0xffee_ddcc;
/// Room for the GRH a UD receive starts with.
pub const GRH: u64 = 40;

/// One side.
pub struct Side {
    /// The device's name.
    pub dev_name: String,
    /// The context.
    pub ctx: Context,
    /// Kept for the QPs and MR.
    pub pd: Pd,
    /// Send completions.
    pub scq: Cq,
    /// Receive completions.
    pub rcq: Cq,
    /// Completion events (`-e`).
    pub chan: Option<CompChannel>,
    /// All regions.
    pub buf: Arc<DmaBuffer>,
    /// Over `buf`.
    pub mr: Mr,
    /// Bytes per QP region (a region holds a receive half and a send half).
    pub region: u64,
    /// The QPs.
    pub qps: Vec<Qp>,
    /// UD and DC: an address handle per remote QP (or DCT).
    pub ahs: Vec<Ah>,
    /// DC (`-c DC`): a DCI and a DCT per `-q`, the DCTs' receives from one SRQ.
    pub dc: Option<DcRes>,
    /// The peer's addresses.
    pub remote: Vec<Dest>,
    /// Our initial PSNs.
    pub psns: Vec<u32>,
    /// Path MTU in bytes.
    pub mtu_bytes: u32,
    /// IBV_MTU_* used.
    pub mtu: u8,
    /// Inline payload staging, reused by every post.
    scratch: Vec<u8>,
}

/// A side's DC objects (perftest's DC mode: the client's DCIs send to the
/// server's DCTs; here every side has both, so `-b` works too).
#[derive(Debug)]
pub struct DcRes {
    /// Senders, one per `-q`.
    pub dcis: Vec<Dci>,
    /// Targets, one per `-q` (their numbers go to the peer as QPNs).
    pub dcts: Vec<Dct>,
    /// The DCTs' receives.
    pub srq: Srq,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("dev_name", &self.dev_name)
            .field("qps", &self.qps.len())
            .field("region", &self.region)
            .finish()
    }
}

fn e<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |x| format!("{what}: {x}")
}

impl Side {
    /// `Err` with the cause once this side's device has failed or vanished
    /// (what the health poller found; no device access).
    pub fn device_ok(&self) -> Result<(), String> {
        match self.ctx.hca().health_failure() {
            Some(h) => Err(format!("device health failure: {h}")),
            None => Ok(()),
        }
    }

    /// `err` as the user should read it: when this side's device is dead
    /// or gone (the health sensors are read now), that is the cause and
    /// `err` (often only "connection reset" by a peer that saw it first)
    /// the consequence.
    pub fn explain(&self, err: String) -> String {
        if err.contains("device health failure") {
            return err;
        }
        match self.ctx.hca().check_health() {
            Err(h) => format!("{h} (then: {err})"),
            Ok(()) => err,
        }
    }

    /// Opens `func` and creates everything for `p`.
    pub fn new(func: Arc<dyn PciFunction>, p: &Params, seed: u32) -> Result<Self, String> {
        let dev_name = func.name().to_string();
        let ctx = Context::open(func, HcaOptions::default()).map_err(e("ibv_open_device"))?;
        let port = ctx.query_port(1).map_err(e("ibv_query_port"))?;
        let mtu = p.mtu.unwrap_or(port.active_mtu.clamp(1, 5));
        if mtu > port.max_mtu.max(1) {
            return Err(format!(
                "-m {}: the port's largest MTU is {} B",
                128u32 << mtu,
                128u32 << port.max_mtu
            ));
        }
        let mtu_bytes = 128u32 << mtu;
        if p.flags.conn == Conn::Ud && p.sizes.iter().any(|&s| s > mtu_bytes as u64) {
            return Err(format!(
                "UD messages fit in one MTU ({mtu_bytes} B): lower -s"
            ));
        }
        let pd = ctx.alloc_pd().map_err(e("ibv_alloc_pd"))?;
        let chan = if p.flags.events {
            Some(
                ctx.create_comp_channel()
                    .map_err(e("ibv_create_comp_channel"))?,
            )
        } else {
            None
        };
        let nq = p.flags.qps;
        let scq_n = (p.tx_depth * nq).max(16);
        let rcq_n = (p.rx_depth * nq).max(16);
        let scq = ctx
            .create_cq(scq_n, chan.as_ref(), None)
            .map_err(e("ibv_create_cq"))?;
        let rcq = ctx
            .create_cq(rcq_n, chan.as_ref(), None)
            .map_err(e("ibv_create_cq"))?;
        let max = p.sizes.iter().copied().max().unwrap_or(8).max(8);
        let half = (max + GRH).next_multiple_of(4096);
        let region = 2 * half;
        let len = (region * nq as u64) as usize;
        let buf = DmaBuffer::with_hugepages(len, p.flags.hugepages).map_err(e("buffer"))?;
        let acc = access::LOCAL_WRITE
            | access::REMOTE_WRITE
            | access::REMOTE_READ
            | access::REMOTE_ATOMIC;
        let mr = if p.flags.udmabuf {
            let fd =
                verbs::dmabuf::udmabuf(buf.file().as_fd(), 0, len as u64).map_err(e("udmabuf"))?;
            // perftest's iova for a dma-buf: the buffer's address.
            pd.reg_dmabuf_mr(0, len as u64, buf.host_addr(), fd.as_raw_fd(), acc)
                .map_err(e("ibv_reg_dmabuf_mr"))?
        } else {
            pd.reg_mr_buffer(&buf, 0, len, acc)
                .map_err(e("ibv_reg_mr"))?
        };
        let qp_type = match p.flags.conn {
            Conn::Rc => QpType::Rc,
            Conn::Uc => QpType::Uc,
            Conn::Ud => QpType::Ud,
            Conn::Dc => QpType::Rc,
        };
        let recv = p.test.verb == Verb::Send;
        let mut qps = Vec::new();
        let mut psns = Vec::new();
        let dc = if p.flags.conn == Conn::Dc {
            Some(dc_res(&ctx, &pd, &scq, &rcq, p, mtu)?)
        } else {
            None
        };
        let rc_like = if dc.is_some() { 0 } else { nq };
        for i in 0..nq {
            psns.push(seed.wrapping_mul(2_654_435_761).wrapping_add(i * 7919) & 0xff_ffff);
        }
        for _ in 0..rc_like {
            let qp = pd
                .create_qp(&QpInitAttr {
                    send_cq: &scq,
                    recv_cq: &rcq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: p.tx_depth.max(2),
                        // At least 4 x 16 B: verbs places the SQ at the RQ's size
                        // rounded up to 64 B, the model (as the PRM) right after
                        // it (see /work/wt/prompts/from-perf.md).
                        max_recv_wr: if recv { p.rx_depth.max(4) } else { 4 },
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: p.inline_size,
                    },
                    qp_type,
                    sq_sig_all: false,
                })
                .map_err(e("ibv_create_qp"))?;
            qps.push(qp);
        }
        Ok(Self {
            dev_name,
            ctx,
            pd,
            scq,
            rcq,
            chan,
            buf,
            mr,
            region,
            qps,
            ahs: Vec::new(),
            dc,
            remote: Vec::new(),
            psns,
            mtu_bytes,
            mtu,
            scratch: Vec::new(),
        })
    }

    /// QPs (`-q`): RC/UC/UD QPs, or DCIs.
    pub fn nqps(&self) -> usize {
        self.dc.as_ref().map_or(self.qps.len(), |d| d.dcis.len())
    }

    /// Address of QP `i`'s receive half (what the peer writes/reads/atomics).
    pub fn recv_addr(&self, i: usize) -> u64 {
        self.mr.addr() + i as u64 * self.region
    }

    /// Offset in the buffer of QP `i`'s send half.
    pub fn send_off(&self, i: usize) -> u64 {
        i as u64 * self.region + self.region / 2
    }

    /// This side's addresses, one per QP.
    pub fn dests(&self, p: &Params) -> Result<Vec<Dest>, String> {
        let gid = self
            .ctx
            .query_gid(1, p.gid_index)
            .map_err(e("ibv_query_gid"))?;
        // DC: the peer's DCIs address our DCTs.
        let qpns: Vec<u32> = match &self.dc {
            Some(d) => d.dcts.iter().map(Dct::dctn).collect(),
            None => self.qps.iter().map(Qp::qp_num).collect(),
        };
        let srqn = self.dc.as_ref().map_or(0, |d| d.srq.srqn());
        Ok(qpns
            .iter()
            .enumerate()
            .map(|(i, &qpn)| Dest {
                lid: 0,
                out_reads: p.outs as u16,
                qpn,
                psn: self.psns[i],
                rkey: self.mr.rkey(),
                vaddr: self.recv_addr(i),
                gid,
                srqn,
            })
            .collect())
    }

    /// Moves every QP to RTS towards `remote`.
    pub fn connect(&mut self, p: &Params, remote: Vec<Dest>) -> Result<(), String> {
        if remote.len() != self.nqps() {
            return Err(format!(
                "peer has {} QPs, this side {}: run both with the same -q",
                remote.len(),
                self.nqps()
            ));
        }
        if self.dc.is_some() {
            return self.connect_dc(p, remote);
        }
        let ud = p.flags.conn == Conn::Ud;
        let outs = p
            .outs
            .min(remote.first().map_or(16, |d| d.out_reads as u32))
            .max(1) as u8;
        for (i, qp) in self.qps.iter_mut().enumerate() {
            let r = &remote[i];
            let init = QpAttr {
                qp_state: Some(QpState::Init),
                port_num: 1,
                qp_access_flags: access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC,
                qkey: QKEY,
                ..Default::default()
            };
            let qp_type = qp.qp_type();
            let im = required_mask(qp_type, QpState::Reset, QpState::Init);
            qp.modify(&init, im).map_err(e("modify QP to INIT"))?;
            let ah_attr = AhAttr {
                dgid: r.gid,
                sgid_index: p.gid_index as u8,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            };
            let rtr = QpAttr {
                qp_state: Some(QpState::Rtr),
                path_mtu: self.mtu,
                dest_qp_num: r.qpn,
                rq_psn: r.psn,
                max_dest_rd_atomic: outs,
                min_rnr_timer: 12,
                ah_attr,
                ..Default::default()
            };
            let rm = required_mask(qp_type, QpState::Init, QpState::Rtr);
            qp.modify(&rtr, rm).map_err(e("modify QP to RTR"))?;
            let rts = QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: self.psns[i],
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: outs,
                ..Default::default()
            };
            let sm = required_mask(qp_type, QpState::Rtr, QpState::Rts);
            qp.modify(&rts, sm).map_err(e("modify QP to RTS"))?;
            if ud {
                let ah = self.pd.create_ah(&ah_attr).map_err(e("ibv_create_ah"))?;
                self.ahs.push(ah);
            }
        }
        self.remote = remote;
        Ok(())
    }

    /// Polls `which` CQ into `wc`; with `-e`, sleeps on the channel when
    /// nothing is there. Error completions are errors.
    pub fn poll(&mut self, recv: bool, wc: &mut [Wc]) -> Result<usize, String> {
        let cq = if recv { &mut self.rcq } else { &mut self.scq };
        let mut n = cq.poll(wc).map_err(e("ibv_poll_cq"))?;
        if n == 0 {
            if let Some(ch) = &self.chan {
                cq.req_notify(false).map_err(e("ibv_req_notify_cq"))?;
                n = cq.poll(wc).map_err(e("ibv_poll_cq"))?;
                if n == 0 {
                    ch.get_cq_event(Duration::from_millis(1))
                        .map_err(e("ibv_get_cq_event"))?;
                    n = cq.poll(wc).map_err(e("ibv_poll_cq"))?;
                }
            }
        }
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                return Err(format!(
                    "completion with error: {:?} (vendor syndrome {:#x}) on QP {:#x}, wr_id {:#x}",
                    w.status, w.vendor_err, w.qp_num, w.wr_id
                ));
            }
        }
        Ok(n)
    }
}

impl Side {
    /// Posts `n` (a post list) WRs of `p`'s verb of `size` bytes on QP `i`;
    /// the last one signaled if `signaled`, with `wr_id`.
    pub fn post_send(
        &mut self,
        p: &Params,
        i: usize,
        size: u64,
        n: u32,
        signaled: bool,
        wr_id: u64,
    ) -> Result<(), String> {
        use verbs::qp::{send_flags, Payload, SendOp, SendWr, UdDest};
        let r = self.remote[i];
        let op = match p.test.verb {
            Verb::Write => SendOp::RdmaWrite {
                raddr: r.vaddr,
                rkey: r.rkey,
            },
            Verb::Read => SendOp::RdmaRead {
                raddr: r.vaddr,
                rkey: r.rkey,
            },
            Verb::Send => SendOp::Send,
            Verb::Atomic => match p.flags.atomic_type {
                super::params::AtomicType::CmpAndSwap => SendOp::AtomicCmpSwp {
                    raddr: r.vaddr,
                    rkey: r.rkey,
                    compare: 0,
                    swap: 0,
                },
                super::params::AtomicType::FetchAndAdd => SendOp::AtomicFetchAdd {
                    raddr: r.vaddr,
                    rkey: r.rkey,
                    add: 1,
                },
            },
        };
        let sge = self
            .mr
            .sge(self.send_off(i), size as u32)
            .map_err(e("SGE"))?;
        let sges = [sge];
        let inline =
            size <= p.inline_size as u64 && matches!(p.test.verb, Verb::Write | Verb::Send);
        let mut inline_bytes = std::mem::take(&mut self.scratch);
        let payload = if inline {
            inline_bytes.resize(size as usize, 0);
            self.buf
                .read(self.send_off(i) as usize, &mut inline_bytes)
                .map_err(e("inline data"))?;
            Payload::Inline(&inline_bytes)
        } else {
            Payload::Sges(&sges)
        };
        if let Some(d) = &mut self.dc {
            let av = DcAv::new(&self.ahs[i], r.qpn, DC_KEY, 0);
            let wr = |flags| {
                let w = SendWr {
                    wr_id,
                    op,
                    payload,
                    flags,
                    ud: None,
                };
                (w, av.clone())
            };
            let mut wrs: Vec<_> = (1..n.max(1)).map(|_| wr(0)).collect();
            wrs.push(wr(if signaled { send_flags::SIGNALED } else { 0 }));
            let res = d.dcis[i].post_send(&wrs);
            self.scratch = inline_bytes;
            return res.map_err(|(k, err)| format!("ibv_post_send (WR {k}): {err}"));
        }
        let ud = self.ahs.get(i).map(|ah| UdDest {
            ah,
            remote_qpn: r.qpn,
            remote_qkey: QKEY,
        });
        let wr = |flags| SendWr {
            wr_id,
            op,
            payload,
            flags,
            ud,
        };
        let last = wr(if signaled { send_flags::SIGNALED } else { 0 });
        let r = if n <= 1 {
            // The common case posts without allocating.
            self.qps[i].post_send(&[last])
        } else {
            let mut wrs = vec![wr(0); n as usize - 1];
            wrs.push(last);
            self.qps[i].post_send(&wrs)
        };
        self.scratch = inline_bytes;
        r.map_err(|(k, err)| format!("ibv_post_send (WR {k}): {err}"))
    }

    /// Posts one receive on QP `i`: its whole receive half, so that a
    /// receive left posted by a smaller size's round takes any size (and
    /// the GRH on UD).
    pub fn post_recv(&mut self, _p: &Params, i: usize, _size: u64) -> Result<(), String> {
        let len = self.region / 2;
        let sge = self
            .mr
            .sge(i as u64 * self.region, len as u32)
            .map_err(e("SGE"))?;
        let wr = verbs::qp::RecvWr {
            wr_id: i as u64,
            sg_list: &[sge],
        };
        match &self.dc {
            Some(d) => d.srq.post_recv(&[wr]),
            None => self.qps[i].post_recv(&[wr]),
        }
        .map_err(|(_, err)| format!("ibv_post_recv: {err}"))
    }
}

/// `-c DC`: a DCI (send CQ) and a DCT (receive CQ, on one SRQ) per `-q`.
fn dc_res(
    ctx: &Context,
    pd: &Pd,
    scq: &Cq,
    rcq: &Cq,
    p: &Params,
    mtu: u8,
) -> Result<DcRes, String> {
    let nq = p.flags.qps;
    let srq = pd
        .create_srq((p.rx_depth * nq).clamp(16, 8192), 1)
        .map_err(e("ibv_create_srq"))?;
    let mut dcis = Vec::new();
    let mut dcts = Vec::new();
    let _ = ctx;
    for _ in 0..nq {
        let dci = pd
            .create_dci(&DciInitAttr {
                send_cq: scq,
                cap: QpCap {
                    max_send_wr: p.tx_depth.max(2),
                    max_send_sge: 1,
                    max_inline_data: p.inline_size,
                    ..QpCap::default()
                },
                sq_sig_all: false,
                streams: None,
                create_flags: 0,
            })
            .map_err(e("create DCI"))?;
        let dct = pd
            .create_dct(&DctInitAttr {
                cq: rcq,
                srq: &srq,
                access_key: DC_KEY,
                access_flags: access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC,
                path_mtu: mtu,
                min_rnr_timer: 12,
                ah_attr: AhAttr {
                    sgid_index: p.gid_index as u8,
                    hop_limit: 64,
                    port_num: 1,
                    ..Default::default()
                },
                pkey_index: 0,
                create_flags: 0,
            })
            .map_err(e("create DCT"))?;
        dcis.push(dci);
        dcts.push(dct);
    }
    Ok(DcRes { dcis, dcts, srq })
}

impl Side {
    /// `-c DC`: every DCI to RTS, an address handle per peer DCT.
    fn connect_dc(&mut self, p: &Params, remote: Vec<Dest>) -> Result<(), String> {
        let Some(d) = &mut self.dc else {
            return Ok(());
        };
        for (i, dci) in d.dcis.iter_mut().enumerate() {
            dci.to_rts(&DciPath {
                path_mtu: self.mtu,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                sq_psn: self.psns[i],
            })
            .map_err(e("modify DCI to RTS"))?;
            let ah = self
                .pd
                .create_ah(&AhAttr {
                    dgid: remote[i].gid,
                    sgid_index: p.gid_index as u8,
                    hop_limit: 64,
                    port_num: 1,
                    ..Default::default()
                })
                .map_err(e("ibv_create_ah"))?;
            self.ahs.push(ah);
        }
        self.remote = remote;
        Ok(())
    }
}
