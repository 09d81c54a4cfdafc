//! `mlx5-hw-gen`: turns the mlx5_ifc-style declarations in `mlx5-hw/ifc/*.ifc`
//! into `mlx5-hw/src/ifc/*.rs` (views, field constants, registry entries and,
//! for `bytes` layouts, zerocopy structs).
//!
//! `cargo run -p mlx5-hw-gen` writes the files; `-- --check` only compares and
//! exits 1 when a checked-in file differs from what the declarations give (CI
//! runs that). Offsets are computed here, never typed by hand, and checked:
//! every `reserved_at_X` must sit at bit X, every `struct`/`union` must be a
//! whole number of dwords, every `bytes` field byte aligned.

mod emit;
mod parse;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// How a layout is declared (see `mlx5-hw/ifc/README.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `struct NAME` = `mlx5_ifc_NAME_bits`.
    Struct,
    /// `union NAME` = `union mlx5_ifc_NAME_bits`.
    Union,
    /// `bytes NAME` = a byte-aligned C struct of device.h/qp.h/cq.h.
    Bytes,
}

/// A field's declared type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    /// `WIDTH` bits.
    Bits(usize),
    /// Another layout.
    Layout(String),
    /// `[ELEM; COUNT]`.
    Array(Box<Ty>, usize),
}

/// One declared field.
#[derive(Debug, Clone)]
pub struct Field {
    /// Name as in the header.
    pub name: String,
    /// Declared type.
    pub ty: Ty,
    /// Doc lines (`///` before the field).
    pub doc: Vec<String>,
    /// Line in the source, for errors.
    pub line: usize,
    /// The header names this reserved gap for another offset; keep its name
    /// (so it diffs against the header) and skip the offset check.
    pub misnamed: bool,
    /// Computed bit offset.
    pub off: usize,
    /// Computed width in bits.
    pub width: usize,
}

/// One declared layout.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Name as in the header (`cqc`).
    pub name: String,
    /// Declaration kind.
    pub kind: Kind,
    /// Doc lines.
    pub doc: Vec<String>,
    /// Fields in order.
    pub fields: Vec<Field>,
    /// Declaring file stem.
    pub file: String,
    /// Line of the declaration.
    pub line: usize,
    /// Computed size in bits.
    pub size: usize,
}

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    match run(&root, check) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("mlx5-hw-gen: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(root: &Path, check: bool) -> Result<bool, String> {
    let ifc_dir = root.join("ifc");
    let out_dir = root.join("src").join("ifc");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&ifc_dir)
        .map_err(|e| format!("{}: {e}", ifc_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ifc"))
        .collect();
    files.sort();

    let mut layouts: Vec<Layout> = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let stem = f
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| format!("{}: bad file name", f.display()))?
            .to_string();
        let mut parsed = parse::parse(&text, &stem).map_err(|e| format!("{}:{e}", f.display()))?;
        layouts.append(&mut parsed);
    }
    let mut errors = Vec::new();
    let mut by_name: BTreeMap<String, usize> = BTreeMap::new();
    for (i, l) in layouts.iter().enumerate() {
        if let Some(prev) = by_name.insert(l.name.clone(), i) {
            let p = &layouts[prev];
            errors.push(format!(
                "{}.ifc:{}: layout {} already declared at {}.ifc:{}",
                l.file, l.line, l.name, p.file, p.line
            ));
        }
    }
    layout_sizes(&mut layouts, &by_name, &mut errors);
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }

    let mut wanted: BTreeMap<PathBuf, String> = BTreeMap::new();
    let stems: Vec<String> = files
        .iter()
        .filter_map(|f| f.file_stem().and_then(|s| s.to_str()).map(String::from))
        .collect();
    for stem in &stems {
        let src: Vec<&Layout> = layouts.iter().filter(|l| &l.file == stem).collect();
        wanted.insert(
            out_dir.join(format!("{stem}.rs")),
            emit::file(stem, &src, &layouts, &by_name),
        );
    }
    wanted.insert(out_dir.join("mod.rs"), emit::module(&stems, &layouts));

    let mut same = true;
    for (path, text) in &wanted {
        let old = std::fs::read_to_string(path).ok();
        if old.as_deref() == Some(text.as_str()) {
            continue;
        }
        same = false;
        if check {
            eprintln!(
                "mlx5-hw-gen: {} is stale; run `cargo run -p mlx5-hw-gen`",
                path.display()
            );
        } else {
            std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            eprintln!("mlx5-hw-gen: wrote {}", path.display());
        }
    }
    // Files in the output folder that no declaration gives any more.
    if let Ok(rd) = std::fs::read_dir(&out_dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "rs") && !wanted.contains_key(&p) {
                same = false;
                if check {
                    eprintln!("mlx5-hw-gen: {} has no declaration file", p.display());
                } else {
                    let _ = std::fs::remove_file(&p);
                    eprintln!("mlx5-hw-gen: removed {}", p.display());
                }
            }
        }
    }
    let n_fields: usize = layouts.iter().map(|l| l.fields.len()).sum();
    eprintln!(
        "mlx5-hw-gen: {} layouts, {} fields from {} files{}",
        layouts.len(),
        n_fields,
        stems.len(),
        if check && same { ", up to date" } else { "" }
    );
    Ok(!check || same)
}

