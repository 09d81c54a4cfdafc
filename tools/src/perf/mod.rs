//! `mlx5-perf`: perftest's programs (`ib_write_bw`, `ib_read_lat`, ...) over
//! this driver, with perftest's flags, output and JSON, so that figures
//! sit next to perftest's without translation.
//!
//! A run is two sides, a server (no HOST) and a client (HOST), that swap
//! their QPs' addresses over TCP ([`exchange`]), connect, and run the
//! bandwidth ([`bw`]) or latency ([`lat`]) loop for each size; the client
//! prints the results ([`report`], [`json`]). Without `-d` (or with
//! `-d emu[:PROFILE]`) both sides run in this process, on two cabled
//! device-model functions, as two threads talking over loopback TCP.

pub mod bw;
pub mod cli;
pub mod clock;
pub mod exchange;
pub mod json;
pub mod lat;
pub mod params;
pub mod report;
pub mod res;

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use vfio::PciFunction;

use crate::dev::Dev;
use exchange::Ctl;
use params::{Kind, Params, Verb};
use res::Side;

/// Nothing to poll: give the CPU away. perftest spins; here the device
/// model's threads share the CPUs with the benchmark, and a spinning
/// poller on a machine with few cores starves the "hardware".
#[inline]
pub fn idle() {
    std::thread::yield_now();
}

/// A progress line on stderr (never on stdout or in the JSON).
pub fn progress(msg: &str) {
    let mut e = std::io::stderr();
    if e.is_terminal() {
        let _ = write!(e, "\r\x1b[K{msg}");
    } else {
        let _ = writeln!(e, "{msg}");
    }
    let _ = e.flush();
}

fn progress_end() {
    let mut e = std::io::stderr();
    if e.is_terminal() {
        let _ = write!(e, "\r\x1b[K");
    }
}

/// Runs the program `p` describes; the client's report goes to `out`.
pub fn run(p: &Params, out: &mut dyn Write) -> Result<(), String> {
    let dev = Dev::parse(p.flags.dev.as_deref())?;
    match (&dev, &p.flags.host) {
        (Dev::Emu(profile), None) => {
            let fabric = mlx5_emu::Fabric::cabled(2, *profile);
            let f0 = fabric
                .function(0)
                .ok_or("the fabric made no function 0")? as Arc<dyn PciFunction>;
            let f1 = fabric
                .function(1)
                .ok_or("the fabric made no function 1")? as Arc<dyn PciFunction>;
            let listener = exchange::listen("127.0.0.1", 0)?;
            let port = listener
                .local_addr()
                .map_err(|e| format!("local address: {e}"))?
                .port();
            let ps = p.clone();
            let server = std::thread::Builder::new()
                .name("perf-server".into())
                .spawn(move || -> Result<(), String> {
                    let mut ctl = Ctl::accept(&listener)?;
                    side_main(f0, &ps, &mut ctl, None)
                })
                .map_err(|e| format!("server thread: {e}"))?;
            let client = Ctl::connect("127.0.0.1", port)
                .and_then(|mut ctl| side_main(f1, p, &mut ctl, Some(out)));
            let server = server
                .join()
                .unwrap_or_else(|_| Err("the server side panicked".into()));
            pair_result(client, server)?;
            drop(fabric);
            Ok(())
        }
        (Dev::Emu(_), Some(_)) => Err(
            "a device-model function reaches no other process: omit HOST to run both sides here, or use -d vfio-user:PATH"
                .into(),
        ),
        (_, host) => {
            let func = dev.open()?;
            let mut ctl = match host {
                Some(h) => Ctl::connect(h, p.flags.port)?,
                None => {
                    let l = exchange::listen("0.0.0.0", p.flags.port)?;
                    eprintln!(
                        "\n************************************\n* Waiting for client to connect... *\n************************************"
                    );
                    Ctl::accept(&l)?
                }
            };
            side_main(func, p, &mut ctl, Some(out))
        }
    }
}

/// Whether `e` only says the control connection to the peer went (the
/// peer's own error is then the cause).
fn peer_lost(e: &str) -> bool {
    e.starts_with("send to peer") || e.starts_with("receive from peer")
}

