//! The `mlx5dv_*` (libmlx5.so.1, MLX5_1.x) and `efadv_*` (libefa.so.1,
//! EFA_1.1) entry points perftest links. This library is installed under
//! those names too (symlinks to one object), so a perftest binary finds
//! them here and never loads the distribution's providers, which need
//! libibverbs' private provider ABI.
//!
//! What the driver has is done: `mlx5dv_open_device` opens the device,
//! the `mlx5dv_devx_*` calls run raw commands under a DevX user context
//! (`crate::devx`), `mlx5dv_query_device` answers from the caps, `mlx5dv_create_qp` and
//! `mlx5dv_qp_ex_from_ibv_qp_ex` make DC QPs and their DC address setters
//! (`crate::dc`), and RC QPs with the mkey builders for
//! `mlx5dv_create_mkey`'s keys (`crate::mkey`). What it lacks answers
//! `EOPNOTSUPP` (crypto, DEKs, signature), and the EFA calls say this is
//! not an EFA device, as libefa does for a foreign context.

use libc::{c_int, c_void};

use crate::abi::*;
use crate::device::checked_ctx;
use crate::{null_errno, ret_errno};

/// `mlx5dv_open_device`: `ibv_open_device`; with
/// `MLX5DV_CONTEXT_FLAGS_DEVX` the context's DevX user context is made
/// now (NULL, errno EOPNOTSUPP, on a function without DevX) and its PDs
/// are that user context's (`crate::devx`).
#[no_mangle]
pub extern "C" fn mlx5dv_open_device(
    dev: *mut ibv_device,
    attr: *mut mlx5dv_context_attr,
) -> *mut ibv_context {
    const DEVX: u32 = 1 << 0;
    let flags = if attr.is_null() {
        0
    } else {
        // SAFETY: the caller's attributes, non-NULL.
        unsafe { (*attr).flags }
    };
    if flags & !DEVX != 0 {
        return null_errno(libc::EOPNOTSUPP);
    }
    let c = crate::device::ibv_open_device(dev);
    if c.is_null() || flags & DEVX == 0 {
        return c;
    }
    if let Err(e) = crate::devx::open(c) {
        crate::device::ibv_close_device(c);
        return null_errno(e);
    }
    c
}

/// `enum mlx5dv_context_comp_mask` bits `mlx5dv_query_device` answers.
mod ctx_mask {
    pub const CQE_COMPRESION: u64 = 1 << 0;
    pub const SWP: u64 = 1 << 1;
    pub const STRIDING_RQ: u64 = 1 << 2;
    pub const TUNNEL_OFFLOADS: u64 = 1 << 3;
    pub const CLOCK_INFO_UPDATE: u64 = 1 << 5;
    pub const FLOW_ACTION_FLAGS: u64 = 1 << 6;
    pub const DC_ODP_CAPS: u64 = 1 << 7;
    pub const HCA_CORE_CLOCK: u64 = 1 << 8;
    pub const NUM_LAG_PORTS: u64 = 1 << 9;
    pub const SIGNATURE_OFFLOAD: u64 = 1 << 10;
    pub const DCI_STREAMS: u64 = 1 << 11;
    pub const WR_MEMCPY_LENGTH: u64 = 1 << 12;
    pub const CRYPTO_OFFLOAD: u64 = 1 << 13;
}

