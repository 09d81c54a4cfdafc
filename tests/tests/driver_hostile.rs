//! The driver against a hostile or broken device (issue 15): absurd
//! capabilities are errors naming the field, never a panic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mlx5_emu::{DeviceConfig, OutputOverride, Profile};
use mlx5_hw::ifc::CmdHcaCap;
use mlx5_hw::opcode::Opcode;
use tests::backend::{device, Backend};
use tests::wait::{until, until_state};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::Error;

/// Rewrites the current general capabilities (QUERY_HCA_CAP op_mod 1)
/// with `edit`, once the driver has set them (SET_HCA_CAP): what the
/// driver then reads back is what it computes with.
struct CapEdit(fn(&mut CmdHcaCap<&mut [u8]>), AtomicBool);

impl OutputOverride for CapEdit {
    fn answer(&self, opcode: u16, op_mod: u16, _: &[u8], out: &[u8]) -> Option<Vec<u8>> {
        if opcode == Opcode::SetHcaCap.to_raw() {
            self.1.store(true, Ordering::Release);
        }
        if opcode != Opcode::QueryHcaCap.to_raw()
            || op_mod != 1
            || out.len() < 0x10
            || !self.1.load(Ordering::Acquire)
        {
            return None;
        }
        let mut out = out.to_vec();
        (self.0)(&mut CmdHcaCap::new_unchecked(&mut out[0x10..]));
        Some(out)
    }
}

fn context_with(edit: fn(&mut CmdHcaCap<&mut [u8]>)) -> (tests::backend::Func, Context) {
    let cfg = DeviceConfig {
        output_override: Some(Arc::new(CapEdit(edit, AtomicBool::new(false)))),
        ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
    };
    let f = device(Backend::InProcess, cfg);
    let ctx = Context::open(f.function(), HcaOptions::default())
        .unwrap_or_else(|e| panic!("open with edited caps: {e}"));
    (f, ctx)
}

fn bad_cap<T: std::fmt::Debug>(r: verbs::Result<T>, name: &str) {
    match r {
        Err(Error::BadCap { field, .. }) => assert_eq!(field, name),
        other => panic!("expected BadCap({name}), got {other:?}"),
    }
}

/// Each log capability that `query_device` shifts by, all ones (the
/// field's width): an error naming it, in debug and release alike.
#[test]
fn all_ones_capabilities_are_errors_naming_the_field() {
    type Edit = fn(&mut CmdHcaCap<&mut [u8]>);
    let cases: [(&str, Edit); 11] = [
        ("log_max_qp_sz", |c| {
            c.set_log_max_qp_sz(0xff);
        }),
        ("log_max_cq_sz", |c| {
            c.set_log_max_cq_sz(0xff);
        }),
        ("log_max_srq_sz", |c| {
            c.set_log_max_srq_sz(0xff);
        }),
        ("log_max_mkey", |c| {
            c.set_log_max_mkey(0x3f);
        }),
        ("log_max_ra_req_qp", |c| {
            c.set_log_max_ra_req_qp(0x3f);
        }),
        ("log_max_ra_res_qp", |c| {
            c.set_log_max_ra_res_qp(0x3f);
        }),
        ("log_max_qp", |c| {
            c.set_log_max_qp(0x1f);
        }),
        ("log_max_cq", |c| {
            c.set_log_max_cq(0x1f);
        }),
        ("log_max_srq", |c| {
            c.set_log_max_srq(0x1f);
        }),
        ("log_max_pd", |c| {
            c.set_log_max_pd(0x1f);
        }),
        ("log_max_msg", |c| {
            c.set_log_max_msg(0x1f);
        }),
    ];
    for (name, edit) in cases {
        let (_f, ctx) = context_with(edit);
        if name == "log_max_msg" {
            // 2^31 is a valid length; one more bit is not representable.
            let a = ctx.query_port(1).unwrap();
            assert_eq!(a.max_msg_sz, 1 << 31, "{name}");
            ctx.close().unwrap();
            continue;
        }
        bad_cap(ctx.query_device(), name);
        let e = ctx.query_device().unwrap_err().to_string();
        assert!(e.contains(name), "the message names {name}: {e}");
        ctx.close().unwrap();
    }
}

/// Where a verb sizes a queue by a capability, an absurd one fails the
/// verb, never the process.
#[test]
fn queue_sizes_by_absurd_capabilities_are_errors() {
    let (_f, ctx) = context_with(|c| {
        c.set_log_max_cq_sz(0xff);
    });
    bad_cap(ctx.create_cq(16, None, None), "log_max_cq_sz");
    ctx.close().unwrap();
}

/// MANAGE_PAGES op_mod 0 ("cannot give") commands firmware received.
fn refusals(f: &tests::backend::Func) -> usize {
    f.model()
        .command_log()
        .iter()
        .filter(|c| c.opcode == Opcode::ManagePages.to_raw() && c.op_mod == 0)
        .count()
}

