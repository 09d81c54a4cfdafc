//! Messages on a UNIX stream socket, and file descriptors passed beside
//! them as `SCM_RIGHTS` ancillary data.
//!
//! A message is sent with one `sendmsg` (more only if the kernel takes it
//! in pieces), its fds attached to the first byte, so a receiver reading the
//! 16-byte header gets them with it. Received fds are owned ([`OwnedFd`],
//! close-on-exec) and closed when dropped, so a peer that sends fds nobody
//! asked for leaks nothing.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use zerocopy::{FromBytes, IntoBytes};

use super::header::{Header, HEADER_SIZE};

/// Most fds one message can carry (the kernel's `SCM_MAX_FD`).
pub const MAX_FDS: usize = 253;

/// One received message.
#[derive(Debug)]
pub struct Message {
    /// The header.
    pub header: Header,
    /// Everything after the header (`header.size - 16` bytes).
    pub payload: Vec<u8>,
    /// The fds that came with it.
    pub fds: Vec<OwnedFd>,
}

/// Why a message could not be received.
#[derive(Debug)]
pub enum RecvError {
    /// The socket failed, timed out, or closed in the middle of a message.
    Io(io::Error),
    /// The header's size is smaller than a header; nothing more was read.
    Short(Header),
    /// The header's size is over the limit; the payload was not read.
    TooLong(Header),
}

impl From<io::Error> for RecvError {
    fn from(e: io::Error) -> Self {
        RecvError::Io(e)
    }
}

