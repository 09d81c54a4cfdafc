//! End to end, DMA-BUF MRs (`Pd::reg_dmabuf_mr`): a udmabuf (a memfd made
//! a dma-buf through `/dev/udmabuf`) registered at an iova of the caller's
//! choosing and written by a peer's RDMA WRITE; refused: a bad fd, an fd
//! that is not a dma-buf, a range past the dma-buf, an iova whose page
//! offset differs from the offset's.
//!
//! The udmabuf test needs `/dev/udmabuf`, which the suite's hosts lack (no
//! module to load): it is `#[ignore]`d, so the count says it did not run,
//! and `cargo test --test verbs_dmabuf -- --ignored` runs it where the
//! device exists (it fails saying NOT RUN where it does not). The QEMU
//! guest's Debian 6.12 kernel has `CONFIG_UDMABUF=y`: qemu_mlx5's VFIO boot
//! runs `mlx5-perf --use_udmabuf` there (the same import, end to end).

mod verbs_common;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use mlx5_emu::Profile;
use verbs::cq::WcStatus;
use verbs::dmabuf::dmabuf_info;
use verbs::qp::{send_flags as sf, Payload, QpType, SendOp, SendWr};
use verbs::Error;
use verbs_common::*;

#[test]
fn bad_fds_and_fds_that_are_not_dma_bufs_are_refused() {
    let p = pair_profile(4096, Profile::ConnectX5, ALL);
    let ebadf = |r: verbs::Result<verbs::mr::Mr>| match r {
        Err(Error::Os { source, .. }) => source.raw_os_error() == Some(libc::EBADF),
        _ => false,
    };
    assert!(ebadf(p.a.pd.reg_dmabuf_mr(0, 4096, 0, -1, ALL)));
    // A closed descriptor number.
    let closed = {
        let f = std::fs::File::open("/dev/null").unwrap();
        f.as_raw_fd()
    };
    assert!(ebadf(p.a.pd.reg_dmabuf_mr(0, 4096, 0, closed, ALL)));
    // A regular file is not a dma-buf.
    let f = std::fs::File::open("/proc/self/exe").unwrap();
    assert!(matches!(
        p.a.pd.reg_dmabuf_mr(0, 4096, 0, f.as_raw_fd(), ALL),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(dmabuf_info(f.as_raw_fd()), Err(Error::Invalid(_))));
}

/// A udmabuf of `size` bytes over a fresh memfd (kept alive beside it),
/// or why not.
fn udmabuf(size: u64) -> Result<(OwnedFd, std::sync::Arc<vfio::DmaBuffer>), String> {
    if !std::path::Path::new("/dev/udmabuf").exists() {
        let _ = std::process::Command::new("modprobe")
            .arg("udmabuf")
            .status();
    }
    let mem = vfio::DmaBuffer::new(size as usize).map_err(|e| format!("memfd: {e}"))?;
    let fd = verbs::dmabuf::udmabuf(mem.file().as_fd(), 0, size).map_err(|e| e.to_string())?;
    Ok((fd, mem))
}

#[test]
#[ignore = "needs /dev/udmabuf (none on the suite's hosts): run with --ignored where it exists"]
fn a_udmabuf_takes_rdma_writes_at_its_iova_and_ranges_past_it_are_refused() {
    let (buf, _mem) = match udmabuf(64 << 10) {
        Ok(b) => b,
        Err(why) => panic!(
            "NOT RUN: no udmabuf on this host ({why}); the guest kernel has CONFIG_UDMABUF=y"
        ),
    };
    let info = dmabuf_info(buf.as_raw_fd()).unwrap();
    assert_eq!((info.size, info.exporter.as_str()), (64 << 10, "udmabuf"));
    let mut p = pair_profile(4096, Profile::ConnectX5, ALL);
    let fd = buf.as_raw_fd();
    assert!(matches!(
        p.b.pd.reg_dmabuf_mr(60 << 10, 8 << 10, 0x10_0000, fd, ALL),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        p.b.pd.reg_dmabuf_mr(4096, 4096, 0x10_0123, fd, ALL),
        Err(Error::Invalid(_))
    ));
    let iova = 0x7700_0000_1000;
    let mr = p.b.pd.reg_dmabuf_mr(4096, 16 << 10, iova, fd, ALL).unwrap();
    assert_eq!((mr.addr(), mr.rkey() != 0), (iova, true));
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(8));
    let data = fill(&p.a.buf, 0, 1024, 9);
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            raddr: iova + 100,
            rkey: mr.rkey(),
        },
        payload: Payload::Sges(&[p.a.mr.sge(0, 1024).unwrap()]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    // The bytes are in the udmabuf's memory: read them through its own map.
    let mut got = vec![0u8; 1024];
    // SAFETY: a fresh shared read-only mapping of the dma-buf.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            64 << 10,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    for (i, b) in got.iter_mut().enumerate() {
        let at = (m as *const u8).wrapping_add(4096 + 100 + i);
        // SAFETY: inside the live mapping; volatile, the device's memory.
        *b = unsafe { at.read_volatile() };
    }
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(m, 64 << 10) };
    assert_eq!(got, data);
}
