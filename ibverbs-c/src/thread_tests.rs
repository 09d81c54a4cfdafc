//! Threads sharing the C ABI's QPs and CQs, in process on two built-in
//! model functions with an RC QP between them: which thread the data-path
//! locks are biased to, and that two threads polling one CQ neither lose
//! nor duplicate a completion.

use std::ffi::{c_int, c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::abi::{
    ibv_cq, ibv_device, ibv_gid, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_cap, ibv_qp_init_attr,
    ibv_send_wr, ibv_send_wr_rdma, ibv_send_wr_wr, ibv_sge, ibv_wc,
};
use crate::spin::{biasing_possible, this_thread, Bias, SpinLock};

// verbs.h's values.
const IBV_QPT_RC: c_int = 2;
const IBV_QPS_INIT: c_int = 1;
const IBV_QPS_RTR: c_int = 2;
const IBV_QPS_RTS: c_int = 3;
const IBV_MTU_4096: c_int = 5;
const IBV_WR_RDMA_WRITE: c_int = 0;
const IBV_SEND_SIGNALED: u32 = 2;
const ACCESS: c_int = 1 | 2 | 4; // LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ
const QP_STATE: c_int = 1;
const QP_ACCESS_FLAGS: c_int = 8;
const QP_PKEY_INDEX: c_int = 16;
const QP_PORT: c_int = 32;
const QP_AV: c_int = 128;
const QP_PATH_MTU: c_int = 256;
const QP_TIMEOUT: c_int = 512;
const QP_RETRY_CNT: c_int = 1024;
const QP_RNR_RETRY: c_int = 2048;
const QP_RQ_PSN: c_int = 4096;
const QP_MAX_QP_RD_ATOMIC: c_int = 8192;
const QP_MIN_RNR_TIMER: c_int = 32768;
const QP_SQ_PSN: c_int = 65536;
const QP_MAX_DEST_RD_ATOMIC: c_int = 131_072;
const QP_DEST_QPN: c_int = 1 << 20;

const SQ: u32 = 1024;
const BUF: usize = 1 << 20;

/// One end: its objects and registered buffer.
struct Side {
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    pd: *mut ibv_pd,
    mr: *mut ibv_mr,
    buf: *mut u8,
    gid: ibv_gid,
}

// SAFETY: the C ABI's objects may be used from any thread (its locks are
// what these tests check); the buffer is leaked, so it outlives them.
unsafe impl Send for Side {}
// SAFETY: as above; the tests share a side's objects, not Rust data.
unsafe impl Sync for Side {}

/// The two model functions ("emu,emu"), listed once per test process.
fn devices() -> [*mut ibv_device; 2] {
    static LIST: OnceLock<[usize; 2]> = OnceLock::new();
    let l = LIST.get_or_init(|| {
        let s = CString::new("emu,emu").unwrap();
        assert_eq!(crate::device::mlx5u_set_devices(s.as_ptr()), 0);
        let mut n = 0;
        let list = crate::device::ibv_get_device_list(&mut n);
        assert!(!list.is_null() && n == 2, "two model functions");
        // SAFETY: a NULL-terminated list of `n` = 2 devices.
        let l = unsafe { std::slice::from_raw_parts(list, 2) };
        [l[0] as usize, l[1] as usize]
    });
    [l[0] as *mut ibv_device, l[1] as *mut ibv_device]
}

fn open_side(dev: *mut ibv_device) -> Side {
    let ctx = crate::device::ibv_open_device(dev);
    assert!(!ctx.is_null());
    let pd = crate::objects::ibv_alloc_pd(ctx);
    let cq = crate::objects::ibv_create_cq(
        ctx,
        SQ as c_int,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        0,
    );
    assert!(!pd.is_null() && !cq.is_null());
    let buf = Box::leak(vec![0u8; BUF].into_boxed_slice()).as_mut_ptr();
    let mr = crate::objects::ibv_reg_mr(pd, buf.cast::<c_void>(), BUF, ACCESS);
    assert!(!mr.is_null());
    let qp = create_qp(pd, cq);
    let mut gid = ibv_gid::default();
    assert_eq!(crate::device::ibv_query_gid(ctx, 1, 0, &mut gid), 0);
    Side {
        cq,
        qp,
        pd,
        mr,
        buf,
        gid,
    }
}

fn create_qp(pd: *mut ibv_pd, cq: *mut ibv_cq) -> *mut ibv_qp {
    let mut ia = ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: std::ptr::null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: SQ,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 0,
    };
    let qp = crate::qp::ibv_create_qp(pd, &mut ia);
    assert!(!qp.is_null());
    qp
}

