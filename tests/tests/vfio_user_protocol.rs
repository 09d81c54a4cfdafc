//! The vfio-user server against malformed and hostile clients, and the
//! client against dead or silent servers: every bad request gets an error
//! reply with an errno, the server keeps serving (the same client and the
//! next one), and the client turns every failure into an error.

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use tests::backend::{serve, socket_path};
use tests::wait::until;
use verbs::hca::{Hca, HcaOptions};
use vfio::user::device::DeviceInfo;
use vfio::user::dma::{DmaAccess, DmaMap, DmaUnmap, DMA_MAP_READ, DMA_MAP_WRITE};
use vfio::user::header::{Command, Header, HEADER_SIZE};
use vfio::user::irq::{IrqSet, IRQ_SET_ACTION_MASK, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD};
use vfio::user::region::{RegionAccess, RegionInfoWire, REGION_FLAG_CAPS};
use vfio::user::socket::{self, Message};
use vfio::user::version::{Capabilities, Version};
use vfio::user::{Options, VfioUserFunction, MAX_MESSAGE};
use vfio::{DmaBuffer, Error, PciFunction};
use zerocopy::IntoBytes;

fn cfg() -> mlx5_emu::DeviceConfig {
    mlx5_emu::DeviceConfig::for_profile(mlx5_emu::Profile::ConnectX4Lx)
}

/// A raw client: sends what it is told, reads one reply.
struct Raw {
    sock: UnixStream,
    id: u16,
}

