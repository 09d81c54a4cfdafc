//! The server side: any [`DeviceModel`] served to vfio-user clients on a
//! UNIX socket, one client at a time (a PCI function has one owner, as
//! under vfio-pci).
//!
//! The server plays the kernel's part: it answers region and IRQ queries
//! from the model, hands out the fd of the model's BAR memory (so mapped
//! registers and doorbells are shared memory the model polls, and a
//! doorbell costs no message), maps the fds the client shares for DMA into
//! the model's [`DmaSpace`](crate::emulated::DmaSpace) (a range mapped
//! without an fd, as QEMU maps ROMs, is reached by `DMA_READ`/`DMA_WRITE`
//! requests to the client, answered to the model's thread by the session's
//! reader thread; the specification's layout, address and count then data:
//! QEMU 11's own `VFIOUserDMARW` puts its data 4 bytes earlier), routes the
//! eventfds of `SET_IRQS` to the model's vectors and enables MSI-X in config
//! space when vectors are attached, as vfio-pci does.
//!
//! Every request gets a reply; anything malformed or unsupported gets an
//! error reply with an errno, and the session goes on. When the client
//! hangs up (or dies), the function is released as vfio-pci releases it:
//! reset, every DMA mapping dropped, every eventfd closed; the server then
//! waits for the next client. A second client while one is connected is
//! answered `EBUSY`.
//!
//! Threads: the caller of [`Server::run`] only accepts connections. Each
//! newcomer gets a thread of its own that reads its first message, within
//! [`FIRST_MESSAGE_TIMEOUT`] in all however slowly it trickles (at the
//! deadline the acceptor shuts the connection down), and then either
//! becomes the owner and is served on that thread, or is answered `EBUSY`.
//! Nothing a newcomer does runs on the owner's thread, so no newcomer can
//! stall the owner. At most [`MAX_NEWCOMERS`] wait at once; more are
//! closed unanswered.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;
use zerocopy::{FromBytes, IntoBytes};

use super::device::{
    DeviceInfo, DEVICE_FLAGS_PCI, DEVICE_FLAGS_RESET, PCI_NUM_IRQS, PCI_NUM_REGIONS,
};
use super::dma::{DmaAccess, DmaMap, DmaUnmap, DMA_MAP_READ, DMA_MAP_WRITE, DMA_UNMAP_ALL};
use super::header::{Command, Header};
use super::irq::*;
use super::region::*;
use super::socket::{self, Message, RecvError};
use super::version::{Capabilities, Version, MAJOR, MINOR};
use super::MAX_MESSAGE;
use crate::emulated::{find_capability, set_msix_enable, Bus, DeviceModel, DmaByMessage};
use crate::{Error, IrqKind, Result};

/// Size of config space served (PCIe: 4 KiB).
pub const CONFIG_SPACE_SIZE: u64 = 4096;
/// Config-space offset of the interrupt pin register (0: no INTx).
const PCI_INTERRUPT_PIN: u64 = 0x3d;
/// How long the server waits for the rest of a message, or for a client to
/// take a reply, before it gives the client up.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a newcomer has to send its whole first message.
pub const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);
/// How many newcomers may be waiting (for their first message, or for the
/// previous owner's release) at once.
pub const MAX_NEWCOMERS: usize = 16;
/// How often a waiting server looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// What this server announces in `VERSION`. `max_msg_fds` is QEMU's ceiling
/// (`VFIO_USER_MAX_MAX_FDS`, 16): QEMU refuses a server announcing more
/// ("malformed max_msg_fds"), and splits a longer run of eventfds into
/// several `SET_IRQS` anyway.
pub const SERVER_CAPS: Capabilities = Capabilities {
    max_msg_fds: 16,
    max_data_xfer_size: 1 << 20,
    max_dma_maps: 65535,
    pgsizes: 4096,
};

const IRQ_KINDS: [IrqKind; 5] = [
    IrqKind::Intx,
    IrqKind::Msi,
    IrqKind::MsiX,
    IrqKind::Err,
    IrqKind::Req,
];

/// A device model listening on a UNIX socket.
#[derive(Debug)]
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    model: Arc<dyn DeviceModel>,
    bus: Bus,
    stop: Arc<AtomicBool>,
    /// The owner's connection (a second handle on it), while there is one.
    owner: Mutex<Option<UnixStream>>,
    /// Signalled when the owner's function has been released.
    released: Condvar,
    /// Newcomers being admitted.
    newcomers: AtomicUsize,
}

/// A newcomer the acceptor watches: a handle to shut it down at its
/// deadline, and whether its admission has finished.
struct Newcomer {
    deadline: Instant,
    sock: UnixStream,
    done: Arc<AtomicBool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A server running on its own thread; stopped and joined when dropped.
#[derive(Debug)]
pub struct ServerThread {
    stop: Arc<AtomicBool>,
    path: PathBuf,
    thread: Option<JoinHandle<()>>,
}

impl ServerThread {
    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Asks the server to stop (it finishes the message in hand).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!(path = %self.path.display(), "vfio-user server thread panicked");
            }
        }
    }
}

/// Why a request was refused: the errno for the reply, and words for the log.
struct Refusal {
    errno: i32,
    why: String,
}

fn refuse(errno: i32, why: impl Into<String>) -> Refusal {
    Refusal {
        errno,
        why: why.into(),
    }
}

/// A reply's payload and the fds that go with it.
#[derive(Default)]
struct Reply {
    payload: Vec<u8>,
    files: Vec<Arc<File>>,
}

