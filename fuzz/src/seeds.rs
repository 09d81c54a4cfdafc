//! The seed inputs of every target: valid messages, commands and command
//! lines to start from (the fuzzer mutates them), and the hostile shapes
//! the issue names (mailbox loops, bad tokens and signatures, a doorbell
//! write that once bricked the function). `mlx5-fuzz seeds` writes them
//! into the corpora; the corpora keep them with the fuzzer's finds.

use mlx5_hw::trace;
use vfio::user::header::{Command, Header};
use vfio::user::irq::{IrqSet, IRQ_SET_ACTION_TRIGGER, IRQ_SET_DATA_EVENTFD};
use vfio::user::region::{RegionAccess, RegionInfoWire};
use vfio::user::version::{Capabilities, Version};
use vfio::user::{device::DeviceInfo, dma};
use zerocopy::IntoBytes;

use crate::cmd_engine::{FIX_ALL, FIX_CHAIN, FIX_LEN, FIX_SIG, FIX_TOKEN, FIX_TYPE};
use crate::rig::{MBOX_IOVA, MEM_IOVA};

/// A named seed.
pub type Seed = (String, Vec<u8>);

/// The seeds of target `name` (none for an unknown name).
pub fn seeds(name: &str) -> Vec<Seed> {
    match name {
        "vfio_user" => vfio_user(),
        "cmd_engine" => cmd_engine(),
        "wqe" => crate::wqe::seeds(),
        "driver_decode" => driver_decode(),
        "prm_decode" => prm_decode(),
        "perf_flags" => perf_flags(),
        _ => Vec::new(),
    }
}

fn msg(id: u16, cmd: Command, parts: &[&[u8]]) -> Vec<u8> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut m = Header::command(id, cmd, len).as_bytes().to_vec();
    for p in parts {
        m.extend_from_slice(p);
    }
    m
}

fn version() -> Vec<u8> {
    let v = Version { major: 0, minor: 1 };
    msg(
        1,
        Command::Version,
        &[v.as_bytes(), &Capabilities::default().to_wire()],
    )
}

fn vfio_user() -> Vec<Seed> {
    let info = DeviceInfo {
        argsz: 16,
        ..DeviceInfo::default()
    };
    let region = RegionInfoWire {
        argsz: 256,
        index: 0,
        ..RegionInfoWire::default()
    };
    let read = RegionAccess {
        offset: 0,
        region: 0,
        count: 4,
    };
    let write_db = RegionAccess {
        offset: 0x18,
        region: 0,
        count: 4,
    };
    let irqs = IrqSet {
        argsz: 20,
        flags: IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER,
        index: 2,
        start: 0,
        count: 2,
    };
    let map = dma::DmaMap {
        argsz: 32,
        flags: dma::DMA_MAP_READ | dma::DMA_MAP_WRITE,
        offset: 0,
        address: 0x10_0000,
        size: 0x1_0000,
    };
    let unmap = dma::DmaUnmap {
        argsz: 24,
        flags: 0,
        address: 0x10_0000,
        size: 0x1_0000,
    };
    let mut session = version();
    session.extend(msg(2, Command::DeviceGetInfo, &[info.as_bytes()]));
    session.extend(msg(3, Command::DeviceGetRegionInfo, &[region.as_bytes()]));
    session.extend(msg(4, Command::RegionRead, &[read.as_bytes()]));
    session.extend(msg(5, Command::DeviceSetIrqs, &[irqs.as_bytes()]));
    session.extend(msg(6, Command::DmaMap, &[map.as_bytes()]));
    session.extend(msg(7, Command::DmaUnmap, &[unmap.as_bytes()]));
    session.extend(msg(8, Command::DeviceReset, &[]));
    let mut doorbell = version();
    doorbell.extend(msg(
        2,
        Command::RegionWrite,
        &[write_db.as_bytes(), &[0, 0, 0, 1]],
    ));
    vec![
        ("version".into(), version()),
        ("session".into(), session),
        ("cmd-doorbell-then-hang-up".into(), doorbell),
        (
            "before-version".into(),
            msg(1, Command::DeviceGetInfo, &[info.as_bytes()]),
        ),
    ]
}

