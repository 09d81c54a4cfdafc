//! Links `libibverbs.so` as rdma-core's: SONAME `libibverbs.so.1` and the
//! symbol versions of `libibverbs.map` (IBVERBS_1.0, IBVERBS_1.1, ...).
//!
//! rustc hands the linker its own anonymous version script (what to
//! export); ld.bfd refuses a second, named one beside it, lld takes both
//! but versions nothing from the second. So the map is given to the linker
//! only to declare the version nodes, and each exported symbol gets its
//! version from a `.symver name, name@@NODE` directive generated here from
//! the same map (`OUT_DIR/symver.s`, pulled in by `global_asm!`). One
//! table, `libibverbs.map`, says which symbol has which version.

use std::fmt::Write as _;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let map_path = format!("{dir}/libibverbs.map");
    println!("cargo:rerun-if-changed={map_path}");
    let map = std::fs::read_to_string(&map_path).expect("reading libibverbs.map");
    let mut asm = String::new();
    let mut node: Option<String> = None;
    let mut text = String::new();
    let mut rest = map.as_str();
    // Comments out, then line by line.
    while let Some(i) = rest.find("/*") {
        text.push_str(&rest[..i]);
        rest = rest[i..].split_once("*/").map_or("", |(_, r)| r);
    }
    text.push_str(rest);
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_suffix('{').map(str::trim) {
            node = Some(name.to_string());
            continue;
        }
        if line.starts_with('}') {
            node = None;
            continue;
        }
        if line.ends_with(':') {
            continue; // global: / local:
        }
        let sym = line.trim_end_matches(';').trim();
        if sym == "*" {
            continue;
        }
        let n = node.as_deref().expect("a symbol outside a version node");
        writeln!(asm, ".symver {sym}, {sym}@@{n}").expect("writing to a String");
    }
    std::fs::write(format!("{out}/symver.s"), asm).expect("writing symver.s");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={map_path}");
}
