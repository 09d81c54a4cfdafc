//! Every PRM layout we declare, checked against Linux 6.12's
//! `include/linux/mlx5/mlx5_ifc.h`.
//!
//! The header is parsed here, independently of `mlx5-hw-gen`: structs and
//! unions `mlx5_ifc_*_bits` (and the few oddly named ones such as
//! `mlx5_ifc_mcam_access_reg_bits1`), fields `u8 name[W];`,
//! `u8 name[N][W];`, `u8 name[][W];`, `struct|union mlx5_ifc_X_bits name;`,
//! `... name[N];`, `... name[];`, `DECLARE_FLEX_ARRAY(struct X, name);`,
//! inline `struct|union { ... } name;` and anonymous `union { ... };`
//! (whose members belong to the enclosing layout, as in C), widths in hex or
//! decimal or `#define`d, comments and preprocessor lines skipped.
//!
//! For each layout of kind `Struct` or `Union` in `mlx5_hw::registry`, the
//! test checks that the header has it (by name, or as the inline aggregate
//! one of our fields stands for), with the same kind and size, and that each
//! of its fields is in the header layout at the same bit offset, with the
//! same width and the same shape (bits, nested layout, array of the same
//! count). Union members must all sit at bit 0. All mismatches are reported
//! together.
//!
//! Where the header comes from, in order:
//! 1. `MLX5_IFC_H=/path/to/mlx5_ifc.h`;
//! 2. `<target dir>/linux-6.12/*/include/linux/mlx5/mlx5_ifc.h`;
//! 3. extracted there from `/usr/src/linux-source-6.12.tar.xz`
//!    (`apt-get install linux-source-6.12`).
//!
//! Without any of them the test fails, unless `MLX5_SKIP_LINUX_HEADER=1`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use mlx5_hw::registry::{self, FieldType, LayoutInfo, LayoutKind};

const TARBALL: &str = "/usr/src/linux-source-6.12.tar.xz";
const HEADER_DIR: &str = "include/linux/mlx5";
const HEADER_IN_TREE: &str = "include/linux/mlx5/mlx5_ifc.h";

// ---------------------------------------------------------------------------
// Finding the header.

/// Writes a line to stderr past libtest's output capture (which only takes
/// `print!`/`eprint!`), so the summary and a skip show in every run.
fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Cargo's target directory for this build.
fn target_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        let d = PathBuf::from(d);
        return if d.is_absolute() {
            d
        } else {
            workspace.join(d)
        };
    }
    // The test binary lives in <target>/[<triple>/]<profile>/deps/; Cargo
    // marks <target> with CACHEDIR.TAG.
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.ancestors().find(|d| d.join("CACHEDIR.TAG").is_file()) {
            return d.to_path_buf();
        }
    }
    workspace.join("target")
}

/// `<dir>/*/include/linux/mlx5/mlx5_ifc.h`, if there is one.
fn header_under(dir: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.path().join(HEADER_IN_TREE))
        .find(|p| p.is_file())
}

/// Where the header is, extracting it from the `linux-source-6.12` tarball
/// if needed; `Err` says why there is none.
fn find_header() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MLX5_IFC_H") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("MLX5_IFC_H={} is not a file", p.display()))
        };
    }
    let target = target_dir();
    let dir = target.join("linux-6.12");
    if let Some(p) = header_under(&dir) {
        return Ok(p);
    }
    if !Path::new(TARBALL).is_file() {
        return Err(format!(
            "Linux 6.12's mlx5_ifc.h not found: neither MLX5_IFC_H, nor {}/*/{HEADER_IN_TREE}, \
             nor {TARBALL}. Run `apt-get install linux-source-6.12` (our test script does), \
             point MLX5_IFC_H at a copy of the header, or set MLX5_SKIP_LINUX_HEADER=1 to skip",
            dir.display()
        ));
    }
    // Extract into a private directory, then move it into place, so that
    // concurrent runs never see half a file.
    let tmp = target.join(format!("linux-6.12.tmp.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    say(&format!(
        "prm_linux: extracting mlx5_ifc.h from {TARBALL} into {}",
        dir.display()
    ));
    let status = Command::new("tar")
        .arg("-xJf")
        .arg(TARBALL)
        .arg("-C")
        .arg(&tmp)
        .arg("--wildcards")
        .arg(format!("*/{HEADER_DIR}/mlx5_ifc*.h"))
        .status()
        .map_err(|e| format!("running tar: {e}"))?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(format!(
            "tar -xJf {TARBALL} --wildcards '*/{HEADER_DIR}/mlx5_ifc*.h' failed: {status}"
        ));
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another run got there first.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    header_under(&dir).ok_or_else(|| {
        format!(
            "{TARBALL} extracted into {} but holds no {HEADER_IN_TREE}",
            dir.display()
        )
    })
}

