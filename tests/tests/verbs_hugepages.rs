//! End to end: MRs over huge pages (issue 14). The user's own hugetlb
//! memory ([`Pd::reg_mr_raw`], page size found by the driver in
//! `/proc/self/smaps`) and the driver's ([`Pd::reg_mr_buffer`] over a
//! hugetlb [`DmaBuffer`]) are mapped as whole huge pages in one IOMMU
//! mapping and described by one or two MTT entries of a page at least as
//! large; RDMA WRITEs across huge-page and MTT-page boundaries land byte
//! for byte, and nothing lands outside the MR though its whole pages are
//! mapped.
//!
//! The tests reserve the huge pages they need (as root, see
//! `tests::hugepages`) and print `NOT RUN` where the kernel has none to
//! give; with `MLX5_HUGEPAGES_REQUIRED=1` (scripts/test-all.sh as root) a
//! missing 2 MiB page is a failure. 1 GiB pages need 1 GiB of contiguous
//! memory, which a fragmented machine may not have: those stay `NOT RUN`.
#![allow(unsafe_code)] // reg_mr_raw over memory the test owns.

mod verbs_common;

use std::sync::Arc;

use tests::hugepages::{not_run, Reservation, SIZE_1G, SIZE_2M};
use verbs::cq::WcStatus;
use verbs::mr::Mr;
use verbs::qp::{send_flags as sf, Payload, Qp, QpType, SendOp, SendWr};
use verbs_common::*;
use vfio::dma::HugePage;
use vfio::DmaBuffer;

const M4: u64 = 4 << 20;

/// A huge-page buffer of `len` bytes, or why there is none.
fn huge(len: usize, page: HugePage, size: u64) -> Result<Arc<DmaBuffer>, String> {
    let b = DmaBuffer::with_huge_page(len, page).map_err(|e| e.to_string())?;
    if b.page_size() as u64 == size {
        Ok(b)
    } else {
        Err(format!(
            "no free {} KiB huge pages (got {} KiB pages)",
            size >> 10,
            b.page_size() >> 10
        ))
    }
}

