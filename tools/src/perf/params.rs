//! perftest's command line: the flags that apply to this driver, their
//! defaults (`perftest_parameters.h`: 65536 B for bandwidth, 2 B for
//! latency, 1000 iterations, TX depth 128, CQ moderation 100, port 18515)
//! and the checks perftest makes before a run.

use clap::{Args, ValueEnum};

/// Which verb a test exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND.
    Send,
    /// Atomics (CMP_AND_SWAP or FETCH_AND_ADD).
    Atomic,
}

impl Verb {
    /// perftest's `testsStr`.
    pub fn name(self) -> &'static str {
        match self {
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Send => "Send",
            Verb::Atomic => "Atomic",
        }
    }

    /// The responder consumes receive WQEs (perftest's `has_recv_comp`).
    pub fn has_recv(self) -> bool {
        self == Verb::Send
    }
}

/// Bandwidth or latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `*_bw`.
    Bw,
    /// `*_lat`.
    Lat,
}

/// One of the eight programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Test {
    /// The verb.
    pub verb: Verb,
    /// Bandwidth or latency.
    pub kind: Kind,
}

impl Test {
    /// Every program, by its subcommand name.
    pub const ALL: [(&'static str, Test); 8] = [
        ("write_bw", Test::new(Verb::Write, Kind::Bw)),
        ("write_lat", Test::new(Verb::Write, Kind::Lat)),
        ("read_bw", Test::new(Verb::Read, Kind::Bw)),
        ("read_lat", Test::new(Verb::Read, Kind::Lat)),
        ("send_bw", Test::new(Verb::Send, Kind::Bw)),
        ("send_lat", Test::new(Verb::Send, Kind::Lat)),
        ("atomic_bw", Test::new(Verb::Atomic, Kind::Bw)),
        ("atomic_lat", Test::new(Verb::Atomic, Kind::Lat)),
    ];

    /// A program.
    pub const fn new(verb: Verb, kind: Kind) -> Self {
        Self { verb, kind }
    }
}

/// `-c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum Conn {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// Dynamically Connected: DCIs send to the peer's DCTs (`verbs::dc`).
    Dc,
}

impl Conn {
    /// perftest's `connStr`.
    pub fn name(self) -> &'static str {
        match self {
            Conn::Rc => "RC",
            Conn::Uc => "UC",
            Conn::Ud => "UD",
            Conn::Dc => "DC",
        }
    }
}

/// `-A`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AtomicType {
    /// Compare and swap.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// Fetch and add.
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

