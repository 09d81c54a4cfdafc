//! `reg_mr_raw` of the program's own memory carrying RDMA between two
//! functions, on whatever backend opened them: the guest binary
//! `kernel-vfio-guest rdma` runs it on two model functions owned through
//! the guest kernel's VFIO (type1 group path or iommufd cdev), issue 14.
//!
//! Each memory kind (heap, anonymous private mmap, memfd, `MFD_HUGETLB`,
//! a hugetlbfs file) is registered on both functions with `reg_mr_raw`;
//! RDMA WRITE, RDMA READ and SEND run between them through those MRs and
//! the bytes are checked. The refusals are checked by name: an unmapped
//! hole and a read-only range (`EFAULT`), `RLIMIT_MEMLOCK` without
//! `CAP_IPC_LOCK` ([`vfio::Error::MemlockLimit`]) and type1's mapping-count
//! limit ([`vfio::Error::MappingLimit`]).
//!
//! Every check returns `Err(why)` instead of panicking, so that a guest
//! reports each one by name.

use std::time::{Duration, Instant};

use verbs::cq::{Cq, Wc, WcOpcode, WcStatus};
use verbs::device::Context;
use verbs::mr::{access, Mr};
use verbs::pd::Pd;
use verbs::qp::{
    required_mask, send_flags as sf, AhAttr, Payload, Qp, QpAttr, QpCap, QpInitAttr, QpState,
    QpType, RecvWr, SendOp, SendWr,
};
use vfio::dma::HugePage;

/// One check's outcome.
pub type Check = Result<(), String>;

/// Every access a user MR of these checks carries.
const ALL: u32 =
    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ | access::REMOTE_ATOMIC;
/// How long a completion may take: a guest under TCG on a shared host.
const POLL_DEADLINE: Duration = Duration::from_secs(60);
/// Bytes each transfer moves.
const XFER: usize = 16 << 10;
const HUGE: usize = 2 << 20;

/// Memory the program allocates itself.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// `Vec<u8>`, 4 KiB aligned inside.
    Heap,
    /// `mmap(MAP_PRIVATE | MAP_ANONYMOUS)`.
    AnonMmap,
    /// A memfd pool ([`vfio::HostMemory::memfd`]).
    Memfd,
    /// An `MFD_HUGETLB` memfd of 2 MiB pages.
    MemfdHugetlb,
    /// A file of a hugetlbfs mount (2 MiB pages).
    HugetlbfsFile,
}

impl Kind {
    /// Every kind, in the order the checks run.
    pub const ALL: [Kind; 5] = [
        Kind::Heap,
        Kind::AnonMmap,
        Kind::Memfd,
        Kind::MemfdHugetlb,
        Kind::HugetlbfsFile,
    ];

    /// The check's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Heap => "reg_mr_raw_heap_rdma",
            Kind::AnonMmap => "reg_mr_raw_anonymous_mmap_rdma",
            Kind::Memfd => "reg_mr_raw_memfd_rdma",
            Kind::MemfdHugetlb => "reg_mr_raw_memfd_hugetlb_2m_rdma",
            Kind::HugetlbfsFile => "reg_mr_raw_hugetlbfs_file_rdma",
        }
    }

    fn len(self) -> usize {
        match self {
            Kind::MemfdHugetlb | Kind::HugetlbfsFile => HUGE,
            _ => 64 << 10,
        }
    }
}

/// One allocation of a [`Kind`]; `ptr` is 4 KiB aligned, `len` bytes.
struct Held {
    ptr: *mut u8,
    len: usize,
    _own: Own,
}

