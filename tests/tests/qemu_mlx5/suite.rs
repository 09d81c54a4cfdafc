//! rdma-core's own test suite (`tests/`, pyverbs) run whole in the guest on
//! mlx5_0 (`scripts/qemu-guest/guest/rdma_suite.py`: one line per test,
//! status, id, reason), held to a ratchet committed in
//! `tests/data/rdma-core-ratchet.txt`: every test recorded `ok` must still
//! pass, and a file whose recorded tests all passed or skipped must have no
//! failure or error now (a new test in it included). What fails today is
//! recorded with its cause (a model gap and the issue that builds it, or a
//! guest limit), kept across rewrites of the file:
//! `MLX5_QEMU_RATCHET_WRITE=1` rewrites it from the run (the causes of the
//! ids still failing are carried over; new failures get `cause: ?`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{repo, tagged, Tally};

/// One run of the suite: on which device it ran, its checks, its ratchet.
pub struct SuiteRun {
    /// The profile of the functions (for the ratchet's header).
    pub profile: &'static str,
    /// The ratchet file, under the repo.
    pub ratchet: &'static str,
    /// Its checks: the suite ran whole; the ratchet holds.
    pub checks: &'static [&'static str; 2],
}

/// The suite on the ConnectX-4 Lx pair (the first boot).
pub const CX4LX: SuiteRun = SuiteRun {
    profile: "cx4lx (ConnectX-4 Lx, the traced firmware 14.12)",
    ratchet: "tests/data/rdma-core-ratchet.txt",
    checks: &["rdma_core_suite_runs_whole", "rdma_core_suite_ratchet"],
};

/// The suite on the ConnectX-7 pair (the feature-rich boot).
pub const CX7: SuiteRun = SuiteRun {
    profile: "cx7 (ConnectX-7, firmware 28.39)",
    ratchet: "tests/data/rdma-core-ratchet-cx7.txt",
    checks: &[
        "cx7/rdma_core_suite_runs_whole",
        "cx7/rdma_core_suite_ratchet",
    ],
};

/// The first boot's suite checks.
pub const SUITE_CHECKS: &[&str] = CX4LX.checks;

/// One test's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// ok, FAIL, ERROR, skip, xfail or xpass.
    pub status: String,
    /// The skip reason or the failure's exception (or the time, for ok).
    pub reason: String,
    /// Why it does not pass (recorded failures only).
    pub cause: String,
}

impl Outcome {
    fn bad(&self) -> bool {
        self.status == "FAIL" || self.status == "ERROR"
    }
}

/// The results by test id, from `status \t id \t reason [\t cause]` lines.
pub fn parse(lines: &[&str]) -> BTreeMap<String, Outcome> {
    lines
        .iter()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split('\t');
            let status = f.next()?.trim().to_string();
            let id = f.next()?.trim().to_string();
            if id.is_empty() {
                return None;
            }
            let reason = f.next().unwrap_or("").trim().to_string();
            let cause = f
                .next()
                .unwrap_or("")
                .trim()
                .trim_start_matches("cause: ")
                .to_string();
            Some((
                id,
                Outcome {
                    status,
                    reason,
                    cause,
                },
            ))
        })
        .collect()
}

/// The test file an id belongs to (`tests.test_cq.CQTest.x` -> `test_cq`).
fn file_of(id: &str) -> &str {
    id.split('.').nth(1).unwrap_or(id)
}

fn ratchet_path(run: &SuiteRun) -> PathBuf {
    repo().join(run.ratchet)
}

/// Per file: (ok, failed or errored, skipped).
fn per_file(r: &BTreeMap<String, Outcome>) -> BTreeMap<&str, (usize, usize, usize)> {
    let mut m: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    for (id, o) in r {
        let e = m.entry(file_of(id)).or_default();
        match o.status.as_str() {
            "ok" | "xfail" => e.0 += 1,
            "skip" => e.2 += 1,
            _ => e.1 += 1,
        }
    }
    m
}

/// What the ratchet refuses in `now` against `was`.
pub fn regressions(
    was: &BTreeMap<String, Outcome>,
    now: &BTreeMap<String, Outcome>,
) -> Vec<String> {
    let mut out = Vec::new();
    for id in was
        .iter()
        .filter(|(_, o)| o.status == "ok")
        .map(|(id, _)| id)
    {
        match now.get(id) {
            Some(n) if n.status == "ok" => {}
            Some(n) => out.push(format!("{id}: passed, now {} ({})", n.status, n.reason)),
            None => out.push(format!("{id}: passed, now not run")),
        }
    }
    let was_files = per_file(was);
    for (id, o) in now.iter().filter(|(_, o)| o.bad()) {
        let f = file_of(id);
        let clean = was_files.get(f).is_some_and(|c| c.1 == 0);
        if clean && !was.contains_key(id) {
            out.push(format!(
                "{id}: new {} in {f}, a file that passed ({})",
                o.status, o.reason
            ));
        }
    }
    out
}

