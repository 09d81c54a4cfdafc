//! Private memory made shareable in place, for `ibv_reg_mr` over
//! vfio-user: the server is another process and reaches memory only
//! through a file, so the heap or a private anonymous mapping cannot be
//! registered as it is (`vfio::Error::NotShareable`). The pages around
//! the range are copied into a memfd and the memfd is mapped over them at
//! the same address (`MAP_FIXED`): the program's pointers and bytes stay
//! as they were, and the server can map the memfd.
//!
//! Caveat: the pages are copied then replaced; a write another thread
//! makes to those pages in between is lost (registration is assumed to
//! own its buffer while it registers, as with fork protection). The memfd
//! stays open for the life of the process so the backend can reopen it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

fn os_err() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Replaces the pages under `addr .. addr + len` with a shared memfd
/// mapping holding the same bytes; an errno if it cannot.
pub(crate) fn make_shared(addr: usize, len: usize) -> Result<(), i32> {
    static FDS: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());
    // SAFETY: sysconf has no memory arguments.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let start = addr & !(page - 1);
    let end = addr
        .checked_add(len)
        .ok_or(libc::EINVAL)?
        .next_multiple_of(page);
    let size = end - start;
    // SAFETY: a NUL-terminated name; no other memory arguments.
    let fd = unsafe { libc::memfd_create(c"ibverbs-reg-mr".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_err());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
        return Err(os_err());
    }
    // SAFETY: a new shared mapping of our memfd, at an address the kernel picks.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return Err(os_err());
    }
    // SAFETY: `start .. end` is mapped readable (the driver's vma check
    // passed before the backend refused it) and `tmp` holds `size` bytes.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, tmp.cast::<u8>(), size) };
    // SAFETY: replaces exactly the pages the registration covers with the
    // same bytes, shared; the program's pointers into them stay valid.
    let at = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    let r = if at == libc::MAP_FAILED {
        Err(os_err())
    } else {
        Ok(())
    };
    // SAFETY: the temporary mapping made above, not used after this.
    unsafe { libc::munmap(tmp, size) };
    r?;
    FDS.lock().unwrap_or_else(|p| p.into_inner()).push(fd);
    Ok(())
}
