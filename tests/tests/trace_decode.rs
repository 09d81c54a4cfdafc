//! The real ConnectX-4 bring-up trace (`tests/data/traces/`, firmware
//! 14.12.1220), parsed with `mlx5_hw::trace` and decoded two independent
//! ways: with the run-time registry (`registry::decode`) and with the
//! generated views (`mlx5_hw::ifc::*`). Every expected number below was read
//! by hand from the hex dump, with the bit offsets of Linux 6.12's
//! `mlx5_ifc.h`; the comment next to each says where.
//!
//! Reading the dump: in a dump, offsets 0x000-0x03f are the command entry
//! (output inline bytes at entry 0x20-0x2f), and mailbox block `k` is at
//! 0x040 + k * 0x240, its 512 data bytes first. Output byte `b >= 0x10` is
//! mailbox byte `b - 0x10`. For QUERY_HCA_CAP the capability starts at
//! output byte 0x10, i.e. mailbox byte 0: `cmd_hca_cap` byte `c` (< 0x200) is
//! at dump offset 0x40 + c. Bit offsets are big-endian (bit 0 = MSB of byte
//! 0), so a field at bit `o` of width `w` is bits `o % 32 .. o % 32 + w` of
//! the dword at byte `(o / 32) * 4`, counting from that dword's MSB. In the
//! comments, `"054: 00170000"` is the word at dump offset 0x054 (the second
//! word of the dump's `050:` line).
//!
//! The trace is found at `$MLX5_TRACE`, else in the repo's
//! `tests/data/traces/` (its README says where it came from).

use std::collections::BTreeMap;

use mlx5_hw::ifc::{
    ManagePagesIn, QueryAdapterOut, QueryHcaCapOut, QueryIssiOut, QueryPagesOut, SetHcaCapIn,
};
use mlx5_hw::registry;
use mlx5_hw::trace::{self, TracedCommand};

const QUERY_HCA_CAP: u16 = 0x100;
const QUERY_ADAPTER: u16 = 0x101;
const ENABLE_HCA: u16 = 0x104;
const QUERY_PAGES: u16 = 0x107;
const MANAGE_PAGES: u16 = 0x108;
const SET_HCA_CAP: u16 = 0x109;
const QUERY_ISSI: u16 = 0x10a;

fn commands() -> Vec<TracedCommand> {
    tests::connectx4_trace()
}

/// The commands with this opcode and op_mod, in trace order.
fn find(cmds: &[TracedCommand], opcode: u16, op_mod: u16) -> Vec<&TracedCommand> {
    cmds.iter()
        .filter(|c| c.opcode == opcode && c.op_mod == op_mod)
        .collect()
}

/// `registry::decode` of `buf` as `layout`, by dotted path.
fn decoded(layout: &str, buf: &[u8]) -> BTreeMap<String, u64> {
    let info = registry::layout(layout).unwrap_or_else(|| panic!("no layout {layout}"));
    registry::decode(info, buf)
        .into_iter()
        .filter_map(|f| f.value.map(|v| (f.path, v)))
        .collect()
}

fn field(map: &BTreeMap<String, u64>, path: &str) -> u64 {
    *map.get(path)
        .unwrap_or_else(|| panic!("registry::decode gave no {path}"))
}