// ---------------------------------------------------------------------------
// Parsing the header.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agg {
    Struct,
    Union,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Num(usize),
    Punct(char),
}

/// A member as declared.
#[derive(Debug, Clone)]
struct RawMember {
    ty: RawTy,
    /// `None`: an anonymous inline aggregate.
    name: Option<String>,
    /// Array dimensions; `None` is `[]`. For `u8` the last one is the width.
    dims: Vec<Option<usize>>,
    /// `file:line`, for messages.
    loc: String,
}

#[derive(Debug, Clone)]
enum RawTy {
    U8,
    Named(String),
    Inline(Box<RawAgg>),
}

#[derive(Debug, Clone)]
struct RawAgg {
    kind: Agg,
    members: Vec<RawMember>,
}

/// What a header field holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HTy {
    Bits,
    /// A named layout (the key, `mlx5_ifc_` and `_bits` removed).
    Named(String),
    /// An inline aggregate, registered under this synthetic key.
    Inline(String),
}

#[derive(Debug, Clone)]
struct HField {
    name: String,
    bit_off: usize,
    width: usize,
    elem: HTy,
    elem_bits: usize,
    /// `None`: not an array; `Some(0)`: flexible.
    count: Option<usize>,
}

#[derive(Debug, Clone)]
struct HLayout {
    kind: Agg,
    size: usize,
    fields: Vec<HField>,
}

struct Header {
    raw: BTreeMap<String, RawAgg>,
    resolved: HashMap<String, HLayout>,
    /// Layouts that could not be resolved (a type from a missing include).
    unresolved: HashMap<String, String>,
    /// The files read, main header first.
    files: Vec<PathBuf>,
}

/// `mlx5_ifc_foo_bits` -> `foo`; other names are kept.
fn key_of(c_name: &str) -> String {
    let s = c_name.strip_prefix("mlx5_ifc_").unwrap_or(c_name);
    s.strip_suffix("_bits").unwrap_or(s).to_string()
}

/// What preprocessing a file leaves: text without comments or
/// preprocessor lines (line numbers kept), its `#define NAME <expr>`s and
/// its `#include "..."`s.
struct Preprocessed {
    text: String,
    defines: HashMap<String, String>,
    includes: Vec<String>,
}

fn preprocess(src: &str) -> Preprocessed {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    // Remove comments first.
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('/', Some('*')) => {
                chars.next();
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                    }
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
                out.push(' ');
            }
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    // Then preprocessor lines, with their continuations.
    let mut defines = HashMap::new();
    let mut includes = Vec::new();
    let mut text = String::with_capacity(out.len());
    let mut lines = out.lines();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with('#') {
            let mut full = line.to_string();
            let mut n = 1;
            while full.ends_with('\\') {
                full.pop();
                match lines.next() {
                    Some(l) => {
                        full.push(' ');
                        full.push_str(l);
                        n += 1;
                    }
                    None => break,
                }
            }
            let body = full.trim_start().trim_start_matches('#').trim_start();
            if let Some(rest) = body.strip_prefix("include") {
                if let Some(name) = rest.trim().strip_prefix('"') {
                    includes.push(name.trim_end_matches('"').to_string());
                }
            } else if let Some(rest) = body.strip_prefix("define") {
                let mut it = rest.trim().splitn(2, char::is_whitespace);
                if let (Some(name), Some(val)) = (it.next(), it.next()) {
                    if !name.contains('(') {
                        defines.insert(name.to_string(), val.trim().to_string());
                    }
                }
            }
            text.push_str(&"\n".repeat(n));
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    Preprocessed {
        text,
        defines,
        includes,
    }
}

