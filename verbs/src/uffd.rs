//! A user-space stand-in for the MMU notifier of on-demand paging:
//! `userfaultfd` events on an ODP region's memory invalidate it.
//!
//! The kernel tells an ODP driver through an MMU notifier that memory is
//! about to be unmapped or changed; user space has no such hook. What it
//! has is `userfaultfd(2)`'s non-cooperative events: a range registered
//! (here in `UFFDIO_REGISTER_MODE_WP`, with no page ever write-protected,
//! so the process never takes a fault on it) reports `munmap`
//! (`UFFD_EVENT_UNMAP`), `madvise(MADV_DONTNEED/REMOVE)`
//! (`UFFD_EVENT_REMOVE`) and `mremap` (`UFFD_EVENT_REMAP`) of it, with the
//! range. [`UnmapWatch`] reads them on a thread and invalidates the
//! region there ([`OdpMr::invalidate_range`]), so the device faults again
//! and maps whatever memory is there then.
//!
//! Weaker than the kernel's notifier: the thread that unmaps waits only
//! until the event is *read*, not until the invalidation is done, and the
//! pages are already gone from the process when it is read. Under kernel
//! VFIO the IOMMU mapping keeps its pinned pages until the invalidation
//! unmaps them (the device may write to the old pages meanwhile, never to
//! another process's memory); the in-process model reaches process memory
//! by address, so there an application must still invalidate before it
//! unmaps. Needs Linux 5.7+ (write-protect registration of anonymous
//! memory) and userfaultfd allowed to the process
//! (`vm.unprivileged_userfaultfd`, or `UFFD_USER_MODE_ONLY`, which this
//! asks for).
#![allow(unsafe_code)] // The userfaultfd syscall, its ioctls and reads.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use crate::odp::{OdpMr, OdpMrInner};
use crate::{Error, Result};

/// `UFFD_API`.
const UFFD_API: u64 = 0xaa;
/// `UFFD_USER_MODE_ONLY` (userfaultfd flags).
const UFFD_USER_MODE_ONLY: i32 = 1;
/// `UFFDIO_API`: `_IOWR(0xAA, 0x3F, struct uffdio_api)` (24 bytes).
const UFFDIO_API: u64 = 0xc018_aa3f;
/// `UFFDIO_REGISTER`: `_IOWR(0xAA, 0x00, struct uffdio_register)` (32 bytes).
const UFFDIO_REGISTER: u64 = 0xc020_aa00;
/// `UFFDIO_REGISTER_MODE_WP`.
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
/// `UFFD_FEATURE_EVENT_REMAP`, `_REMOVE`, `_UNMAP`.
const FEATURES: u64 = (1 << 1) | (1 << 3) | (1 << 6);
/// `UFFD_EVENT_REMAP`, `_REMOVE`, `_UNMAP` (`uffd_msg.event`).
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
/// `sizeof(struct uffd_msg)`.
const MSG: usize = 32;
/// How long a read waits before the thread looks whether to stop (ms).
const POLL_MS: i32 = 20;

/// `userfaultfd` events on an ODP region's memory, invalidating it; the
/// thread ends when this is dropped.
#[derive(Debug)]
pub struct UnmapWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for UnmapWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn os(op: &'static str) -> Error {
    Error::os(op, std::io::Error::last_os_error())
}

/// A userfaultfd with the unmap, remove and remap events.
fn open() -> Result<OwnedFd> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY;
    // SAFETY: the syscall takes flags only and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(os("userfaultfd"));
    }
    // SAFETY: a new fd, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut api = [UFFD_API, FEATURES, 0u64];
    // SAFETY: UFFDIO_API reads and writes the 24 bytes of `api`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, api.as_mut_ptr()) } != 0 {
        return Err(os("UFFDIO_API"));
    }
    if api[1] & FEATURES != FEATURES {
        return Err(Error::NotSupported("userfaultfd unmap/remove/remap events"));
    }
    Ok(fd)
}

/// Registers `[addr, addr + len)` (page aligned) in write-protect mode.
fn register(fd: &OwnedFd, addr: u64, len: u64) -> Result<()> {
    let mut reg = [addr, len, UFFDIO_REGISTER_MODE_WP, 0u64];
    // SAFETY: UFFDIO_REGISTER reads and writes the 32 bytes of `reg`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_REGISTER as _, reg.as_mut_ptr()) } != 0 {
        return Err(os("UFFDIO_REGISTER"));
    }
    Ok(())
}

impl OdpMr {
    /// Watches `[addr, addr + len)` of this region with a `userfaultfd`:
    /// `munmap`, `madvise(DONTNEED/REMOVE)` and `mremap` of it invalidate
    /// the region there (module docs: what that does and does not
    /// guarantee). The range is widened to whole 4 KiB pages.
    pub fn watch_unmaps(&self, addr: u64, len: u64) -> Result<UnmapWatch> {
        let start = addr & !(crate::odp::ODP_PAGE - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(crate::odp::ODP_PAGE))
            .ok_or(Error::Invalid("range wraps"))?;
        let fd = open()?;
        register(&fd, start, end - start)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mr = Arc::downgrade(&self.inner);
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mlx5-odp-uffd".into())
            .spawn(move || watch(&fd, &mr, &st))
            .map_err(|e| Error::os("spawn userfaultfd thread", e))?;
        Ok(UnmapWatch {
            stop,
            thread: Some(thread),
        })
    }
}

/// The watch thread: events until stopped (or the region is gone).
fn watch(fd: &OwnedFd, mr: &Weak<OdpMrInner>, stop: &AtomicBool) {
    let mut buf = [0u8; MSG * 16];
    while !stop.load(Ordering::Acquire) {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd.
        if unsafe { libc::poll(&mut p, 1, POLL_MS) } <= 0 {
            continue;
        }
        // SAFETY: reads into `buf`, at most its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            continue;
        }
        let Some(mr) = mr.upgrade() else {
            return;
        };
        for m in buf[..n as usize].chunks_exact(MSG) {
            let w = |i: usize| {
                u64::from_ne_bytes(m[8 + 8 * i..16 + 8 * i].try_into().unwrap_or([0; 8]))
            };
            let range = match m[0] {
                // remove / unmap: start, end.
                EVENT_REMOVE | EVENT_UNMAP => Some((w(0), w(1).saturating_sub(w(0)))),
                // remap: from, to, len.
                EVENT_REMAP => Some((w(0), w(2))),
                _ => None,
            };
            if let Some((a, l)) = range {
                tracing::debug!(
                    event = m[0],
                    addr = format_args!("{a:#x}"),
                    len = l,
                    "userfaultfd: invalidating"
                );
                if let Err(e) = mr.invalidate_counted(a, l) {
                    tracing::warn!("ODP invalidation on a userfaultfd event: {e}");
                }
            }
        }
    }
}
