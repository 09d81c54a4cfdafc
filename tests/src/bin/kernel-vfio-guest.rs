//! Runs inside the QEMU guest of `tests/tests/kernel_vfio.rs`, as the
//! initramfs's only program besides busybox: owns QEMU's `edu` device
//! (1234:11e8) through the real kernel VFIO with the `vfio` crate and checks
//! it end to end. Built static (`-C target-feature=+crt-static`).
//!
//! Usage: `kernel-vfio-guest PCI_ADDRESS group|cdev`. Prints one line per
//! check, `kvfio: check PATH/NAME: ok` or `... FAIL: why` or
//! `... skipped: why`, then `kvfio: done`.
//!
//! `kernel-vfio-guest rdma group|cdev PCI_ADDRESS_0 PCI_ADDRESS_1`: the
//! guest's two mlx5 functions (the device model, served to QEMU over
//! vfio-user) owned by our driver through this kernel's VFIO, and
//! `reg_mr_raw` of each kind of the program's own memory carrying RDMA
//! between them, with the refusals (`tests::usermem_rdma`); its checks are
//! reported under `rdma-group/` or `rdma-cdev/`.
//!
//! The edu device (QEMU `docs/specs/edu.rst`): BAR0 registers, little
//! endian: 0x00 ID `0x010000ed`, 0x04 liveness (reads back inverted),
//! 0x24 interrupt status, 0x64 interrupt acknowledge, 0x80/0x88/0x90 DMA
//! source/destination/count, 0x98 DMA command (bit 0 start, bit 1
//! device-to-RAM, bit 2 interrupt 0x100 on completion). Its DMA buffer sits
//! at device address 0x40000 (4 KiB); its DMA mask is 28 bits.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "kernel-vfio-guest/rdma.rs"]
mod rdma;

use tests::function_contract;
use vfio::kernel::{DmaAccess, Interface, KernelFunction, OpenOptions, PciAddress};
use vfio::{pci, DmaBuffer, Error, Iova, IovaAllocator, IrqKind, Mmio, PciFunction};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const EDU: (u16, u16) = (0x1234, 0x11e8);
const EDU_ID: u32 = 0x0100_00ed;
const REG_ID: usize = 0x00;
const REG_LIVENESS: usize = 0x04;
const REG_IRQ_STATUS: usize = 0x24;
const REG_IRQ_ACK: usize = 0x64;
const REG_DMA_SRC: usize = 0x80;
const REG_DMA_DST: usize = 0x88;
const REG_DMA_CNT: usize = 0x90;
const REG_DMA_CMD: usize = 0x98;
const DMA_START: u32 = 1;
const DMA_TO_RAM: u32 = 2;
const DMA_IRQ: u32 = 4;
const IRQ_DMA_DONE: u32 = 0x100;
const EDU_BUF: u32 = 0x40000;
/// Under 4096: QEMU 7.2's edu aborts on a transfer of exactly its buffer size.
const XFER: usize = 3000;
/// Generous: the guest runs under TCG on a shared host.
const IRQ_DEADLINE: Duration = Duration::from_secs(30);

type Check = Result<(), String>;