/// INIT, RTR to `p`, RTS.
fn connect(s: &Side, p: &Side) {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        port_num: 1,
        qp_access_flags: ACCESS as u32,
        ..Default::default()
    };
    let m = QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
    assert_eq!(crate::qp::ibv_modify_qp(s.qp, &mut a, m), 0);
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: IBV_MTU_4096,
        // SAFETY: the peer's live QP.
        dest_qp_num: unsafe { (*p.qp).qp_num },
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ..Default::default()
    };
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = p.gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    let m = QP_STATE
        | QP_AV
        | QP_PATH_MTU
        | QP_DEST_QPN
        | QP_RQ_PSN
        | QP_MAX_DEST_RD_ATOMIC
        | QP_MIN_RNR_TIMER;
    assert_eq!(crate::qp::ibv_modify_qp(s.qp, &mut a, m), 0);
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..Default::default()
    };
    let m = QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC;
    assert_eq!(crate::qp::ibv_modify_qp(s.qp, &mut a, m), 0);
}

/// Two connected sides, made and connected on this thread.
fn pair() -> (Side, Side) {
    let [d0, d1] = devices();
    let (a, b) = (open_side(d0), open_side(d1));
    connect(&a, &b);
    connect(&b, &a);
    (a, b)
}

/// A signaled 64-byte RDMA WRITE from `a`'s slot `i % 1024` to `b`'s,
/// posted through `ibv_post_send` (the header's inline call's target).
fn post_write(a: &Side, b: &Side, wr_id: u64) {
    let slot = (wr_id % 1024) * 64;
    let mut sge = ibv_sge {
        addr: a.buf as u64 + slot,
        length: 64,
        // SAFETY: a live MR.
        lkey: unsafe { (*a.mr).lkey },
    };
    // SAFETY: ibv_send_wr is plain data (pointers, integers): all zero is
    // a valid empty WR.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr = ibv_send_wr_wr {
        rdma: ibv_send_wr_rdma {
            remote_addr: b.buf as u64 + slot,
            // SAFETY: a live MR.
            rkey: unsafe { (*b.mr).rkey },
        },
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: a live QP and a well-formed WR list of one.
    let r = unsafe { crate::datapath::post_send(a.qp, &mut wr, &mut bad) };
    assert_eq!(r, 0, "ibv_post_send");
}

/// `ibv_poll_cq` into `wc`: how many, every one a success.
fn poll(cq: *mut ibv_cq, wc: &mut [ibv_wc]) -> usize {
    // SAFETY: a live CQ and an array of `wc.len()` entries.
    let n = unsafe { crate::datapath::poll_cq(cq, wc.len() as c_int, wc.as_mut_ptr()) };
    assert!(n >= 0, "ibv_poll_cq failed");
    for w in &wc[..n as usize] {
        assert_eq!(w.status, 0, "completion {} failed", w.wr_id);
    }
    n as usize
}

/// Polls until one completion comes; its wr_id.
fn poll_one(cq: *mut ibv_cq) -> u64 {
    let mut wc = [ibv_wc::default()];
    tests::wait::until("a completion", || poll(cq, &mut wc) == 1);
    wc[0].wr_id
}

fn cq_lock<'a>(cq: *mut ibv_cq) -> &'a SpinLock<verbs::cq::Cq> {
    // SAFETY: a live CQ of this library; only its lock is borrowed.
    unsafe { &(*(cq as *const crate::objects::Cq)).cq }
}

fn qp_lock<'a>(qp: *mut ibv_qp) -> &'a SpinLock<verbs::qp::Qp> {
    // SAFETY: a live QP of this library; only its lock is borrowed.
    unsafe { &(*(qp as *const crate::qp::Qp)).qp }
}

