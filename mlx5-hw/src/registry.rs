//! A run-time registry of every layout and field, for tools that decode raw
//! dumps (`mlx5 layouts`, the command tracer, the device model's logs).
//!
//! Offsets and widths are in bits, as in `mlx5_ifc.h`, for every kind of
//! layout (the byte-aligned ones from `device.h`/`qp.h` included).

use crate::bits::get_bits;

/// Where a layout's declaration comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutKind {
    /// A `struct mlx5_ifc_<name>_bits` of `mlx5_ifc.h`.
    Struct,
    /// A `union mlx5_ifc_<name>_bits` of `mlx5_ifc.h`: every member at bit 0.
    Union,
    /// A byte-aligned C struct of `device.h`, `qp.h` or `cq.h`
    /// (`struct mlx5_<name>`), also available as a zerocopy type.
    Bytes,
}

/// What a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// A plain bit field (`u8 name[0xN]`).
    Bits,
    /// A nested layout (`struct mlx5_ifc_<layout>_bits name;`).
    Layout(&'static str),
    /// An array of `count` elements of `elem_bits` bits each; `elem` names
    /// the element layout when elements are layouts. `count` 0 is a
    /// flexible array (`pas[0][0x40]`) that runs past the layout's end.
    Array {
        /// Width of one element, in bits.
        elem_bits: usize,
        /// Number of elements (0: flexible).
        count: usize,
        /// Element layout, if the elements are structures.
        elem: Option<&'static str>,
    },
}

/// One field of a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldInfo {
    /// The field's name, exactly as in the header (`reserved_at_<hex>` included).
    pub name: &'static str,
    /// Offset from the start of the layout, in bits.
    pub bit_off: usize,
    /// Width in bits (for arrays: element width times count).
    pub width: usize,
    /// What the field holds.
    pub ty: FieldType,
}

impl FieldInfo {
    /// Whether this is a `reserved_*` gap.
    pub fn is_reserved(&self) -> bool {
        self.name.starts_with("reserved")
    }
}

/// One layout: its name, size and fields in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutInfo {
    /// The layout's name: `mlx5_ifc_<name>_bits` or `struct mlx5_<name>`.
    pub name: &'static str,
    /// Where it comes from.
    pub kind: LayoutKind,
    /// Size in bits.
    pub size_bits: usize,
    /// A one-line description.
    pub doc: &'static str,
    /// Fields in declaration order.
    pub fields: &'static [FieldInfo],
}

impl LayoutInfo {
    /// Size in bytes.
    pub const fn size_bytes(&self) -> usize {
        self.size_bits / 8
    }

    /// The field called `name`.
    pub fn field(&self, name: &str) -> Option<&'static FieldInfo> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// The layout called `name`, if the registry has it.
pub fn layout(name: &str) -> Option<&'static LayoutInfo> {
    crate::ifc::LAYOUTS.iter().copied().find(|l| l.name == name)
}

/// Every layout the crate defines, sorted by name.
pub fn layouts() -> &'static [&'static LayoutInfo] {
    crate::ifc::LAYOUTS
}

/// A decoded scalar: its dotted path from the root layout, where it sits and
/// its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedField {
    /// `cq_context.log_cq_size`, `pas[3]`, ...
    pub path: String,
    /// Bit offset from the start of the buffer.
    pub bit_off: usize,
    /// Width in bits.
    pub width: usize,
    /// The value (for fields wider than 64 bits: `None`, see `bytes`).
    pub value: Option<u64>,
    /// For fields wider than 64 bits: their bytes, if byte-aligned.
    pub bytes: Option<Vec<u8>>,
}

/// Decodes every named (non-reserved) scalar of `info` in `buf`, recursing
/// into nested layouts and arrays. Flexible arrays are decoded for as many
/// whole elements as `buf` holds. Bits beyond `buf` read as zero.
pub fn decode(info: &LayoutInfo, buf: &[u8]) -> Vec<DecodedField> {
    let mut out = Vec::new();
    decode_into(info, buf, 0, "", &mut out);
    out
}

fn decode_into(
    info: &LayoutInfo,
    buf: &[u8],
    base: usize,
    prefix: &str,
    out: &mut Vec<DecodedField>,
) {
    for f in info.fields {
        if f.is_reserved() {
            continue;
        }
        let path = format!("{prefix}{}", f.name);
        let off = base + f.bit_off;
        match f.ty {
            FieldType::Bits => out.push(scalar(buf, off, f.width, path)),
            FieldType::Layout(name) => {
                if let Some(inner) = layout(name) {
                    decode_into(inner, buf, off, &format!("{path}."), out);
                }
            }
            FieldType::Array {
                elem_bits,
                count,
                elem,
            } => {
                let n = if count == 0 {
                    (buf.len() * 8).saturating_sub(off) / elem_bits.max(1)
                } else {
                    count
                };
                for i in 0..n {
                    let eoff = off + i * elem_bits;
                    let epath = format!("{path}[{i}]");
                    match elem.and_then(layout) {
                        Some(inner) => decode_into(inner, buf, eoff, &format!("{epath}."), out),
                        None => out.push(scalar(buf, eoff, elem_bits, epath)),
                    }
                }
            }
        }
    }
}

fn scalar(buf: &[u8], off: usize, width: usize, path: String) -> DecodedField {
    if width <= 64 {
        DecodedField {
            path,
            bit_off: off,
            width,
            value: Some(get_bits(buf, off, width)),
            bytes: None,
        }
    } else {
        let bytes = (off % 8 == 0 && width % 8 == 0).then(|| {
            (off / 8..(off + width) / 8)
                .map(|i| buf.get(i).copied().unwrap_or(0))
                .collect()
        });
        DecodedField {
            path,
            bit_off: off,
            width,
            value: None,
            bytes,
        }
    }
}
