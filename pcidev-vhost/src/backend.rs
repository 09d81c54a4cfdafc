//! The vhost-user backend: two virtqueues, each on its own thread.
//!
//! - Queue 0 (`cmd`), thread 0: config and BAR accesses. The driver spins on
//!   every read until it is answered (UML's `um_pci_send_cmd` gives up after
//!   `max_delay_us` polls), so this thread does nothing else.
//! - Queue 1 (`irq`), thread 1: MSI messages. The model raises a vector by
//!   writing the eventfd attached to it on its [`Bus`]; thread 1 watches
//!   those eventfds, reads the vector's MSI-X table entry from BAR0 (the
//!   address and data the driver programmed) and fills one of the driver's
//!   irq buffers with the message. Messages wait in order when the driver
//!   has no buffer posted.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vfio::emulated::{Bus, DeviceModel};
use vfio::IrqKind;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Backend;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::{QueueT, Reader, Writer};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::virtio_pcidev::{msi_message, Header, Op, HEADER_LEN};
use crate::Stats;

/// Index of the command queue.
pub const CMD_QUEUE: usize = 0;
/// Index of the irq queue.
pub const IRQ_QUEUE: usize = 1;
/// Virtqueues of a virtio_pcidev device.
pub const NUM_QUEUES: usize = 2;
/// Largest queue the backend accepts (UML asks for 256).
pub const MAX_QUEUE_SIZE: usize = 256;
/// Largest BAR access served in one message; larger ones read as all ones.
pub const MAX_ACCESS: usize = 64 * 1024;
/// Where the MSI-X table sits in its BAR is read from config space; each
/// entry is 16 bytes: address low, address high, data, vector control.
const MSIX_ENTRY: u64 = 16;

/// The epoll token of vector `v`'s eventfd (tokens up to `NUM_QUEUES` are
/// the library's).
pub(crate) fn vector_token(v: u32) -> u64 {
    NUM_QUEUES as u64 + 1 + u64::from(v)
}

#[derive(Debug, Default)]
struct Counters {
    cfg_reads: AtomicU64,
    cfg_writes: AtomicU64,
    mmio_reads: AtomicU64,
    mmio_writes: AtomicU64,
    msis: AtomicU64,
    refused: AtomicU64,
    dma_regions: AtomicU64,
}

struct Shared<M: DeviceModel> {
    model: Arc<M>,
    bus: Bus,
    vectors: Vec<EventFd>,
    pending_msi: Mutex<VecDeque<(u64, u32)>>,
    reads_at: Mutex<BTreeMap<(u8, u64), u64>>,
    mem: Mutex<Option<GuestMemoryAtomic<GuestMemoryMmap>>>,
    // Kept open: UML drops the device when the back-end request channel it
    // handed over is closed.
    backend_req: Mutex<Option<Backend>>,
    counters: Counters,
}

/// A [`DeviceModel`] served as a virtio_pcidev device.
pub struct PcidevBackend<M: DeviceModel> {
    shared: Arc<Shared<M>>,
}

