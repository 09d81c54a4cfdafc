//! MEMIC operations (fw/memic_op.rs): MODIFY_MEMIC and the trapped loads
//! and stores of the operation windows, as Linux's
//! `MLX5_IB_METHOD_DM_MAP_OP_ADDR` and rdma-core's test_mlx5_dm_ops.py use
//! them, and what each refuses.

use mlx5_hw::ifc::{alloc_memic_in, alloc_memic_out, dealloc_memic_in, dealloc_memic_out};
use mlx5_hw::ifc::{device_mem_cap, modify_memic_in, modify_memic_out};
use mlx5_hw::init::{
    MEMIC_OP_ATOMIC_INCREMENT as INC, MEMIC_OP_ATOMIC_TEST_AND_SET as TAS,
    MODIFY_MEMIC_OP_MOD_ALLOC as MAP, MODIFY_MEMIC_OP_MOD_DEALLOC as UNMAP,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use vfio::PciFunction;

use super::{bar, be32, cmd_in, Drv};
use crate::fw::synd;
use crate::{cap_type, DeviceConfig, Profile};

fn up(profile: Profile) -> Drv {
    let mut d = Drv::with(DeviceConfig {
        profile,
        ..DeviceConfig::default()
    });
    d.bring_up();
    d
}

/// The MEMIC window `(start, len)` of `p`.
fn window(p: Profile) -> (u64, u64) {
    let c = p.caps();
    (
        c.get(cap_type::DEV_MEM, device_mem_cap::MEMIC_BAR_START_ADDR),
        c.get(cap_type::DEV_MEM, device_mem_cap::MEMIC_BAR_SIZE),
    )
}

fn alloc(d: &mut Drv, size: u64) -> u64 {
    let (win, len) = window(Profile::ConnectX7);
    let mut c = cmd_in(Opcode::AllocMemic.to_raw(), 0, alloc_memic_in::SIZE_BYTES);
    alloc_memic_in::RANGE_START_ADDR.set(&mut c, win);
    alloc_memic_in::RANGE_SIZE.set(&mut c, len);
    alloc_memic_in::MEMIC_SIZE.set(&mut c, size);
    alloc_memic_out::MEMIC_START_ADDR.get(&d.ok(&c, alloc_memic_out::SIZE_BYTES))
}

fn modify(d: &mut Drv, op_mod: u16, op: u8, start: u64) -> Vec<u8> {
    let mut c = cmd_in(
        Opcode::ModifyMemic.to_raw(),
        op_mod,
        modify_memic_in::SIZE_BYTES,
    );
    modify_memic_in::MEMIC_OPERATION_TYPE.set(&mut c, u64::from(op));
    modify_memic_in::MEMIC_START_ADDR.set(&mut c, start);
    d.exec(&c, modify_memic_out::SIZE_BYTES)
}

/// MODIFY_MEMIC ALLOC: the operation's BAR0 address.
fn map(d: &mut Drv, op: u8, start: u64) -> u64 {
    let out = modify(d, MAP, op, start);
    assert_eq!(status(&out), (0, 0), "MODIFY_MEMIC map of op {op}");
    modify_memic_out::MEMIC_OPERATION_ADDR.get(&out)
}

fn status(out: &[u8]) -> (u8, u32) {
    (out[0], be32(out, 4))
}

fn bad(s: CmdStatus, synd: u32) -> (u8, u32) {
    (s.to_raw(), synd)
}

fn load(d: &Drv, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    d.f.region_read(0, at, &mut b).unwrap();
    b
}

fn store(d: &Drv, at: u64, data: &[u8]) {
    d.f.region_write(0, at, data).unwrap();
}

fn memic(d: &Drv, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    bar(d).read(at as usize, &mut b).unwrap();
    b
}

#[test]
fn connectx7_offers_increment_and_test_and_set_in_trapped_windows() {
    let c = Profile::ConnectX7.caps();
    let dm = |f| c.get(cap_type::DEV_MEM, f);
    assert_eq!(dm(device_mem_cap::MEMIC_OPERATIONS), 0x3);
    assert_eq!(dm(device_mem_cap::MEMIC_ATOMIC_INCREMENT_SIZE_SUP), 0xf);
    assert_eq!(dm(device_mem_cap::MEMIC_ATOMIC_TEST_AND_SET_SIZE_SUP), 0xf);
    for p in [Profile::ConnectX5, Profile::ConnectX6] {
        assert_eq!(
            p.caps()
                .get(cap_type::DEV_MEM, device_mem_cap::MEMIC_OPERATIONS),
            0,
            "{p:?}"
        );
    }
    let mut d = up(Profile::ConnectX7);
    let (win, len) = window(Profile::ConnectX7);
    let start = alloc(&mut d, 128);
    let inc = map(&mut d, INC, start);
    let tas = map(&mut d, TAS, start);
    // Below the MEMIC window, one window-sized stretch per type.
    assert_eq!(inc, win - 2 * len + (start - win));
    assert_eq!(tas, inc + len);
    // No mappable area of BAR0 reaches an operation address.
    let info = d.f.region_info(0).unwrap();
    for (o, l) in info.mmap_areas {
        assert!(
            o + l <= win - 2 * len || o >= win,
            "{o:#x}+{l:#x} maps an op window"
        );
    }
    // Mapping a type again hands out the same address.
    assert_eq!(map(&mut d, INC, start), inc);
}

#[test]
fn increment_and_test_and_set_act_on_the_allocation() {
    let mut d = up(Profile::ConnectX7);
    let start = alloc(&mut d, 128);
    let inc = map(&mut d, INC, start);
    let tas = map(&mut d, TAS, start);
    // rdma-core's test_dm_atomic_ops: two 1-byte increments, then
    // test-and-set reads 2 and leaves 1, and reads that 1 next.
    store(&d, inc, &[1]);
    store(&d, inc, &[1]);
    assert_eq!(load(&d, tas, 1), [2]);
    assert_eq!(memic(&d, start, 1), [1]);
    assert_eq!(load(&d, tas, 1), [1]);
    // Wider accesses: big-endian value and operand, wrapping.
    bar(&d)
        .write(start as usize + 8, &0x01ffu16.to_be_bytes())
        .unwrap();
    store(&d, inc + 8, &0x0102u16.to_be_bytes());
    assert_eq!(memic(&d, start + 8, 2), 0x0301u16.to_be_bytes());
    bar(&d)
        .write(start as usize + 16, &u64::MAX.to_be_bytes())
        .unwrap();
    store(&d, inc + 16, &2u64.to_be_bytes());
    assert_eq!(memic(&d, start + 16, 8), 1u64.to_be_bytes());
    assert_eq!(load(&d, tas + 16, 8), 1u64.to_be_bytes());
    store(&d, inc + 124, &7u32.to_be_bytes());
    assert_eq!(load(&d, tas + 124, 4), 7u32.to_be_bytes());
    assert_eq!(memic(&d, start + 124, 4), 1u32.to_be_bytes());
    // The neighbours of what each access touched stay as they were.
    assert_eq!(memic(&d, start + 1, 7), [0; 7]);
}

#[test]
fn modify_memic_refuses_bad_operations_and_unknown_memory() {
    let mut d = up(Profile::ConnectX7);
    let start = alloc(&mut d, 64);
    let e = |s| bad(CmdStatus::BadParameter, s);
    for op in [2, 31, 0xff] {
        let out = modify(&mut d, MAP, op, start);
        assert_eq!(status(&out), e(synd::MEMIC_BAD_OPERATION), "op {op}");
    }
    assert_eq!(
        status(&modify(&mut d, 2, INC, start)),
        e(synd::MEMIC_BAD_OP_MOD)
    );
    // Not the start of an allocation: inside one, or none at all.
    for at in [start + 64, start + 4, 0x1000] {
        let out = modify(&mut d, MAP, INC, at);
        assert_eq!(status(&out), e(synd::MEMIC_UNKNOWN), "at {at:#x}");
    }
    assert_eq!(
        status(&modify(&mut d, UNMAP, TAS, start)),
        e(synd::MEMIC_OP_NOT_MAPPED)
    );
    map(&mut d, TAS, start);
    assert_eq!(status(&modify(&mut d, UNMAP, TAS, start)), (0, 0));
    assert_eq!(
        status(&modify(&mut d, UNMAP, TAS, start)),
        e(synd::MEMIC_OP_NOT_MAPPED)
    );
    // A card with MEMIC but no operations, and one without MEMIC.
    let mut cx6 = up(Profile::ConnectX6);
    let (win, len) = window(Profile::ConnectX6);
    let mut c = cmd_in(Opcode::AllocMemic.to_raw(), 0, alloc_memic_in::SIZE_BYTES);
    alloc_memic_in::RANGE_START_ADDR.set(&mut c, win);
    alloc_memic_in::RANGE_SIZE.set(&mut c, len);
    alloc_memic_in::MEMIC_SIZE.set(&mut c, 64);
    let s6 = alloc_memic_out::MEMIC_START_ADDR.get(&cx6.ok(&c, alloc_memic_out::SIZE_BYTES));
    assert_eq!(
        status(&modify(&mut cx6, MAP, INC, s6)),
        e(synd::MEMIC_BAD_OPERATION)
    );
    let mut cx4 = up(Profile::ConnectX4Lx);
    assert_eq!(
        status(&modify(&mut cx4, MAP, INC, 0)),
        bad(CmdStatus::BadOperation, synd::MEMIC_UNSUPPORTED)
    );
}

#[test]
fn accesses_that_name_no_mapped_operation_do_nothing() {
    let mut d = up(Profile::ConnectX7);
    let (_, len) = window(Profile::ConnectX7);
    let a = alloc(&mut d, 64);
    let b = alloc(&mut d, 64);
    assert_eq!(b, a + 64, "the second allocation follows the first");
    bar(&d).write(b as usize, &[5]).unwrap();
    let inc = map(&mut d, INC, a);
    let tas = inc + len; // where test-and-set of `a` would be: not mapped
                         // Past the allocation: the next one's bytes, not mapped for it.
    store(&d, inc + 64, &[1]);
    assert_eq!(load(&d, tas + 64, 1), [0xff]);
    assert_eq!(memic(&d, b, 1), [5]);
    // An operation not mapped for the allocation.
    assert_eq!(load(&d, tas, 1), [0xff]);
    assert_eq!(memic(&d, a, 1), [0]);
    // Sizes and alignment the operation does not take.
    store(&d, inc, &[1, 2, 3]);
    store(&d, inc + 2, &1u32.to_be_bytes());
    let wide = [1u8; 16];
    store(&d, inc + 16, &wide);
    // The wrong direction: a load of the increment.
    assert_eq!(load(&d, inc, 1), [0xff]);
    assert_eq!(memic(&d, a, 64), [0; 64]);
    // Unmapped, then freed: stores no longer reach the memory.
    assert_eq!(status(&modify(&mut d, UNMAP, INC, a)), (0, 0));
    store(&d, inc, &[1]);
    assert_eq!(memic(&d, a, 1), [0]);
    map(&mut d, INC, a);
    let mut c = cmd_in(
        Opcode::DeallocMemic.to_raw(),
        0,
        dealloc_memic_in::SIZE_BYTES,
    );
    dealloc_memic_in::MEMIC_START_ADDR.set(&mut c, a);
    dealloc_memic_in::MEMIC_SIZE.set(&mut c, 64);
    d.ok(&c, dealloc_memic_out::SIZE_BYTES);
    store(&d, inc, &[1]);
    assert_eq!(memic(&d, a, 1), [0]);
    assert_eq!(
        status(&modify(&mut d, MAP, INC, a)),
        bad(CmdStatus::BadParameter, synd::MEMIC_UNKNOWN)
    );
}
