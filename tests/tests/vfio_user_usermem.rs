//! `reg_mr_raw` of the program's own memory over vfio-user, against
//! `mlx5-emu serve` in its own process (two cabled functions): memory
//! reaches the server only by file descriptor, so the heap and anonymous
//! private mappings are refused by name (`vfio::Error::NotShareable`), and
//! memfd, shared anonymous, `MFD_HUGETLB` and hugetlbfs memory carry RDMA
//! WRITE and SEND between the functions, byte-exact.
//!
//! Huge pages: when too few are free, the test (as root) reserves them
//! through `/proc/sys/vm/nr_hugepages` and mounts a hugetlbfs of its own,
//! and gives both back afterwards. If it cannot, it fails saying NOT RUN.

mod verbs_common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;

use tests::wait::HANG_GUARD;
use verbs::cq::{WcOpcode, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::Mr;
use verbs::qp::{send_flags as sf, Payload, QpType, RecvWr, SendOp, SendWr};
use verbs_common::*;
use vfio::dma::HugePage;
use vfio::user::VfioUserFunction;
use vfio::HostMemory;

/// `mlx5-emu`, built now so that it carries this tree's server.
fn emu_bin() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["build", "-q", "-p", "tools", "--bin", "mlx5-emu"])
        .output()
        .expect("running cargo build");
    assert!(
        out.status.success(),
        "cargo build mlx5-emu: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // target/debug/deps/<this test> -> target/debug/mlx5-emu
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("mlx5-emu")
}

/// `mlx5-emu serve --functions 2` in its own process.
struct Served {
    child: Child,
    sock: PathBuf,
    _log: Receiver<String>,
}

