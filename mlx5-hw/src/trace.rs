//! A codec for the Linux `mlx5_core` command dump format.
//!
//! With `dyndbg="module mlx5_core +p"` the kernel's `dump_command()`
//! (`drivers/net/ethernet/mellanox/mlx5/core/cmd.c`) logs every command twice:
//! once as posted (`INPUT`) and once after completion (`OUTPUT`). Each dump is
//! a header line, the 64-byte command queue entry (`struct mlx5_cmd_layout`)
//! as four lines of four big-endian dwords, then one `command block:` section
//! per mailbox block (`struct mlx5_cmd_prot_block`, 0x240 bytes: 512 bytes
//! of data, then the block's `next` pointer, number, token and signatures):
//!
//! ```text
//! [  +0.074963] mlx5_core 0000:02:00.0: 0000:02:00.0:dump_command:587:(pid 87): dump command MLX5_CMD_OP_ENABLE_HCA(0x104) INPUT
//! [  +0.000004] 000: 07000000 00000010 00000000 00000000
//! [  +0.000001] 010: 01040000 00000000 00000000 00000000
//! [  +0.000002] 020: 00000000 00000000 00000000 00000000
//! [  +0.000001] 030: 00000000 00000000 00000010 01fd0001
//!
//! [  +0.000002] mlx5_core 0000:02:00.0: 0000:02:00.0:dump_command:608:(pid 87): command block:
//! [  +0.000002] 040: 00000000 00000000 00000000 00000000
//! ...
//! ```
//!
//! [`parse`] reads such text (dmesg prefixes or not, other log lines
//! interleaved, the kernel's names for opcodes it knows and
//! `unknown command opcode(0x10a)` for the others) and pairs each `INPUT` dump
//! with its `OUTPUT` dump into a [`TracedCommand`]. It also reads the newer
//! kernels' shape (Linux 6.x tags every line with `cmd[<slot>]: ` and
//! brackets each dump with `start dump` / `end dump`), pairing dumps of the
//! same slot, so traces of concurrent commands parse too. The data-only
//! shape (`dump command data ...`, debug mask `MLX5_CMD_DATA`) carries no
//! command entry and is rejected.
//!
//! [`write_dump`] and [`write_command`] produce the classic shape above, so
//! a trace of our own driver can be diffed against the kernel's. They differ
//! from the kernel's lines in three documented ways:
//!
//! * no timestamps (`[  +0.000004] `): they only add noise to a diff;
//! * the message prefix is `mlx5-user <dev>: dump_command: ` where the kernel
//!   writes `mlx5_core <bdf>: <bdf>:dump_command:<line>:(pid <pid>): `
//!   (source line and pid mean nothing for a user-space driver). `<dev>` is
//!   whatever the caller passes: the PCI address for a VFIO device,
//!   [`DEFAULT_DEVICE`] for the software device model;
//! * opcodes are named by [`Opcode`] (Linux 6.x's `mlx5_command_str()`
//!   names: `ENABLE_HCA`, `QUERY_ISSI`), where older kernels printed
//!   `MLX5_CMD_OP_ENABLE_HCA` for some and `unknown command opcode` for
//!   others ([`write_dump_named`] takes any name).
//!
//! Since the parser reads both, the simplest faithful diff is to parse the
//! kernel's trace and write it back with [`write_commands`]: both sides then
//! have exactly the same line shapes and names.
//!
//! Everything here is pure text processing: no I/O, no `unsafe`.

use std::fmt::{self, Write as _};

use crate::init;
use crate::opcode::Opcode;

/// Size of a command queue entry (`struct mlx5_cmd_layout`).
pub const ENTRY_SIZE: usize = init::CMD_ENTRY_SIZE;
/// Size of one mailbox block (`struct mlx5_cmd_prot_block`).
pub const BLOCK_SIZE: usize = init::CMD_PROT_BLOCK_SIZE;
/// Data bytes carried by one mailbox block.
pub const BLOCK_DATA_SIZE: usize = init::CMD_DATA_BLOCK_SIZE;
/// Input or output bytes carried inline in the command entry.
pub const INLINE_SIZE: usize = init::CMD_INLINE_IN_SIZE;
/// The device name [`write_dump`] callers use when there is no PCI address
/// (the software device model).
pub const DEFAULT_DEVICE: &str = "0000:00:00.0";

/// Byte offsets inside the command entry (`struct mlx5_cmd_layout`).
mod entry_off {
    use crate::ifc::cmd_layout as l;
    pub const INLEN: usize = l::INLEN.off / 8;
    pub const IN: usize = l::IN.off / 8;
    pub const OUT: usize = l::OUT.off / 8;
    pub const OUTLEN: usize = l::OUTLEN.off / 8;
    pub const TOKEN: usize = l::TOKEN.off / 8;
    pub const STATUS_OWN: usize = l::STATUS_OWN.off / 8;
}

/// Which of the two dumps of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// The entry and input mailbox as posted to the device.
    Input,
    /// The entry and output mailbox after completion.
    Output,
}