/// Computes every layout's size and every field's offset, in dependency order.
fn layout_sizes(
    layouts: &mut [Layout],
    by_name: &BTreeMap<String, usize>,
    errors: &mut Vec<String>,
) {
    let mut state = vec![0u8; layouts.len()]; // 0 new, 1 visiting, 2 done
    for i in 0..layouts.len() {
        size_of(i, layouts, by_name, &mut state, errors);
    }
}

fn size_of(
    i: usize,
    layouts: &mut [Layout],
    by_name: &BTreeMap<String, usize>,
    state: &mut [u8],
    errors: &mut Vec<String>,
) -> usize {
    match state[i] {
        2 => return layouts[i].size,
        1 => {
            errors.push(format!("layout {} contains itself", layouts[i].name));
            return 0;
        }
        _ => {}
    }
    state[i] = 1;
    let kind = layouts[i].kind;
    let mut off = 0usize;
    let mut size = 0usize;
    for fi in 0..layouts[i].fields.len() {
        let ty = layouts[i].fields[fi].ty.clone();
        let width = ty_width(
            &ty,
            layouts,
            by_name,
            state,
            errors,
            &layouts[i].name.clone(),
        );
        let kinds: Vec<Kind> = layouts.iter().map(|l| l.kind).collect();
        let kind_of = |n: &str| by_name.get(n).map(|&j| kinds[j]);
        let l = &mut layouts[i];
        let f = &mut l.fields[fi];
        f.width = width;
        f.off = if kind == Kind::Union { 0 } else { off };
        let here = format!("{}.ifc:{}: {}.{}", l.file, f.line, l.name, f.name);
        if let Some(hex) = f.name.strip_prefix("reserved_at_").filter(|_| !f.misnamed) {
            let hex = hex.split('_').next().unwrap_or(hex);
            match usize::from_str_radix(hex, 16) {
                Ok(v) if v == f.off => {}
                Ok(v) => errors.push(format!(
                    "{here}: named for bit {v:#x} but sits at bit {:#x}",
                    f.off
                )),
                Err(_) => {}
            }
        }
        if kind == Kind::Bytes {
            if f.off % 8 != 0 {
                errors.push(format!("{here}: bytes layout field not byte aligned"));
            }
            let ok = match &f.ty {
                Ty::Bits(w) => matches!(w, 8 | 16 | 32 | 64),
                Ty::Layout(n) => kind_of(n) == Some(Kind::Bytes),
                Ty::Array(e, _) => match e.as_ref() {
                    Ty::Bits(w) => matches!(w, 8 | 16 | 32 | 64),
                    Ty::Layout(n) => kind_of(n) == Some(Kind::Bytes),
                    Ty::Array(..) => false,
                },
            };
            if !ok {
                errors.push(format!("{here}: bytes layout fields are 8/16/32/64 bits, bytes layouts or arrays of those"));
            }
        } else {
            let nested = match &f.ty {
                Ty::Layout(_) => true,
                Ty::Array(e, _) => matches!(e.as_ref(), Ty::Layout(_)),
                Ty::Bits(_) => false,
            };
            if nested && f.off % 8 != 0 {
                errors.push(format!("{here}: nested layout not byte aligned"));
            }
        }
        off += width;
        size = size.max(if kind == Kind::Union { width } else { off });
    }
    let l = &mut layouts[i];
    l.size = size;
    if kind != Kind::Bytes && size % 32 != 0 {
        errors.push(format!(
            "{}.ifc:{}: {} is {size:#x} bits, not whole dwords",
            l.file, l.line, l.name
        ));
    }
    if kind == Kind::Bytes && size % 8 != 0 {
        errors.push(format!(
            "{}.ifc:{}: {} is not whole bytes",
            l.file, l.line, l.name
        ));
    }
    state[i] = 2;
    size
}

fn ty_width(
    ty: &Ty,
    layouts: &mut [Layout],
    by_name: &BTreeMap<String, usize>,
    state: &mut [u8],
    errors: &mut Vec<String>,
    owner: &str,
) -> usize {
    match ty {
        Ty::Bits(w) => *w,
        Ty::Layout(n) => match by_name.get(n) {
            Some(&j) => size_of(j, layouts, by_name, state, errors),
            None => {
                errors.push(format!("{owner}: unknown layout {n}"));
                0
            }
        },
        Ty::Array(e, n) => ty_width(e, layouts, by_name, state, errors, owner) * n,
    }
}