impl Raw {
    fn connect(path: &std::path::Path) -> Self {
        let sock = UnixStream::connect(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut r = Raw { sock, id: 0 };
        let v = Version { major: 0, minor: 1 };
        let m = r.ask(
            Command::Version as u16,
            &[v.as_bytes(), &Capabilities::default().to_wire()],
        );
        assert_eq!(m.header.errno(), None, "VERSION accepted");
        r
    }

    fn send(&mut self, mut h: Header, parts: &[&[u8]], fds: &[std::os::fd::BorrowedFd<'_>]) -> u16 {
        self.id = self.id.wrapping_add(1);
        h.id = self.id;
        socket::send(&self.sock, &h, parts, fds).unwrap();
        self.id
    }

    fn reply(&self, id: u16) -> Message {
        let m = socket::recv(&self.sock, MAX_MESSAGE)
            .unwrap()
            .expect("a reply, not a hang-up");
        assert!(m.header.is_reply());
        assert_eq!(m.header.id, id, "the reply echoes the message ID");
        m
    }

    fn ask_with(
        &mut self,
        command: u16,
        parts: &[&[u8]],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Message {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        let h = Header {
            command,
            size: (HEADER_SIZE + len) as u32,
            ..Header::default()
        };
        let id = self.send(h, parts, fds);
        self.reply(id)
    }

    fn ask(&mut self, command: u16, parts: &[&[u8]]) -> Message {
        self.ask_with(command, parts, &[])
    }

    /// Asks, expects an error reply with `errno` and nothing after the header.
    fn refused(&mut self, what: &str, command: u16, parts: &[&[u8]], errno: i32) {
        let m = self.ask(command, parts);
        assert_eq!(m.header.errno(), Some(errno), "{what}: errno");
        assert!(
            m.payload.is_empty(),
            "{what}: an error reply carries only the header"
        );
    }

    /// The session still answers a well-formed request.
    fn still_serving(&mut self) {
        let req = DeviceInfo {
            argsz: 16,
            ..DeviceInfo::default()
        };
        let m = self.ask(Command::DeviceGetInfo as u16, &[req.as_bytes()]);
        assert_eq!(m.header.errno(), None);
        assert_eq!(m.payload.len(), 16);
    }
}

/// A full bring-up over a fresh client: the server is serving.
fn bring_up_works(path: &std::path::Path) {
    let f = std::sync::Arc::new(VfioUserFunction::connect(path).unwrap());
    let hca = Hca::open(f.clone(), HcaOptions::default()).unwrap();
    hca.nop().unwrap();
    hca.close().unwrap();
    assert_eq!(f.dma_mappings(), 0);
}

#[test]
fn malformed_messages_get_error_replies_and_the_server_keeps_serving() {
    let (model, bus, server) = serve(cfg());
    let mut c = Raw::connect(server.path());
    let bar = mlx5_emu::Profile::ConnectX4Lx.bar0_size();

    // Short: a size smaller than the header itself.
    let id = c.send(
        Header {
            command: Command::DeviceGetInfo as u16,
            size: 8,
            ..Header::default()
        },
        &[],
        &[],
    );
    assert_eq!(c.reply(id).header.errno(), Some(libc::EINVAL));
    c.still_serving();
    // Short: a payload shorter than the command's fixed part.
    c.refused(
        "short REGION_READ",
        Command::RegionRead as u16,
        &[&[0u8; 4]],
        libc::EINVAL,
    );
    c.refused(
        "short DMA_MAP",
        Command::DmaMap as u16,
        &[&[0u8; 8]],
        libc::EINVAL,
    );
    c.refused(
        "empty SET_IRQS",
        Command::DeviceSetIrqs as u16,
        &[],
        libc::EINVAL,
    );
    // Oversized: refused unread, the body skipped, the stream in step.
    let big = vec![0u8; MAX_MESSAGE];
    c.refused(
        "oversized",
        Command::RegionWrite as u16,
        &[&big],
        libc::E2BIG,
    );
    c.still_serving();
    // Bad commands: unknown, wrong direction, not served.
    c.refused("command 99", 99, &[&[1, 2, 3]], libc::ENOSYS);
    c.refused("command 14", 14, &[], libc::ENOSYS);
    c.refused(
        "DMA_READ to a server",
        Command::DmaRead as u16,
        &[&[0u8; 16]],
        libc::EINVAL,
    );
    c.refused(
        "DEVICE_FEATURE",
        Command::DeviceFeature as u16,
        &[&[0u8; 8]],
        libc::ENOTSUP,
    );
    // Bad regions and accesses.
    let info = |index| RegionInfoWire {
        argsz: 32,
        index,
        ..RegionInfoWire::default()
    };
    c.refused(
        "region info 100",
        Command::DeviceGetRegionInfo as u16,
        &[info(100).as_bytes()],
        libc::EINVAL,
    );
    let rd = |region, offset, count| RegionAccess {
        offset,
        region,
        count,
    };
    c.refused(
        "read region 42",
        Command::RegionRead as u16,
        &[rd(42, 0, 4).as_bytes()],
        libc::EINVAL,
    );
    c.refused(
        "read region 3 (absent)",
        Command::RegionRead as u16,
        &[rd(3, 0, 4).as_bytes()],
        libc::EINVAL,
    );
    c.refused(
        "read past BAR0",
        Command::RegionRead as u16,
        &[rd(0, bar - 2, 4).as_bytes()],
        libc::EINVAL,
    );
    c.refused(
        "read past config",
        Command::RegionRead as u16,
        &[rd(7, 4095, 2).as_bytes()],
        libc::EINVAL,
    );
    c.refused(
        "offset wraps",
        Command::RegionRead as u16,
        &[rd(0, u64::MAX, 4).as_bytes()],
        libc::EINVAL,
    );
    c.refused(
        "write with less data than its count",
        Command::RegionWrite as u16,
        &[rd(0, 0x18, 4).as_bytes(), &[0u8; 2]],
        libc::EINVAL,
    );
    // DMA: no fd, a file too small, overlap (an unmap of a range holding
    // nothing succeeds, as the kernel's: qemu_viommu_* below).
    let map = DmaMap {
        argsz: 32,
        flags: DMA_MAP_READ | DMA_MAP_WRITE,
        offset: 0,
        address: 0x10_0000,
        size: 0x2000,
    };
    c.refused(
        "DMA_MAP without an fd, not 4 KiB aligned",
        Command::DmaMap as u16,
        &[DmaMap { size: 0x10, ..map }.as_bytes()],
        libc::EINVAL,
    );
    let small = DmaBuffer::new(0x1000).unwrap();
    let m = c.ask_with(
        Command::DmaMap as u16,
        &[map.as_bytes()],
        &[small.file().as_fd()],
    );
    assert_eq!(
        m.header.errno(),
        Some(libc::EINVAL),
        "a mapping past the end of its file"
    );
    let fit = DmaMap {
        size: 0x1000,
        ..map
    };
    let m = c.ask_with(
        Command::DmaMap as u16,
        &[fit.as_bytes()],
        &[small.file().as_fd()],
    );
    assert_eq!(m.header.errno(), None);
    let m = c.ask_with(
        Command::DmaMap as u16,
        &[fit.as_bytes()],
        &[small.file().as_fd()],
    );
    assert_eq!(
        m.header.errno(),
        Some(libc::EEXIST),
        "a mapping over a mapping"
    );
    assert_eq!(bus.dma.mappings(), 1);
    // Interrupts: no such type, too many vectors, mask.
    let set = |index, flags, count| IrqSet {
        argsz: 20,
        flags,
        index,
        start: 0,
        count,
    };
    let trig = IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER;
    c.refused(
        "SET_IRQS type 9",
        Command::DeviceSetIrqs as u16,
        &[set(9, trig, 1).as_bytes()],
        libc::EINVAL,
    );
    c.refused(
        "SET_IRQS 5000 vectors",
        Command::DeviceSetIrqs as u16,
        &[set(2, trig, 5000).as_bytes()],
        libc::EINVAL,
    );
    let mask = IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_MASK;
    c.refused(
        "SET_IRQS mask",
        Command::DeviceSetIrqs as u16,
        &[set(2, mask, 1).as_bytes()],
        libc::EINVAL,
    );
    c.still_serving();
    // The device itself was not disturbed: no command, no DMA fault.
    assert_eq!(model.stats().commands, 0);
    assert_eq!(model.stats().dma_faults, 0);

    // The client leaves; its mapping goes with it; the next client works.
    drop(c);
    until("the release", || bus.dma.mappings() == 0);
    bring_up_works(server.path());
}

/// What QEMU 11 sends when a guest with an emulated Intel IOMMU
/// (caching-mode=on) moves the function from the passthrough domain to a
/// DMA domain (vfio-pci bound in the guest): the RAM mappings go by exact
/// unmaps, then `vtd_address_space_unmap` invalidates the whole 48-bit
/// space in power-of-two pieces, none holding a mapping (seen in the guest:
/// `vfio_container_dma_unmap(..., 0xfef00000, 0x100000) = -2`). Each
/// succeeds, as VFIO_IOMMU_UNMAP_DMA does; a range over two mappings takes
/// both; one that would split a mapping is refused and unmaps nothing.
#[test]
fn qemu_viommu_invalidation_unmaps_whole_ranges() {
    let (_model, bus, server) = serve(cfg());
    let mut c = Raw::connect(server.path());
    let _ = qemu_version(&mut c);
    let buf = DmaBuffer::new(0x4000).unwrap();
    let map = |address, offset| DmaMap {
        argsz: 32,
        flags: DMA_MAP_READ | DMA_MAP_WRITE,
        offset,
        address,
        size: 0x1000,
    };
    for (iova, off) in [(0x10_0000, 0), (0x10_1000, 0x1000), (0x20_0000, 0x2000)] {
        let m = c.ask_with(
            Command::DmaMap as u16,
            &[map(iova, off).as_bytes()],
            &[buf.file().as_fd()],
        );
        assert_eq!(m.header.errno(), None);
    }
    let unmap = |address, size| DmaUnmap {
        argsz: 24,
        flags: 0,
        address,
        size,
    };
    // The invalidation's pieces that hold nothing (the high ones first,
    // as QEMU sends them).
    let mut piece = 0x8000_0000_0000u64;
    while piece >= 0x1000_0000 {
        let un = unmap(piece, piece);
        let r = c.ask(Command::DmaUnmap as u16, &[un.as_bytes()]);
        assert_eq!(r.header.errno(), None, "unmap {piece:#x}+{piece:#x}");
        assert_eq!(r.payload, un.as_bytes());
        piece >>= 1;
    }
    assert_eq!(bus.dma.mappings(), 3);
    // A range that would split the first mapping: refused, nothing goes.
    c.refused(
        "unmap splitting a mapping",
        Command::DmaUnmap as u16,
        &[unmap(0x10_0800, 0x1000).as_bytes()],
        libc::EINVAL,
    );
    assert_eq!(bus.dma.mappings(), 3);
    // A range holding two mappings takes both, the third stays.
    let r = c.ask(Command::DmaUnmap as u16, &[unmap(0, 0x20_0000).as_bytes()]);
    assert_eq!(r.header.errno(), None);
    assert_eq!(bus.dma.mappings(), 1);
    assert!(!bus.dma.is_mapped(0x10_0000, 1) && bus.dma.is_mapped(0x20_0000, 0x1000));
    c.still_serving();
}

#[test]
fn a_client_dying_mid_message_or_mid_run_leaves_the_server_ready() {
    let (model, bus, server) = serve(cfg());
    // Dies in the middle of a message: a header promising 100 bytes, then 10.
    {
        let c = Raw::connect(server.path());
        let h = Header::command(9, Command::RegionWrite, 100);
        socket::send(&c.sock, &h, &[&[0u8; 10]], &[]).unwrap();
    }
    bring_up_works(server.path());
    // Dies with DMA mapped and vectors attached: hangs up without any
    // teardown, as a killed process does (the client's drop only closes).
    {
        let f = VfioUserFunction::connect(server.path()).unwrap();
        let buf = DmaBuffer::new(1 << 20).unwrap();
        f.dma_map(vfio::Iova(1 << 30), &buf).unwrap();
        let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        f.set_irqs(vfio::IrqKind::MsiX, 0, &[Some(&efd)]).unwrap();
        assert_eq!((bus.dma.mappings(), bus.irqs.attached()), (1, 1));
        drop(f);
    }
    until("the release", || {
        bus.dma.mappings() == 0 && bus.irqs.attached() == 0
    });
    bring_up_works(server.path());
    assert!(
        model.stats().resets >= 2,
        "the function was reset on each release"
    );
}

#[test]
fn a_second_client_is_turned_away_busy() {
    let (_model, _bus, server) = serve(cfg());
    let first = VfioUserFunction::connect(server.path()).unwrap();
    match VfioUserFunction::connect(server.path()) {
        Err(Error::Refused { errno, .. }) => assert_eq!(errno, libc::EBUSY),
        other => panic!("expected EBUSY, got {other:?}"),
    }
    // The first owner is undisturbed.
    let mut v = [0u8; 2];
    first.config_read(0, &mut v).unwrap();
    assert_eq!(u16::from_le_bytes(v), 0x15b3);
}

#[test]
fn a_server_that_dies_or_never_answers_is_an_error() {
    let (_model, _bus, server) = serve(cfg());
    let f = VfioUserFunction::connect(server.path()).unwrap();
    let mut v = [0u8; 4];
    f.config_read(0, &mut v).unwrap();
    drop(server);
    match f.config_read(0, &mut v) {
        Err(Error::Gone(_)) => {}
        other => panic!("expected Gone, got {other:?}"),
    }
    // Every later request too, at once.
    assert!(matches!(f.reset(), Err(Error::Gone(_))));

    // A server that accepts and never answers.
    let path = socket_path("silent");
    let listener = UnixListener::bind(&path).unwrap();
    let opts = Options {
        timeout: Duration::from_millis(200),
    };
    match VfioUserFunction::connect_with(&path, opts) {
        Err(Error::Timeout { command, .. }) => assert_eq!(command, "VFIO_USER_VERSION"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(listener);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn client_serves_dma_read_and_write_from_the_server() {
    // A hand-written server: negotiates, describes a device with no
    // regions, then reaches the client's memory by message.
    let path = socket_path("dmamsg");
    let listener = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let answer = |payload: &[&[u8]]| {
            let m = socket::recv(&s, MAX_MESSAGE).unwrap().unwrap();
            let len = payload.iter().map(|p| p.len()).sum();
            socket::send(&s, &m.header.reply(len), payload, &[]).unwrap();
            m
        };
        let v = Version { major: 0, minor: 1 };
        answer(&[v.as_bytes(), &Capabilities::default().to_wire()]);
        let info = DeviceInfo {
            argsz: 16,
            flags: vfio::user::device::DEVICE_FLAGS_PCI,
            num_regions: 0,
            num_irqs: 0,
        };
        answer(&[info.as_bytes()]);
        // The client maps a buffer by fd; this server reads it by message.
        let map = answer(&[]);
        assert_eq!(map.fds.len(), 1);
        let (m, _) = <DmaMap as zerocopy::FromBytes>::read_from_prefix(&map.payload).unwrap();
        let write = vfio::user::dma::DmaAccess {
            address: m.address + 8,
            count: 4,
        };
        let h = Header::command(100, Command::DmaWrite, 20);
        socket::send(&s, &h, &[write.as_bytes(), b"\xde\xad\xbe\xef"], &[]).unwrap();
        let r = socket::recv(&s, MAX_MESSAGE).unwrap().unwrap();
        assert!(r.header.is_reply() && r.header.id == 100 && r.header.errno().is_none());
        let read = vfio::user::dma::DmaAccess {
            address: m.address,
            count: 16,
        };
        let h = Header::command(101, Command::DmaRead, 16);
        socket::send(&s, &h, &[read.as_bytes()], &[]).unwrap();
        let r = socket::recv(&s, MAX_MESSAGE).unwrap().unwrap();
        assert_eq!(r.header.id, 101);
        let data = r.payload[16..].to_vec();
        // Outside every mapping: an error reply, not a crash.
        let far = vfio::user::dma::DmaAccess {
            address: 0xdead_0000,
            count: 4,
        };
        let h = Header::command(102, Command::DmaRead, 16);
        socket::send(&s, &h, &[far.as_bytes()], &[]).unwrap();
        let r = socket::recv(&s, MAX_MESSAGE).unwrap().unwrap();
        assert_eq!(r.header.errno(), Some(libc::EFAULT));
        data
    });
    let f = VfioUserFunction::connect(&path).unwrap();
    let buf = DmaBuffer::new(4096).unwrap();
    buf.write(0, b"abcdefgh").unwrap();
    f.dma_map(vfio::Iova(0x4000), &buf).unwrap();
    let data = server.join().unwrap();
    assert_eq!(&data[..12], b"abcdefgh\xde\xad\xbe\xef");
    let mut b = [0u8; 4];
    buf.read(8, &mut b).unwrap();
    assert_eq!(&b, b"\xde\xad\xbe\xef");
    let _ = std::fs::remove_file(&path);
}

// What QEMU 11's vfio-user client (hw/vfio-user/) sends, message for
// message, and the checks it makes on the replies.

impl Raw {
    /// Connected, nothing sent yet.
    fn bare(path: &std::path::Path) -> Self {
        let sock = UnixStream::connect(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Raw { sock, id: 0 }
    }
}

/// QEMU's `caps_json()`: its own limits, a migration object and
/// write_multiple; major 0, minor 0.
fn qemu_version(c: &mut Raw) -> Message {
    let caps = br#"{"capabilities": {"migration": {"pgsize": 4096, "max_bitmap_size": 268435456}, "max_msg_fds": 16, "max_data_xfer_size": 1048576, "pgsizes": 4096, "max_dma_maps": 65535, "write_multiple": true}}"#;
    let v = Version { major: 0, minor: 0 };
    c.ask(Command::Version as u16, &[v.as_bytes(), caps, &[0]])
}

#[test]
fn qemu_version_reply_passes_qemus_capability_checks() {
    let (_model, _bus, server) = serve(cfg());
    let mut c = Raw::bare(server.path());
    let m = qemu_version(&mut c);
    assert_eq!(m.header.errno(), None);
    let (v, rest) = m.payload.split_at(4);
    assert_eq!(
        v,
        Version { major: 0, minor: 0 }.as_bytes(),
        "minor no higher than QEMU's 0"
    );
    assert_eq!(
        rest.last(),
        Some(&0),
        "NUL-terminated (QEMU: corrupt version reply)"
    );
    let json: serde_json::Value = serde_json::from_slice(&rest[..rest.len() - 1]).unwrap();
    let caps = &json["capabilities"];
    // QEMU's check_max_fds, check_max_xfer, check_max_dma, check_pgsizes.
    let fds = caps["max_msg_fds"].as_u64().unwrap();
    assert!(fds <= 16, "max_msg_fds {fds} > VFIO_USER_MAX_MAX_FDS (16)");
    let xfer = caps["max_data_xfer_size"].as_u64().unwrap();
    assert!(xfer <= 64 << 20, "max_data_xfer_size {xfer} > 64 MiB");
    let maps = caps["max_dma_maps"].as_u64().unwrap();
    assert!(maps <= 65535, "max_dma_maps {maps} > 65535");
    let pg = caps["pgsizes"].as_u64().unwrap();
    assert_eq!(pg % 4096, 0, "pgsizes below 4 KiB");
    c.still_serving();
}

#[test]
fn qemu_region_info_with_a_short_argsz_then_the_full_one() {
    let (_model, _bus, server) = serve(cfg());
    let mut c = Raw::bare(server.path());
    assert_eq!(qemu_version(&mut c).header.errno(), None);
    // QEMU asks with argsz = sizeof(struct vfio_region_info) and checks:
    // with the CAPS flag, cap_offset must lie in [32, argsz]; a larger argsz
    // in the reply makes it ask again with that.
    let head = std::mem::size_of::<RegionInfoWire>() as u32;
    let ask = |c: &mut Raw, argsz| {
        let req = RegionInfoWire {
            argsz,
            index: 0,
            ..RegionInfoWire::default()
        };
        let m = c.ask(Command::DeviceGetRegionInfo as u16, &[req.as_bytes()]);
        assert_eq!(m.header.errno(), None);
        let (info, _) =
            <RegionInfoWire as zerocopy::FromBytes>::read_from_prefix(&m.payload).unwrap();
        (info, m)
    };
    let (short, m) = ask(&mut c, head);
    assert_eq!(m.payload.len(), head as usize, "only the head fits");
    assert!(short.argsz > head, "argsz says how much to ask for");
    assert!(
        short.flags & REGION_FLAG_CAPS == 0
            || (short.cap_offset >= head && short.cap_offset <= short.argsz),
        "QEMU refuses CAPS with cap_offset {} (argsz {})",
        short.cap_offset,
        short.argsz
    );
    let (full, m) = ask(&mut c, short.argsz);
    assert_eq!(full.argsz, short.argsz);
    assert_ne!(
        full.flags & REGION_FLAG_CAPS,
        0,
        "the chain comes with the full reply"
    );
    assert_eq!(
        full.cap_offset, head,
        "the sparse-mmap capability follows the head"
    );
    assert_eq!(m.payload.len(), full.argsz as usize);
    assert_eq!(m.fds.len(), 1, "BAR0's memory by fd");
    c.still_serving();
}

#[test]
fn qemu_wires_intx_err_and_req_with_eventfds() {
    let (_model, bus, server) = serve(cfg());
    let mut c = Raw::bare(server.path());
    assert_eq!(qemu_version(&mut c).header.errno(), None);
    // GET_IRQ_INFO on VFIO_PCI_INTX_IRQ_INDEX: config space has pin INTA,
    // so one line, by eventfd (as vfio-pci counts it).
    let req = vfio::user::irq::IrqInfo {
        argsz: 16,
        index: 0,
        ..Default::default()
    };
    let m = c.ask(Command::DeviceGetIrqInfo as u16, &[req.as_bytes()]);
    assert_eq!(m.header.errno(), None);
    let (info, _) =
        <vfio::user::irq::IrqInfo as zerocopy::FromBytes>::read_from_prefix(&m.payload).unwrap();
    assert_eq!(info.count, 1);
    assert_ne!(info.flags & vfio::user::irq::IRQ_INFO_EVENTFD, 0);
    // vfio_intx_enable: SET_IRQS trigger, eventfd, argsz 20, one fd.
    let efd = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    let set = IrqSet {
        argsz: 20,
        flags: IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER,
        index: 0,
        start: 0,
        count: 1,
    };
    // SAFETY: `efd` is open for the whole call and outlives the borrow.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(std::os::fd::AsRawFd::as_raw_fd(&efd)) };
    let m = c.ask_with(Command::DeviceSetIrqs as u16, &[set.as_bytes()], &[fd]);
    assert_eq!(m.header.errno(), None, "INTx eventfd accepted");
    assert_eq!(bus.irqs.attached_of(vfio::IrqKind::Intx), 1);
    // vfio_intx_disable (when MSI-X comes on): trigger, no data, count 0.
    let off = IrqSet {
        flags: vfio::user::irq::IRQ_SET_DATA_NONE | IRQ_SET_ACTION_TRIGGER,
        count: 0,
        ..set
    };
    let m = c.ask(Command::DeviceSetIrqs as u16, &[off.as_bytes()]);
    assert_eq!(m.header.errno(), None);
    assert_eq!(bus.irqs.attached_of(vfio::IrqKind::Intx), 0);
    // vfio_register_err_notifier and vfio_register_req_notifier: the error
    // interrupt (a PCIe function) and the request interrupt, one each, by
    // eventfd, as vfio-pci offers them.
    for (index, kind) in [(3, vfio::IrqKind::Err), (4, vfio::IrqKind::Req)] {
        let req = vfio::user::irq::IrqInfo {
            argsz: 16,
            index,
            ..Default::default()
        };
        let m = c.ask(Command::DeviceGetIrqInfo as u16, &[req.as_bytes()]);
        let (info, _) =
            <vfio::user::irq::IrqInfo as zerocopy::FromBytes>::read_from_prefix(&m.payload)
                .unwrap();
        assert_eq!(info.count, 1, "{kind:?}");
        let m = c.ask_with(
            Command::DeviceSetIrqs as u16,
            &[IrqSet { index, ..set }.as_bytes()],
            &[fd],
        );
        assert_eq!(m.header.errno(), None, "{kind:?} eventfd accepted");
        assert_eq!(bus.irqs.attached_of(kind), 1);
    }
    c.still_serving();
}

#[test]
fn qemu_maps_memory_without_an_fd_and_the_device_reaches_it_by_message() {
    let (_model, bus, server) = serve(cfg());
    let mut c = Raw::bare(server.path());
    assert_eq!(qemu_version(&mut c).header.errno(), None);
    // vfio_user_dma_map for a region with no fd (the BIOS ROM, read only;
    // another device's BAR, read-write): argsz 32, offset 0, no SCM_RIGHTS.
    let bios = DmaMap {
        argsz: 32,
        flags: DMA_MAP_READ,
        offset: 0,
        address: 0xfffc_0000,
        size: 0x4_0000,
    };
    let bar = DmaMap {
        flags: DMA_MAP_READ | DMA_MAP_WRITE,
        address: 0xf800_0000,
        size: 0x4000,
        ..bios
    };
    for m in [bios, bar] {
        let r = c.ask(Command::DmaMap as u16, &[m.as_bytes()]);
        assert_eq!(
            r.header.errno(),
            None,
            "DMA_MAP {:#x} without an fd",
            m.address
        );
    }
    assert!(bus.dma.is_mapped(0xfffc_0000, 0x4_0000));
    c.refused(
        "a mapping over a mapping",
        Command::DmaMap as u16,
        &[DmaMap {
            size: 0x1000,
            ..bar
        }
        .as_bytes()],
        libc::EEXIST,
    );

    // The device reads: the client gets DMA_READ (address, count) and
    // answers with the data after them.
    let dma = bus.dma.clone();
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        dma.read(0xffff_fff0, &mut b).map(|()| b)
    });
    let m = socket::recv(&c.sock, MAX_MESSAGE).unwrap().unwrap();
    assert!(!m.header.is_reply());
    assert_eq!(m.header.command, Command::DmaRead as u16);
    let (a, _) = <DmaAccess as zerocopy::FromBytes>::read_from_prefix(&m.payload).unwrap();
    assert_eq!((a.address, a.count), (0xffff_fff0, 8));
    socket::send(
        &c.sock,
        &m.header.reply(24),
        &[a.as_bytes(), b"reset-vc"],
        &[],
    )
    .unwrap();
    assert_eq!(&reader.join().unwrap().unwrap(), b"reset-vc");

    // The device writes: DMA_WRITE carries the data; the reply echoes the head.
    let dma = bus.dma.clone();
    let writer = std::thread::spawn(move || dma.write(0xf800_0100, b"doorbell"));
    let m = socket::recv(&c.sock, MAX_MESSAGE).unwrap().unwrap();
    assert_eq!(m.header.command, Command::DmaWrite as u16);
    let (a, data) = <DmaAccess as zerocopy::FromBytes>::read_from_prefix(&m.payload).unwrap();
    assert_eq!(
        (a.address, a.count, data),
        (0xf800_0100, 8, &b"doorbell"[..])
    );
    socket::send(&c.sock, &m.header.reply(16), &[a.as_bytes()], &[]).unwrap();
    writer.join().unwrap().unwrap();

    // A refusal from the client is a DMA fault, not a hang.
    let dma = bus.dma.clone();
    let refused = std::thread::spawn(move || dma.write(0xf800_0000, &[1]));
    let m = socket::recv(&c.sock, MAX_MESSAGE).unwrap().unwrap();
    socket::send(&c.sock, &m.header.error_reply(libc::EFAULT), &[], &[]).unwrap();
    assert!(refused.join().unwrap().is_err());
    // Past the end of the window: a fault, no message.
    let mut b = [0u8; 8];
    assert!(bus.dma.read(0xf800_3ffc, &mut b).is_err());

    // vfio_user_dma_unmap: argsz 24, flags 0, exactly the range mapped;
    // the reply echoes it.
    let un = DmaUnmap {
        argsz: 24,
        flags: 0,
        address: bar.address,
        size: bar.size,
    };
    let r = c.ask(Command::DmaUnmap as u16, &[un.as_bytes()]);
    assert_eq!(r.header.errno(), None);
    assert_eq!(r.payload, un.as_bytes());
    assert!(!bus.dma.is_mapped(0xf800_0000, 1));
    assert!(
        bus.dma.write(0xf800_0100, b"gone").is_err(),
        "unmapped: a fault"
    );
    c.still_serving();
    // The client leaves: the ROM window goes with it.
    drop(c);
    until("the release", || bus.dma.mappings() == 0);
}
