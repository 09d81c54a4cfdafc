//! `mlx5-perf`: every subcommand runs briefly on two cabled device-model
//! functions (both sides in this process, exchanging over loopback TCP);
//! its perftest-shaped text and its JSON file are parsed and checked.

use serde_json::Value;

const BW_MIB: &str =
    " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";
const BW_GB: &str =
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";
const LAT: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
const LINE: &str =
    "---------------------------------------------------------------------------------------";

struct Run {
    text: String,
    json: Option<Value>,
}

fn run(args: &[&str], json: bool) -> Run {
    let dir = std::env::temp_dir().join(format!(
        "mlx5-perf-test-{}-{}",
        std::process::id(),
        args.join("_").replace(['/', ' '], "")
    ));
    let file = dir.to_string_lossy().to_string() + ".json";
    let mut all: Vec<&str> = args.to_vec();
    if json {
        all.extend(["--out_json", "--out_json_file", &file]);
    }
    let mut out = Vec::new();
    if let Err(e) = tools::perf::cli::main_with(&all, &mut out) {
        panic!(
            "mlx5-perf {}: {e}\n{}",
            all.join(" "),
            String::from_utf8_lossy(&out)
        );
    }
    let text = String::from_utf8(out).expect("output is text");
    let json = json.then(|| {
        let s = std::fs::read_to_string(&file).expect("JSON file written");
        std::fs::remove_file(&file).ok();
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("{file}: {e}\n{s}"))
    });
    Run { text, json }
}

/// The header's `key : value` (perftest prints two per line, tab-separated).
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    for line in text.lines() {
        for part in line.split('\t').filter(|p| !p.is_empty()) {
            if let Some((k, v)) = part.split_once(':') {
                if k.trim() == key {
                    return v.trim();
                }
            }
        }
    }
    panic!("no {key:?} in\n{text}")
}

/// The rows under the results title line `title`.
fn rows(text: &str, title: &str) -> Vec<Vec<f64>> {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| *l == title)
        .unwrap_or_else(|| panic!("no {title:?} in\n{text}"));
    lines
        .take_while(|l| *l != LINE)
        .map(|l| {
            l.split_whitespace()
                .map(|x| {
                    x.parse::<f64>()
                        .unwrap_or_else(|_| panic!("{x:?} in {l:?}"))
                })
                .collect()
        })
        .collect()
}

fn check_header(text: &str, title: &str, conn: &str) {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], LINE);
    assert_eq!(lines[1].trim(), title, "{text}");
    assert_eq!(field(text, "Dual-port"), "OFF");
    assert!(field(text, "Device").starts_with("emu"), "{text}");
    assert_eq!(field(text, "Number of qps"), "1");
    assert_eq!(field(text, "Transport type"), "IB");
    assert_eq!(field(text, "Connection type"), conn);
    assert_eq!(field(text, "Using SRQ"), "OFF");
    assert!(field(text, "Mtu").ends_with("[B]"));
    assert_eq!(field(text, "Link type"), "Ethernet");
    let local: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with(" local address: LID 0000 QPN 0x"))
        .collect();
    let remote: Vec<&&str> = lines
        .iter()
        .filter(|l| l.starts_with(" remote address: LID 0000 QPN 0x"))
        .collect();
    assert_eq!((local.len(), remote.len()), (1, 1), "{text}");
    let gids: Vec<&&str> = lines.iter().filter(|l| l.starts_with(" GID: ")).collect();
    assert_eq!(gids.len(), 2);
    // Link-local RoCE GIDs, printed as perftest does (decimal bytes).
    assert!(
        gids.iter().all(|g| g.starts_with(" GID: 254:128:00:00")),
        "{gids:?}"
    );
    assert_ne!(gids[0], gids[1], "two functions, two GIDs");
}

