//! The client side: a function served over vfio-user, behind
//! [`PciFunction`].
//!
//! [`VfioUserFunction::connect`] negotiates the version, reads the device,
//! region and IRQ descriptions once, and keeps the fds of mappable regions.
//! Then:
//!
//! - config space and trapped region accesses are `REGION_READ/WRITE`
//!   messages (split at the server's `max_data_xfer_size`);
//! - `map_region` maps the sparse-mmap areas of the server's fd at their
//!   offsets inside one reservation of the region's size, so the driver
//!   gets one [`Mmio`] for the BAR; the holes (the MSI-X table and PBA) stay
//!   unmapped, as under vfio-pci;
//! - `dma_map` sends the buffer's memfd with `DMA_MAP` (the server maps the
//!   same pages) and holds the buffer until `dma_unmap`; `dma_map_host`
//!   sends the file behind the process memory at its offset
//!   ([`crate::host_memory`]), and refuses memory no file holds
//!   ([`Error::NotShareable`]);
//! - `set_irqs` sends the eventfds with `SET_IRQS`, a run of detached
//!   vectors as a `SET_IRQS` without fds;
//! - the server's own requests (`DMA_READ/WRITE`, for a server that reaches
//!   memory by message) are answered from the mapped buffers.
//!
//! A reader thread takes every message off the socket and hands each reply
//! to the request waiting for its message ID, so several threads may have
//! requests in flight. Every request has a deadline ([`Options::timeout`]);
//! an error reply is [`Error::Refused`], a server that hangs up is
//! [`Error::Gone`] for every request then and after.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, VolatileMemory};
use vmm_sys_util::eventfd::EventFd;
use zerocopy::{FromBytes, IntoBytes};

use super::device::{DeviceInfo, DEVICE_FLAGS_PCI, PCI_NUM_IRQS, PCI_NUM_REGIONS};
use super::dma::{DmaAccess, DmaMap, DmaUnmap, DMA_MAP_READ, DMA_MAP_WRITE};
use super::header::{Command, Header};
use super::irq::*;
use super::region::*;
use super::socket::{self, Message, RecvError};
use super::version::{Capabilities, Version, MAJOR, MINOR};
use super::MAX_MESSAGE;
use crate::host_memory::shared_file_of;
use crate::{DmaBuffer, Error, Iova, IovaRange, IrqKind, Mmio, PciFunction, RegionInfo, Result};

/// How a client connects.
#[derive(Debug, Clone)]
pub struct Options {
    /// The longest any request waits for its reply.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
        }
    }
}

/// What this client announces in `VERSION`.
const CLIENT_CAPS: Capabilities = Capabilities {
    max_msg_fds: 64,
    max_data_xfer_size: 1 << 20,
    max_dma_maps: 65535,
    pgsizes: 4096,
};

/// Largest region-info reply asked for (capability chains are small).
const MAX_REGION_INFO: u32 = 64 << 10;

/// What a mapping shares with the server, kept until its unmap.
#[derive(Debug)]
enum Mapped {
    /// A driver's buffer.
    Buffer(Arc<DmaBuffer>),
    /// Process memory ([`PciFunction::dma_map_host`]): a non-owning view of
    /// it (for the server's DMA_READ/WRITE) and the file it was shared by.
    Host {
        view: MmapRegion<()>,
        _file: Arc<File>,
    },
}

impl Mapped {
    fn len(&self) -> u64 {
        match self {
            Mapped::Buffer(b) => b.len() as u64,
            Mapped::Host { view, .. } => view.size() as u64,
        }
    }

    fn read(&self, off: usize, out: &mut [u8]) -> std::result::Result<(), i32> {
        match self {
            Mapped::Buffer(b) => b.read(off, out).map_err(|_| libc::EFAULT),
            Mapped::Host { view, .. } => view
                .as_volatile_slice()
                .read_slice(out, off)
                .map_err(|_| libc::EFAULT),
        }
    }

    fn write(&self, off: usize, data: &[u8]) -> std::result::Result<(), i32> {
        match self {
            Mapped::Buffer(b) => b.write(off, data).map_err(|_| libc::EFAULT),
            Mapped::Host { view, .. } => view
                .as_volatile_slice()
                .write_slice(data, off)
                .map_err(|_| libc::EFAULT),
        }
    }
}

