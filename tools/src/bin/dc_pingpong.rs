//! `dc_pingpong`: `ibv_rc_pingpong`'s exchange over DC, N clients on one
//! DCT.
//!
//! All in this process on `-c` + 1 cabled device-model functions (a
//! profile with `dct`: cx5, cx6 or cx7): the server has one DCT (its
//! receives from an SRQ) and one DCI; each client a DCT and a DCI. Every
//! client sends `-s` bytes to the server's DCT; the server answers each
//! message through its one DCI to the sender's DCT (the address exchange
//! is done through memory; each message starts with its client's index).
//! `-n` round trips per client, all clients at
//! once; then each client's line as `ibv_rc_pingpong` prints it, and the
//! server's.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use verbs::ah::Ah;
use verbs::cq::{Cq, Wc, WcStatus};
use verbs::dc::{DcAv, Dci, DciInitAttr, DciPath, Dct, DctInitAttr};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::{access, Mr};
use verbs::pd::Pd;
use verbs::qp::{send_flags as sf, AhAttr, Payload, QpCap, RecvWr, SendOp, SendWr};
use verbs::srq::Srq;
use vfio::{DmaBuffer, PciFunction};

/// The DC access key of every DCT here.
const KEY: u64 = 0xffee_ddcc;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "dc_pingpong",
    about = "Ping-pong over DC: N clients, one server DCT"
)]
struct Opts {
    /// Device model profile: cx5, cx6 or cx7 (they have DCT).
    #[arg(short = 'd', long = "ib-dev", default_value = "emu:cx6")]
    ib_dev: String,
    /// Clients.
    #[arg(short = 'c', long = "clients", default_value_t = 4)]
    clients: usize,
    /// Size of message to exchange.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Number of exchanges per client.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
}

/// One function's DC objects.
struct Node {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    buf: Arc<DmaBuffer>,
    mr: Mr,
    srq: Srq,
    dct: Dct,
    dci: Dci,
}

fn e<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |x| format!("{what}: {x}")
}

fn node(f: Arc<dyn PciFunction>, o: &Opts, mtu: u8, slots: u32) -> Result<Node, String> {
    let ctx = Context::open(f, HcaOptions::default()).map_err(e("Couldn't get context"))?;
    let pd = ctx.alloc_pd().map_err(e("ibv_alloc_pd"))?;
    let cq = ctx
        .create_cq(4096, None, None)
        .map_err(e("ibv_create_cq"))?;
    let len = (o.size as usize * (slots as usize + 1)).next_multiple_of(4096);
    let buf = DmaBuffer::new(len).map_err(e("buffer"))?;
    let mr = pd
        .reg_mr_buffer(&buf, 0, len, access::LOCAL_WRITE)
        .map_err(e("ibv_reg_mr"))?;
    let srq = pd.create_srq(slots, 1).map_err(e("ibv_create_srq"))?;
    let dct = pd
        .create_dct(&DctInitAttr {
            cq: &cq,
            srq: &srq,
            access_key: KEY,
            access_flags: 0,
            path_mtu: mtu,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                hop_limit: 64,
                port_num: 1,
                ..AhAttr::default()
            },
            pkey_index: 0,
            create_flags: 0,
        })
        .map_err(e("create DCT"))?;
    let mut dci = pd
        .create_dci(&DciInitAttr {
            send_cq: &cq,
            cap: QpCap {
                max_send_wr: slots.max(16),
                max_send_sge: 1,
                ..QpCap::default()
            },
            sq_sig_all: true,
            streams: None,
            create_flags: 0,
        })
        .map_err(e("create DCI"))?;
    dci.to_rts(&DciPath {
        path_mtu: mtu,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: 0,
    })
    .map_err(e("modify DCI to RTS"))?;
    let n = Node {
        ctx,
        pd,
        cq,
        buf,
        mr,
        srq,
        dct,
        dci,
    };
    for i in 0..slots {
        n.post_recv(o, i)?;
    }
    Ok(n)
}

impl Node {
    fn post_recv(&self, o: &Opts, slot: u32) -> Result<(), String> {
        let sge = self
            .mr
            .sge(u64::from(slot + 1) * u64::from(o.size), o.size)
            .map_err(e("SGE"))?;
        self.srq
            .post_recv(&[RecvWr {
                wr_id: u64::from(slot),
                sg_list: &[sge],
            }])
            .map_err(|(_, x)| format!("ibv_post_srq_recv: {x}"))
    }

    fn send(&mut self, o: &Opts, av: DcAv, wr_id: u64) -> Result<(), String> {
        let sge = self.mr.sge(0, o.size).map_err(e("SGE"))?;
        let wr = SendWr {
            wr_id,
            op: SendOp::Send,
            payload: Payload::Sges(&[sge]),
            flags: sf::SIGNALED,
            ud: None,
        };
        self.dci
            .post_send(&[(wr, av)])
            .map_err(|(_, x)| format!("ibv_post_send: {x}"))
    }

    fn ah_to(&self, to: &Node) -> Result<Ah, String> {
        let dgid = to.ctx.query_gid(1, 0).map_err(e("ibv_query_gid"))?;
        self.pd
            .create_ah(&AhAttr {
                dgid,
                hop_limit: 64,
                port_num: 1,
                ..AhAttr::default()
            })
            .map_err(e("ibv_create_ah"))
    }