impl Direction {
    /// `INPUT` or `OUTPUT`, as the kernel prints it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Direction::Input => "INPUT",
            Direction::Output => "OUTPUT",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One mailbox block, exactly as dumped.
pub type Block = [u8; BLOCK_SIZE];

/// One `dump command` section: a header, the command entry and the mailbox
/// blocks of one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dump {
    /// 1-based line number of the header in the parsed text (0 if built).
    pub line: usize,
    /// The `cmd[<slot>]` tag of newer kernels, if the lines carry one.
    pub slot: Option<u32>,
    /// The opcode's name as printed (`MLX5_CMD_OP_ENABLE_HCA`,
    /// `QUERY_PAGES`, `unknown command opcode`).
    pub name: String,
    /// The opcode as printed in the header (and found in the entry).
    pub opcode: u16,
    /// INPUT or OUTPUT.
    pub direction: Direction,
    /// The 64-byte command queue entry.
    pub entry: [u8; ENTRY_SIZE],
    /// The mailbox blocks, whole (data, next pointer, block number, token,
    /// signatures).
    pub blocks: Vec<Block>,
}

impl Dump {
    /// The message length the entry declares for this direction (`inlen`
    /// or `outlen`), inline bytes included.
    pub fn declared_len(&self) -> usize {
        let off = match self.direction {
            Direction::Input => entry_off::INLEN,
            Direction::Output => entry_off::OUTLEN,
        };
        be32(&self.entry, off) as usize
    }

    /// The message of this direction: the 16 inline bytes of the entry,
    /// then the data of each block, cut to [`Dump::declared_len`] (or to
    /// what the dump holds, if it holds less).
    pub fn message(&self) -> Vec<u8> {
        let inline = match self.direction {
            Direction::Input => entry_off::IN,
            Direction::Output => entry_off::OUT,
        };
        let mut msg = self.entry[inline..inline + INLINE_SIZE].to_vec();
        for b in &self.blocks {
            msg.extend_from_slice(&b[..BLOCK_DATA_SIZE]);
        }
        msg.truncate(self.declared_len());
        msg
    }
}

/// One command as traced: what was posted and what came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedCommand {
    /// 1-based line number of the INPUT header (0 if built).
    pub line: usize,
    /// The opcode's name as printed in the INPUT header.
    pub name: String,
    /// The command's opcode.
    pub opcode: u16,
    /// The command's `op_mod` (input bytes 6..8).
    pub op_mod: u16,
    /// The command entry as posted (the INPUT dump).
    pub entry: [u8; ENTRY_SIZE],
    /// The command entry after completion (the OUTPUT dump): output inline
    /// bytes, status and ownership.
    pub completed_entry: [u8; ENTRY_SIZE],
    /// The input: the 16 inline bytes then the input mailbox data, `inlen`
    /// bytes in all, or fewer if the kernel cut the dump short (the shared
    /// ConnectX-4 trace's 12868-page MANAGE_PAGES dumps 179 of its 202
    /// blocks).
    pub input: Vec<u8>,
    /// The output: the 16 inline bytes then the output mailbox data,
    /// `outlen` bytes in all.
    pub output: Vec<u8>,
    /// The input mailbox blocks, whole.
    pub in_blocks: Vec<Block>,
    /// The output mailbox blocks, whole.
    pub out_blocks: Vec<Block>,
}

impl TracedCommand {
    /// The command's token (entry byte 0x3c).
    pub fn token(&self) -> u8 {
        self.entry[entry_off::TOKEN]
    }

    /// The command's status (output byte 0), 0 for success.
    pub fn status(&self) -> u8 {
        self.output.first().copied().unwrap_or(0)
    }

    /// The command's syndrome (output bytes 4..8).
    pub fn syndrome(&self) -> u32 {
        let mut b = [0u8; 4];
        for (i, v) in b.iter_mut().enumerate() {
            *v = self.output.get(4 + i).copied().unwrap_or(0);
        }
        u32::from_be_bytes(b)
    }

    /// The delivery status of the completed entry (`status_own >> 1`), 0
    /// when the command reached the firmware.
    pub fn delivery_status(&self) -> u8 {
        self.completed_entry[entry_off::STATUS_OWN] >> 1
    }

    /// The INPUT dump this command came from (or would be written as).
    pub fn input_dump(&self) -> Dump {
        Dump {
            line: self.line,
            slot: None,
            name: self.name.clone(),
            opcode: self.opcode,
            direction: Direction::Input,
            entry: self.entry,
            blocks: self.in_blocks.clone(),
        }
    }

    /// The OUTPUT dump this command came from (or would be written as).
    pub fn output_dump(&self) -> Dump {
        Dump {
            line: 0,
            slot: None,
            name: self.name.clone(),
            opcode: self.opcode,
            direction: Direction::Output,
            entry: self.completed_entry,
            blocks: self.out_blocks.clone(),
        }
    }

