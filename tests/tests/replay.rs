//! Real firmware replay: the driver's bring-up and teardown against the
//! device model whose answers are replaced by what real ConnectX-4
//! firmware (14.12.1220) answered in the shared `mlx5_core` trace
//! (`tests::replay`, hooked in through `mlx5_emu::OutputOverride`).
//!
//! The driver must come up on real capabilities and real page counts, and
//! every command it sends that real firmware never answered in the trace is
//! named (the trace ends at the kernel's CREATE_EQs).
//!
//! The trace is found at `$MLX5_TRACE`, else in the repo's
//! `tests/data/traces/` (its README says where it came from).

use std::collections::BTreeSet;
use std::sync::Arc;

use mlx5_hw::ifc::{cmd_hca_cap, manage_pages_in, query_pages_out};
use mlx5_hw::trace::{self, TracedCommand};
use tests::replay::{Kind, Replay, Source};
use verbs::cmd::TraceSink;
use verbs::hca::{Hca, HcaOptions};
use vfio::emulated::EmulatedFunction;
use vfio::PciFunction;

const QUERY_HCA_CAP: u16 = 0x100;
const QUERY_PAGES: u16 = 0x107;
const MANAGE_PAGES: u16 = 0x108;
const SET_HCA_CAP: u16 = 0x109;
/// QUERY_HCA_CAP op_mod: general caps, current values.
const GENERAL_CUR: u16 = 1;
/// Where the capability starts in a QUERY_HCA_CAP output.
const CAP_OFF: usize = 0x10;

fn commands() -> Vec<TracedCommand> {
    tests::connectx4_trace()
}

fn replay_device(replay: &Arc<Replay>) -> Arc<EmulatedFunction<mlx5_emu::Device>> {
    let cfg = mlx5_emu::DeviceConfig {
        output_override: Some(replay.clone()),
        ..mlx5_emu::DeviceConfig::for_profile(mlx5_emu::Profile::ConnectX4Lx)
    };
    Arc::new(mlx5_emu::emulated_with(cfg))
}

/// The general caps (current) real firmware reported last: after
/// SET_HCA_CAP and INIT_HCA.
fn traced_general_cur(cmds: &[TracedCommand]) -> Vec<u8> {
    let set_at = cmds
        .iter()
        .position(|c| c.opcode == SET_HCA_CAP)
        .expect("the trace has a SET_HCA_CAP");
    let c = cmds[set_at..]
        .iter()
        .rev()
        .find(|c| c.opcode == QUERY_HCA_CAP && c.op_mod == GENERAL_CUR)
        .expect("the trace queries the general caps after SET_HCA_CAP");
    c.output[CAP_OFF..].to_vec()
}

/// The page counts real firmware asked for: (boot, init).
fn traced_page_counts(cmds: &[TracedCommand]) -> (i64, i64) {
    let n = |op_mod| {
        let c = cmds
            .iter()
            .find(|c| c.opcode == QUERY_PAGES && c.op_mod == op_mod)
            .unwrap_or_else(|| panic!("the trace has QUERY_PAGES op_mod {op_mod}"));
        i64::from(query_pages_out::NUM_PAGES.get(&c.output) as u32 as i32)
    };
    (n(1), n(2))
}

/// Pages the driver gave in each MANAGE_PAGES GIVE run: the runs are split
/// by the QUERY_PAGES before them (boot, init, ...).
fn given_per_phase(driver: &[TracedCommand]) -> Vec<u64> {
    let mut v = Vec::new();
    for c in driver {
        if c.opcode == QUERY_PAGES {
            v.push(0);
        } else if c.opcode == MANAGE_PAGES && c.op_mod == 1 {
            if let Some(last) = v.last_mut() {
                *last += manage_pages_in::INPUT_NUM_ENTRIES.get(&c.input);
            }
        }
    }
    v
}

