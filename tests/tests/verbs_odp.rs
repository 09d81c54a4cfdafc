//! End to end, on-demand paging (issue 21): explicit and implicit ODP
//! regions between two cabled ConnectX-5 models, on a manual clock (the
//! requester's RNR retries after a responder's page fault wait until the
//! test moves it). Memory is anonymous process memory the device has never
//! had mapped: the first access faults, the driver's fault thread maps the
//! pages and resumes.

mod verbs_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5_emu::transport::RETRY_DEADLINE;
use mlx5_emu::{DeviceConfig, Fabric, Profile};
use tests::wait::{until, HANG_GUARD};
use verbs::cq::{Cq, Wc, WcOpcode, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Sge};
use verbs::odp::{advice, OdpMr, IMR_MTT_SIZE};
use verbs::qp::{send_flags as sf, Payload, Qp, QpType, RecvWr, SendOp, SendWr};
use verbs_common::*;
use vfio::clock::ManualClock;

const SIG: u32 = sf::SIGNALED;
const ODP_ALL: u32 = ALL | access::ON_DEMAND;

/// Anonymous private memory of the process, unmapped on drop.
struct Anon {
    ptr: *mut u8,
    len: usize,
}

/// `mmap` (read/write) at `at` (null: anywhere); panics on failure.
fn sys_mmap(at: *mut u8, len: usize, flags: i32, fd: i32) -> *mut u8 {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a new mapping; with MAP_FIXED the caller replaces its own.
    let p = unsafe { libc::mmap(at.cast(), len, prot, flags, fd, 0) };
    assert_ne!(p, libc::MAP_FAILED, "mmap {len}");
    p.cast()
}

/// `munmap` of pages of a test's own mapping.
fn sys_munmap(at: *mut u8, len: usize) {
    // SAFETY: the callers name pages of their own mappings.
    assert_eq!(unsafe { libc::munmap(at.cast(), len) }, 0);
}