#[test]
fn the_trace_has_42_commands_all_successful() {
    let cmds = commands();
    assert_eq!(cmds.len(), 42);
    assert_eq!(cmds[0].opcode, ENABLE_HCA);
    assert_eq!(cmds[0].name, "MLX5_CMD_OP_ENABLE_HCA");
    assert_eq!(cmds[0].op_mod, 0);

    let mut per_opcode: BTreeMap<u16, usize> = BTreeMap::new();
    for (i, c) in cmds.iter().enumerate() {
        *per_opcode.entry(c.opcode).or_default() += 1;
        assert_eq!(c.status(), 0, "command {i} ({:#x}) status", c.opcode);
        assert_eq!(c.delivery_status(), 0, "command {i} delivery status");
        // Linux numbers its commands 1, 2, ... in the entry's token.
        assert_eq!(usize::from(c.token()), i + 1, "command {i} token");
        assert_eq!(c.entry[0x3f] & 1, 1, "posted owned by hardware");
        assert_eq!(
            c.completed_entry[0x3f] & 1,
            0,
            "completed owned by software"
        );
    }
    let expected: BTreeMap<u16, usize> = [
        (QUERY_HCA_CAP, 12), // 24 dumps: every page, max and current
        (QUERY_ADAPTER, 1),
        (0x102, 1), // INIT_HCA
        (ENABLE_HCA, 1),
        (QUERY_PAGES, 2),
        (MANAGE_PAGES, 2),
        (SET_HCA_CAP, 1),
        (QUERY_ISSI, 1),
        (0x10b, 1),  // SET_ISSI
        (0x301, 15), // CREATE_EQ
        (0x802, 4),  // ALLOC_UAR
        (0x805, 1),  // ACCESS_REG
    ]
    .into_iter()
    .collect();
    assert_eq!(per_opcode, expected);
}

#[test]
fn the_whole_trace_round_trips_through_our_writer() {
    let cmds = commands();
    let text = trace::write_commands("0000:02:00.0", &cmds);
    assert!(text.starts_with(
        "mlx5-user 0000:02:00.0: dump_command: dump command ENABLE_HCA(0x104) INPUT\n\
         000: 07000000 00000010 00000000 00000000\n"
    ));
    let again = trace::parse(&text).expect("our own trace parses");
    assert_eq!(again.len(), cmds.len());
    for (a, b) in cmds.iter().zip(&again) {
        assert_eq!(b.name, trace::opcode_name(a.opcode));
        assert_eq!(
            (a.opcode, a.op_mod, &a.entry, &a.completed_entry),
            (b.opcode, b.op_mod, &b.entry, &b.completed_entry)
        );
        assert_eq!(a.input, b.input);
        assert_eq!(a.output, b.output);
        assert_eq!(a.in_blocks, b.in_blocks);
        assert_eq!(a.out_blocks, b.out_blocks);
    }
    assert_eq!(trace::write_commands("0000:02:00.0", &again), text);
}

#[test]
fn query_issi_supports_issi_1() {
    let cmds = commands();
    let issi = find(&cmds, QUERY_ISSI, 0);
    assert_eq!(issi.len(), 1);
    let c = issi[0];
    // The kernel of the trace did not know the opcode's name.
    assert_eq!(c.name, "unknown command opcode");
    // outlen 0x70 (entry 0x38: "00000070"): 16 inline bytes and one block.
    assert_eq!(c.output.len(), 0x70);
    assert_eq!(c.out_blocks.len(), 1);

    // supported_issi_dw0 is at bit 0x360 = output byte 0x6c = mailbox byte
    // 0x5c = dump offset 0x9c: line "090: 00000000 00000000 00000000
    // 00000002", last word: 0x2, bit 1 set = ISSI 1 supported.
    // current_issi is at bit 0x50 = output byte 0xa = entry byte 0x2a: 0.
    let out = QueryIssiOut::new_checked(&c.output[..]).expect("query_issi_out fits");
    assert_eq!(out.supported_issi_dw0(), 0x2);
    assert_eq!(out.current_issi(), 0);
    assert_eq!(out.status(), 0);

    let d = decoded("query_issi_out", &c.output);
    assert_eq!(field(&d, "supported_issi_dw0"), 0x2);
    assert_eq!(field(&d, "current_issi"), 0);
}

