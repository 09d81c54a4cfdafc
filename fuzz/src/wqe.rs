//! WQE execution in the model (`mlx5-emu`'s data path): whatever bytes a
//! driver leaves in a send queue, and whatever producer counter it rings.
//!
//! The bench: the real driver (`verbs`) brings up a model function and
//! makes a PD and an MR over a 64 KiB buffer once; for every input it
//! makes a CQ and an RC QP connected to itself (loopback) with receive
//! WQEs posted, and destroys both afterwards, so that each input starts
//! from an empty, connected queue and no completion of one input reaches
//! the next. (Taking one QP to RESET and back between inputs is not
//! enough: this driver does not clean a reset QP's completions from its
//! CQ, as Linux's `mlx5_ib_cq_clean` does, so a late one corrupts the new
//! queue's accounting; see docs/MEASUREMENTS.md, "Fuzzing".) Where the
//! QP's send queue and doorbell record are, the harness learns from the
//! CREATE_QP the driver sent (the model's output hook sees every command;
//! it changes nothing).
//!
//! Input:
//!
//! | bytes | what |
//! |---|---|
//! | 2 | the producer counter written to the doorbell record (big-endian; any value: past the WQEs written, past the ring) |
//! | 1 | bit 0: ring by a BlueFlame copy of a whole block, else by the 8-byte doorbell |
//! | rest | the send queue's bytes from block 0 on (at most the ring) |
//!
//! The MR's address is the buffer's host address, which differs from run
//! to run; so that inputs mean the same every time, every 8-byte-aligned
//! big-endian word of the ring in `SEED_VA .. SEED_VA + BUF_LEN` is moved
//! to the same offset in the MR before the ring is written (every other
//! address stays what the input says).
//!
//! Oracle: nothing panics (the model's worker, the driver polling the CQ);
//! the QP and CQ can always be destroyed afterwards (a refused command is
//! a failure); the driver's CQ polling stays sane.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use mlx5_emu::{emulated_with, Device, DeviceConfig, OutputOverride};
use mlx5_hw::ifc::{CreateQpIn, CreateQpOut};
use mlx5_hw::opcode::Opcode;
use verbs::cq::{Cq, Wc};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr};
use verbs::pd::Pd;
use verbs::qp::{required_mask, AhAttr, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RecvWr};
use vfio::emulated::EmulatedFunction;
use vfio::{DmaBuffer, PciFunction};

/// The MR's address as inputs write it (see the module docs).
pub const SEED_VA: u64 = 0x5eed_0000_0000;
/// Size of the MR's buffer.
pub const BUF_LEN: usize = 1 << 16;
/// Send queue WQEs the QP is made with.
pub const SQ_WR: u32 = 64;
/// CQ entries (an input whose producer counter is far past the ring may
/// overrun it with flushes: the CQ is then in error, for this input only).
pub const CQ_ENTRIES: u32 = 4095;
/// Receive WQEs posted before every input.
pub const RECVS: usize = 8;
/// How long the harness waits for the model to notice a doorbell.
const NOTICE: Duration = Duration::from_millis(50);
/// How long the CQ must stay quiet for an input to be over.
const QUIET: Duration = Duration::from_millis(2);
/// The longest an input may keep the data path busy.
const BUSY_MAX: Duration = Duration::from_secs(2);

/// Where the QP's queues are, as its CREATE_QP said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpPlace {
    /// The QP number.
    pub qpn: u32,
    /// IOVA of the send queue (after the receive queue in the QP buffer).
    pub sq_iova: u64,
    /// Send queue size in 64-byte blocks.
    pub sq_blocks: u32,
    /// IOVA of the doorbell record.
    pub dbr_iova: u64,
    /// The UAR page the QP rings.
    pub uar_page: u32,
}

/// The output hook that watches CREATE_QP go by.
#[derive(Debug, Default)]
struct Watch(Mutex<Option<QpPlace>>);

impl OutputOverride for Watch {
    fn answer(&self, opcode: u16, _: u16, input: &[u8], out: &[u8]) -> Option<Vec<u8>> {
        if opcode == Opcode::CreateQp.to_raw() && input.len() >= 0x110 && out.len() >= 0x10 {
            let i = CreateQpIn::new_unchecked(input);
            let q = i.qpc();
            let rq = (1u64 << q.log_rq_size()) * (16u64 << q.log_rq_stride());
            let place = QpPlace {
                qpn: CreateQpOut::new_unchecked(out).qpn(),
                sq_iova: i.pas(0) + rq,
                sq_blocks: 1 << q.log_sq_size(),
                dbr_iova: q.dbr_addr(),
                uar_page: q.uar_page(),
            };
            *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(place);
        }
        None
    }
}