impl Anon {
    fn new(len: usize) -> Self {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        Self {
            ptr: sys_mmap(std::ptr::null_mut(), len, flags, -1),
            len,
        }
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Makes everything past the first `keep` bytes inaccessible
    /// (`PROT_NONE`): memory the process does not map for access, the
    /// range still reserved (never another thread's mapping).
    fn cut_tail(&self, keep: usize) {
        let tail = self.ptr.wrapping_add(keep);
        // SAFETY: pages of our own mapping.
        let r = unsafe { libc::mprotect(tail.cast(), self.len - keep, libc::PROT_NONE) };
        assert_eq!(r, 0);
    }

    fn read(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        (0..n)
            .map(|i| {
                let p = self.ptr.wrapping_add(off + i);
                // SAFETY: inside the mapping; volatile, the device writes it.
                unsafe { p.read_volatile() }
            })
            .collect()
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        for (i, b) in data.iter().enumerate() {
            let p = self.ptr.wrapping_add(off + i);
            // SAFETY: inside the mapping.
            unsafe { p.write_volatile(*b) };
        }
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        // Parts may be gone already: munmap of unmapped pages is no error.
        sys_munmap(self.ptr, self.len);
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Two cabled ConnectX-5 functions on `clock`, a normal region each.
fn cx5_pair(clock: &Arc<ManualClock>) -> Pair {
    let fabric = Fabric::cabled_as(
        2,
        &DeviceConfig {
            fw_start: Duration::ZERO,
            clock: clock.shared(),
            ..DeviceConfig::for_profile(Profile::ConnectX5)
        },
    );
    let on = |i| {
        let o = HcaOptions {
            clock: clock.shared(),
            ..HcaOptions::default()
        };
        Context::open(function(&fabric, i), o).unwrap_or_else(|e| panic!("open: {e}"))
    };
    let a = side(on(0), 1 << 16, ALL);
    let b = side(on(1), 1 << 16, ALL);
    Pair { fabric, a, b }
}

fn odp(s: &Side, mem: &Anon, acc: u32) -> OdpMr {
    // SAFETY: `mem` outlives the region in every test; accessed volatile.
    unsafe { s.pd.reg_mr_odp(mem.ptr, mem.len, acc) }.unwrap()
}

/// Polls `cq` for `n` completions, moving the clock to each retry timer
/// the requester arms meanwhile (RNR NAKs while a fault is handled).
fn complete(clock: &ManualClock, cq: &mut Cq, n: usize) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut wc = [Wc::default(); 8];
    let give_up = Instant::now() + HANG_GUARD;
    while out.len() < n {
        let k = cq.poll(&mut wc[..(n - out.len()).min(8)]).unwrap();
        out.extend_from_slice(&wc[..k]);
        if k == 0 {
            assert!(Instant::now() < give_up, "only {out:?}");
            if let Some(at) = clock.wait_armed(RETRY_DEADLINE, Duration::from_millis(5)) {
                clock.advance_to(at);
            }
        }
    }
    out
}

fn post(qp: &mut Qp, wr_id: u64, op: SendOp, sge: Sge) {
    qp.post_send(&[SendWr {
        wr_id,
        op,
        payload: Payload::Sges(&[sge]),
        flags: SIG,
        ud: None,
    }])
    .unwrap();
}

#[test]
fn write_and_read_through_never_mapped_odp_memory_on_both_sides() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let (ma, mb) = (Anon::new(1 << 20), Anon::new(1 << 20));
    let (ra, rb) = (odp(&p.a, &ma, ODP_ALL), odp(&p.b, &mb, ODP_ALL));
    assert_eq!(ra.stats().mappings, 0, "nothing mapped at registration");
    let data = pattern(8192, 3);
    ma.write(0x1800, &data);
    // WRITE from a's ODP memory (requester fault) into b's (responder
    // RDMA fault, RNR NAKs until resumed), across a page boundary.
    let op = SendOp::RdmaWrite {
        raddr: mb.addr() + 0x3_0800,
        rkey: rb.rkey(),
    };
    post(&mut qa, 1, op, ra.sge(ma.addr() + 0x1800, 8192).unwrap());
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (1, WcStatus::Success),
        "{wc:?}"
    );
    assert_eq!(mb.read(0x3_0800, 8192), data);
    let (sa, sb) = (ra.stats(), rb.stats());
    assert!(sa.page_faults >= 1 && sa.pages_faulted == 3, "{sa:?}");
    assert!(sb.page_faults >= 1 && sb.pages_faulted == 3, "{sb:?}");
    // READ b's memory back into untouched memory of a (requester fault
    // for a local write, responder fault for a remote read).
    let op = SendOp::RdmaRead {
        raddr: mb.addr() + 0x3_0800,
        rkey: rb.rkey(),
    };
    post(&mut qa, 2, op, ra.sge(ma.addr() + 0x8_0000, 8192).unwrap());
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (2, WcStatus::Success),
        "{wc:?}"
    );
    assert_eq!(ma.read(0x8_0000, 8192), data);
    // Mapped now: the same WRITE again faults nowhere.
    let before = (ra.stats().page_faults, rb.stats().page_faults);
    let op = SendOp::RdmaWrite {
        raddr: mb.addr() + 0x3_0800,
        rkey: rb.rkey(),
    };
    post(&mut qa, 3, op, ra.sge(ma.addr() + 0x1800, 8192).unwrap());
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(before, (ra.stats().page_faults, rb.stats().page_faults));
    // 256 KiB (64 pages: more MTT entries than one inline UMR holds, so
    // the fault's translation goes by a UMR pointing at it) from untouched
    // memory of a into untouched memory of b.
    let big = pattern(256 << 10, 5);
    ma.write(0x4_0000, &big);
    let op = SendOp::RdmaWrite {
        raddr: mb.addr() + 0xa_0000,
        rkey: rb.rkey(),
    };
    post(
        &mut qa,
        4,
        op,
        ra.sge(ma.addr() + 0x4_0000, 256 << 10).unwrap(),
    );
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (4, WcStatus::Success),
        "{wc:?}"
    );
    assert_eq!(mb.read(0xa_0000, 256 << 10), big);
    assert!(rb.stats().pages_faulted >= 3 + 64, "{:?}", rb.stats());
}

#[test]
fn send_and_atomics_into_never_mapped_odp_memory() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Rc, cap(16));
    let (ma, mb) = (Anon::new(1 << 20), Anon::new(1 << 20));
    let (ra, rb) = (odp(&p.a, &ma, ODP_ALL), odp(&p.b, &mb, ODP_ALL));
    // A receive into b's ODP memory: the responder's WQE fault (RESP).
    qb.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[rb.sge(mb.addr() + 0x2_0000, 4096).unwrap()],
    }])
    .unwrap();
    let data = pattern(3000, 7);
    ma.write(0x5000, &data);
    post(
        &mut qa,
        1,
        SendOp::Send,
        ra.sge(ma.addr() + 0x5000, 3000).unwrap(),
    );
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
    let wc = poll_n(&mut p.b.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (9, WcStatus::Success, 3000)
    );
    assert_eq!(mb.read(0x2_0000, 3000), data);
    // Fetch-and-add on b's untouched ODP memory, the original value into
    // a's untouched ODP memory (host byte order: the driver sets
    // host-endian atomics where the card offers them, as Linux does).
    mb.write(0x9_0000, &40u64.to_le_bytes());
    let op = SendOp::AtomicFetchAdd {
        raddr: mb.addr() + 0x9_0000,
        rkey: rb.rkey(),
        add: 2,
    };
    post(&mut qa, 2, op, ra.sge(ma.addr() + 0xa_0000, 8).unwrap());
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::FetchAdd),
        "{wc:?}"
    );
    assert_eq!(ma.read(0xa_0000, 8), 40u64.to_le_bytes());
    assert_eq!(mb.read(0x9_0000, 8), 42u64.to_le_bytes());
    assert!(rb.stats().page_faults >= 2, "{:?}", rb.stats());
}