#[test]
fn a_cq_made_on_one_thread_is_biased_to_the_thread_that_polls_it() {
    let (a, b) = pair();
    if !biasing_possible() {
        // No membarrier: every lock a spinlock from the start.
        assert_eq!(cq_lock(a.cq).bias(), Bias::Revoked);
        return;
    }
    if cq_lock(a.cq).bias() == Bias::Single {
        return; // MLX5_SINGLE_THREADED=1: no lock to bias
    }
    // Creating the QP, connecting it (control path) and arming the CQ
    // before any poll claimed nothing.
    // SAFETY: a live CQ.
    assert_eq!(unsafe { crate::datapath::req_notify_cq(a.cq, 0) }, 0);
    assert_eq!(
        cq_lock(a.cq).bias(),
        Bias::Unowned,
        "CQ after ibv_create_qp"
    );
    assert_eq!(
        qp_lock(a.qp).bias(),
        Bias::Unowned,
        "QP after ibv_modify_qp"
    );
    // Another thread posts and polls: the data path is biased to it.
    let worker = std::thread::scope(|s| {
        s.spawn(|| {
            post_write(&a, &b, 7);
            assert_eq!(poll_one(a.cq), 7);
            this_thread()
        })
        .join()
        .unwrap()
    });
    assert_ne!(worker, this_thread());
    assert_eq!(
        cq_lock(a.cq).bias(),
        Bias::Owner(worker),
        "CQ after the polls"
    );
    assert_eq!(
        qp_lock(a.qp).bias(),
        Bias::Owner(worker),
        "QP after the post"
    );
    // The control path on this thread borrows the locks and gives the
    // bias back: a second QP on the CQ, a query of the QP.
    let qp2 = create_qp(a.pd, a.cq);
    let mut attr = ibv_qp_attr::default();
    // SAFETY: ibv_qp_init_attr is plain data: all zero is valid.
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    assert_eq!(crate::qp::ibv_query_qp(a.qp, &mut attr, 0, &mut init), 0);
    assert_eq!(attr.qp_state, IBV_QPS_RTS);
    assert_eq!(
        cq_lock(a.cq).bias(),
        Bias::Owner(worker),
        "CQ after a control call"
    );
    assert_eq!(
        qp_lock(a.qp).bias(),
        Bias::Owner(worker),
        "QP after a control call"
    );
    assert_eq!(crate::qp::ibv_destroy_qp(qp2), 0);
    // A second thread on the data path shares the CQ: revoked for good.
    post_write(&a, &b, 8);
    assert_eq!(poll_one(a.cq), 8);
    assert_eq!(
        cq_lock(a.cq).bias(),
        Bias::Revoked,
        "CQ polled by two threads"
    );
    assert_eq!(
        qp_lock(a.qp).bias(),
        Bias::Revoked,
        "QP posted by two threads"
    );
}

#[test]
fn two_threads_polling_one_cq_neither_lose_nor_duplicate_a_completion() {
    const N: u64 = 8192;
    const WINDOW: usize = 512;
    let (a, b) = pair();
    if cq_lock(a.cq).bias() == Bias::Single {
        return; // MLX5_SINGLE_THREADED=1 promises no such sharing
    }
    let polled = AtomicUsize::new(0);
    let got: Vec<Vec<u64>> = std::thread::scope(|s| {
        let pollers: Vec<_> = [1usize, 4]
            .into_iter()
            .map(|batch| {
                let (a, polled) = (&a, &polled);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    let mut wc = vec![ibv_wc::default(); batch];
                    tests::wait::until("every completion polled", || {
                        let n = poll(a.cq, &mut wc);
                        mine.extend(wc[..n].iter().map(|w| w.wr_id));
                        polled.fetch_add(n, Ordering::AcqRel) + n >= N as usize
                    });
                    mine
                })
            })
            .collect();
        // This thread posts, never more than WINDOW outstanding.
        for id in 0..N {
            while id as usize - polled.load(Ordering::Acquire) >= WINDOW {
                std::thread::yield_now();
            }
            post_write(&a, &b, id);
        }
        pollers.into_iter().map(|p| p.join().unwrap()).collect()
    });
    assert_eq!(
        polled.load(Ordering::Relaxed),
        N as usize,
        "polled more than posted"
    );
    let mut all: Vec<u64> = got.into_iter().flatten().collect();
    all.sort_unstable();
    assert_eq!(all.len(), N as usize);
    assert!(all.iter().copied().eq(0..N), "each completion exactly once");
}