impl Reply {
    fn of(parts: &[&[u8]]) -> Self {
        Self {
            payload: parts.concat(),
            files: Vec::new(),
        }
    }
}

/// The fixed part of a request's payload, or EINVAL naming what is short.
fn head<T: FromBytes>(cmd: Command, payload: &[u8]) -> std::result::Result<(T, &[u8]), Refusal> {
    T::read_from_prefix(payload).map_err(|_| {
        refuse(
            libc::EINVAL,
            format!(
                "{}: payload of {} bytes is shorter than its {} fixed bytes",
                cmd.name(),
                payload.len(),
                std::mem::size_of::<T>()
            ),
        )
    })
}

fn irq_kind(index: u32) -> std::result::Result<IrqKind, Refusal> {
    IRQ_KINDS
        .get(index as usize)
        .copied()
        .ok_or_else(|| refuse(libc::EINVAL, format!("no interrupt type {index}")))
}

impl Server {
    /// Listens on `path` for clients of `model`, whose bus is `bus` (the
    /// server fills its DMA space and vectors from what clients send). A
    /// stale socket file (nobody listening) is replaced; a live one, and
    /// anything that is not a socket (a file, a directory), is an error
    /// and left as it is.
    pub fn bind(path: impl AsRef<Path>, model: Arc<dyn DeviceModel>, bus: Bus) -> Result<Self> {
        use std::os::unix::fs::FileTypeExt;
        let path = path.as_ref().to_path_buf();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if !meta.file_type().is_socket() {
                return Err(Error::Os {
                    op: "bind(vfio-user socket)",
                    source: std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!(
                            "{} exists and is not a socket; not replacing it",
                            path.display()
                        ),
                    ),
                });
            }
            if UnixStream::connect(&path).is_ok() {
                return Err(Error::Os {
                    op: "bind(vfio-user socket)",
                    source: std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        format!("{} is served by another process", path.display()),
                    ),
                });
            }
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path).map_err(|e| Error::Os {
            op: "bind(vfio-user socket)",
            source: e,
        })?;
        Ok(Self {
            listener,
            path,
            model,
            bus,
            stop: Arc::new(AtomicBool::new(false)),
            owner: Mutex::new(None),
            released: Condvar::new(),
            newcomers: AtomicUsize::new(0),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The flag that stops [`run`](Self::run) (set it from a signal handler
    /// or another thread; the server notices within 100 ms).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Runs the server on a thread of its own.
    pub fn spawn(self) -> Result<ServerThread> {
        let stop = self.stop.clone();
        let path = self.path.clone();
        let name = format!(
            "vfio-user:{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        );
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                if let Err(e) = self.run() {
                    tracing::error!(path = %self.path.display(), error = %e, "vfio-user server stopped");
                }
            })
            .map_err(|e| Error::Os {
                op: "spawn(vfio-user server)",
                source: e,
            })?;
        Ok(ServerThread {
            stop,
            path,
            thread: Some(thread),
        })
    }

    /// Serves clients, one at a time, until the stop flag is set (the
    /// owner's session ends within 100 ms of it too).
    pub fn run(&self) -> Result<()> {
        tracing::info!(path = %self.path.display(), device = %self.model.name(), "vfio-user server listening");
        std::thread::scope(|scope| {
            let mut waiting: Vec<Newcomer> = Vec::new();
            let result = loop {
                if self.stop.load(Ordering::Acquire) {
                    break Ok(());
                }
                let ready = match socket::poll_readable(&[self.listener.as_raw_fd()], STOP_POLL) {
                    Ok(r) => r,
                    Err(e) => {
                        break Err(Error::Os {
                            op: "poll(vfio-user listener)",
                            source: e,
                        })
                    }
                };
                // Newcomers past their deadline are cut off: a read blocked
                // on them returns.
                let now = Instant::now();
                waiting.retain(|n| {
                    if n.done.load(Ordering::Acquire) {
                        return false;
                    }
                    if now < n.deadline {
                        return true;
                    }
                    tracing::warn!(path = %self.path.display(), "a newcomer did not finish its first message in time; cut off");
                    let _ = n.sock.shutdown(std::net::Shutdown::Both);
                    false
                });
                if !ready[0] {
                    continue;
                }
                let sock = match self.listener.accept() {
                    Ok((sock, _)) => sock,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept");
                        continue;
                    }
                };
                if self.newcomers.load(Ordering::Acquire) >= MAX_NEWCOMERS {
                    tracing::warn!(path = %self.path.display(), "too many clients waiting; one more closed unanswered");
                    continue;
                }
                let watch = match sock.try_clone() {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::warn!(error = %e, "dup(vfio-user connection)");
                        continue;
                    }
                };
                let done = Arc::new(AtomicBool::new(false));
                let deadline = Instant::now() + FIRST_MESSAGE_TIMEOUT;
                waiting.push(Newcomer {
                    deadline,
                    sock: watch,
                    done: done.clone(),
                });
                self.newcomers.fetch_add(1, Ordering::AcqRel);
                let spawned = std::thread::Builder::new()
                    .name("vfio-user-session".into())
                    .spawn_scoped(scope, move || self.admit(sock, deadline, &done));
                if let Err(e) = spawned {
                    self.newcomers.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(error = %e, "spawn(vfio-user session)");
                }
            };
            // Stopping: newcomers still talking are cut off; the owner's
            // session sees the stop flag.
            for n in &waiting {
                let _ = n.sock.shutdown(std::net::Shutdown::Both);
            }
            self.released.notify_all();
            result
        })?;
        tracing::info!(path = %self.path.display(), "vfio-user server stopped");
        Ok(())
    }

    /// A newcomer's thread: its first message, then its session as the
    /// owner or an `EBUSY`.
    fn admit(&self, sock: UnixStream, deadline: Instant, done: &AtomicBool) {
        if let Err(e) = sock
            .set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| sock.set_write_timeout(Some(IO_TIMEOUT)))
        {
            tracing::warn!(error = %e, "socket timeouts");
        }
        let first = socket::recv(&sock, MAX_MESSAGE);
        done.store(true, Ordering::Release);
        let owner = self.take_ownership(&sock, deadline, &first);
        self.newcomers.fetch_sub(1, Ordering::AcqRel);
        if owner {
            self.serve(sock, first);
            *lock(&self.owner) = None;
            self.released.notify_all();
        }
    }

    /// Makes the newcomer on `sock` the owner if there is none (or the one
    /// there is has hung up and is being released, which it waits for, up
    /// to `deadline`); otherwise answers its `first` message `EBUSY`.
    fn take_ownership(
        &self,
        sock: &UnixStream,
        deadline: Instant,
        first: &std::result::Result<Option<socket::Message>, RecvError>,
    ) -> bool {
        if matches!(first, Ok(None) | Err(RecvError::Io(_))) {
            // Gone (or cut off) before it said anything.
            return false;
        }
        let mut owner = lock(&self.owner);
        loop {
            let leaving = match owner.as_ref() {
                None => match sock.try_clone() {
                    Ok(s) => {
                        *owner = Some(s);
                        return true;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "dup(vfio-user connection)");
                        return false;
                    }
                },
                Some(o) => socket::peer_hung_up(o.as_raw_fd()).unwrap_or(false),
            };
            let now = Instant::now();
            if !leaving || now >= deadline || self.stop.load(Ordering::Acquire) {
                break;
            }
            // The owner hung up: the function is free once released.
            owner = match self.released.wait_timeout(owner, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        drop(owner);
        if let Ok(Some(m)) = first {
            if !m.header.no_reply() {
                let _ = socket::send(sock, &m.header.error_reply(libc::EBUSY), &[], &[]);
            }
        }
        tracing::warn!(path = %self.path.display(), "second client turned away: the function has an owner");
        false
    }

    /// One client's session (its `first` message already read), then the
    /// release of the function.
    fn serve(
        &self,
        sock: UnixStream,
        first: std::result::Result<Option<socket::Message>, RecvError>,
    ) {
        tracing::info!(path = %self.path.display(), "client connected");
        let link = match sock.try_clone() {
            Ok(s) => Arc::new(Link::new(s)),
            Err(e) => {
                tracing::warn!(error = %e, "dup(vfio-user connection)");
                return;
            }
        };
        let mut s = Session {
            srv: self,
            link: link.clone(),
            negotiated: false,
            files: HashMap::new(),
        };
        let skip = match &first {
            Err(RecvError::TooLong(h)) => h.payload_len(),
            _ => 0,
        };
        let why = std::thread::scope(|scope| {
            let why = match s.received(first) {
                Some(why) => why,
                None if skip > 0 && socket::discard(&sock, skip).is_err() => {
                    "skipping an oversized message failed".into()
                }
                None => {
                    // One reader: requests come here in order, replies to the
                    // server's own requests go to whoever waits for them (the
                    // model's thread in the middle of a DMA by message).
                    let (tx, rx) = mpsc::channel();
                    let reader = std::thread::Builder::new()
                        .name("vfio-user-reader".into())
                        .spawn_scoped(scope, || read_loop(&link, &self.stop, tx));
                    match reader {
                        Ok(_) => s.run(&rx),
                        Err(e) => format!("spawn(vfio-user reader): {e}"),
                    }
                }
            };
            // The reader (if any) sees the socket shut and ends.
            let _ = sock.shutdown(std::net::Shutdown::Both);
            why
        });
        link.hang_up();
        tracing::info!(path = %self.path.display(), dma_maps = self.bus.dma.mappings(), "client gone ({why}); releasing the function");
        self.release();
    }

    /// What vfio-pci does when its device file is closed: reset, and drop
    /// everything the owner attached.
    fn release(&self) {
        self.model.reset();
        self.bus.dma.clear();
        for k in IRQ_KINDS {
            let _ = self.bus.irqs.set(k, 0, &[]);
        }
        set_msix_enable(&*self.model, false);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the reader hands the session: one receive.
type Received = std::result::Result<Option<Message>, RecvError>;

/// A message that waited this long for the session, or took the session
/// this long to answer, is logged (a client such as QEMU waits for some
/// replies holding its big lock, and gives up after its `x-msg-timeout`).
const SLOW_MESSAGE: Duration = Duration::from_secs(1);

/// Reads the client's messages until it goes (or the server stops): replies
/// to the server's requests to their waiters, everything else to `tx`. An
/// oversized message's body is skipped here, so the stream stays in step.
fn read_loop(link: &Link, stop: &AtomicBool, tx: mpsc::Sender<(Instant, Received)>) {
    let fds = [link.sock.as_raw_fd()];
    loop {
        if stop.load(Ordering::Acquire) {
            break;
        }
        match socket::poll_readable(&fds, STOP_POLL) {
            Ok(r) if !r[0] => continue,
            Ok(_) => {}
            Err(e) => {
                let _ = tx.send((Instant::now(), Err(RecvError::Io(e))));
                break;
            }
        }
        match socket::recv(&link.sock, MAX_MESSAGE) {
            Ok(Some(m)) if m.header.is_reply() => link.deliver(m),
            Err(RecvError::TooLong(h)) => {
                if tx
                    .send((Instant::now(), Err(RecvError::TooLong(h))))
                    .is_err()
                {
                    break;
                }
                if let Err(e) = socket::discard(&link.sock, h.payload_len()) {
                    let _ = tx.send((Instant::now(), Err(RecvError::Io(e))));
                    break;
                }
            }
            r @ (Ok(Some(_)) | Err(RecvError::Short(_))) => {
                if tx.send((Instant::now(), r)).is_err() {
                    break;
                }
            }
            r @ (Ok(None) | Err(RecvError::Io(_))) => {
                let _ = tx.send((Instant::now(), r));
                break;
            }
        }
    }
    link.hang_up();
}

/// The session's socket as both directions use it: every message is sent
/// whole under one lock (replies, and the server's own DMA_READ/DMA_WRITE
/// requests, which may come from the model's threads), and replies to the
/// server's requests are matched to their waiters by message ID.
#[derive(Debug)]
struct Link {
    sock: UnixStream,
    send_lock: Mutex<()>,
    next_id: AtomicU16,
    /// Requests in flight: `None` until the reply comes.
    waiting: Mutex<HashMap<u16, Option<Message>>>,
    arrived: Condvar,
    gone: AtomicBool,
    /// Most bytes one DMA message may carry (the smaller of both sides').
    max_xfer: AtomicU32,
}

impl Link {
    fn new(sock: UnixStream) -> Self {
        Self {
            sock,
            send_lock: Mutex::new(()),
            next_id: AtomicU16::new(0),
            waiting: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            gone: AtomicBool::new(false),
            max_xfer: AtomicU32::new(Capabilities::default().max_data_xfer_size),
        }
    }

    fn send(
        &self,
        h: &Header,
        parts: &[&[u8]],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> std::io::Result<()> {
        let _g = lock(&self.send_lock);
        socket::send(&self.sock, h, parts, fds)
    }

    /// A reply from the client: to its waiter, if one still waits.
    fn deliver(&self, m: Message) {
        let mut w = lock(&self.waiting);
        match w.get_mut(&m.header.id) {
            Some(slot) => {
                *slot = Some(m);
                self.arrived.notify_all();
            }
            None => tracing::warn!(
                id = m.header.id,
                cmd = m.header.command_name(),
                "reply from the client to no request of ours (timed out?); ignored"
            ),
        }
    }

    /// The client is gone: every waiter gives up.
    fn hang_up(&self) {
        self.gone.store(true, Ordering::Release);
        let _w = lock(&self.waiting);
        self.arrived.notify_all();
    }

    /// Sends a request and waits (up to [`IO_TIMEOUT`]) for its reply.
    fn request(&self, cmd: Command, parts: &[&[u8]]) -> Option<Message> {
        let id = self.next_id.fetch_add(1, Ordering::AcqRel);
        let len = parts.iter().map(|p| p.len()).sum();
        lock(&self.waiting).insert(id, None);
        let sent = !self.gone.load(Ordering::Acquire)
            && self
                .send(&Header::command(id, cmd, len), parts, &[])
                .is_ok();
        let deadline = Instant::now() + IO_TIMEOUT;
        let mut w = lock(&self.waiting);
        let reply = loop {
            if !sent {
                break None;
            }
            if let Some(Some(_)) = w.get(&id) {
                break w.remove(&id).flatten();
            }
            let now = Instant::now();
            if now >= deadline || self.gone.load(Ordering::Acquire) {
                break None;
            }
            w = match self.arrived.wait_timeout(w, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        };
        w.remove(&id);
        match reply {
            Some(m) if m.header.errno().is_none() => Some(m),
            Some(m) => {
                tracing::debug!(cmd = cmd.name(), errno = ?m.header.errno(), "the client refused a DMA message");
                None
            }
            None => {
                tracing::warn!(
                    cmd = cmd.name(),
                    "no reply from the client to a DMA message"
                );
                None
            }
        }
    }

    /// The chunks of `len` bytes at `iova` that one message each may carry.
    fn chunks(&self, iova: u64, len: usize) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> {
        let step = (self.max_xfer.load(Ordering::Acquire) as usize).max(1);
        (0..len)
            .step_by(step)
            .map(move |at| (iova + at as u64, at..(at + step).min(len)))
    }
}

/// DMA to memory the client did not share: `DMA_READ` / `DMA_WRITE`
/// requests (the specification's layout: address, count, then the data).
impl DmaByMessage for Link {
    fn read(&self, iova: u64, buf: &mut [u8]) -> bool {
        for (at, r) in self.chunks(iova, buf.len()) {
            let a = DmaAccess {
                address: at,
                count: r.len() as u64,
            };
            let Some(m) = self.request(Command::DmaRead, &[a.as_bytes()]) else {
                return false;
            };
            let head = std::mem::size_of::<DmaAccess>();
            match m.payload.get(head..) {
                Some(data) if data.len() == r.len() => buf[r].copy_from_slice(data),
                _ => {
                    tracing::warn!(
                        iova = at,
                        count = a.count,
                        got = m.payload.len(),
                        "DMA_READ reply of the wrong size"
                    );
                    return false;
                }
            }
        }
        true
    }

    fn write(&self, iova: u64, data: &[u8]) -> bool {
        for (at, r) in self.chunks(iova, data.len()) {
            let a = DmaAccess {
                address: at,
                count: r.len() as u64,
            };
            if self
                .request(Command::DmaWrite, &[a.as_bytes(), &data[r]])
                .is_none()
            {
                return false;
            }
        }
        true
    }
}

/// Logs a message that waited `queued` behind others or took `handled` to
/// answer, if either is [`SLOW_MESSAGE`] or more.
fn slow(srv: &Server, what: Option<(u16, &'static str)>, queued: Duration, handled: Duration) {
    if queued >= SLOW_MESSAGE || handled >= SLOW_MESSAGE {
        let (id, cmd) = what.unwrap_or((0, "(none)"));
        tracing::warn!(
            path = %srv.path.display(),
            id,
            cmd,
            queued_ms = queued.as_millis() as u64,
            handled_ms = handled.as_millis() as u64,
            dma_maps = srv.bus.dma.mappings(),
            "slow vfio-user message"
        );
    }
}

struct Session<'a> {
    srv: &'a Server,
    link: Arc<Link>,
    negotiated: bool,
    /// The files this client's DMA_MAPs shared, by (device, inode): QEMU
    /// sends its RAM's memfd again with every map, and a vIOMMU makes
    /// tens of thousands of 4 KiB maps, so each new fd for a file already
    /// held is closed and the held one reused (else the server runs out
    /// of descriptors: EMFILE on the next SET_IRQS).
    files: HashMap<(u64, u64), Weak<File>>,
}

impl Session<'_> {
    /// Serves the reader's messages until the client goes; returns why it
    /// ended.
    fn run(&mut self, rx: &mpsc::Receiver<(Instant, Received)>) -> String {
        loop {
            if self.srv.stop.load(Ordering::Acquire) {
                return "server stopping".into();
            }
            match rx.recv_timeout(STOP_POLL) {
                Ok((read_at, r)) => {
                    let what = match &r {
                        Ok(Some(m)) => Some((m.header.id, m.header.command_name())),
                        _ => None,
                    };
                    let taken = Instant::now();
                    let why = self.received(r);
                    slow(self.srv, what, taken - read_at, taken.elapsed());
                    if let Some(why) = why {
                        return why;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return "reader ended".into(),
            }
        }
    }

    /// Acts on one receive; `Some(why)` when the session is over.
    fn received(&mut self, r: std::result::Result<Option<Message>, RecvError>) -> Option<String> {
        match r {
            Ok(None) => Some("hung up".into()),
            Ok(Some(m)) => self.handle(m).err().map(|e| format!("reply failed: {e}")),
            Err(RecvError::Io(e)) => Some(format!("receive: {e}")),
            Err(RecvError::Short(h)) => {
                // The size cannot be trusted, so nothing more is read;
                // what follows is taken as the next message.
                tracing::warn!(size = h.size, "message shorter than its header");
                self.error_reply(&h, libc::EINVAL)
                    .err()
                    .map(|e| format!("reply failed: {e}"))
            }
            Err(RecvError::TooLong(h)) => {
                // Its body is skipped by whoever reads the socket (the
                // first message: here).
                tracing::warn!(size = h.size, cmd = h.command_name(), "message too long");
                self.error_reply(&h, libc::E2BIG)
                    .err()
                    .map(|e| format!("reply failed: {e}"))
            }
        }
    }

    fn error_reply(&self, h: &Header, errno: i32) -> std::io::Result<()> {
        if h.no_reply() {
            return Ok(());
        }
        self.link.send(&h.error_reply(errno), &[], &[])
    }

    fn handle(&mut self, m: Message) -> std::io::Result<()> {
        let h = m.header;
        if h.is_reply() {
            tracing::warn!(
                id = h.id,
                cmd = h.command_name(),
                "unexpected reply from the client (no request pending); ignored"
            );
            return Ok(());
        }
        let result = match Command::from_raw(h.command) {
            None => Err(refuse(
                libc::ENOSYS,
                format!("unknown command {}", h.command),
            )),
            Some(cmd) if cmd != Command::Version && !self.negotiated => Err(refuse(
                libc::EINVAL,
                format!("{} before VFIO_USER_VERSION", cmd.name()),
            )),
            Some(cmd) => self.dispatch(cmd, &m.payload, m.fds),
        };
        match result {
            Ok(r) => {
                if h.no_reply() {
                    return Ok(());
                }
                let fds: Vec<_> = r.files.iter().map(|f| f.as_fd()).collect();
                self.link
                    .send(&h.reply(r.payload.len()), &[&r.payload], &fds)
            }
            Err(r) => {
                tracing::debug!(id = h.id, cmd = h.command_name(), errno = r.errno, why = %r.why, "request refused");
                self.error_reply(&h, r.errno)
            }
        }
    }

    fn dispatch(
        &mut self,
        cmd: Command,
        p: &[u8],
        fds: Vec<OwnedFd>,
    ) -> std::result::Result<Reply, Refusal> {
        use Command::*;
        match cmd {
            Version => self.version(p),
            DmaMap => self.dma_map(p, fds),
            DmaUnmap => self.dma_unmap(p),
            DeviceGetInfo => self.device_info(p),
            DeviceGetRegionInfo => self.region_info(p),
            DeviceGetIrqInfo => self.irq_info(p),
            DeviceSetIrqs => self.set_irqs(p, fds),
            RegionRead => self.region_read(p),
            RegionWrite => self.region_write(p),
            DeviceReset => {
                self.srv.model.reset();
                Ok(Reply::default())
            }
            DmaRead | DmaWrite => Err(refuse(
                libc::EINVAL,
                format!("{} goes from server to client", cmd.name()),
            )),
            DeviceGetRegionIoFds | RegionWriteMulti | DeviceFeature | MigDataRead
            | MigDataWrite => Err(refuse(
                libc::ENOTSUP,
                format!("{} is not served", cmd.name()),
            )),
        }
    }

    fn version(&mut self, p: &[u8]) -> std::result::Result<Reply, Refusal> {
        let (v, rest) = head::<Version>(Command::Version, p)?;
        if v.major != MAJOR {
            return Err(refuse(
                libc::ENOTSUP,
                format!(
                    "protocol {}.{} (this server speaks {MAJOR}.x)",
                    v.major, v.minor
                ),
            ));
        }
        let client = Capabilities::from_wire(rest).map_err(|e| refuse(libc::EINVAL, e))?;
        tracing::debug!(?client, minor = v.minor, "VERSION");
        self.negotiated = true;
        self.link.max_xfer.store(
            client
                .max_data_xfer_size
                .min(SERVER_CAPS.max_data_xfer_size),
            Ordering::Release,
        );
        let ours = Version {
            major: MAJOR,
            minor: v.minor.min(MINOR),
        };
        Ok(Reply::of(&[ours.as_bytes(), &SERVER_CAPS.to_wire()]))
    }

    fn dma_map(&mut self, p: &[u8], fds: Vec<OwnedFd>) -> std::result::Result<Reply, Refusal> {
        let (m, _) = head::<DmaMap>(Command::DmaMap, p)?;
        if fds.is_empty() && m.size != 0 && (m.address | m.size) % 4096 == 0 {
            // Memory the client does not share (QEMU: ROMs, other
            // devices' BARs): the device reaches it by DMA_READ/DMA_WRITE.
            if m.flags & !(DMA_MAP_READ | DMA_MAP_WRITE) != 0 || m.flags == 0 {
                return Err(refuse(
                    libc::EINVAL,
                    format!(
                        "DMA_MAP {:#x}+{:#x}: flags {:#x}",
                        m.address, m.size, m.flags
                    ),
                ));
            }
            if self.srv.bus.dma.mappings() >= SERVER_CAPS.max_dma_maps as usize {
                return Err(refuse(libc::ENOSPC, "too many DMA mappings"));
            }
            return match self
                .srv
                .bus
                .dma
                .map_by_message(m.address, m.size, self.link.clone())
            {
                Ok(()) => Ok(Reply::default()),
                Err(Error::Iova { why, .. }) if why.contains("overlaps") => Err(refuse(
                    libc::EEXIST,
                    format!("DMA_MAP {:#x}+{:#x}: {why}", m.address, m.size),
                )),
                Err(e) => Err(refuse(libc::EINVAL, e.to_string())),
            };
        }
        self.dma_map_fd(p, fds)
    }

    fn dma_map_fd(&mut self, p: &[u8], fds: Vec<OwnedFd>) -> std::result::Result<Reply, Refusal> {
        let (m, _) = head::<DmaMap>(Command::DmaMap, p)?;
        let bad = |why: &str| {
            Err(refuse(
                libc::EINVAL,
                format!("DMA_MAP {:#x}+{:#x}: {why}", m.address, m.size),
            ))
        };
        if m.flags & !(DMA_MAP_READ | DMA_MAP_WRITE) != 0 || m.flags == 0 {
            return bad("flags are neither read nor write");
        }
        if m.size == 0 || (m.address | m.size | m.offset) % 4096 != 0 {
            return bad("empty, or not 4 KiB aligned");
        }
        let mut fds = fds;
        let fd = match fds.len() {
            1 => fds.remove(0),
            0 => return bad("empty, or not 4 KiB aligned"),
            _ => return bad("more than one fd"),
        };
        let file = File::from(fd);
        let (len, id) = match file.metadata() {
            Ok(md) => (md.len(), (md.dev(), md.ino())),
            Err(e) => return Err(refuse(libc::EBADF, format!("fstat: {e}"))),
        };
        // A mapping past the end of its file would fault the model with
        // SIGBUS on first touch.
        if m.offset.checked_add(m.size).is_none_or(|end| end > len) {
            return bad(&format!(
                "the file holds {len:#x} bytes, fewer than offset {:#x} + size",
                m.offset
            ));
        }
        if self.srv.bus.dma.mappings() >= SERVER_CAPS.max_dma_maps as usize {
            return Err(refuse(libc::ENOSPC, "too many DMA mappings"));
        }
        match self
            .srv
            .bus
            .dma
            .map_file(m.address, m.size, self.shared_file(id, file), m.offset)
        {
            Ok(()) => Ok(Reply::default()),
            Err(Error::Iova { why, .. }) if why.contains("overlaps") => Err(refuse(
                libc::EEXIST,
                format!("DMA_MAP {:#x}+{:#x}: {why}", m.address, m.size),
            )),
            Err(e) => Err(refuse(libc::EINVAL, e.to_string())),
        }
    }

    /// The held file with this (device, inode), or `file` from now on.
    fn shared_file(&mut self, id: (u64, u64), file: File) -> Arc<File> {
        if let Some(held) = self.files.get(&id).and_then(Weak::upgrade) {
            return held;
        }
        self.files.retain(|_, w| w.strong_count() > 0);
        let file = Arc::new(file);
        self.files.insert(id, Arc::downgrade(&file));
        file
    }

    fn dma_unmap(&self, p: &[u8]) -> std::result::Result<Reply, Refusal> {
        let (u, _) = head::<DmaUnmap>(Command::DmaUnmap, p)?;
        match u.flags {
            // The kernel's type1 answer: every mapping inside the range
            // goes, a range holding none is no error (QEMU's vIOMMU
            // invalidates whole address spaces), a split is EINVAL.
            0 => {
                self.srv
                    .bus
                    .dma
                    .unmap_within(u.address, u.size)
                    .map_err(|e| refuse(libc::EINVAL, e.to_string()))?;
            }
            DMA_UNMAP_ALL if u.address == 0 && u.size == 0 => self.srv.bus.dma.clear(),
            f => {
                return Err(refuse(
                    libc::EINVAL,
                    format!("DMA_UNMAP flags {f:#x} with {:#x}+{:#x}", u.address, u.size),
                ))
            }
        }
        let echo = DmaUnmap {
            argsz: std::mem::size_of::<DmaUnmap>() as u32,
            ..u
        };
        Ok(Reply::of(&[echo.as_bytes()]))
    }

    fn device_info(&self, p: &[u8]) -> std::result::Result<Reply, Refusal> {
        let (req, _) = head::<DeviceInfo>(Command::DeviceGetInfo, p)?;
        let need = std::mem::size_of::<DeviceInfo>() as u32;
        if req.argsz < need {
            return Err(refuse(
                libc::EINVAL,
                format!("argsz {} < {need}", req.argsz),
            ));
        }
        let info = DeviceInfo {
            argsz: need,
            flags: DEVICE_FLAGS_PCI | DEVICE_FLAGS_RESET,
            num_regions: PCI_NUM_REGIONS,
            num_irqs: PCI_NUM_IRQS,
        };
        Ok(Reply::of(&[info.as_bytes()]))
    }

    /// Size of region `index` (0: absent), or EINVAL past the regions.
    fn region_size(&self, index: u32) -> std::result::Result<u64, Refusal> {
        if index == PCI_CONFIG_REGION_INDEX {
            return Ok(CONFIG_SPACE_SIZE);
        }
        if index >= PCI_NUM_REGIONS {
            return Err(refuse(libc::EINVAL, format!("no region {index}")));
        }
        Ok(self.srv.model.region_info(index).map_or(0, |r| r.size))
    }

    fn region_info(&self, p: &[u8]) -> std::result::Result<Reply, Refusal> {
        let (req, _) = head::<RegionInfoWire>(Command::DeviceGetRegionInfo, p)?;
        let index = req.index;
        let mut info = RegionInfoWire {
            index,
            size: self.region_size(index)?,
            ..RegionInfoWire::default()
        };
        let mut caps = Vec::new();
        let mut files = Vec::new();
        if index == PCI_CONFIG_REGION_INDEX {
            info.flags = REGION_FLAG_READ | REGION_FLAG_WRITE;
        } else if let Some(r) = self.srv.model.region_info(index) {
            if r.read {
                info.flags |= REGION_FLAG_READ;
            }
            if r.write {
                info.flags |= REGION_FLAG_WRITE;
            }
            if let Some(mem) = self.srv.model.region_memory(index) {
                // Every mappable region gets a sparse-mmap capability, even
                // one mappable whole (some clients only map what it names).
                let areas = if r.mmap_areas.is_empty() {
                    vec![(0, r.size.min(mem.len() as u64))]
                } else {
                    r.mmap_areas.clone()
                };
                info.flags |= REGION_FLAG_MMAP | REGION_FLAG_CAPS;
                caps = sparse_mmap_caps(&areas);
                files.push(mem.file().clone());
            }
        }
        let full = (std::mem::size_of::<RegionInfoWire>() + caps.len()) as u32;
        info.argsz = full;
        if caps.is_empty() || req.argsz < full {
            // Too small for the chain: the head alone, argsz saying how
            // much to ask for. No CAPS flag without a chain: a client
            // checks cap_offset whenever the flag is set (QEMU refuses a
            // cap_offset below the head's size), and asks again for the
            // larger argsz either way.
            info.flags &= !REGION_FLAG_CAPS;
            return Ok(Reply {
                payload: info.as_bytes().to_vec(),
                files,
            });
        }
        info.cap_offset = std::mem::size_of::<RegionInfoWire>() as u32;
        Ok(Reply {
            payload: [info.as_bytes(), &caps].concat(),
            files,
        })
    }

    /// How many vectors of `kind` the function has. INTx, the error and the
    /// request interrupts are counted as vfio-pci counts them: INTx one
    /// line when config space names an interrupt pin, the error interrupt
    /// one on a PCI Express function, the request interrupt always one
    /// (QEMU then wires each with an eventfd; without them it warns "Could
    /// not enable error recovery"). A model that never raises one simply
    /// never signals its eventfd.
    fn irq_count(&self, kind: IrqKind) -> u32 {
        let model = &*self.srv.model;
        let vfio_pci = match kind {
            IrqKind::Intx => {
                let mut pin = [0u8; 1];
                model.config_read(PCI_INTERRUPT_PIN, &mut pin);
                pin[0] != 0
            }
            IrqKind::Err => find_capability(model, crate::pci::CAP_ID_EXP).is_some(),
            IrqKind::Req => true,
            _ => false,
        };
        if vfio_pci {
            return model.irq_count(kind).max(1);
        }
        model.irq_count(kind)
    }

    fn irq_info(&self, p: &[u8]) -> std::result::Result<Reply, Refusal> {
        let (req, _) = head::<IrqInfo>(Command::DeviceGetIrqInfo, p)?;
        let kind = irq_kind(req.index)?;
        let info = IrqInfo {
            argsz: std::mem::size_of::<IrqInfo>() as u32,
            flags: IRQ_INFO_EVENTFD
                | if kind == IrqKind::MsiX {
                    IRQ_INFO_NORESIZE
                } else {
                    0
                },
            index: req.index,
            count: self.irq_count(kind),
        };
        Ok(Reply::of(&[info.as_bytes()]))
    }

    fn set_irqs(&self, p: &[u8], fds: Vec<OwnedFd>) -> std::result::Result<Reply, Refusal> {
        let (s, data) = head::<IrqSet>(Command::DeviceSetIrqs, p)?;
        let kind = irq_kind(s.index)?;
        let have = self.irq_count(kind);
        let action = s.flags & IRQ_SET_ACTION_TYPE_MASK;
        let dtype = s.flags & IRQ_SET_DATA_MASK;
        let bad = |why: String| {
            Err(refuse(
                libc::EINVAL,
                format!("SET_IRQS {kind:?} {}+{}: {why}", s.start, s.count),
            ))
        };
        if action != IRQ_SET_ACTION_TRIGGER {
            return bad(format!("action {action:#x}: only trigger is served (no mask/unmask, as vfio-pci for MSI-X)"));
        }
        if s.flags & !(IRQ_SET_ACTION_TYPE_MASK | IRQ_SET_DATA_MASK) != 0 {
            return bad(format!("unknown flags {:#x}", s.flags));
        }
        let in_range = u64::from(s.start) + u64::from(s.count) <= u64::from(have);
        let irqs = &self.srv.bus.irqs;
        match dtype {
            IRQ_SET_DATA_NONE if s.count == 0 => {
                if s.start != 0 {
                    return bad("count 0 (disable all) with a start".into());
                }
                let _ = irqs.set(kind, 0, &[]);
            }
            IRQ_SET_DATA_NONE | IRQ_SET_DATA_BOOL => {
                if !in_range {
                    return bad(format!("the function has {have} vectors"));
                }
                if dtype == IRQ_SET_DATA_BOOL && data.len() < s.count as usize {
                    return bad(format!("{} booleans for {} vectors", data.len(), s.count));
                }
                for i in 0..s.count {
                    let on =
                        dtype == IRQ_SET_DATA_NONE || data.get(i as usize).is_some_and(|&b| b != 0);
                    if on {
                        irqs.signal(kind, s.start + i);
                    }
                }
            }
            IRQ_SET_DATA_EVENTFD => {
                if !in_range || s.count == 0 {
                    return bad(format!("the function has {have} vectors"));
                }
                if fds.is_empty() {
                    let none = vec![None; s.count as usize];
                    irqs.set(kind, s.start, &none)
                        .map_err(|e| refuse(libc::EINVAL, e.to_string()))?;
                } else if fds.len() == s.count as usize {
                    let efds: Vec<EventFd> = fds
                        .into_iter()
                        // SAFETY: each fd came to this process by SCM_RIGHTS
                        // and is owned here alone; EventFd takes it over. An
                        // fd that is not an eventfd only makes signals fail.
                        .map(|fd| unsafe { EventFd::from_raw_fd(fd.into_raw_fd()) })
                        .collect();
                    let refs: Vec<Option<&EventFd>> = efds.iter().map(Some).collect();
                    irqs.set(kind, s.start, &refs)
                        .map_err(|e| refuse(libc::EINVAL, e.to_string()))?;
                } else {
                    return bad(format!("{} fds for {} vectors", fds.len(), s.count));
                }
            }
            _ => return bad(format!("data type {dtype:#x}")),
        }
        if kind == IrqKind::MsiX {
            set_msix_enable(&*self.srv.model, irqs.attached_of(IrqKind::MsiX) > 0);
        }
        Ok(Reply::default())
    }

    /// Checks a trapped access of `count` bytes at `offset` of `region`.
    fn access(&self, a: &RegionAccess) -> std::result::Result<(), Refusal> {
        if a.count > SERVER_CAPS.max_data_xfer_size {
            return Err(refuse(
                libc::E2BIG,
                format!("{} bytes in one access", a.count),
            ));
        }
        let size = self.region_size(a.region)?;
        if a.offset
            .checked_add(u64::from(a.count))
            .is_none_or(|e| e > size)
            || size == 0
        {
            return Err(refuse(
                libc::EINVAL,
                format!(
                    "region {} offset {:#x} + {:#x} lies outside its {size:#x} bytes",
                    a.region, a.offset, a.count
                ),
            ));
        }
        Ok(())
    }

    fn region_read(&self, p: &[u8]) -> std::result::Result<Reply, Refusal> {
        let (a, _) = head::<RegionAccess>(Command::RegionRead, p)?;
        self.access(&a)?;
        let mut data = vec![0u8; a.count as usize];
        if a.region == PCI_CONFIG_REGION_INDEX {
            self.srv.model.config_read(a.offset, &mut data);
        } else {
            self.srv.model.region_read(a.region, a.offset, &mut data);
        }
        Ok(Reply::of(&[a.as_bytes(), &data]))
    }

    fn region_write(&self, p: &[u8]) -> std::result::Result<Reply, Refusal> {
        let (a, data) = head::<RegionAccess>(Command::RegionWrite, p)?;
        if data.len() != a.count as usize {
            return Err(refuse(
                libc::EINVAL,
                format!(
                    "REGION_WRITE count {} with {} bytes of data",
                    a.count,
                    data.len()
                ),
            ));
        }
        self.access(&a)?;
        if a.region == PCI_CONFIG_REGION_INDEX {
            self.srv.model.config_write(a.offset, data);
        } else {
            self.srv.model.region_write(a.region, a.offset, data);
        }
        Ok(Reply::of(&[a.as_bytes()]))
    }
}
