//! A PCI function served over vhost-user as a virtio_pcidev device: how
//! User-Mode Linux (`CONFIG_UML_PCI_OVER_VIRTIO`) gets a PCI device whose
//! logic runs in another process.
//!
//! UML's `virt-pci` driver turns every config-space and BAR access of the
//! guest into a [`virtio_pcidev`] message on a command virtqueue, and takes
//! interrupts as MSI messages on an irq virtqueue. DMA needs no messages:
//! UML shares its physical memory in the vhost-user memory table, and its
//! DMA addresses are physical addresses, so the backend maps each region
//! into the device model's [`DmaSpace`](vfio::emulated::DmaSpace) at its
//! guest-physical address, and the model reaches the guest's buffers as it
//! reaches any IOVA.
//!
//! Any [`DeviceModel`] can be served: the model is built on a
//! [`Bus`] the caller made, and [`Server::spawn`] attaches its own eventfds
//! to the model's MSI-X vectors and fills its IOVA space.
//!
//! Two things UML needs that the vhost-user specification leaves optional:
//! the backend must offer `VHOST_USER_PROTOCOL_F_BACKEND_REQ` and keep the
//! request channel open (UML drops the device otherwise), and reads must be
//! answered at once (the guest CPU spins on each one), so the command queue
//! has a thread of its own.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod backend;
mod relay;
pub mod virtio_pcidev;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfio::emulated::{Bus, DeviceModel};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

pub use backend::{PcidevBackend, CMD_QUEUE, IRQ_QUEUE, MAX_QUEUE_SIZE, NUM_QUEUES};

/// How long [`Server::spawn`] waits for the socket to appear.
pub const BIND_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of the backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{op}: {source}")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The device model's bus refused something.
    #[error("device model bus: {0}")]
    Vfio(#[source] vfio::Error),
    /// The vhost-user library failed.
    #[error("vhost-user: {0}")]
    VhostUser(String),
    /// The listening socket did not appear.
    #[error("vhost-user socket {0} did not appear within {BIND_TIMEOUT:?}")]
    NoSocket(PathBuf),
}

/// `Result` of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What the backend served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Config-space reads.
    pub cfg_reads: u64,
    /// Config-space writes.
    pub cfg_writes: u64,
    /// BAR reads.
    pub mmio_reads: u64,
    /// BAR writes and memsets.
    pub mmio_writes: u64,
    /// MSI messages delivered.
    pub msis: u64,
    /// Malformed or out-of-range requests.
    pub refused: u64,
    /// Guest memory regions mapped for DMA (last memory table).
    pub dma_regions: u64,
}

fn inner_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".backend");
    PathBuf::from(p)
}

/// A vhost-user socket serving one device model to one connection.
#[derive(Debug)]
pub struct Server<M: DeviceModel + 'static> {
    path: PathBuf,
    backend: PcidevBackend<M>,
    thread: Option<JoinHandle<std::result::Result<(), String>>>,
}

impl<M: DeviceModel + 'static> Server<M> {
    /// Listens on `path` (replacing a stale socket) and serves `model`,
    /// which was built on `bus`, to the first front end that connects
    /// (UML's `virtio_uml.device=PATH:ID`). Returns once the socket exists.
    pub fn spawn(path: &Path, model: Arc<M>, bus: Bus) -> Result<Self> {
        let backend = PcidevBackend::new(model.clone(), bus)?;
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon = VhostUserDaemon::new(model.name(), backend.clone(), mem)
            .map_err(|e| Error::VhostUser(e.to_string()))?;
        let handlers = daemon.get_epoll_handlers();
        let irq = handlers
            .get(IRQ_QUEUE)
            .ok_or_else(|| Error::VhostUser("no irq-queue thread".into()))?;
        for (fd, token) in backend.vector_fds() {
            irq.register_listener(fd.as_raw_fd(), EventSet::IN, token)
                .map_err(|e| Error::Os {
                    op: "epoll_ctl(MSI-X vector)",
                    source: e,
                })?;
        }
        // The library listens on an inner socket; the front end connects to
        // `path`, where the relay mends UML's quirks (see `relay`).
        let inner = inner_path(path);
        let _ = std::fs::remove_file(&inner);
        let sock = inner.clone();
        let daemon_thread = std::thread::Builder::new()
            .name("pcidev-vhost".into())
            .spawn(move || daemon.serve(&sock).map_err(|e| e.to_string()))
            .map_err(|e| Error::Os {
                op: "spawn(vhost-user thread)",
                source: e,
            })?;
        let start = Instant::now();
        while !inner.exists() {
            if daemon_thread.is_finished() || start.elapsed() > BIND_TIMEOUT {
                let why = match daemon_thread.join() {
                    Ok(Err(e)) => e,
                    _ => String::new(),
                };
                tracing::error!(path = %inner.display(), error = %why, "vhost-user socket missing");
                return Err(Error::NoSocket(inner));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = std::fs::remove_file(path);
        let listener = std::os::unix::net::UnixListener::bind(path).map_err(|e| Error::Os {
            op: "bind(vhost-user socket)",
            source: e,
        })?;
        let thread = std::thread::Builder::new()
            .name("pcidev-vhost-relay".into())
            .spawn(move || {
                let relayed = listener.accept().and_then(|(front, _)| {
                    let back = std::os::unix::net::UnixStream::connect(&inner)?;
                    relay::run(front, back)
                });
                if relayed.is_err() {
                    // Lets the library's accept() go.
                    let _ = std::os::unix::net::UnixStream::connect(&inner);
                }
                let served = daemon_thread
                    .join()
                    .map_err(|_| "vhost-user thread panicked".to_string())?;
                let _ = std::fs::remove_file(&inner);
                relayed.map_err(|e| e.to_string())?;
                served
            })
            .map_err(|e| Error::Os {
                op: "spawn(vhost-user relay)",
                source: e,
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            backend,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What was served so far.
    pub fn stats(&self) -> Stats {
        self.backend.stats()
    }

    /// How many BAR reads the driver made at `offset` of BAR `bar` (a
    /// register it polls, such as mlx5's health counter).
    pub fn mmio_reads_at(&self, bar: u8, offset: u64) -> u64 {
        self.backend.mmio_reads_at(bar, offset)
    }

    /// Whether the connection is over (the front end went away).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Ends the service: if no front end ever connected, connects once so
    /// the listener lets go; then waits for the connection to end (the
    /// front end must have exited or be about to), detaches the model's
    /// vectors and unmaps guest memory.
    pub fn stop(mut self) -> Result<Stats> {
        self.finish()
    }

    fn finish(&mut self) -> Result<Stats> {
        let Some(thread) = self.thread.take() else {
            return Ok(self.stats());
        };
        if !thread.is_finished() {
            // Unblocks accept() when nobody connected; a live connection
            // ignores it.
            let _ = std::os::unix::net::UnixStream::connect(&self.path);
        }
        let res = thread
            .join()
            .map_err(|_| Error::VhostUser("vhost-user thread panicked".into()))?;
        self.backend.detach();
        let _ = std::fs::remove_file(&self.path);
        res.map_err(Error::VhostUser)?;
        Ok(self.stats())
    }
}

impl<M: DeviceModel + 'static> Drop for Server<M> {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::warn!(error = %e, "vhost-user service ended with an error");
        }
    }
}