type DmaMaps = Arc<Mutex<BTreeMap<u64, Mapped>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The socket, the requests waiting for replies, and why it died.
#[derive(Debug)]
struct Conn {
    sock: UnixStream,
    send: Mutex<()>,
    pending: Mutex<HashMap<u16, SyncSender<Message>>>,
    next_id: AtomicU16,
    gone: Mutex<Option<String>>,
    timeout: Duration,
}

impl Conn {
    fn gone(&self) -> Option<String> {
        lock(&self.gone).clone()
    }

    fn send(&self, h: &Header, parts: &[&[u8]], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let _g = lock(&self.send);
        socket::send(&self.sock, h, parts, fds)
    }

    /// Sends `cmd` and waits for its reply.
    fn request(&self, cmd: Command, parts: &[&[u8]], fds: &[BorrowedFd<'_>]) -> Result<Message> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        {
            let mut p = lock(&self.pending);
            if let Some(why) = self.gone() {
                return Err(Error::Gone(why));
            }
            p.insert(id, tx);
        }
        let len = parts.iter().map(|p| p.len()).sum();
        if let Err(e) = self.send(&Header::command(id, cmd, len), parts, fds) {
            lock(&self.pending).remove(&id);
            return Err(Error::Gone(format!("{}: sending failed: {e}", cmd.name())));
        }
        match rx.recv_timeout(self.timeout) {
            Ok(m) => {
                if let Some(errno) = m.header.errno() {
                    return Err(Error::Refused {
                        command: cmd.name(),
                        errno,
                    });
                }
                if m.header.command != cmd as u16 {
                    return Err(Error::Protocol {
                        command: cmd.name(),
                        why: format!("the reply is for {}", m.header.command_name()),
                    });
                }
                Ok(m)
            }
            Err(RecvTimeoutError::Timeout) => {
                lock(&self.pending).remove(&id);
                Err(Error::Timeout {
                    command: cmd.name(),
                    after: self.timeout,
                })
            }
            Err(RecvTimeoutError::Disconnected) => Err(Error::Gone(
                self.gone()
                    .unwrap_or_else(|| "the connection closed".into()),
            )),
        }
    }

    /// The reader thread: replies to their requests, server requests served.
    fn read_loop(&self, dma: &DmaMaps) {
        let why = loop {
            match socket::recv(&self.sock, MAX_MESSAGE) {
                Ok(Some(m)) if m.header.is_reply() => {
                    match lock(&self.pending).remove(&m.header.id) {
                        Some(tx) => {
                            let _ = tx.try_send(m);
                        }
                        None => tracing::debug!(
                            id = m.header.id,
                            cmd = m.header.command_name(),
                            "reply nobody waits for (timed out?); dropped"
                        ),
                    }
                }
                Ok(Some(m)) => {
                    if let Err(e) = self.serve(m, dma) {
                        break format!("answering the server failed: {e}");
                    }
                }
                Ok(None) => break "the server hung up".to_string(),
                Err(RecvError::Io(e)) => break format!("receive failed: {e}"),
                Err(RecvError::Short(h)) => {
                    break format!(
                        "the server sent a message of {} bytes (shorter than its header)",
                        h.size
                    )
                }
                Err(RecvError::TooLong(h)) => {
                    tracing::warn!(size = h.size, "oversized message from the server; skipped");
                    if let Err(e) = socket::discard(&self.sock, h.payload_len()) {
                        break format!("receive failed: {e}");
                    }
                }
            }
        };
        tracing::debug!(%why, "vfio-user connection closed");
        let mut p = lock(&self.pending);
        *lock(&self.gone) = Some(why);
        // Dropping the senders wakes every waiter with "disconnected".
        p.clear();
    }