/// The bench (see the module docs).
#[derive(Debug)]
pub struct WqeRig {
    /// The function.
    pub f: Arc<EmulatedFunction<Device>>,
    /// The driver's context on it.
    pub ctx: Context,
    /// The PD of the MR and QP.
    pub pd: Pd,
    /// The MR's memory.
    pub buf: Arc<DmaBuffer>,
    /// An MR over all of `buf` with every access right.
    pub mr: Mr,
    watch: Arc<Watch>,
}

/// One input's CQ and QP.
#[derive(Debug)]
pub struct Queues {
    /// The QP's send and receive CQ.
    pub cq: Cq,
    /// The RC QP, connected to itself.
    pub qp: Qp,
    /// Where its queues are.
    pub place: QpPlace,
}

fn rig() -> &'static Mutex<WqeRig> {
    static RIG: OnceLock<Mutex<WqeRig>> = OnceLock::new();
    RIG.get_or_init(|| Mutex::new(WqeRig::new()))
}

impl WqeRig {
    fn new() -> Self {
        let watch = Arc::new(Watch::default());
        let cfg = DeviceConfig {
            output_override: Some(watch.clone()),
            ..DeviceConfig::default()
        };
        let f = Arc::new(emulated_with(cfg));
        let func: Arc<dyn PciFunction> = f.clone();
        let ctx = Context::open(func, HcaOptions::default())
            .unwrap_or_else(|e| panic!("bring-up of the model: {e}"));
        let pd = ctx.alloc_pd().unwrap_or_else(|e| panic!("alloc_pd: {e}"));
        let buf = DmaBuffer::new(BUF_LEN).unwrap_or_else(|e| panic!("buffer: {e}"));
        let all = access::LOCAL_WRITE
            | access::REMOTE_WRITE
            | access::REMOTE_READ
            | access::REMOTE_ATOMIC;
        let mr = pd
            .reg_mr_buffer(&buf, 0, BUF_LEN, all)
            .unwrap_or_else(|e| panic!("reg_mr: {e}"));
        Self {
            f,
            ctx,
            pd,
            buf,
            mr,
            watch,
        }
    }

    /// A CQ and a QP connected to itself, receive WQEs posted.
    pub fn queues(&self) -> Queues {
        let cq = self
            .ctx
            .create_cq(CQ_ENTRIES, None, None)
            .unwrap_or_else(|e| panic!("create_cq: {e}"));
        let qp = self
            .pd
            .create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: SQ_WR,
                    max_recv_wr: RECVS as u32,
                    max_send_sge: 4,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap_or_else(|e| panic!("create_qp: {e}"));
        let place = self
            .watch
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(|| panic!("CREATE_QP went by unseen"));
        assert_eq!(
            place.qpn,
            qp.qp_num(),
            "the watched CREATE_QP is another QP's"
        );
        let mut q = Queues { cq, qp, place };
        self.connect(&mut q);
        q
    }