/// Sends `header`, then `parts`, with `fds` attached.
pub fn send(
    sock: &UnixStream,
    header: &Header,
    parts: &[&[u8]],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} fds in one message (at most {MAX_FDS})", fds.len()),
        ));
    }
    let mut buf = Vec::with_capacity(header.size as usize);
    buf.extend_from_slice(header.as_bytes());
    for p in parts {
        buf.extend_from_slice(p);
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut done = 0;
    while done < buf.len() {
        let with = if done == 0 { &raw[..] } else { &[][..] };
        match sendmsg(sock.as_raw_fd(), &buf[done..], with) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Receives one message whose size is at most `limit` bytes. `Ok(None)`:
/// the peer closed the socket between messages.
pub fn recv(sock: &UnixStream, limit: usize) -> Result<Option<Message>, RecvError> {
    let mut fds = Vec::new();
    let mut h = [0u8; HEADER_SIZE];
    if !read_exact(sock, &mut h, &mut fds)? {
        return Ok(None);
    }
    let header = match Header::read_from_bytes(&h) {
        Ok(x) => x,
        Err(_) => return Err(io::Error::other("header of the wrong size").into()),
    };
    let size = header.size as usize;
    if size < HEADER_SIZE {
        return Err(RecvError::Short(header));
    }
    if size > limit {
        return Err(RecvError::TooLong(header));
    }
    let mut payload = vec![0u8; size - HEADER_SIZE];
    if !payload.is_empty() && !read_exact(sock, &mut payload, &mut fds)? {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(Some(Message {
        header,
        payload,
        fds,
    }))
}

/// Reads and drops `len` bytes (the payload of a message refused unread),
/// so the stream stays in step with the sender.
pub fn discard(sock: &UnixStream, mut len: usize) -> io::Result<()> {
    let mut chunk = vec![0u8; len.min(64 << 10)];
    let mut fds = Vec::new();
    while len > 0 {
        let n = len.min(chunk.len());
        if !read_exact(sock, &mut chunk[..n], &mut fds)? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        fds.clear();
        len -= n;
    }
    Ok(())
}

/// Fills `buf`, collecting fds. `Ok(false)`: end of stream before the first
/// byte; end of stream after it is an error.
fn read_exact(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match recvmsg(sock.as_raw_fd(), &mut buf[done..], fds) {
            Ok(0) if done == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Waits until one of `fds` is readable (or hung up), at most `timeout`;
/// returns which are.
pub fn poll_readable(fds: &[RawFd], timeout: std::time::Duration) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `p` is a live array of `p.len()` pollfds that poll fills in.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(p.iter().map(|x| x.revents != 0).collect())
}

/// Whether the peer of `fd` has closed or shut down its end (data it sent
/// before may still be unread); does not wait.
pub fn peer_hung_up(fd: RawFd) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: `p` is one live pollfd that poll fills in; timeout 0.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0)
}

/// Bytes of control buffer for `n` fds.
fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument; no memory is touched.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// `cmsg_len` of a control message carrying `n` fds.
fn cmsg_len(n: usize) -> usize {
    // SAFETY: CMSG_LEN is arithmetic on its argument; no memory is touched.
    unsafe { libc::CMSG_LEN((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

fn empty_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is a plain C struct of integers and pointers; all
    // zeroes (null pointers, zero lengths) is a valid empty header.
    unsafe { std::mem::zeroed() }
}

/// One `sendmsg` of `buf` with `fds` as SCM_RIGHTS (none if empty).
fn sendmsg(fd: RawFd, buf: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // u64 words keep the control buffer aligned for cmsghdr.
    let space = if fds.is_empty() {
        0
    } else {
        cmsg_space(fds.len())
    };
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut msg = empty_msghdr();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` has a control buffer of `space` bytes, enough for
        // one header; CMSG_FIRSTHDR only computes a pointer into it.
        let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        if c.is_null() {
            return Err(io::Error::other("no room for SCM_RIGHTS"));
        }
        let hdr = libc::cmsghdr {
            cmsg_len: cmsg_len(fds.len()) as _,
            cmsg_level: libc::SOL_SOCKET,
            cmsg_type: libc::SCM_RIGHTS,
        };
        // SAFETY: `c` points at the start of `control`, which is aligned
        // (u64 words) and large enough for a cmsghdr.
        unsafe { c.write(hdr) };
        // SAFETY: CMSG_DATA computes the data pointer of the header just
        // written, inside `control`.
        let data = unsafe { libc::CMSG_DATA(c) };
        // SAFETY: the control buffer was sized by CMSG_SPACE for exactly
        // `fds.len()` descriptors after the header; the copy is bytewise, so
        // alignment does not matter.
        unsafe {
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                data,
                std::mem::size_of_val(fds),
            )
        };
    }
    // SAFETY: `msg` points at `iov` (describing `buf`, alive for the call)
    // and at `control`; sendmsg only reads them. MSG_NOSIGNAL: a dead peer
    // is an EPIPE error, not a SIGPIPE that kills the process.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// One `recvmsg` into `buf`; fds received are appended to `fds`.
fn recvmsg(fd: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let space = cmsg_space(MAX_FDS);
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut msg = empty_msghdr();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` describes `buf` and `control`, both writable and alive
    // for the call; recvmsg writes at most their lengths. Received fds are
    // close-on-exec.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR reads its control
    // fields and returns null or a pointer into `control`.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: `c` is non-null and points at a cmsghdr the kernel wrote
        // inside `control` (aligned: u64 words).
        let hdr = unsafe { c.read() };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            let bytes = (hdr.cmsg_len as usize).saturating_sub(cmsg_len(0));
            // SAFETY: CMSG_DATA computes the data pointer of header `c`.
            let data = unsafe { libc::CMSG_DATA(c) };
            for i in 0..bytes / std::mem::size_of::<RawFd>() {
                // The kernel wrote `bytes` bytes of descriptors at `data`,
                // inside `control`; read_unaligned copes with any alignment.
                let at = data.cast::<RawFd>().wrapping_add(i);
                // SAFETY: `at` lies inside the descriptors the kernel wrote.
                let raw = unsafe { at.read_unaligned() };
                // SAFETY: the kernel just installed `raw` in this process
                // for us; nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: `msg` and `c` are as above; CMSG_NXTHDR returns the next
        // header inside `control` or null.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::user::header::Command;
    use std::io::Read;

    #[test]
    fn message_with_fds_round_trip() {
        let (a, b) = UnixStream::pair().unwrap();
        let f1 = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        let f2 = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        let h = Header::command(3, Command::DeviceSetIrqs, 20);
        // SAFETY: the eventfds outlive the borrowed fds.
        let b1 = unsafe { BorrowedFd::borrow_raw(f1.as_raw_fd()) };
        // SAFETY: as above.
        let b2 = unsafe { BorrowedFd::borrow_raw(f2.as_raw_fd()) };
        let fds = [b1, b2];
        send(&a, &h, &[&[7u8; 20]], &fds).unwrap();
        let m = recv(&b, 4096).unwrap().unwrap();
        assert_eq!(m.header, h);
        assert_eq!(m.payload, vec![7u8; 20]);
        assert_eq!(m.fds.len(), 2);
        // The received fd is the same eventfd.
        f1.write(5).unwrap();
        let mut v = [0u8; 8];
        std::fs::File::from(m.fds.into_iter().next().unwrap())
            .read_exact(&mut v)
            .unwrap();
        assert_eq!(u64::from_ne_bytes(v), 5);
        // Short, too long, end of stream.
        let mut short = Header::command(1, Command::Version, 0);
        short.size = 8;
        send(&a, &short, &[], &[]).unwrap();
        assert!(matches!(recv(&b, 4096), Err(RecvError::Short(_))));
        send(
            &a,
            &Header::command(1, Command::Version, 100),
            &[&[0; 100]],
            &[],
        )
        .unwrap();
        match recv(&b, 64) {
            Err(RecvError::TooLong(h)) => discard(&b, h.payload_len()).unwrap(),
            other => panic!("{other:?}"),
        }
        drop(a);
        assert!(recv(&b, 4096).unwrap().is_none());
    }
}
