//! `mlx5-emu`: the device model as a process of its own, serving emulated
//! ConnectX functions over vfio-user.
//!
//! `mlx5-emu serve --socket PATH [--profile cx4lx] [--functions N]` serves
//! function 0 on `PATH` and function `i` on `PATH.i` (`PATH.1`, ...), each
//! its own device with its own server thread, one client at a time, their
//! ports cabled together (`mlx5_emu::Fabric`: two make a cable). Any
//! vfio-user client can open them; this workspace's tools take
//! `-d vfio-user:PATH`. SIGINT or SIGTERM stops the servers and removes
//! the sockets.
//!
//! `--wire SPEC` connects the ports to another process (another
//! `mlx5-emu serve`, a QEMU guest's `-netdev dgram`/`stream` NIC) as
//! RoCEv2 frames on a socket; `--pcap FILE` captures them, `--wire-faults`
//! loses, duplicates, reorders, corrupts and delays them from a seed. Two
//! processes on one wire need different MACs (`--mac`). The wire's counts
//! are logged while they move and printed at exit, as are each
//! function's data-path counts (packets, CQEs, compressed CQEs).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use mlx5_emu::{Device, DeviceConfig, Fabric, Profile};
use tools::dev::Dev;
use vfio::emulated::{Bus, DeviceModel};
use vfio::user::Server;

#[derive(Parser, Debug)]
#[command(
    name = "mlx5-emu",
    version,
    about = "The ConnectX device model, served over vfio-user"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve emulated functions on UNIX sockets until SIGINT/SIGTERM.
    Serve {
        /// Socket of function 0; function i (i > 0) listens on PATH.i.
        #[arg(long)]
        socket: PathBuf,
        /// Which card: cx4lx, cx5, cx6 or cx7.
        #[arg(long, default_value = "cx4lx", value_parser = parse_profile)]
        profile: Profile,
        /// How many functions to serve, their ports cabled together.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        functions: u32,
        /// Serve the init-segment page and the first UAR page (EQ
        /// doorbells) trapped, not mapped, so every write to them is seen:
        /// for clients that trap unmapped BAR pages (QEMU's vfio-user-pci).
        /// Our own client needs them mapped.
        #[arg(long)]
        trap_control_pages: bool,
        /// MAC of function 0 (function i: plus i), hex with or without
        /// colons; two processes on one wire need different ones.
        #[arg(long, value_parser = parse_mac)]
        mac: Option<u64>,
        #[command(flatten)]
        wire: WireArgs,
    },
}

/// The port's link to another process (`mlx5_emu::wire`).
#[derive(clap::Args, Debug, Clone)]
struct WireArgs {
    /// Connect the ports to another process: `dgram,local=A,remote=B`
    /// (one frame per datagram), `stream,server=on,addr=A` or
    /// `stream,addr=A` (4-byte big-endian length before each frame);
    /// A, B: 127.0.0.1:PORT or a Unix socket path (QEMU's `-netdev
    /// dgram` / `-netdev stream`).
    #[arg(long, value_parser = mlx5_emu::wire::LinkSpec::parse)]
    wire: Option<mlx5_emu::wire::LinkSpec>,
    /// Capture every frame on the wire to this pcap file.
    #[arg(long, requires = "wire")]
    pcap: Option<PathBuf>,
    /// Faults on the frames this end sends, deterministic from the seed:
    /// `seed=N,loss=P,dup=P,reorder=P,window=N,corrupt=P,delay=P,delay_us=N`.
    #[arg(long, requires = "wire", value_parser = mlx5_emu::wire::WireFaults::parse)]
    wire_faults: Option<mlx5_emu::wire::WireFaults>,
    /// How long (ms, real time) a send queue waits for a response from the
    /// other process before it counts as lost.
    #[arg(long, default_value_t = 200)]
    response_wait_ms: u64,
}

fn parse_mac(s: &str) -> Result<u64, String> {
    let hex: String = s.chars().filter(|c| *c != ':').collect();
    let v = u64::from_str_radix(&hex, 16).map_err(|_| format!("{s:?}: not a MAC"))?;
    if hex.len() != 12 || v & 0x0100_0000_0000 != 0 {
        return Err(format!("{s:?}: not a unicast MAC of 6 bytes"));
    }
    Ok(v)
}

fn parse_profile(s: &str) -> Result<Profile, String> {
    match Dev::parse(Some(&format!("emu:{s}")))? {
        Dev::Emu(p) => Ok(p),
        _ => Err(format!("unknown profile {s:?}")),
    }
}

/// Set by SIGINT/SIGTERM; the main thread polls it.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::Release);
}

/// The socket of function `i`.
fn socket_of(base: &std::path::Path, i: u32) -> PathBuf {
    if i == 0 {
        return base.to_path_buf();
    }
    let mut s = base.as_os_str().to_owned();
    s.push(format!(".{i}"));
    PathBuf::from(s)
}