#[test]
fn query_pages_and_manage_pages() {
    let cmds = commands();
    // num_pages is at bit 0x60 of query_pages_out = output byte 0xc = entry
    // byte 0x2c: the last word of the OUTPUT dump's "020:" line.
    // op_mod 1 (boot pages), line 119: "020: 00000000 00000000 00000000
    //   00000006" -> 6 (the log says "requested 6 boot pages").
    // op_mod 2 (init pages), line 1130: "... 00003244" -> 0x3244 = 12868
    //   ("requested 12868 init pages").
    for (op_mod, pages) in [(1u16, 6u32), (2, 12868)] {
        let q = find(&cmds, QUERY_PAGES, op_mod);
        assert_eq!(q.len(), 1, "QUERY_PAGES op_mod {op_mod}");
        let out = QueryPagesOut::new_checked(&q[0].output[..]).expect("query_pages_out fits");
        assert_eq!(out.num_pages(), pages, "op_mod {op_mod} num_pages");
        assert_eq!(out.function_id(), 0);
        let d = decoded("query_pages_out", &q[0].output);
        assert_eq!(field(&d, "num_pages"), u64::from(pages));
    }

    // MANAGE_PAGES op_mod 1 (give) follows each with as many pages:
    // input_num_entries is at bit 0x60 = input byte 0xc = entry byte 0x1c,
    // the last word of the INPUT dump's "010:" line ("00000006", then
    // "00003244"); inlen (entry 0x04) is 0x10 + 8 bytes per page:
    // "00000040" and "00019230".
    let give = find(&cmds, MANAGE_PAGES, 1);
    assert_eq!(give.len(), 2);
    for (c, pages) in give.iter().zip([6u32, 12868]) {
        let inlen = u32::from_be_bytes(c.entry[4..8].try_into().unwrap());
        assert_eq!(inlen, 0x10 + 8 * pages);
        let inp = ManagePagesIn::new_unchecked(&c.input[..]);
        assert_eq!(inp.input_num_entries(), pages);
        assert_eq!(inp.op_mod(), 1);
        let d = decoded("manage_pages_in", &c.input[..0x10]);
        assert_eq!(field(&d, "input_num_entries"), u64::from(pages));
    }
    // The kernel of the trace did not dump these inputs whole, and the
    // parsed input is what the dump holds, shorter than inlen:
    // - the 6 boot pages (line 129): no mailbox block at all;
    assert!(give[0].in_blocks.is_empty());
    assert_eq!(give[0].input.len(), 0x10);
    // - the 12868 init pages (line 1140): 179 of the 202 blocks, the last
    //   one dumped (block 0xb2, "192f0: 00000007 ab0a9000 000000b2 ...")
    //   still pointing to a next one.
    let init = give[1];
    assert_eq!(init.in_blocks.len(), 179);
    assert_eq!(init.input.len(), 0x10 + 179 * 512);
    assert_eq!(
        init.in_blocks[178][0x230..0x23c],
        [0, 0, 0, 7, 0xab, 0x0a, 0x90, 0, 0, 0, 0, 0xb2]
    );
    // The page addresses: pas[i] is mailbox bytes 8i..8i+8; line 1147 reads
    // "040: 00000007 ab122000 00000007 ab123000".
    let inp = ManagePagesIn::new_unchecked(&init.input[..]);
    assert_eq!(inp.pas(0), 0x7_ab12_2000);
    assert_eq!(inp.pas(1), 0x7_ab12_3000);
    let d = decoded("manage_pages_in", &init.input[..0x20]);
    assert_eq!(field(&d, "pas[0]"), 0x7_ab12_2000);
    assert_eq!(field(&d, "pas[1]"), 0x7_ab12_3000);
}

/// A `cmd_hca_cap` field, its value in the general/current capabilities
/// before SET_HCA_CAP, and where it came from.
struct Cap {
    name: &'static str,
    value: u64,
    view: fn(&mlx5_hw::ifc::CmdHcaCap<&[u8]>) -> u64,
}

macro_rules! cap {
    ($name:ident = $value:expr) => {
        Cap {
            name: stringify!($name),
            value: $value,
            view: |c| u64::from(c.$name()),
        }
    };
}