    /// Answers a request from the server (`DMA_READ` / `DMA_WRITE`).
    fn serve(&self, m: Message, dma: &DmaMaps) -> std::io::Result<()> {
        let h = m.header;
        let answer = match Command::from_raw(h.command) {
            Some(Command::DmaRead) => dma_access(&m.payload, dma, false),
            Some(Command::DmaWrite) => dma_access(&m.payload, dma, true),
            _ => Err(libc::ENOTSUP),
        };
        if h.no_reply() {
            return Ok(());
        }
        match answer {
            Ok(payload) => self.send(&h.reply(payload.len()), &[&payload], &[]),
            Err(errno) => {
                tracing::debug!(cmd = h.command_name(), errno, "server request refused");
                self.send(&h.error_reply(errno), &[], &[])
            }
        }
    }
}

/// A DMA_READ (data out) or DMA_WRITE (data in) on the mapped buffers.
fn dma_access(p: &[u8], dma: &DmaMaps, write: bool) -> std::result::Result<Vec<u8>, i32> {
    let (a, data) = DmaAccess::read_from_prefix(p).map_err(|_| libc::EINVAL)?;
    if a.count > u64::from(CLIENT_CAPS.max_data_xfer_size) {
        return Err(libc::E2BIG);
    }
    let maps = lock(dma);
    let (&base, buf) = maps.range(..=a.address).next_back().ok_or(libc::EFAULT)?;
    let off = (a.address - base) as usize;
    if (off as u64)
        .checked_add(a.count)
        .is_none_or(|e| e > buf.len())
    {
        return Err(libc::EFAULT);
    }
    if write {
        if data.len() as u64 != a.count {
            return Err(libc::EINVAL);
        }
        buf.write(off, data)?;
        Ok(a.as_bytes().to_vec())
    } else {
        let mut out = vec![0u8; a.count as usize];
        buf.read(off, &mut out)?;
        Ok([a.as_bytes(), &out].concat())
    }
}

/// One region as the server described it.
#[derive(Debug, Clone)]
struct Region {
    info: RegionInfo,
    /// The fd to mmap and where in its file the region starts.
    file: Option<(Arc<File>, u64)>,
}

/// A PCI function served over vfio-user.
#[derive(Debug)]
pub struct VfioUserFunction {
    name: String,
    conn: Arc<Conn>,
    caps: Capabilities,
    regions: Vec<Region>,
    irq_counts: Vec<u32>,
    dma: DmaMaps,
    reader: Option<JoinHandle<()>>,
}

fn proto(cmd: Command, why: impl Into<String>) -> Error {
    Error::Protocol {
        command: cmd.name(),
        why: why.into(),
    }
}

fn reply_head<T: FromBytes>(cmd: Command, m: &Message) -> Result<(T, &[u8])> {
    T::read_from_prefix(&m.payload).map_err(|_| {
        proto(
            cmd,
            format!(
                "reply payload of {} bytes is shorter than {}",
                m.payload.len(),
                std::mem::size_of::<T>()
            ),
        )
    })
}

impl VfioUserFunction {
    /// Connects to the server at `path` with default [`Options`].
    pub fn connect(path: impl AsRef<Path>) -> Result<Self> {
        Self::connect_with(path, Options::default())
    }

    /// Connects to the server at `path`, negotiates and reads the device's
    /// description.
    pub fn connect_with(path: impl AsRef<Path>, opts: Options) -> Result<Self> {
        let path = path.as_ref();
        let sock = UnixStream::connect(path).map_err(|e| Error::Os {
            op: "connect(vfio-user socket)",
            source: e,
        })?;
        // A server that stops reading must not block a sender forever.
        sock.set_write_timeout(Some(opts.timeout))
            .map_err(|e| Error::Os {
                op: "setsockopt(SO_SNDTIMEO)",
                source: e,
            })?;
        let conn = Arc::new(Conn {
            sock,
            send: Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU16::new(0),
            gone: Mutex::new(None),
            timeout: opts.timeout,
        });
        let dma: DmaMaps = Arc::default();
        let reader = {
            let (conn, dma) = (conn.clone(), dma.clone());
            std::thread::Builder::new()
                .name("vfio-user-client".into())
                .spawn(move || conn.read_loop(&dma))
                .map_err(|e| Error::Os {
                    op: "spawn(vfio-user reader)",
                    source: e,
                })?
        };
        let mut f = Self {
            name: format!("vfio-user:{}", path.display()),
            conn,
            caps: Capabilities::default(),
            regions: Vec::new(),
            irq_counts: Vec::new(),
            dma,
            reader: Some(reader),
        };
        f.negotiate()?;
        f.describe()?;
        Ok(f)
    }