    /// Pairs an INPUT dump with its OUTPUT dump.
    pub fn from_dumps(input: &Dump, output: &Dump) -> TracedCommand {
        let in_msg = input.message();
        let op_mod = match in_msg.get(6..8) {
            Some(b) => u16::from_be_bytes([b[0], b[1]]),
            None => 0,
        };
        TracedCommand {
            line: input.line,
            name: input.name.clone(),
            opcode: input.opcode,
            op_mod,
            entry: input.entry,
            completed_entry: output.entry,
            input: in_msg,
            output: output.message(),
            in_blocks: input.blocks.clone(),
            out_blocks: output.blocks.clone(),
        }
    }
}

/// Why a trace did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number where the problem shows.
    pub line: usize,
    /// What is wrong.
    pub kind: ParseErrorKind,
}

/// What is wrong with a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// A `dump command` line not of the shape `NAME(0xOP) INPUT|OUTPUT`.
    BadHeader(String),
    /// A data-only dump (`dump command data ...`): it has no command entry.
    DataOnly,
    /// A dump line at an offset other than the next one expected.
    OffsetGap {
        /// The offset the next line should have had.
        expected: usize,
        /// The offset it had.
        found: usize,
    },
    /// A `command block:` line where no block starts.
    MisplacedBlock {
        /// Bytes of the dump read so far.
        offset: usize,
    },
    /// A dump that ends inside its entry or inside a block.
    Truncated {
        /// Bytes of the dump read.
        len: usize,
    },
    /// The header's opcode differs from the one in the entry.
    OpcodeMismatch {
        /// The opcode in the header.
        header: u16,
        /// The opcode in the entry.
        entry: u16,
    },
    /// An OUTPUT dump with no pending INPUT dump of the same opcode.
    UnmatchedOutput {
        /// The dump's opcode.
        opcode: u16,
    },
    /// An INPUT dump never followed by its OUTPUT dump.
    UnmatchedInput {
        /// The dump's opcode.
        opcode: u16,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: ", self.line)?;
        match &self.kind {
            ParseErrorKind::BadHeader(h) => write!(
                f,
                "`dump command` line is not `NAME(0xOPCODE) INPUT|OUTPUT`: {h:?}"
            ),
            ParseErrorKind::DataOnly => f.write_str(
                "data-only dump (MLX5_CMD_DATA debug mask) has no command entry; \
                 capture with the default mask",
            ),
            ParseErrorKind::OffsetGap { expected, found } => write!(
                f,
                "dump line at offset {found:#05x}, expected {expected:#05x} (lost or reordered lines?)"
            ),
            ParseErrorKind::MisplacedBlock { offset } => {
                write!(f, "`command block:` at dump offset {offset:#x}, not at a block boundary")
            }
            ParseErrorKind::Truncated { len } => write!(
                f,
                "dump ends after {len:#x} bytes, inside the entry or a mailbox block"
            ),
            ParseErrorKind::OpcodeMismatch { header, entry } => write!(
                f,
                "header says opcode {header:#x} but the entry holds {entry:#x}"
            ),
            ParseErrorKind::UnmatchedOutput { opcode } => {
                write!(f, "OUTPUT dump of opcode {opcode:#x} without a pending INPUT dump")
            }
            ParseErrorKind::UnmatchedInput { opcode } => {
                write!(f, "INPUT dump of opcode {opcode:#x} never completed (no OUTPUT dump)")
            }
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses a trace into its commands, in the order they were posted (the
/// order of their INPUT dumps).
///
/// Each OUTPUT dump completes the pending INPUT dump of the same slot (see
/// the module docs) with the same opcode and token, or failing a token
/// match the oldest one with the same opcode.
pub fn parse(text: &str) -> Result<Vec<TracedCommand>, ParseError> {
    let dumps = parse_dumps(text)?;
    // Commands in INPUT order; `pending` holds indices into `order`.
    let mut order: Vec<Option<TracedCommand>> = Vec::new();
    let mut pending: Vec<(usize, Dump)> = Vec::new();
    for d in dumps {
        match d.direction {
            Direction::Input => {
                pending.push((order.len(), d));
                order.push(None);
            }
            Direction::Output => {
                let token = d.entry[entry_off::TOKEN];
                let candidates: Vec<usize> = pending
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, p))| p.slot == d.slot && p.opcode == d.opcode)
                    .map(|(i, _)| i)
                    .collect();
                let idx = candidates
                    .iter()
                    .copied()
                    .find(|&i| pending[i].1.entry[entry_off::TOKEN] == token)
                    .or_else(|| candidates.first().copied());
                let Some(i) = idx else {
                    return Err(ParseError {
                        line: d.line,
                        kind: ParseErrorKind::UnmatchedOutput { opcode: d.opcode },
                    });
                };
                let (at, input) = pending.remove(i);
                order[at] = Some(TracedCommand::from_dumps(&input, &d));
            }
        }
    }
    if let Some((_, d)) = pending.first() {
        return Err(ParseError {
            line: d.line,
            kind: ParseErrorKind::UnmatchedInput { opcode: d.opcode },
        });
    }
    Ok(order.into_iter().flatten().collect())
}

