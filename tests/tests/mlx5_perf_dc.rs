//! `mlx5-perf -c DC` (issue 20): perftest's DC mode on two cabled
//! ConnectX-6 model functions (DCIs send to the peer's DCTs), its header
//! and result rows; refused where the device has no DCT.

fn run(args: &[&str]) -> Result<String, String> {
    let mut out = Vec::new();
    tools::perf::cli::main_with(args, &mut out)?;
    Ok(String::from_utf8(out).expect("output is text"))
}

fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .flat_map(|l| l.split('\t'))
        .filter_map(|p| p.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
        .unwrap_or_else(|| panic!("no {key:?} in\n{text}"))
}

/// The one result row of a bandwidth run: size, iterations, peak,
/// average, message rate.
fn bw_row(text: &str) -> Vec<f64> {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| l.trim_start().starts_with("#bytes"))
        .unwrap_or_else(|| panic!("no results in\n{text}"));
    let row: Vec<f64> = lines
        .next()
        .expect("a row")
        .split_whitespace()
        .map(|x| x.parse().expect("a number"))
        .collect();
    assert_eq!(row.len(), 5, "{text}");
    row
}

#[test]
fn write_read_send_and_atomic_bw_over_dc() {
    for (prog, size) in [
        ("write_bw", "4096"),
        ("read_bw", "4096"),
        ("send_bw", "1024"),
        ("atomic_bw", "8"),
    ] {
        let mut args = vec![prog, "-d", "emu:cx6", "-c", "DC", "-n", "64", "-q", "2"];
        if prog != "atomic_bw" {
            args.extend(["-s", size]);
        }
        let text = run(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(field(&text, "Connection type"), "DC", "{text}");
        assert_eq!(field(&text, "Using SRQ"), "ON");
        assert_eq!(field(&text, "Number of qps"), "2");
        let r = bw_row(&text);
        assert_eq!(r[0] as u64, size.parse::<u64>().unwrap());
        assert!(r[3] > 0.0 && r[4] > 0.0, "{prog}: {r:?}");
    }
}

#[test]
fn dc_latency_and_bidirectional() {
    let text = run(&[
        "send_lat", "-d", "emu:cx6", "-c", "DC", "-n", "20", "-s", "64",
    ])
    .unwrap();
    assert_eq!(field(&text, "Connection type"), "DC");
    let text = run(&["write_bw", "-d", "emu:cx6", "-c", "DC", "-n", "64", "-b"]).unwrap();
    assert!(bw_row(&text)[3] > 0.0);
}

#[test]
fn dc_on_a_card_without_dct_is_refused() {
    let e = run(&["write_bw", "-d", "emu:cx4lx", "-c", "DC", "-n", "8"]).unwrap_err();
    assert!(e.contains("DC"), "{e}");
}
