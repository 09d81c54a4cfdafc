//! The helpers of libibverbs that need no device (status and type
//! strings, rate conversions, sysfs reads, fork support), and the verbs
//! this driver does not offer: they are exported so that programs linking
//! them load (the distribution's binaries are linked `-z now`), and answer
//! as libibverbs answers for a provider without the feature: `EOPNOTSUPP`
//! (or `ENOSYS`, as rdma-core's own fallbacks do) with NULL or -1.

use libc::{c_char, c_int, c_void};

use crate::abi::*;
use crate::{null_errno, ret_errno, set_errno};

fn cstr(s: &'static [u8]) -> *const c_char {
    s.as_ptr().cast()
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const S: [&[u8]; 24] = [
        b"success\0",
        b"local length error\0",
        b"local QP operation error\0",
        b"local EE context operation error\0",
        b"local protection error\0",
        b"Work Request Flushed Error\0",
        b"memory management operation error\0",
        b"bad response error\0",
        b"local access error\0",
        b"remote invalid request error\0",
        b"remote access error\0",
        b"remote operation error\0",
        b"transport retry counter exceeded\0",
        b"RNR retry counter exceeded\0",
        b"local RDD violation error\0",
        b"remote invalid RD request\0",
        b"operation aborted\0",
        b"invalid EE context number\0",
        b"invalid EE context state\0",
        b"fatal error\0",
        b"response timeout error\0",
        b"general error\0",
        b"TM error\0",
        b"TM software rendezvous\0",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| S.get(i))
        .map_or(cstr(b"unknown\0"), |s| cstr(s))
}

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    const S: [&[u8]; 8] = [
        b"unknown\0",
        b"InfiniBand channel adapter\0",
        b"InfiniBand switch\0",
        b"InfiniBand router\0",
        b"iWARP NIC\0",
        b"usNIC\0",
        b"usNIC UDP\0",
        b"unspecified\0",
    ];
    usize::try_from(t)
        .ok()
        .and_then(|i| S.get(i))
        .map_or(cstr(b"unknown\0"), |s| cstr(s))
}

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: c_int) -> *const c_char {
    const S: [&[u8]; 6] = [
        b"no state change (NOP)\0",
        b"down\0",
        b"init\0",
        b"armed\0",
        b"active\0",
        b"active deferred\0",
    ];
    usize::try_from(s)
        .ok()
        .and_then(|i| S.get(i))
        .map_or(cstr(b"unknown\0"), |s| cstr(s))
}

/// `ibv_event_type_str`.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: c_int) -> *const c_char {
    const S: [&[u8]; 20] = [
        b"CQ error\0",
        b"local work queue catastrophic error\0",
        b"invalid request local work queue error\0",
        b"local access violation work queue error\0",
        b"communication established\0",
        b"send queue drained\0",
        b"path migrated\0",
        b"path migration request error\0",
        b"local catastrophic error\0",
        b"port active\0",
        b"port error\0",
        b"LID change\0",
        b"P_Key change\0",
        b"SM change\0",
        b"SRQ catastrophic error\0",
        b"SRQ limit reached\0",
        b"last WQE reached\0",
        b"client reregistration\0",
        b"GID table change\0",
        b"WQ fatal\0",
    ];
    usize::try_from(e)
        .ok()
        .and_then(|i| S.get(i))
        .map_or(cstr(b"unknown\0"), |s| cstr(s))
}

/// (`enum ibv_rate`, multiple of 2.5 Gb/s, Mb/s), IBA's table.
const RATES: [(c_int, c_int, c_int); 24] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 0, 14062),
    (12, 0, 56250),
    (13, 0, 112500),
    (14, 0, 168750),
    (15, 10, 25781),
    (16, 40, 103125),
    (17, 80, 206250),
    (18, 120, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
    (23, 320, 850000),
    (24, 480, 1275000),
    (0, 0, 0),
];