impl Served {
    fn start(tag: &str) -> Self {
        let sock =
            std::env::temp_dir().join(format!("mlx5-usermem-{tag}-{}.sock", std::process::id()));
        let mut child = Command::new(emu_bin())
            .args(["serve", "--functions", "2", "--socket"])
            .arg(&sock)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting mlx5-emu serve");
        let err = child.stderr.take().expect("piped stderr");
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[mlx5-emu] {line}");
                let _ = tx.send(line);
            }
        });
        loop {
            match log.recv_timeout(HANG_GUARD) {
                Ok(l) if l.contains("mlx5-emu: serving") => break,
                Ok(_) => {}
                Err(e) => panic!("mlx5-emu serve never said it serves ({e})"),
            }
        }
        Self {
            child,
            sock,
            _log: log,
        }
    }

    fn open(&self, i: u32) -> Context {
        let path = if i == 0 {
            self.sock.clone()
        } else {
            PathBuf::from(format!("{}.{i}", self.sock.display()))
        };
        let f = VfioUserFunction::connect(&path).unwrap_or_else(|e| panic!("connect: {e}"));
        Context::open(Arc::new(f), HcaOptions::default()).unwrap_or_else(|e| panic!("open: {e}"))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain mmap of `len` bytes (`flags`, from `fd` at `off` or anonymous).
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(len: usize, flags: i32, fd: i32, off: i64) -> Self {
        // SAFETY: a new mapping chosen by the kernel; nothing is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                off,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Self { ptr: p.cast(), len }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once, after every MR
        // over it is gone (they are dropped first in each test).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn memfd(len: u64, flags: u32) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"usermem-test".as_ptr(), libc::MFD_CLOEXEC | flags) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a new fd, owned here.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

/// Writes `data` at `p` (volatile: the device may read it concurrently).
fn poke(p: *mut u8, data: &[u8]) {
    for (i, b) in data.iter().enumerate() {
        // SAFETY: callers pass pointers into their live mappings with room
        // for `data`.
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
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// Registers `len` bytes at `a` on function 0 and at `b` on function 1,
/// then RDMA WRITEs a→b and SENDs b→a through those MRs; checks the bytes.
fn traffic(kind: &str, ctx: &[Context; 2], a: *mut u8, b: *mut u8, len: usize) {
    let pd = [ctx[0].alloc_pd().unwrap(), ctx[1].alloc_pd().unwrap()];
    let mut cq = [
        ctx[0].create_cq(64, None, None).unwrap(),
        ctx[1].create_cq(64, None, None).unwrap(),
    ];
    let reg = |i: usize, p: *mut u8| -> Mr {
        // SAFETY: `a` and `b` are `len` bytes of live mappings that outlive
        // the MRs (deregistered at the end of this function) and are only
        // touched by volatile copies.
        unsafe { pd[i].reg_mr_raw(p, len, ALL) }
            .unwrap_or_else(|e| panic!("{kind}: reg_mr_raw on function {i}: {e}"))
    };
    let (ma, mb) = (reg(0, a), reg(1, b));
    let side = |i: usize| Side2 {
        pd: &pd[i],
        cq: &cq[i],
    };
    let mut qa = side(0).qp();
    let mut qb = side(1).qp();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &ctx[0], &ctx[1], nb);
    connect(&mut qb, &ctx[1], &ctx[0], na);

    // RDMA WRITE: a[0 .. half] -> b[half ..].
    let half = len / 2;
    let data = pattern(half, kind.len() as u8);
    poke(a, &data);
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            raddr: mb.addr() + half as u64,
            rkey: mb.rkey(),
        },
        payload: Payload::Sges(&[ma.sge(0, half as u32).unwrap()]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let wc = poll_n(&mut cq[0], 1);
    assert_eq!(wc[0].status, WcStatus::Success, "{kind}: write {:?}", wc[0]);
    // `half .. len` lies inside `b`.
    assert_eq!(
        peek(b.wrapping_add(half), half),
        data,
        "{kind}: RDMA WRITE bytes"
    );

    // SEND: b[0 .. half] -> a[half ..].
    let data = pattern(half, 0x5a ^ kind.len() as u8);
    poke(b, &data);
    qa.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: &[ma.sge(half as u64, half as u32).unwrap()],
    }])
    .unwrap();
    qb.post_send(&[SendWr {
        wr_id: 3,
        op: SendOp::Send,
        payload: Payload::Sges(&[mb.sge(0, half as u32).unwrap()]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let sw = poll_n(&mut cq[1], 1);
    assert_eq!(sw[0].status, WcStatus::Success, "{kind}: send {:?}", sw[0]);
    let rw = poll_n(&mut cq[0], 1);
    assert_eq!(rw[0].status, WcStatus::Success, "{kind}: recv {:?}", rw[0]);
    assert_eq!(rw[0].opcode, WcOpcode::Recv);
    assert_eq!(rw[0].byte_len as usize, half);
    // `half .. len` lies inside `a`.
    assert_eq!(peek(a.wrapping_add(half), half), data, "{kind}: SEND bytes");
    drop((qa, qb));
    ma.dereg().unwrap();
    mb.dereg().unwrap();
    println!("{kind}: reg_mr_raw + RDMA WRITE + SEND over vfio-user: ok");
}

struct Side2<'a> {
    pd: &'a verbs::pd::Pd,
    cq: &'a verbs::cq::Cq,
}

impl Side2<'_> {
    fn qp(&self) -> verbs::qp::Qp {
        self.pd
            .create_qp(&verbs::qp::QpInitAttr {
                send_cq: self.cq,
                recv_cq: self.cq,
                srq: None,
                cap: cap(16),
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap()
    }
}

fn expect_not_shareable(ctx: &Context, p: *mut u8, len: usize, what: &str) {
    let pd = ctx.alloc_pd().unwrap();
    // SAFETY: `p .. p + len` is live memory of the caller; the registration
    // is refused before any mapping is made.
    let e = unsafe { pd.reg_mr_raw(p, len, ALL) }
        .err()
        .unwrap_or_else(|| panic!("{what}: reg_mr_raw was accepted over vfio-user"));
    assert!(
        matches!(e, verbs::Error::Vfio(vfio::Error::NotShareable { .. })),
        "{what}: {e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("HostMemory") && msg.contains("memfd"),
        "{what}: {msg}"
    );
    println!("{what}: refused by name: {msg}");
}

#[test]
fn heap_and_anonymous_private_memory_are_refused_by_name() {
    let s = Served::start("refuse");
    let ctx = s.open(0);
    let mut heap = vec![0u8; 64 << 10];
    let at = heap
        .as_mut_ptr()
        .wrapping_add(heap.as_ptr().align_offset(4096));
    expect_not_shareable(&ctx, at, 16 << 10, "heap");
    let anon = Map::new(64 << 10, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
    expect_not_shareable(&ctx, anon.ptr, anon.len, "anonymous private mmap");
    // A private mapping of a file: the server would not see our copies.
    let f = memfd(64 << 10, 0);
    let private = Map::new(
        64 << 10,
        libc::MAP_PRIVATE,
        std::os::fd::AsRawFd::as_raw_fd(&f),
        0,
    );
    expect_not_shareable(&ctx, private.ptr, private.len, "private file mmap");
    // Nothing was left mapped by the refusals.
    drop(ctx);
}

#[test]
fn memfd_and_shared_anonymous_memory_carry_rdma_write_and_send() {
    let s = Served::start("memfd");
    let ctx = [s.open(0), s.open(1)];
    let len = 64 << 10;
    // A HostMemory pool (found without /proc), at an offset inside it.
    let pa = HostMemory::memfd(4 * len).unwrap();
    // A memfd mapped by hand from a file offset (found through
    // /proc/self/maps and /proc/self/fd), its fd then closed: the mapping
    // alone keeps it (found through /proc/self/map_files).
    let f = memfd(4 * len as u64, 0);
    let pb = Map::new(
        2 * len,
        libc::MAP_SHARED,
        std::os::fd::AsRawFd::as_raw_fd(&f),
        len as i64,
    );
    traffic(
        "memfd (HostMemory / by hand, fd open)",
        &ctx,
        pa.as_ptr().wrapping_add(len + 4096),
        pb.ptr.wrapping_add(4096),
        len,
    );
    drop(f);
    if is_root() {
        traffic(
            "memfd (HostMemory / by hand, fd closed)",
            &ctx,
            pa.as_ptr(),
            pb.ptr,
            len,
        );
    }
    let sa = Map::new(len, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0);
    let sb = Map::new(len, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0);
    if is_root() {
        traffic("shared anonymous mmap", &ctx, sa.ptr, sb.ptr, len);
    } else {
        expect_not_shareable(&ctx[0], sa.ptr, len, "shared anonymous mmap (not root)");
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

fn free_2m() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// 2 MiB pages reserved for the test (and a hugetlbfs mount), given back
/// on drop.
struct HugeSetup {
    added: u64,
    mount: PathBuf,
}

impl HugeSetup {
    fn new(need: u64) -> Self {
        let free = free_2m();
        let mut added = 0;
        if free < need {
            if !is_root() {
                panic!(
                    "NOT RUN: {free} free 2 MiB huge pages, {need} needed, and not root to \
                     reserve them (echo {need} > {NR_HUGEPAGES})"
                );
            }
            let now: u64 = std::fs::read_to_string(NR_HUGEPAGES)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            added = need - free;
            std::fs::write(NR_HUGEPAGES, (now + added).to_string()).unwrap();
            if free_2m() < need {
                let _ = std::fs::write(NR_HUGEPAGES, now.to_string());
                panic!(
                    "NOT RUN: asked the kernel for {added} more 2 MiB pages, only {} are free \
                     (memory too fragmented?)",
                    free_2m()
                );
            }
        }
        let mount = std::env::temp_dir().join(format!("usermem-huge-{}", std::process::id()));
        std::fs::create_dir_all(&mount).unwrap();
        let st = Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", "pagesize=2M", "none"])
            .arg(&mount)
            .status()
            .expect("running mount");
        assert!(st.success(), "NOT RUN: mount -t hugetlbfs failed ({st})");
        Self { added, mount }
    }
}

impl Drop for HugeSetup {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir(&self.mount);
        if self.added > 0 {
            if let Ok(now) = std::fs::read_to_string(NR_HUGEPAGES) {
                if let Ok(n) = now.trim().parse::<u64>() {
                    let _ = std::fs::write(NR_HUGEPAGES, n.saturating_sub(self.added).to_string());
                }
            }
        }
    }
}

#[test]
fn hugetlb_memory_carries_rdma_write_and_send() {
    const HUGE: usize = 2 << 20;
    let setup = HugeSetup::new(4);
    let s = Served::start("huge");
    let ctx = [s.open(0), s.open(1)];
    // MFD_HUGETLB through HostMemory, and a hugetlbfs file mapped by hand
    // (found through /proc/self/maps by its path), each two pages.
    let pa = HostMemory::memfd_huge(2 * HUGE, HugePage::Size2M)
        .unwrap_or_else(|e| panic!("NOT RUN: {e}"));
    assert_eq!(pa.page_size(), HUGE);
    let path = setup.mount.join("pool");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(2 * HUGE as u64).unwrap();
    let pb = Map::new(
        2 * HUGE,
        libc::MAP_SHARED,
        std::os::fd::AsRawFd::as_raw_fd(&f),
        0,
    );
    drop(f);
    // Whole pages, then 64 KiB that start 12 KiB into the second page and
    // cross into nothing (the server maps the whole page around them).
    traffic(
        "2 MiB hugetlb (MFD_HUGETLB / hugetlbfs file), whole pages",
        &ctx,
        pa.as_ptr(),
        pb.ptr,
        2 * HUGE,
    );
    traffic(
        "2 MiB hugetlb, 64 KiB inside a page",
        &ctx,
        pa.as_ptr().wrapping_add(HUGE + (12 << 10)),
        pb.ptr.wrapping_add(HUGE + (12 << 10)),
        64 << 10,
    );
    // Straddling the two pages.
    traffic(
        "2 MiB hugetlb, 1 MiB across a page boundary",
        &ctx,
        pa.as_ptr().wrapping_add(HUGE - (512 << 10)),
        pb.ptr.wrapping_add(HUGE - (512 << 10)),
        1 << 20,
    );
    drop(ctx);
    drop(pb);
    let _ = std::fs::remove_file(&path);
}