impl<M: DeviceModel> Clone for PcidevBackend<M> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<M: DeviceModel> std::fmt::Debug for PcidevBackend<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcidevBackend")
            .field("model", &self.shared.model.name())
            .field("vectors", &self.shared.vectors.len())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<M: DeviceModel> PcidevBackend<M> {
    /// A backend for `model`, which was built on `bus`: guest memory the
    /// driver shares is mapped into `bus.dma` at its guest-physical address
    /// (UML's DMA addresses), and an eventfd is attached to every MSI-X
    /// vector of `bus.irqs`.
    pub fn new(model: Arc<M>, bus: Bus) -> crate::Result<Self> {
        let count = model.irq_count(IrqKind::MsiX);
        let mut vectors = Vec::with_capacity(count as usize);
        for _ in 0..count {
            vectors.push(EventFd::new(EFD_NONBLOCK).map_err(|e| crate::Error::Os {
                op: "eventfd(MSI-X vector)",
                source: e,
            })?);
        }
        let refs: Vec<Option<&EventFd>> = vectors.iter().map(Some).collect();
        bus.irqs
            .set(IrqKind::MsiX, 0, &refs)
            .map_err(crate::Error::Vfio)?;
        Ok(Self {
            shared: Arc::new(Shared {
                model,
                bus,
                vectors,
                pending_msi: Mutex::new(VecDeque::new()),
                reads_at: Mutex::new(BTreeMap::new()),
                mem: Mutex::new(None),
                backend_req: Mutex::new(None),
                counters: Counters::default(),
            }),
        })
    }

    /// The eventfds the model raises, with their epoll tokens.
    pub(crate) fn vector_fds(&self) -> impl Iterator<Item = (&EventFd, u64)> {
        self.shared
            .vectors
            .iter()
            .enumerate()
            .map(|(v, fd)| (fd, vector_token(v as u32)))
    }

    /// What the backend has served so far.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        Stats {
            cfg_reads: c.cfg_reads.load(Ordering::Relaxed),
            cfg_writes: c.cfg_writes.load(Ordering::Relaxed),
            mmio_reads: c.mmio_reads.load(Ordering::Relaxed),
            mmio_writes: c.mmio_writes.load(Ordering::Relaxed),
            msis: c.msis.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            dma_regions: c.dma_regions.load(Ordering::Relaxed),
        }
    }

    /// How many BAR reads the driver made at `offset` of BAR `bar`.
    pub fn mmio_reads_at(&self, bar: u8, offset: u64) -> u64 {
        lock(&self.shared.reads_at)
            .get(&(bar, offset))
            .copied()
            .unwrap_or(0)
    }

    /// Detaches the vectors from the model's bus and unmaps guest memory.
    pub(crate) fn detach(&self) {
        let _ = self.shared.bus.irqs.set(IrqKind::MsiX, 0, &[]);
        self.shared.bus.dma.clear();
    }

    fn memory(&self) -> Option<GuestMemoryAtomic<GuestMemoryMmap>> {
        lock(&self.shared.mem).clone()
    }

    /// Serves every request the driver queued on the command queue.
    fn process_cmd_queue(&self, vring: &VringRwLock) -> std::io::Result<()> {
        let Some(atomic) = self.memory() else {
            return Ok(());
        };
        loop {
            let mem = atomic.memory();
            let Some(chain) = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone())
            else {
                break;
            };
            let head = chain.head_index();
            let written = match self.serve_one(&mem, chain) {
                Ok(n) => n,
                Err(e) => {
                    self.shared.counters.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "virtio_pcidev: malformed request");
                    0
                }
            };
            if let Err(e) = vring.add_used(head, written as u32) {
                tracing::warn!(error = ?e, "virtio_pcidev: cannot return a command buffer");
            }
            vring.signal_used_queue()?;
        }
        Ok(())
    }

    /// One request: returns how many bytes were written back.
    ///
    /// A virtio device must not assume how the driver frames a message
    /// across descriptors: the request is the concatenation of the chain's
    /// device-readable descriptors (UML sends a header and the data of a
    /// write in two when it cannot allocate one buffer for both) and the
    /// answer goes into its device-writable ones, however they are split.
    fn serve_one<T>(
        &self,
        mem: &GuestMemoryMmap,
        chain: virtio_queue::DescriptorChain<T>,
    ) -> Result<usize, String>
    where
        T: std::ops::Deref + Clone,
        T::Target: vm_memory::GuestMemory + Sized,
    {
        let mut reader = Reader::new(mem, chain.clone()).map_err(|e| e.to_string())?;
        let mut writer = Writer::new(mem, chain).map_err(|e| e.to_string())?;
        let avail = reader.available_bytes();
        if avail < HEADER_LEN {
            return Err(format!("{avail} bytes is shorter than a header"));
        }
        let mut msg = vec![0u8; avail.min(HEADER_LEN + MAX_ACCESS)];
        reader.read_exact(&mut msg).map_err(|e| e.to_string())?;
        let hdr = Header::parse(&msg).ok_or("short header")?;
        let data = &msg[HEADER_LEN..];
        let size = hdr.size as usize;
        let m = &self.shared.model;
        let c = &self.shared.counters;
        match hdr.op {
            Op::CfgRead => {
                c.cfg_reads.fetch_add(1, Ordering::Relaxed);
                let mut buf = vec![0xffu8; size.min(8)];
                if matches!(size, 1 | 2 | 4 | 8) {
                    m.config_read(hdr.addr, &mut buf);
                }
                Self::answer(&mut writer, &buf)
            }
            Op::CfgWrite => {
                c.cfg_writes.fetch_add(1, Ordering::Relaxed);
                if matches!(size, 1 | 2 | 4 | 8) && data.len() >= size {
                    m.config_write(hdr.addr, &data[..size]);
                    Ok(0)
                } else {
                    Err(format!(
                        "config write of {size} bytes with {} bytes",
                        data.len()
                    ))
                }
            }
            Op::MmioRead => {
                c.mmio_reads.fetch_add(1, Ordering::Relaxed);
                *lock(&self.shared.reads_at)
                    .entry((hdr.bar, hdr.addr))
                    .or_default() += 1;
                let mut buf = vec![0xffu8; size.min(MAX_ACCESS)];
                if self.in_bar(hdr.bar, hdr.addr, size) {
                    m.region_read(u32::from(hdr.bar), hdr.addr, &mut buf);
                } else {
                    c.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(bar = hdr.bar, addr = hdr.addr, size, "read outside the BAR");
                }
                Self::answer(&mut writer, &buf)
            }
            Op::MmioWrite => {
                c.mmio_writes.fetch_add(1, Ordering::Relaxed);
                if data.len() < size || !self.in_bar(hdr.bar, hdr.addr, size) {
                    return Err(format!(
                        "BAR{} write of {size} bytes at {:#x} ({} bytes sent)",
                        hdr.bar,
                        hdr.addr,
                        data.len()
                    ));
                }
                m.region_write(u32::from(hdr.bar), hdr.addr, &data[..size]);
                Ok(0)
            }
            Op::MmioMemset => {
                c.mmio_writes.fetch_add(1, Ordering::Relaxed);
                let (Some(&byte), true) = (data.first(), self.in_bar(hdr.bar, hdr.addr, size))
                else {
                    return Err(format!(
                        "BAR{} memset of {size} bytes at {:#x}",
                        hdr.bar, hdr.addr
                    ));
                };
                m.region_write(u32::from(hdr.bar), hdr.addr, &vec![byte; size]);
                Ok(0)
            }
            other => Err(format!("{other:?} on the command queue")),
        }
    }

    fn answer<B: vm_memory::bitmap::BitmapSlice>(
        writer: &mut Writer<'_, B>,
        buf: &[u8],
    ) -> Result<usize, String> {
        let n = buf.len().min(writer.available_bytes());
        writer.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        Ok(n)
    }

    fn in_bar(&self, bar: u8, addr: u64, size: usize) -> bool {
        if size == 0 || size > MAX_ACCESS {
            return false;
        }
        match self.shared.model.region_info(u32::from(bar)) {
            Some(info) => addr
                .checked_add(size as u64)
                .is_some_and(|end| end <= info.size),
            None => false,
        }
    }

    /// The MSI-X table's BAR and offset, from the capability in config space.
    fn msix_table(&self) -> Option<(u32, u64)> {
        let m = &self.shared.model;
        let mut b = [0u8; 1];
        m.config_read(vfio::pci::CAPABILITIES_POINTER, &mut b);
        let mut at = u64::from(b[0] & !3);
        for _ in 0..48 {
            if at == 0 {
                return None;
            }
            let mut hdr = [0u8; 2];
            m.config_read(at, &mut hdr);
            if hdr[0] == vfio::pci::CAP_ID_MSIX {
                let mut t = [0u8; 4];
                m.config_read(at + vfio::pci::MSIX_TABLE, &mut t);
                let t = u32::from_le_bytes(t);
                return Some((t & 7, u64::from(t & !7)));
            }
            at = u64::from(hdr[1] & !3);
        }
        None
    }

    /// Vector `v` fired: queue the MSI write its table entry describes.
    fn vector_fired(&self, v: u32) {
        let Some(fd) = self.shared.vectors.get(v as usize) else {
            return;
        };
        // One message per wake-up: the eventfd counts writes, and MSI-X
        // messages to one vector that are not yet taken merge, as on PCI.
        if fd.read().is_err() {
            return;
        }
        let Some((bar, table)) = self.msix_table() else {
            return;
        };
        let mut e = [0u8; MSIX_ENTRY as usize];
        self.shared
            .model
            .region_read(bar, table + u64::from(v) * MSIX_ENTRY, &mut e);
        let addr = u64::from(u32::from_le_bytes([e[0], e[1], e[2], e[3]]))
            | u64::from(u32::from_le_bytes([e[4], e[5], e[6], e[7]])) << 32;
        let data = u32::from_le_bytes([e[8], e[9], e[10], e[11]]);
        lock(&self.shared.pending_msi).push_back((addr, data));
    }

    /// Puts waiting MSI messages into the driver's irq buffers.
    fn flush_msi(&self, vring: &VringRwLock) -> std::io::Result<()> {
        let Some(atomic) = self.memory() else {
            return Ok(());
        };
        let mut sent = false;
        let mut pending = lock(&self.shared.pending_msi);
        while let Some(&(addr, data)) = pending.front() {
            let mem = atomic.memory();
            let Some(chain) = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(mem.clone())
            else {
                break;
            };
            pending.pop_front();
            let head = chain.head_index();
            let msg = msi_message(addr, data);
            let written = match Writer::new(&*mem, chain) {
                Ok(mut w) if w.available_bytes() >= msg.len() => match w.write_all(&msg) {
                    Ok(()) => msg.len(),
                    Err(e) => {
                        tracing::warn!(error = %e, "virtio_pcidev: irq buffer write failed");
                        0
                    }
                },
                Ok(_) | Err(_) => {
                    tracing::warn!("virtio_pcidev: irq buffer too small for an MSI message");
                    0
                }
            };
            if written > 0 {
                self.shared.counters.msis.fetch_add(1, Ordering::Relaxed);
            }
            if let Err(e) = vring.add_used(head, written as u32) {
                tracing::warn!(error = ?e, "virtio_pcidev: cannot return an irq buffer");
            }
            sent = true;
        }
        drop(pending);
        if sent {
            vring.signal_used_queue()?;
        }
        Ok(())
    }
}

