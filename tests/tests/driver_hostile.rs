//! The driver against a hostile or broken device (issue 15): absurd
//! capabilities are errors naming the field, never a panic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mlx5_emu::{DeviceConfig, OutputOverride, Profile};
use mlx5_hw::ifc::CmdHcaCap;
use mlx5_hw::opcode::Opcode;
use tests::backend::{device, Backend};
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