enum Own {
    Heap(#[allow(dead_code)] Vec<u8>),
    Map(*mut u8, usize),
    Pool(#[allow(dead_code)] vfio::HostMemory),
}

impl Drop for Own {
    fn drop(&mut self) {
        if let Own::Map(p, len) = *self {
            // SAFETY: a mapping made by `map`, unmapped once, after every
            // MR over it is gone (MRs are dropped inside the checks).
            unsafe { libc::munmap(p.cast(), len) };
        }
    }
}

fn map(len: usize, prot: i32) -> Result<*mut u8, String> {
    // SAFETY: a new private anonymous mapping the kernel places.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    Ok(p.cast())
}

/// Allocates `kind`; hugetlbfs files go under `hugetlbfs`.
fn alloc(kind: Kind, hugetlbfs: &str) -> Result<Held, String> {
    let len = kind.len();
    let pool = |m: vfio::HostMemory| {
        let ptr = m.as_ptr();
        Held {
            ptr,
            len,
            _own: Own::Pool(m),
        }
    };
    Ok(match kind {
        Kind::Heap => {
            let mut v = vec![0u8; len + 4096];
            let p = v.as_mut_ptr();
            let ptr = p.wrapping_add(p.align_offset(4096));
            Held {
                ptr,
                len,
                _own: Own::Heap(v),
            }
        }
        Kind::AnonMmap => {
            let ptr = map(len, libc::PROT_READ | libc::PROT_WRITE)?;
            Held {
                ptr,
                len,
                _own: Own::Map(ptr, len),
            }
        }
        Kind::Memfd => pool(vfio::HostMemory::memfd(len).map_err(|e| e.to_string())?),
        Kind::MemfdHugetlb => pool(
            vfio::HostMemory::memfd_huge(len, HugePage::Size2M)
                .map_err(|e| format!("{e} (the guest reserves 2 MiB pages)"))?,
        ),
        Kind::HugetlbfsFile => pool(
            vfio::HostMemory::hugetlbfs(hugetlbfs, len)
                .map_err(|e| format!("{e} (hugetlbfs at {hugetlbfs})"))?,
        ),
    })
}

fn poke(p: *mut u8, data: &[u8]) {
    for (i, b) in data.iter().enumerate() {
        // SAFETY: callers pass pointers into live allocations with room
        // for `data`; volatile, as the device may access them.
        unsafe { p.wrapping_add(i).write_volatile(*b) };
    }
}

fn peek(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: as `poke`.
    (0..len)
        .map(|i| unsafe { p.wrapping_add(i).read_volatile() })
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn same(what: &str, got: &[u8], want: &[u8]) -> Check {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: bytes differ from byte {i}")),
    }
}

fn e2s(e: verbs::Error) -> String {
    e.to_string()
}

fn poll_one(cq: &mut Cq, what: &str) -> Result<Wc, String> {
    let mut wc = [Wc::default(); 1];
    let deadline = Instant::now() + POLL_DEADLINE;
    loop {
        if cq.poll(&mut wc).map_err(e2s)? == 1 {
            return if wc[0].status == WcStatus::Success {
                Ok(wc[0])
            } else {
                Err(format!("{what}: {:?}", wc[0]))
            };
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: no completion in {POLL_DEADLINE:?}"));
        }
        std::thread::yield_now();
    }
}

fn rc_qp(pd: &Pd, cq: &Cq) -> Result<Qp, String> {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    })
    .map_err(e2s)
}

/// RESET -> INIT -> RTR -> RTS towards `rqpn` on `remote`'s GID 0.
fn connect(qp: &mut Qp, remote: &Context, rqpn: u32) -> Check {
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        port_num: 1,
        qp_access_flags: access::REMOTE_WRITE | access::REMOTE_READ,
        ..Default::default()
    };
    qp.modify(
        &init,
        required_mask(QpType::Rc, QpState::Reset, QpState::Init),
    )
    .map_err(e2s)?;
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: 3,
        dest_qp_num: rqpn,
        rq_psn: 0x100,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: remote.query_gid(1, 0).map_err(e2s)?,
            sgid_index: 0,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    qp.modify(&rtr, required_mask(QpType::Rc, QpState::Init, QpState::Rtr))
        .map_err(e2s)?;
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: 0x100,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..Default::default()
    };
    qp.modify(&rts, required_mask(QpType::Rc, QpState::Rtr, QpState::Rts))
        .map_err(e2s)
}