/// A dump being read.
struct OpenDump {
    dump: Dump,
    bytes: Vec<u8>,
}

impl OpenDump {
    fn finish(self) -> Result<Dump, ParseError> {
        let OpenDump { mut dump, bytes } = self;
        let len = bytes.len();
        if !at_block_boundary(len) {
            return Err(ParseError {
                line: dump.line,
                kind: ParseErrorKind::Truncated { len },
            });
        }
        dump.entry.copy_from_slice(&bytes[..ENTRY_SIZE]);
        let entry_op = entry_opcode(&dump.entry);
        if entry_op != dump.opcode {
            return Err(ParseError {
                line: dump.line,
                kind: ParseErrorKind::OpcodeMismatch {
                    header: dump.opcode,
                    entry: entry_op,
                },
            });
        }
        dump.blocks = bytes[ENTRY_SIZE..]
            .chunks_exact(BLOCK_SIZE)
            .map(|c| {
                let mut b = [0u8; BLOCK_SIZE];
                b.copy_from_slice(c);
                b
            })
            .collect();
        Ok(dump)
    }
}

/// Parses a trace into its individual dumps, in the order of their header
/// lines, without pairing them: for traces whose commands do not all
/// complete (a timed-out command has no OUTPUT dump).
pub fn parse_dumps(text: &str) -> Result<Vec<Dump>, ParseError> {
    let mut done = Vec::new();
    // Open dumps, by slot (`None`: the untagged classic shape).
    let mut open: Vec<(Option<u32>, OpenDump)> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line_no = n + 1;
        let slot = slot_tag(raw);
        if let Some(rest) = find_after(raw, "dump command ") {
            close(&mut open, slot, &mut done)?;
            let (name, opcode, direction) = parse_header(rest).map_err(|kind| ParseError {
                line: line_no,
                kind,
            })?;
            open.push((
                slot,
                OpenDump {
                    dump: Dump {
                        line: line_no,
                        slot,
                        name,
                        opcode,
                        direction,
                        entry: [0; ENTRY_SIZE],
                        blocks: Vec::new(),
                    },
                    bytes: Vec::new(),
                },
            ));
        } else if raw.trim_end().ends_with("command block:") {
            if let Some((_, d)) = open.iter().find(|(s, _)| *s == slot) {
                let len = d.bytes.len();
                if !at_block_boundary(len) {
                    return Err(ParseError {
                        line: line_no,
                        kind: ParseErrorKind::MisplacedBlock { offset: len },
                    });
                }
            }
        } else if raw.trim_end().ends_with("end dump") && slot.is_some() {
            close(&mut open, slot, &mut done)?;
        } else if let Some((off, words)) = hex_line(raw) {
            let Some((_, d)) = open.iter_mut().find(|(s, _)| *s == slot) else {
                continue; // Someone else's hex: not inside a dump.
            };
            if off != d.bytes.len() {
                return Err(ParseError {
                    line: line_no,
                    kind: ParseErrorKind::OffsetGap {
                        expected: d.bytes.len(),
                        found: off,
                    },
                });
            }
            for w in words {
                d.bytes.extend_from_slice(&w.to_be_bytes());
            }
        }
    }
    while let Some((slot, _)) = open.first() {
        let slot = *slot;
        close(&mut open, slot, &mut done)?;
    }
    done.sort_by_key(|(line, _)| *line);
    Ok(done.into_iter().map(|(_, d)| d).collect())
}

/// Finishes the open dump of `slot`, if any, into `done`.
fn close(
    open: &mut Vec<(Option<u32>, OpenDump)>,
    slot: Option<u32>,
    done: &mut Vec<(usize, Dump)>,
) -> Result<(), ParseError> {
    if let Some(i) = open.iter().position(|(s, _)| *s == slot) {
        let (_, d) = open.remove(i);
        let d = d.finish()?;
        done.push((d.line, d));
    }
    Ok(())
}

/// The text after the first `pat` in `s`.
fn find_after<'a>(s: &'a str, pat: &str) -> Option<&'a str> {
    s.find(pat).map(|i| &s[i + pat.len()..])
}

/// The `<n>` of a `cmd[<n>]: ` tag (Linux 6.x), if the line has one.
fn slot_tag(s: &str) -> Option<u32> {
    let rest = find_after(s, "cmd[")?;
    let end = rest.find("]:")?;
    rest[..end].parse().ok()
}

/// Parses `NAME(0xOP) INPUT|OUTPUT`.
fn parse_header(rest: &str) -> Result<(String, u16, Direction), ParseErrorKind> {
    let rest = rest.trim();
    if rest.starts_with("data ") {
        return Err(ParseErrorKind::DataOnly);
    }
    let bad = || ParseErrorKind::BadHeader(rest.to_string());
    let (head, direction) = if let Some(h) = rest.strip_suffix(" INPUT") {
        (h, Direction::Input)
    } else if let Some(h) = rest.strip_suffix(" OUTPUT") {
        (h, Direction::Output)
    } else {
        return Err(bad());
    };
    let head = head.trim_end().strip_suffix(')').ok_or_else(bad)?;
    let open = head.rfind('(').ok_or_else(bad)?;
    let name = head[..open].trim();
    let hex = head[open + 1..]
        .strip_prefix("0x")
        .or_else(|| head[open + 1..].strip_prefix("0X"))
        .ok_or_else(bad)?;
    let opcode = u16::from_str_radix(hex, 16).map_err(|_| bad())?;
    if name.is_empty() {
        return Err(bad());
    }
    Ok((name.to_string(), opcode, direction))
}