/// The general capabilities, current values, as first queried (before
/// SET_HCA_CAP). Dump lines are those of the OUTPUT at trace line 489.
fn general_current_caps() -> Vec<Cap> {
    vec![
        // bit 0x88 w8: dump 0x051; "050: 0f0f000e": 2nd byte 0x0f.
        cap!(log_max_qp_sz = 15),
        // bit 0x9b w5: dump 0x053 = 0x0e, low 5 bits.
        cap!(log_max_qp = 14),
        // bit 0xab w5: dump 0x055; "054: 00170000": 0x17, low 5 bits.
        cap!(log_max_srq = 23),
        // bit 0xc8 w8: dump 0x059; "058: 00160018": 0x16.
        cap!(log_max_cq_sz = 22),
        // bit 0xdb w5: dump 0x05b = 0x18.
        cap!(log_max_cq = 24),
        // bit 0xe0 w8: dump 0x05c; "05c: 16180008": 0x16.
        cap!(log_max_eq_sz = 22),
        // bit 0xea w6: dump 0x05d = 0x18, low 6 bits.
        cap!(log_max_mkey = 24),
        // bit 0xfc w4: dump 0x05f = 0x08, low 4 bits.
        cap!(log_max_eq = 8),
        // bit 0x109 w7: dump 0x061; "060: 04401010": 0x40, low 7 bits.
        cap!(log_max_mrw_sz = 64),
        // bit 0x11a w6: dump 0x063 = 0x10, low 6 bits.
        cap!(log_max_klm_list_size = 16),
        // bit 0x190 w16: dump 0x072..0x074; "070: 40ff0000": 0x0000 (the
        // encoding of 128 entries: "Current Pkey table size 128").
        cap!(pkey_table_size = 0),
        // bit 0x1b6 w2: dump 0x076; "074: c7100101": 0x01, bits 6-7 = 01
        // (Ethernet).
        cap!(port_type = 1),
        // bit 0x1b8 w8: dump 0x077 = 0x01.
        cap!(num_ports = 1),
        // bit 0x1c3 w5: dump 0x078; "078: 1e000000": 0x1e, low 5 bits.
        cap!(log_max_msg = 30),
        // bit 0x1cc w4: dump 0x079 = 0x00, low 4 bits.
        cap!(max_tc = 0),
        // bit 0x210 w2: dump 0x082; "080: c0060c0e": 0x0c, top 2 bits = 00
        // (the maximum capabilities, line 176, have 0xcc there: 3).
        cap!(cmdif_checksum = 0),
        // bit 0x258 w8: dump 0x08b; "088: 0005000c": 0x0c (4 KiB pages).
        cap!(log_pg_sz = 12),
        // bit 0x26b w5: dump 0x08d; "08c: a0090000": 0x09, low 5 bits.
        cap!(log_bf_reg_size = 9),
        // bit 0x2e7 w25: dump 0x09c..0x0a0; "09c: 00000030": low 25 bits.
        cap!(max_qp_mcg = 0x30),
        // bit 0x323 w5: dump 0x0a4; "0a4: 10180018": 0x10, low 5 bits.
        cap!(log_max_transport_domain = 16),
        // bit 0x32b w5: dump 0x0a5 = 0x18, low 5 bits.
        cap!(log_max_pd = 24),
        // bit 0x33b w5: dump 0x0a7 = 0x18, low 5 bits.
        cap!(log_max_xrcd = 24),
    ]
}

