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
    },
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
    for i in 0..functions {
        let path = socket_of(&socket, i);
        let bus = Bus::new();
        let mut cfg = DeviceConfig::for_profile(profile);
        cfg.mac = mlx5_emu::DEFAULT_MAC + u64::from(i);
        cfg.trap_control_pages = trap_control_pages;
        let dev = Arc::new(Device::new(cfg, bus.clone()));
        fabric.attach(&dev);
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
    while !STOP.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("stopping");
    // Each server stops, releases its function and removes its socket.
    drop(servers);
    drop(fabric);
    eprintln!("mlx5-emu: stopped");
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Serve {
            socket,
            profile,
            functions,
            trap_control_pages,
        } => serve(socket, profile, functions, trap_control_pages),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mlx5-emu: {e}");
            ExitCode::FAILURE
        }
    }
}