/// Parses a dump line `OFF: XXXXXXXX XXXXXXXX XXXXXXXX XXXXXXXX`, whatever
/// precedes it (timestamp, `cmd[n]: `).
fn hex_line(s: &str) -> Option<(usize, [u32; 4])> {
    let toks: Vec<&str> = s.split_whitespace().collect();
    if toks.len() < 5 {
        return None;
    }
    let t = &toks[toks.len() - 5..];
    let off = t[0].strip_suffix(':')?;
    if off.len() < 3 || !off.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let off = usize::from_str_radix(off, 16).ok()?;
    let mut words = [0u32; 4];
    for (w, tok) in words.iter_mut().zip(&t[1..]) {
        if tok.len() != 8 || !tok.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *w = u32::from_str_radix(tok, 16).ok()?;
    }
    Some((off, words))
}

/// Whether a dump of `len` bytes ends where a block may start: after the
/// entry and whole blocks.
fn at_block_boundary(len: usize) -> bool {
    len >= ENTRY_SIZE && (len - ENTRY_SIZE) % BLOCK_SIZE == 0
}

fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The name our traces give `opcode`: [`Opcode`]'s, which are Linux 6.x's
/// `mlx5_command_str()` names (`ENABLE_HCA`, `QUERY_ISSI`), where the kernel
/// of the shared trace printed `MLX5_CMD_OP_ENABLE_HCA` or
/// `unknown command opcode`.
pub fn opcode_name(opcode: u16) -> &'static str {
    Opcode::from_raw(opcode).name()
}

/// Appends one dump in the kernel's classic shape (see the module docs for
/// the prefix and the missing timestamps): the header
/// `mlx5-user <dev>: dump_command: dump command <NAME>(0x<op>) INPUT`, the
/// entry as four lines `000: 07000000 00000010 ...`, a blank line, then for
/// each block `mlx5-user <dev>: dump_command: command block:`, its 36 lines
/// and a blank line. The opcode is read from the entry and named by
/// [`opcode_name`].
///
/// # Panics
/// If a block is not exactly [`BLOCK_SIZE`] bytes (the kernel always dumps
/// whole `mlx5_cmd_prot_block`s).
pub fn write_dump<B: AsRef<[u8]>>(
    out: &mut String,
    dev: &str,
    direction: Direction,
    entry: &[u8; ENTRY_SIZE],
    blocks: impl IntoIterator<Item = B>,
) {
    let name = opcode_name(entry_opcode(entry));
    write_dump_named(out, dev, name, direction, entry, blocks);
}

/// [`write_dump`] with the opcode's name given (to reproduce a kernel's
/// names verbatim).
///
/// # Panics
/// If a block is not exactly [`BLOCK_SIZE`] bytes.
pub fn write_dump_named<B: AsRef<[u8]>>(
    out: &mut String,
    dev: &str,
    name: &str,
    direction: Direction,
    entry: &[u8; ENTRY_SIZE],
    blocks: impl IntoIterator<Item = B>,
) {
    let opcode = entry_opcode(entry);
    let prefix = format!("mlx5-user {dev}: dump_command: ");
    // Writing to a String cannot fail.
    let _ = writeln!(out, "{prefix}dump command {name}({opcode:#x}) {direction}");
    write_hex(out, entry, 0);
    out.push('\n');
    let mut offset = ENTRY_SIZE;
    for b in blocks {
        let b = b.as_ref();
        assert_eq!(
            b.len(),
            BLOCK_SIZE,
            "a mailbox block is {BLOCK_SIZE:#x} bytes, not {:#x}",
            b.len()
        );
        let _ = writeln!(out, "{prefix}command block:");
        write_hex(out, b, offset);
        out.push('\n');
        offset += BLOCK_SIZE;
    }
}

/// The opcode in a command entry (the first 16 bits of its inline input).
fn entry_opcode(entry: &[u8; ENTRY_SIZE]) -> u16 {
    u16::from_be_bytes([entry[entry_off::IN], entry[entry_off::IN + 1]])
}

fn write_hex(out: &mut String, bytes: &[u8], base: usize) {
    for (i, line) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:03x}:", base + i * 16);
        for w in line.chunks(4) {
            let mut d = [0u8; 4];
            d[..w.len()].copy_from_slice(w);
            let _ = write!(out, " {:08x}", u32::from_be_bytes(d));
        }
        out.push('\n');
    }
}