fn e2s(e: Error) -> String {
    e.to_string()
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Check {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

pub(crate) struct Report {
    pub(crate) path: &'static str,
    pub(crate) failed: usize,
}

impl Report {
    fn record(&mut self, name: &str, r: Check) {
        match r {
            Ok(()) => println!("kvfio: check {}/{name}: ok", self.path),
            Err(why) => {
                self.failed += 1;
                println!("kvfio: check {}/{name}: FAIL: {why}", self.path);
            }
        }
    }

    fn skip(&self, name: &str, why: &str) {
        println!("kvfio: check {}/{name}: skipped: {why}", self.path);
    }
}

/// edu's little-endian registers through the mapped BAR.
struct Regs(Mmio);

impl Regs {
    fn read(&self, off: usize) -> Result<u32, String> {
        self.0.read32_be(off).map(u32::swap_bytes).map_err(e2s)
    }
    fn write(&self, off: usize, v: u32) -> Check {
        self.0.write32_be(off, v.swap_bytes()).map_err(e2s)
    }
}

/// Waits for one interrupt on `fd` and returns its count.
fn wait_irq(fd: &EventFd) -> Result<u64, String> {
    let start = Instant::now();
    loop {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll reads and writes the one live pollfd given.
        let r = unsafe { libc::poll(&mut p, 1, 200) };
        if r > 0 {
            return fd.read().map_err(|e| e.to_string());
        }
        if start.elapsed() > IRQ_DEADLINE {
            return Err(format!("no interrupt within {IRQ_DEADLINE:?}"));
        }
    }
}

/// One edu DMA: programs it, waits for the completion MSI, acknowledges it.
fn edu_dma(regs: &Regs, irq: &EventFd, src: u64, dst: u64, to_ram: bool) -> Check {
    regs.write(REG_DMA_SRC, src as u32)?;
    regs.write(REG_DMA_DST, dst as u32)?;
    regs.write(REG_DMA_CNT, XFER as u32)?;
    let dir = if to_ram { DMA_TO_RAM } else { 0 };
    regs.write(REG_DMA_CMD, DMA_START | dir | DMA_IRQ)?;
    let n = wait_irq(irq)?;
    ensure(n == 1, || format!("{n} interrupts for one DMA"))?;
    let status = regs.read(REG_IRQ_STATUS)?;
    ensure(status & IRQ_DMA_DONE != 0, || {
        format!("interrupt status {status:#x} lacks DMA done")
    })?;
    regs.write(REG_IRQ_ACK, status)
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..XFER)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// New kernel log lines that mention an IOMMU (DMAR) fault.
fn dmar_faults(kmsg: &mut Option<std::fs::File>) -> Vec<String> {
    use std::io::Read;
    let Some(f) = kmsg else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    // /dev/kmsg gives one record per read; EAGAIN at the end.
    while let Ok(n) = f.read(&mut buf) {
        if n == 0 {
            break;
        }
        let line = String::from_utf8_lossy(&buf[..n]).into_owned();
        if line.contains("DMAR") && line.to_ascii_lowercase().contains("fault") {
            out.push(line.trim().to_string());
        }
    }
    out
}

fn open_kmsg() -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .ok()?;
    // Skip what is already logged.
    // SAFETY: lseek on our own descriptor; SEEK_END on /dev/kmsg moves
    // past the existing records.
    unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) };
    Some(f)
}

fn open(addr: PciAddress, interface: Interface) -> Result<KernelFunction, String> {
    let opts = OpenOptions {
        interface,
        expect_id: Some(EDU),
        ..Default::default()
    };
    KernelFunction::open(addr, &opts).map_err(e2s)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("rdma") {
        rdma::main(&args[2..]);
        return;
    }
    let (Some(addr), Some(path)) = (args.get(1), args.get(2)) else {
        println!("kvfio: usage: kernel-vfio-guest PCI_ADDRESS group|cdev");
        std::process::exit(2);
    };
    let (interface, path) = match path.as_str() {
        "cdev" => (Interface::Cdev, "cdev"),
        "noiommu" => (Interface::Group, "noiommu"),
        _ => (Interface::Group, "group"),
    };
    let mut rep = Report { path, failed: 0 };
    let addr: PciAddress = match addr.parse() {
        Ok(a) => a,
        Err(e) => {
            println!("kvfio: {e}");
            std::process::exit(2);
        }
    };
    if path == "noiommu" {
        run_noiommu(&mut rep, addr);
    } else {
        run(&mut rep, addr, interface);
    }
    println!("kvfio: done ({} failed)", rep.failed);
}

fn run(rep: &mut Report, addr: PciAddress, interface: Interface) {
    // Discovery refusals, on the real sysfs.
    rep.record("discovery_errors", discovery_errors(addr));

    // Auto picks the cdev exactly when the kernel has one.
    let f = match open(addr, Interface::Auto) {
        Ok(f) => f,
        Err(e) => {
            rep.record("open_by_address", Err(e));
            return;
        }
    };
    rep.record(
        "open_by_address",
        ensure(f.interface() == interface, || {
            format!("Auto opened through {:?}, not {interface:?}", f.interface())
        })
        .and_then(|()| listed(&f, addr)),
    );
    rep.record("region_info", region_info(&f));
    rep.record("iova_ranges", iova_ranges(&f));

    let f = Arc::new(f);
    for (name, r) in function_contract::check(&*f) {
        rep.record(name, r);
    }
    rep.record("bar0_id_and_liveness", bar0(&*f));
    rep.record("dma_both_ways_with_msi", dma_both_ways(&f));
    rep.record("dma_to_unmapped_iova_blocked", dma_blocked(&f));
    rep.record("hugetlb_dma_buffer", hugetlb_dma(&f));
    for kind in UserMem::ALL {
        rep.record(
            &format!("dma_map_host_{}", kind.name()),
            user_memory_dma(&f, kind),
        );
    }
    rep.record("dma_map_host_memlock_named", user_memory_memlock(&f));
    rep.record("intx_without_msi", intx(&f));
    match interface {
        Interface::Cdev => rep.skip(
            "mapping_count_limit_named",
            "iommufd has no mapping-count limit (type1's dma_entry_limit)",
        ),
        _ => rep.record("mapping_count_limit_named", mapping_limit(&f)),
    }
    rep.record("memlock_limit_named", memlock_limit(&f));
    rep.record("function_reset", function_reset(&f));
    rep.record("hot_reset", hot_reset(&f));
    rep.record("driver_bringup_runs_unchanged", driver_bringup(f.clone()));
    let f = match Arc::try_unwrap(f) {
        Ok(f) => f,
        Err(_) => {
            rep.record("close_and_reopen", Err("function still shared".into()));
            return;
        }
    };
    drop(f);
    let f = match open(addr, interface) {
        Ok(f) => f,
        Err(e) => {
            rep.record("close_and_reopen", Err(e));
            return;
        }
    };
    rep.record("close_and_reopen", reopened(&f));
    rep.record("device_request_on_unplug", unplug(f, addr));
}