    /// INIT, RTR and RTS towards itself, receive WQEs posted.
    fn connect(&self, q: &mut Queues) {
        let t = QpType::Rc;
        let init = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qp_access_flags: access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC,
            ..Default::default()
        };
        q.qp.modify(&init, required_mask(t, QpState::Reset, QpState::Init))
            .unwrap_or_else(|e| panic!("RESET -> INIT refused: {e}"));
        let dgid = self
            .ctx
            .query_gid(1, 0)
            .unwrap_or_else(|e| panic!("query_gid: {e}"));
        let rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: 3,
            dest_qp_num: q.place.qpn,
            rq_psn: 0x100,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
            ah_attr: AhAttr {
                dgid,
                sgid_index: 0,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        q.qp.modify(&rtr, required_mask(t, QpState::Init, QpState::Rtr))
            .unwrap_or_else(|e| panic!("INIT -> RTR refused: {e}"));
        let rts = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: 0x100,
            timeout: 1,
            retry_cnt: 1,
            rnr_retry: 0,
            max_rd_atomic: 4,
            ..Default::default()
        };
        q.qp.modify(&rts, required_mask(t, QpState::Rtr, QpState::Rts))
            .unwrap_or_else(|e| panic!("RTR -> RTS refused: {e}"));
        let sges: Vec<_> = (0..RECVS)
            .map(|i| {
                self.mr
                    .sge((i * 4096) as u64, 4096)
                    .unwrap_or_else(|e| panic!("sge: {e}"))
            })
            .collect();
        let wrs: Vec<RecvWr<'_>> = sges
            .iter()
            .enumerate()
            .map(|(i, s)| RecvWr {
                wr_id: i as u64,
                sg_list: std::slice::from_ref(s),
            })
            .collect();
        q.qp.post_recv(&wrs)
            .unwrap_or_else(|(i, e)| panic!("post_recv {i}: {e}"));
    }

    /// Polls the CQ until it has been quiet for [`QUIET`] (at most
    /// [`BUSY_MAX`]); the completions seen.
    fn drain(q: &mut Queues) -> usize {
        let mut wc = [Wc::default(); 16];
        let start = Instant::now();
        let mut last = Instant::now();
        let mut seen = 0;
        while last.elapsed() < QUIET && start.elapsed() < BUSY_MAX {
            // An error: the device failed or vanished, which no send-queue
            // content may cause.
            let n =
                q.cq.poll(&mut wc)
                    .unwrap_or_else(|e| panic!("the device failed under a send queue input: {e}"));
            assert!(
                n <= wc.len(),
                "poll reported {n} completions into {}",
                wc.len()
            );
            if n > 0 {
                if std::env::var_os("MLX5_FUZZ_VERBOSE").is_some() {
                    for w in &wc[..n] {
                        eprintln!(
                            "  wc: qp {:#x} wr_id {} {:?} {:?} vendor_err {:#x} len {}",
                            w.qp_num, w.wr_id, w.status, w.opcode, w.vendor_err, w.byte_len
                        );
                    }
                }
                seen += n;
                last = Instant::now();
            } else {
                std::thread::yield_now();
            }
        }
        seen
    }

    /// The bytes of one input into the send queue, then the doorbell.
    fn execute(&self, q: &mut Queues, pc: u16, blueflame: bool, ring: &[u8]) {
        let p = q.place;
        let dma = &self.f.bus().dma;
        let mut sq = vec![0u8; p.sq_blocks as usize * 64];
        let len = ring.len().min(sq.len());
        sq[..len].copy_from_slice(&ring[..len]);
        let va = self.mr.addr();
        for w in sq.chunks_exact_mut(8) {
            let v = u64::from_be_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            if (SEED_VA..SEED_VA + BUF_LEN as u64).contains(&v) {
                w.copy_from_slice(&(va + (v - SEED_VA)).to_be_bytes());
            }
        }
        let _ = dma.write(p.sq_iova, &sq);
        let before = self.f.model().stats().doorbells;
        // The doorbell record's send counter, then the UAR doorbell: the
        // first 8 bytes (or the whole 64-byte block, BlueFlame) of the
        // block before the counter, as a driver rings its last WQE.
        let _ = dma.write_u32_be(p.dbr_iova + 4, u32::from(pc));
        let last = u64::from(pc.wrapping_sub(1)) % u64::from(p.sq_blocks);
        let mut block = [0u8; 64];
        let _ = dma.read(p.sq_iova + last * 64, &mut block);
        let n = if blueflame { 64 } else { 8 };
        let bar = self.f.model().bar0();
        let _ = bar.write(p.uar_page as usize * 4096 + 0x800, &block[..n]);
        let t = Instant::now();
        while self.f.model().stats().doorbells == before && t.elapsed() < NOTICE {
            std::thread::yield_now();
        }
        let seen = Self::drain(q);
        if std::env::var_os("MLX5_FUZZ_VERBOSE").is_some() {
            let s = self.f.model().stats();
            eprintln!(
                "pc {pc}: {seen} completions; model: {} messages sent, {} error CQEs, {} doorbells",
                s.messages_sent, s.error_cqes, s.doorbells
            );
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let [a, b, flags, ring @ ..] = data else {
        return;
    };
    let r = rig().lock().unwrap_or_else(|p| p.into_inner());
    let mut q = r.queues();
    r.execute(&mut q, u16::from_be_bytes([*a, *b]), flags & 1 != 0, ring);
    let Queues { cq, qp, .. } = q;
    qp.destroy()
        .unwrap_or_else(|e| panic!("destroy_qp after an input: {e}"));
    cq.destroy()
        .unwrap_or_else(|e| panic!("destroy_cq after an input: {e}"));
}

/// Seeds: valid WQEs of each opcode the model executes (with the rig's
/// real QPN, keys and addresses), and the hostile shapes: garbage opcodes,
/// ds counts of 0 and 63, bad keys, addresses outside the MR, a counter
/// past the ring.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let key = rig().lock().unwrap_or_else(|p| p.into_inner()).mr.lkey();
    // The control segments' QPN: the first a function hands out (each
    // input's QP has another; the model executes a WQE whatever QPN its
    // control segment names).
    let qpn = 0x100;
    let va = SEED_VA;
    // ctrl (16) + raddr (16) + data (16): one block.
    let wqe =
        |idx: u16, opcode: u8, ds: u8, raddr: u64, rkey: u32, len: u32, lkey: u32, addr: u64| {
            let mut b = [0u8; 64];
            b[0..4].copy_from_slice(&(u32::from(idx) << 8 | u32::from(opcode)).to_be_bytes());
            b[4..8].copy_from_slice(&(qpn << 8 | u32::from(ds)).to_be_bytes());
            b[11] = 0x08; // CQ_UPDATE: a completion for every WQE
            b[16..24].copy_from_slice(&raddr.to_be_bytes());
            b[24..28].copy_from_slice(&rkey.to_be_bytes());
            b[32..36].copy_from_slice(&len.to_be_bytes());
            b[36..40].copy_from_slice(&lkey.to_be_bytes());
            b[40..48].copy_from_slice(&addr.to_be_bytes());
            b
        };
    let one = |pc: u16, flags: u8, blocks: &[[u8; 64]]| {
        let mut v = pc.to_be_bytes().to_vec();
        v.push(flags);
        for b in blocks {
            v.extend_from_slice(b);
        }
        v
    };
    let write = wqe(0, 0x08, 3, va + 0x8000, key, 256, key, va);
    let read = wqe(0, 0x10, 3, va + 0x8000, key, 256, key, va + 0x1000);
    // SEND: ctrl + data (ds 2): the data segment right after the control.
    let mut send = wqe(0, 0x0a, 2, 0, 0, 0, 0, 0);
    send[16..20].copy_from_slice(&128u32.to_be_bytes());
    send[20..24].copy_from_slice(&key.to_be_bytes());
    send[24..32].copy_from_slice(&(va + 0x2000).to_be_bytes());
    let nop = wqe(0, 0x00, 1, 0, 0, 0, 0, 0);
    let chain: Vec<[u8; 64]> = (0..4u16)
        .map(|i| {
            wqe(
                i,
                0x08,
                3,
                va + 0x8000 + u64::from(i) * 256,
                key,
                256,
                key,
                va,
            )
        })
        .collect();
    vec![
        ("rdma-write".into(), one(1, 0, &[write])),
        ("rdma-write-blueflame".into(), one(1, 1, &[write])),
        ("rdma-read".into(), one(1, 0, &[read])),
        ("send".into(), one(1, 0, &[send])),
        ("nop".into(), one(1, 0, &[nop])),
        ("four-writes".into(), one(4, 0, &chain)),
        (
            "garbage-opcode".into(),
            one(1, 0, &[wqe(0, 0xee, 3, va, key, 64, key, va)]),
        ),
        (
            "ds-zero".into(),
            one(1, 0, &[wqe(0, 0x08, 0, va, key, 64, key, va)]),
        ),
        (
            "ds-63".into(),
            one(1, 0, &[wqe(0, 0x08, 63, va, key, 64, key, va)]),
        ),
        (
            "bad-lkey".into(),
            one(1, 0, &[wqe(0, 0x08, 3, va, key, 64, key ^ 0x5a00, va)]),
        ),
        (
            "bad-rkey".into(),
            one(1, 0, &[wqe(0, 0x08, 3, va, key ^ 0x5a00, 64, key, va)]),
        ),
        (
            "outside-mr".into(),
            one(
                1,
                0,
                &[wqe(
                    0,
                    0x08,
                    3,
                    va + BUF_LEN as u64 - 16,
                    key,
                    4096,
                    key,
                    va,
                )],
            ),
        ),
        ("pc-past-ring".into(), one(300, 0, &[write])),
        ("pc-behind".into(), one(0xffff, 0, &[write])),
    ]
}