/// `ibv_rate_to_mult`.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && r.0 != 0)
        .map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate`.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && r.1 != 0)
        .map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && r.0 != 0)
        .map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.2 == mbps && r.2 != 0)
        .map_or(0, |r| r.0)
}

/// `ibv_get_sysfs_path`: "/sys", as libibverbs says without `SYSFS_PATH`.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    cstr(b"/sys\0")
}

/// `ibv_read_sysfs_file`: reads `dir/file` (trailing newline dropped);
/// the bytes read, or -1. The devices' sysfs paths do not exist (no
/// kernel device), so reads of them fail as for an absent attribute.
#[no_mangle]
pub extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's NUL-terminated strings, non-NULL.
    let d = unsafe { std::ffi::CStr::from_ptr(dir) };
    // SAFETY: as above.
    let f = unsafe { std::ffi::CStr::from_ptr(file) };
    let path = std::path::Path::new(std::ffi::OsStr::new(&*d.to_string_lossy()))
        .join(&*f.to_string_lossy());
    let Ok(mut s) = std::fs::read(&path) else {
        set_errno(libc::ENOENT);
        return -1;
    };
    s.truncate(size - 1);
    if s.last() == Some(&b'\n') {
        s.pop();
    }
    s.push(0);
    // SAFETY: `buf` holds `size` bytes; we write s.len() <= size.
    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len()) };
    s.pop();
    s.len() as c_int
}

/// `ibv_fork_init`: the driver's memory is not pinned through the
/// kernel, so there is nothing to protect across fork.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (2).
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_resolve_eth_l2_from_gid`: the MAC of a link-local (EUI-64) GID;
/// no neighbour table is consulted, so a routable GID is `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    _c: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    if attr.is_null() || eth_mac.is_null() {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let g = unsafe { (*attr).grh.dgid.raw };
    let Some(mac) = verbs::device::mac_of_link_local_gid(&g) else {
        return ret_errno(libc::EOPNOTSUPP);
    };
    // SAFETY: the caller's 6-byte MAC buffer.
    unsafe { std::ptr::copy_nonoverlapping(mac.as_ptr(), eth_mac, 6) };
    if !vid.is_null() {
        // SAFETY: the caller's VLAN id, non-NULL.
        unsafe { vid.write(0xffff) };
    }
    0
}

/// `ibv_attach_mcast`: the UD QP joins the group of `gid` (the LID is
/// InfiniBand's; RoCE has none). 0, or the errno: EINVAL for a NULL or
/// unknown QP, a NULL or unicast GID, a QP that is not UD.
#[no_mangle]
pub extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    mcast("ibv_attach_mcast", qp, gid, verbs::qp::Qp::attach_mcast)
}

/// `ibv_detach_mcast`: the UD QP leaves the group of `gid`.
#[no_mangle]
pub extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    mcast("ibv_detach_mcast", qp, gid, verbs::qp::Qp::detach_mcast)
}

fn mcast(
    what: &str,
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    f: fn(&verbs::qp::Qp, &verbs::device::Gid) -> verbs::Result<()>,
) -> c_int {
    let Some(q) = crate::qp::qp_of(qp) else {
        return libc::EINVAL;
    };
    if gid.is_null() {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the caller's GID, non-NULL.
    let g = unsafe { (*gid).raw };
    match f(&q.qp.lock_control(), &g) {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of(what, &e)),
    }
}

/// `ibv_reg_dmabuf_mr`: dma-buf memory is not mapped by the driver.
#[no_mangle]
pub extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _len: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    null_errno(libc::EOPNOTSUPP)
}

/// `ibv_import_device`: there is no kernel context to import.
#[no_mangle]
pub extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    null_errno(libc::EOPNOTSUPP)
}

/// `ibv_import_pd`: no kernel objects to import.
#[no_mangle]
pub extern "C" fn ibv_import_pd(_c: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
    null_errno(libc::EOPNOTSUPP)
}

/// `ibv_unimport_pd`.
#[no_mangle]
pub extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

/// `ibv_import_mr`: no kernel objects to import.
#[no_mangle]
pub extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut ibv_mr {
    null_errno(libc::EOPNOTSUPP)
}

/// `ibv_unimport_mr`.
#[no_mangle]
pub extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

/// `ibv_import_dm`: no device memory.
#[no_mangle]
pub extern "C" fn ibv_import_dm(_c: *mut ibv_context, _handle: u32) -> *mut c_void {
    null_errno(libc::EOPNOTSUPP)
}

/// `ibv_unimport_dm`.
#[no_mangle]
pub extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {}

/// `ibv_set_ece`: no enhanced connection establishment.
#[no_mangle]
pub extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    ret_errno(libc::EOPNOTSUPP)
}

/// `ibv_query_ece`: no enhanced connection establishment.
#[no_mangle]
pub extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    ret_errno(libc::EOPNOTSUPP)
}

/// `ibv_query_qp_data_in_order`: 0, no in-order guarantee promised
/// beyond what verbs says.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: c_int, _flags: u32) -> c_int {
    0
}

/// `ibv_copy_qp_attr_from_kern`: kernel ABI structures do not exist here.
#[no_mangle]
pub extern "C" fn ibv_copy_qp_attr_from_kern(_dst: *mut c_void, _src: *mut c_void) {}

/// `ibv_copy_ah_attr_from_kern`: as above.
#[no_mangle]
pub extern "C" fn ibv_copy_ah_attr_from_kern(_dst: *mut c_void, _src: *mut c_void) {}

/// `ibv_copy_path_rec_from_kern`: as above.
#[no_mangle]
pub extern "C" fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *mut c_void) {}