fn bring_up_and_teardown(event_mode: bool) {
    let cmds = commands();
    let replay = Arc::new(Replay::new(&cmds));
    let f = replay_device(&replay);
    let (sink, text) = TraceSink::memory();
    let func: Arc<dyn PciFunction> = f.clone();
    let hca = Hca::open(
        func,
        HcaOptions {
            event_mode,
            // The health poller at the kernel's interval (HcaOptions::default):
            // three polls without a tick (6 s) declare the firmware dead, which a
            // loaded machine starving the model's worker for 1.5 s must not.
            trace: Some(sink),
            ..HcaOptions::default()
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "bring-up against real firmware's answers: {e}\n{}",
            replay.report()
        )
    });
    assert_eq!(hca.cmd().event_mode(), event_mode);

    // Real capabilities: what real firmware reported after SET_HCA_CAP
    // and INIT_HCA.
    let real = traced_general_cur(&cmds);
    let g = hca.caps().gen();
    assert_eq!(
        u64::from(g.log_max_qp()),
        cmd_hca_cap::LOG_MAX_QP.get(&real),
        "log_max_qp"
    );
    assert_eq!(
        u64::from(g.log_max_cq()),
        cmd_hca_cap::LOG_MAX_CQ.get(&real)
    );
    assert_eq!(g.log_max_cq(), 24, "real ConnectX-4: log_max_cq 24");
    assert_eq!(hca.caps().general.current, real, "the whole general page");

    // Real page counts: 6 boot, 12868 init, given in full, and the model
    // holds them (its accounting followed what was given).
    let (boot, init) = traced_page_counts(&cmds);
    assert_eq!((boot, init), (6, 12868));
    let driver = trace::parse(&text.lock().unwrap()).expect("the driver's own trace parses");
    let given = given_per_phase(&driver);
    assert!(given.len() >= 2, "two QUERY_PAGES at least: {given:?}");
    assert_eq!(given[0] as i64, boot, "boot pages given");
    assert_eq!(given[1] as i64, init, "init pages given");
    assert_eq!(hca.fw_pages() as i64, boot + init);
    assert_eq!(f.model().stats().pages_held as i64, boot + init);
    assert_eq!(f.model().stats().hca_state, mlx5_emu::HcaState::Initialized);
    let (c, a) = hca.eqns();
    assert!(c.is_some() && a.is_some());
    hca.nop().unwrap();

    hca.close().unwrap();
    assert_eq!(f.dma_mappings(), 0);
    assert_eq!(f.bus().irqs.attached(), 0);

    let report = replay.report();
    println!("=== real firmware replay, event mode {event_mode} ===\n{report}");

    // Every bring-up command up to INIT_HCA was answered by the trace.
    let log = replay.log();
    let init_at = log
        .iter()
        .position(|a| a.opcode == 0x102)
        .expect("INIT_HCA was sent");
    for a in &log[..=init_at] {
        assert!(
            matches!(a.source, Source::Trace { .. }),
            "{:#x}/{} before INIT_HCA had no real answer\n{report}",
            a.opcode,
            a.op_mod
        );
        assert_eq!(a.status, 0);
    }

    // The commands real firmware never answered in the trace, named.
    let names: BTreeSet<&str> = replay.unanswered_names().into_iter().collect();
    for want in [
        "NOP",
        "QUERY_NIC_VPORT_CONTEXT",
        "MANAGE_PAGES",
        "DESTROY_EQ",
        "DEALLOC_UAR",
        "TEARDOWN_HCA",
        "DISABLE_HCA",
    ] {
        assert!(names.contains(want), "{want} not reported\n{report}");
        assert!(report.contains(want), "the report names {want}");
    }
    let expected: BTreeSet<&str> = [
        "SET_DRIVER_VERSION",
        "NOP",
        "QUERY_NIC_VPORT_CONTEXT",
        "MANAGE_PAGES",
        "DESTROY_EQ",
        "DEALLOC_UAR",
        "TEARDOWN_HCA",
        "DISABLE_HCA",
    ]
    .into_iter()
    .collect();
    assert!(
        names.is_subset(&expected),
        "unexpected commands without a real answer: {:?}\n{report}",
        names.difference(&expected).collect::<Vec<_>>()
    );
    // MANAGE_PAGES appears only as TAKE (op_mod 2): GIVE was replayed.
    for u in replay.unanswered() {
        if u.opcode == MANAGE_PAGES {
            assert_eq!(u.op_mod, 2, "{u}");
        }
        assert_eq!(u.model_status, 0, "the model failed {u}");
    }

    // No replayed command had a different status in the model: the model's
    // state moved as real firmware's did.
    let status: Vec<String> = replay
        .divergences()
        .iter()
        .filter(|d| d.what == "status")
        .map(ToString::to_string)
        .collect();
    assert!(status.is_empty(), "status divergences: {status:#?}");

    // Every output difference follows from a difference in what our driver
    // set (SET_HCA_CAP) against what the kernel set: elsewhere the model
    // answers as real firmware did (caps, adapter, pages, ISSI, ids).
    let divs = replay.divergences();
    let set_by_driver: BTreeSet<&str> = divs
        .iter()
        .filter(|d| d.kind == Kind::Input)
        .map(|d| d.what.as_str())
        .collect();
    for d in divs.iter().filter(|d| d.kind == Kind::Output) {
        if let Some((_, why)) = MODEL_FILLS.iter().find(|(f, _)| d.what.ends_with(f)) {
            println!("expected divergence: {d} ({why})");
            continue;
        }
        assert!(
            set_by_driver.contains(d.what.as_str()),
            "the model differs from real firmware: {d}\n{report}"
        );
    }
}