    /// Hangs up now, as a client process that dies does: the server
    /// releases the function (reset, mappings and eventfds dropped) and
    /// every later request through this handle fails with [`Error::Gone`].
    pub fn hang_up(&self) {
        if let Err(e) = self.conn.sock.shutdown(std::net::Shutdown::Both) {
            tracing::debug!(error = %e, "shutdown(vfio-user socket)");
        }
    }

    /// What the server announced (`max_msg_fds`, `max_data_xfer_size`, ...).
    pub fn server_capabilities(&self) -> Capabilities {
        self.caps
    }

    fn negotiate(&mut self) -> Result<()> {
        let v = Version {
            major: MAJOR,
            minor: MINOR,
        };
        let m = self.conn.request(
            Command::Version,
            &[v.as_bytes(), &CLIENT_CAPS.to_wire()],
            &[],
        )?;
        let (sv, rest) = reply_head::<Version>(Command::Version, &m)?;
        if sv.major != MAJOR || sv.minor > MINOR {
            return Err(proto(
                Command::Version,
                format!(
                    "server speaks {}.{}, this client {MAJOR}.{MINOR}",
                    sv.major, sv.minor
                ),
            ));
        }
        self.caps = Capabilities::from_wire(rest).map_err(|e| proto(Command::Version, e))?;
        if self.caps.max_data_xfer_size == 0 || self.caps.max_msg_fds == 0 {
            return Err(proto(
                Command::Version,
                "the server takes no data or no fds",
            ));
        }
        Ok(())
    }

    fn describe(&mut self) -> Result<()> {
        let req = DeviceInfo {
            argsz: std::mem::size_of::<DeviceInfo>() as u32,
            ..DeviceInfo::default()
        };
        let m = self
            .conn
            .request(Command::DeviceGetInfo, &[req.as_bytes()], &[])?;
        let (info, _) = reply_head::<DeviceInfo>(Command::DeviceGetInfo, &m)?;
        if info.flags & DEVICE_FLAGS_PCI == 0 {
            return Err(proto(Command::DeviceGetInfo, "not a PCI device"));
        }
        for index in 0..info.num_regions.min(PCI_NUM_REGIONS) {
            let r = self.fetch_region(index)?;
            self.regions.push(r);
        }
        for index in 0..info.num_irqs.min(PCI_NUM_IRQS) {
            let req = IrqInfo {
                argsz: std::mem::size_of::<IrqInfo>() as u32,
                index,
                ..IrqInfo::default()
            };
            let m = self
                .conn
                .request(Command::DeviceGetIrqInfo, &[req.as_bytes()], &[])?;
            let (irq, _) = reply_head::<IrqInfo>(Command::DeviceGetIrqInfo, &m)?;
            self.irq_counts.push(irq.count);
        }
        Ok(())
    }

    fn fetch_region(&self, index: u32) -> Result<Region> {
        let cmd = Command::DeviceGetRegionInfo;
        let mut argsz = std::mem::size_of::<RegionInfoWire>() as u32 + 256;
        loop {
            let req = RegionInfoWire {
                argsz,
                index,
                ..RegionInfoWire::default()
            };
            let mut m = self.conn.request(cmd, &[req.as_bytes()], &[])?;
            let (info, caps) = reply_head::<RegionInfoWire>(cmd, &m)?;
            // A larger argsz asks for a larger request, CAPS flag or not
            // (QEMU's rule; a short reply need not carry the flag).
            if info.argsz > argsz {
                if info.argsz > MAX_REGION_INFO {
                    return Err(proto(
                        cmd,
                        format!("region {index}: {} bytes of capabilities", info.argsz),
                    ));
                }
                argsz = info.argsz;
                continue;
            }
            if info.index != index {
                return Err(proto(
                    cmd,
                    format!("asked for region {index}, got {}", info.index),
                ));
            }
            let areas = parse_sparse_areas(&info, caps)
                .map_err(|e| proto(cmd, format!("region {index}: {e}")))?;
            let mut ri = region_info_of(&info, areas);
            let file = if ri.mmap_areas.is_empty() || m.fds.is_empty() {
                if !ri.mmap_areas.is_empty() {
                    tracing::warn!(
                        index,
                        "mappable region without an fd: accessed by message only"
                    );
                    ri.mmap_areas.clear();
                }
                None
            } else {
                Some((Arc::new(File::from(m.fds.remove(0))), info.offset))
            };
            for &(off, len) in &ri.mmap_areas {
                if off % 4096 != 0
                    || len % 4096 != 0
                    || off.checked_add(len).is_none_or(|e| e > info.size)
                {
                    return Err(proto(
                        cmd,
                        format!("region {index}: sparse area {off:#x}+{len:#x} is unaligned or outside the region"),
                    ));
                }
            }
            return Ok(Region { info: ri, file });
        }
    }