/// A QP of `t` on `s` whose receives come from `srq`.
fn srq_qp(s: &Side, t: QpType, srq: &verbs::srq::Srq) -> Qp {
    s.pd.create_qp(&verbs::qp::QpInitAttr {
        send_cq: &s.cq,
        recv_cq: &s.cq,
        srq: Some(srq),
        cap: cap(8),
        qp_type: t,
        sq_sig_all: false,
    })
    .unwrap()
}

#[test]
fn sends_into_never_mapped_odp_memory_through_an_srq() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let mb = Anon::new(1 << 20);
    let rb = odp(&p.b, &mb, ODP_ALL);
    let srq = p.b.pd.create_srq(8, 1).unwrap();
    // Two RC QPs of b share the SRQ; its WQEs point into untouched ODP
    // memory: the responder's fault is the SRQ's (type RMP), the WQE stays
    // at the head until the resume, and each message then takes the next.
    let (mut a1, mut a2) = (
        create_qp(&p.a, QpType::Rc, cap(8)),
        create_qp(&p.a, QpType::Rc, cap(8)),
    );
    let (mut b1, mut b2) = (
        srq_qp(&p.b, QpType::Rc, &srq),
        srq_qp(&p.b, QpType::Rc, &srq),
    );
    for (a, b) in [(&mut a1, &mut b1), (&mut a2, &mut b2)] {
        connect(a, &p.a.ctx, &p.b.ctx, b.qp_num());
        connect(b, &p.b.ctx, &p.a.ctx, a.qp_num());
    }
    let wrs: Vec<_> = (0..2u64)
        .map(|i| {
            rb.sge(mb.addr() + 0x4_0000 * (i + 1) + 0x800, 6000)
                .unwrap()
        })
        .collect();
    for (i, sge) in wrs.iter().enumerate() {
        srq.post_recv(&[RecvWr {
            wr_id: 70 + i as u64,
            sg_list: std::slice::from_ref(sge),
        }])
        .unwrap();
    }
    let (d1, d2) = (pattern(5000, 11), pattern(6000, 12));
    p.a.buf.write(0, &d1).unwrap();
    p.a.buf.write(0x8000, &d2).unwrap();
    post(&mut a1, 1, SendOp::Send, p.a.mr.sge(0, 5000).unwrap());
    assert_eq!(
        complete(&clock, &mut p.a.cq, 1)[0].status,
        WcStatus::Success
    );
    post(&mut a2, 2, SendOp::Send, p.a.mr.sge(0x8000, 6000).unwrap());
    assert_eq!(
        complete(&clock, &mut p.a.cq, 1)[0].status,
        WcStatus::Success
    );
    let wc = poll_n(&mut p.b.cq, 2);
    let got: Vec<_> = wc
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len, w.qp_num))
        .collect();
    assert_eq!(
        got,
        [
            (70, WcStatus::Success, 5000, b1.qp_num()),
            (71, WcStatus::Success, 6000, b2.qp_num()),
        ],
        "the faulting WQE served the first message, the next the second"
    );
    assert_eq!(mb.read(0x4_0800, 5000), d1);
    assert_eq!(mb.read(0x8_0800, 6000), d2);
    let st = rb.stats();
    assert!(st.page_faults >= 2 && st.pages_faulted >= 4, "{st:?}");
    assert_eq!(st.fault_errors, 0, "{st:?}");

    // UD: a datagram meeting an absent page is dropped (no RNR for
    // datagrams) while the fault is resolved; the WQE stays posted and
    // takes a later datagram.
    let mut ua = create_qp(&p.a, QpType::Ud, cap(8));
    let mut ub = srq_qp(&p.b, QpType::Ud, &srq);
    connect(&mut ua, &p.a.ctx, &p.b.ctx, ub.qp_num());
    connect(&mut ub, &p.b.ctx, &p.a.ctx, ua.qp_num());
    srq.post_recv(&[RecvWr {
        wr_id: 80,
        sg_list: &[rb.sge(mb.addr() + 0xc_0000, 2048).unwrap()],
    }])
    .unwrap();
    let ah = ah(&p.a, &p.b);
    let dropped = stats(&p.fabric, 1).dropped;
    let handled = rb.stats().faults_handled;
    let mut sent = 0u32;
    let landed = loop {
        sent += 1;
        p.a.buf.write(0xc000, &pattern(1000, sent as u8)).unwrap();
        ua.post_send(&[SendWr {
            wr_id: 100 + u64::from(sent),
            op: SendOp::SendImm(sent),
            payload: Payload::Sges(&[p.a.mr.sge(0xc000, 1000).unwrap()]),
            flags: SIG,
            ud: Some(verbs::qp::UdDest {
                ah: &ah,
                remote_qpn: ub.qp_num(),
                remote_qkey: QKEY,
            }),
        }])
        .unwrap();
        assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
        settle(&p.fabric);
        let mut w = [Wc::default(); 2];
        if p.b.cq.poll(&mut w).unwrap() == 1 {
            break w[0];
        }
        assert!(sent < 4, "no datagram landed in {sent}");
        // The next datagram once the driver resumed the fault.
        until("the fault resumed", || rb.stats().faults_handled > handled);
    };
    assert!(sent >= 2, "the first datagram met the absent page");
    assert_eq!(
        (landed.wr_id, landed.status, landed.imm(), landed.byte_len),
        (80, WcStatus::Success, Some(sent), 40 + 1000),
        "the WQE that faulted took the datagram that landed"
    );
    assert_eq!(mb.read(0xc_0000 + 40, 1000), pattern(1000, sent as u8));
    assert!(stats(&p.fabric, 1).dropped >= dropped + u64::from(sent - 1));
    assert_eq!(rb.stats().fault_errors, 0);
}