/// WRITEs `len` bytes from side a's buffer to `off` into `mr` (whose
/// memory is `dst` at `dst_off`), checks they land and the 64 bytes after
/// them stay as they were.
fn write_lands(p: &mut Pair, qa: &mut Qp, mr: &Mr, off: u64, len: usize, dst: (&DmaBuffer, u64)) {
    let (buf, base) = dst;
    let at = (base + off) as usize;
    let after_len = 64.min(buf.len() - at - len);
    let after = read(buf, at + len, after_len);
    let data = fill(&p.a.buf, 0, len, off as u8 ^ len as u8);
    qa.post_send(&[SendWr {
        wr_id: off,
        op: SendOp::RdmaWrite {
            raddr: mr.addr() + off,
            rkey: mr.rkey(),
        },
        payload: Payload::Sges(&[p.a.mr.sge(0, len as u32).unwrap()]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let wc = poll_n(&mut p.a.cq, 1);
    assert_eq!(
        wc[0].status,
        WcStatus::Success,
        "{off:#x}+{len:#x}: {:?}",
        wc[0]
    );
    assert_eq!(read(buf, at, len), data, "{off:#x}+{len:#x}");
    assert_eq!(
        read(buf, at + len, after_len),
        after,
        "after {off:#x}+{len:#x}"
    );
}

#[test]
fn raw_mr_over_2m_pages_takes_writes_across_page_and_mtt_boundaries() {
    let name = "raw_mr_over_2m_pages_takes_writes_across_page_and_mtt_boundaries";
    let (_r, _) = Reservation::free_pages(SIZE_2M, 8);
    let buf = match huge(16 << 20, HugePage::Size2M, SIZE_2M) {
        Ok(b) => b,
        Err(why) => return not_run(name, &why, true),
    };
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    // X: a 4 MiB boundary inside the buffer with a 2 MiB page each side.
    // The MR runs from 0x100 into the page before X to 0x100 short of the
    // end of the page after it: the two pages are mapped (4 MiB), so the
    // MTT page is 4 MiB and X, a huge-page boundary, is an MTT one too.
    let h = buf.host_addr();
    let x = (h + M4).next_multiple_of(M4);
    let start = x - SIZE_2M + 0x100;
    let len = 2 * SIZE_2M - 0x200;
    // SAFETY: `buf` outlives the MR (dropped at the end of the test), is
    // mapped read/write, and the test touches it only through its
    // volatile accessors.
    let mr = unsafe {
        p.b.pd
            .reg_mr_raw(start as *mut u8, len as usize, ALL)
            .unwrap()
    };
    assert_eq!(mr.log_page_size(), 22, "4 MiB MTT pages");
    assert_eq!(mr.mtt_entries(), 2);
    assert_eq!(mr.mapped_len(), 2 * SIZE_2M, "the two huge pages, whole");
    let base = start - h;
    let to_x = x - start;
    for (off, n) in [
        (to_x - 4096, 8192), // across X
        (to_x - 50, 100),
        (to_x, 1),
        (to_x - 1, 1),
        (0, 4096),
        (len - 1, 1),
        (len - 5000, 5000),
        (0, 64 << 10),
    ] {
        write_lands(&mut p, &mut qa, &mr, off, n as usize, (&buf, base));
    }
    // One byte past the MR, though mapped (same huge page): refused, and
    // the byte stays untouched.
    let before = read(&buf, (base + len) as usize, 16);
    qa.post_send(&[SendWr {
        wr_id: 99,
        op: SendOp::RdmaWrite {
            raddr: mr.addr() + len - 1,
            rkey: mr.rkey(),
        },
        payload: Payload::Sges(&[p.a.mr.sge(0, 2).unwrap()]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let wc = poll_n(&mut p.a.cq, 1);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr, "{:?}", wc[0]);
    assert_eq!(read(&buf, (base + len) as usize, 16), before);
    mr.dereg().unwrap();
}

#[test]
fn driver_buffer_of_2m_pages_gets_huge_mtt_pages() {
    let name = "driver_buffer_of_2m_pages_gets_huge_mtt_pages";
    let (_r, _) = Reservation::free_pages(SIZE_2M, 4);
    let buf = match huge(8 << 20, HugePage::Size2M, SIZE_2M) {
        Ok(b) => b,
        Err(why) => return not_run(name, &why, true),
    };
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let mr = p.b.pd.reg_mr_buffer(&buf, 0, buf.len(), ALL).unwrap();
    assert_eq!(mr.log_page_size(), 23, "one 8 MiB MTT page size");
    assert!(mr.mtt_entries() <= 2, "{} entries", mr.mtt_entries());
    assert_eq!(mr.mapped_len(), 8 << 20);
    for k in 1..4u64 {
        write_lands(&mut p, &mut qa, &mr, k * SIZE_2M - 3000, 6000, (&buf, 0));
    }
    mr.dereg().unwrap();
}

#[test]
fn raw_mr_over_a_1g_page() {
    let name = "raw_mr_over_a_1g_page";
    let (_r, free) = Reservation::free_pages(SIZE_1G, 1);
    if free == 0 {
        return not_run(
            name,
            "no free 1 GiB huge page (memory too fragmented?)",
            false,
        );
    }
    let buf = match huge(1 << 30, HugePage::Size1G, SIZE_1G) {
        Ok(b) => b,
        Err(why) => return not_run(name, &why, false),
    };
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let h = buf.host_addr();
    // 4 KiB near the end of the page: the whole page is mapped, one entry.
    let small_at = SIZE_1G - 8192;
    // SAFETY: as in the 2 MiB test: `buf` outlives both MRs.
    let small = unsafe {
        p.b.pd
            .reg_mr_raw((h + small_at) as *mut u8, 4096, ALL)
            .unwrap()
    };
    assert_eq!(
        (
            small.log_page_size(),
            small.mtt_entries(),
            small.mapped_len()
        ),
        (30, 1, SIZE_1G)
    );
    write_lands(&mut p, &mut qa, &small, 100, 3000, (&buf, small_at));
    // All of it: one 1 GiB entry.
    // SAFETY: as above.
    let all = unsafe { p.b.pd.reg_mr_raw(h as *mut u8, 1 << 30, ALL).unwrap() };
    assert_eq!((all.log_page_size(), all.mtt_entries()), (30, 1));
    write_lands(&mut p, &mut qa, &all, SIZE_1G / 2 - 100, 200, (&buf, 0));
    write_lands(&mut p, &mut qa, &all, SIZE_1G - 4096, 4096, (&buf, 0));
    small.dereg().unwrap();
    all.dereg().unwrap();
}

#[test]
fn raw_mr_over_heap_uses_4k_pages_and_refusals_are_named() {
    let p = pair(4096);
    let heap = vec![0u8; 3 << 20].into_boxed_slice();
    let addr = heap.as_ptr() as u64 + 100;
    // SAFETY: `heap` outlives the MR and is not touched while registered.
    let mr = unsafe { p.b.pd.reg_mr_raw(addr as *mut u8, 2 << 20, ALL).unwrap() };
    assert_eq!(mr.mapped_len() % 4096, 0);
    assert!(mr.mapped_len() <= (2 << 20) + 4096);
    assert!(mr.mtt_entries() <= 2);
    mr.dereg().unwrap();
    drop(heap);
    // Not mapped: EFAULT, as ibv_reg_mr.
    // SAFETY: refused before anything is mapped.
    let e = unsafe { p.b.pd.reg_mr_raw(0x1000 as *mut u8, 4096, ALL) }.unwrap_err();
    assert_eq!(e.errno(), libc::EFAULT, "{e}");
    // Read-only memory: EFAULT (the device would write it).
    // SAFETY: a fresh private anonymous mapping, unmapped below.
    let ro = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(ro, libc::MAP_FAILED);
    // SAFETY: refused before anything is mapped.
    let e = unsafe { p.b.pd.reg_mr_raw(ro.cast(), 8192, ALL) }.unwrap_err();
    assert_eq!(e.errno(), libc::EFAULT, "{e}");
    // SAFETY: the mapping made above, no longer used.
    assert_eq!(unsafe { libc::munmap(ro, 8192) }, 0);
    // A page size that is no page size.
    let mut v = vec![0u8; 8192];
    // SAFETY: refused before anything is mapped.
    let e = unsafe { p.b.pd.reg_mr_raw_paged(v.as_mut_ptr(), 4096, ALL, 3000) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
}