#[test]
fn query_hca_cap_general_current_decodes() {
    let cmds = commands();
    let general_current = find(&cmds, QUERY_HCA_CAP, 0x1);
    // Once before SET_HCA_CAP, once after INIT_HCA.
    assert_eq!(general_current.len(), 2);
    let c = general_current[0];
    // outlen "00001010" (entry 0x38): query_hca_cap_out is 0x1010 bytes,
    // 0x1000 of them in 8 mailbox blocks.
    assert_eq!(c.output.len(), 0x1010);
    assert_eq!(c.out_blocks.len(), 8);

    let out = QueryHcaCapOut::new_checked(&c.output[..]).expect("query_hca_cap_out fits");
    assert_eq!(out.status(), 0);
    assert_eq!(out.syndrome(), 0);
    // (The sub-views borrow the view they come from, so keep the union.)
    let union = out.capability();
    let cap = union.cmd_hca_cap();
    let d = decoded("query_hca_cap_out", &c.output);
    assert_eq!(field(&d, "status"), 0);

    let mut wrong = Vec::new();
    for f in general_current_caps() {
        let from_view = (f.view)(&cap);
        let path = format!("capability.cmd_hca_cap.{}", f.name);
        let from_registry = field(&d, &path);
        if (from_view, from_registry) != (f.value, f.value) {
            wrong.push(format!(
                "{}: expected {:#x}, view gives {from_view:#x}, registry::decode gives {from_registry:#x}",
                f.name, f.value
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "cmd_hca_cap mismatches:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn log_max_qp_max_set_and_current() {
    let cmds = commands();
    // log_max_qp is bit 0x9b w5 of cmd_hca_cap: dump offset 0x053, the low
    // 5 bits of the 4th byte of the "050:" line.
    // Maximum (op_mod 0), line 176: "050: 0f0f0017" -> 0x17 = 23.
    let max = find(&cmds, QUERY_HCA_CAP, 0x0);
    let max = QueryHcaCapOut::new_checked(&max[0].output[..]).unwrap();
    assert_eq!(max.capability().cmd_hca_cap().log_max_qp(), 23);
    assert_eq!(max.capability().cmd_hca_cap().cmdif_checksum(), 3);

    // SET_HCA_CAP (line 803) asks for "0f0f0011" -> 17 (Linux's profile),
    // at the same place: set_hca_cap_in's capability is at input byte 0x10.
    let set = find(&cmds, SET_HCA_CAP, 0x0);
    assert_eq!(set.len(), 1);
    assert_eq!(set[0].input.len(), 0x1010);
    let set_in = SetHcaCapIn::new_checked(&set[0].input[..]).unwrap();
    assert_eq!(set_in.capability().cmd_hca_cap().log_max_qp(), 17);
    let d = decoded("set_hca_cap_in", &set[0].input);
    assert_eq!(field(&d, "capability.cmd_hca_cap.log_max_qp"), 17);

    // And the current value after INIT_HCA (line 8041) is 17: "0f0f0011".
    let after = find(&cmds, QUERY_HCA_CAP, 0x1)[1];
    let after = QueryHcaCapOut::new_checked(&after.output[..]).unwrap();
    assert_eq!(after.capability().cmd_hca_cap().log_max_qp(), 17);
}

#[test]
fn query_adapter_vendor_ids() {
    let cmds = commands();
    let q = find(&cmds, QUERY_ADAPTER, 0);
    assert_eq!(q.len(), 1);
    // query_adapter_struct is at output byte 0x10 = mailbox byte 0.
    // ieee_vendor_id: bit 0xc8 w24 -> dump 0x059..0x05c; "058: 000002c9"
    // -> 0x0002c9 (Mellanox's OUI). vsd_vendor_id: bit 0xf0 w16 -> dump
    // 0x05e; "05c: 000015b3" -> 0x15b3 (Mellanox's PCI vendor ID).
    let out = QueryAdapterOut::new_checked(&q[0].output[..]).unwrap();
    assert_eq!(out.query_adapter_struct().ieee_vendor_id(), 0x2c9);
    assert_eq!(out.query_adapter_struct().vsd_vendor_id(), 0x15b3);
    let d = decoded("query_adapter_out", &q[0].output);
    assert_eq!(field(&d, "query_adapter_struct.ieee_vendor_id"), 0x2c9);
    assert_eq!(field(&d, "query_adapter_struct.vsd_vendor_id"), 0x15b3);
}