#[test]
fn sparse_implicit_region_maps_only_the_touched_pages() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    // 64 GiB of address space, none of it backed.
    let mem = Anon::new(64 << 30);
    // SAFETY: every address the test names is in `mem`, alive throughout.
    let imr = unsafe { p.b.pd.reg_mr_implicit(ODP_ALL) }.unwrap();
    assert_eq!((imr.addr(), imr.len()), (0, 1 << 47));
    let f = function(&p.fabric, 1);
    let maps0 = f.dma_mappings();
    let src = p.a.mr.sge(0, 64).unwrap();
    let offsets: Vec<u64> = (0..8)
        .map(|i| i * 8 * IMR_MTT_SIZE + 0x1234_5000 + i * 64)
        .collect();
    for (i, off) in offsets.iter().enumerate() {
        fill(&p.a.buf, 0, 64, i as u8);
        let op = SendOp::RdmaWrite {
            raddr: mem.addr() + off,
            rkey: imr.rkey(),
        };
        post(&mut qa, i as u64, op, src);
        let wc = complete(&clock, &mut p.a.cq, 1);
        assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
        assert_eq!(mem.read(*off as usize, 64), pattern_of(&p, 64));
    }
    let s = imr.stats();
    assert_eq!(s.pages_faulted, offsets.len() as u64, "{s:?}");
    assert_eq!(s.mappings, offsets.len() as u64, "{s:?}");
    assert_eq!(f.dma_mappings() - maps0, offsets.len(), "IOMMU mappings");
    drop(imr);
    assert_eq!(f.dma_mappings(), maps0, "all unmapped with the region");
}

fn pattern_of(p: &Pair, n: usize) -> Vec<u8> {
    read(&p.a.buf, 0, n)
}

