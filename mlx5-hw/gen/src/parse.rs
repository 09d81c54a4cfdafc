//! The `.ifc` declaration parser (grammar: `mlx5-hw/ifc/README.md`).

use crate::{Field, Kind, Layout, Ty};

/// Parses one `.ifc` file. Errors are `line: message`.
pub fn parse(text: &str, file: &str) -> Result<Vec<Layout>, String> {
    let mut out = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut cur: Option<Layout> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let t = raw.trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_string());
            continue;
        }
        let t = match t.find('#') {
            Some(i) => t[..i].trim(),
            None => t,
        };
        if t.is_empty() {
            continue;
        }
        if t == "}" {
            let l = cur.take().ok_or(format!("{line}: '}}' outside a layout"))?;
            out.push(l);
            continue;
        }
        if let Some(rest) = t.strip_suffix('{') {
            if cur.is_some() {
                return Err(format!("{line}: layout inside a layout"));
            }
            let mut w = rest.split_whitespace();
            let kind = match w.next() {
                Some("struct") => Kind::Struct,
                Some("union") => Kind::Union,
                Some("bytes") => Kind::Bytes,
                other => {
                    return Err(format!(
                        "{line}: expected struct/union/bytes, got {other:?}"
                    ))
                }
            };
            let name = w.next().ok_or(format!("{line}: layout without a name"))?;
            check_ident(name, line)?;
            if w.next().is_some() {
                return Err(format!("{line}: junk after layout name"));
            }
            cur = Some(Layout {
                name: name.to_string(),
                kind,
                doc: std::mem::take(&mut doc),
                fields: Vec::new(),
                file: file.to_string(),
                line,
                size: 0,
            });
            continue;
        }
        let l = cur
            .as_mut()
            .ok_or(format!("{line}: field outside a layout"))?;
        let (name, ty) = t
            .split_once(char::is_whitespace)
            .ok_or(format!("{line}: expected `name TYPE`"))?;
        check_ident(name, line)?;
        let ty = ty.trim();
        let (ty, misnamed) = match ty.strip_suffix("misnamed") {
            Some(t) if t.ends_with(char::is_whitespace) => (t.trim(), true),
            _ => (ty, false),
        };
        let ty = parse_ty(ty, line)?;
        l.fields.push(Field {
            name: name.to_string(),
            ty,
            misnamed,
            doc: std::mem::take(&mut doc),
            line,
            off: 0,
            width: 0,
        });
    }
    if let Some(l) = cur {
        return Err(format!("{}: layout {} is not closed", l.line, l.name));
    }
    Ok(out)
}

fn parse_ty(s: &str, line: usize) -> Result<Ty, String> {
    if let Some(inner) = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
        let (e, n) = inner
            .split_once(';')
            .ok_or(format!("{line}: array is `[ELEM; COUNT]`"))?;
        let e = parse_ty(e.trim(), line)?;
        let n = number(n.trim()).ok_or(format!("{line}: bad array count {n:?}"))?;
        return Ok(Ty::Array(Box::new(e), n));
    }
    if let Some(w) = number(s) {
        if w == 0 {
            return Err(format!("{line}: zero-width field"));
        }
        return Ok(Ty::Bits(w));
    }
    check_ident(s, line)?;
    Ok(Ty::Layout(s.to_string()))
}

fn number(s: &str) -> Option<usize> {
    match s.strip_prefix("0x") {
        Some(h) => usize::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn check_ident(s: &str, line: usize) -> Result<(), String> {
    let ok = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!("{line}: {s:?} is not a name"))
    }
}
