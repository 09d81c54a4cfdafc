//! `rc_pingpong`: libibverbs' `ibv_rc_pingpong` on this driver.
//!
//! Same flags and output lines. Two ways to run:
//!
//! - no server name and the device model (`-d emu[:PROFILE]` or no `-d`):
//!   both sides run in this process, each on its own device-model function,
//!   the two functions cabled port to port; the address exchange goes
//!   through memory instead of TCP;
//! - a real function (`-d PCI` or `-d vfio-user:PATH`): the server waits
//!   for a TCP connection on `-p`, the client names the server; the two
//!   exchange `LID:QPN:PSN:GID` as `ibv_rc_pingpong` does.
//!
//! Each side posts `-r` receives; the client sends first, and each side
//! sends again once its send and a receive completed, `-n` times.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use tools::dev::Dev;
use verbs::cq::{Wc, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::access;
use verbs::qp::{
    required_mask, send_flags as sf, AhAttr, Payload, Qp, QpAttr, QpCap, QpInitAttr, QpState,
    QpType, RecvWr, SendOp, SendWr,
};
use vfio::{DmaBuffer, PciFunction};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "rc_pingpong",
    about = "Ping-pong over an RC connection (ibv_rc_pingpong)"
)]
struct Opts {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Use this device: PCI address, emu[:cx4lx|cx5|cx6|cx7] or vfio-user:PATH (default emu).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Use port N of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Size of message to exchange.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level value.
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (default poll).
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local port GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    gid_idx: u8,
    /// Validate received buffer.
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// Server to connect to (client side); absent: be the server.
    servername: Option<String>,
}

/// What each side tells the other (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dest {
    lid: u16,
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

impl Dest {
    /// `ibv_rc_pingpong`'s wire form: `LLLL:QQQQQQ:PPPPPP:` + 32 hex digits.
    fn wire(&self) -> String {
        let g: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        format!("{:04x}:{:06x}:{:06x}:{g}", self.lid, self.qpn, self.psn)
    }

    fn parse(s: &str) -> Option<Self> {
        let s = s.trim_end_matches(['\0', '\n']);
        let mut it = s.split(':');
        let lid = u16::from_str_radix(it.next()?, 16).ok()?;
        let qpn = u32::from_str_radix(it.next()?, 16).ok()?;
        let psn = u32::from_str_radix(it.next()?, 16).ok()?;
        let g = it.next()?;
        if g.len() != 32 || it.next().is_some() {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(g.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self { lid, qpn, psn, gid })
    }

    fn print(&self, what: &str) {
        println!(
            "  {what} address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid)
        );
    }
}

fn mtu_enum(mtu: u32) -> Option<u8> {
    Some(match mtu {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        4096 => 5,
        _ => return None,
    })
}

/// A 24-bit PSN, as `lrand48() & 0xffffff` would give.
fn random_psn(salt: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ std::process::id().rotate_left(8) ^ salt.wrapping_mul(0x9e37_79b9)) & 0xff_ffff
}

/// The pattern `-c` checks: byte `i` of every message.
fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(1)
}

struct Stats {
    bytes: u64,
    secs: f64,
    iters: u32,
}