fn tokenize(src: &str) -> Result<Vec<(Tok, usize)>, String> {
    let mut toks = Vec::new();
    let mut line = 1;
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            toks.push((Tok::Ident(src[s..i].to_string()), line));
        } else if c.is_ascii_digit() {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric()) {
                i += 1;
            }
            let t = &src[s..i];
            let t = t.trim_end_matches(['u', 'U', 'l', 'L']);
            let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                usize::from_str_radix(h, 16)
            } else {
                t.parse()
            };
            let v = v.map_err(|_| format!("line {line}: bad number {:?}", &src[s..i]))?;
            toks.push((Tok::Num(v), line));
        } else if c == '"' || c == '\'' {
            // Strings and characters: skip them whole.
            i += 1;
            while i < b.len() && b[i] as char != c {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else {
            toks.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    Ok(toks)
}

/// Evaluates a constant expression of numbers, `#define`d names, `+ - * /`
/// and parentheses.
fn eval(toks: &[Tok], defines: &HashMap<String, String>, depth: usize) -> Result<usize, String> {
    fn expr(
        t: &[Tok],
        p: &mut usize,
        d: &HashMap<String, String>,
        depth: usize,
    ) -> Result<i64, String> {
        let mut v = term(t, p, d, depth)?;
        while let Some(Tok::Punct(c @ ('+' | '-'))) = t.get(*p) {
            *p += 1;
            let r = term(t, p, d, depth)?;
            v = if *c == '+' { v + r } else { v - r };
        }
        Ok(v)
    }
    fn term(
        t: &[Tok],
        p: &mut usize,
        d: &HashMap<String, String>,
        depth: usize,
    ) -> Result<i64, String> {
        let mut v = atom(t, p, d, depth)?;
        while let Some(Tok::Punct(c @ ('*' | '/'))) = t.get(*p) {
            *p += 1;
            let r = atom(t, p, d, depth)?;
            v = if *c == '*' { v * r } else { v / r };
        }
        Ok(v)
    }
    fn atom(
        t: &[Tok],
        p: &mut usize,
        d: &HashMap<String, String>,
        depth: usize,
    ) -> Result<i64, String> {
        let tok = t.get(*p).ok_or("expression ends early")?;
        *p += 1;
        match tok {
            Tok::Num(n) => Ok(*n as i64),
            Tok::Punct('(') => {
                let v = expr(t, p, d, depth)?;
                match t.get(*p) {
                    Some(Tok::Punct(')')) => {
                        *p += 1;
                        Ok(v)
                    }
                    other => Err(format!("expected `)`, found {other:?}")),
                }
            }
            Tok::Ident(name) => {
                let body = d.get(name).ok_or(format!("unknown name {name}"))?;
                let toks: Vec<Tok> = tokenize(body)?.into_iter().map(|(t, _)| t).collect();
                if depth > 16 {
                    return Err(format!("{name}: macros nest too deep"));
                }
                Ok(eval(&toks, d, depth + 1)? as i64)
            }
            other => Err(format!("unexpected {other:?} in expression")),
        }
    }
    let mut p = 0;
    let v = expr(toks, &mut p, defines, depth)?;
    if p != toks.len() {
        return Err(format!("trailing tokens in {toks:?}"));
    }
    usize::try_from(v).map_err(|_| format!("negative value {v}"))
}

struct P<'a> {
    file: &'a str,
    toks: &'a [(Tok, usize)],
    pos: usize,
    defines: &'a HashMap<String, String>,
}

impl P<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }
    fn peek_at(&self, n: usize) -> Option<&Tok> {
        self.toks.get(self.pos + n).map(|(t, _)| t)
    }
    fn line(&self) -> usize {
        self.toks
            .get(self.pos.min(self.toks.len().saturating_sub(1)))
            .map_or(0, |t| t.1)
    }
    fn err<T>(&self, msg: impl std::fmt::Display) -> Result<T, String> {
        Err(format!("{}:{}: {msg}", self.file, self.line()))
    }
    fn next(&mut self) -> Option<Tok> {
        let t = self.peek().cloned();
        self.pos += 1;
        t
    }
    fn punct(&mut self, c: char) -> Result<(), String> {
        match self.next() {
            Some(Tok::Punct(p)) if p == c => Ok(()),
            other => {
                self.pos -= 1;
                self.err(format!("expected `{c}`, found {other:?}"))
            }
        }
    }
    fn ident(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Tok::Ident(s)) => Ok(s),
            other => {
                self.pos -= 1;
                self.err(format!("expected a name, found {other:?}"))
            }
        }
    }
    fn agg_kw(t: Option<&Tok>) -> Option<Agg> {
        match t {
            Some(Tok::Ident(s)) if s == "struct" => Some(Agg::Struct),
            Some(Tok::Ident(s)) if s == "union" => Some(Agg::Union),
            _ => None,
        }
    }

    /// `[N]...` array dimensions.
    fn dims(&mut self) -> Result<Vec<Option<usize>>, String> {
        let mut dims = Vec::new();
        while self.peek() == Some(&Tok::Punct('[')) {
            self.pos += 1;
            let start = self.pos;
            while !matches!(self.peek(), Some(Tok::Punct(']')) | None) {
                self.pos += 1;
            }
            let inner: Vec<Tok> = self.toks[start..self.pos]
                .iter()
                .map(|(t, _)| t.clone())
                .collect();
            self.punct(']')?;
            if inner.is_empty() {
                dims.push(None);
            } else {
                match eval(&inner, self.defines, 0) {
                    Ok(v) => dims.push(Some(v)),
                    Err(e) => return self.err(format!("array size: {e}")),
                }
            }
        }
        Ok(dims)
    }

    /// The members of a `{ ... }` body, after the `{`, up to and with `}`.
    fn body(&mut self, kind: Agg) -> Result<RawAgg, String> {
        let mut members = Vec::new();
        loop {
            let loc = format!("{}:{}", self.file, self.line());
            match self.peek().cloned() {
                Some(Tok::Punct('}')) => {
                    self.pos += 1;
                    return Ok(RawAgg { kind, members });
                }
                None => return self.err("unterminated layout"),
                Some(Tok::Ident(s)) if s == "u8" => {
                    self.pos += 1;
                    let name = self.ident()?;
                    let dims = self.dims()?;
                    self.punct(';')?;
                    if dims.is_empty() || dims.len() > 2 || (dims.len() == 2 && dims[1].is_none()) {
                        return self.err(format!("u8 {name}: expected [W] or [N][W]"));
                    }
                    members.push(RawMember {
                        ty: RawTy::U8,
                        name: Some(name),
                        dims,
                        loc: loc.clone(),
                    });
                }
                Some(Tok::Ident(s)) if s == "DECLARE_FLEX_ARRAY" => {
                    self.pos += 1;
                    self.punct('(')?;
                    if Self::agg_kw(self.peek()).is_none() {
                        return self.err("DECLARE_FLEX_ARRAY of a non-layout");
                    }
                    self.pos += 1;
                    let ty = self.ident()?;
                    self.punct(',')?;
                    let name = self.ident()?;
                    self.punct(')')?;
                    self.punct(';')?;
                    members.push(RawMember {
                        ty: RawTy::Named(key_of(&ty)),
                        name: Some(name),
                        dims: vec![None],
                        loc: loc.clone(),
                    });
                }
                t => {
                    let Some(agg) = Self::agg_kw(t.as_ref()) else {
                        return self.err(format!("unexpected {t:?} in a layout"));
                    };
                    self.pos += 1;
                    let ty = if self.peek() == Some(&Tok::Punct('{')) {
                        self.pos += 1;
                        RawTy::Inline(Box::new(self.body(agg)?))
                    } else {
                        RawTy::Named(key_of(&self.ident()?))
                    };
                    let name = match self.peek() {
                        Some(Tok::Ident(_)) => Some(self.ident()?),
                        _ => None,
                    };
                    let dims = self.dims()?;
                    self.punct(';')?;
                    if name.is_none() && !matches!(ty, RawTy::Inline(_)) {
                        return self.err("unnamed member of a named type");
                    }
                    if dims.len() > 1 {
                        return self.err("layout arrays of more than one dimension");
                    }
                    members.push(RawMember {
                        ty,
                        name,
                        dims,
                        loc: loc.clone(),
                    });
                }
            }
        }
    }
}

