//! The PRM decoders that read device bytes and traces by name: the
//! run-time registry (`mlx5_hw::registry::decode`, used by `mlx5 layouts`
//! and the trace tests) over any layout, and the `mlx5_core` command-dump
//! codec (`mlx5_hw::trace`, what `tests/tests/trace_decode.rs` reads the
//! real firmware trace with).
//!
//! Input: two bytes choosing the layout (little-endian, modulo the number
//! of layouts), then the buffer to decode; the same input, as text, is
//! parsed as a trace. A trace that parses is written back with
//! `write_commands` and parsed again: the second parse must give the same
//! commands (the writer's documented shape is lossless for what it keeps).

use mlx5_hw::{registry, trace};

/// Runs one input.
pub fn run(data: &[u8]) {
    if let [a, b, buf @ ..] = data {
        let layouts = registry::layouts();
        let info = layouts[usize::from(u16::from_le_bytes([*a, *b])) % layouts.len()];
        for f in registry::decode(info, buf) {
            assert!(
                f.value.is_some() || f.width > 64,
                "{}: {} bits decoded with no value",
                f.path,
                f.width
            );
        }
    }
    let text = String::from_utf8_lossy(data);
    let _ = trace::parse_dumps(&text);
    let Ok(cmds) = trace::parse(&text) else {
        return;
    };
    for c in &cmds {
        let _ = (c.token(), c.status(), c.syndrome(), c.delivery_status());
        let (i, o) = (c.input_dump(), c.output_dump());
        let _ = (i.message(), o.message(), i.declared_len());
        let _ = trace::TracedCommand::from_dumps(&i, &o);
        let _ = trace::opcode_name(c.opcode);
    }
    let written = trace::write_commands(trace::DEFAULT_DEVICE, &cmds);
    let again = trace::parse(&written)
        .unwrap_or_else(|e| panic!("write_commands wrote a trace parse refuses: {e}"));
    assert_eq!(
        again.len(),
        cmds.len(),
        "commands lost in a write/parse round trip"
    );
    for (a, b) in cmds.iter().zip(&again) {
        assert_eq!(
            (a.opcode, a.op_mod, &a.input, &a.output),
            (b.opcode, b.op_mod, &b.input, &b.output),
            "a command changed in a write/parse round trip"
        );
    }
}
