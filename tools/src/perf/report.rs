//! perftest's text output: the test-info block (`ctx_print_test_info`),
//! the address lines (`ctx_print_pingpong_data`) and the result tables
//! (`RESULT_FMT*` / `REPORT_FMT*`), in perftest's spacing.

use super::bw::BwReport;
use super::exchange::Dest;
use super::lat::LatReport;
use super::params::{Kind, Params, Verb};

/// perftest's `RESULT_LINE`.
pub const LINE: &str =
    "---------------------------------------------------------------------------------------";

/// The name line's test words (`RDMA_Write BW Test`).
pub fn title(p: &Params) -> String {
    let mut s = format!("{} ", p.test.verb.name());
    if p.test.verb == Verb::Atomic {
        s.push_str(p.flags.atomic_type.name());
        s.push(' ');
    }
    match p.test.kind {
        Kind::Bw => {
            if p.flags.bidirectional {
                s.push_str("Bidirectional ");
            }
            if p.flags.post_list > 1 {
                s.push_str("Post List ");
            }
            s.push_str("BW ");
        }
        Kind::Lat => s.push_str("Latency "),
    }
    s.push_str("Test");
    s
}

/// The test-info block.
pub fn header(p: &Params, dev: &str, client: bool, mtu_bytes: u32) -> String {
    let f = &p.flags;
    let mut o = String::new();
    o += LINE;
    o += "\n";
    o += &format!("                    {}\n", title(p));
    if f.events {
        o += &format!(" Test with events. Using {dev}_comp0\n");
    }
    o += &format!(" Dual-port       : OFF\t\tDevice         : {dev}\n");
    o += &format!(" Number of qps   : {}\t\tTransport type : IB\n", f.qps);
    o += &format!(
        " Connection type : {}\t\tUsing SRQ      : {}\n",
        f.conn.name(),
        if f.conn == super::params::Conn::Dc {
            "ON"
        } else {
            "OFF"
        }
    );
    o += " PCIe relax order: Unsupported\t\tLock-free\t: Unsupported\n";
    o += " ibv_wr* API     : OFF\t\tUsing Enhanced Reorder      : OFF\n";
    if client || f.bidirectional {
        o += &format!(" TX depth        : {}\n", p.tx_depth);
    }
    if f.post_list > 1 {
        o += &format!(" Post List       : {}\n", f.post_list);
    }
    if p.test.verb.has_recv() && (!client || f.bidirectional) {
        o += &format!(" RX depth        : {}\n", p.rx_depth);
    }
    if p.test.kind == Kind::Bw {
        o += &format!(" CQ Moderation   : {}\n", p.cq_mod);
        o += " CQE Poll Batch  : 16\n";
    }
    o += &format!(" Mtu             : {mtu_bytes}[B]\n");
    o += " Link type       : Ethernet\n";
    if f.gid_index.is_some() {
        o += &format!(" GID index       : {}\n", p.gid_index);
    }
    if matches!(p.test.verb, Verb::Read | Verb::Atomic) {
        o += &format!(" Outstand reads  : {}\n", p.outs);
    } else {
        o += &format!(" Max inline data : {}[B]\n", p.inline_size);
    }
    o += " rdma_cm QPs\t : OFF\n";
    o += " Data ex. method : Ethernet\n";
    o += LINE;
    o += "\n";
    o
}

/// C's `%#0Nx`: `0x` and zero padding to `width` in all, bare `0` padded
/// for zero.
pub fn alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{:#0width$x}", v)
    }
}

/// One side's address line and its GID line.
pub fn address(p: &Params, side: &str, d: &Dest) -> String {
    let mut o = format!(
        " {side} address: LID {} QPN {} PSN {}",
        alt_hex(d.lid as u64, 4),
        alt_hex(d.qpn as u64, 6),
        alt_hex(d.psn as u64, 6)
    );
    if p.test.verb == Verb::Read {
        o += &format!(" OUT {}", alt_hex(d.out_reads as u64, 4));
    }
    if matches!(p.test.verb, Verb::Read | Verb::Write) {
        o += &format!(
            " RKey {} VAddr {}",
            alt_hex(d.rkey as u64, 8),
            alt_hex(d.vaddr, 16)
        );
    }
    o += "\n";
    let g: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    o += &format!(" GID: {}\n", g.join(":"));
    o
}

/// The bandwidth table's title line.
pub fn bw_title(gbits: bool, cpu: bool) -> String {
    let mut s = if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"
    }
    .to_string();
    if cpu {
        s += "    CPU_Util[%]";
    }
    s
}

/// One bandwidth row (`REPORT_FMT`, or `REPORT_FMT_EXT` below 0.1 Gb/s).
pub fn bw_row(r: &BwReport, gbits: bool, cpu: Option<f64>) -> String {
    let mut s = if gbits && r.avg < 0.1 {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t     {:<7.6}",
            r.size, r.iters, r.peak, r.avg, r.msg_rate
        )
    };
    if let Some(c) = cpu {
        s += &format!("\t    {c:<3.2}");
    }
    s
}

/// The latency table's title line.
pub fn lat_title(duration: bool) -> &'static str {
    if duration {
        " #bytes        #iterations       t_avg[usec]    tps average"
    } else {
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    }
}

/// One latency row (`REPORT_FMT_LAT` / `REPORT_FMT_LAT_DUR`).
pub fn lat_row(r: &LatReport) -> String {
    match r.tps {
        Some(tps) => format!(
            " {:<7}       {}            {:<7.2}        {:<7.2}",
            r.size, r.iters, r.t_avg, tps
        ),
        None => format!(
            " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            r.size, r.iters, r.t_min, r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p999
        ),
    }
}