impl Header {
    /// Reads `path` and the headers it `#include "..."`s from its directory
    /// (`mlx5_ifc_fpga.h`, when there), then resolves every layout.
    fn load(path: &Path) -> Result<Header, String> {
        let mut h = Header {
            raw: BTreeMap::new(),
            resolved: HashMap::new(),
            unresolved: HashMap::new(),
            files: Vec::new(),
        };
        let mut defines = HashMap::new();
        h.read(path, &mut defines)?;
        let keys: Vec<String> = h.raw.keys().cloned().collect();
        for k in keys {
            if let Err(e) = h.resolve(&k, 0) {
                h.unresolved.insert(k, e);
            }
        }
        Ok(h)
    }

    fn read(&mut self, path: &Path, defines: &mut HashMap<String, String>) -> Result<(), String> {
        if self.files.iter().any(|f| f == path) {
            return Ok(());
        }
        self.files.push(path.to_path_buf());
        let src = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let pre = preprocess(&src);
        for inc in &pre.includes {
            let p = path.with_file_name(inc);
            if p.is_file() {
                self.read(&p, defines)?;
            }
        }
        defines.extend(pre.defines);
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        let toks = tokenize(&pre.text).map_err(|e| format!("{file}: {e}"))?;
        let mut p = P {
            file: &file,
            toks: &toks,
            pos: 0,
            defines,
        };
        let mut depth = 0usize;
        while let Some(t) = p.peek().cloned() {
            match t {
                Tok::Punct('{') => {
                    depth += 1;
                    p.pos += 1;
                }
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    p.pos += 1;
                }
                _ if depth == 0
                    && P::agg_kw(Some(&t)).is_some()
                    && matches!(p.peek_at(1), Some(Tok::Ident(_)))
                    && p.peek_at(2) == Some(&Tok::Punct('{')) =>
                {
                    let kind = P::agg_kw(Some(&t)).expect("checked");
                    let line = p.line();
                    p.pos += 1;
                    let name = p.ident()?;
                    p.pos += 1; // `{`
                    let body = p.body(kind)?;
                    if name.starts_with("mlx5_ifc_") {
                        let key = key_of(&name);
                        if self.raw.insert(key, body).is_some() {
                            return Err(format!("{file}:{line}: {name} defined twice"));
                        }
                    }
                }
                _ => p.pos += 1,
            }
        }
        Ok(())
    }

    /// Resolves the named layout `key` (sizes, offsets), memoized.
    fn resolve(&mut self, key: &str, depth: usize) -> Result<usize, String> {
        if let Some(l) = self.resolved.get(key) {
            return Ok(l.size);
        }
        if depth > 64 {
            return Err(format!("{key}: layouts nest too deep (a cycle?)"));
        }
        let agg = self.raw.get(key).cloned().ok_or_else(|| {
            format!("mlx5_ifc_{key}_bits is used but defined in none of the headers read")
        })?;
        let l = self.resolve_agg(key, &agg, depth)?;
        let size = l.size;
        self.resolved.insert(key.to_string(), l);
        Ok(size)
    }

    fn resolve_agg(&mut self, owner: &str, agg: &RawAgg, depth: usize) -> Result<HLayout, String> {
        let mut fields = Vec::new();
        let mut cursor = 0usize;
        let mut size = 0usize;
        for m in &agg.members {
            let here = |msg: String| format!("{}: {owner}: {msg}", m.loc);
            let off = match agg.kind {
                Agg::Struct => cursor,
                Agg::Union => 0,
            };
            let (elem, elem_bits, count) = match &m.ty {
                RawTy::U8 => match m.dims.as_slice() {
                    [Some(w)] => (HTy::Bits, *w, None),
                    // `u8 data[];`: a flexible run of bytes.
                    [None] => (HTy::Bits, 8, Some(0)),
                    [n, Some(w)] => (HTy::Bits, *w, Some(n.unwrap_or(0))),
                    _ => return Err(here("bad u8 dimensions".into())),
                },
                RawTy::Named(k) => {
                    let w = self.resolve(k, depth + 1).map_err(here)?;
                    let count = m.dims.first().map(|n| n.unwrap_or(0));
                    (HTy::Named(k.clone()), w, count)
                }
                RawTy::Inline(inner) => {
                    let name = m.name.as_deref().unwrap_or("");
                    let key = format!("{owner}.{name}");
                    let l = self.resolve_agg(&key, inner, depth + 1)?;
                    let w = l.size;
                    if m.name.is_none() {
                        // Anonymous: its members are the owner's.
                        for f in &l.fields {
                            let mut f = f.clone();
                            f.bit_off += off;
                            fields.push(f);
                        }
                    }
                    self.resolved.insert(key.clone(), l);
                    let count = m.dims.first().map(|n| n.unwrap_or(0));
                    (HTy::Inline(key), w, count)
                }
            };
            let width = elem_bits * count.unwrap_or(1);
            if let Some(name) = &m.name {
                fields.push(HField {
                    name: name.clone(),
                    bit_off: off,
                    width,
                    elem,
                    elem_bits,
                    count,
                });
            }
            match agg.kind {
                Agg::Struct => {
                    cursor += width;
                    size = cursor;
                }
                Agg::Union => size = size.max(width),
            }
        }
        Ok(HLayout {
            kind: agg.kind,
            size,
            fields,
        })
    }
}