fn discovery_errors(addr: PciAddress) -> Check {
    let wrong = KernelFunction::open(
        addr,
        &OpenOptions {
            expect_id: Some((0x15b3, 0x1013)),
            ..Default::default()
        },
    );
    let e = wrong.err().map(e2s).unwrap_or_default();
    ensure(e.contains("not the 15b3:1013"), || {
        format!("wrong ID gave {e:?}")
    })?;
    // The host bridge at 00:00.0 is bound to no driver.
    let bridge: PciAddress = "0000:00:00.0".parse().map_err(e2s)?;
    let e = KernelFunction::open(bridge, &OpenOptions::default())
        .err()
        .map(e2s)
        .unwrap_or_default();
    ensure(
        e.contains("no driver") && e.contains("drivers_probe"),
        || format!("unbound host bridge gave {e:?}"),
    )
}

/// What `mlx5 list` shows: the function, bound to vfio-pci, with its group.
fn listed(f: &KernelFunction, addr: PciAddress) -> Check {
    let all = vfio::kernel::Sysfs::default().vfio_functions();
    let me = all.iter().find(|i| i.address == addr);
    ensure(
        me.is_some_and(|i| (i.vendor, i.device) == EDU && i.iommu_group == f.info().iommu_group),
        || format!("vfio_functions() lists {all:?}"),
    )
}

fn region_info(f: &KernelFunction) -> Check {
    let bar0 = f.device().region(0).map_err(e2s)?;
    ensure(bar0.info.size == 1 << 20, || {
        format!("BAR0 is {:#x} bytes", bar0.info.size)
    })?;
    ensure(bar0.mmap && bar0.info.read && bar0.info.write, || {
        format!("BAR0 {bar0:?}")
    })?;
    let cfg = f.device().region(7).map_err(e2s)?;
    ensure(cfg.info.size >= 256 && !cfg.mmap, || {
        format!("config {cfg:?}")
    })?;
    ensure(f.irq_count(IrqKind::Msi).map_err(e2s)? == 1, || {
        "edu has one MSI vector".into()
    })?;
    ensure(f.irq_count(IrqKind::MsiX).map_err(e2s)? == 0, || {
        "edu has no MSI-X".into()
    })?;
    ensure(f.irq_count(IrqKind::Req).map_err(e2s)? == 1, || {
        "no device-request interrupt".into()
    })
}

fn iova_ranges(f: &KernelFunction) -> Check {
    let r = f.iova_ranges().map_err(e2s)?;
    ensure(!r.is_empty(), || "no ranges".into())?;
    // The x86 MSI window is never usable for DMA.
    ensure(
        !r.iter()
            .any(|r| r.start <= 0xfee0_0000 && 0xfee0_0000 <= r.last),
        || format!("ranges {r:x?} include the MSI window"),
    )?;
    ensure(
        r.iter()
            .any(|r| r.start <= 0x10_0000 && r.last >= 0x0fff_ffff),
        || format!("ranges {r:x?} miss the low 256 MiB edu can reach"),
    )
}