/// `mlx5dv_query_device`, as libmlx5's `_mlx5dv_query_device`: `comp_mask`
/// in says which fields the caller's struct has and wants, `comp_mask`
/// out which were written. The DCI stream limits and the LAG port count
/// come from the HCA caps; what the driver does not do reads as none
/// (CQE compression, software parsing, striding RQ, tunnel offloads,
/// flow actions, signature and crypto offloads, MMO memcpy); DC's ODP
/// caps are the device's (`verbs::device::Context::odp_caps`). On a
/// device with a clock: how long a clock-info snapshot stays good
/// (`max_clock_info_update_nsec`) and where the internal timer is mapped
/// (`hca_core_clock`, two big-endian words). Not answered (its bit stays
/// clear): the dynamic bfreg count. `flags` is 0: CQEs are version 0
/// (QPs carry no user index), multi-packet send is not offered, and the
/// clock is free-running (no real-time stamps).
#[no_mangle]
pub extern "C" fn mlx5dv_query_device(c: *mut ibv_context, out: *mut mlx5dv_context) -> c_int {
    use ctx_mask::*;
    let Some(ctx) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    if out.is_null() {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the caller's struct: its first three fields always exist.
    let want = unsafe { (*out).comp_mask };
    let caps = ctx.vc.hca().caps().gen();
    let mut got = 0u64;
    // Each field is written only if asked for: the caller's struct may be
    // an older, shorter one.
    macro_rules! put {
        ($bit:expr, $field:ident, $v:expr) => {
            if want & $bit != 0 {
                // SAFETY: the caller asked for this field: its struct has it.
                unsafe { std::ptr::addr_of_mut!((*out).$field).write($v) };
                got |= $bit;
            }
        };
    }
    put!(
        CQE_COMPRESION,
        cqe_comp_caps,
        mlx5dv_cqe_comp_caps::default()
    );
    put!(SWP, sw_parsing_caps, mlx5dv_sw_parsing_caps::default());
    put!(
        STRIDING_RQ,
        striding_rq_caps,
        mlx5dv_striding_rq_caps::default()
    );
    put!(TUNNEL_OFFLOADS, tunnel_offloads_caps, 0);
    put!(FLOW_ACTION_FLAGS, flow_action_flags, 0);
    put!(DC_ODP_CAPS, dc_odp_caps, ctx.vc.odp_caps().dc_odp_caps);
    if let Ok(info) = ctx.vc.clock_info() {
        put!(
            CLOCK_INFO_UPDATE,
            max_clock_info_update_nsec,
            info.update_period_ns()
        );
        if let Ok(p) = ctx.vc.internal_timer_addr() {
            put!(HCA_CORE_CLOCK, hca_core_clock, p.cast_mut().cast());
        }
    }
    put!(NUM_LAG_PORTS, num_lag_ports, caps.num_lag_ports());
    put!(SIGNATURE_OFFLOAD, sig_caps, mlx5dv_sig_caps::default());
    let streams = if caps.dct() {
        mlx5dv_dci_streams_caps {
            max_log_num_concurent: caps.log_max_dci_stream_channels(),
            max_log_num_errored: caps.log_max_dci_errored_streams(),
        }
    } else {
        mlx5dv_dci_streams_caps::default()
    };
    put!(DCI_STREAMS, dci_streams_caps, streams);
    put!(WR_MEMCPY_LENGTH, max_wr_memcpy_length, 0);
    put!(CRYPTO_OFFLOAD, crypto_caps, mlx5dv_crypto_caps::default());
    // SAFETY: as above: the first three fields.
    unsafe {
        (*out).version = 0;
    }
    // SAFETY: as above.
    unsafe { (*out).flags = 0 };
    // SAFETY: as above.
    unsafe { (*out).comp_mask = got };
    0
}

/// `_mlx5dv_query_port` (`mlx5dv_query_port`): the port's vport,
/// VHCA-id and steering attributes. A function of this driver is neither
/// an eswitch representor in switchdev mode nor a multiport (LAG) one,
/// so, as mlx5_ib's `MLX5_IB_METHOD_QUERY_PORT` answers for such a
/// function, the struct comes back zeroed, `flags` 0: none of them is
/// reported. EINVAL for a port the device has not.
#[no_mangle]
pub extern "C" fn _mlx5dv_query_port(
    c: *mut ibv_context,
    port_num: u32,
    info: *mut c_void,
    info_len: usize,
) -> c_int {
    let Some(ctx) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    let ports = ctx.vc.hca().caps().gen().num_ports().max(1);
    if info.is_null() || port_num == 0 || port_num > u32::from(ports) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the caller's struct of `info_len` bytes; at most the
    // uapi struct's size is written.
    unsafe { std::ptr::write_bytes(info.cast::<u8>(), 0, info_len.min(MLX5DV_PORT_SIZE)) };
    0
}

/// `mlx5dv_crypto_login`: no crypto engine.
#[no_mangle]
pub extern "C" fn mlx5dv_crypto_login(_c: *mut ibv_context, _a: *mut c_void) -> c_int {
    ret_errno(libc::EOPNOTSUPP)
}

/// `mlx5dv_dek_create`: no crypto engine.
#[no_mangle]
pub extern "C" fn mlx5dv_dek_create(_c: *mut ibv_context, _a: *mut c_void) -> *mut c_void {
    null_errno(libc::EOPNOTSUPP)
}

/// `mlx5dv_dek_destroy`: none exist.
#[no_mangle]
pub extern "C" fn mlx5dv_dek_destroy(_dek: *mut c_void) -> c_int {
    ret_errno(libc::EINVAL)
}

/// `efadv_query_device`: not an EFA device.
#[no_mangle]
pub extern "C" fn efadv_query_device(_c: *mut ibv_context, _a: *mut c_void, _len: u32) -> c_int {
    ret_errno(libc::EOPNOTSUPP)
}

/// `efadv_create_qp_ex`: not an EFA device.
#[no_mangle]
pub extern "C" fn efadv_create_qp_ex(
    _c: *mut ibv_context,
    _a: *mut c_void,
    _e: *mut c_void,
    _len: u32,
) -> *mut ibv_qp {
    null_errno(libc::EOPNOTSUPP)
}

/// Entry points of libmlx5 / libefa this driver does not offer, exported
/// so that pyverbs' provider modules (loaded `RTLD_NOW`) load: each
/// answers as those libraries answer for a device without the feature.
macro_rules! not_offered {
    (ptr: $($p:ident),* ; int: $($i:ident),*) => {
        $(
            #[doc = concat!("`", stringify!($p), "`: not offered (NULL, errno EOPNOTSUPP).")]
            #[no_mangle]
            pub extern "C" fn $p() -> *mut c_void {
                null_errno(libc::EOPNOTSUPP)
            }
        )*
        $(
            #[doc = concat!("`", stringify!($i), "`: not offered (EOPNOTSUPP).")]
            #[no_mangle]
            pub extern "C" fn $i() -> c_int {
                ret_errno(libc::EOPNOTSUPP)
            }
        )*
    };
}

not_offered!(
    ptr: mlx5dv_alloc_var, mlx5dv_pp_alloc, mlx5dv_dm_map_op_addr, mlx5dv_devx_alloc_msi_vector, mlx5dv_devx_create_eq,
        efadv_create_driver_qp, efadv_cq_from_ibv_cq_ex, efadv_create_cq,
        mlx5dv_create_flow_action_packet_reformat, mlx5dv_crypto_login_create, mlx5dv_dr_action_create_default_miss, mlx5dv_dr_action_create_dest_array, mlx5dv_dr_action_create_dest_devx_tir, mlx5dv_dr_action_create_dest_ib_port, mlx5dv_dr_action_create_dest_ibv_qp, mlx5dv_dr_action_create_dest_table, mlx5dv_dr_action_create_dest_vport, mlx5dv_dr_action_create_drop, mlx5dv_dr_action_create_modify_header, mlx5dv_dr_action_create_flow_counter, mlx5dv_dr_action_create_flow_sampler, mlx5dv_dr_action_create_packet_reformat, mlx5dv_dr_action_create_pop_vlan, mlx5dv_dr_action_create_push_vlan, mlx5dv_dr_action_create_tag, mlx5dv_dr_domain_create, mlx5dv_dr_matcher_create, mlx5dv_dr_rule_create, mlx5dv_dr_table_create, mlx5dv_get_vfio_device_list, mlx5dv_sched_leaf_create, mlx5dv_sched_node_create;
    int: mlx5dv_free_var, mlx5dv_pp_free, mlx5dv_modify_qp_lag_port, mlx5dv_query_qp_lag_port, mlx5dv_modify_qp_sched_elem,
        mlx5dv_modify_qp_udp_sport, mlx5dv_reserved_qpn_alloc, mlx5dv_reserved_qpn_dealloc,
        mlx5dv_map_ah_to_qp, mlx5dv_qp_cancel_posted_send_wrs,
        mlx5dv_crypto_login_query_state, mlx5dv_crypto_logout,
        mlx5dv_devx_destroy_eq, mlx5dv_devx_free_msi_vector,
        efadv_query_ah,
        _mlx5dv_mkey_check, mlx5dv_crypto_login_destroy, mlx5dv_crypto_login_query, mlx5dv_dek_query, mlx5dv_dr_action_destroy, mlx5dv_dr_domain_allow_duplicate_rules, mlx5dv_dr_domain_destroy, mlx5dv_dr_domain_sync, mlx5dv_dr_matcher_destroy, mlx5dv_dr_matcher_set_layout, mlx5dv_dr_rule_destroy, mlx5dv_dr_table_destroy, mlx5dv_dump_dr_domain, mlx5dv_sched_leaf_destroy, mlx5dv_sched_leaf_modify, mlx5dv_sched_node_destroy, mlx5dv_sched_node_modify, mlx5dv_vfio_get_events_fd, mlx5dv_vfio_process_events
);

/// `mlx5dv_is_supported`: true for a device of this library (every one
/// is an mlx5 function), as libmlx5 answers for its own: the `mlx5dv_*`
/// calls above serve it; false for anything else.
#[no_mangle]
pub extern "C" fn mlx5dv_is_supported(dev: *mut ibv_device) -> bool {
    crate::device::is_our_device(dev)
}