// ---------------------------------------------------------------------------
// Checking the registry.

fn kind_str(k: Agg) -> &'static str {
    match k {
        Agg::Struct => "struct",
        Agg::Union => "union",
    }
}

/// How `ty` differs from the header field `h`, if it does. Inline header
/// aggregates our field names a layout for are recorded in `aliases`.
fn shape_mismatch(
    ty: &FieldType,
    h: &HField,
    aliases: &mut BTreeMap<String, String>,
) -> Option<String> {
    let elem_ok = |ours: Option<&str>, aliases: &mut BTreeMap<String, String>| match (ours, &h.elem)
    {
        (None, HTy::Bits) => true,
        (Some(n), HTy::Named(k)) => n == k,
        (Some(n), HTy::Inline(k)) => {
            aliases.insert(n.to_string(), k.clone());
            true
        }
        _ => false,
    };
    let header_shape = || {
        let elem = match &h.elem {
            HTy::Bits => "bits".to_string(),
            HTy::Named(k) => format!("layout {k}"),
            HTy::Inline(k) => format!("inline {k}"),
        };
        match h.count {
            None => elem,
            Some(n) => format!("array [{elem} of {:#x} bits; {n}]", h.elem_bits),
        }
    };
    let ok = match ty {
        FieldType::Bits => h.count.is_none() && elem_ok(None, aliases),
        FieldType::Layout(n) => h.count.is_none() && elem_ok(Some(n), aliases),
        FieldType::Array {
            elem_bits,
            count,
            elem,
        } => h.count == Some(*count) && h.elem_bits == *elem_bits && elem_ok(*elem, aliases),
    };
    (!ok).then(|| format!("is {ty:?} but the header has {}", header_shape()))
}

