//! Hostile vfio-user clients (issue 15): what one client does must not
//! outlive it (a reset restores everything the model keeps), and a second
//! client can never hold up the owner.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use tests::backend::serve;
use tests::wait::until;
use verbs::device::Context;
use verbs::hca::{Hca, HcaOptions};
use vfio::user::header::{Command, Header, HEADER_SIZE};
use vfio::user::region::RegionAccess;
use vfio::user::socket::{self, Message};
use vfio::user::version::{Capabilities, Version};
use vfio::user::{VfioUserFunction, MAX_MESSAGE};
use vfio::PciFunction;
use zerocopy::IntoBytes;

/// Short advertised command timeouts: a function that cannot run commands
/// fails its bring-up in seconds, not the default minute.
fn cfg() -> mlx5_emu::DeviceConfig {
    mlx5_emu::DeviceConfig {
        cmd_exec_timeout_ms: 5_000,
        ..mlx5_emu::DeviceConfig::for_profile(mlx5_emu::Profile::ConnectX4Lx)
    }
}

/// A raw client that sends exactly what it is told.
struct Raw {
    sock: UnixStream,
    id: u16,
}

impl Raw {
    fn connect(path: &std::path::Path) -> Self {
        let sock = UnixStream::connect(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Raw { sock, id: 0 }
    }

    fn ask(&mut self, command: Command, parts: &[&[u8]]) -> Message {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        self.id = self.id.wrapping_add(1);
        let h = Header::command(self.id, command, len);
        socket::send(&self.sock, &h, parts, &[]).unwrap();
        let m = socket::recv(&self.sock, MAX_MESSAGE)
            .unwrap()
            .expect("a reply, not a hang-up");
        assert!(m.header.is_reply());
        assert_eq!(m.header.id, self.id);
        m
    }

    fn version(&mut self) {
        let v = Version { major: 0, minor: 1 };
        let m = self.ask(
            Command::Version,
            &[v.as_bytes(), &Capabilities::default().to_wire()],
        );
        assert_eq!(m.header.errno(), None, "VERSION accepted");
    }

    fn write(&mut self, region: u32, offset: u64, data: &[u8]) {
        let a = RegionAccess {
            offset,
            region,
            count: data.len() as u32,
        };
        let m = self.ask(Command::RegionWrite, &[a.as_bytes(), data]);
        assert_eq!(m.header.errno(), None, "REGION_WRITE at {offset:#x}");
    }
}

/// Panics naming each part of the state that differs, with the text
/// around its first difference (the whole state is too long to read).
fn same_state(want: &mlx5_emu::PowerOnState, got: &mlx5_emu::PowerOnState, when: &str) {
    if want == got {
        return;
    }
    let show = |what: &str, a: String, b: String| -> Option<String> {
        if a == b {
            return None;
        }
        let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        let from = at.saturating_sub(120);
        let cut = |s: &str| {
            s.get(from..(at + 120).min(s.len()))
                .unwrap_or("")
                .to_string()
        };
        Some(format!(
            "{what} differs at {at}:\n  power-on: ...{}\n  now:      ...{}",
            cut(&a),
            cut(&b)
        ))
    };
    let parts = [
        show(
            "config space",
            want.config_space.clone(),
            got.config_space.clone(),
        ),
        show(
            "BAR0",
            format!("{:x?}", want.bar0),
            format!("{:x?}", got.bar0),
        ),
        show("firmware", want.firmware.clone(), got.firmware.clone()),
        show("data path", want.data_path.clone(), got.data_path.clone()),
        show(
            "trapped",
            format!("{:?}", want.trapped),
            format!("{:?}", got.trapped),
        ),
        show(
            "stats",
            format!("{:?}", want.stats),
            format!("{:?}", got.stats),
        ),
    ];
    let diffs: Vec<String> = parts.into_iter().flatten().collect();
    panic!(
        "{when}, the model is not as at power-on:\n{}",
        diffs.join("\n")
    );
}

/// The reported scenario: VERSION, a 4-byte REGION_WRITE to the command
/// doorbell (BAR0 + 0x18), hang-up; the next client (which rings through
/// the mapped BAR) brings the function up.
#[test]
fn a_trapped_command_doorbell_does_not_outlive_its_client() {
    let (model, _bus, server) = serve(cfg());
    {
        let mut c = Raw::connect(server.path());
        c.version();
        c.write(0, 0x18, &1u32.to_be_bytes());
    }
    until("the release", || model.stats().resets == 1);
    let f = Arc::new(VfioUserFunction::connect(server.path()).unwrap());
    let hca = Hca::open(f, HcaOptions::default())
        .unwrap_or_else(|e| panic!("bring-up after the doorbell client: {e}"));
    hca.nop().unwrap();
    hca.close().unwrap();
}

/// Everything the model keeps, right after power-on and after clients that
/// did things and hung up: equal.
#[test]
fn a_reset_restores_power_on_state_completely() {
    let (model, bus, server) = serve(cfg());
    let power_on = model.power_on_state();

    // A raw client: stores the doorbell trapped, junk into UAR pages
    // nobody allocated and into the MSI-X table, enables bus mastering.
    {
        let mut c = Raw::connect(server.path());
        c.version();
        c.write(0, 0x18, &0x8000_0001u32.to_be_bytes());
        let uar = 0x40_0000u64;
        c.write(0, uar + 0x20, &0x1234_5678u32.to_be_bytes());
        c.write(0, uar + 0x800, &[0xab; 8]);
        c.write(0, mlx5_emu::initseg::MSIX_TABLE + 0x30, &[0x5a; 4]);
        c.write(7, 0x4, &0x0006u16.to_le_bytes());
    }
    until("the first release", || model.stats().resets == 1);
    same_state(
        &power_on,
        &model.power_on_state(),
        "after a raw client hung up",
    );

    // A driver: bring-up, a PD and a CQ, pages; hangs up with all of it
    // alive, as a process that dies does: nothing of it is torn down (a
    // teardown would ring commands through the still-mapped BAR, which no
    // dead process does; see ARCHITECTURE on stale mappings).
    {
        let f = Arc::new(VfioUserFunction::connect(server.path()).unwrap());
        let ctx = Context::open(f.clone(), HcaOptions::default()).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None, None).unwrap();
        assert!(model.stats().pages_held > 0);
        assert_ne!(model.power_on_state(), power_on);
        std::mem::forget((cq, pd, ctx));
        f.hang_up();
    }
    until("the second release", || model.stats().resets == 2);
    until("the mappings to go", || bus.dma.mappings() == 0);
    same_state(
        &power_on,
        &model.power_on_state(),
        "after a driver hung up with objects alive",
    );
}

