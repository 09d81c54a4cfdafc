//! `mlx5`: inspect, bring up and exercise mlx5 functions from user space.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand};
use tools::dev::Dev;
use verbs::cmd::TraceSink;
use verbs::hca::{Hca, HcaOptions};

#[derive(Parser, Debug)]
#[command(
    name = "mlx5",
    version,
    about = "User-space mlx5 (ConnectX) driver tool"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Bring the function up and print what ibv_devinfo prints.
    Devinfo {
        /// PCI address (0000:3b:00.0), emu[:cx4lx|cx5|cx6|cx7] or vfio-user:PATH; default emu.
        #[arg(short, long)]
        dev: Option<String>,
        /// Add capabilities by name.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Capability pages, decoded field by field.
    Caps {
        /// The device (see devinfo).
        #[arg(short, long)]
        dev: Option<String>,
        /// Show the maximum values instead of the current ones.
        #[arg(long)]
        max: bool,
        /// One page: general, general_2, atomic, roce, odp, device_mem.
        page: Option<String>,
    },
    /// Bring-up and teardown, printed as a Linux mlx5_core command trace.
    Trace {
        /// The device (see devinfo).
        #[arg(short, long)]
        dev: Option<String>,
        /// Complete commands by polling instead of through the command EQ.
        #[arg(long)]
        polling: bool,
    },
    /// The decoded health buffer and firmware state, read from the init
    /// segment without bringing the function up (works on stuck firmware).
    Health {
        /// The device (see devinfo).
        #[arg(short, long)]
        dev: Option<String>,
    },
    /// Functions bound to vfio-pci (address, ID, IOMMU group, whether mlx5) and the device model.
    List,
    /// Function-level reset (VFIO_DEVICE_RESET).
    Reset {
        /// The device (see devinfo).
        #[arg(short, long)]
        dev: Option<String>,
    },
    /// Run one raw command (hex or JSON) on the function, after bring-up,
    /// and decode its output through the layout registry.
    #[command(name = "cmd")]
    Raw {
        /// The device (see devinfo).
        #[arg(short, long)]
        dev: Option<String>,
        /// Output length in bytes (default: the output layout's size).
        #[arg(long, value_parser = parse_len)]
        outlen: Option<usize>,
        /// Decode the output with this layout (default: the opcode's _out).
        #[arg(long)]
        decode: Option<String>,
        /// Print every field, zeros included.
        #[arg(long)]
        all: bool,
        /// Print JSON: status, syndrome, fields, raw.
        #[arg(long)]
        json: bool,
        /// The input: hex bytes, or JSON such as
        /// '{"opcode":"QUERY_HCA_CAP","fields":{"op_mod":1}}'; @FILE reads
        /// a file, - stdin.
        input: String,
    },
    /// Print the PRM layouts this build knows (every field's bit offset and width).
    Layouts {
        /// Print JSON: {"name": {"size": bits, "fields": {"field": [bit_offset, width]}}}.
        #[arg(long)]
        json: bool,
        /// Print only this layout (e.g. create_cq_in).
        name: Option<String>,
    },
}

fn open(dev: Option<&str>, opts: HcaOptions) -> Result<Hca, String> {
    let func = Dev::parse(dev)?.open()?;
    let name = func.name().to_string();
    Hca::open(func, opts).map_err(|e| format!("{name}: bring-up failed: {e}"))
}

fn parse_len(s: &str) -> Result<usize, String> {
    match s.strip_prefix("0x") {
        Some(h) => usize::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))
}

/// The command's text: as given, from a file (`@FILE`) or stdin (`-`).
fn command_text(input: &str) -> Result<String, String> {
    use std::io::Read;
    if input == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| format!("stdin: {e}"))?;
        return Ok(s);
    }
    match input.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}")),
        None => Ok(input.to_string()),
    }
}

fn close(hca: Hca) -> Result<(), String> {
    hca.close().map_err(|e| format!("teardown failed: {e}"))
}

fn run(cmd: Cmd) -> Result<String, String> {
    match cmd {
        Cmd::Layouts { json, name } => tools::layouts::run(json, name.as_deref()),
        Cmd::List => Ok(tools::list::run()),
        Cmd::Reset { dev } => tools::reset::run(&*Dev::parse(dev.as_deref())?.open()?),
        Cmd::Devinfo { dev, verbose } => {
            let hca = open(dev.as_deref(), HcaOptions::default())?;
            let out = tools::devinfo::render(&hca, verbose);
            close(hca)?;
            out
        }
        Cmd::Caps { dev, max, page } => {
            let hca = open(dev.as_deref(), HcaOptions::default())?;
            let out = tools::caps::render(hca.caps(), page.as_deref(), max);
            close(hca)?;
            out
        }
        Cmd::Trace { dev, polling } => {
            let text = Arc::new(Mutex::new(String::new()));
            let sink = {
                let text = text.clone();
                TraceSink::new(move |s: &str| {
                    if let Ok(mut t) = text.lock() {
                        t.push_str(s);
                    }
                })
            };
            let opts = HcaOptions {
                trace: Some(sink),
                event_mode: !polling,
                ..HcaOptions::default()
            };
            let hca = open(dev.as_deref(), opts)?;
            close(hca)?;
            let out = text
                .lock()
                .map_err(|_| "trace buffer poisoned".to_string())?
                .clone();
            Ok(out.trim_end().to_string())
        }
        Cmd::Raw {
            dev,
            outlen,
            decode,
            all,
            json,
            input,
        } => {
            let mut req = tools::cmd::parse(&command_text(&input)?)?;
            req.outlen = outlen.or(req.outlen);
            req.decode = decode.or(req.decode);
            let hca = open(dev.as_deref(), HcaOptions::default())?;
            let out = tools::cmd::run(hca.cmd(), &req, tools::cmd::Show { all, json });
            close(hca)?;
            out
        }
        Cmd::Health { dev } => {
            let func = tools::dev::Dev::parse(dev.as_deref())?.open()?;
            tools::health::report(&*func)
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli.cmd) {
        Ok(text) => {
            use std::io::Write;
            // A closed pipe (`mlx5 layouts | head`) is not an error worth a panic.
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mlx5: {e}");
            ExitCode::FAILURE
        }
    }
}
