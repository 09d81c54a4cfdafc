//! Command sizes against Linux's `mlx5_ifc.h` (the review of `fw::sized`):
//! for every command the model serves whose input layout the registry
//! has (`<name>_in`, as Linux names it), an input of that layout's size is
//! never refused for its length (Linux sends exactly that), and an input 4
//! bytes shorter is BAD_INPUT_LENGTH (a command never reads fields the
//! caller did not send) — except where firmware still takes the older,
//! shorter layout a driver may send (INIT_HCA: 0x10 bytes before
//! `sw_owner_id`; SET_DRIVER_VERSION: the string may be short). Outputs
//! shorter than their layout are answered truncated
//! (`tests/tests/devx.rs`).

use mlx5_hw::opcode::Opcode;
use mlx5_hw::registry;
use mlx5_hw::status::CmdStatus;

use super::{cmd_in, Drv};
use crate::{DeviceConfig, Profile};

/// Commands left out: the HCA's life cycle (a zeroed one would end the
/// run), and the two that take older shorter inputs.
fn skipped(op: Opcode) -> bool {
    use Opcode as O;
    matches!(
        op,
        O::EnableHca | O::DisableHca | O::InitHca | O::TeardownHca | O::SetDriverVersion
    )
}

/// The input size Linux sends: the layout's, but where the registry's
/// layout is rdma-core's longer one (RTS2RTS with the DCI stream trailer
/// of `mlx5dv_dci_stream_id_reset`), Linux's 0x110 bytes.
fn linux_size(op: Opcode, layout_bytes: usize) -> usize {
    match op {
        Opcode::Rts2RtsQp => mlx5_hw::ifc::rst2init_qp_in::SIZE_BYTES,
        _ => layout_bytes,
    }
}

#[test]
fn every_input_layout_is_taken_whole_and_refused_short() {
    let mut d = Drv::with(DeviceConfig {
        profile: Profile::ConnectX7,
        ..DeviceConfig::default()
    });
    d.bring_up();
    let bad_len = CmdStatus::BadInputLength.to_raw();
    let bad_op = CmdStatus::BadOperation.to_raw();
    let mut checked = Vec::new();
    for &op in Opcode::ALL {
        let name = format!("{}_in", op.name().to_ascii_lowercase());
        let Some(l) = registry::layout(&name) else {
            continue;
        };
        let size = linux_size(op, l.size_bytes());
        if skipped(op) || size <= 0x10 {
            // 16 bytes is the entry's inline input: nothing shorter to send
            // that the engine would not pad.
            if !skipped(op) {
                let out = d.exec(&cmd_in(op.to_raw(), 0, size), 0x100);
                assert_ne!(out[0], bad_len, "{name}: whole input refused");
            }
            continue;
        }
        let short = d.exec(&cmd_in(op.to_raw(), 0, size - 4), 0x100);
        if short[0] == bad_op {
            continue; // not served by the model
        }
        assert_eq!(
            short[0],
            bad_len,
            "{name}: {} bytes taken",
            l.size_bytes() - 4
        );
        let whole = d.exec(&cmd_in(op.to_raw(), 0, l.size_bytes()), 0x100);
        assert_ne!(
            whole[0],
            bad_len,
            "{name}: {} bytes refused",
            l.size_bytes()
        );
        checked.push(name);
    }
    // The review covers the object commands, not a handful.
    assert!(checked.len() > 40, "{checked:?}");
}