/// The outcome of the in-process pair: when one side fails, the other
/// usually fails next only because its peer went ("Connection reset by
/// peer"); the real cause leads, the consequence follows.
pub(crate) fn pair_result(
    client: Result<(), String>,
    server: Result<(), String>,
) -> Result<(), String> {
    match (client, server) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(c), Ok(())) => Err(c),
        (Ok(()), Err(s)) => Err(format!("server side: {s}")),
        (Err(c), Err(s)) if peer_lost(&c) && !peer_lost(&s) => {
            Err(format!("server side: {s} (then the client side: {c})"))
        }
        (Err(c), Err(s)) => Err(format!("{c} (then the server side: {s})")),
    }
}

fn w(out: &mut Option<&mut dyn Write>, s: &str) -> Result<(), String> {
    if let Some(o) = out {
        o.write_all(s.as_bytes())
            .and_then(|_| o.flush())
            .map_err(|e| format!("output: {e}"))?;
    }
    Ok(())
}

/// One side, start to end.
fn side_main(
    func: Arc<dyn PciFunction>,
    p: &Params,
    ctl: &mut Ctl,
    out: Option<&mut dyn Write>,
) -> Result<(), String> {
    let client = ctl.client;
    let seed = (clock::cycles() as u32) ^ if client { 0x5a5a } else { 0xa5a5 };
    let mut side = Side::new(func, p, seed)?;
    side_run(&mut side, p, ctl, out).map_err(|e| side.explain(e))
}