#[test]
fn invalidation_during_traffic_faults_again_and_spares_freed_memory() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let len = 1 << 16;
    // b's region over a memfd; a second mapping of the same file watches
    // the pages the region had once they are "freed" from it.
    // SAFETY: a plain syscall; the fd is ours.
    let fd = unsafe { libc::memfd_create(c"odp".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: our fd.
    assert_eq!(unsafe { libc::ftruncate(fd, len as i64) }, 0);
    let shared = || Anon {
        ptr: sys_mmap(std::ptr::null_mut(), len, libc::MAP_SHARED, fd),
        len,
    };
    let (watch, mb) = (shared(), shared());
    let rb = odp(&p.b, &mb, ODP_ALL);
    let write = |qa: &mut Qp, p: &mut Pair, seed: u8| {
        fill(&p.a.buf, 0, 4096, seed);
        let op = SendOp::RdmaWrite {
            raddr: mb.addr(),
            rkey: rb.rkey(),
        };
        post(qa, u64::from(seed), op, p.a.mr.sge(0, 4096).unwrap());
        let wc = complete(&clock, &mut p.a.cq, 1);
        assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
    };
    write(&mut qa, &mut p, 1);
    let first = read(&p.a.buf, 0, 4096);
    assert_eq!(watch.read(0, 4096), first);
    let faults = rb.stats().page_faults;
    // The application is about to give the pages up: invalidate, then
    // replace them with fresh anonymous memory at the same address.
    assert_eq!(rb.invalidate_range(mb.addr(), len as u64).unwrap(), 1);
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    assert_eq!(sys_mmap(mb.ptr, len, flags, -1), mb.ptr);
    write(&mut qa, &mut p, 2);
    let second = read(&p.a.buf, 0, 4096);
    assert_eq!(mb.read(0, 4096), second, "landed in the new memory");
    assert_eq!(
        watch.read(0, 4096),
        first,
        "nothing landed in the freed pages"
    );
    let s = rb.stats();
    assert!(s.page_faults > faults, "faulted again: {s:?}");
    assert_eq!((s.invalidations, s.pages_invalidated), (1, 1));
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
}

#[test]
fn prefetch_makes_the_first_access_fault_free() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let mb = Anon::new(1 << 20);
    let rb = odp(&p.b, &mb, ODP_ALL);
    rb.advise(
        advice::PREFETCH_WRITE,
        advice::FLAG_FLUSH,
        &[(mb.addr(), 1 << 16)],
    )
    .unwrap();
    let s = rb.stats();
    assert_eq!(
        (s.prefetches, s.pages_prefetched, s.page_faults),
        (1, 16, 0)
    );
    let data = fill(&p.a.buf, 0, 1 << 16, 4);
    let op = SendOp::RdmaWrite {
        raddr: mb.addr(),
        rkey: rb.rkey(),
    };
    post(&mut qa, 1, op, p.a.mr.sge(0, 1 << 16).unwrap());
    // No clock moved: no RNR retry was needed.
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(mb.read(0, 1 << 16), data);
    assert_eq!(rb.stats().page_faults, 0);
    // PREFETCH_NO_FAULT maps only resident pages: two touched of eight.
    mb.write(0x10_0000 - 0x8000, &[1]);
    mb.write(0x10_0000 - 0x1000, &[1]);
    rb.advise(
        advice::PREFETCH_NO_FAULT,
        0,
        &[(mb.addr() + 0x10_0000 - 0x8000, 0x8000)],
    )
    .unwrap();
    assert_eq!(rb.stats().pages_prefetched, 16 + 2);
    assert!(rb.advise(7, 0, &[(mb.addr(), 1)]).is_err(), "bad advice");
}

#[test]
fn a_fault_on_memory_the_process_does_not_map_ends_in_the_error_cqe() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let mb = Anon::new(1 << 20);
    let rb = odp(&p.b, &mb, ODP_ALL);
    // The last 64 KiB of the region are no longer memory the process
    // may access.
    mb.cut_tail(0xf_0000);
    let op = SendOp::RdmaWrite {
        raddr: mb.addr() + 0xf_8000,
        rkey: rb.rkey(),
    };
    post(&mut qa, 1, op, p.a.mr.sge(0, 64).unwrap());
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr, "{wc:?}");
    until("the fault counted as failed", || {
        p.b.ctx.odp_stats().fault_errors >= 1
    });
    // Requester side: a SEND from unmapped ODP memory of a.
    let ma = Anon::new(1 << 20);
    let ra = odp(&p.a, &ma, ODP_ALL);
    ma.cut_tail(0xf_0000);
    let (mut qa2, _qb2) = qp_pair(&p, QpType::Rc, cap(16));
    post(
        &mut qa2,
        2,
        SendOp::Send,
        ra.sge(ma.addr() + 0xf_0000, 64).unwrap(),
    );
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (2, WcStatus::LocProtErr),
        "{wc:?}"
    );
}