fn check_bw_json(j: &Value, size: u64, iters: u64) {
    let info = &j["test_info"];
    assert!(info["Device"].as_str().unwrap().starts_with("emu"));
    assert_eq!(info["Number_of_qps"], 1);
    assert_eq!(info["Link_type"], "Ethernet");
    let r = &j["results"];
    assert_eq!(r["MsgSize"].as_u64(), Some(size), "{j}");
    assert_eq!(r["n_iterations"].as_u64(), Some(iters));
    let peak = r["BW_peak"].as_f64().unwrap();
    let avg = r["BW_average"].as_f64().unwrap();
    let rate = r["MsgRate"].as_f64().unwrap();
    assert!(avg > 0.0 && peak >= avg * 0.99 && rate > 0.0, "{r}");
}

fn check_lat_json(j: &Value, size: u64) {
    let r = &j["results"];
    assert_eq!(r["MsgSize"].as_u64(), Some(size), "{j}");
    let v = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("no {k} in {r}"));
    assert!(v("t_min") > 0.0);
    assert!(
        v("t_min") <= v("t_typical") && v("t_typical") <= v("t_max"),
        "{r}"
    );
    assert!(v("t_min") <= v("t_avg") && v("t_avg") <= v("t_max"), "{r}");
    assert!(v("percentile_99") <= v("percentile_99.9") && v("percentile_99.9") <= v("t_max"));
    assert!(v("t_stdev") >= 0.0);
}

fn bw(prog: &str, title: &str, size: u64, extra: &[&str]) {
    let s = size.to_string();
    let mut args = vec![prog, "-n", "64", "-s", &s];
    if prog.starts_with("atomic") {
        args.truncate(3);
    }
    args.extend(extra);
    let r = run(&args, true);
    check_header(&r.text, title, "RC");
    assert_eq!(
        field(&r.text, "TX depth"),
        "64",
        "TX depth is capped at the iterations"
    );
    let rows = rows(&r.text, BW_MIB);
    assert_eq!(rows.len(), 1, "{}", r.text);
    assert_eq!(rows[0].len(), 5);
    assert_eq!((rows[0][0] as u64, rows[0][1] as u64), (size, 64));
    assert!(rows[0][3] > 0.0 && rows[0][4] > 0.0, "{:?}", rows[0]);
    // The same figures in the text and the JSON.
    let j = r.json.unwrap();
    check_bw_json(&j, size, 64);
    assert!((j["results"]["BW_average"].as_f64().unwrap() - rows[0][3]).abs() < 0.011);
}

fn lat(prog: &str, title: &str, size: u64) {
    let s = size.to_string();
    let mut args = vec![prog, "-n", "50", "-s", &s];
    if prog.starts_with("atomic") {
        args.truncate(3);
    }
    let r = run(&args, true);
    check_header(&r.text, title, "RC");
    let rows = rows(&r.text, LAT);
    assert_eq!(rows.len(), 1, "{}", r.text);
    assert_eq!(rows[0].len(), 9);
    assert_eq!((rows[0][0] as u64, rows[0][1] as u64), (size, 50));
    // t_min <= t_typical <= t_max, t_min <= t_avg <= t_max, 99% <= 99.9%.
    let r0 = &rows[0];
    assert!(r0[2] > 0.0 && r0[2] <= r0[4] && r0[4] <= r0[3], "{r0:?}");
    assert!(r0[2] <= r0[5] && r0[5] <= r0[3] && r0[7] <= r0[8], "{r0:?}");
    check_lat_json(r.json.as_ref().unwrap(), size);
}

#[test]
fn write_bw() {
    bw("write_bw", "RDMA_Write BW Test", 4096, &[]);
}

#[test]
fn read_bw() {
    bw("read_bw", "RDMA_Read BW Test", 4096, &[]);
}

#[test]
fn send_bw() {
    bw("send_bw", "Send BW Test", 4096, &[]);
}

#[test]
fn atomic_bw() {
    bw("atomic_bw", "Atomic FETCH_AND_ADD BW Test", 8, &[]);
}

#[test]
fn atomic_bw_cmp_and_swap() {
    bw(
        "atomic_bw",
        "Atomic CMP_AND_SWAP BW Test",
        8,
        &["-A", "CMP_AND_SWAP"],
    );
}