fn bar0(f: &dyn PciFunction) -> Check {
    let regs = Regs(f.map_region(0).map_err(e2s)?);
    let id = regs.read(REG_ID)?;
    ensure(id == EDU_ID, || format!("ID {id:#010x}"))?;
    regs.write(REG_LIVENESS, 0x1234_5678)?;
    let live = regs.read(REG_LIVENESS)?;
    ensure(live == !0x1234_5678u32, || format!("liveness {live:#x}"))
}

fn enable(f: &KernelFunction) -> Check {
    f.set_command(true, true).map_err(e2s)
}

struct Mapped {
    buf: Arc<DmaBuffer>,
    iova: Iova,
}

fn map_new(f: &KernelFunction, a: &mut IovaAllocator, len: usize) -> Result<Mapped, String> {
    let buf = DmaBuffer::new(len).map_err(e2s)?;
    let iova = a.alloc(buf.len() as u64).map_err(e2s)?;
    f.dma_map(iova, &buf).map_err(e2s)?;
    Ok(Mapped { buf, iova })
}

fn msi(f: &dyn PciFunction) -> Result<EventFd, String> {
    let fd = EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?;
    f.set_irqs(IrqKind::Msi, 0, &[Some(&fd)]).map_err(e2s)?;
    Ok(fd)
}

fn dma_both_ways(f: &KernelFunction) -> Check {
    enable(f)?;
    let regs = Regs(f.map_region(0).map_err(e2s)?);
    let irq = msi(f)?;
    let mut a = IovaAllocator::new(&f.iova_ranges().map_err(e2s)?);
    let src = map_new(f, &mut a, 4096)?;
    let dst = map_new(f, &mut a, 4096)?;
    let data = pattern(7);
    src.buf.write(0, &data).map_err(e2s)?;
    edu_dma(&regs, &irq, src.iova.0, u64::from(EDU_BUF), false)?;
    edu_dma(&regs, &irq, u64::from(EDU_BUF), dst.iova.0, true)?;
    let mut got = vec![0u8; XFER];
    dst.buf.read(0, &mut got).map_err(e2s)?;
    f.dma_unmap(src.iova, 4096).map_err(e2s)?;
    f.dma_unmap(dst.iova, 4096).map_err(e2s)?;
    f.set_irqs(IrqKind::Msi, 0, &[]).map_err(e2s)?;
    ensure(got == data, || {
        let first = got.iter().zip(&data).position(|(x, y)| x != y);
        format!("copied back differs from byte {first:?}")
    })
}

fn dma_blocked(f: &KernelFunction) -> Check {
    enable(f)?;
    let regs = Regs(f.map_region(0).map_err(e2s)?);
    let irq = msi(f)?;
    let mut kmsg = open_kmsg();
    let mut a = IovaAllocator::new(&f.iova_ranges().map_err(e2s)?);
    let src = map_new(f, &mut a, 4096)?;
    let victim = map_new(f, &mut a, 4096)?;
    src.buf.write(0, &pattern(9)).map_err(e2s)?;
    edu_dma(&regs, &irq, src.iova.0, u64::from(EDU_BUF), false)?;
    // The victim's memory stays ours, but its IOVA is no longer mapped.
    f.dma_unmap(victim.iova, 4096).map_err(e2s)?;
    victim.buf.fill(0, 4096, 0x5a).map_err(e2s)?;
    edu_dma(&regs, &irq, u64::from(EDU_BUF), victim.iova.0, true)?;
    f.dma_unmap(src.iova, 4096).map_err(e2s)?;
    f.set_irqs(IrqKind::Msi, 0, &[]).map_err(e2s)?;
    let mut got = vec![0u8; 4096];
    victim.buf.read(0, &mut got).map_err(e2s)?;
    ensure(got.iter().all(|&b| b == 0x5a), || {
        "the DMA reached memory whose IOVA was unmapped".into()
    })?;
    let faults = dmar_faults(&mut kmsg);
    let addr = format!("0x{:x}", victim.iova.0);
    let Some(line) = faults.iter().find(|l| l.contains(&addr)) else {
        return Err(format!(
            "no DMAR fault naming {addr} in the kernel log: {faults:?}"
        ));
    };
    println!(
        "kvfio:   IOMMU fault seen: {}",
        line.rsplit(';').next().unwrap_or(line)
    );
    Ok(())
}

