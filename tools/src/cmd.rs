//! `mlx5 cmd`: one raw command, from hex or JSON, run on a function the
//! tool brings up; the output decoded through the layout registry. A
//! bring-up engineer's tool: any opcode, any field, nothing between the
//! input given and the command queue but the mailbox.
//!
//! Input forms:
//! - hex: the input's bytes (`"0100 0000 0000 0001 ..."`; spaces, `:`,
//!   `_`, newlines and `0x` prefixes ignored);
//! - JSON: `{"opcode": "QUERY_HCA_CAP", "fields": {"op_mod": 1}}` (the
//!   input layout is the opcode's name in lower case with `_in`, or
//!   `"layout"`; `"fields"` sets dotted paths as `mlx5 layouts` names them,
//!   `cq_context.log_cq_size`, arrays as `pas[2]`; values are numbers or
//!   strings, `"0x..."` for hex; a field wider than 64 bits takes a hex
//!   string of its bytes; `"size"` makes the input longer, e.g. for a
//!   list after the layout; `"outlen"` and `"decode"` as the flags).
//!
//! The output is decoded with the opcode's `_out` layout (or `--decode`):
//! status by name, syndrome, then every named field that is not zero
//! (`--all`: every field), or all of it as JSON.

use std::fmt::Write;

use mlx5_hw::bits::{get_bits, set_bits};
use mlx5_hw::ifc::general_obj_out_cmd_hdr as hdr;
use mlx5_hw::opcode::Opcode;
use mlx5_hw::registry::{self, FieldType, LayoutInfo};
use mlx5_hw::status::CmdStatus;
use serde_json::{json, Map, Value};

/// A command ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The input bytes.
    pub input: Vec<u8>,
    /// The output length asked for (default: the output layout's size).
    pub outlen: Option<usize>,
    /// The layout that decodes the output, when one was named.
    pub decode: Option<String>,
}

/// How to print the answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Show {
    /// Every named field, zeros included.
    pub all: bool,
    /// JSON instead of text.
    pub json: bool,
}

/// Parses a command given as hex or JSON.
pub fn parse(spec: &str) -> Result<Request, String> {
    let s = spec.trim();
    if s.starts_with('{') {
        let v: Value = serde_json::from_str(s).map_err(|e| format!("JSON input: {e}"))?;
        return from_json(&v);
    }
    let input = parse_hex(s)?;
    if input.len() < 8 {
        return Err(format!(
            "a command input is at least 8 bytes (opcode, op_mod), got {}",
            input.len()
        ));
    }
    Ok(Request {
        input,
        outlen: None,
        decode: None,
    })
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: String = s
        .split(|c: char| c.is_whitespace() || c == ':' || c == '_' || c == ',')
        .map(|t| t.trim_start_matches("0x").trim_start_matches("0X"))
        .collect();
    if digits.len() % 2 != 0 {
        return Err("hex input has an odd number of digits".into());
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&digits[i..i + 2], 16)
                .map_err(|_| format!("not hex: {:?}", &digits[i..i + 2]))
        })
        .collect()
}

fn opcode_named(name: &str) -> Option<Opcode> {
    Opcode::ALL
        .iter()
        .copied()
        .find(|o| o.name().eq_ignore_ascii_case(name))
}

fn number(v: &Value, what: &str) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("{what}: not a non-negative integer")),
        Value::String(s) => {
            let t = s.trim();
            match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16),
                None => t.parse(),
            }
            .map_err(|_| format!("{what}: not a number: {s:?}"))
        }
        _ => Err(format!("{what}: a number or a string")),
    }
}

fn from_json(v: &Value) -> Result<Request, String> {
    let o = v.as_object().ok_or("JSON input: an object")?;
    let op = match o.get("opcode") {
        Some(Value::String(s)) if opcode_named(s).is_some() => opcode_named(s),
        Some(x) => Some(Opcode::from_raw(number(x, "opcode")? as u16)),
        None => None,
    };
    let lname = match (o.get("layout").and_then(Value::as_str), op) {
        (Some(l), _) => l.to_string(),
        (None, Some(op)) => format!("{}_in", op.name().to_ascii_lowercase()),
        (None, None) => return Err("JSON input: \"opcode\" or \"layout\"".into()),
    };
    let layout =
        registry::layout(&lname).ok_or_else(|| format!("no layout {lname:?} (mlx5 layouts)"))?;
    let size = match o.get("size") {
        Some(s) => (number(s, "size")? as usize).max(layout.size_bytes()),
        None => layout.size_bytes(),
    };
    let mut input = vec![0u8; size.max(8)];
    if let Some(op) = op {
        set_path(layout, &mut input, "opcode", &json!(op.to_raw()))?;
    }
    if let Some(f) = o.get("fields") {
        let f = f.as_object().ok_or("\"fields\": an object")?;
        for (path, val) in f {
            set_path(layout, &mut input, path, val)?;
        }
    }
    let outlen = o
        .get("outlen")
        .map(|v| number(v, "outlen").map(|n| n as usize))
        .transpose()?;
    let decode = o.get("decode").and_then(Value::as_str).map(str::to_string);
    Ok(Request {
        input,
        outlen,
        decode,
    })
}

