//! A relay between UML's vhost-user front end and the vhost-user library,
//! for two messages UML sends in a form the library (vhost 0.18) refuses:
//!
//! - `VHOST_USER_SET_MEM_TABLE` (5): UML's `header.size` is its whole
//!   two-region payload whatever `num` says; the library wants exactly
//!   `8 + num * 32` bytes. The relay trims the payload to `num` regions.
//! - `VHOST_USER_SET_SLAVE_REQ_FD` (21, `SET_BACKEND_REQ_FD`): UML hands over
//!   the write end of a pipe; the library accepts only a Unix stream socket.
//!   The relay keeps the pipe open (UML drops the device when it closes)
//!   and passes one end of a fresh socket pair instead.
//!
//! Everything else goes through unchanged, in both directions. Each message
//! is read whole (12-byte header, then `size` bytes) with the file
//! descriptor that came with it (UML sends at most one per message).

use std::fs::File;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// `VHOST_USER_SET_MEM_TABLE`.
const SET_MEM_TABLE: u32 = 5;
/// `VHOST_USER_SET_SLAVE_REQ_FD` / `SET_BACKEND_REQ_FD`.
const SET_BACKEND_REQ_FD: u32 = 21;
/// Bytes of a vhost-user message header.
const HDR: usize = 12;
/// Bytes of the memory-table header (`num`, padding) and of one region.
const MEM_HDR: usize = 8;
const MEM_REGION: usize = 32;
/// Largest payload a front end may send (the library's own limit is lower).
const MAX_PAYLOAD: usize = 64 * 1024;

/// What the relay holds open for the front end while it runs.
#[derive(Debug, Default)]
struct Kept {
    _files: Vec<File>,
    _socks: Vec<UnixStream>,
}

/// Relays `front` (UML) to `back` (the library) until either side closes.
pub(crate) fn run(front: UnixStream, back: UnixStream) -> std::io::Result<()> {
    let (front_rx, back_tx) = (front.try_clone()?, back.try_clone()?);
    let replies = std::thread::Builder::new()
        .name("pcidev-vhost-replies".into())
        .spawn(move || {
            let (mut from, mut to) = (back, front);
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Both);
        })?;
    let res = requests(front_rx, back_tx);
    let _ = replies.join();
    res
}

fn requests(front: UnixStream, back: UnixStream) -> std::io::Result<()> {
    let mut kept = Kept::default();
    let res = loop {
        match relay_one(&front, &back, &mut kept) {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let _ = back.shutdown(Shutdown::Both);
    let _ = front.shutdown(Shutdown::Both);
    res
}

/// One message; false at end of stream.
fn relay_one(front: &UnixStream, back: &UnixStream, kept: &mut Kept) -> std::io::Result<bool> {
    let mut hdr = [0u8; HDR];
    let (n, fd) = front
        .recv_with_fd(&mut hdr)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    if n == 0 {
        return Ok(false);
    }
    let mut reader = front;
    reader.read_exact(&mut hdr[n..])?;
    let request = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    let size = u32::from_ne_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]) as usize;
    if size > MAX_PAYLOAD {
        return Err(std::io::Error::other(format!(
            "vhost-user request {request} with {size} bytes of payload"
        )));
    }
    let mut payload = vec![0u8; size];
    reader.read_exact(&mut payload)?;
    let mut fd = fd;
    match request {
        SET_MEM_TABLE if payload.len() >= MEM_HDR => {
            let num = u32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
            let want = MEM_HDR + num * MEM_REGION;
            if want < payload.len() {
                payload.truncate(want);
                hdr[8..12].copy_from_slice(&(want as u32).to_ne_bytes());
            }
        }
        SET_BACKEND_REQ_FD => {
            if let Some(pipe) = fd.take() {
                let (ours, theirs) = UnixStream::pair()?;
                kept._files.push(pipe);
                kept._socks.push(ours);
                let mut msg = hdr.to_vec();
                msg.extend_from_slice(&payload);
                send(back, &msg, Some(theirs.as_raw_fd()))?;
                return Ok(true);
            }
        }
        _ => {}
    }
    let mut msg = hdr.to_vec();
    msg.extend_from_slice(&payload);
    send(back, &msg, fd.as_ref().map(|f| f.as_raw_fd()))?;
    Ok(true)
}

/// Sends `msg`, with `fd` attached to its first bytes.
fn send(back: &UnixStream, msg: &[u8], fd: Option<std::os::fd::RawFd>) -> std::io::Result<()> {
    let sent = match fd {
        Some(fd) => back
            .send_with_fds(&[msg], &[fd])
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?,
        None => 0,
    };
    let mut w = back;
    w.write_all(&msg[sent..])
}