#[test]
fn userfaultfd_events_invalidate_the_region() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let mb = Anon::new(1 << 16);
    let rb = odp(&p.b, &mb, ODP_ALL);
    let _watch = match rb.watch_unmaps(mb.addr(), 1 << 16) {
        Ok(w) => w,
        Err(e) => panic!("userfaultfd here (root, Linux 5.7+) should work: {e}"),
    };
    let write = |qa: &mut Qp, p: &mut Pair, seed: u8| {
        fill(&p.a.buf, 0, 4096, seed);
        let op = SendOp::RdmaWrite {
            raddr: mb.addr(),
            rkey: rb.rkey(),
        };
        post(qa, u64::from(seed), op, p.a.mr.sge(0, 4096).unwrap());
        let wc = complete(&clock, &mut p.a.cq, 1);
        assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
    };
    write(&mut qa, &mut p, 1);
    assert_eq!(rb.stats().mappings, 1);
    // The application drops the pages (no call to the driver): the
    // userfaultfd REMOVE event invalidates the region.
    // SAFETY: our own mapping; the device is idle.
    let r = unsafe { libc::madvise(mb.ptr.cast(), 1 << 16, libc::MADV_DONTNEED) };
    assert_eq!(r, 0);
    until("the REMOVE event invalidated the region", || {
        rb.stats().invalidations == 1
    });
    let s = rb.stats();
    assert_eq!((s.mappings, s.pages_invalidated), (0, 1), "{s:?}");
    assert_eq!(mb.read(0, 4), [0; 4], "DONTNEED gave fresh zero pages");
    let faults = s.page_faults;
    write(&mut qa, &mut p, 2);
    assert_eq!(mb.read(0, 4096), read(&p.a.buf, 0, 4096));
    assert!(rb.stats().page_faults > faults, "faulted again");
}

/// A PAGE_FAULT_RESUME of `token` (transport scheme, type 4: RDMA).
fn resume(ctx: &Context, token: u32) -> verbs::Result<Vec<u8>> {
    use mlx5_hw::ifc::{page_fault_resume_in as pin, page_fault_resume_out, trans_page_fault_info};
    let mut inb = vec![0u8; pin::SIZE_BYTES];
    let op = mlx5_hw::opcode::Opcode::PageFaultResume.to_raw();
    pin::OPCODE.set(&mut inb, u64::from(op));
    let info = &mut inb[pin::PAGE_FAULT_INFO.off / 8..];
    trans_page_fault_info::PAGE_FAULT_TYPE.set(info, 4);
    trans_page_fault_info::FAULT_TOKEN.set(info, u64::from(token));
    trans_page_fault_info::WQ_NUMBER.set(info, u64::from(token));
    ctx.hca()
        .cmd()
        .exec(&inb, page_fault_resume_out::SIZE_BYTES)
}

#[test]
fn odp_refusals_by_name() {
    use mlx5_hw::status::CmdStatus;
    // ConnectX-4 Lx: no `pg`, no ODP: registration refused, and firmware
    // refuses PAGE_FAULT_RESUME as an unknown operation.
    let mut p = pair(1 << 16);
    let mem = Anon::new(1 << 16);
    // SAFETY: `mem` outlives the attempt.
    let r = unsafe { p.a.pd.reg_mr_odp(mem.ptr, mem.len, ODP_ALL) };
    assert!(
        matches!(r, Err(verbs::Error::NotSupported(m)) if m.contains("pg")),
        "{r:?}"
    );
    let r = resume(&p.a.ctx, 1);
    assert!(
        matches!(
            r,
            Err(verbs::Error::Cmd {
                status: CmdStatus::BadOperation,
                ..
            })
        ),
        "{r:?}"
    );
    let _ = &mut p;
    // ConnectX-5: a resume of a fault nobody raised is a bad parameter;
    // a region of zero bytes, bad access and bad advice are refused.
    let clock = ManualClock::new();
    let q = cx5_pair(&clock);
    let r = resume(&q.a.ctx, 0x77);
    assert!(
        matches!(
            r,
            Err(verbs::Error::Cmd {
                status: CmdStatus::BadParameter,
                ..
            })
        ),
        "{r:?}"
    );
    // SAFETY: as above.
    assert!(unsafe { q.a.pd.reg_mr_odp(mem.ptr, 0, ODP_ALL) }.is_err());
    // SAFETY: as above.
    let r = unsafe { q.a.pd.reg_mr_odp(mem.ptr, mem.len, access::REMOTE_WRITE) };
    assert!(matches!(r, Err(verbs::Error::Invalid(_))), "{r:?}");
    let r = odp(&q.a, &mem, ODP_ALL);
    assert!(r.advise(advice::PREFETCH, 2, &[(mem.addr(), 1)]).is_err());
    assert!(r
        .advise(advice::PREFETCH, 0, &[(mem.addr() - 4096, 1)])
        .is_err());
    assert!(r.sge(mem.addr() + (1 << 16), 1).is_err());
}