/// Fields the PRM and rdma-core's `mlx5_ifc.h` name (DevX: queues and
/// doorbell records in UMEMs) where Linux's header, which never builds
/// those commands itself, keeps a reserved gap. Each must lie inside one
/// of the header's gaps, and so must the reserved fields around it.
const RDMA_CORE_FIELDS: &[(&str, &str)] = &[
    ("cqc", "dbr_umem_id"),
    ("create_cq_in", "cq_umem_offset"),
    ("create_cq_in", "cq_umem_id"),
    ("qpc", "dbr_umem_id"),
    ("create_mkey_in", "mkey_umem_id"),
    ("create_mkey_in", "mkey_umem_offset"),
    // mlx5dv_dci_stream_id_reset: RTS2RTS with the QPC extension.
    ("rts2rts_qp_in", "qpc_ext"),
    ("rts2rts_qp_in", "opt_param_mask_95_32"),
    ("cmd_hca_cap", "qp_data_in_order"),
    ("cmd_hca_cap", "dp_ordering_ooo_all_ud"),
    ("cmd_hca_cap", "dp_ordering_ooo_all_uc"),
    ("cmd_hca_cap", "dp_ordering_ooo_all_xrc"),
    ("cmd_hca_cap", "dp_ordering_ooo_all_dc"),
    ("cmd_hca_cap", "dp_ordering_ooo_all_rc"),
    ("qpc", "data_in_order"),
    // Named by neither header: the bytes rdma-core's test_mlx5_dm_ops.py
    // reads for the MEMIC atomics' access sizes.
    ("device_mem_cap", "memic_atomic_increment_size_sup"),
    ("device_mem_cap", "memic_atomic_test_and_set_size_sup"),
];

