//! The driver's own memory at scale: 10,000 QPs and 10,000 CQs on one
//! function of the in-process model at the default fd limit (1024). Every
//! ring, CQE buffer and doorbell record is a piece of a few large chunks
//! (`verbs::buf`), so the process holds a few dozen fds and DMA mappings
//! however many queues exist, and all of it comes back when they go. The
//! 20,000 objects need more UAR pages than BAR0 has (8,176): the driver
//! asks firmware once more when they run out, then shares them.

use std::sync::{Arc, Mutex};

use mlx5_hw::opcode::Opcode;
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::qp::{QpCap, QpInitAttr, QpType};
use vfio::PciFunction;

/// The tests count the fds of the whole process: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The most fds and DMA mappings the queues may add ("a few dozen").
const FEW_DOZEN: usize = 48;

/// Sets the soft RLIMIT_NOFILE to `n` (the default `ulimit -n`).
fn limit_fds(n: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the live local `r` and nothing else.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r.rlim_cur = n.min(r.rlim_max);
    // SAFETY: setrlimit reads the live local `r`.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
    assert_eq!(r.rlim_cur, n, "the hard limit allows {n} fds");
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// The acceptance size: 10,000 QPs and 10,000 CQs (about 7 s unoptimized
/// on a loaded 2-core machine: the model's per-pass work does not grow
/// with the object count, see docs/MEASUREMENTS.md).
#[test]
fn ten_thousand_qps_and_cqs_at_the_default_fd_limit() {
    queues_at_the_default_fd_limit(10_000);
}

/// ALLOC_UARs in the model's command log that firmware refused.
fn refused_alloc_uars(m: &mlx5_emu::Device) -> usize {
    m.command_log()
        .iter()
        .filter(|e| e.opcode == Opcode::AllocUar.to_raw() && e.status != 0)
        .count()
}

fn queues_at_the_default_fd_limit(n: usize) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    limit_fds(1024);
    let f = Arc::new(mlx5_emu::emulated(mlx5_emu::Profile::ConnectX4Lx));
    let func: Arc<dyn PciFunction> = f.clone();
    let ctx = Context::open(func.clone(), HcaOptions::default()).expect("open");
    let pd = ctx.alloc_pd().expect("PD");
    let (fds0, maps0) = (open_fds(), func.dma_mappings());
    let mem0 = ctx.hca().queue_memory();
    let uars0 = f.model().stats().uars;
    f.model().clear_command_log();

    let cqs: Vec<_> = (0..n)
        .map(|i| {
            ctx.create_cq(1, None, None)
                .unwrap_or_else(|e| panic!("CQ {i}: {e}"))
        })
        .collect();
    // The log keeps the last 16,384 commands: every CQ created once the
    // pages ran out is in it.
    let refused = refused_alloc_uars(f.model());
    f.model().clear_command_log();
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qps: Vec<_> = cqs
        .iter()
        .enumerate()
        .map(|(i, cq)| {
            pd.create_qp(&QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap,
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap_or_else(|e| panic!("QP {i}: {e}"))
        })
        .collect();

    let st = f.model().stats();
    assert_eq!((st.qps, st.cqs >= n), (n, true), "{st:?}");
    let refused = refused + refused_alloc_uars(f.model());
    assert!(
        refused <= 1,
        "{refused} ALLOC_UARs refused: one per object?"
    );
    println!(
        "UAR pages {uars0} -> {}, ALLOC_UARs refused: {refused}",
        st.uars
    );
    let (fds, maps) = (open_fds(), func.dma_mappings());
    let mem = ctx.hca().queue_memory();
    println!(
        "{n} QPs + {n} CQs: fds {fds0} -> {fds}, DMA mappings {maps0} -> {maps}, \
         arena {} chunks ({} MiB, {} huge), {} pieces ({} MiB), {} doorbell records in {} pages",
        mem.chunks,
        mem.chunk_bytes >> 20,
        mem.huge_chunks,
        mem.pieces,
        mem.piece_bytes >> 20,
        mem.dbrecs,
        mem.dbrec_pages,
    );
    assert!(fds <= fds0 + FEW_DOZEN, "fds {fds0} -> {fds}");
    assert!(maps <= maps0 + FEW_DOZEN, "DMA mappings {maps0} -> {maps}");
    assert_eq!(mem.dbrecs, mem0.dbrecs + 2 * n, "{mem:?}");
    assert!(mem.chunks <= mem0.chunks + FEW_DOZEN, "{mem:?}");

    drop(qps);
    drop(cqs);
    let st = f.model().stats();
    assert_eq!(st.qps, 0, "{st:?}");
    let mem = ctx.hca().queue_memory();
    assert_eq!(mem, mem0, "every queue's memory came back");
    assert_eq!(mem.quarantined_bytes, 0);
    assert_eq!(func.dma_mappings(), maps0, "every chunk unmapped");
    assert_eq!(open_fds(), fds0, "every chunk's fd closed");
    drop(pd);
    drop(ctx);
    assert_eq!(func.dma_mappings(), 0, "nothing mapped after close");
}