fn post(qp: &mut Qp, wr_id: u64, op: SendOp, mr: &Mr, off: u64) -> Check {
    qp.post_send(&[SendWr {
        wr_id,
        op,
        payload: Payload::Sges(&[mr.sge(off, XFER as u32).map_err(e2s)?]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .map_err(|(i, e)| format!("post_send of WR {i}: {e:?}"))
}

/// Registers one allocation of `kind` on each function with `reg_mr_raw`
/// and moves data between them: RDMA WRITE a->b, RDMA READ of b into a,
/// SEND b->a, each at its own offsets (the last XFER bytes of huge
/// allocations, so offsets inside a huge page count); bytes checked.
pub fn traffic(kind: Kind, ctx: &[Context; 2], hugetlbfs: &str) -> Check {
    let (a, b) = (alloc(kind, hugetlbfs)?, alloc(kind, hugetlbfs)?);
    let pd = [
        ctx[0].alloc_pd().map_err(e2s)?,
        ctx[1].alloc_pd().map_err(e2s)?,
    ];
    let mut cq = [
        ctx[0].create_cq(16, None, None).map_err(e2s)?,
        ctx[1].create_cq(16, None, None).map_err(e2s)?,
    ];
    // SAFETY: `a` and `b` are live allocations of `len` bytes that outlive
    // the MRs (dropped before them at the end of this function), touched
    // only by volatile copies meanwhile.
    let ma = unsafe { pd[0].reg_mr_raw(a.ptr, a.len, ALL) }
        .map_err(|e| format!("reg_mr_raw on function 0: {e}"))?;
    // SAFETY: as above.
    let mb = unsafe { pd[1].reg_mr_raw(b.ptr, b.len, ALL) }
        .map_err(|e| format!("reg_mr_raw on function 1: {e}"))?;
    let mut qa = rc_qp(&pd[0], &cq[0])?;
    let mut qb = rc_qp(&pd[1], &cq[1])?;
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &ctx[1], nb)?;
    connect(&mut qb, &ctx[0], na)?;
    let (len, x) = (a.len, XFER as u64);
    let far = (len - XFER) as u64;

    // RDMA WRITE: a[0 .. x] -> b[far ..].
    let w = pattern(XFER, 1);
    poke(a.ptr, &w);
    let op = SendOp::RdmaWrite {
        raddr: mb.addr() + far,
        rkey: mb.rkey(),
    };
    post(&mut qa, 1, op, &ma, 0)?;
    poll_one(&mut cq[0], "RDMA WRITE")?;
    same(
        "RDMA WRITE",
        &peek(b.ptr.wrapping_add(far as usize), XFER),
        &w,
    )?;

    // RDMA READ: b[x .. 2x] -> a[far ..].
    let r = pattern(XFER, 2);
    poke(b.ptr.wrapping_add(XFER), &r);
    let op = SendOp::RdmaRead {
        raddr: mb.addr() + x,
        rkey: mb.rkey(),
    };
    post(&mut qa, 2, op, &ma, far)?;
    poll_one(&mut cq[0], "RDMA READ")?;
    same(
        "RDMA READ",
        &peek(a.ptr.wrapping_add(far as usize), XFER),
        &r,
    )?;

    // SEND: b[2x .. 3x] -> a[x .. 2x].
    let s = pattern(XFER, 3);
    poke(b.ptr.wrapping_add(2 * XFER), &s);
    qa.post_recv(&[RecvWr {
        wr_id: 3,
        sg_list: &[ma.sge(x, XFER as u32).map_err(e2s)?],
    }])
    .map_err(|(i, e)| format!("post_recv of WR {i}: {e:?}"))?;
    post(&mut qb, 4, SendOp::Send, &mb, 2 * x)?;
    poll_one(&mut cq[1], "SEND")?;
    let rw = poll_one(&mut cq[0], "RECV")?;
    if rw.opcode != WcOpcode::Recv || rw.byte_len as usize != XFER {
        return Err(format!("RECV completion {rw:?}"));
    }
    same("SEND", &peek(a.ptr.wrapping_add(XFER), XFER), &s)?;
    drop((qa, qb));
    ma.dereg().map_err(e2s)?;
    mb.dereg().map_err(e2s)?;
    drop(cq);
    drop(pd);
    drop((a, b));
    Ok(())
}

fn expect_efault(pd: &Pd, p: *mut u8, len: usize, what: &str) -> Check {
    // SAFETY: refused before anything is mapped (the range is checked
    // against /proc/self/maps first); were it accepted, the MR is
    // dropped at once while `p` is still mapped as far as it is.
    match unsafe { pd.reg_mr_raw(p, len, ALL) } {
        Err(e) if e.errno() == libc::EFAULT => {
            println!("kvfio:   {what}: {e}");
            Ok(())
        }
        Err(e) => Err(format!("{what}: refused for another reason: {e}")),
        Ok(_) => Err(format!("{what}: reg_mr_raw accepted it")),
    }
}

/// A hole in the middle of the range, and a read-only mapping: `EFAULT`.
pub fn refuses_unmapped_and_read_only(ctx: &Context) -> Check {
    let pd = ctx.alloc_pd().map_err(e2s)?;
    let p = map(3 * 4096, libc::PROT_READ | libc::PROT_WRITE)?;
    // SAFETY: the middle page of the mapping just made, nothing else.
    unsafe { libc::munmap(p.wrapping_add(4096).cast(), 4096) };
    let hole = expect_efault(&pd, p, 3 * 4096, "a range with an unmapped page");
    for left in [p, p.wrapping_add(8192)] {
        // SAFETY: one of the two pages left of that mapping.
        unsafe { libc::munmap(left.cast(), 4096) };
    }
    hole?;
    let ro = map(4096, libc::PROT_READ)?;
    let r = expect_efault(&pd, ro, 4096, "a read-only mapping");
    // SAFETY: the mapping just made.
    unsafe { libc::munmap(ro.cast(), 4096) };
    r
}

fn set_memlock(cur: u64) -> Result<u64, String> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Err("getrlimit".into());
    }
    let old = r.rlim_cur;
    r.rlim_cur = cur;
    // SAFETY: setrlimit reads the live local.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } != 0 {
        return Err("setrlimit".into());
    }
    Ok(old)
}