/// Fields where the model answers with more than the traced firmware on
/// purpose, and why.
const MODEL_FILLS: &[(&str, &str)] = &[(
    "cmd_hca_cap.device_frequency_khz",
    "firmware 14.12 gives the frequency only in MHz (275); the model also fills \
     the kHz field, which Linux 6.12 needs for its PTP clock",
)];

#[test]
fn real_firmware_replay_polled() {
    bring_up_and_teardown(false);
}

#[test]
fn real_firmware_replay_event_mode() {
    bring_up_and_teardown(true);
}

/// Outputs are cycled per (opcode, op_mod) in trace order and the last one
/// repeats: the third general-caps query sees the caps after INIT_HCA.
#[test]
fn repeats_follow_trace_order_then_hold_the_last() {
    use mlx5_emu::OutputOverride;
    let cmds = commands();
    let replay = Replay::new(&cmds);
    let n = replay.recorded(QUERY_HCA_CAP, GENERAL_CUR);
    assert!(n >= 2, "the trace queries general caps twice: {n}");
    let all: Vec<&TracedCommand> = cmds
        .iter()
        .filter(|c| c.opcode == QUERY_HCA_CAP && c.op_mod == GENERAL_CUR)
        .collect();
    let mut input = vec![0u8; 0x10];
    input[..2].copy_from_slice(&QUERY_HCA_CAP.to_be_bytes());
    input[6..8].copy_from_slice(&GENERAL_CUR.to_be_bytes());
    let model = vec![0u8; 0x1010];
    for k in 0..n + 2 {
        let out = replay
            .answer(QUERY_HCA_CAP, GENERAL_CUR, &input, &model)
            .expect("replayed");
        assert_eq!(out, all[k.min(n - 1)].output, "answer {k}");
    }
    // Never answered: the model's output stays, and the command is named.
    let mut td = vec![0u8; 0x10];
    td[..2].copy_from_slice(&0x103u16.to_be_bytes());
    assert!(replay.answer(0x103, 0, &td, &[0u8; 0x10]).is_none());
    assert_eq!(replay.unanswered_names(), vec!["TEARDOWN_HCA"]);
}