/// One side of the ping-pong on `ctx`; `exchange` trades addresses.
fn run_side(
    ctx: &Context,
    o: &Opts,
    client: bool,
    exchange: impl FnOnce(Dest) -> Result<Dest, String>,
) -> Result<Stats, String> {
    let e = |what: &str| {
        let what = what.to_string();
        move |err: verbs::Error| format!("{what}: {err}")
    };
    if o.ib_port != 1 {
        return Err(format!(
            "port {} does not exist (the function has port 1)",
            o.ib_port
        ));
    }
    let mtu = mtu_enum(o.mtu).ok_or_else(|| format!("invalid MTU {}", o.mtu))?;
    if o.size == 0 {
        return Err("message size must be positive".into());
    }
    let size = o.size as usize;
    let pd = ctx.alloc_pd().map_err(e("Couldn't allocate PD"))?;
    let buf =
        DmaBuffer::new(size.next_multiple_of(4096)).map_err(|err| format!("buffer: {err}"))?;
    if o.chk {
        let p: Vec<u8> = (0..size).map(pattern).collect();
        buf.write(0, &p).map_err(|err| format!("buffer: {err}"))?;
    }
    let mr = pd
        .reg_mr_buffer(&buf, 0, size, access::LOCAL_WRITE)
        .map_err(e("Couldn't register MR"))?;
    let channel = if o.events {
        Some(
            ctx.create_comp_channel()
                .map_err(e("Couldn't create completion channel"))?,
        )
    } else {
        None
    };
    let mut cq = ctx
        .create_cq(o.rx_depth + 1, channel.as_ref(), None)
        .map_err(e("Couldn't create CQ"))?;
    let mut qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: o.rx_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .map_err(e("Couldn't create QP"))?;
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Init),
            port_num: o.ib_port,
            ..Default::default()
        },
        required_mask(QpType::Rc, QpState::Reset, QpState::Init),
    )
    .map_err(e("Failed to modify QP to INIT"))?;
    let sge = mr.sge(0, o.size).map_err(e("SGE"))?;
    let post_recv = |qp: &mut Qp, n: u32| -> u32 {
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sg_list: std::slice::from_ref(&sge),
        };
        (0..n)
            .take_while(|_| qp.post_recv(std::slice::from_ref(&wr)).is_ok())
            .count() as u32
    };
    let mut routs = post_recv(&mut qp, o.rx_depth);
    if routs < o.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    if let Some(c) = &channel {
        let _ = c;
        cq.req_notify(false)
            .map_err(e("Couldn't request CQ notification"))?;
    }
    let gid = ctx
        .query_gid(o.ib_port, o.gid_idx.into())
        .map_err(e(&format!("can't read sgid of index {}", o.gid_idx)))?;
    let my = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(qp.qp_num()),
        gid,
    };
    my.print("local");
    let rem = exchange(my)?;
    rem.print("remote");
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: mtu,
            dest_qp_num: rem.qpn,
            rq_psn: rem.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                dgid: rem.gid,
                sgid_index: o.gid_idx,
                hop_limit: 1,
                sl: o.sl,
                port_num: o.ib_port,
                ..Default::default()
            },
            ..Default::default()
        },
        required_mask(QpType::Rc, QpState::Init, QpState::Rtr),
    )
    .map_err(e("Failed to modify QP to RTR"))?;
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Rts),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: my.psn,
            max_rd_atomic: 1,
            ..Default::default()
        },
        required_mask(QpType::Rc, QpState::Rtr, QpState::Rts),
    )
    .map_err(e("Failed to modify QP to RTS"))?;
    let send = |qp: &mut Qp| {
        qp.post_send(&[SendWr {
            wr_id: SEND_WRID,
            op: SendOp::Send,
            payload: Payload::Sges(std::slice::from_ref(&sge)),
            flags: sf::SIGNALED,
            ud: None,
        }])
        .map_err(|(_, err)| format!("Couldn't post send: {err}"))
    };
    let start = Instant::now();
    let mut pending = RECV_WRID;
    if client {
        send(&mut qp)?;
        pending |= SEND_WRID;
    }
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wc = [Wc::default(); 2];
    let deadline_idle = Duration::from_secs(10);
    let mut last = Instant::now();
    while rcnt < o.iters || scnt < o.iters {
        if let Some(c) = &channel {
            match c.get_cq_event(deadline_idle) {
                Ok(Some(_)) => {}
                Ok(None) => return Err("Failed to get cq_event (timed out)".into()),
                Err(err) => return Err(format!("Failed to get cq_event: {err}")),
            }
            cq.req_notify(false)
                .map_err(e("Couldn't request CQ notification"))?;
        }
        let n = loop {
            let n = cq.poll(&mut wc).map_err(e("poll CQ failed"))?;
            if n > 0 || channel.is_some() {
                break n;
            }
            if last.elapsed() > deadline_idle {
                return Err("poll CQ failed: no completion in 10 seconds".into());
            }
            // The device (model) may share these cores: give it the CPU.
            std::thread::yield_now();
        };
        if n > 0 {
            last = Instant::now();
        }
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {:?} ({}) for wr_id {}",
                    w.status, w.status as u32, w.wr_id
                ));
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if o.chk {
                        let mut got = vec![0u8; size];
                        buf.read(0, &mut got)
                            .map_err(|err| format!("buffer: {err}"))?;
                        if let Some(i) = (0..size).find(|&i| got[i] != pattern(i)) {
                            return Err(format!("Invalid data at byte {i} of receive {rcnt}"));
                        }
                    }
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recv(&mut qp, o.rx_depth - routs);
                        if routs < o.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !w.wr_id;
            if scnt < o.iters && pending == 0 {
                send(&mut qp)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(qp);
    Ok(Stats {
        bytes: u64::from(o.size) * u64::from(o.iters) * 2,
        secs,
        iters: o.iters,
    })
}

fn report(s: &Stats) {
    let usec = s.secs * 1e6;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        s.bytes,
        s.secs,
        s.bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        s.iters,
        s.secs,
        usec / f64::from(s.iters)
    );
}

fn open(f: Arc<dyn PciFunction>) -> Result<Context, String> {
    Context::open(f, HcaOptions::default()).map_err(|e| format!("Couldn't get context: {e}"))
}

