//! The vfio-user server (`vfio::user::Server`) serving the device model:
//! the input is what one client sends on a fresh connection, from its
//! first byte to its hang-up. The server parses every message (header,
//! then each command's payload) and runs the session against the model
//! (region reads and writes reach BAR0 and its doorbells); on hang-up it
//! releases the function. The client-side parsers of what a server sends
//! (`Capabilities::from_wire`, `parse_sparse_areas`) get the input too.
//!
//! Framing: the input is cut into messages by their headers' `size`
//! (a header whose size runs past the input, or is below 16, sends the rest
//! as it is), so that file descriptors can travel beside the bytes as a
//! real client's do: a `DMA_MAP` message carries a 64 KiB memfd, a
//! `DEVICE_SET_IRQS` message carries as many fds as it asks for (at most
//! 8): small memfds, which the server cannot tell from eventfds (it keeps
//! them and writes its 8-byte counts into them; taking an `EventFd`'s fd
//! as a `BorrowedFd` would need `unsafe` here, which this crate has none of).
//!
//! Oracle: the server must end the session after the hang-up within
//! [`SESSION_DEADLINE`]: close its side, or release the function (the
//! model's reset count moves; the server may hold its side of the socket
//! a little longer); a panic anywhere in the process (the server's threads
//! included) aborts it.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use mlx5_emu::{Device, DeviceConfig};
use vfio::emulated::{Bus, DeviceModel};
use vfio::user::header::{Command, Header, HEADER_SIZE};
use vfio::user::irq::IrqSet;
use vfio::user::region::{parse_sparse_areas, RegionInfoWire};
use vfio::user::version::Capabilities;
use vfio::user::{socket, Server, ServerThread};
use vfio::DmaBuffer;
use zerocopy::FromBytes;

/// How long the server may take to end a session after the client hung
/// up (its own I/O timeouts are 5 s; a release is milliseconds).
pub const SESSION_DEADLINE: Duration = Duration::from_secs(20);

struct Served {
    path: PathBuf,
    dev: Arc<Device>,
    _thread: ServerThread,
}

/// The served function of this process (made on first use: after the
/// fuzzer's fork, so the model's and server's threads are the child's).
fn served() -> &'static Served {
    static SERVED: OnceLock<Served> = OnceLock::new();
    SERVED.get_or_init(|| {
        let dir = std::env::temp_dir().join("mlx5-fuzz-vfio-user");
        let _ = std::fs::create_dir_all(&dir);
        // Sockets of processes that are gone (a fuzzer child lives for a
        // few thousand inputs, then the next one starts).
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name.strip_suffix(".sock") {
                    if !PathBuf::from(format!("/proc/{pid}")).exists() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        let path = dir.join(format!("{}.sock", std::process::id()));
        let bus = Bus::new();
        let dev = Arc::new(Device::new(DeviceConfig::default(), bus.clone()));
        let model: Arc<dyn DeviceModel> = dev.clone();
        let server = Server::bind(&path, model, bus)
            .unwrap_or_else(|e| panic!("cannot serve {}: {e}", path.display()));
        let thread = server
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the server: {e}"));
        Served {
            path,
            dev,
            _thread: thread,
        }
    })
}

/// Runs one input.
pub fn run(data: &[u8]) {
    client_parsers(data);
    let s = served();
    let resets = s.dev.stats().resets;
    let t0 = Instant::now();
    let sock = UnixStream::connect(&s.path)
        .unwrap_or_else(|e| panic!("connect {}: {e}", s.path.display()));
    // Replies are drained on a thread of their own: a client that only
    // writes would fill the socket and stall the server's replies.
    let mut rx = sock
        .try_clone()
        .unwrap_or_else(|e| panic!("dup(socket): {e}"));
    let _ = rx.set_read_timeout(Some(SESSION_DEADLINE));
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = closed.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match rx.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        seen.store(true, std::sync::atomic::Ordering::Release);
    });
    let _ = sock.set_write_timeout(Some(SESSION_DEADLINE));
    send_all(&sock, data);
    let _ = sock.shutdown(std::net::Shutdown::Write);
    if std::env::var_os("MLX5_FUZZ_VERBOSE").is_some() {
        eprintln!("sent in {:?}", t0.elapsed());
    }
    let start = Instant::now();
    while !closed.load(std::sync::atomic::Ordering::Acquire) && s.dev.stats().resets == resets {
        assert!(
            start.elapsed() < SESSION_DEADLINE,
            "the server did not end the session within {SESSION_DEADLINE:?} of the hang-up"
        );
        std::thread::yield_now();
    }
    if std::env::var_os("MLX5_FUZZ_VERBOSE").is_some() {
        eprintln!(
            "session over {:?} after the hang-up ({})",
            start.elapsed(),
            if closed.load(std::sync::atomic::Ordering::Acquire) {
                "closed"
            } else {
                "released"
            }
        );
    }
    let _ = sock.shutdown(std::net::Shutdown::Both);
    let _ = reader.join();
}

/// What a client parses of a server's replies.
fn client_parsers(data: &[u8]) {
    let _ = Capabilities::from_wire(data);
    if let Ok((info, caps)) = RegionInfoWire::read_from_prefix(data) {
        if let Ok(areas) = parse_sparse_areas(&info, caps) {
            for (off, len) in areas {
                assert!(
                    off.checked_add(len).is_some_and(|end| end <= info.size),
                    "a sparse area {off:#x}+{len:#x} past the region's size {:#x} was accepted",
                    info.size
                );
            }
        }
    }
}

/// Sends `data` as the messages its headers delimit, with the fds a real
/// client would attach; stops at the first write the server refused.
fn send_all(sock: &UnixStream, mut data: &[u8]) {
    while !data.is_empty() {
        let Ok((h, _)) = Header::read_from_prefix(data) else {
            // Fewer than 16 bytes: they go as they are.
            let _ = std::io::Write::write_all(&mut &*sock, data);
            return;
        };
        let size = h.size as usize;
        if size < HEADER_SIZE || size > data.len() {
            let _ = std::io::Write::write_all(&mut &*sock, data);
            return;
        }
        let (msg, rest) = data.split_at(size);
        data = rest;
        let payload = &msg[HEADER_SIZE..];
        let files: Vec<Arc<DmaBuffer>> = match Command::from_raw(h.command) {
            Some(Command::DmaMap) => DmaBuffer::new(1 << 16).into_iter().collect(),
            Some(Command::DeviceSetIrqs) => {
                let n = IrqSet::read_from_prefix(payload)
                    .map(|(s, _)| s.count.min(8))
                    .unwrap_or(0);
                (0..n).filter_map(|_| DmaBuffer::new(4096).ok()).collect()
            }
            _ => Vec::new(),
        };
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|m| m.file().as_fd()).collect();
        if socket::send(sock, &h, &[payload], &fds).is_err() {
            return;
        }
    }
}