/// INTx, what a function without MSI-X falls back to: edu raises it when
/// MSI is off. Level-triggered, so the kernel masks it until we unmask.
fn intx(f: &KernelFunction) -> Check {
    ensure(f.irq_count(IrqKind::Intx).map_err(e2s)? == 1, || {
        "edu has one INTx pin".into()
    })?;
    enable(f)?;
    let regs = Regs(f.map_region(0).map_err(e2s)?);
    let fd = EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?;
    f.set_irqs(IrqKind::Intx, 0, &[Some(&fd)]).map_err(e2s)?;
    let mut a = IovaAllocator::new(&f.iova_ranges().map_err(e2s)?);
    let dst = map_new(f, &mut a, 4096)?;
    let r = (|| {
        for _ in 0..2 {
            edu_dma(&regs, &fd, u64::from(EDU_BUF), dst.iova.0, true)?;
            f.device().unmask(IrqKind::Intx, 0).map_err(e2s)?;
        }
        Ok(())
    })();
    f.dma_unmap(dst.iova, 4096).map_err(e2s)?;
    f.set_irqs(IrqKind::Intx, 0, &[]).map_err(e2s)?;
    r
}

fn hugetlb_dma(f: &KernelFunction) -> Check {
    let buf = DmaBuffer::with_hugepages(2 << 20, true).map_err(e2s)?;
    ensure(buf.is_huge(), || {
        "no 2 MiB huge page (the guest reserves two)".into()
    })?;
    enable(f)?;
    let regs = Regs(f.map_region(0).map_err(e2s)?);
    let irq = msi(f)?;
    let mut a = IovaAllocator::new(&f.iova_ranges().map_err(e2s)?);
    let iova = a.alloc(2 << 20).map_err(e2s)?;
    ensure(iova.0 % (2 << 20) == 0, || format!("IOVA {iova:#x}"))?;
    f.dma_map(iova, &buf).map_err(e2s)?;
    let data = pattern(3);
    let far = (1 << 20) + 4096; // in the middle of the huge page
    buf.write(far, &data).map_err(e2s)?;
    edu_dma(&regs, &irq, iova.0 + far as u64, u64::from(EDU_BUF), false)?;
    edu_dma(&regs, &irq, u64::from(EDU_BUF), iova.0 + 8192, true)?;
    let mut got = vec![0u8; XFER];
    buf.read(8192, &mut got).map_err(e2s)?;
    f.dma_unmap(iova, 2 << 20).map_err(e2s)?;
    f.set_irqs(IrqKind::Msi, 0, &[]).map_err(e2s)?;
    ensure(got == data, || "huge-page round trip differs".into())
}

/// Memory the program allocates itself, mapped with `dma_map_host`.
#[derive(Debug, Clone, Copy)]
enum UserMem {
    Heap,
    AnonMmap,
    Memfd,
    Hugetlb,
}

impl UserMem {
    const ALL: [UserMem; 4] = [
        UserMem::Heap,
        UserMem::AnonMmap,
        UserMem::Memfd,
        UserMem::Hugetlb,
    ];

    fn name(self) -> &'static str {
        match self {
            UserMem::Heap => "heap",
            UserMem::AnonMmap => "anonymous_mmap",
            UserMem::Memfd => "memfd",
            UserMem::Hugetlb => "memfd_hugetlb_2m",
        }
    }
}

/// Owns one allocation of a [`UserMem`] kind; `ptr` is 4 KiB aligned.
enum Held {
    /// Kept only to be freed after the unmap.
    Heap(#[allow(dead_code)] Vec<u8>),
    Map(*mut u8, usize),
    /// Kept only to be freed after the unmap.
    Pool(#[allow(dead_code)] vfio::HostMemory),
}

fn user_alloc(kind: UserMem, len: usize) -> Result<(Held, *mut u8), String> {
    Ok(match kind {
        UserMem::Heap => {
            let mut v = vec![0u8; len + 4096];
            let p = v.as_mut_ptr();
            let p = p.wrapping_add(p.align_offset(4096));
            (Held::Heap(v), p)
        }
        UserMem::AnonMmap => {
            // SAFETY: a new private anonymous mapping the kernel places.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(format!("mmap: {}", std::io::Error::last_os_error()));
            }
            (Held::Map(p.cast(), len), p.cast())
        }
        UserMem::Memfd => {
            let m = vfio::HostMemory::memfd(len).map_err(e2s)?;
            let p = m.as_ptr();
            (Held::Pool(m), p)
        }
        UserMem::Hugetlb => {
            let m = vfio::HostMemory::memfd_huge(len, vfio::dma::HugePage::Size2M)
                .map_err(|e| format!("{e} (the guest reserves two)"))?;
            let p = m.as_ptr();
            (Held::Pool(m), p)
        }
    })
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Held::Map(p, len) = *self {
            // SAFETY: the mapping made in `user_alloc`, unmapped once, after
            // its DMA mapping is gone.
            unsafe { libc::munmap(p.cast(), len) };
        }
    }
}