/// Both sides in this process on two cabled device-model functions.
fn run_pair(o: &Opts, profile: mlx5_emu::Profile) -> Result<(), String> {
    let fabric = mlx5_emu::Fabric::cabled(2, profile);
    let fs: Vec<Arc<dyn PciFunction>> = (0..2)
        .map(|i| fabric.function(i).ok_or("fabric function").map(|f| f as _))
        .collect::<Result<_, _>>()?;
    let (to_client, from_server) = mpsc::channel::<Dest>();
    let (to_server, from_client) = mpsc::channel::<Dest>();
    let so = o.clone();
    let sf = fs[0].clone();
    let server = std::thread::spawn(move || -> Result<Stats, String> {
        let ctx = open(sf)?;
        run_side(&ctx, &so, false, |my| {
            let rem = from_client
                .recv()
                .map_err(|_| "client went away".to_string())?;
            to_client
                .send(my)
                .map_err(|_| "client went away".to_string())?;
            Ok(rem)
        })
    });
    let ctx = open(fs[1].clone())?;
    let client = run_side(&ctx, o, true, |my| {
        to_server
            .send(my)
            .map_err(|_| "server went away".to_string())?;
        from_server
            .recv()
            .map_err(|_| "server went away".to_string())
    });
    let server = server
        .join()
        .map_err(|_| "server side panicked".to_string())?;
    let (s, c) = (server?, client?);
    report(&s);
    report(&c);
    Ok(())
}

/// One side, the address exchange over TCP as `ibv_rc_pingpong` does it.
fn run_tcp(o: &Opts, f: Arc<dyn PciFunction>) -> Result<(), String> {
    let ctx = open(f)?;
    let client = o.servername.is_some();
    let stats = run_side(&ctx, o, client, |my| {
        let msg = format!("{}\0", my.wire());
        let mut stream = match &o.servername {
            Some(host) => TcpStream::connect((host.as_str(), o.port))
                .map_err(|e| format!("Couldn't connect to {host}:{}: {e}", o.port))?,
            None => {
                let l = TcpListener::bind(("::", o.port))
                    .or_else(|_| TcpListener::bind(("0.0.0.0", o.port)))
                    .map_err(|e| format!("Couldn't listen to port {}: {e}", o.port))?;
                l.accept().map_err(|e| format!("accept() failed: {e}"))?.0
            }
        };
        let mut rbuf = vec![0u8; msg.len()];
        if client {
            stream
                .write_all(msg.as_bytes())
                .map_err(|e| format!("Couldn't send local address: {e}"))?;
            stream
                .read_exact(&mut rbuf)
                .map_err(|e| format!("Couldn't read remote address: {e}"))?;
            stream
                .write_all(b"done")
                .map_err(|e| format!("Couldn't send \"done\": {e}"))?;
        } else {
            stream
                .read_exact(&mut rbuf)
                .map_err(|e| format!("Couldn't read remote address: {e}"))?;
            stream
                .write_all(msg.as_bytes())
                .map_err(|e| format!("Couldn't send local address: {e}"))?;
            let mut done = [0u8; 4];
            let _ = stream.read_exact(&mut done);
        }
        Dest::parse(&String::from_utf8_lossy(&rbuf))
            .ok_or_else(|| "Couldn't parse remote address".to_string())
    })?;
    report(&stats);
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let o = Opts::parse();
    let r = match Dev::parse(o.ib_dev.as_deref()) {
        Err(e) => Err(e),
        Ok(Dev::Emu(p)) if o.servername.is_none() => run_pair(&o, p),
        Ok(Dev::Emu(_)) => Err(
            "a device-model function is cabled only inside its process: run without a server name to run both sides here"
                .into(),
        ),
        Ok(d) => d.open().and_then(|f| run_tcp(&o, f)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_wire_form_round_trips() {
        let d = Dest {
            lid: 0,
            qpn: 0x1234,
            psn: 0xabcdef,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 1, 2, 0xff, 0xfe, 3, 4, 5],
        };
        let w = d.wire();
        assert_eq!(w, "0000:001234:abcdef:fe80000000000000020102fffe030405");
        assert_eq!(
            w.len() + 1,
            "0000:000000:000000:00000000000000000000000000000000".len() + 1
        );
        assert_eq!(Dest::parse(&format!("{w}\0")), Some(d));
        assert_eq!(Dest::parse("0000:001234:abcdef:fe80"), None);
    }

    #[test]
    fn mtu_values_are_ibv_mtu() {
        assert_eq!(
            [256, 512, 1024, 2048, 4096].map(mtu_enum),
            [Some(1), Some(2), Some(3), Some(4), Some(5)]
        );
        assert_eq!(mtu_enum(1500), None);
    }
}