/// A second client that trickles its first message (a byte every 400 ms,
/// on its own thread, until the test tells it to stop) does not hold up
/// the owner: the owner's requests are all answered, each within the
/// owner's own request timeout, while the trickler is connected and still
/// in the middle of its header. (Before the fix the owner's session thread
/// read the trickler's message, a second at most per byte, for as long as
/// the bytes kept coming: the owner's first request timed out.)
#[test]
fn a_trickling_second_client_never_stalls_the_owner() {
    const REQUESTS: usize = 50;
    let (_model, _bus, server) = serve(cfg());
    let opts = vfio::user::Options {
        timeout: Duration::from_secs(3),
    };
    let owner = VfioUserFunction::connect_with(server.path(), opts).unwrap();
    let trickler = UnixStream::connect(server.path()).unwrap();
    // A VERSION header promising a payload that never comes.
    let bytes = Header::command(1, Command::Version, 4096)
        .as_bytes()
        .to_vec();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (first, first_sent) = std::sync::mpsc::channel::<()>();
    let trickle = std::thread::spawn(move || {
        use std::io::Write;
        let mut sent = 0;
        while sent < bytes.len() {
            if (&trickler).write_all(&bytes[sent..sent + 1]).is_err() {
                break;
            }
            sent += 1;
            let _ = first.send(());
            match stopped.recv_timeout(Duration::from_millis(400)) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => break,
            }
        }
        (sent, trickler)
    });
    first_sent.recv().unwrap();
    let mut v = [0u8; 2];
    for i in 0..REQUESTS {
        owner
            .config_read(0, &mut v)
            .unwrap_or_else(|e| panic!("owner request {i} with a trickler connected: {e}"));
        assert_eq!(u16::from_le_bytes(v), 0x15b3);
    }
    stop.send(()).unwrap();
    let (sent, trickler) = trickle.join().unwrap();
    assert!(
        sent < HEADER_SIZE,
        "the trickler was still mid-header ({sent} of {HEADER_SIZE} bytes) when the owner was done"
    );
    // The trickler is never served: its connection ends (cut off at its
    // deadline) without a reply.
    trickler
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = std::io::Read::read(&mut &trickler, &mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the trickler gets no reply, only the hang-up");
}

/// `mlx5-emu serve --socket notes.txt`: binding over a regular file (or a
/// directory) is refused and leaves it alone; a stale socket is replaced.
#[test]
fn binding_never_deletes_what_is_not_a_stale_socket() {
    let dir = std::env::temp_dir().join(format!("mlx5-bind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, "keep me\n").unwrap();
    let bind = |p: &std::path::Path| {
        let bus = vfio::emulated::Bus::new();
        let model: Arc<dyn vfio::emulated::DeviceModel> =
            Arc::new(mlx5_emu::Device::new(cfg(), bus.clone()));
        vfio::user::Server::bind(p, model, bus)
    };
    let e = bind(&notes).unwrap_err().to_string();
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me\n");
    let sub = dir.join("a-directory");
    std::fs::create_dir_all(&sub).unwrap();
    assert!(bind(&sub).is_err());
    assert!(sub.is_dir());
    // A stale socket (its listener gone) is replaced.
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let s = bind(&stale).unwrap_or_else(|e| panic!("a stale socket is replaced: {e}"));
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}