/// Layouts only rdma-core's `mlx5_ifc.h` declares (Linux 6.12 never builds
/// the commands that carry them): not looked for in Linux's header.
const RDMA_CORE_LAYOUTS: &[&str] = &["qpc_ext"];

/// Layouts rdma-core's `mlx5_ifc.h` extends past the end of Linux's: the
/// fields from Linux's end on are rdma-core's (checked in rdma-core's shape
/// by `mlx5-hw-gen`), the size may exceed Linux's.
const RDMA_CORE_TAILS: &[&str] = &["rts2rts_qp_in"];

/// Whether bits `[off, off + width)` lie inside one reserved gap of `h`.
fn inside_gap(h: &HLayout, off: usize, width: usize) -> bool {
    h.fields.iter().any(|hf| {
        hf.name.starts_with("reserved") && hf.bit_off <= off && off + width <= hf.bit_off + hf.width
    })
}

/// Checks `ours` against the header layout `h`, appending mismatches.
fn check_layout(
    ours: &LayoutInfo,
    hname: &str,
    h: &HLayout,
    aliases: &mut BTreeMap<String, String>,
    problems: &mut Vec<String>,
) -> usize {
    let n = ours.name;
    let our_kind = match ours.kind {
        LayoutKind::Struct => Agg::Struct,
        LayoutKind::Union => Agg::Union,
        LayoutKind::Bytes => unreachable!("bytes layouts are not checked"),
    };
    if our_kind != h.kind {
        problems.push(format!(
            "{n}: declared a {} but {hname} is a {} in the header",
            kind_str(our_kind),
            kind_str(h.kind)
        ));
    }
    let tail = RDMA_CORE_TAILS.contains(&n);
    if ours.size_bits != h.size && !(tail && ours.size_bits > h.size) {
        problems.push(format!(
            "{n}: size {:#x} bits, header {hname} has {:#x}",
            ours.size_bits, h.size
        ));
    }
    let rdma_core = RDMA_CORE_FIELDS.iter().any(|(l, _)| *l == n);
    for f in ours.fields {
        let named_by_rdma_core = RDMA_CORE_FIELDS.contains(&(n, f.name));
        if (named_by_rdma_core || (rdma_core && f.is_reserved()))
            && inside_gap(h, f.bit_off, f.width)
        {
            continue;
        }
        if tail && f.bit_off >= h.size {
            continue;
        }
        if our_kind == Agg::Union && f.bit_off != 0 {
            problems.push(format!(
                "{n}.{}: union member at bit {:#x}, not 0",
                f.name, f.bit_off
            ));
        }
        let same_name: Vec<&HField> = h.fields.iter().filter(|hf| hf.name == f.name).collect();
        let exact = same_name
            .iter()
            .copied()
            .find(|hf| hf.bit_off == f.bit_off && hf.width == f.width);
        let hf = match exact.or_else(|| same_name.first().copied()) {
            Some(hf) => hf,
            None if f.is_reserved() => {
                // The header sometimes misnames a gap: any gap there will do.
                match h.fields.iter().find(|hf| {
                    hf.name.starts_with("reserved")
                        && hf.bit_off == f.bit_off
                        && hf.width == f.width
                }) {
                    Some(hf) => hf,
                    None => {
                        problems.push(format!(
                            "{n}.{} (bit {:#x}, width {:#x}): no such gap in {hname}{}",
                            f.name,
                            f.bit_off,
                            f.width,
                            describe_at(h, f.bit_off)
                        ));
                        continue;
                    }
                }
            }
            None => {
                problems.push(format!(
                    "{n}.{} (bit {:#x}, width {:#x}): not a field of {hname}{}",
                    f.name,
                    f.bit_off,
                    f.width,
                    describe_at(h, f.bit_off)
                ));
                continue;
            }
        };
        if hf.bit_off != f.bit_off || hf.width != f.width {
            problems.push(format!(
                "{n}.{}: bit {:#x} width {:#x}, header has bit {:#x} width {:#x}",
                f.name, f.bit_off, f.width, hf.bit_off, hf.width
            ));
        }
        if let Some(m) = shape_mismatch(&f.ty, hf, aliases) {
            problems.push(format!("{n}.{}: {m}", f.name));
        }
    }
    ours.fields.len()
}