/// A UD send from never-mapped ODP memory: the requester's WQE fault names
/// a WQE whose data segments follow the address vector (the datagram
/// segment), which the fault handler steps over as
/// `mlx5_ib_mr_initiator_pfault_handler` does. rdma-core's
/// `test_odp_ud_traffic` found it stepping over nothing.
#[test]
fn a_ud_send_from_never_mapped_odp_memory_faults_and_lands() {
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let mut ua = create_qp(&p.a, QpType::Ud, cap(8));
    let mut ub = create_qp(&p.b, QpType::Ud, cap(8));
    connect(&mut ua, &p.a.ctx, &p.b.ctx, ub.qp_num());
    connect(&mut ub, &p.b.ctx, &p.a.ctx, ua.qp_num());
    let ma = Anon::new(1 << 16);
    let ra = odp(&p.a, &ma, ODP_ALL);
    ub.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &[p.b.mr.sge(0, 40 + 2000).unwrap()],
    }])
    .unwrap();
    let data = pattern(2000, 11);
    ma.write(0x3f00, &data);
    let ah = ah(&p.a, &p.b);
    ua.post_send(&[SendWr {
        wr_id: 70,
        op: SendOp::Send,
        // Across a page boundary: two pages fault in.
        payload: Payload::Sges(&[ra.sge(ma.addr() + 0x3f00, 2000).unwrap()]),
        flags: SIG,
        ud: Some(verbs::qp::UdDest {
            ah: &ah,
            remote_qpn: ub.qp_num(),
            remote_qkey: QKEY,
        }),
    }])
    .unwrap();
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (70, WcStatus::Success),
        "{wc:?}"
    );
    let wc = poll_n(&mut p.b.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (7, WcStatus::Success, 40 + 2000)
    );
    let mut got = vec![0u8; 2000];
    p.b.buf.read(40, &mut got).unwrap();
    assert_eq!(got, data);
    let st = ra.stats();
    assert!(st.page_faults >= 1 && st.pages_faulted == 2, "{st:?}");
    assert_eq!(st.fault_errors, 0, "{st:?}");
}

/// `ibv_query_device_ex`'s ODP caps as `mlx5_ib` derives them: none on a
/// ConnectX-4 Lx (no `pg`); on a ConnectX-5 explicit and implicit ODP,
/// every RC and XRC operation, UD's send and SRQ receive, nothing for UC.
#[test]
fn odp_caps_as_mlx5_ib_reports_them() {
    use verbs::odp::odp_caps as c;
    let p = pair(1 << 12);
    assert_eq!(p.a.ctx.odp_caps(), verbs::odp::OdpCaps::default());
    let clock = ManualClock::new();
    let q = cx5_pair(&clock);
    let caps = q.a.ctx.odp_caps();
    let all = c::SEND | c::RECV | c::WRITE | c::READ | c::ATOMIC | c::SRQ_RECV;
    assert_eq!(caps.general_caps, c::SUPPORT | c::SUPPORT_IMPLICIT);
    assert_eq!(
        (
            caps.rc_odp_caps,
            caps.uc_odp_caps,
            caps.ud_odp_caps,
            caps.xrc_odp_caps
        ),
        (all, 0, c::SEND | c::SRQ_RECV, all)
    );
}