/// A command record of the `cmd_engine` input format: `input` carried
/// inline and in blocks, output `outlen` bytes.
pub fn cmd_record(slot: u8, fix: u8, input: &[u8], outlen: u32) -> Vec<u8> {
    let mut e = [0u8; 64];
    e[0] = 7;
    e[0x04..0x08].copy_from_slice(&(input.len() as u32).to_be_bytes());
    let k = input.len().min(16);
    e[0x10..0x10 + k].copy_from_slice(&input[..k]);
    e[0x38..0x3c].copy_from_slice(&outlen.to_be_bytes());
    e[0x3c] = slot.wrapping_add(0x41);
    let tail = input.get(16..).unwrap_or(&[]);
    let n = tail.len().div_ceil(512);
    let mut r = vec![slot, fix, 0, 0, 0, 0];
    r.extend_from_slice(&e);
    r.push(n as u8);
    for i in 0..n {
        let mut b = [0u8; 576];
        let part = &tail[i * 512..tail.len().min((i + 1) * 512)];
        b[..part.len()].copy_from_slice(part);
        r.extend_from_slice(&b);
    }
    r
}

/// A command input: opcode, op_mod, then `rest` from byte 8 on.
pub fn cmd_input(opcode: u16, op_mod: u16, len: usize, rest: &[(usize, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; len.max(8)];
    m[0..2].copy_from_slice(&opcode.to_be_bytes());
    m[6..8].copy_from_slice(&op_mod.to_be_bytes());
    for (at, b) in rest {
        m[*at..*at + b.len()].copy_from_slice(b);
    }
    m
}

/// The firmware bring-up the driver performs, as `cmd_engine` records.
pub fn bringup_records(pages: u32) -> Vec<u8> {
    let mut s = Vec::new();
    let mut push = |slot: u8, input: Vec<u8>, outlen: u32| {
        s.extend(cmd_record(slot, FIX_ALL, &input, outlen));
    };
    push(0, cmd_input(0x104, 0, 16, &[]), 16); // ENABLE_HCA
    push(1, cmd_input(0x10a, 0, 16, &[]), 0x70); // QUERY_ISSI
    push(2, cmd_input(0x10b, 0, 16, &[(10, &[0, 1])]), 16); // SET_ISSI 1
    push(3, cmd_input(0x107, 1, 16, &[]), 16); // QUERY_PAGES boot
    let give = |first: u32| {
        let mut pas = Vec::new();
        for i in first..first + pages {
            pas.extend_from_slice(&(MEM_IOVA + u64::from(i) * 4096).to_be_bytes());
        }
        cmd_input(
            0x108,
            1,
            16 + pas.len(),
            &[(12, &pages.to_be_bytes()), (16, &pas)],
        )
    };
    push(4, give(0), 16); // MANAGE_PAGES give (boot)
    push(5, cmd_input(0x100, 1, 16, &[]), 0x1010); // QUERY_HCA_CAP general current
    push(6, cmd_input(0x100, 0, 16, &[]), 0x1010); // QUERY_HCA_CAP general max
    push(7, cmd_input(0x107, 2, 16, &[]), 16); // QUERY_PAGES init
    push(13, give(pages), 16); // MANAGE_PAGES give (init)
    push(8, cmd_input(0x102, 0, 0x40, &[]), 16); // INIT_HCA
    push(9, cmd_input(0x802, 0, 16, &[]), 16); // ALLOC_UAR
    push(10, cmd_input(0x800, 0, 16, &[]), 16); // ALLOC_PD
    push(11, cmd_input(0x816, 0, 16, &[]), 16); // ALLOC_TRANSPORT_DOMAIN
    s
}

fn cmd_engine() -> Vec<Seed> {
    let query_issi = cmd_input(0x10a, 0, 16, &[]);
    let big = cmd_input(0x100, 1, 16 + 512 * 3, &[]);
    // A chain whose first block points back at itself: the engine must
    // stop at the block number, not follow it forever.
    let mut looped = cmd_record(0, FIX_ALL & !FIX_CHAIN, &big, 0x1010);
    let e = 6;
    looped[e + 0x08..e + 0x10].copy_from_slice(&MBOX_IOVA.to_be_bytes());
    let b0 = 6 + 64 + 1;
    looped[b0 + 0x230..b0 + 0x238].copy_from_slice(&MBOX_IOVA.to_be_bytes());
    // Unmapped and misaligned chains.
    let mut unmapped = cmd_record(0, FIX_ALL & !FIX_CHAIN, &big, 16);
    unmapped[e + 0x08..e + 0x10].copy_from_slice(&0x7000_0000u64.to_be_bytes());
    let mut misaligned = cmd_record(0, FIX_ALL & !FIX_CHAIN, &big, 16);
    misaligned[e + 0x08..e + 0x10].copy_from_slice(&(MBOX_IOVA + 0x40).to_be_bytes());
    let mut bad_token = cmd_record(0, FIX_ALL & !FIX_TOKEN, &big, 16);
    bad_token[b0 + 0x23d] = 0x99;
    let mut bad_sig = cmd_record(0, FIX_ALL & !FIX_SIG, &big, 16);
    bad_sig[b0 + 0x23f] = 0x5a;
    let mut bad_type = cmd_record(0, FIX_ALL & !FIX_TYPE, &query_issi, 0x70);
    bad_type[e] = 0;
    let mut checksums = bringup_records(64);
    checksums.extend(cmd_record(12, FIX_ALL, &query_issi, 0x70));
    let mut init = vec![1u8];
    init.extend(cmd_record(0, FIX_ALL, &cmd_input(0x802, 0, 16, &[]), 16)); // ALLOC_UAR
    init.extend(cmd_record(1, FIX_ALL, &cmd_input(0x800, 0, 16, &[]), 16)); // ALLOC_PD
    init.extend(cmd_record(2, FIX_ALL, &cmd_input(0x816, 0, 16, &[]), 16)); // ALLOC_TRANSPORT_DOMAIN
    init.extend(cmd_record(
        3,
        FIX_ALL,
        &cmd_input(0x754, 0, 16, &[]),
        0x1010,
    )); // QUERY_NIC_VPORT_CONTEXT
    let seeds: Vec<Seed> = vec![
        (
            "query-issi".into(),
            cmd_record(0, FIX_ALL, &query_issi, 0x70),
        ),
        ("garbage-entry".into(), cmd_record(3, 0, &query_issi, 0x70)),
        ("bad-type".into(), bad_type),
        (
            "bad-lengths".into(),
            cmd_record(0, FIX_ALL & !FIX_LEN, &big, 0x7fff_ffff),
        ),
        ("loop".into(), looped),
        ("unmapped".into(), unmapped),
        ("misaligned".into(), misaligned),
        ("bad-token".into(), bad_token),
        ("bad-signature".into(), bad_sig),
        ("bringup".into(), checksums),
    ];
    let mut seeds: Vec<Seed> = seeds
        .into_iter()
        .map(|(n, r)| (n, [vec![0u8], r].concat()))
        .collect();
    seeds.push(("initialized".into(), init));
    seeds
}

fn driver_decode() -> Vec<Seed> {
    let mut ok = vec![0u8];
    ok.extend_from_slice(&[0x01, 0x04, 0, 0, 0]);
    ok.extend_from_slice(&[0u8; 16]);
    let mut bad = vec![0u8];
    bad.extend_from_slice(&[0x01, 0x00, 0, 1, 0]);
    let mut out = [0u8; 16];
    out[0] = 0x03; // BAD_PARAM
    out[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    bad.extend_from_slice(&out);
    let mut chain = vec![1u8, 0x41, 0, 200];
    chain.extend_from_slice(&[0u8; 16]);
    for b in verbs::cmd::build_chain(&[7u8; 1000], 2, MBOX_IOVA, 0x41) {
        chain.extend_from_slice(&b);
    }
    let mut cqe = vec![2u8, 0, 5, 6, 6, 4];
    let mut req = [0u8; 64];
    req[0x38..0x3c].copy_from_slice(&5u32.to_be_bytes());
    req[0x3f] = 0; // REQ, owner 0
    cqe.extend_from_slice(&req);
    let mut err = [0u8; 64];
    err[0x37] = 0x05; // syndrome: local protection
    err[0x38..0x3c].copy_from_slice(&5u32.to_be_bytes());
    err[0x3f] = 0xd0; // REQ_ERR
    cqe.extend_from_slice(&err);
    let mut resp = [0u8; 64];
    resp[0x2c..0x30].copy_from_slice(&64u32.to_be_bytes());
    resp[0x3f] = 0x20; // RESP_SEND
    cqe.extend_from_slice(&resp);
    let mut eqe = vec![3u8, 6];
    let mut page_req = [0u8; 64];
    page_req[1] = 0x0b; // PAGE_REQUEST
    page_req[0x24..0x28].copy_from_slice(&8i32.to_be_bytes());
    eqe.extend_from_slice(&page_req);
    let mut comp = [0u8; 64];
    comp[1] = 0x00; // COMPLETION
    comp[0x38..0x3c].copy_from_slice(&3u32.to_be_bytes());
    eqe.extend_from_slice(&comp);
    let mut caps = vec![4u8, 0x1f];
    let mut page = vec![0u8; 0x1000];
    page[0x18] = 0x12; // log_max_qp region, some values
    page[0x20] = 0x0f;
    caps.extend_from_slice(&page);
    vec![
        ("status-ok".into(), ok),
        ("status-bad-param".into(), bad),
        ("chain".into(), chain),
        ("cqes".into(), cqe),
        ("eqes".into(), eqe),
        ("caps".into(), caps),
        (
            "caps-all-ones".into(),
            [vec![4u8, 0x00], vec![0xff; 0x2000]].concat(),
        ),
    ]
}

fn prm_decode() -> Vec<Seed> {
    let mut seeds: Vec<Seed> = Vec::new();
    let layouts = mlx5_hw::registry::layouts();
    for name in [
        "cmd_hca_cap",
        "cqc",
        "qpc",
        "create_qp_in",
        "query_hca_cap_out",
    ] {
        if let Some(i) = layouts.iter().position(|l| l.name == name) {
            let mut s = (i as u16).to_le_bytes().to_vec();
            s.extend((0..256u32).map(|x| (x * 37 % 251) as u8));
            seeds.push((format!("layout-{name}"), s));
        }
    }
    // The first commands of the real trace the tests read, as the kernel
    // wrote them, and as our writer writes them.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/traces/connectx4-mlx5_core-bringup.txt");
    if let Ok(text) = std::fs::read_to_string(path) {
        let lines: Vec<&str> = text.lines().collect();
        let headers: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.contains("dump command"))
            .map(|(i, _)| i)
            .collect();
        if let Some(&end) = headers.get(4) {
            let head = lines[..end].join("\n");
            seeds.push(("trace-kernel".into(), head.clone().into_bytes()));
            if let Ok(cmds) = trace::parse(&head) {
                let ours = trace::write_commands(trace::DEFAULT_DEVICE, &cmds);
                seeds.push(("trace-ours".into(), ours.into_bytes()));
            }
        }
    }
    seeds
}

fn perf_flags() -> Vec<Seed> {
    let lines: [(&str, &[&str]); 7] = [
        ("write-bw", &["write_bw"]),
        ("write-bw-l16", &["write_bw", "-l", "16", "-n", "5000"]),
        (
            "atomic-bw",
            &["atomic_bw", "-q", "3", "-l", "7", "-n", "50"],
        ),
        ("write-bw-bidir", &["write_bw", "-b", "-l", "3", "-n", "10"]),
        ("send-lat-ud", &["send_lat", "-c", "UD", "-s", "64"]),
        ("read-bw-all", &["read_bw", "-a", "-D", "2"]),
        ("help", &["write_lat", "--help"]),
    ];
    lines
        .iter()
        .map(|(n, argv)| ((*n).to_string(), argv.join("\0").into_bytes()))
        .collect()
}