/// `dma_map_host` of 8 KiB (2 MiB for huge pages) of `kind`, the kernel
/// pinning it by address (or iommufd by the memfd): edu copies a pattern
/// out of the first page and back into the second; the bytes must match.
fn user_memory_dma(f: &KernelFunction, kind: UserMem) -> Check {
    let len = match kind {
        UserMem::Hugetlb => 2 << 20,
        _ => 8192,
    };
    let (held, p) = user_alloc(kind, len)?;
    enable(f)?;
    let regs = Regs(f.map_region(0).map_err(e2s)?);
    let irq = msi(f)?;
    let mut a = IovaAllocator::new(&f.iova_ranges().map_err(e2s)?);
    let iova = a.alloc(len as u64).map_err(e2s)?;
    let data = pattern(11);
    for (i, b) in data.iter().enumerate() {
        // SAFETY: `p .. p + len` is the live allocation `held` owns.
        unsafe { p.wrapping_add(i).write_volatile(*b) };
    }
    // SAFETY: `held` keeps the memory mapped until after the unmap below;
    // it is touched only by volatile accesses meanwhile.
    unsafe { f.dma_map_host(iova, p as u64, len as u64) }.map_err(e2s)?;
    let r = (|| {
        edu_dma(&regs, &irq, iova.0, u64::from(EDU_BUF), false)?;
        edu_dma(&regs, &irq, u64::from(EDU_BUF), iova.0 + 4096, true)
    })();
    f.dma_unmap(iova, len as u64).map_err(e2s)?;
    f.set_irqs(IrqKind::Msi, 0, &[]).map_err(e2s)?;
    r?;
    // SAFETY: as above; the device no longer reaches it.
    let got: Vec<u8> = (0..XFER)
        .map(|i| unsafe { p.wrapping_add(4096 + i).read_volatile() })
        .collect();
    drop(held);
    ensure(got == data, || {
        let first = got.iter().zip(&data).position(|(x, y)| x != y);
        format!("{} round trip differs from byte {first:?}", kind.name())
    })
}

/// `dma_map_host` of 1 MiB of heap past a 64 KiB RLIMIT_MEMLOCK, from a
/// thread without CAP_IPC_LOCK: refused as [`Error::MemlockLimit`].
fn user_memory_memlock(f: &Arc<KernelFunction>) -> Check {
    let f = f.clone();
    let t = std::thread::spawn(move || -> Check {
        drop_cap_ipc_lock()?;
        let old = set_memlock(64 << 10)?;
        let r = (|| {
            let (held, p) = user_alloc(UserMem::Heap, 1 << 20)?;
            let mut a = IovaAllocator::new(&f.iova_ranges().map_err(e2s)?);
            let iova = a.alloc(1 << 20).map_err(e2s)?;
            // SAFETY: `held` outlives the mapping (unmapped below if made).
            let r = match unsafe { f.dma_map_host(iova, p as u64, 1 << 20) } {
                Err(e @ Error::MemlockLimit { .. }) => {
                    println!("kvfio:   {e}");
                    Ok(())
                }
                Ok(()) => {
                    let _ = f.dma_unmap(iova, 1 << 20);
                    Err("1 MiB of heap passed a 64 KiB RLIMIT_MEMLOCK".into())
                }
                Err(e) => Err(format!("refused for another reason: {e}")),
            };
            drop(held);
            r
        })();
        set_memlock(old)?;
        r
    });
    t.join().map_err(|_| "thread panicked".to_string())?
}

fn mapping_limit(f: &KernelFunction) -> Check {
    let left = f
        .dma_mappings_left()
        .map_err(e2s)?
        .ok_or("the kernel reports no DMA_AVAIL")?;
    ensure(left < 1000, || {
        format!("{left} mappings left (the guest loads vfio_iommu_type1 with dma_entry_limit=64)")
    })?;
    let mut a = IovaAllocator::new(&f.iova_ranges().map_err(e2s)?);
    let mut maps = Vec::new();
    let mut result = Ok(());
    for _ in 0..left {
        match map_new(f, &mut a, 4096) {
            Ok(m) => maps.push(m),
            Err(e) => {
                result = Err(format!("map {} of {left} failed early: {e}", maps.len()));
                break;
            }
        }
    }
    if result.is_ok() {
        let buf = DmaBuffer::new(4096).map_err(e2s)?;
        let iova = a.alloc(4096).map_err(e2s)?;
        result = match f.dma_map(iova, &buf) {
            Err(e @ Error::MappingLimit { .. }) => {
                println!("kvfio:   {e}");
                Ok(())
            }
            other => Err(format!("mapping past the limit gave {other:?}")),
        };
    }
    for m in maps {
        f.dma_unmap(m.iova, m.buf.len() as u64).map_err(e2s)?;
    }
    result
}

