//! `mlx5-pkt`: packet forwarding in the style of DPDK's testpmd over raw
//! packet QPs (issue 26), for measuring and checking the Ethernet data
//! path: port 0 generates UDP frames (one source port per flow, so RSS
//! spreads them), port 1 takes them in over `-q` RSS queues and, by mode,
//! drops them (`rxonly`), sends each back unchanged (`io`) or with its
//! MAC addresses swapped (`macswap`), or is not listened to at all
//! (`txonly`: only the generator's rate). Every frame's payload is a
//! pattern of its flow: what port 1 (and, forwarded, port 0) receives is
//! checked, and a frame that differs is counted as bad.
//!
//! `-d DEV` and `-p DEV` name the two ports (as `mlx5-perf`'s `-d`): with
//! the built-in model (the default, `emu[:PROFILE]`) both are functions of
//! one cabled fabric in this process; otherwise two functions whose ports
//! are cabled to each other. The report gives packets, Mpps and Gbit/s
//! per port and per queue (Gbit/s counts frame bytes, as testpmd's
//! `Rx-bps`).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use mlx5_hw::eth::ETH_ZLEN;
use verbs::cq::Cq;
use verbs::device::Context;
use verbs::flow::{FlowAction, FlowSpec, FlowSteering};
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr, Sge};
use verbs::pd::Pd;
use verbs::raw_eth::{RawPacketQp, RawQpCap, RxPkt, TxFrame, TxPkt};
use verbs::rss::{rx_hash_fields as rh, RssQp, RwqIndTable, RxHashConf, Wq, WqCap};
use vfio::{DmaBuffer, PciFunction};

use crate::dev::Dev;

/// What port 1 does with what it receives (testpmd's forwarding modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Port 0 sends; nobody listens (frames are dropped at port 1).
    Txonly,
    /// Port 0 sends; port 1 receives and drops.
    Rxonly,
    /// Port 1 sends every frame back unchanged; port 0 receives them.
    Io,
    /// Port 1 swaps the MAC addresses and sends it back.
    Macswap,
    /// Port 0 alone sends UDP datagrams to a host beyond its cable
    /// (`--peer-mac`, `--peer-ip`, UDP port 7000) that echoes them, one at
    /// a time, and checks each echo (another stack judges the frames).
    UdpEcho,
}

/// `mlx5-pkt`.
#[derive(Parser, Debug)]
#[command(
    name = "mlx5-pkt",
    version,
    about = "testpmd-style packet forwarding over raw packet QPs of the user-space mlx5 driver"
)]
pub struct Cli {
    /// Forwarding mode.
    #[arg(value_enum)]
    pub mode: Mode,
    /// Port 0, the generator: `emu[:PROFILE]` (the default: two cabled
    /// functions of the built-in model), a PCI address, vfio-user:PATH.
    #[arg(short = 'd', long)]
    pub dev: Option<String>,
    /// Port 1 (not with the built-in model, whose fabric gives it).
    #[arg(short = 'p', long)]
    pub peer: Option<String>,
    /// Frame size in bytes, Ethernet header to payload (no FCS).
    #[arg(short = 's', long, default_value_t = 64)]
    pub size: usize,
    /// Frames per burst.
    #[arg(short = 'b', long, default_value_t = 32)]
    pub burst: usize,
    /// Receive queues on port 1 (RSS over UDP source and destination).
    #[arg(short = 'q', long, default_value_t = 1)]
    pub queues: usize,
    /// Flows (UDP source ports) the generator cycles through.
    #[arg(short = 'f', long, default_value_t = 64)]
    pub flows: u16,
    /// Frames to send (the run ends once they are received, or after
    /// `--duration`).
    #[arg(short = 'n', long, default_value_t = 100_000)]
    pub packets: u64,
    /// Longest run, in seconds.
    #[arg(short = 'D', long, default_value_t = 30)]
    pub duration: u64,
    /// `udp-echo`: the echoing host's MAC.
    #[arg(long)]
    pub peer_mac: Option<String>,
    /// `udp-echo`: the echoing host's IPv4 address.
    #[arg(long)]
    pub peer_ip: Option<std::net::Ipv4Addr>,
    /// `udp-echo`: this port's IPv4 address.
    #[arg(long, default_value = "10.25.0.1")]
    pub ip: std::net::Ipv4Addr,
    /// Port 0 sends whole frames by enhanced multi-packet WQEs (DPDK's
    /// eMPW: 16 bytes of WQE a frame; ConnectX-5 and later, `-d emu:cx5`),
    /// instead of a WQE per frame with its headers inline.
    #[arg(long)]
    pub empw: bool,
}