/// One side's exchange, rounds and report, over its resources.
fn side_run(
    side: &mut Side,
    p: &Params,
    ctl: &mut Ctl,
    mut out: Option<&mut dyn Write>,
) -> Result<(), String> {
    let client = ctl.client;
    let report_here = client || p.flags.bidirectional;
    w(
        &mut out,
        &report::header(p, &side.dev_name, client, side.mtu_bytes),
    )?;
    let mine = side.dests(p)?;
    let theirs = ctl.exchange_dests(&mine)?;
    for (m, t) in mine.iter().zip(&theirs) {
        w(&mut out, &report::address(p, "local", m))?;
        w(&mut out, &report::address(p, "remote", t))?;
    }
    w(&mut out, &format!("{}\n", report::LINE))?;
    side.connect(p, theirs)?;
    ctl.sync()?;
    let gbits = p.flags.report_gbits;
    let cpu = p.flags.cpu_util;
    let duration = p.duration.map(Duration::from_secs);
    let mut results = Vec::new();
    match p.test.kind {
        Kind::Bw => {
            if report_here {
                w(&mut out, &format!("{}\n", report::bw_title(gbits, cpu)))?;
            }
            let tx = client || p.flags.bidirectional;
            let rx = p.test.verb.has_recv() && (!client || p.flags.bidirectional);
            let peer_tx = !client || p.flags.bidirectional;
            for (k, &size) in p.sizes.iter().enumerate() {
                if p.sizes.len() > 1 && client {
                    progress(&format!("size {size} ({} of {})", k + 1, p.sizes.len()));
                }
                let mut one = |iters: u64, duration: Option<Duration>| {
                    let r = bw::Round {
                        size,
                        iters,
                        duration,
                        tx,
                        rx,
                    };
                    let c0 = clock::cpu_stat();
                    let st = bw::run(side, p, ctl, r)?;
                    let c1 = clock::cpu_stat();
                    if tx {
                        ctl.send_done()?;
                    }
                    if peer_tx {
                        ctl.wait_peer_done_watching(&mut || side.device_ok())?;
                    }
                    ctl.reset_done();
                    Ok::<_, String>((st, clock::cpu_util(c0, c1)))
                };
                if p.flags.warm_up {
                    one(p.iters.min(2 * p.tx_depth as u64).max(5), None)?;
                }
                let (st, util) = one(p.iters, duration)?;
                let mut r = bw::report(p, &st, size, gbits);
                if p.flags.bidirectional {
                    let theirs = ctl.exchange_text(&format!(
                        "{} {} {} {}",
                        r.iters, r.peak, r.avg, r.msg_rate
                    ))?;
                    let v: Vec<f64> = theirs
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    if v.len() != 4 {
                        return Err(format!("peer's report is not four numbers: {theirs:?}"));
                    }
                    r.iters += v[0] as u64;
                    r.peak += v[1];
                    r.avg += v[2];
                    r.msg_rate += v[3];
                }
                if report_here {
                    let c = cpu.then_some(util);
                    w(&mut out, &format!("{}\n", report::bw_row(&r, gbits, c)))?;
                    results.push(json::bw(&r, c));
                }
            }
        }
        Kind::Lat => {
            if client {
                w(
                    &mut out,
                    &format!("{}\n", report::lat_title(duration.is_some())),
                )?;
            }
            for (k, &size) in p.sizes.iter().enumerate() {
                if p.sizes.len() > 1 && client {
                    progress(&format!("size {size} ({} of {})", k + 1, p.sizes.len()));
                }
                let mut one = |iters: u64, duration: Option<Duration>| {
                    let c0 = clock::cpu_stat();
                    let (stamps, n) = lat::run(side, p, ctl, size, iters, duration)?;
                    let c1 = clock::cpu_stat();
                    if client {
                        ctl.send_done()?;
                    } else {
                        ctl.wait_peer_done_watching(&mut || side.device_ok())?;
                        if duration.is_none()
                            && n != iters
                            && !matches!(p.test.verb, Verb::Read | Verb::Atomic)
                        {
                            return Err(format!(
                                "the client stopped after {n} of {iters} iterations"
                            ));
                        }
                    }
                    ctl.reset_done();
                    // The receives a SEND round left posted.
                    Ok::<_, String>((stamps, n, clock::cpu_util(c0, c1)))
                };
                if p.flags.warm_up {
                    one(p.iters.min(100), None)?;
                }
                let (stamps, n, util) = one(p.iters, duration)?;
                if client {
                    let r = if duration.is_some() {
                        lat::report_duration(p, &stamps, size, n)
                    } else {
                        lat::report(p, &stamps, size, n)
                    };
                    let c = cpu.then_some(util);
                    let mut row = report::lat_row(&r);
                    if let Some(c) = c {
                        row += &format!("\t    {c:<3.2}");
                    }
                    w(&mut out, &format!("{row}\n"))?;
                    results.push(json::lat(&r, c));
                }
            }
        }
    }
    if p.sizes.len() > 1 || duration.is_some() {
        progress_end();
    }
    w(&mut out, &format!("{}\n", report::LINE))?;
    if report_here && out.is_some() {
        if let Some(file) = p.json_file() {
            let doc = json::document(
                json::test_info(p, &side.dev_name, client, side.mtu_bytes),
                results,
            );
            let text = serde_json::to_string_pretty(&doc).map_err(|e| format!("JSON: {e}"))?;
            std::fs::write(&file, text + "\n").map_err(|e| format!("{file}: {e}"))?;
        }
    }
    ctl.sync()?;
    Ok(())
}

#[cfg(test)]
mod pair_tests {
    use super::pair_result;

    #[test]
    fn the_failing_side_is_reported_not_the_reset_it_caused() {
        let reset = "receive from peer: Connection reset by peer (os error 104)".to_string();
        let cause = "CREATE_QP (0x500) op_mod 0: bad parameter (0x3), syndrome 0x1".to_string();
        let e = pair_result(Err(reset.clone()), Err(cause.clone())).unwrap_err();
        assert!(e.starts_with("server side: CREATE_QP"), "{e}");
        assert!(e.contains("Connection reset"), "{e}");
        let e = pair_result(Err(cause.clone()), Err(reset.clone())).unwrap_err();
        assert!(e.starts_with("CREATE_QP"), "{e}");
        let e = pair_result(Ok(()), Err(cause.clone())).unwrap_err();
        assert!(e.contains("CREATE_QP"), "{e}");
        assert!(pair_result(Ok(()), Ok(())).is_ok());
    }
}