/// The ratchet file's text for `now`, the causes of `was` carried over.
pub fn render(
    now: &BTreeMap<String, Outcome>,
    was: &BTreeMap<String, Outcome>,
    profile: &str,
) -> String {
    let mut s = format!(
        "# rdma-core's tests/ (python3-pyverbs, trixie) on the device model in the QEMU guest,\n\
         # profile {profile},\n\
         # --dev mlx5_0 --gid 1 (RoCE v2), written by `MLX5_QEMU_RATCHET_WRITE=1 cargo test -p tests\n\
         # --test qemu_mlx5`. status TAB test id TAB reason [TAB cause: why it does not pass].\n\
         # qemu_mlx5 fails when a test recorded ok does not pass, or a file with no failure\n\
         # here gets one.\n",
    );
    let files = per_file(now);
    let mut last = "";
    for (id, o) in now {
        let f = file_of(id);
        if f != last {
            let (ok, bad, skip) = files[f];
            s.push_str(&format!(
                "# {f}.py: {ok} ok, {bad} failed, {skip} skipped\n"
            ));
            last = f;
        }
        let reason = if o.status == "ok" {
            ""
        } else {
            o.reason.as_str()
        };
        s.push_str(&format!("{}\t{id}\t{reason}", o.status));
        if o.bad() {
            let cause = was
                .get(id)
                .map(|w| w.cause.as_str())
                .filter(|c| !c.is_empty())
                .unwrap_or("?");
            s.push_str(&format!("\tcause: {cause}"));
        }
        s.push('\n');
    }
    s
}

/// The suite's checks from the guest's console.
pub fn judge(t: &mut Tally, console: &str, log: &str, run: &SuiteRun) {
    let lines = tagged(console, "suite: ");
    let ran = lines.iter().find_map(|l| l.strip_prefix("# ran "));
    let now = parse(&lines);
    let files = per_file(&now);
    for (f, (ok, bad, skip)) in &files {
        println!(
            "qemu_mlx5: rdma-core {f} on {}: {ok} ok, {bad} failed, {skip} skipped",
            run.profile
        );
    }
    let total = now.len();
    let finished = tagged(console, "suite rc=");
    t.check(
        run.checks[0],
        match ran {
            Some(r) if finished.first().is_some_and(|l| l.starts_with("0 ")) && total >= 300 => {
                println!("qemu_mlx5: rdma-core suite: ran {r}");
                Ok(())
            }
            _ => Err(format!(
                "{total} results, {:?} {:?}; {log}",
                finished.first(),
                ran
            )),
        },
    );
    let path = ratchet_path(run);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let was = parse(&text.lines().collect::<Vec<_>>());
    if std::env::var("MLX5_QEMU_RATCHET_WRITE").is_ok_and(|v| v == "1") && ran.is_some() {
        match std::fs::write(&path, render(&now, &was, run.profile)) {
            Ok(()) => println!("qemu_mlx5: wrote {}", path.display()),
            Err(e) => println!("qemu_mlx5: writing {}: {e}", path.display()),
        }
    }
    let newly: Vec<&String> = now
        .iter()
        .filter(|(id, o)| o.status == "ok" && was.get(*id).is_none_or(|w| w.status != "ok"))
        .map(|(id, _)| id)
        .collect();
    if !newly.is_empty() {
        println!(
            "qemu_mlx5: {} rdma-core tests pass that the ratchet does not hold (MLX5_QEMU_RATCHET_WRITE=1 records them): {newly:?}",
            newly.len()
        );
    }
    let bad = regressions(&was, &now);
    t.check(
        run.checks[1],
        if was.is_empty() {
            Err(format!("no ratchet at {}", path.display()))
        } else if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{} regressions: {bad:?}; {log}", bad.len()))
        },
    );
}

/// The ratchet's own logic on made-up results (runs without the guest):
/// a passing test that fails or vanishes, and a new failure in a file that
/// had none, are caught; the causes survive a rewrite.
pub fn self_check() -> Result<(), String> {
    let was = parse(&[
        "ok\ttests.test_pd.PD.a\t0.1s",
        "skip\ttests.test_pd.PD.b\tno",
        "ERROR\ttests.test_cq.CQ.r\tE\tcause: model",
        "ok\ttests.test_cq.CQ.c\t",
    ]);
    let same = parse(&[
        "ok\ttests.test_pd.PD.a\t0.2s",
        "skip\ttests.test_pd.PD.b\tno",
        "ERROR\ttests.test_cq.CQ.r\tE",
        "ok\ttests.test_cq.CQ.c\t",
        "FAIL\ttests.test_cq.CQ.new\tx",
    ]);
    let r = regressions(&was, &same);
    if !r.is_empty() {
        return Err(format!("false regressions {r:?}"));
    }
    let worse = parse(&[
        "FAIL\ttests.test_pd.PD.a\tboom",
        "ERROR\ttests.test_pd.PD.n\tnew",
    ]);
    let r = regressions(&was, &worse);
    if r.len() != 3 {
        return Err(format!(
            "expected 3 regressions (a failed, c not run, n new), got {r:?}"
        ));
    }
    let text = render(&same, &was, "test");
    if !text.contains("ERROR\ttests.test_cq.CQ.r\tE\tcause: model")
        || !text.contains("FAIL\ttests.test_cq.CQ.new\tx\tcause: ?")
    {
        return Err(format!("causes not carried over: {text}"));
    }
    Ok(())
}