#[test]
fn write_lat() {
    lat("write_lat", "RDMA_Write Latency Test", 8);
}

#[test]
fn read_lat() {
    lat("read_lat", "RDMA_Read Latency Test", 8);
}

#[test]
fn send_lat() {
    lat("send_lat", "Send Latency Test", 8);
}

#[test]
fn atomic_lat() {
    lat("atomic_lat", "Atomic FETCH_AND_ADD Latency Test", 8);
}

#[test]
fn all_sizes_sweep_2_bytes_to_8_mib() {
    let r = run(&["write_bw", "-a", "-n", "5"], true);
    let rows = rows(&r.text, BW_MIB);
    let sizes: Vec<u64> = rows.iter().map(|r| r[0] as u64).collect();
    assert_eq!(sizes, (1..=23).map(|k| 1u64 << k).collect::<Vec<_>>());
    // Every row ran its 5 iterations and measured a rate. (BW is printed
    // in MiB/s with two decimals, as perftest does: 5 x 2 bytes on a
    // loaded machine can round to 0.00, so the message rate, printed with
    // six decimals in Mpps, is what must be nonzero.)
    assert!(
        rows.iter().all(|r| r[1] as u64 == 5 && r[4] > 0.0),
        "{}",
        r.text
    );
    let res = r.json.unwrap()["results"].clone();
    let res = res.as_array().expect("a sweep's results are an array");
    assert_eq!(res.len(), 23);
    assert_eq!(res[22]["MsgSize"], 8 << 20);
}