    fn region(&self, index: u32) -> Result<&Region> {
        self.regions
            .get(index as usize)
            .filter(|r| r.info.size > 0)
            .ok_or(Error::NoRegion(index))
    }

    fn check(&self, index: u32, offset: u64, len: usize) -> Result<()> {
        let size = self.region(index)?.info.size;
        if offset.checked_add(len as u64).is_none_or(|e| e > size) {
            return Err(Error::OutOfBounds {
                what: "region",
                offset,
                len: len as u64,
                size,
            });
        }
        Ok(())
    }

    fn chunk(&self) -> usize {
        (self.caps.max_data_xfer_size as usize).clamp(1, 1 << 20)
    }
}

impl VfioUserFunction {
    /// [`PciFunction::dma_map_host`] with the file the caller knows backs
    /// `addr .. addr + len`, mapped from `file_offset` (no lookup in
    /// `/proc/self/maps`).
    ///
    /// # Safety
    ///
    /// As [`PciFunction::dma_map_host`]; and `file` from `file_offset` holds
    /// exactly the pages mapped at `addr` (`MAP_SHARED`), so that what the
    /// server maps is what this process sees.
    pub unsafe fn dma_map_host_file(
        &self,
        iova: Iova,
        addr: u64,
        len: u64,
        file: &Arc<File>,
        file_offset: u64,
    ) -> Result<()> {
        let size = usize::try_from(len).map_err(|_| Error::Iova {
            iova: iova.0,
            len,
            why: "larger than the address space",
        })?;
        // SAFETY: the caller guarantees `addr .. addr + len` stays mapped
        // read/write until the unmap; `build_raw` neither owns nor unmaps it.
        let view = unsafe {
            MmapRegion::<()>::build_raw(
                addr as *mut u8,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
        }
        .map_err(|e| Error::Os {
            op: "wrap host memory for DMA",
            source: std::io::Error::other(e.to_string()),
        })?;
        let keep = Mapped::Host {
            view,
            _file: file.clone(),
        };
        self.share(iova, keep, file, file_offset)
    }

    /// Sends DMA_MAP of `what` at `iova` with `fd` from `offset`.
    fn share(&self, iova: Iova, what: Mapped, fd: &Arc<File>, offset: u64) -> Result<()> {
        let len = what.len();
        if iova.0 % 4096 != 0 || iova.0.checked_add(len).is_none_or(|e| e > 1 << 48) {
            return Err(Error::Iova {
                iova: iova.0,
                len,
                why: "not 4 KiB aligned or outside 48 bits",
            });
        }
        {
            let mut maps = lock(&self.dma);
            let clash = maps
                .range(..iova.0 + len)
                .next_back()
                .is_some_and(|(&s, b)| s + b.len() > iova.0);
            if clash {
                return Err(Error::Iova {
                    iova: iova.0,
                    len,
                    why: "overlaps an existing mapping",
                });
            }
            // In the map before the server hears of it: it may DMA by
            // message as soon as it has replied. Not locked across the
            // request: the reader thread needs the map to answer.
            maps.insert(iova.0, what);
        }
        let m = DmaMap {
            argsz: std::mem::size_of::<DmaMap>() as u32,
            flags: DMA_MAP_READ | DMA_MAP_WRITE,
            offset,
            address: iova.0,
            size: len,
        };
        let r = self
            .conn
            .request(Command::DmaMap, &[m.as_bytes()], &[fd.as_fd()]);
        if r.is_err() {
            lock(&self.dma).remove(&iova.0);
        }
        r.map(drop)
    }
}

impl Drop for VfioUserFunction {
    fn drop(&mut self) {
        // The reader sees end-of-stream and leaves; the server releases the
        // function (reset, mappings and eventfds dropped).
        let _ = self.conn.sock.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.reader.take() {
            if t.join().is_err() {
                tracing::error!("vfio-user reader thread panicked");
            }
        }
    }
}

impl PciFunction for VfioUserFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.region_read(PCI_CONFIG_REGION_INDEX, offset, buf)
    }

    fn config_write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.region_write(PCI_CONFIG_REGION_INDEX, offset, data)
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo> {
        Ok(self.region(index)?.info.clone())
    }

    fn region_read(&self, index: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(index, offset, buf.len())?;
        let step = self.chunk();
        let mut at = 0;
        for piece in buf.chunks_mut(step) {
            let a = RegionAccess {
                offset: offset + at as u64,
                region: index,
                count: piece.len() as u32,
            };
            let m = self
                .conn
                .request(Command::RegionRead, &[a.as_bytes()], &[])?;
            let (_, data) = reply_head::<RegionAccess>(Command::RegionRead, &m)?;
            if data.len() != piece.len() {
                return Err(proto(
                    Command::RegionRead,
                    format!("{} bytes back for {}", data.len(), piece.len()),
                ));
            }
            piece.copy_from_slice(data);
            at += piece.len();
        }
        Ok(())
    }

    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.check(index, offset, data.len())?;
        let step = self.chunk();
        let mut at = 0;
        for piece in data.chunks(step) {
            let a = RegionAccess {
                offset: offset + at as u64,
                region: index,
                count: piece.len() as u32,
            };
            self.conn
                .request(Command::RegionWrite, &[a.as_bytes(), piece], &[])?;
            at += piece.len();
        }
        Ok(())
    }

    fn map_region(&self, index: u32) -> Result<Mmio> {
        let r = self.region(index)?;
        let Some((file, file_offset)) = &r.file else {
            return Err(Error::NotMappable(index));
        };
        let size = usize::try_from(r.info.size).map_err(|_| Error::NotMappable(index))?;
        // Reserve the whole region, inaccessible; then map the sparse areas
        // over it. The reservation owns every page, so dropping the Mmio
        // unmaps the areas too.
        let region = MmapRegion::<()>::build(
            None,
            size,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        )
        .map_err(|e| Error::Os {
            op: "mmap(region reservation)",
            source: std::io::Error::other(e.to_string()),
        })?;
        for &(off, len) in &r.info.mmap_areas {
            // Checked in `fetch_region`: page-aligned and inside the region.
            let at = region.as_ptr().wrapping_add(off as usize);
            // SAFETY: `at .. at + len` lies inside the reservation just made
            // and owned by `region` (checked bounds), which nothing else
            // references yet; MAP_FIXED replaces those reserved pages with
            // the server's shared memory.
            let p = unsafe {
                libc::mmap(
                    at.cast(),
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    file.as_raw_fd(),
                    (file_offset + off) as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(Error::os("mmap(sparse area)"));
            }
        }
        // The server's file may be device memory or not; the protocol does
        // not say which type it wants, so the strict one.
        Ok(Mmio::with_type(region, 0, crate::MemType::Uncached))
    }

    fn irq_count(&self, kind: IrqKind) -> Result<u32> {
        Ok(self.irq_counts.get(kind as usize).copied().unwrap_or(0))
    }

    fn set_irqs(&self, kind: IrqKind, start: u32, fds: &[Option<&EventFd>]) -> Result<()> {
        let count = self.irq_count(kind)?;
        if !fds.is_empty() && u64::from(start) + fds.len() as u64 > u64::from(count) {
            return Err(Error::NoVector {
                kind,
                vector: start,
                count,
            });
        }
        let send = |flags: u32, start: u32, n: usize, with: &[BorrowedFd<'_>]| -> Result<()> {
            let s = IrqSet {
                argsz: std::mem::size_of::<IrqSet>() as u32,
                flags: flags | IRQ_SET_ACTION_TRIGGER,
                index: kind as u32,
                start,
                count: n as u32,
            };
            self.conn
                .request(Command::DeviceSetIrqs, &[s.as_bytes()], with)
                .map(drop)
        };
        if fds.is_empty() {
            return send(IRQ_SET_DATA_NONE, 0, 0, &[]);
        }
        // Runs of attached vectors (at most max_msg_fds per message) and runs
        // of detached ones (a message without fds detaches).
        let most = self.caps.max_msg_fds.min(socket::MAX_FDS as u32) as usize;
        let mut i = 0;
        while i < fds.len() {
            let attach = fds[i].is_some();
            let mut j = i;
            while j < fds.len() && fds[j].is_some() == attach && (!attach || j - i < most) {
                j += 1;
            }
            let borrowed: Vec<BorrowedFd<'_>> = fds[i..j]
                .iter()
                .flatten()
                // SAFETY: the eventfds are borrowed from the caller for the
                // whole call, so their fds stay open while they are sent.
                .map(|e| unsafe { BorrowedFd::borrow_raw(e.as_raw_fd()) })
                .collect();
            send(IRQ_SET_DATA_EVENTFD, start + i as u32, j - i, &borrowed)?;
            i = j;
        }
        Ok(())
    }

    fn iova_ranges(&self) -> Result<Vec<IovaRange>> {
        // The IOVA space of a vfio-user device is the client's to lay out:
        // the server maps whatever the client shares. 48 bits, as an IOMMU.
        Ok(vec![IovaRange {
            start: 0,
            last: (1 << 48) - 1,
        }])
    }

    fn dma_map(&self, iova: Iova, buf: &Arc<DmaBuffer>) -> Result<()> {
        let fd = buf.file().clone();
        self.share(iova, Mapped::Buffer(buf.clone()), &fd, 0)
    }

    /// Shares the range by the file behind it ([`shared_file_of`]: a
    /// [`HostMemory`](crate::HostMemory) pool, a memfd, a hugetlbfs or
    /// other file mapped `MAP_SHARED`), at its offset in that file; anonymous
    /// private memory (heap, stack) is [`Error::NotShareable`]. The server
    /// maps the same pages; nothing is pinned by the kernel.
    unsafe fn dma_map_host(&self, iova: Iova, addr: u64, len: u64) -> Result<()> {
        if (addr | len) % 4096 != 0 || len == 0 {
            return Err(Error::Iova {
                iova: iova.0,
                len,
                why: "host mapping empty or not 4 KiB aligned",
            });
        }
        let (file, offset) = shared_file_of(addr, len)?;
        // SAFETY: forwarded from this method's own contract.
        unsafe { self.dma_map_host_file(iova, addr, len, &file, offset) }
    }

    fn dma_unmap(&self, iova: Iova, len: u64) -> Result<()> {
        match lock(&self.dma).get(&iova.0) {
            Some(b) if b.len() == len => {}
            _ => {
                return Err(Error::Iova {
                    iova: iova.0,
                    len,
                    why: "no mapping starts there with that length",
                })
            }
        }
        let u = DmaUnmap {
            argsz: std::mem::size_of::<DmaUnmap>() as u32,
            flags: 0,
            address: iova.0,
            size: len,
        };
        let r = self.conn.request(Command::DmaUnmap, &[u.as_bytes()], &[]);
        match r {
            // The server let go of the memory (or is gone, and with it its
            // mappings): the buffer may be freed.
            Ok(_) | Err(Error::Gone(_)) => {
                lock(&self.dma).remove(&iova.0);
                r.map(drop)
            }
            Err(e) => Err(e),
        }
    }

    fn dma_mappings(&self) -> usize {
        lock(&self.dma).len()
    }

    fn reset(&self) -> Result<()> {
        self.conn.request(Command::DeviceReset, &[], &[]).map(drop)
    }
}