/// Parses `args` (without the program name) and runs them; the report
/// goes to `out`.
pub fn main_with(args: &[&str], out: &mut dyn Write) -> Result<(), String> {
    let cli = Cli::try_parse_from(std::iter::once("mlx5-pkt").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    run(&cli, out)
}

/// Headers of the generated frames: Ethernet, IPv4, UDP.
const HDRS: usize = 42;
/// Bytes of each receive buffer.
const RX_BUF: usize = 2048;
/// Receive ring of each queue, log2.
const LOG_RX: u8 = 9;
/// Send ring, log2 of its blocks.
const LOG_TX: u8 = 10;
/// The UDP destination port every generated frame goes to.
const DPORT: u16 = 9000;
const MAC0: [u8; 6] = [0x02, 0, 0, 0, 0, 0x10];
const MAC1: [u8; 6] = [0x02, 0, 0, 0, 0, 0x11];

/// One port: its context, memory, a raw packet QP (sends; its own RQ
/// unused) and the RSS receive side.
/// (Fields drop in order: what uses the context before it.)
struct Port {
    steer: Option<FlowSteering>,
    rss: Option<RssQp>,
    table: Option<RwqIndTable>,
    /// The receive queues (RSS), each with its CQ.
    rx: Vec<(Wq, Cq)>,
    qp: RawPacketQp,
    tx_cq: Cq,
    _rx_cq: Cq,
    mr: Mr,
    buf: Arc<DmaBuffer>,
    pd: Pd,
    ctx: Context,
    tx_frames: u64,
    tx_bytes: u64,
    rx_frames: Vec<u64>,
    rx_bytes: u64,
    bad: u64,
}

/// Where the generator's frame templates are (one per flow), and the
/// receive buffers (queue q, slot k) after them.
fn rx_at(flows: u16, q: usize, k: usize) -> usize {
    (usize::from(flows) + q * (1 << LOG_RX) + k) * RX_BUF
}

impl Port {
    fn open(func: Arc<dyn PciFunction>, c: &Cli) -> Result<Self, String> {
        let e = |what: &'static str| move |err: verbs::Error| format!("{what}: {err}");
        let ctx = Context::open(func, HcaOptions::default()).map_err(e("open"))?;
        let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
        let len = rx_at(c.flows, c.queues, 0);
        let buf = DmaBuffer::new(len).map_err(|err| format!("buffer: {err}"))?;
        let mr = pd
            .reg_mr_buffer(&buf, 0, len, access::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
        let tx_cq = ctx
            .create_cq(1 << LOG_TX, None, None)
            .map_err(e("create_cq"))?;
        let rx_cq = ctx.create_cq(64, None, None).map_err(e("create_cq"))?;
        let cap = RawQpCap {
            log_sq_bbs: LOG_TX,
            log_rq_wqes: 0,
            strip_vlan: false,
            tunnel_offloads: false,
            striding: None,
        };
        let qp = ctx
            .create_raw_packet_qp(&pd, &tx_cq, &rx_cq, cap)
            .map_err(e("create raw packet QP"))?;
        Ok(Self {
            steer: None,
            rss: None,
            table: None,
            rx: Vec::new(),
            qp,
            tx_cq,
            _rx_cq: rx_cq,
            mr,
            buf,
            pd,
            ctx,
            tx_frames: 0,
            tx_bytes: 0,
            rx_frames: Vec::new(),
            rx_bytes: 0,
            bad: 0,
        })
    }

    /// `queues` receive queues, all their buffers posted, behind an RSS
    /// QP that every UDP frame to `dport` is steered to.
    fn listen(&mut self, queues: usize, flows: u16, dport: u16) -> Result<(), String> {
        let e = |what: &'static str| move |err: verbs::Error| format!("{what}: {err}");
        let cap = WqCap {
            log_wqes: LOG_RX,
            strip_vlan: false,
        };
        for q in 0..queues {
            let cq = self
                .ctx
                .create_cq(1 << LOG_RX, None, None)
                .map_err(e("create_cq"))?;
            let mut wq = self
                .ctx
                .create_wq(&self.pd, &cq, cap)
                .map_err(e("create_wq"))?;
            let bufs: Vec<Sge> = (0..1 << LOG_RX)
                .map(|k| self.rx_sge(flows, q, k))
                .collect::<Result<_, _>>()?;
            wq.post_rx(&bufs);
            self.rx.push((wq, cq));
        }
        let wqs: Vec<&Wq> = self.rx.iter().map(|(w, _)| w).collect();
        let table = self
            .ctx
            .create_rwq_ind_table(&wqs)
            .map_err(e("create_rwq_ind_table"))?;
        let conf = RxHashConf {
            table: &table,
            key: RSS_KEY,
            fields: rh::SRC_IPV4 | rh::DST_IPV4 | rh::SRC_PORT_UDP | rh::DST_PORT_UDP,
        };
        let rss = self.ctx.create_rss_qp(&conf).map_err(e("RSS QP"))?;
        let mut steer = self.ctx.flow_steering().map_err(e("flow steering"))?;
        let spec = FlowSpec {
            ethertype: Some(0x0800),
            ip_protocol: Some(17),
            udp_dport: Some(dport),
            ..FlowSpec::default()
        };
        steer
            .create_flow(&spec, FlowAction::Rss(&rss))
            .map_err(e("create_flow"))?;
        self.rx_frames = vec![0; queues];
        self.table = Some(table);
        self.rss = Some(rss);
        self.steer = Some(steer);
        Ok(())
    }

    fn rx_sge(&self, flows: u16, q: usize, k: usize) -> Result<Sge, String> {
        self.mr
            .sge(rx_at(flows, q, k) as u64, RX_BUF as u32)
            .map_err(|e| format!("receive buffer: {e}"))
    }

    /// Frees the send ring from its completions.
    fn reap(&mut self) -> Result<(), String> {
        self.qp
            .poll_tx(&mut self.tx_cq)
            .map(|_| ())
            .map_err(|s| format!("send completion: {s:?}"))
    }
}

/// The Toeplitz key (Microsoft's verification key, as DPDK's default).
const RSS_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// Flow `f`'s frame of `size` bytes from port 0 to port 1 (UDP source
/// port 10000 + f), its payload a pattern of the flow.
fn template(f: u16, size: usize) -> Vec<u8> {
    let ends = Ends {
        macs: (MAC0, MAC1),
        ips: ([198, 18, 0, 1], [198, 18, 0, 2]),
        ports: (10_000 + f, DPORT),
    };
    udp_frame(&ends, size, f as u8)
}

/// The two ends of a UDP flow: (source, destination) each.
struct Ends {
    macs: ([u8; 6], [u8; 6]),
    ips: ([u8; 4], [u8; 4]),
    ports: (u16, u16),
}

/// An Ethernet + IPv4 + UDP frame of `size` bytes between `e`, its
/// payload a pattern of `seed` (checksums left to the device).
fn udp_frame(e: &Ends, size: usize, seed: u8) -> Vec<u8> {
    let mut h = vec![0u8; size];
    h[0..6].copy_from_slice(&e.macs.1);
    h[6..12].copy_from_slice(&e.macs.0);
    h[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    h[14] = 0x45;
    h[16..18].copy_from_slice(&((size - 14) as u16).to_be_bytes());
    h[22] = 64;
    h[23] = 17;
    h[26..30].copy_from_slice(&e.ips.0);
    h[30..34].copy_from_slice(&e.ips.1);
    h[34..36].copy_from_slice(&e.ports.0.to_be_bytes());
    h[36..38].copy_from_slice(&e.ports.1.to_be_bytes());
    h[38..40].copy_from_slice(&((size - 34) as u16).to_be_bytes());
    for (i, b) in h[HDRS..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ seed;
    }
    h
}

/// Runs `c`; the report goes to `out`.
pub fn run(c: &Cli, out: &mut dyn Write) -> Result<(), String> {
    if c.size < HDRS + 1 || c.size > RX_BUF {
        return Err(format!(
            "frame size {} outside {}..={RX_BUF}",
            c.size,
            HDRS + 1
        ));
    }
    if c.burst == 0 || c.burst > 256 || c.flows == 0 || c.queues == 0 {
        return Err("burst 1..=256, at least one flow and one queue".into());
    }
    if !c.queues.is_power_of_two() {
        return Err(format!("{} queues: RSS wants a power of two", c.queues));
    }
    let dev = Dev::parse(c.dev.as_deref())?;
    if c.mode == Mode::UdpEcho {
        return udp_echo(c, dev, out);
    }
    let (_fabric, f0, f1) = match (&dev, &c.peer) {
        (Dev::Emu(p), None) => {
            let fab = mlx5_emu::Fabric::cabled(2, *p);
            let f = |i| {
                fab.function(i)
                    .map(|f| f as Arc<dyn PciFunction>)
                    .ok_or(format!("the fabric made no function {i}"))
            };
            let (f0, f1) = (f(0)?, f(1)?);
            (Some(fab), f0, f1)
        }
        (Dev::Emu(_), Some(_)) => return Err("--peer: the built-in model gives port 1".into()),
        (_, None) => return Err("--peer DEV: port 1 (cabled to port 0)".into()),
        (_, Some(p)) => (None, dev.open()?, Dev::parse(Some(p))?.open()?),
    };
    let mut p0 = Port::open(f0, c)?;
    let mut p1 = Port::open(f1, c)?;
    if c.mode != Mode::Txonly {
        p1.listen(c.queues, c.flows, DPORT)?;
    }
    if matches!(c.mode, Mode::Io | Mode::Macswap) {
        p0.listen(1, c.flows, DPORT)?;
    }
    for f in 0..c.flows {
        p0.buf
            .write(usize::from(f) * RX_BUF, &template(f, c.size))
            .map_err(|e| format!("template: {e}"))?;
    }
    writeln!(
        out,
        "mlx5-pkt {:?}: {} B frames, burst {}, {} flows, {} RSS queue(s), {} frames",
        c.mode, c.size, c.burst, c.flows, c.queues, c.packets
    )
    .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let secs = forward(c, &mut p0, &mut p1, start)?;
    report(c, &p0, &p1, secs, out).map_err(|e| e.to_string())?;
    // Torn down in order: flows, RSS QPs, tables, queues (Drop does it
    // too; here errors are not silent).
    for p in [&mut p0, &mut p1] {
        if let Some(s) = p.steer.take() {
            s.destroy().map_err(|e| format!("flow steering: {e}"))?;
        }
        if let Some(r) = p.rss.take() {
            r.destroy().map_err(|e| format!("RSS QP: {e}"))?;
        }
        if let Some(t) = p.table.take() {
            t.destroy().map_err(|e| format!("indirection table: {e}"))?;
        }
        for (w, _) in p.rx.drain(..) {
            w.destroy().map_err(|e| format!("work queue: {e}"))?;
        }
    }
    Ok(())
}

/// The forwarding loop; the seconds it took.
fn forward(c: &Cli, p0: &mut Port, p1: &mut Port, start: Instant) -> Result<f64, String> {
    let deadline = start + Duration::from_secs(c.duration);
    let back = matches!(c.mode, Mode::Io | Mode::Macswap);
    // One packet per flow: its headers (inline) and its payload where the
    // template lies (no copy).
    let hdrs: Vec<[u8; HDRS]> = (0..c.flows)
        .map(|f| {
            let mut h = [0u8; HDRS];
            h.copy_from_slice(&template(f, c.size)[..HDRS]);
            h
        })
        .collect();
    let flows: Vec<TxPkt<'_>> = hdrs
        .iter()
        .enumerate()
        .map(|(f, h)| {
            let sge = p0
                .mr
                .sge((f * RX_BUF + HDRS) as u64, (c.size - HDRS) as u32)
                .map_err(|e| format!("payload: {e}"))?;
            Ok(TxPkt {
                headers: h,
                payload: Some(sge),
                csum: true,
                mss: 0,
                vlan: None,
            })
        })
        .collect::<Result<_, String>>()?;
    // `--empw`: each flow's whole frame where its template lies.
    let frames: Vec<TxFrame<'_>> = (0..usize::from(c.flows))
        .map(|f| {
            p0.mr
                .sge((f * RX_BUF) as u64, c.size as u32)
                .map(TxFrame::Ref)
                .map_err(|e| format!("frame: {e}"))
        })
        .collect::<Result<_, String>>()?;
    let mut seq = 0u64;
    let mut last_progress = start;
    let mut burst = Vec::with_capacity(c.burst);
    let mut whole = Vec::with_capacity(c.burst);
    // What was last received, and when it changed: once everything is
    // sent, a run whose receivers stay quiet for QUIET is over (what did
    // not arrive was missed: a receive queue out of buffers drops).
    let (mut seen, mut seen_at) = (0u64, start);
    loop {
        let received: u64 = p1.rx_frames.iter().sum();
        let returned: u64 = p0.rx_frames.iter().sum();
        if received + returned != seen {
            (seen, seen_at) = (received + returned, Instant::now());
        }
        let all = match c.mode {
            Mode::Txonly | Mode::UdpEcho => seq >= c.packets,
            Mode::Rxonly => received >= c.packets,
            Mode::Io | Mode::Macswap => returned >= c.packets,
        };
        let quiet = seq >= c.packets && seen_at.elapsed() >= QUIET;
        if all || quiet || Instant::now() >= deadline {
            drain(p0)?;
            drain(p1)?;
            return Ok(start.elapsed().as_secs_f64());
        }
        if seq < c.packets {
            p0.reap()?;
            let n = c.burst.min((c.packets - seq) as usize);
            let flow = |i: u64| ((seq + i) % u64::from(c.flows)) as usize;
            let sent = if c.empw {
                whole.clear();
                whole.extend((0..n as u64).map(|i| frames[flow(i)]));
                p0.qp
                    .tx_burst_empw(&whole, true)
                    .map_err(|e| format!("port 0: {e}"))?
            } else {
                burst.clear();
                burst.extend((0..n as u64).map(|i| flows[flow(i)]));
                p0.qp.tx_burst(&burst)
            };
            seq += sent as u64;
            p0.tx_frames += sent as u64;
            p0.tx_bytes += (sent * c.size) as u64;
        }
        receive(c, p1, back)?;
        if back {
            receive(c, p0, false)?;
        }
        if last_progress.elapsed() >= Duration::from_secs(1) && std::io::stderr().is_terminal() {
            last_progress = Instant::now();
            let r: u64 = p1.rx_frames.iter().sum();
            eprint!(
                "\r{:.0} s: port 0 sent {}, port 1 received {r}   ",
                start.elapsed().as_secs_f64(),
                p0.tx_frames
            );
        }
    }
}

/// Waits (at most [`DRAIN_WAIT`]) until every WQE `p` posted completed.
fn drain(p: &mut Port) -> Result<(), String> {
    let give_up = Instant::now() + DRAIN_WAIT;
    while p.qp.tx_in_flight() > 0 {
        p.reap()?;
        if Instant::now() >= give_up {
            return Err(format!(
                "{} send blocks still in flight after {DRAIN_WAIT:?}",
                p.qp.tx_in_flight()
            ));
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// How long the receivers stay quiet, once everything is sent, before the
/// run ends.
const QUIET: Duration = Duration::from_millis(500);

/// How long a port's sends may take to complete before the run fails.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// Takes what `p`'s queues received, checks each frame, and (when `back`)
/// sends each back out (`macswap`: its MAC addresses swapped); the
/// buffers are posted again once their frames left.
fn receive(c: &Cli, p: &mut Port, back: bool) -> Result<(), String> {
    let mut got = [RxPkt::default(); 64];
    for q in 0..p.rx.len() {
        let n = {
            let (wq, cq) = &mut p.rx[q];
            wq.rx_burst(cq, &mut got[..c.burst.min(64)])
        };
        if n == 0 {
            continue;
        }
        let mut hdrs = vec![[0u8; HDRS]; n];
        let mut ok = vec![false; n];
        for (i, r) in got[..n].iter().enumerate() {
            let at = rx_at(c.flows, q, usize::from(r.slot));
            let mut frame = vec![0u8; r.len as usize];
            // A frame under Ethernet's 60 bytes arrives padded to 60.
            let good = r.error.is_none()
                && r.len as usize == c.size.max(ETH_ZLEN)
                && p.buf.read(at, &mut frame).is_ok()
                && frame_ok(&frame);
            ok[i] = good;
            p.bad += u64::from(!good);
            p.rx_bytes += u64::from(r.len);
            if good {
                hdrs[i].copy_from_slice(&frame[..HDRS]);
            }
        }
        p.rx_frames[q] += n as u64;
        if back {
            if c.mode == Mode::Macswap {
                for h in &mut hdrs {
                    let (d, s) = h.split_at_mut(6);
                    d.swap_with_slice(&mut s[..6]);
                }
            }
            let mut pkts = Vec::with_capacity(n);
            for (i, r) in got[..n].iter().enumerate().filter(|(i, _)| ok[*i]) {
                let at = rx_at(c.flows, q, usize::from(r.slot));
                pkts.push(TxPkt {
                    headers: &hdrs[i],
                    payload: Some(
                        p.mr.sge((at + HDRS) as u64, r.len - HDRS as u32)
                            .map_err(|e| format!("payload: {e}"))?,
                    ),
                    csum: true,
                    mss: 0,
                    vlan: None,
                });
            }
            let mut sent = 0;
            while sent < pkts.len() {
                p.reap()?;
                sent += p.qp.tx_burst(&pkts[sent..]);
            }
            // The buffers go back once the device has read them.
            drain(p)?;
            p.tx_frames += sent as u64;
            p.tx_bytes += (sent * c.size) as u64;
        }
        let bufs: Vec<Sge> = got[..n]
            .iter()
            .map(|r| p.rx_sge(c.flows, q, usize::from(r.slot)))
            .collect::<Result<_, _>>()?;
        let (wq, _) = &mut p.rx[q];
        wq.post_rx(&bufs);
    }
    Ok(())
}

/// Whether a received frame is one the generator made: IPv4/UDP to
/// [`DPORT`], its payload the pattern of its flow.
fn frame_ok(f: &[u8]) -> bool {
    if f.len() < HDRS || f[23] != 17 || f[36..38] != DPORT.to_be_bytes() {
        return false;
    }
    let flow = u16::from_be_bytes([f[34], f[35]]).wrapping_sub(10_000);
    let Some(payload) = udp_payload(f) else {
        return false;
    };
    payload
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i as u8).wrapping_mul(31) ^ flow as u8)
}

fn report(c: &Cli, p0: &Port, p1: &Port, secs: f64, out: &mut dyn Write) -> std::io::Result<()> {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[K");
    }
    let rate =
        |frames: u64, bytes: u64| (frames as f64 / secs / 1e6, bytes as f64 * 8.0 / secs / 1e9);
    writeln!(out, "{:.3} s", secs)?;
    let line = |out: &mut dyn Write, what: &str, frames: u64, bytes: u64| {
        let (mpps, gbps) = rate(frames, bytes);
        writeln!(
            out,
            "{what:<18} {frames:>12} packets {mpps:>9.3} Mpps {gbps:>9.3} Gbit/s"
        )
    };
    line(out, "port 0 tx", p0.tx_frames, p0.tx_bytes)?;
    if c.mode != Mode::Txonly {
        let r: u64 = p1.rx_frames.iter().sum();
        line(out, "port 1 rx", r, p1.rx_bytes)?;
        writeln!(out, "port 1 rx missed    {:>12} packets", p0.tx_frames - r)?;
        for (q, n) in p1.rx_frames.iter().enumerate() {
            let b = n * c.size as u64;
            line(out, &format!("port 1 rx queue {q}"), *n, b)?;
        }
    }
    if matches!(c.mode, Mode::Io | Mode::Macswap) {
        line(out, "port 1 tx", p1.tx_frames, p1.tx_bytes)?;
        let r: u64 = p0.rx_frames.iter().sum();
        line(out, "port 0 rx", r, p0.rx_bytes)?;
        writeln!(out, "port 0 rx missed    {:>12} packets", p1.tx_frames - r)?;
    }
    writeln!(out, "bad frames: port 0 {} port 1 {}", p0.bad, p1.bad)
}

/// The UDP port `udp-echo` sends to, and the one it sends from.
const ECHO_PORT: u16 = 7000;
const ECHO_FROM: u16 = 9001;
/// How long `udp-echo` waits for the echoing host to answer at all (it
/// may still be starting), and then for each echo.
const ECHO_FIRST_WAIT: Duration = Duration::from_secs(240);
const ECHO_WAIT: Duration = Duration::from_secs(20);

/// `udp-echo`: port 0 alone, datagrams of sizes cycling from 1 byte up to
/// `--size` minus the headers, each sent and its echo waited for.
fn udp_echo(c: &Cli, dev: Dev, out: &mut dyn Write) -> Result<(), String> {
    let (Some(mac), Some(peer_ip)) = (&c.peer_mac, c.peer_ip) else {
        return Err("udp-echo: --peer-mac and --peer-ip name the echoing host".into());
    };
    if c.peer.is_some() {
        return Err("udp-echo: one port (-d), no --peer".into());
    }
    let peer_mac = parse_mac(mac)?;
    let mut p = Port::open(dev.open()?, c)?;
    p.listen(1, c.flows, ECHO_FROM)?;
    let ends = Ends {
        macs: (p.ctx.mac(), peer_mac),
        ips: (c.ip.octets(), peer_ip.octets()),
        ports: (ECHO_FROM, ECHO_PORT),
    };
    writeln!(
        out,
        "mlx5-pkt udp-echo: {} datagrams to {peer_ip}:{ECHO_PORT} ({mac}) from {}:{ECHO_FROM}",
        c.packets, c.ip
    )
    .map_err(|e| e.to_string())?;
    let max = c.size - HDRS;
    let mut intact = 0u64;
    for k in 0..c.packets {
        let len = 1 + (k as usize * 97) % max;
        let frame = udp_frame(&ends, HDRS + len, k as u8);
        // The first datagram again every second until the host answers.
        let (wait, again) = match k {
            0 => (ECHO_FIRST_WAIT, Some(Duration::from_secs(1))),
            _ => (ECHO_WAIT, None),
        };
        match echo_once(&mut p, c, &frame, wait, again)? {
            Some(echo) if udp_payload(&echo) == udp_payload(&frame) => intact += 1,
            Some(_) => {}
            None => {
                writeln!(out, "no echo of datagram {k} ({len} bytes)")
                    .map_err(|e| e.to_string())?;
                break;
            }
        }
    }
    writeln!(out, "udp-echo: sent {} echoed intact {intact}", c.packets)
        .map_err(|e| e.to_string())?;
    if let Some(s) = p.steer.take() {
        s.destroy().map_err(|e| format!("flow steering: {e}"))?;
    }
    Ok(())
}

/// Sends `frame` (again every `again`, if given) and waits at most `wait`
/// for one datagram back; its frame, or `None`.
fn echo_once(
    p: &mut Port,
    c: &Cli,
    frame: &[u8],
    wait: Duration,
    again: Option<Duration>,
) -> Result<Option<Vec<u8>>, String> {
    let start = Instant::now();
    let mut sent_at: Option<Instant> = None;
    let mut got = [RxPkt::default()];
    loop {
        if sent_at.is_none_or(|t| again.is_some_and(|a| t.elapsed() >= a)) {
            p.buf.write(0, frame).map_err(|e| format!("frame: {e}"))?;
            drain(p)?;
            let pkt = TxPkt {
                headers: &frame[..HDRS],
                payload: Some(
                    p.mr.sge(HDRS as u64, (frame.len() - HDRS) as u32)
                        .map_err(|e| format!("payload: {e}"))?,
                ),
                csum: true,
                mss: 0,
                vlan: None,
            };
            if p.qp.tx_burst(&[pkt]) != 1 {
                return Err("udp-echo: the send ring is full".into());
            }
            sent_at = Some(Instant::now());
        }
        let (wq, cq) = &mut p.rx[0];
        if wq.rx_burst(cq, &mut got) == 1 {
            let r = got[0];
            let at = rx_at(c.flows, 0, usize::from(r.slot));
            let mut f = vec![0u8; r.len as usize];
            let read = p.buf.read(at, &mut f).map_err(|e| format!("echo: {e}"));
            let sge = p.rx_sge(c.flows, 0, usize::from(r.slot))?;
            p.rx[0].0.post_rx(&[sge]);
            read?;
            if r.error.is_none() {
                return Ok(Some(f));
            }
        }
        if start.elapsed() >= wait {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The UDP payload of a [`udp_frame`]-shaped frame (Ethernet, a 20-byte
/// IPv4 header, UDP), as long as its IPv4 total length says: a frame under
/// Ethernet's 60 bytes arrives padded with zeros past it.
fn udp_payload(f: &[u8]) -> Option<&[u8]> {
    let total = usize::from(u16::from_be_bytes([*f.get(16)?, *f.get(17)?]));
    f.get(HDRS..14 + total)
}

/// `aa:bb:cc:dd:ee:ff`.
fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let v: Vec<u8> = s
        .split(':')
        .map(|x| u8::from_str_radix(x, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("MAC {s:?}: {e}"))?;
    v.try_into().map_err(|_| format!("MAC {s:?}: six bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram's payload is what its IPv4 length says: the zeros a
    /// runt is padded with on the wire are not part of it.
    #[test]
    fn a_padded_echo_carries_the_same_payload() {
        let ends = Ends {
            macs: ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
            ips: ([10, 0, 0, 1], [10, 0, 0, 2]),
            ports: (9001, 7000),
        };
        let frame = udp_frame(&ends, HDRS + 3, 5);
        let mut padded = frame.clone();
        padded.resize(60, 0);
        assert_eq!(udp_payload(&padded), udp_payload(&frame));
        assert_eq!(udp_payload(&frame).map(<[u8]>::len), Some(3));
        padded[HDRS] ^= 1;
        assert_ne!(udp_payload(&padded), udp_payload(&frame));
        assert_eq!(udp_payload(&frame[..10]), None, "too short");
    }
}