/// What the header has at `bit` (for mismatch messages).
fn describe_at(h: &HLayout, bit: usize) -> String {
    let names: Vec<String> = h
        .fields
        .iter()
        .filter(|f| f.bit_off <= bit && bit < f.bit_off + f.width.max(1))
        .map(|f| format!("{} (bit {:#x}, width {:#x})", f.name, f.bit_off, f.width))
        .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!("; the header has {} there", names.join(", "))
    }
}

#[test]
fn registry_matches_linux_mlx5_ifc_h() {
    let path = match find_header() {
        Ok(p) => p,
        Err(why) => {
            if std::env::var("MLX5_SKIP_LINUX_HEADER").as_deref() == Ok("1") {
                let bang = "!".repeat(78);
                say(&format!(
                    "\n{bang}\n!!! SKIPPED prm_linux: MLX5_SKIP_LINUX_HEADER=1 and {why}\n\
                     !!! The PRM layouts were NOT checked against Linux's mlx5_ifc.h.\n{bang}"
                ));
                return;
            }
            panic!("{why}");
        }
    };
    let header = Header::load(&path).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "parsed {} layouts ({} not laid out: types from headers not read) from {}",
        header.resolved.len(),
        header.unresolved.len(),
        header
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    // The parser itself, on layouts whose sizes every driver relies on
    // (query_hca_cap_out and query_issi_out: the outlens of the kernel trace).
    for (k, bits) in [
        ("hca_cap_union", 0x8000),
        ("query_hca_cap_out", 0x1010 * 8),
        ("cqc", 0x200),
        ("query_issi_out", 0x70 * 8),
    ] {
        let got = header.resolved.get(k).map(|l| l.size);
        assert_eq!(got, Some(bits), "header parser: size of {k}");
    }
    let pas = header.resolved["create_qp_in"]
        .fields
        .iter()
        .find(|f| f.name == "pas")
        .expect("create_qp_in.pas");
    assert_eq!((pas.count, pas.elem_bits, pas.width), (Some(0), 0x40, 0));

    // Inline aggregates our fields stand for, found while checking their
    // owners: check everything once to collect them, then for real.
    let ours: Vec<&LayoutInfo> = registry::layouts()
        .iter()
        .copied()
        .filter(|l| matches!(l.kind, LayoutKind::Struct | LayoutKind::Union))
        .filter(|l| !RDMA_CORE_LAYOUTS.contains(&l.name))
        .collect();
    assert!(
        !ours.is_empty(),
        "the registry has no struct or union layouts"
    );
    let mut aliases: BTreeMap<String, String> = BTreeMap::new();
    for pass in 0..2 {
        let mut problems = Vec::new();
        let (mut layouts, mut fields) = (0, 0);
        for l in &ours {
            if let Some(why) = header.unresolved.get(l.name) {
                problems.push(format!(
                    "{}: the header's layout cannot be laid out: {why}",
                    l.name
                ));
                continue;
            }
            let hkey = if header.resolved.contains_key(l.name) {
                l.name.to_string()
            } else if let Some(k) = aliases.get(l.name) {
                k.clone()
            } else {
                problems.push(format!(
                    "{}: no mlx5_ifc_{}_bits in the header",
                    l.name, l.name
                ));
                continue;
            };
            let h = &header.resolved[&hkey];
            fields += check_layout(l, &hkey, h, &mut aliases, &mut problems);
            layouts += 1;
        }
        if pass == 1 {
            say(&format!(
                "checked {layouts} layouts, {fields} fields against mlx5_ifc.h ({})",
                path.display()
            ));
            assert!(
                problems.is_empty(),
                "{} mismatches between mlx5-hw's layouts and {}:\n  {}",
                problems.len(),
                path.display(),
                problems.join("\n  ")
            );
        }
    }
}
