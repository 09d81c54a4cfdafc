//! `mlx5 layouts`: the registry of every PRM layout, as JSON or as a table.

use mlx5_hw::registry::{self, FieldType, LayoutInfo};
use serde_json::{json, Map, Value};

/// The JSON form: `{"name": {"size": bits, "fields": {"field": [bit_off, width], ...}}, ...}`.
pub fn to_json(layouts: &[&LayoutInfo]) -> Value {
    let mut all = Map::new();
    for l in layouts {
        let mut fields = Map::new();
        for f in l.fields {
            fields.insert(f.name.to_string(), json!([f.bit_off, f.width]));
        }
        all.insert(
            l.name.to_string(),
            json!({ "size": l.size_bits, "fields": Value::Object(fields) }),
        );
    }
    Value::Object(all)
}

/// The readable form of one layout.
pub fn table(l: &LayoutInfo) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} ({:?}): {} bits, {} bytes. {}",
        l.name,
        l.kind,
        l.size_bits,
        l.size_bits / 8,
        l.doc
    );
    let _ = writeln!(
        o,
        "  {:>6} {:>6} {:>6}  {:<40} type",
        "bit", "width", "byte", "field"
    );
    for f in l.fields {
        let ty = match f.ty {
            FieldType::Bits => String::new(),
            FieldType::Layout(n) => n.to_string(),
            FieldType::Array {
                elem_bits,
                count,
                elem,
            } => format!(
                "[{}; {}]",
                elem.map_or_else(|| format!("{elem_bits} bits"), String::from),
                if count == 0 {
                    "flexible".to_string()
                } else {
                    count.to_string()
                }
            ),
        };
        let _ = writeln!(
            o,
            "  {:>#6x} {:>#6x} {:>#6x}  {:<40} {}",
            f.bit_off,
            f.width,
            f.bit_off / 8,
            f.name,
            ty
        );
    }
    o
}

/// Runs `mlx5 layouts [--json] [NAME]`.
pub fn run(json: bool, name: Option<&str>) -> Result<String, String> {
    let chosen: Vec<&LayoutInfo> = match name {
        Some(n) => vec![registry::layout(n)
            .ok_or_else(|| format!("no layout named {n:?}; `mlx5 layouts` lists them all"))?],
        None => registry::layouts().to_vec(),
    };
    if json {
        serde_json::to_string(&to_json(&chosen)).map_err(|e| e.to_string())
    } else if name.is_some() {
        Ok(chosen.iter().map(|l| table(l)).collect())
    } else {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{:<40} {:>8} {:>7}  description",
            "layout", "bits", "fields"
        );
        for l in &chosen {
            let _ = writeln!(
                o,
                "{:<40} {:>8} {:>7}  {}",
                l.name,
                l.size_bits,
                l.fields.len(),
                l.doc
            );
        }
        let _ = write!(o, "{} layouts; `mlx5 layouts NAME` shows one", chosen.len());
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_documented_shape() {
        let v = to_json(registry::layouts());
        let cq = &v["create_cq_in"];
        assert_eq!(cq["size"], 2176);
        assert_eq!(cq["fields"]["opcode"], json!([0, 16]));
        assert_eq!(cq["fields"]["uid"], json!([16, 16]));
        assert_eq!(cq["fields"]["cq_context"], json!([128, 512]));
    }

    #[test]
    fn unknown_layout_is_a_clear_error() {
        let e = run(false, Some("no_such_layout")).unwrap_err();
        assert!(e.contains("no layout named"));
    }
}