/// Drops `CAP_IPC_LOCK` from this thread's effective set (root ignores
/// `RLIMIT_MEMLOCK` with it).
fn drop_cap_ipc_lock() -> Check {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAP_IPC_LOCK: u32 = 14;
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget writes the live header and the two data words
    // version 3 defines.
    if unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) } != 0 {
        return Err("capget".into());
    }
    d[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset reads them back; it acts on this thread only.
    if unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) } != 0 {
        return Err("capset".into());
    }
    Ok(())
}

/// `reg_mr_raw` of 1 MiB of heap from a thread without `CAP_IPC_LOCK`
/// under a 64 KiB `RLIMIT_MEMLOCK`: refused as
/// [`vfio::Error::MemlockLimit`], the limit named.
pub fn refuses_past_memlock(ctx: &Context) -> Check {
    let pd = ctx.alloc_pd().map_err(e2s)?;
    std::thread::scope(|s| {
        s.spawn(|| -> Check {
            drop_cap_ipc_lock()?;
            let old = set_memlock(64 << 10)?;
            let mut v = vec![0u8; (1 << 20) + 4096];
            let p = v.as_mut_ptr().wrapping_add(v.as_ptr().align_offset(4096));
            // SAFETY: `v` outlives the MR, dropped at once if made.
            let r = match unsafe { pd.reg_mr_raw(p, 1 << 20, ALL) } {
                Err(e @ verbs::Error::Vfio(vfio::Error::MemlockLimit { .. })) => {
                    println!("kvfio:   {e}");
                    Ok(())
                }
                Err(e) => Err(format!("refused for another reason: {e}")),
                Ok(_) => Err("1 MiB of heap passed a 64 KiB RLIMIT_MEMLOCK".into()),
            };
            set_memlock(old)?;
            r
        })
        .join()
        .map_err(|_| "thread panicked".to_string())?
    })
}

/// Type1's `dma_entry_limit`: `left` more mappings are allowed; that many
/// 4 KiB heap MRs (a page apart, so no two merge) are taken, and one more
/// is refused as [`vfio::Error::MappingLimit`]; all given back after.
pub fn refuses_past_mapping_limit(ctx: &Context, left: u32) -> Check {
    let pd = ctx.alloc_pd().map_err(e2s)?;
    let n = left as usize + 1;
    let mut v = vec![0u8; (2 * n + 1) * 4096];
    let base = v.as_mut_ptr().wrapping_add(v.as_ptr().align_offset(4096));
    let mut mrs = Vec::new();
    let mut out = Err(format!("{n} MRs of 4 KiB all registered ({left} allowed)"));
    for i in 0..n {
        // SAFETY: a page of `v`, which outlives every MR (dropped below).
        match unsafe { pd.reg_mr_raw(base.wrapping_add(2 * i * 4096), 4096, ALL) } {
            Ok(m) => mrs.push(m),
            Err(e @ verbs::Error::Vfio(vfio::Error::MappingLimit { .. })) if i == left as usize => {
                println!("kvfio:   MR {i}: {e}");
                out = Ok(());
                break;
            }
            Err(e) => {
                out = Err(format!("MR {i} of {left} allowed refused: {e}"));
                break;
            }
        }
    }
    for m in mrs {
        m.dereg().map_err(e2s)?;
    }
    drop(v);
    out
}