/// Maps more than RLIMIT_MEMLOCK allows from a thread without
/// CAP_IPC_LOCK (capabilities are per thread; the limit is per process).
fn memlock_limit(f: &Arc<KernelFunction>) -> Check {
    let f = f.clone();
    let t = std::thread::spawn(move || -> Check {
        drop_cap_ipc_lock()?;
        let old = set_memlock(64 << 10)?;
        let r = (|| {
            let buf = DmaBuffer::new(1 << 20).map_err(e2s)?;
            let mut a = IovaAllocator::new(&f.iova_ranges().map_err(e2s)?);
            let iova = a.alloc(1 << 20).map_err(e2s)?;
            match f.dma_map_access(iova, &buf, DmaAccess::READ_WRITE) {
                Err(e @ Error::MemlockLimit { .. }) => {
                    println!("kvfio:   {e}");
                    Ok(())
                }
                Ok(()) => {
                    let _ = f.dma_unmap(iova, 1 << 20);
                    Err("a 1 MiB mapping passed a 64 KiB RLIMIT_MEMLOCK".into())
                }
                Err(e) => Err(format!("refused for another reason: {e}")),
            }
        })();
        set_memlock(old)?;
        r
    });
    t.join().map_err(|_| "thread panicked".to_string())?
}

fn set_memlock(cur: u64) -> Result<u64, String> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Err("getrlimit".into());
    }
    let old = r.rlim_cur;
    r.rlim_cur = cur;
    // SAFETY: setrlimit reads the live local.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } != 0 {
        return Err("setrlimit".into());
    }
    Ok(old)
}

fn drop_cap_ipc_lock() -> Check {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAP_IPC_LOCK: u32 = 14;
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget writes the live header and the two data words
    // version 3 defines.
    if unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) } != 0 {
        return Err("capget".into());
    }
    d[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset reads them back; it acts on this thread only.
    if unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) } != 0 {
        return Err("capset".into());
    }
    Ok(())
}