fn open_with_budget(budget: usize) -> (tests::backend::Func, Context) {
    let f = device(
        Backend::InProcess,
        DeviceConfig::for_profile(Profile::ConnectX4Lx),
    );
    let opts = HcaOptions {
        max_fw_pages: budget,
        ..HcaOptions::default()
    };
    let ctx = Context::open(f.function(), opts).unwrap_or_else(|e| panic!("open: {e}"));
    (f, ctx)
}

/// A PAGE_REQUEST for 2^31 - 1 pages: refused whole (nothing allocated),
/// reported to firmware as the kernel does (MANAGE_PAGES op_mod 0), and
/// the HCA still works and closes with every page back.
#[test]
fn a_page_request_for_2_31_pages_is_refused_and_reported() {
    let (f, ctx) = open_with_budget(16_384);
    let held = f.model().stats().pages_held;
    f.model().request_pages(i32::MAX);
    until("the refusal", || refusals(&f) == 1);
    assert_eq!(f.model().stats().pages_held, held, "nothing was given");
    assert_eq!(ctx.hca().fw_pages(), held as usize);
    ctx.hca().nop().unwrap();
    ctx.close().unwrap();
    assert_eq!(f.model().stats().pages_held, 0);
    assert_eq!(f.dma_mappings(), 0);
}

/// A storm of one-page requests past the budget: pages are given up to
/// the budget, each request past it refused to firmware.
#[test]
fn a_page_request_storm_stops_at_the_budget() {
    // What bring-up gives (boot and init pages), then 40 more at most.
    let (f0, ctx0) = open_with_budget(1 << 16);
    let need = f0.model().stats().pages_held as usize;
    ctx0.close().unwrap();
    drop(f0);
    let budget = need + 40;
    let (f, ctx) = open_with_budget(budget);
    f.model().faults().page_request_storm(100);
    until_state(
        "60 refusals",
        || refusals(&f) == 60,
        || {
            let st = f.model().stats();
            format!(
                "refusals {}, pages held {}, EQ overruns {}, health {:?}",
                refusals(&f),
                st.pages_held,
                st.eq_overruns,
                ctx.hca().health_failure()
            )
        },
    );
    assert_eq!(f.model().stats().pages_held as usize, budget);
    ctx.close().unwrap();
    assert_eq!(f.model().stats().pages_held, 0);
    assert_eq!(f.dma_mappings(), 0);
}

/// A request within the budget but huge: closing interrupts the give
/// (before the fix close waited for every page to be given).
#[test]
fn close_interrupts_a_give_in_progress() {
    // 300 MANAGE_PAGES of 512 pages (300 blocks of 2 MiB).
    let want = 300 * 512;
    let (f, ctx) = open_with_budget(want + (1 << 16));
    let held = f.model().stats().pages_held;
    let gives = |f: &tests::backend::Func| {
        f.model()
            .command_log()
            .iter()
            .filter(|c| c.opcode == Opcode::ManagePages.to_raw() && c.op_mod == 1)
            .count()
    };
    let at_boot = gives(&f);
    f.model().request_pages(want as i32);
    until("the give to start", || f.model().stats().pages_held > held);
    ctx.close().unwrap();
    assert_eq!(
        f.model().stats().pages_held,
        0,
        "every page given came back"
    );
    let gives = gives(&f) - at_boot;
    assert!(
        gives < want / 512,
        "the give was interrupted ({gives} MANAGE_PAGES GIVE of {})",
        want / 512
    );
    assert_eq!(f.dma_mappings(), 0);
}

/// Answers QUERY_PAGES (boot) with 2^31 - 1 pages.
struct BootPagesEdit;

impl OutputOverride for BootPagesEdit {
    fn answer(&self, opcode: u16, op_mod: u16, _: &[u8], out: &[u8]) -> Option<Vec<u8>> {
        if opcode != Opcode::QueryPages.to_raw() || op_mod != 1 {
            return None;
        }
        let mut out = out.to_vec();
        mlx5_hw::ifc::query_pages_out::NUM_PAGES.set(&mut out, i32::MAX as u64);
        Some(out)
    }
}

/// QUERY_PAGES at boot asking 2^31 - 1 pages: bring-up fails with the
/// budget error, having allocated nothing and left nothing mapped.
#[test]
fn boot_pages_past_the_budget_fail_bring_up() {
    let cfg = DeviceConfig {
        output_override: Some(Arc::new(BootPagesEdit)),
        ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
    };
    let f = device(Backend::InProcess, cfg);
    match Context::open(f.function(), HcaOptions::default()) {
        Err(Error::PageBudget { requested, .. }) => assert_eq!(requested, i32::MAX as u64),
        other => panic!("expected PageBudget, got {:?}", other.map(|_| ())),
    }
    assert_eq!(f.model().stats().pages_held, 0);
    assert_eq!(f.dma_mappings(), 0);
}