#[test]
fn latency_sweep_and_gbits_and_ud() {
    let r = run(
        &["send_lat", "-a", "-n", "5", "-c", "UD", "-m", "1024"],
        false,
    );
    let sizes: Vec<u64> = rows(&r.text, LAT).iter().map(|r| r[0] as u64).collect();
    assert_eq!(
        sizes,
        vec![2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
        "UD stops at the MTU"
    );
    assert_eq!(field(&r.text, "Connection type"), "UD");
    let r = run(
        &[
            "send_bw",
            "-n",
            "32",
            "-s",
            "512",
            "-c",
            "UC",
            "--report_gbits",
        ],
        false,
    );
    assert_eq!(rows(&r.text, BW_GB).len(), 1);
}

#[test]
fn duration_mode() {
    let r = run(&["write_bw", "-D", "1", "-s", "1024"], true);
    let bwr = rows(&r.text, BW_MIB);
    assert_eq!(bwr.len(), 1);
    assert!(bwr[0][1] > 0.0 && bwr[0][3] > 0.0, "{:?}", bwr[0]);
    assert_eq!(bwr[0][2], 0.0, "no peak in duration mode (as perftest)");
    assert!(
        !r.text.contains(" s of "),
        "the progress line goes to stderr, not into the report"
    );
    let r = run(&["read_lat", "-D", "1"], true);
    let dur = rows(
        &r.text,
        " #bytes        #iterations       t_avg[usec]    tps average",
    );
    assert!(dur[0][1] > 0.0 && dur[0][2] > 0.0 && dur[0][3] > 0.0);
    assert!(r.json.unwrap()["results"]["tps_average"].as_f64().unwrap() > 0.0);
}

#[test]
fn more_flags() {
    // Two QPs, bidirectional, post lists, events, inline off, warm-up, CPU use.
    let r = run(
        &[
            "write_bw",
            "-n",
            "40",
            "-s",
            "2048",
            "-q",
            "2",
            "-b",
            "-l",
            "4",
            "-Q",
            "4",
            "-I",
            "0",
            "-e",
            "--perform_warm_up",
            "--cpu_util",
            "--use_hugepages",
        ],
        true,
    );
    assert_eq!(field(&r.text, "Number of qps"), "2");
    assert_eq!(field(&r.text, "Post List"), "4");
    let lines = r
        .text
        .lines()
        .filter(|l| l.starts_with(" local address"))
        .count();
    assert_eq!(lines, 2);
    let rows = rows(&r.text, &format!("{BW_MIB}    CPU_Util[%]"));
    // Both directions, both QPs: 2 x 2 x 40 messages.
    assert_eq!(rows[0][1] as u64, 160);
    assert!(r.json.unwrap()["results"]["CPU_util"].is_number());
}

#[test]
fn bad_flags_are_refused() {
    let mut out = Vec::new();
    let e = tools::perf::cli::main_with(&["read_bw", "-c", "UD"], &mut out).unwrap_err();
    assert!(e.contains("RC"), "{e}");
    let e = tools::perf::cli::main_with(&["write_bw", "-a", "-s", "8"], &mut out).unwrap_err();
    assert!(e.contains("-a"), "{e}");
    let e =
        tools::perf::cli::main_with(&["send_bw", "-c", "UD", "-s", "8192"], &mut out).unwrap_err();
    assert!(e.contains("MTU"), "{e}");
    let e =
        tools::perf::cli::main_with(&["write_bw", "-d", "emu", "somehost"], &mut out).unwrap_err();
    assert!(e.contains("HOST"), "{e}");
    assert!(out.is_empty(), "nothing printed for refused flags");
}

/// Two sides as perftest runs them: a server (`-d DEV`, waiting on its
/// port) and a client (`-d DEV HOST`), each opening its own function over
/// vfio-user; the two served functions are cabled.
#[test]
fn server_and_client_over_vfio_user() {
    use std::sync::Arc;
    use vfio::emulated::{Bus, DeviceModel};
    use vfio::user::Server;

    let fabric = mlx5_emu::Fabric::new();
    let dir = std::env::temp_dir();
    let mut servers = Vec::new();
    let mut paths = Vec::new();
    for i in 0..2u64 {
        let path = dir.join(format!("mlx5-perf-test-{}-{i}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let bus = Bus::new();
        let mut cfg = mlx5_emu::DeviceConfig::for_profile(mlx5_emu::Profile::ConnectX4Lx);
        cfg.mac = mlx5_emu::DEFAULT_MAC + i;
        let dev = Arc::new(mlx5_emu::Device::new(cfg, bus.clone()));
        fabric.attach(&dev);
        let dev: Arc<dyn DeviceModel> = dev;
        servers.push(Server::bind(&path, dev, bus).unwrap().spawn().unwrap());
        paths.push(format!("vfio-user:{}", path.display()));
    }
    // A free TCP port for the exchange.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    for prog in ["write_bw", "send_lat"] {
        let (d0, p0) = (paths[0].clone(), port.clone());
        let server = std::thread::spawn(move || {
            let mut out = Vec::new();
            tools::perf::cli::main_with(&[prog, "-n", "20", "-d", &d0, "-p", &p0], &mut out)
                .map(|()| String::from_utf8(out).unwrap())
        });
        let mut out = Vec::new();
        tools::perf::cli::main_with(
            &[prog, "-n", "20", "-d", &paths[1], "-p", &port, "127.0.0.1"],
            &mut out,
        )
        .unwrap_or_else(|e| panic!("client: {e}"));
        let srv = server
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("server: {e}"));
        let cli = String::from_utf8(out).unwrap();
        let title = if prog == "write_bw" { BW_MIB } else { LAT };
        let r = rows(&cli, title);
        assert_eq!((r.len(), r[0][1] as u64), (1, 20), "{cli}");
        // The server prints the header and both addresses, no results.
        assert!(srv.contains(" local address: LID 0000 QPN 0x"), "{srv}");
        assert!(!srv.contains(title), "{srv}");
        // Each side's local address is the other's remote one.
        let addr = |t: &str, side: &str| {
            t.lines()
                .find(|l| l.starts_with(&format!(" {side} address")))
                .unwrap()
                .split_once("QPN")
                .unwrap()
                .1
                .to_string()
        };
        assert_eq!(addr(&cli, "local"), addr(&srv, "remote"));
        assert_eq!(addr(&cli, "remote"), addr(&srv, "local"));
    }
    drop(servers);
}
