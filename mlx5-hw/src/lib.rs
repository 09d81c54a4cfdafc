//! The mlx5 hardware contract: every layout and number that crosses the line
//! between a ConnectX function and its driver, as the PRM defines them and as
//! Linux's `include/linux/mlx5/mlx5_ifc.h`, `device.h` and `qp.h` publish them.
//!
//! This crate is pure data: no I/O, no allocation on any accessor path, no
//! `unsafe`. The driver (`verbs`) and the device model (`mlx5-emu`) both build
//! on it, so a layout mistake shows up on both sides of every test instead of
//! hiding between two private copies.
//!
//! # Layouts
//!
//! PRM structures are big-endian bit strings. Each one is declared once, in
//! the mlx5_ifc shape (field name and width in bits, in PRM order, reserved
//! gaps named by offset), in `mlx5-hw/ifc/*.ifc`; `mlx5-hw-gen` generates
//! [`ifc`] from those declarations. A layout `create_cq_in` becomes:
//!
//! - a view [`ifc::CreateCqIn<T>`] over any `T: AsRef<[u8]>`, with
//!   `new_checked`/`new_unchecked`, a getter per field named as in the header
//!   (`opcode()`), a setter (`set_opcode()`), sub-views for nested layouts
//!   (`cq_context()` returns a [`ifc::Cqc`]) and indexed accessors for arrays
//!   (`pas(i)`);
//! - a module [`ifc::create_cq_in`] with `SIZE_BITS`, `SIZE_BYTES`, a
//!   [`bits::BitField`] per field and its [`registry`] entry.
//!
//! The byte-aligned hot-path formats (`cqe64`, `eqe`, the WQE segments, the
//! initialization segment, the command entry and mailbox block) are zerocopy
//! structs of big-endian integers, with registry entries as well.
//!
//! ```
//! use mlx5_hw::ifc::{create_cq_in, CreateCqIn};
//! let mut buf = [0u8; create_cq_in::SIZE_BYTES];
//! let mut cmd = CreateCqIn::new_unchecked(&mut buf[..]);
//! cmd.set_opcode(0x400);
//! cmd.cq_context_mut().set_log_cq_size(10).set_uar_page(3);
//! assert_eq!(buf[0..2], [0x04, 0x00]);
//! let cmd = CreateCqIn::new_checked(&buf[..]).unwrap();
//! assert_eq!(cmd.cq_context().log_cq_size(), 10);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod macros;

pub mod bits;
pub mod cqe;
pub mod devx;
pub mod eth;
pub mod event;
pub mod health;
pub mod ifc;
pub mod init;
pub mod mad;
pub mod opcode;
pub mod qp;
pub mod registry;
pub mod status;
pub mod trace;
pub mod uar;
pub mod wqe;

/// A buffer too short for the layout it is viewed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutError {
    /// The layout's name.
    pub layout: &'static str,
    /// Bytes the layout needs.
    pub need: usize,
    /// Bytes the buffer has.
    pub got: usize,
}

impl LayoutError {
    /// `Ok` if `got` bytes hold a `need`-byte layout.
    pub const fn check(layout: &'static str, need: usize, got: usize) -> Result<(), Self> {
        if got < need {
            Err(Self { layout, need, got })
        } else {
            Ok(())
        }
    }
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} needs {} bytes, the buffer has {}",
            self.layout, self.need, self.got
        )
    }
}

impl std::error::Error for LayoutError {}