/// Bit offset and width of `path` in `layout` (nested layouts by `.`,
/// array elements by `[i]`).
pub fn locate(layout: &LayoutInfo, path: &str) -> Option<(usize, usize)> {
    let mut info = layout;
    let mut base = 0usize;
    let parts: Vec<&str> = path.split('.').collect();
    for (k, part) in parts.iter().enumerate() {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, Some(rest.strip_suffix(']')?.parse::<usize>().ok()?)),
            None => (*part, None),
        };
        let f = info.field(name)?;
        let last = k + 1 == parts.len();
        match (f.ty, index) {
            (FieldType::Bits, None) if last => return Some((base + f.bit_off, f.width)),
            (FieldType::Layout(l), None) => {
                base += f.bit_off;
                if last {
                    return Some((base, f.width));
                }
                info = registry::layout(l)?;
            }
            (
                FieldType::Array {
                    elem_bits,
                    count,
                    elem,
                },
                Some(i),
            ) => {
                if count != 0 && i >= count {
                    return None;
                }
                let off = base + f.bit_off + i * elem_bits;
                match (elem.and_then(registry::layout), last) {
                    (_, true) => return Some((off, elem_bits)),
                    (Some(l), false) => {
                        base = off;
                        info = l;
                    }
                    (None, false) => return None,
                }
            }
            (FieldType::Array { .. }, None) if last => return Some((base + f.bit_off, f.width)),
            _ => return None,
        }
    }
    None
}

fn set_path(layout: &LayoutInfo, buf: &mut Vec<u8>, path: &str, v: &Value) -> Result<(), String> {
    let (off, width) =
        locate(layout, path).ok_or_else(|| format!("{}: no field {path:?}", layout.name))?;
    if (off + width).div_ceil(8) > buf.len() {
        buf.resize((off + width).div_ceil(8), 0);
    }
    if width <= 64 {
        let n = number(v, path)?;
        if width < 64 && n >> width != 0 {
            return Err(format!("{path}: {n:#x} does not fit in {width} bits"));
        }
        set_bits(buf, off, width, n);
        return Ok(());
    }
    let s = v
        .as_str()
        .ok_or_else(|| format!("{path}: {width} bits take a hex string"))?;
    let bytes = parse_hex(s)?;
    if off % 8 != 0 || bytes.len() * 8 > width {
        return Err(format!("{path}: {} bytes do not fit", bytes.len()));
    }
    buf[off / 8..off / 8 + bytes.len()].copy_from_slice(&bytes);
    Ok(())
}

/// The layout that decodes the output of `input`: `decode` when named,
/// else the opcode's `_out` layout.
pub fn out_layout(
    input: &[u8],
    decode: Option<&str>,
) -> Result<Option<&'static LayoutInfo>, String> {
    if let Some(d) = decode {
        return registry::layout(d)
            .map(Some)
            .ok_or_else(|| format!("no layout {d:?} (mlx5 layouts)"));
    }
    let op = Opcode::from_raw(get_bits(input, 0, 16) as u16);
    if !op.is_known() {
        return Ok(None);
    }
    Ok(registry::layout(&format!(
        "{}_out",
        op.name().to_ascii_lowercase()
    )))
}

/// Renders a command's output: status and syndrome by name, the decoded
/// fields, or JSON.
pub fn render(out: &[u8], layout: Option<&LayoutInfo>, show: Show) -> String {
    let status = CmdStatus::from_raw(hdr::STATUS.get(out) as u8);
    let syndrome = hdr::SYNDROME.get(out);
    let fields: Vec<_> = layout
        .map(|l| registry::decode(l, out))
        .unwrap_or_default()
        .into_iter()
        .filter(|f| {
            show.all
                || f.value.is_some_and(|v| v != 0)
                || f.bytes.as_ref().is_some_and(|b| b.iter().any(|&x| x != 0))
        })
        .collect();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    if show.json {
        let mut m = Map::new();
        for f in &fields {
            let v = match (&f.value, &f.bytes) {
                (Some(v), _) => json!(v),
                (None, Some(b)) => json!(hex(b)),
                _ => Value::Null,
            };
            m.insert(f.path.clone(), v);
        }
        let v = json!({
            "status": status.name(),
            "status_raw": status.to_raw(),
            "syndrome": syndrome,
            "layout": layout.map(|l| l.name),
            "fields": m,
            "raw": hex(out),
        });
        return v.to_string();
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "status {} ({:#x}), syndrome {syndrome:#010x}",
        status.name(),
        status.to_raw()
    );
    match layout {
        Some(l) => {
            let _ = writeln!(o, "{} ({} bytes returned):", l.name, out.len());
        }
        None => {
            let _ = writeln!(o, "no output layout known; raw:");
        }
    }
    for f in &fields {
        match (&f.value, &f.bytes) {
            (Some(v), _) => {
                let _ = writeln!(o, "  {:<44} {v:#x}", f.path);
            }
            (None, Some(b)) => {
                let _ = writeln!(o, "  {:<44} {}", f.path, hex(b));
            }
            _ => {}
        }
    }
    if layout.is_none() {
        let _ = writeln!(o, "  {}", hex(out));
    }
    o.trim_end().to_string()
}

/// Runs `req` on `cmd` and renders the answer; a failing status is still
/// an answer (the text says which), a delivery failure an error.
pub fn run(cmd: &verbs::cmd::Cmd, req: &Request, show: Show) -> Result<String, String> {
    let layout = out_layout(&req.input, req.decode.as_deref())?;
    let outlen = req
        .outlen
        .or(layout.map(LayoutInfo::size_bytes))
        .unwrap_or(0x10)
        .max(0x10);
    let out = cmd
        .exec_unchecked(&req.input, outlen)
        .map_err(|e| format!("command not delivered: {e}"))?;
    Ok(render(&out, layout, show))
}