impl<M: DeviceModel + 'static> VhostUserBackend for PcidevBackend<M> {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::BACKEND_REQ
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        let dma = &self.shared.bus.dma;
        dma.clear();
        let mut n = 0;
        for region in mem.memory().iter() {
            let Some(fo) = region.file_offset() else {
                tracing::warn!(
                    gpa = region.start_addr().0,
                    "guest memory region without a file: the device cannot reach it"
                );
                continue;
            };
            if let Err(e) = dma.map_file(
                region.start_addr().0,
                region.len(),
                fo.arc().clone(),
                fo.start(),
            ) {
                tracing::error!(
                    gpa = region.start_addr().0,
                    len = region.len(),
                    error = %e,
                    "cannot map guest memory for DMA"
                );
                return Err(std::io::Error::other(e));
            }
            tracing::debug!(
                gpa = region.start_addr().0,
                len = region.len(),
                "guest memory mapped for DMA"
            );
            n += 1;
        }
        self.shared.counters.dma_regions.store(n, Ordering::Relaxed);
        *lock(&self.shared.mem) = Some(mem);
        Ok(())
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        *lock(&self.shared.backend_req) = Some(backend);
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // The library notifies it when the connection ends; without one its
        // queue threads never stop and dropping the daemon waits forever.
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        vec![1 << CMD_QUEUE, 1 << IRQ_QUEUE]
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        thread_id: usize,
    ) -> std::io::Result<()> {
        if evset != EventSet::IN {
            return Ok(());
        }
        let Some(vring) = vrings.first() else {
            return Ok(());
        };
        match (thread_id, u64::from(device_event)) {
            (0, 0) => self.process_cmd_queue(vring),
            (1, 0) => self.flush_msi(vring),
            (1, token) if token > NUM_QUEUES as u64 => {
                self.vector_fired((token - NUM_QUEUES as u64 - 1) as u32);
                self.flush_msi(vring)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio::function::RegionInfo;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    const BAR0: u64 = 0x1000;

    /// A function with one BAR of plain registers.
    #[derive(Debug)]
    struct Regs(Mutex<Vec<u8>>);

    impl DeviceModel for Regs {
        fn name(&self) -> String {
            "regs".into()
        }
        fn config_read(&self, _offset: u64, buf: &mut [u8]) {
            buf.fill(0);
        }
        fn config_write(&self, _offset: u64, _data: &[u8]) {}
        fn region_info(&self, index: u32) -> Option<RegionInfo> {
            (index == 0).then(|| RegionInfo {
                index,
                size: BAR0,
                read: true,
                write: true,
                mmap_areas: Vec::new(),
            })
        }
        fn region_memory(&self, _index: u32) -> Option<Arc<vfio::DmaBuffer>> {
            None
        }
        fn region_read(&self, _index: u32, offset: u64, buf: &mut [u8]) {
            let at = offset as usize;
            buf.copy_from_slice(&lock(&self.0)[at..at + buf.len()]);
        }
        fn region_write(&self, _index: u32, offset: u64, data: &[u8]) {
            let at = offset as usize;
            lock(&self.0)[at..at + data.len()].copy_from_slice(data);
        }
        fn irq_count(&self, _kind: IrqKind) -> u32 {
            0
        }
        fn reset(&self) {}
        fn shutdown(&self) {}
    }

    fn setup() -> (Arc<Regs>, PcidevBackend<Regs>, GuestMemoryMmap) {
        let regs = Arc::new(Regs(Mutex::new(vec![0; BAR0 as usize])));
        let backend = PcidevBackend::new(regs.clone(), Bus::new()).expect("backend");
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).expect("memory");
        (regs, backend, mem)
    }

    fn desc(addr: u64, len: u32, writable: bool) -> RawDescriptor {
        let flags = if writable {
            VRING_DESC_F_WRITE as u16
        } else {
            0
        };
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    fn header(op: Op, addr: u64, size: u32) -> [u8; HEADER_LEN] {
        Header {
            op,
            bar: 0,
            size,
            addr,
        }
        .emit()
    }

    #[test]
    fn a_write_split_into_header_and_data_descriptors_is_one_write() {
        // What UML's um_pci_send_cmd() queues when its GFP_ATOMIC copy
        // fails: the header in one descriptor, the data in another.
        let (regs, backend, mem) = setup();
        mem.write_slice(&header(Op::MmioWrite, 0x40, 4), GuestAddress(0x10_0000))
            .expect("header");
        mem.write_slice(&[0x11, 0x22, 0x33, 0x44], GuestAddress(0x10_1000))
            .expect("data");
        let q = MockSplitQueue::new(&mem, 16);
        let chain = q
            .build_desc_chain(&[
                desc(0x10_0000, HEADER_LEN as u32, false),
                desc(0x10_1000, 4, false),
            ])
            .expect("chain");
        assert_eq!(backend.serve_one(&mem, chain), Ok(0));
        assert_eq!(&lock(&regs.0)[0x40..0x44], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(backend.stats().mmio_writes, 1);
    }

    #[test]
    fn a_read_gathers_its_header_and_scatters_its_answer() {
        let (regs, backend, mem) = setup();
        lock(&regs.0)[0x10..0x18].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        let h = header(Op::MmioRead, 0x10, 8);
        mem.write_slice(&h[..5], GuestAddress(0x10_0000))
            .expect("header");
        mem.write_slice(&h[5..], GuestAddress(0x10_0800))
            .expect("header");
        let q = MockSplitQueue::new(&mem, 16);
        let chain = q
            .build_desc_chain(&[
                desc(0x10_0000, 5, false),
                desc(0x10_0800, (HEADER_LEN - 5) as u32, false),
                desc(0x10_1000, 3, true),
                desc(0x10_2000, 5, true),
            ])
            .expect("chain");
        assert_eq!(backend.serve_one(&mem, chain), Ok(8));
        let mut a = [0u8; 3];
        let mut b = [0u8; 5];
        mem.read_slice(&mut a, GuestAddress(0x10_1000))
            .expect("answer");
        mem.read_slice(&mut b, GuestAddress(0x10_2000))
            .expect("answer");
        assert_eq!(a, [0x08, 0x07, 0x06]);
        assert_eq!(b, [0x05, 0x04, 0x03, 0x02, 0x01]);
    }

    #[test]
    fn a_write_whose_data_never_came_is_refused_and_not_applied() {
        // A header that says 4 bytes with none behind it (what a guest whose
        // header buffer was overwritten under a queued read sends).
        let (regs, backend, mem) = setup();
        mem.write_slice(&header(Op::MmioWrite, 0x40, 4), GuestAddress(0x10_0000))
            .expect("header");
        let q = MockSplitQueue::new(&mem, 16);
        let chain = q
            .build_desc_chain(&[
                desc(0x10_0000, HEADER_LEN as u32, false),
                desc(0x10_1000, 8, true),
            ])
            .expect("chain");
        let err = backend.serve_one(&mem, chain).expect_err("no data");
        assert!(err.contains("0 bytes sent"), "{err}");
        assert!(lock(&regs.0).iter().all(|&b| b == 0));
    }
}