/// Appends both dumps of a command, INPUT then OUTPUT, named by
/// [`opcode_name`].
pub fn write_command(out: &mut String, dev: &str, cmd: &TracedCommand) {
    let name = opcode_name(cmd.opcode);
    write_dump_named(out, dev, name, Direction::Input, &cmd.entry, &cmd.in_blocks);
    write_dump_named(
        out,
        dev,
        name,
        Direction::Output,
        &cmd.completed_entry,
        &cmd.out_blocks,
    );
}

/// Writes a whole trace: the canonical form of a parsed trace, for diffing
/// a kernel's trace against ours (same prefixes, same names, no
/// timestamps, no other log lines).
pub fn write_commands(dev: &str, cmds: &[TracedCommand]) -> String {
    let mut out = String::new();
    for c in cmds {
        write_command(&mut out, dev, c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENABLE_HCA: &str = "\
[  +0.074963] mlx5_core 0000:02:00.0: 0000:02:00.0:dump_command:587:(pid 87): dump command MLX5_CMD_OP_ENABLE_HCA(0x104) INPUT
[  +0.000004] 000: 07000000 00000010 00000000 00000000
[  +0.000001] 010: 01040000 00000000 00000000 00000000
[  +0.000002] 020: 00000000 00000000 00000000 00000000
[  +0.000001] 030: 00000000 00000000 00000010 01fd0001

[  +0.000003] mlx5_core 0000:02:00.0: 0000:02:00.0:cmd_work_handler:665:(pid 87): writing 0x1 to command doorbell
[  +0.009517] mlx5_core 0000:02:00.0: 0000:02:00.0:dump_command:587:(pid 87): dump command MLX5_CMD_OP_ENABLE_HCA(0x104) OUTPUT
[  +0.000001] 000: 07000000 00000010 00000000 00000000
[  +0.000002] 010: 01040000 00000000 00000000 00000000
[  +0.000001] 020: 00000000 00000000 00000000 00000000
[  +0.000001] 030: 00000000 00000000 00000010 01fd0000

[  +0.000002] mlx5_core 0000:02:00.0: 0000:02:00.0:mlx5_cmd_comp_handler:1286:(pid 87): command completed. ret 0x0, delivery status no errors(0x0)
";

    /// QUERY_ISSI from the ConnectX-4 trace, with an unrelated log line
    /// dropped into the middle of its output mailbox.
    fn query_issi() -> String {
        let mut s = String::from(
            "\
[  +0.000006] mlx5_core 0000:02:00.0: 0000:02:00.0:dump_command:587:(pid 87): dump command unknown command opcode(0x10a) INPUT
[  +0.000002] 000: 07000000 00000010 00000000 00000000
[  +0.000001] 010: 010a0000 00000000 00000000 00000000
[  +0.000001] 020: 00000000 00000000 00000000 00000000
[  +0.000001] 030: 00000007 ab0fe400 00000070 02d70001

[  +0.000002] mlx5_core 0000:02:00.0: 0000:02:00.0:cmd_work_handler:665:(pid 87): writing 0x1 to command doorbell
[  +0.010040] mlx5_core 0000:02:00.0: 0000:02:00.0:dump_command:587:(pid 87): dump command unknown command opcode(0x10a) OUTPUT
[  +0.000006] 000: 07000000 00000010 00000000 00000000
[  +0.000003] 010: 010a0000 00000000 00000000 00000000
[  +0.000002] 020: 00000000 00000000 00000000 00000000
[  +0.000003] 030: 00000007 ab0fe400 00000070 02d70000

[  +0.000005] mlx5_core 0000:02:00.0: 0000:02:00.0:dump_command:608:(pid 87): command block:
",
        );
        for off in (0x40..0x280).step_by(16) {
            let last = match off {
                0x90 => 0x0000_0002,  // supported_issi_dw0: ISSI 1
                0x270 => 0x0002_0000, // token 2
                _ => 0,
            };
            s += &format!("[  +0.000002] {off:03x}: 00000000 00000000 00000000 {last:08x}\n");
            if off == 0x100 {
                s += "[  +0.000002] EDAC MC: Ver: 3.0.0\n";
            }
        }
        s += "\n[  +0.000005] mlx5_core 0000:02:00.0: 0000:02:00.0:mlx5_cmd_comp_handler:1286:(pid 87): command completed. ret 0x0, delivery status no errors(0x0)\n";
        s
    }

    #[test]
    fn parses_enable_hca() {
        let cmds = parse(ENABLE_HCA).unwrap();
        assert_eq!(cmds.len(), 1);
        let c = &cmds[0];
        assert_eq!(c.opcode, 0x104);
        assert_eq!(c.name, "MLX5_CMD_OP_ENABLE_HCA");
        assert_eq!(c.op_mod, 0);
        assert_eq!(c.line, 1);
        assert_eq!(c.token(), 0x01);
        assert_eq!(c.input, [1, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(c.output, [0; 16]);
        assert_eq!(c.status(), 0);
        assert_eq!(c.syndrome(), 0);
        assert_eq!(c.entry[0x3f], 0x01, "posted owned by hardware");
        assert_eq!(c.completed_entry[0x3f], 0x00);
        assert_eq!(c.delivery_status(), 0);
        assert!(c.in_blocks.is_empty() && c.out_blocks.is_empty());
    }

    #[test]
    fn parses_query_issi_mailbox() {
        let cmds = parse(&query_issi()).unwrap();
        assert_eq!(cmds.len(), 1);
        let c = &cmds[0];
        assert_eq!(
            (c.opcode, c.name.as_str()),
            (0x10a, "unknown command opcode")
        );
        assert_eq!(c.input.len(), 0x10);
        assert_eq!(c.output.len(), 0x70);
        assert!(c.in_blocks.is_empty());
        assert_eq!(c.out_blocks.len(), 1);
        assert_eq!(c.out_blocks[0][0x23d], 2, "block token");
        // query_issi_out.supported_issi_dw0 is at bit 0x360 = byte 0x6c:
        // mailbox byte 0x5c, dump offset 0x40 + 0x5c = 0x9c.
        assert_eq!(crate::bits::get_bits(&c.output, 0x360, 32), 2);
        assert_eq!(c.output[0x6f], 2);
    }

    #[test]
    fn round_trip() {
        let cmds = parse(&query_issi()).unwrap();
        let text = write_commands(DEFAULT_DEVICE, &cmds);
        assert!(text.starts_with(
            "mlx5-user 0000:00:00.0: dump_command: dump command QUERY_ISSI(0x10a) INPUT\n\
             000: 07000000 00000010 00000000 00000000\n"
        ));
        assert!(text.contains("\nmlx5-user 0000:00:00.0: dump_command: command block:\n040: "));
        assert!(text.contains("\n090: 00000000 00000000 00000000 00000002\n"));
        let again = parse(&text).unwrap();
        assert_eq!(again.len(), 1);
        let (a, b) = (&cmds[0], &again[0]);
        assert_eq!(
            (a.name.as_str(), b.name.as_str()),
            ("unknown command opcode", "QUERY_ISSI")
        );
        assert_eq!(a.opcode, b.opcode);
        assert_eq!(a.op_mod, b.op_mod);
        assert_eq!(a.entry, b.entry);
        assert_eq!(a.completed_entry, b.completed_entry);
        assert_eq!(a.input, b.input);
        assert_eq!(a.output, b.output);
        assert_eq!(a.in_blocks, b.in_blocks);
        assert_eq!(a.out_blocks, b.out_blocks);
        // Writing is canonical: a second round gives the same text.
        assert_eq!(write_commands(DEFAULT_DEVICE, &again), text);
    }

    #[test]
    fn write_dump_from_entry_and_blocks() {
        let mut entry = [0u8; ENTRY_SIZE];
        entry[0] = 7;
        entry[0x07] = 0x10;
        entry[0x10..0x12].copy_from_slice(&0x104u16.to_be_bytes());
        let mut out = String::new();
        write_dump(
            &mut out,
            "0000:03:00.0",
            Direction::Input,
            &entry,
            std::iter::empty::<&[u8]>(),
        );
        let named = {
            let mut o = String::new();
            let none: [Block; 0] = [];
            write_dump_named(
                &mut o,
                "0000:03:00.0",
                "MLX5_CMD_OP_ENABLE_HCA",
                Direction::Input,
                &entry,
                none,
            );
            o
        };
        assert_eq!(named, out.replace("ENABLE_HCA", "MLX5_CMD_OP_ENABLE_HCA"));
        assert_eq!(
            out,
            "mlx5-user 0000:03:00.0: dump_command: dump command ENABLE_HCA(0x104) INPUT\n\
             000: 07000000 00000010 00000000 00000000\n\
             010: 01040000 00000000 00000000 00000000\n\
             020: 00000000 00000000 00000000 00000000\n\
             030: 00000000 00000000 00000000 00000000\n\
             \n"
        );
    }

    #[test]
    fn parses_linux_6_tagged_interleaved_dumps() {
        // Two commands in flight in slots 0 and 1, their lines interleaved.
        let text = "\
mlx5_core 0000:08:00.0: dump_command:879:(pid 1): cmd[0]: start dump
mlx5_core 0000:08:00.0: dump_command:888:(pid 1): cmd[0]: dump command ENABLE_HCA(0x104) INPUT
cmd[0]: 000: 07000000 00000010 00000000 00000000
mlx5_core 0000:08:00.0: dump_command:888:(pid 2): cmd[1]: dump command QUERY_PAGES(0x107) INPUT
cmd[0]: 010: 01040000 00000000 00000000 00000000
cmd[1]: 000: 07000000 00000010 00000000 00000000
cmd[1]: 010: 01070000 00000001 00000000 00000000
cmd[1]: 020: 00000000 00000000 00000000 00000000
cmd[1]: 030: 00000000 00000000 00000010 02000001
cmd[0]: 020: 00000000 00000000 00000000 00000000
cmd[0]: 030: 00000000 00000000 00000010 01000001
mlx5_core 0000:08:00.0: dump_command:922:(pid 1): cmd[0]: end dump
mlx5_core 0000:08:00.0: dump_command:922:(pid 2): cmd[1]: end dump
mlx5_core 0000:08:00.0: dump_command:888:(pid 2): cmd[1]: dump command QUERY_PAGES(0x107) OUTPUT
cmd[1]: 000: 07000000 00000010 00000000 00000000
cmd[1]: 010: 01070000 00000001 00000000 00000000
cmd[1]: 020: 00000000 00000000 00000000 00000006
cmd[1]: 030: 00000000 00000000 00000010 02000000
mlx5_core 0000:08:00.0: dump_command:888:(pid 1): cmd[0]: dump command ENABLE_HCA(0x104) OUTPUT
cmd[0]: 000: 07000000 00000010 00000000 00000000
cmd[0]: 010: 01040000 00000000 00000000 00000000
cmd[0]: 020: 00000000 00000000 00000000 00000000
cmd[0]: 030: 00000000 00000000 00000010 01000000
";
        let cmds = parse(text).unwrap();
        assert_eq!(cmds.len(), 2);
        assert_eq!(
            (cmds[0].opcode, cmds[0].name.as_str()),
            (0x104, "ENABLE_HCA")
        );
        assert_eq!((cmds[1].opcode, cmds[1].op_mod), (0x107, 1));
        assert_eq!(cmds[1].output[0xc..0x10], [0, 0, 0, 6], "num_pages");
    }

    #[test]
    fn two_pending_inputs_pair_by_token() {
        // Both inputs posted before either output: tokens decide.
        let dump = |dir: &str, token: u8, out_word: u32| {
            format!(
                "x: dump command QUERY_PAGES(0x107) {dir}\n\
                 000: 07000000 00000010 00000000 00000000\n\
                 010: 01070000 0000000{token} 00000000 00000000\n\
                 020: 00000000 00000000 00000000 {out_word:08x}\n\
                 030: 00000000 00000000 00000010 {token:02x}000000\n\n"
            )
        };
        let text = dump("INPUT", 1, 0)
            + &dump("INPUT", 2, 0)
            + &dump("OUTPUT", 2, 22)
            + &dump("OUTPUT", 1, 11);
        let cmds = parse(&text).unwrap();
        assert_eq!(cmds.len(), 2);
        assert_eq!((cmds[0].op_mod, cmds[0].output[0xf]), (1, 11));
        assert_eq!((cmds[1].op_mod, cmds[1].output[0xf]), (2, 22));
    }

    #[test]
    fn errors_are_clear() {
        // OUTPUT without INPUT.
        let out_only: String = ENABLE_HCA
            .lines()
            .skip(7)
            .map(|l| format!("{l}\n"))
            .collect();
        let e = parse(&out_only).unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::UnmatchedOutput { opcode: 0x104 });
        assert!(e.to_string().contains("line 1:"), "{e}");

        // INPUT without OUTPUT.
        let in_only: String = ENABLE_HCA
            .lines()
            .take(6)
            .map(|l| format!("{l}\n"))
            .collect();
        let e = parse(&in_only).unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::UnmatchedInput { opcode: 0x104 });
        assert_eq!(parse_dumps(&in_only).unwrap().len(), 1);

        // A lost dump line.
        let gap = ENABLE_HCA.replace(
            "[  +0.000001] 010: 01040000 00000000 00000000 00000000\n",
            "",
        );
        let e = parse(&gap).unwrap_err();
        assert_eq!(
            (e.line, e.kind),
            (
                3,
                ParseErrorKind::OffsetGap {
                    expected: 0x10,
                    found: 0x20
                }
            )
        );

        // A truncated dump.
        let short = ENABLE_HCA.replace(
            "[  +0.000001] 030: 00000000 00000000 00000010 01fd0001\n",
            "",
        );
        assert_eq!(
            parse(&short).unwrap_err().kind,
            ParseErrorKind::Truncated { len: 0x30 }
        );

        // Header and entry disagree.
        let wrong = ENABLE_HCA.replace("ENABLE_HCA(0x104) INPUT", "ENABLE_HCA(0x105) INPUT");
        assert_eq!(
            parse(&wrong).unwrap_err().kind,
            ParseErrorKind::OpcodeMismatch {
                header: 0x105,
                entry: 0x104
            }
        );

        // Data-only dumps.
        let data = "cmd[0]: dump command data ENABLE_HCA(0x104) INPUT\n";
        assert_eq!(parse(data).unwrap_err().kind, ParseErrorKind::DataOnly);

        // A malformed header.
        let bad = "dump command ENABLE_HCA INPUT\n";
        assert!(matches!(
            parse(bad).unwrap_err().kind,
            ParseErrorKind::BadHeader(_)
        ));
    }

    #[test]
    fn ignores_text_without_dumps() {
        assert!(parse("").unwrap().is_empty());
        assert!(
            parse("Hexdump:\n000: 00000000 00000000 00000000 00000000\n")
                .unwrap()
                .is_empty()
        );
    }
}
