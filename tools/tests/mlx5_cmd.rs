//! `mlx5 cmd` as a process against the device model: a command from JSON
//! decoded by its `_out` layout, the same command from hex, a DevX command
//! on a ConnectX-4 Lx refused with its status named, JSON output, and the
//! input mistakes it refuses (unknown field, value too wide, short hex).

use std::process::{Command, Output};

const MLX5: &str = env!("CARGO_BIN_EXE_mlx5");

fn mlx5(args: &[&str]) -> Output {
    Command::new(MLX5)
        .arg("cmd")
        .args(args)
        .output()
        .expect("running mlx5")
}

fn ok(args: &[&str]) -> String {
    let o = mlx5(args);
    assert!(
        o.status.success(),
        "mlx5 cmd {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn refused(args: &[&str]) -> String {
    let o = mlx5(args);
    assert!(!o.status.success(), "mlx5 cmd {args:?} succeeded");
    String::from_utf8(o.stderr).unwrap()
}

#[test]
fn json_and_hex_commands_decode_through_the_registry() {
    // QUERY_HCA_CAP of the general page, current values (op_mod 1).
    let out = ok(&[
        "-d",
        "emu:cx5",
        r#"{"opcode":"QUERY_HCA_CAP","fields":{"op_mod":1}}"#,
    ]);
    assert!(
        out.starts_with("status OK (0x0), syndrome 0x00000000"),
        "{out}"
    );
    assert!(
        out.contains("query_hca_cap_out (4112 bytes returned)"),
        "{out}"
    );
    let uctx = out
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with("capability.cmd_hca_cap.log_max_uctx")
        })
        .expect("log_max_uctx decoded");
    assert!(uctx.ends_with("0x8"), "{uctx}");

    // The same command as hex: opcode 0x100, op_mod 1; 16 bytes of output.
    let out = ok(&[
        "--outlen",
        "0x10",
        "0100 0000 0000 0001 0000 0000 0000 0000",
    ]);
    assert!(
        out.contains("query_hca_cap_out (16 bytes returned)"),
        "{out}"
    );

    // CREATE_UCTX where the function has no DevX: the status by name.
    let out = ok(&["-d", "emu:cx4lx", r#"{"opcode":"CREATE_UCTX"}"#]);
    assert!(out.starts_with("status bad operation (0x2)"), "{out}");

    // JSON out: a uid that does not exist is a bad parameter.
    let out = ok(&[
        "--json",
        "-d",
        "emu:cx5",
        r#"{"opcode":"ALLOC_PD","fields":{"uid":"0x9"}}"#,
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["status"], "bad parameter");
    assert_eq!(v["layout"], "alloc_pd_out");
    assert_ne!(v["syndrome"], 0);
}

#[test]
fn bad_inputs_are_refused_by_name() {
    let e = refused(&[r#"{"opcode":"ALLOC_PD","fields":{"no_such":1}}"#]);
    assert!(e.contains("no field \"no_such\""), "{e}");
    let e = refused(&[r#"{"opcode":"ALLOC_PD","fields":{"uid":"0x10000"}}"#]);
    assert!(e.contains("does not fit in 16 bits"), "{e}");
    let e = refused(&["0100 0000"]);
    assert!(e.contains("at least 8 bytes"), "{e}");
    let e = refused(&[r#"{"opcode":"NO_SUCH_COMMAND"}"#]);
    assert!(e.contains("opcode"), "{e}");
}