/// `Pd::advise_mr` (`ibv_advise_mr`) refuses as `mlx5_ib_advise_mr` does:
/// an lkey of no ODP region ENOENT, another PD's region or PREFETCH_WRITE
/// of a read-only one EPERM, an unknown advice or flag EOPNOTSUPP, a range
/// outside its region EFAULT with FLUSH (and nothing without: the kernel
/// would fail it in its worker). Its prefetches land and are counted.
#[test]
fn advise_mr_over_a_list_and_its_refusals() {
    use verbs::odp::AdviseSge;
    let clock = ManualClock::new();
    let q = cx5_pair(&clock);
    let (m1, m2) = (Anon::new(1 << 16), Anon::new(1 << 16));
    let r1 = odp(&q.a, &m1, ODP_ALL);
    // SAFETY: `m2` outlives the region.
    let ro = unsafe {
        q.a.pd
            .reg_mr_odp(m2.ptr, m2.len, access::REMOTE_READ | access::ON_DEMAND)
    }
    .unwrap();
    let sge = |mr: &OdpMr, m: &Anon, off: u64, length: u32| AdviseSge {
        addr: m.addr() + off,
        length,
        lkey: mr.lkey(),
    };
    let flush = advice::FLAG_FLUSH;
    // One call over two regions: 3 pages of one, 1 of the other.
    q.a.pd
        .advise_mr(
            advice::PREFETCH,
            flush,
            &[sge(&r1, &m1, 0x800, 3 * 4096 - 0x800), sge(&ro, &m2, 0, 16)],
        )
        .unwrap();
    assert_eq!((r1.stats().prefetches, r1.stats().pages_prefetched), (1, 3));
    assert_eq!((ro.stats().prefetches, ro.stats().pages_prefetched), (1, 1));

    let errno = |r: verbs::Result<()>| r.map_err(|e| e.errno()).err();
    let pd = &q.a.pd;
    let plain = AdviseSge {
        addr: q.a.mr.addr(),
        length: 8,
        lkey: q.a.mr.lkey(),
    };
    assert_eq!(
        errno(pd.advise_mr(advice::PREFETCH, flush, &[plain])),
        Some(2)
    );
    let stale = AdviseSge {
        lkey: r1.lkey() ^ 0xff,
        ..sge(&r1, &m1, 0, 8)
    };
    assert_eq!(
        errno(pd.advise_mr(advice::PREFETCH, flush, &[stale])),
        Some(2)
    );
    let other = q.a.ctx.alloc_pd().unwrap();
    let s = sge(&r1, &m1, 0, 8);
    assert_eq!(
        errno(other.advise_mr(advice::PREFETCH, flush, &[s])),
        Some(1)
    );
    let w = sge(&ro, &m2, 0, 8);
    assert_eq!(
        errno(pd.advise_mr(advice::PREFETCH_WRITE, flush, &[w])),
        Some(1)
    );
    assert_eq!(errno(pd.advise_mr(7, flush, &[s])), Some(95));
    assert_eq!(errno(pd.advise_mr(advice::PREFETCH, 2, &[s])), Some(95));
    assert_eq!(errno(pd.advise_mr(advice::PREFETCH, flush, &[])), Some(22));
    let past = sge(&r1, &m1, (1 << 16) - 8, 16);
    assert_eq!(
        errno(pd.advise_mr(advice::PREFETCH, flush, &[past])),
        Some(14)
    );
    assert_eq!(errno(pd.advise_mr(advice::PREFETCH, 0, &[past])), None);
    // A refused key fails the whole list before anything is mapped.
    let before = r1.stats().prefetches;
    let list = [sge(&r1, &m1, 0x8000, 8), plain];
    assert_eq!(errno(pd.advise_mr(advice::PREFETCH, 0, &list)), Some(2));
    assert_eq!(r1.stats().prefetches, before);
}

/// An indirect (KLM) key over never-mapped ODP memory: a WRITE through its
/// rkey faults on the indirect key, and the handler maps the ODP region's
/// pages the key's entries reach, reading the list back with QUERY_MKEY
/// as Linux does for a DevX indirect key (rdma-core's
/// `test_odp_mkey_list_new_api` looped on that fault before: the handler
/// took the indirect key for a pinned one and resumed, and the device
/// faulted again).
#[test]
fn a_write_through_an_indirect_key_over_odp_memory_faults_through_its_list() {
    use verbs::mkey::{mkey_init_flags, MkeyInitAttr};
    let clock = ManualClock::new();
    let mut p = cx5_pair(&clock);
    let qcap = verbs::qp::QpCap {
        max_inline_data: 512,
        ..cap(16)
    };
    let (mut qa, mut qb) = qp_pair(&p, QpType::Rc, qcap);
    let mb = Anon::new(1 << 20);
    let rb = odp(&p.b, &mb, ODP_ALL);
    let mut attr = MkeyInitAttr {
        create_flags: mkey_init_flags::INDIRECT,
        max_entries: 2,
    };
    let k = p.b.pd.create_mkey(&mut attr).unwrap();
    // Two pieces, 0x3_0000 apart: 0x100 bytes each.
    let list = [
        rb.sge(mb.addr() + 0x1_0f80, 0x100).unwrap(),
        rb.sge(mb.addr() + 0x4_0000, 0x100).unwrap(),
    ];
    let mut b = qb.wr_start();
    b.wr_id(1, sf::SIGNALED | sf::INLINE)
        .mr_list(&k, ALL, &list);
    b.complete().unwrap();
    assert_eq!(poll_n(&mut p.b.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(rb.stats().mappings, 0, "nothing mapped yet");
    let data = pattern(0x200, 9);
    p.a.buf.write(0, &data).unwrap();
    let op = SendOp::RdmaWrite {
        raddr: 0,
        rkey: k.rkey(),
    };
    post(&mut qa, 5, op, p.a.mr.sge(0, 0x200).unwrap());
    let wc = complete(&clock, &mut p.a.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (5, WcStatus::Success),
        "{wc:?}"
    );
    assert_eq!(mb.read(0x1_0f80, 0x100), data[..0x100]);
    assert_eq!(mb.read(0x4_0000, 0x100), data[0x100..]);
    let st = rb.stats();
    // The first piece crosses a page boundary: three pages in all.
    assert!(st.page_faults >= 1 && st.pages_faulted == 3, "{st:?}");
    assert_eq!(st.fault_errors, 0, "{st:?}");
}