fn serve(
    socket: PathBuf,
    profile: Profile,
    functions: u32,
    trap_control_pages: bool,
    mac: Option<u64>,
    wire: &WireArgs,
) -> Result<(), String> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        vmm_sys_util::signal::register_signal_handler(sig, on_signal)
            .map_err(|e| format!("installing the signal handler: {e}"))?;
    }
    // The functions' ports are cabled together (two: a cable; more: a
    // switch; one: looped back), so clients of different sockets exchange
    // RDMA traffic. Each function has its own MAC, hence its own GIDs.
    let fabric = Fabric::new();
    let mut servers = Vec::new();
    let mut devs = Vec::new();
    for i in 0..functions {
        let path = socket_of(&socket, i);
        let bus = Bus::new();
        let mut cfg = DeviceConfig::for_profile(profile);
        cfg.mac = mac.unwrap_or(mlx5_emu::DEFAULT_MAC) + u64::from(i);
        cfg.trap_control_pages = trap_control_pages;
        let dev = Arc::new(Device::new(cfg, bus.clone()));
        fabric.attach(&dev);
        devs.push(dev.clone());
        let dev: Arc<dyn DeviceModel> = dev;
        let server =
            Server::bind(&path, dev, bus).map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::info!(function = i, socket = %path.display(), profile = profile.short(), "serving");
        servers.push(
            server
                .spawn()
                .map_err(|e| format!("{}: {e}", path.display()))?,
        );
    }
    let link = match &wire.wire {
        Some(spec) => {
            let opts = mlx5_emu::wire::LinkOptions {
                pcap: wire.pcap.clone(),
                faults: wire.wire_faults.unwrap_or_default(),
                response_wait: Duration::from_millis(wire.response_wait_ms),
                ..Default::default()
            };
            let l = fabric
                .connect(spec, &opts)
                .map_err(|e| format!("wire {spec}: {e}"))?;
            eprintln!("mlx5-emu: wire {spec}");
            Some(l)
        }
        None => None,
    };
    eprintln!(
        "mlx5-emu: serving {functions} {} function(s) on {}{}",
        profile.name(),
        socket.display(),
        if functions > 1 {
            format!(" .. {}", socket_of(&socket, functions - 1).display())
        } else {
            String::new()
        }
    );
    let mut last = None;
    let mut ticks = 0u32;
    while !STOP.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        ticks += 1;
        // The wire's counts, every 5 s while they move.
        if let Some(l) = link.as_ref().filter(|_| ticks % 50 == 0) {
            let s = l.stats();
            if last != Some(s) {
                tracing::info!(stats = ?s, "wire");
                last = Some(s);
            }
        }
    }
    tracing::info!("stopping");
    if let Some(l) = &link {
        l.close();
        eprintln!("mlx5-emu: wire {}", wire_summary(&l.stats()));
    }
    // Each function's data-path counts while it was served, its resets
    // included (what a test or a person reads at exit).
    for (i, d) in devs.iter().enumerate() {
        let l = d.stats().lifetime;
        eprintln!(
            "mlx5-emu: function {i} packets_sent {} packets_received {} cqes {} \
             cqes_compressed {} compressed_sessions {} error_cqes {} dropped {}",
            l.packets_sent,
            l.packets_received,
            l.cqes,
            l.cqes_compressed,
            l.compressed_sessions,
            l.error_cqes,
            l.dropped
        );
    }
    // Each server stops, releases its function and removes its socket.
    drop(servers);
    drop(fabric);
    eprintln!("mlx5-emu: stopped");
    Ok(())
}

/// The wire's counts in one line (what a test or a person reads at exit).
fn wire_summary(s: &mlx5_emu::wire::LinkStats) -> String {
    format!(
        "tx_frames {} tx_raw {} tx_errors {} rx_frames {} rx_delivered {} rx_raw {} rx_malformed {} \
         rx_bad_icrc {} rx_unknown_gid {} rx_giant {} rx_truncated {} rx_stale {} \
         response_timeouts {} lost {} duplicated {} reordered {} corrupted {} delayed {} \
         loss_wakeups {} tx_loss_notices {} rx_loss_notices {} tx_loss_probes {} rx_loss_probes {}",
        s.tx_frames,
        s.tx_raw,
        s.tx_errors,
        s.rx_frames,
        s.rx_delivered,
        s.rx_raw,
        s.rx_malformed,
        s.rx_bad_icrc,
        s.rx_unknown_gid,
        s.rx_giant,
        s.rx_truncated,
        s.rx_stale,
        s.response_timeouts,
        s.faults.lost,
        s.faults.duplicated,
        s.faults.reordered,
        s.faults.corrupted,
        s.faults.delayed,
        s.loss_wakeups,
        s.tx_loss_notices,
        s.rx_loss_notices,
        s.tx_loss_probes,
        s.rx_loss_probes,
    )
}

fn main() -> ExitCode {
    tools::init_tracing("info");
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Serve {
            socket,
            profile,
            functions,
            trap_control_pages,
            mac,
            wire,
        } => serve(socket, profile, functions, trap_control_pages, mac, &wire),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mlx5-emu: {e}");
            ExitCode::FAILURE
        }
    }
}