impl AtomicType {
    /// perftest's `atomicTypesStr`.
    pub fn name(self) -> &'static str {
        match self {
            AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            AtomicType::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}

/// The flags every program takes (perftest's names and letters).
#[derive(Args, Debug, Clone)]
pub struct Flags {
    /// The device: emu[:cx4lx|cx5|cx6|cx7] (default: both sides in this
    /// process on two cabled device-model functions), vfio-user:PATH, or a
    /// PCI address.
    #[arg(short = 'd', long = "ib-dev")]
    pub dev: Option<String>,
    /// Port of the device (only 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// GID index (0 is the link-local RoCE v2 GID the driver sets).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u32>,
    /// Connection type.
    #[arg(short = 'c', long = "connection", value_enum, default_value_t = Conn::Rc)]
    pub conn: Conn,
    /// Message size in bytes.
    #[arg(short = 's', long = "size")]
    pub size: Option<u64>,
    /// Run sizes from 2 till 2^23 (8 MiB).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Iterations per size.
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u64>,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Size of the send queue (outstanding WRs).
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Receive queue depth (send tests).
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// Max size of a message sent inline.
    #[arg(short = 'I', long = "inline_size")]
    pub inline_size: Option<u32>,
    /// Signal one completion every this many WRs.
    #[arg(short = 'Q', long = "cq-mod")]
    pub cq_mod: Option<u32>,
    /// WRs per post (a post list).
    #[arg(short = 'l', long = "post_list", default_value_t = 1)]
    pub post_list: u32,
    /// Bidirectional: both sides send (bandwidth tests).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Path MTU in bytes (256..4096).
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// Do not fail on a CPU frequency mismatch (timestamps here are
    /// nanoseconds, so there is none; accepted for perftest's scripts).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Sleep on CQ events instead of polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Atomic operation.
    #[arg(short = 'A', long = "atomic_type", value_enum, default_value_t = AtomicType::FetchAndAdd)]
    pub atomic_type: AtomicType,
    /// Outstanding reads/atomics per QP.
    #[arg(short = 'o', long = "outs")]
    pub outs: Option<u32>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Report bandwidth in Gb/sec instead of MiB/sec.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Write the results as JSON (to --out_json_file, default perftest_out.json).
    #[arg(long = "out_json")]
    pub out_json: bool,
    /// JSON output file.
    #[arg(long = "out_json_file")]
    pub out_json_file: Option<String>,
    /// Run a warm-up round before measuring.
    #[arg(long = "perform_warm_up")]
    pub warm_up: bool,
    /// Report the CPU utilization of the run (from /proc/stat).
    #[arg(long = "cpu_util")]
    pub cpu_util: bool,
    /// Back the buffers with huge pages.
    #[arg(long = "use_hugepages")]
    pub hugepages: bool,
    /// Register the buffers as a dma-buf (udmabuf over their memfd,
    /// `ibv_reg_dmabuf_mr`), as perftest's `--use_*_dmabuf` do with a
    /// GPU's memory.
    #[arg(long = "use_udmabuf")]
    pub udmabuf: bool,
    /// The server to connect to (absent: be the server).
    pub host: Option<String>,
}

/// `-a`'s largest size (perftest's MAX_SIZE).
pub const MAX_SIZE: u64 = 8 << 20;

/// The checked and defaulted parameters of a run.
#[derive(Debug, Clone)]
pub struct Params {
    /// The program.
    pub test: Test,
    /// The flags as given.
    pub flags: Flags,
    /// Sizes to run (one, or the `-a` sweep).
    pub sizes: Vec<u64>,
    /// Iterations per size (iteration mode).
    pub iters: u64,
    /// Seconds (duration mode).
    pub duration: Option<u64>,
    /// Send queue depth.
    pub tx_depth: u32,
    /// Receive queue depth.
    pub rx_depth: u32,
    /// Completion moderation.
    pub cq_mod: u32,
    /// Inline threshold.
    pub inline_size: u32,
    /// Outstanding reads/atomics.
    pub outs: u32,
    /// IBV_MTU_* of `-m` (None: the port's active MTU).
    pub mtu: Option<u8>,
    /// GID index.
    pub gid_index: u32,
}

impl Params {
    /// Checks `flags` for `test` and fills perftest's defaults.
    pub fn new(test: Test, flags: Flags) -> Result<Self, String> {
        let bw = test.kind == Kind::Bw;
        let f = &flags;
        if f.ib_port != 1 {
            return Err(format!(
                "port {} does not exist: the device has port 1",
                f.ib_port
            ));
        }
        if f.qps == 0 {
            return Err("-q: at least one QP".into());
        }
        if !bw && f.qps != 1 {
            return Err("-q: latency tests run one QP".into());
        }
        if f.bidirectional && !bw {
            return Err("-b: bidirectional is for bandwidth tests".into());
        }
        if matches!(test.verb, Verb::Read | Verb::Atomic) && !matches!(f.conn, Conn::Rc | Conn::Dc)
        {
            return Err(format!(
                "{} needs RC (-c {} given)",
                test.verb.name(),
                f.conn.name()
            ));
        }
        if test.verb == Verb::Write && f.conn == Conn::Ud {
            return Err("RDMA_Write is not possible on UD: use -c RC or UC".into());
        }
        if f.all && f.size.is_some() {
            return Err("-a and -s exclude each other".into());
        }
        if f.duration.is_some() && (f.all || f.iters.is_some()) {
            return Err("-D runs one size for a duration: not with -a or -n".into());
        }
        if f.duration == Some(0) {
            return Err("-D: at least one second".into());
        }
        let mtu = match f.mtu {
            None => None,
            Some(m) => Some(match m {
                256 => 1,
                512 => 2,
                1024 => 3,
                2048 => 4,
                4096 => 5,
                _ => return Err(format!("-m {m}: use 256, 512, 1024, 2048 or 4096")),
            }),
        };
        let max_ud = f.mtu.unwrap_or(4096) as u64;
        let sizes: Vec<u64> = if test.verb == Verb::Atomic {
            if f.size.is_some_and(|s| s != 8) {
                return Err("atomics move 8 bytes: -s 8 or nothing".into());
            }
            vec![8]
        } else if f.all {
            (1..=23)
                .map(|k| 1u64 << k)
                .filter(|s| f.conn != Conn::Ud || *s <= max_ud)
                .collect()
        } else {
            vec![f.size.unwrap_or(if bw { 65536 } else { 2 })]
        };
        for &s in &sizes {
            if s == 0 || s > MAX_SIZE.max(1 << 30) {
                return Err(format!("-s {s}: from 1 byte to 1 GiB"));
            }
            if f.conn == Conn::Ud && s > max_ud {
                return Err(format!("-s {s}: UD messages fit in one MTU ({max_ud} B)"));
            }
            if test.kind == Kind::Lat && test.verb == Verb::Write && s < 1 {
                return Err("write_lat needs at least 1 byte".into());
            }
        }
        let iters = f.iters.unwrap_or(if bw { 5000 } else { 1000 });
        if iters < 5 {
            return Err("-n: at least 5 iterations".into());
        }
        let tx_depth = f.tx_depth.unwrap_or(if bw { 128 } else { 1 });
        if tx_depth == 0 || tx_depth > 8192 {
            return Err("-t: from 1 to 8192".into());
        }
        let tx_depth = if bw && f.duration.is_none() {
            tx_depth.min(iters as u32)
        } else {
            tx_depth
        };
        let rx_depth = f
            .rx_depth
            .unwrap_or(if test.verb == Verb::Send { 512 } else { 1 });
        if rx_depth == 0 || rx_depth > 8192 {
            return Err("-r: from 1 to 8192".into());
        }
        let cq_mod = f.cq_mod.unwrap_or(100).min(tx_depth).max(1);
        if f.post_list == 0 || f.post_list > tx_depth {
            return Err("-l: from 1 to the TX depth".into());
        }
        let cq_mod = if f.post_list > 1 { f.post_list } else { cq_mod };
        // As perftest: a run of iterations posts whole lists.
        if bw && f.duration.is_none() && iters % u64::from(f.post_list) != 0 {
            return Err(format!(
                "-n {iters}: the number of iterations must be a multiple of the post list size (-l {})",
                f.post_list
            ));
        }
        let def_inline = match (test.verb, f.conn) {
            (Verb::Write, _) => 220,
            (Verb::Send, Conn::Ud) => 188,
            (Verb::Send, _) => 236,
            _ => 0,
        };
        let inline_size = f.inline_size.unwrap_or(def_inline);
        if inline_size > verbs::qp::MAX_INLINE as u32 {
            return Err(format!(
                "-I {inline_size}: at most {} bytes inline",
                verbs::qp::MAX_INLINE
            ));
        }
        let outs = f.outs.unwrap_or(16).clamp(1, 255);
        Ok(Self {
            test,
            sizes,
            iters,
            duration: f.duration,
            tx_depth,
            rx_depth,
            cq_mod,
            inline_size,
            outs,
            mtu,
            gid_index: f.gid_index.unwrap_or(0),
            flags,
        })
    }

    /// The JSON file, if `--out_json`.
    pub fn json_file(&self) -> Option<String> {
        (self.flags.out_json || self.flags.out_json_file.is_some()).then(|| {
            self.flags
                .out_json_file
                .clone()
                .unwrap_or_else(|| "perftest_out.json".into())
        })
    }
}