    fn poll(&mut self, wc: &mut [Wc]) -> Result<usize, String> {
        let n = self.cq.poll(wc).map_err(e("ibv_poll_cq"))?;
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {:?} ({}) for wr_id {}",
                    w.status, w.status as u32, w.wr_id
                ));
            }
        }
        Ok(n)
    }
}

/// The ping-pong: every client's exchanges at once, the server answering.
fn run(o: &Opts, server: &mut Node, clients: &mut [Node]) -> Result<Vec<f64>, String> {
    // The exchange: each client knows the server's DCT, the server each
    // client's. A receive completion names the sending DCI, but clients on
    // different functions may have the same DCI number: each message's
    // first bytes carry its client's index.
    let mut by_index = Vec::new();
    let mut to_server = Vec::new();
    for c in clients.iter() {
        by_index.push(DcAv::new(&server.ah_to(c)?, c.dct.dctn(), KEY, 0));
        to_server.push(DcAv::new(&c.ah_to(server)?, server.dct.dctn(), KEY, 0));
    }
    let mut left = vec![o.iters; clients.len()];
    let mut start = vec![Instant::now(); clients.len()];
    let mut took = vec![0f64; clients.len()];
    for (i, c) in clients.iter_mut().enumerate() {
        c.buf
            .write(0, &(i as u32).to_be_bytes())
            .map_err(e("buffer"))?;
        start[i] = Instant::now();
        c.send(o, to_server[i].clone(), 0)?;
    }
    let mut wc = [Wc::default(); 16];
    let total = o.iters as u64 * clients.len() as u64;
    let mut answered = 0u64;
    while left.iter().any(|&l| l > 0) || answered < total {
        let n = server.poll(&mut wc)?;
        for w in &wc[..n] {
            if w.opcode != verbs::cq::WcOpcode::Recv {
                continue;
            }
            let slot = w.wr_id as u32;
            let mut who = [0u8; 4];
            server
                .buf
                .read((slot as usize + 1) * o.size as usize, &mut who)
                .map_err(e("buffer"))?;
            let i = u32::from_be_bytes(who) as usize;
            let av = by_index.get(i).ok_or("a message from nobody")?.clone();
            server.post_recv(o, slot)?;
            server.send(o, av, i as u64)?;
            answered += 1;
        }
        for (i, c) in clients.iter_mut().enumerate() {
            let n = c.poll(&mut wc)?;
            for w in &wc[..n] {
                if w.opcode != verbs::cq::WcOpcode::Recv {
                    continue;
                }
                c.post_recv(o, w.wr_id as u32)?;
                left[i] -= 1;
                if left[i] == 0 {
                    took[i] = start[i].elapsed().as_secs_f64();
                } else {
                    c.send(o, to_server[i].clone(), 0)?;
                }
            }
        }
    }
    Ok(took)
}

fn main() -> ExitCode {
    let o = Opts::parse();
    match main_with(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

fn main_with(o: &Opts) -> Result<(), String> {
    let profile = match o.ib_dev.strip_prefix("emu:").unwrap_or(&o.ib_dev) {
        "cx5" => mlx5_emu::Profile::ConnectX5,
        "cx6" | "emu" => mlx5_emu::Profile::ConnectX6,
        "cx7" => mlx5_emu::Profile::ConnectX7,
        d => {
            return Err(format!(
                "-d {d}: a device-model profile with DCT: cx5, cx6, cx7"
            ))
        }
    };
    let mtu = match o.mtu {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        4096 => 5,
        m => return Err(format!("Invalid MTU {m}")),
    };
    if o.clients == 0 || o.iters == 0 || o.size < 4 {
        return Err("at least one client, one iteration and 4 bytes".into());
    }
    let fabric = mlx5_emu::Fabric::cabled(o.clients + 1, profile);
    let f = |i| {
        fabric
            .function(i)
            .map(|f| f as Arc<dyn PciFunction>)
            .ok_or_else(|| "fabric function".to_string())
    };
    // The server holds a receive for every client's message in flight.
    let mut server = node(f(0)?, o, mtu, (o.clients as u32 * 2).max(16))?;
    let mut clients = (1..=o.clients)
        .map(|i| node(f(i)?, o, mtu, 16))
        .collect::<Result<Vec<_>, String>>()?;
    println!(
        "  server DCT 0x{:06x}, {} clients, DC key {KEY:#x}",
        server.dct.dctn(),
        o.clients
    );
    let took = run(o, &mut server, &mut clients)?;
    for (i, t) in took.iter().enumerate() {
        let bytes = 2 * u64::from(o.size) * u64::from(o.iters);
        println!("client {i}:");
        println!(
            "{bytes} bytes in {t:.2} seconds = {:.2} Mbit/sec",
            bytes as f64 * 8.0 / t / 1e6
        );
        println!(
            "{} iters in {t:.2} seconds = {:.2} usec/iter",
            o.iters,
            t * 1e6 / f64::from(o.iters)
        );
    }
    let st = fabric.function(0).ok_or("fabric function")?.model().stats();
    println!(
        "server: {} messages received on one DCT; {} DC connections open now",
        st.messages_received, st.dc_connections
    );
    Ok(())
}