/// The kernel's reset method for the function (edu has no FLR or PM
/// reset; behind its own root port it gets a secondary bus reset).
fn reset_method(f: &KernelFunction) -> String {
    std::fs::read_to_string(format!("/sys/bus/pci/devices/{}/reset_method", f.name()))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// edu keeps no state a reset clears, and vfio-pci restores config space
/// around it, so what is checked is that the kernel did the reset and the
/// function works fully afterwards (ID, liveness, DMA with its MSI).
fn function_reset(f: &KernelFunction) -> Check {
    ensure(f.device().can_reset(), || {
        "VFIO_DEVICE_FLAGS_RESET is not offered".into()
    })?;
    enable(f)?;
    f.reset().map_err(e2s)?;
    println!(
        "kvfio:   VFIO_DEVICE_RESET done (reset_method: {})",
        reset_method(f)
    );
    bar0(f)?;
    dma_both_ways(f)
}

fn hot_reset(f: &KernelFunction) -> Check {
    enable(f)?;
    f.hot_reset().map_err(e2s)?;
    println!("kvfio:   VFIO_DEVICE_PCI_HOT_RESET done");
    bar0(f)?;
    dma_both_ways(f)
}

/// The driver's bring-up, unchanged, on the kernel backend: it enables the
/// function, maps BAR0 and waits for the init segment's `initializing` bit
/// (0x1fc bit 31), which edu (not a ConnectX) never clears.
fn driver_bringup(f: Arc<KernelFunction>) -> Check {
    let before = f.dma_mappings();
    let opts = verbs::hca::HcaOptions {
        fw_pre_init_timeout: Duration::from_millis(300),
        health_interval: None,
        ..Default::default()
    };
    let r = verbs::hca::Hca::open(f.clone(), opts);
    let e = match r {
        Ok(h) => {
            let _ = h.close();
            return Err("edu came up as an mlx5 HCA".into());
        }
        Err(e) => e.to_string(),
    };
    ensure(e.contains("initializing"), || {
        format!("bring-up ended with {e:?}, not the init-segment wait")
    })?;
    ensure(f.dma_mappings() == before, || {
        "bring-up left mappings behind".into()
    })?;
    let mut b = [0u8; 2];
    f.config_read(pci::COMMAND, &mut b).map_err(e2s)?;
    ensure(u16::from_le_bytes(b) & pci::COMMAND_BUS_MASTER != 0, || {
        "bring-up did not enable bus mastering through the backend".into()
    })
}

fn reopened(f: &KernelFunction) -> Check {
    ensure(f.dma_mappings() == 0, || "mappings survived close".into())?;
    bar0(f)?;
    dma_both_ways(f)
}

/// Removing the device while we own it: the kernel asks for it back
/// through the device-request interrupt, and waits until we close it.
fn unplug(f: KernelFunction, addr: PciAddress) -> Check {
    let req = EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?;
    f.set_irqs(IrqKind::Req, 0, &[Some(&req)]).map_err(e2s)?;
    let remove = format!("/sys/bus/pci/devices/{addr}/remove");
    let t = std::thread::spawn(move || std::fs::write(remove, "1"));
    let got = wait_irq(&req);
    drop(f);
    let removed = t.join().map_err(|_| "remove thread panicked".to_string())?;
    got?;
    removed.map_err(|e| format!("remove: {e}"))?;
    ensure(
        !std::path::Path::new(&format!("/sys/bus/pci/devices/{addr}")).exists(),
        || "the device is still there".into(),
    )
}

/// No-IOMMU mode (the guest has no IOMMU; vfio loaded with
/// enable_unsafe_noiommu_mode=1): refused unless asked for, then the
/// device is given physical addresses. The guest has 256 MiB, all of it
/// within edu's 28-bit DMA mask.
fn run_noiommu(rep: &mut Report, addr: PciAddress) {
    let refused = KernelFunction::open(addr, &OpenOptions::default());
    rep.record(
        "refused_unless_asked",
        match refused {
            Err(Error::Setup { problem, .. }) if problem.contains("no-IOMMU") => Ok(()),
            Err(e) => Err(format!("refused for another reason: {e}")),
            Ok(_) => Err("opened without being asked for no-IOMMU mode".into()),
        },
    );
    let opts = OpenOptions {
        noiommu: true,
        expect_id: Some(EDU),
        ..Default::default()
    };
    let f = match KernelFunction::open(addr, &opts) {
        Ok(f) => f,
        Err(e) => {
            rep.record("open_when_asked", Err(e2s(e)));
            return;
        }
    };
    rep.record(
        "open_when_asked",
        ensure(f.is_noiommu() && f.interface() == Interface::Group, || {
            format!("noiommu {} through {:?}", f.is_noiommu(), f.interface())
        })
        .and_then(|()| bar0(&f)),
    );
    rep.record("dma_with_physical_addresses", noiommu_dma(&f));
}

fn noiommu_dma(f: &KernelFunction) -> Check {
    let buf = DmaBuffer::new(4096).map_err(e2s)?;
    let refused = f.dma_map(Iova(0x10_0000), &buf);
    ensure(
        matches!(&refused, Err(Error::Iova { why, .. }) if why.contains("physical")),
        || format!("dma_map in no-IOMMU mode gave {refused:?}"),
    )?;
    let src = DmaBuffer::new(4096).map_err(e2s)?;
    let dst = DmaBuffer::new(4096).map_err(e2s)?;
    let ps = KernelFunction::physical_addresses(&src).map_err(e2s)?[0];
    let pd = KernelFunction::physical_addresses(&dst).map_err(e2s)?[0];
    ensure(ps < 1 << 28 && pd < 1 << 28, || {
        format!("physical addresses {ps:#x} {pd:#x} beyond edu's DMA mask")
    })?;
    enable(f)?;
    let regs = Regs(f.map_region(0).map_err(e2s)?);
    let irq = msi(f)?;
    let data = pattern(5);
    src.write(0, &data).map_err(e2s)?;
    edu_dma(&regs, &irq, ps, u64::from(EDU_BUF), false)?;
    edu_dma(&regs, &irq, u64::from(EDU_BUF), pd, true)?;
    f.set_irqs(IrqKind::Msi, 0, &[]).map_err(e2s)?;
    let mut got = vec![0u8; XFER];
    dst.read(0, &mut got).map_err(e2s)?;
    ensure(got == data, || "physical-address round trip differs".into())
}
