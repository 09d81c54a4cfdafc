//! The structures of rdma-core's `infiniband/verbs.h` (v44, Debian 12),
//! and of `infiniband/mlx5dv.h` for DC QPs, laid out field for field as C
//! lays them out, under C's names so they can be diffed against the header. Only what this library fills or reads is
//! declared; `tests` compiles a C program against the installed header and
//! compares every `sizeof` and `offsetof` listed in [`layout_checks`].
//!
//! Unions are Rust unions (or the one member this library uses, where the
//! others are the same size: noted at the field).

// The C ABI's own names, as verbs.h spells them, so the two can be compared.
#![allow(non_camel_case_types)]
// pthread types and unions have no Debug; these are plain C data.
#![allow(missing_debug_implementations)]

use libc::{c_char, c_int, c_uint, c_void, pthread_cond_t, pthread_mutex_t, size_t};

/// `union ibv_gid`: 16 bytes, aligned as its `__be64` halves.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    /// The GID, network order.
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct _ibv_device_ops` (obsolete, kept for the layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct _ibv_device_ops {
    pub _dummy1: *mut c_void,
    pub _dummy2: *mut c_void,
}

/// `struct ibv_device`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// A function pointer slot of `ibv_context_ops` this library leaves NULL.
pub type Unused = Option<unsafe extern "C" fn()>;

/// `ibv_post_send`'s signature.
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ibv_post_recv`'s signature.
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ibv_post_srq_recv`'s signature.
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ibv_context_ops.alloc_mw` (`ibv_alloc_mw`).
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw;
/// `ibv_context_ops.bind_mw` (`ibv_bind_mw`).
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
/// `ibv_context_ops.dealloc_mw` (`ibv_dealloc_mw`).
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `ibv_poll_cq`'s signature.
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ibv_req_notify_cq`'s signature.
pub type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;

/// `struct ibv_context_ops`: the data path the header's inline functions
/// call through.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_context_ops {
    pub _compat_query_device: Unused,
    pub _compat_query_port: Unused,
    pub _compat_alloc_pd: Unused,
    pub _compat_dealloc_pd: Unused,
    pub _compat_reg_mr: Unused,
    pub _compat_rereg_mr: Unused,
    pub _compat_dereg_mr: Unused,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: Unused,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    pub _compat_cq_event: Unused,
    pub _compat_resize_cq: Unused,
    pub _compat_destroy_cq: Unused,
    pub _compat_create_srq: Unused,
    pub _compat_modify_srq: Unused,
    pub _compat_query_srq: Unused,
    pub _compat_destroy_srq: Unused,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: Unused,
    pub _compat_query_qp: Unused,
    pub _compat_modify_qp: Unused,
    pub _compat_destroy_qp: Unused,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: Unused,
    pub _compat_destroy_ah: Unused,
    pub _compat_attach_mcast: Unused,
    pub _compat_detach_mcast: Unused,
    pub _compat_async_event: Unused,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `verbs_context.query_port`.
pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, size_t) -> c_int;
/// `verbs_context.query_device_ex`.
pub type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut ibv_device_attr_ex, size_t) -> c_int;
/// `verbs_context.create_qp_ex`.
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
/// `verbs_context.create_cq_ex`.
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex`).
pub type QueryRtValuesFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_values_ex) -> c_int;
/// `verbs_context.get_srq_num`.
pub type GetSrqNumFn = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;
/// `verbs_context.reg_dm_mr`.
pub type RegDmMrFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, size_t, c_uint) -> *mut ibv_mr;
/// `verbs_context.alloc_dm`.
pub type AllocDmFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm;
/// `verbs_context.free_dm`.
pub type FreeDmFn = unsafe extern "C" fn(*mut ibv_dm) -> c_int;
/// `verbs_context.advise_mr` (`ibv_advise_mr`; the advice an `enum
/// ibv_advise_mr_advice`).
pub type AdviseMrFn = unsafe extern "C" fn(*mut ibv_pd, c_int, u32, *mut ibv_sge, u32) -> c_int;

/// `struct verbs_context`: the extended operations before the
/// `ibv_context` (which must be last); `sz` says how far back they reach.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Option<AdviseMrFn>,
    pub alloc_null_mr: Unused,
    pub read_counters: Unused,
    pub attach_counters_point_flow: Unused,
    pub create_counters: Unused,
    pub destroy_counters: Unused,
    pub reg_dm_mr: Option<RegDmMrFn>,
    pub alloc_dm: Option<AllocDmFn>,
    pub free_dm: Option<FreeDmFn>,
    pub modify_flow_action_esp: Unused,
    pub destroy_flow_action: Unused,
    pub create_flow_action_esp: Unused,
    pub modify_qp_rate_limit: Unused,
    pub alloc_parent_domain: Unused,
    pub dealloc_td: Unused,
    pub alloc_td: Unused,
    pub modify_cq: Unused,
    pub post_srq_ops: Unused,
    pub destroy_rwq_ind_table: Option<unsafe extern "C" fn(*mut ibv_rwq_ind_table) -> c_int>,
    pub create_rwq_ind_table: Option<
        unsafe extern "C" fn(
            *mut ibv_context,
            *mut ibv_rwq_ind_table_init_attr,
        ) -> *mut ibv_rwq_ind_table,
    >,
    pub destroy_wq: Option<unsafe extern "C" fn(*mut ibv_wq) -> c_int>,
    pub modify_wq: Option<unsafe extern "C" fn(*mut ibv_wq, *mut ibv_wq_attr) -> c_int>,
    pub create_wq:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_wq_init_attr) -> *mut ibv_wq>,
    pub query_rt_values: Option<QueryRtValuesFn>,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: Option<unsafe extern "C" fn(*mut ibv_flow) -> c_int>,
    pub abi_placeholder2: Unused,
    pub ibv_create_flow:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_flow_attr) -> *mut ibv_flow>,
    pub abi_placeholder1: Unused,
    pub open_qp: Unused,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<GetSrqNumFn>,
    pub create_srq_ex: Unused,
    pub open_xrcd: Unused,
    pub close_xrcd: Unused,
    pub _abi_placeholder3: u64,
    pub sz: size_t,
    pub context: ibv_context,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `struct ibv_tso_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

/// `struct ibv_values_ex` (`ibv_query_rt_values_ex`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_values_ex {
    pub comp_mask: u32,
    pub raw_clock: libc::timespec,
}

/// `struct ibv_flow` (`ibv_create_flow`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_flow {
    pub comp_mask: u32,
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_flow_attr`: its specs follow it in memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_attr {
    pub comp_mask: u32,
    pub type_: c_int,
    pub size: u16,
    pub priority: u16,
    pub num_of_specs: u8,
    pub port: u8,
    pub flags: u32,
}

/// `struct ibv_flow_spec` header: every spec starts with it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_spec_hdr {
    pub type_: c_int,
    pub size: u16,
}

/// `struct ibv_flow_eth_filter`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_eth_filter {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub ether_type: u16,
    pub vlan_tag: u16,
}

/// `struct ibv_flow_spec_eth`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_spec_eth {
    pub type_: c_int,
    pub size: u16,
    pub val: ibv_flow_eth_filter,
    pub mask: ibv_flow_eth_filter,
}

/// `struct ibv_flow_ipv4_filter`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_ipv4_filter {
    pub src_ip: u32,
    pub dst_ip: u32,
}

/// `struct ibv_flow_spec_ipv4`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_spec_ipv4 {
    pub type_: c_int,
    pub size: u16,
    pub val: ibv_flow_ipv4_filter,
    pub mask: ibv_flow_ipv4_filter,
}

/// `struct ibv_flow_ipv4_ext_filter`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_ipv4_ext_filter {
    pub src_ip: u32,
    pub dst_ip: u32,
    pub proto: u8,
    pub tos: u8,
    pub ttl: u8,
    pub flags: u8,
}

/// `struct ibv_flow_spec_ipv4_ext`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_spec_ipv4_ext {
    pub type_: c_int,
    pub size: u16,
    pub val: ibv_flow_ipv4_ext_filter,
    pub mask: ibv_flow_ipv4_ext_filter,
}

/// `struct ibv_flow_ipv6_filter`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_ipv6_filter {
    pub src_ip: [u8; 16],
    pub dst_ip: [u8; 16],
    pub flow_label: u32,
    pub next_hdr: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
}

/// `struct ibv_flow_spec_ipv6`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_spec_ipv6 {
    pub type_: c_int,
    pub size: u16,
    pub val: ibv_flow_ipv6_filter,
    pub mask: ibv_flow_ipv6_filter,
}

/// `struct ibv_flow_tcp_udp_filter`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_tcp_udp_filter {
    pub dst_port: u16,
    pub src_port: u16,
}

/// `struct ibv_flow_spec_tcp_udp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_flow_spec_tcp_udp {
    pub type_: c_int,
    pub size: u16,
    pub val: ibv_flow_tcp_udp_filter,
    pub mask: ibv_flow_tcp_udp_filter,
}

/// `struct ibv_wq`.
#[repr(C)]
pub struct ibv_wq {
    pub context: *mut ibv_context,
    pub wq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub cq: *mut ibv_cq,
    pub wq_num: u32,
    pub handle: u32,
    pub state: c_int,
    pub wq_type: c_int,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_wq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
    pub comp_mask: u32,
}

/// `struct ibv_wq_init_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_wq_init_attr {
    pub wq_context: *mut c_void,
    pub wq_type: c_int,
    pub max_wr: u32,
    pub max_sge: u32,
    pub pd: *mut ibv_pd,
    pub cq: *mut ibv_cq,
    pub comp_mask: u32,
    pub create_flags: u32,
}

/// `struct ibv_wq_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_wq_attr {
    pub attr_mask: u32,
    pub wq_state: c_int,
    pub curr_wq_state: c_int,
    pub flags: u32,
    pub flags_mask: u32,
}

/// `struct ibv_rwq_ind_table`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_rwq_ind_table {
    pub context: *mut ibv_context,
    pub ind_tbl_handle: c_int,
    pub ind_tbl_num: c_int,
    pub comp_mask: u32,
}

/// `struct ibv_rwq_ind_table_init_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_rwq_ind_table_init_attr {
    pub log_ind_tbl_size: u32,
    pub ind_tbl: *mut *mut ibv_wq,
    pub comp_mask: u32,
}

/// `struct ibv_pci_atomic_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_async_event` (`element` is a union of pointers and an int).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_async_event {
    pub element: *mut c_void,
    pub event_type: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`: one union.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `ibv_wc`'s fields, named once: `$m!($args.., [fields])`. The layout
/// checks against the header use them, and so does the compile-time check
/// that the driver's `Wc` is laid out the same (`datapath`).
macro_rules! ibv_wc_fields {
    ($m:ident $(, $arg:ident)*) => {
        $m!(
            $($arg,)*
            [
                wr_id,
                status,
                opcode,
                vendor_err,
                byte_len,
                imm_data,
                qp_num,
                src_qp,
                wc_flags,
                pkey_index,
                slid,
                sl,
                dlid_path_bits
            ]
        );
    };
}
pub(crate) use ibv_wc_fields;

/// `struct ibv_pd`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    pub type_: c_int,
}

/// `struct ibv_mw_bind`: `ibv_bind_mw`'s work request.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_alloc_dm_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_alloc_dm_attr {
    pub length: size_t,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

/// `ibv_dm`'s `memcpy_to_dm`.
pub type MemcpyToDmFn = unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, size_t) -> c_int;
/// `ibv_dm`'s `memcpy_from_dm`.
pub type MemcpyFromDmFn = unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, size_t) -> c_int;

/// `struct ibv_dm`: the header's `ibv_memcpy_to_dm` / `ibv_memcpy_from_dm`
/// call its pointers.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_dm {
    pub context: *mut ibv_context,
    pub memcpy_to_dm: Option<MemcpyToDmFn>,
    pub memcpy_from_dm: Option<MemcpyFromDmFn>,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: size_t,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_grh`: what a UD receive finds in its first 40 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_grh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `bind_mw` of `struct ibv_send_wr` (the larger member of its union
/// with `tso`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut c_void,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`: one union.
    pub imm_data: u32,
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type: u32,
    pub bind_mw: ibv_send_wr_bind_mw,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_data_buf`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: size_t,
}

/// `struct ibv_qp_ex`: the `ibv_wr_*` batch API, called through these
/// pointers by the header's inline functions.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, size_t)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, size_t, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, size_t, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

/// `struct mlx5dv_cqe_comp_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_cqe_comp_caps {
    pub max_num: u32,
    pub supported_format: u32,
}

/// `struct mlx5dv_sw_parsing_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_sw_parsing_caps {
    pub sw_parsing_offloads: u32,
    pub supported_qpts: u32,
}

/// `struct mlx5dv_striding_rq_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_striding_rq_caps {
    pub min_single_stride_log_num_of_bytes: u32,
    pub max_single_stride_log_num_of_bytes: u32,
    pub min_single_wqe_log_num_of_strides: u32,
    pub max_single_wqe_log_num_of_strides: u32,
    pub supported_qpts: u32,
}

/// `struct mlx5dv_sig_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_sig_caps {
    pub block_size: u64,
    pub block_prot: u32,
    pub t10dif_bg: u16,
    pub crc_type: u16,
}

/// `struct mlx5dv_dci_streams_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_dci_streams_caps {
    pub max_log_num_concurent: u8,
    pub max_log_num_errored: u8,
}

/// `struct mlx5dv_crypto_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_crypto_caps {
    pub failed_selftests: u16,
    pub crypto_engines: u8,
    pub wrapped_import_method: u8,
    pub log_max_num_deks: u8,
    pub flags: u32,
}

/// `struct mlx5dv_context` (`mlx5dv_query_device`), as rdma-core 44
/// lays it out; a caller's struct may end earlier (an older header), so
/// only the fields its `comp_mask` asks for are written.
#[repr(C)]
pub struct mlx5dv_context {
    pub version: u8,
    pub flags: u64,
    pub comp_mask: u64,
    pub cqe_comp_caps: mlx5dv_cqe_comp_caps,
    pub sw_parsing_caps: mlx5dv_sw_parsing_caps,
    pub striding_rq_caps: mlx5dv_striding_rq_caps,
    pub tunnel_offloads_caps: u32,
    pub max_dynamic_bfregs: u32,
    pub max_clock_info_update_nsec: u64,
    pub flow_action_flags: u32,
    pub dc_odp_caps: u32,
    pub hca_core_clock: *mut c_void,
    pub num_lag_ports: u8,
    pub sig_caps: mlx5dv_sig_caps,
    pub dci_streams_caps: mlx5dv_dci_streams_caps,
    pub max_wr_memcpy_length: size_t,
    pub crypto_caps: mlx5dv_crypto_caps,
}

/// The size of `struct mlx5dv_port` (`mlx5_ib_uapi_query_port`), which
/// `_mlx5dv_query_port` zeroes.
pub const MLX5DV_PORT_SIZE: usize = 40;

/// `struct mlx5dv_cq_init_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_cq_init_attr {
    pub comp_mask: u64,
    pub cqe_comp_res_format: u8,
    pub flags: u32,
    pub cqe_size: u16,
}

/// `struct mlx5dv_context_attr` (`mlx5dv_open_device`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_context_attr {
    pub flags: u32,
    pub comp_mask: u64,
}

/// `struct mlx5dv_devx_umem`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_devx_umem {
    pub umem_id: u32,
}

/// `struct mlx5dv_devx_umem_in` (`mlx5dv_devx_umem_reg_ex`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_devx_umem_in {
    pub addr: *mut c_void,
    pub size: size_t,
    pub access: u32,
    pub pgsz_bitmap: u64,
    pub comp_mask: u64,
    pub dmabuf_fd: c_int,
}

/// `struct mlx5dv_devx_uar`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_devx_uar {
    pub reg_addr: *mut c_void,
    pub base_addr: *mut c_void,
    pub page_id: u32,
    pub mmap_off: libc::off_t,
    pub comp_mask: u64,
}

/// `struct mlx5dv_clock_info` (`mlx5dv_get_clock_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_clock_info {
    pub nsec: u64,
    pub last_cycles: u64,
    pub frac: u64,
    pub mult: u32,
    pub shift: u32,
    pub mask: u64,
}

/// `struct mlx5dv_flow_match_parameters`: `match_sz` bytes of
/// `fte_match_param` follow it (`match_buf`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_flow_match_parameters {
    pub match_sz: size_t,
    pub match_buf: [u64; 0],
}

/// `struct mlx5dv_flow_matcher_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_flow_matcher_attr {
    pub type_: c_int,
    pub flags: u32,
    pub priority: u16,
    pub match_criteria_enable: u8,
    pub match_mask: *mut mlx5dv_flow_match_parameters,
    pub comp_mask: u64,
    pub ft_type: c_int,
}

/// `struct mlx5dv_flow_action_attr`: `obj` is the union's pointer (a QP
/// for `MLX5DV_FLOW_ACTION_DEST_IBV_QP`, or `tag_value` in its low bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_flow_action_attr {
    pub type_: c_int,
    pub obj: *mut c_void,
}

/// `struct mlx5dv_pd`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_pd {
    pub pdn: u32,
    pub comp_mask: u64,
}

/// One `in`/`out` pair of `struct mlx5dv_obj`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_obj_pair {
    pub in_: *mut c_void,
    pub out: *mut c_void,
}

/// `struct mlx5dv_obj` (`mlx5dv_init_obj`): `qp`, `cq`, `srq`, `rwq`,
/// `dm`, `ah`, `pd`, each an `in` object and an `out` structure.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_obj {
    pub qp: mlx5dv_obj_pair,
    pub cq: mlx5dv_obj_pair,
    pub srq: mlx5dv_obj_pair,
    pub rwq: mlx5dv_obj_pair,
    pub dm: mlx5dv_obj_pair,
    pub ah: mlx5dv_obj_pair,
    pub pd: mlx5dv_obj_pair,
}

/// `struct mlx5dv_mkey_init_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mlx5dv_mkey_init_attr {
    pub pd: *mut ibv_pd,
    pub create_flags: u32,
    pub max_entries: u16,
}

/// `struct mlx5dv_mkey`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_mkey {
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct mlx5dv_mkey_conf_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_mkey_conf_attr {
    pub conf_flags: u32,
    pub comp_mask: u64,
}

/// `struct mlx5dv_mr_interleaved`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_mr_interleaved {
    pub addr: u64,
    pub bytes_count: u32,
    pub bytes_skip: u32,
    pub lkey: u32,
}

/// `struct mlx5dv_dci_streams` (mlx5dv.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct mlx5dv_dci_streams {
    pub log_num_concurent: u8,
    pub log_num_errored: u8,
}

/// `struct mlx5dv_dc_init_attr`: `dct_access_key` (a DCT's) or
/// `dci_streams` (a DCI's) in one union, read by `dc_type`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mlx5dv_dc_init_attr {
    pub dc_type: c_int,
    pub u: mlx5dv_dc_init_attr_u,
}

/// The union of [`mlx5dv_dc_init_attr`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union mlx5dv_dc_init_attr_u {
    pub dct_access_key: u64,
    pub dci_streams: mlx5dv_dci_streams,
}

/// `struct mlx5dv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mlx5dv_qp_init_attr {
    pub comp_mask: u64,
    pub create_flags: u32,
    pub dc_init_attr: mlx5dv_dc_init_attr,
    pub send_ops_flags: u64,
}

/// `struct mlx5dv_qp_ex`: libmlx5's work-request setters beyond verbs'.
/// Only the DC address setters are filled (on a DCI); the rest are NULL,
/// as libmlx5 leaves those a QP was not made with.
#[repr(C)]
pub struct mlx5dv_qp_ex {
    pub comp_mask: u64,
    pub wr_set_dc_addr: Option<unsafe extern "C" fn(*mut mlx5dv_qp_ex, *mut ibv_ah, u32, u64)>,
    pub wr_mr_interleaved: Option<
        unsafe extern "C" fn(
            *mut mlx5dv_qp_ex,
            *mut mlx5dv_mkey,
            u32,
            u32,
            u16,
            *mut mlx5dv_mr_interleaved,
        ),
    >,
    pub wr_mr_list:
        Option<unsafe extern "C" fn(*mut mlx5dv_qp_ex, *mut mlx5dv_mkey, u32, u16, *mut ibv_sge)>,
    pub wr_mkey_configure: Option<
        unsafe extern "C" fn(*mut mlx5dv_qp_ex, *mut mlx5dv_mkey, u8, *mut mlx5dv_mkey_conf_attr),
    >,
    pub wr_set_mkey_access_flags: Option<unsafe extern "C" fn(*mut mlx5dv_qp_ex, u32)>,
    pub wr_set_mkey_layout_list:
        Option<unsafe extern "C" fn(*mut mlx5dv_qp_ex, u16, *const ibv_sge)>,
    pub wr_set_mkey_layout_interleaved:
        Option<unsafe extern "C" fn(*mut mlx5dv_qp_ex, u32, u16, *const mlx5dv_mr_interleaved)>,
    pub wr_set_mkey_sig_block: Option<unsafe extern "C" fn()>,
    pub wr_raw_wqe: Option<unsafe extern "C" fn()>,
    pub wr_set_dc_addr_stream:
        Option<unsafe extern "C" fn(*mut mlx5dv_qp_ex, *mut ibv_ah, u32, u64, u16)>,
    pub wr_memcpy: Option<unsafe extern "C" fn()>,
    pub wr_set_mkey_crypto: Option<unsafe extern "C" fn()>,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_cq_ex`: an `ibv_cq` (its first fields, `ibv_cq_ex_to_cq`
/// casts) with the extended poll API called through these pointers.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_ah`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// A `pthread_mutex_t` as `PTHREAD_MUTEX_INITIALIZER` makes it.
pub fn mutex_init() -> pthread_mutex_t {
    libc::PTHREAD_MUTEX_INITIALIZER
}

/// A `pthread_cond_t` as `PTHREAD_COND_INITIALIZER` makes it.
pub fn cond_init() -> pthread_cond_t {
    libc::PTHREAD_COND_INITIALIZER
}

/// One line the layout test compares: a C expression (`sizeof(struct x)`
/// or `offsetof(struct x, f)`) and what Rust says it is.
#[derive(Debug, Clone)]
pub struct LayoutCheck {
    /// The C expression.
    pub c_expr: String,
    /// Rust's value for it.
    pub rust: usize,
}

/// The C name of a field: its Rust name, or the one after `as` (a C
/// field named by a Rust keyword, `type` as `type_`).
macro_rules! c_field {
    ($f:ident) => {
        stringify!($f)
    };
    ($f:ident $c:ident) => {
        stringify!($c)
    };
}

macro_rules! layout {
    ($out:ident, $t:ident, [$($f:ident $(as $c:ident)?),* $(,)?]) => {
        $out.push(LayoutCheck {
            c_expr: format!("sizeof(struct {})", stringify!($t)),
            rust: std::mem::size_of::<$t>(),
        });
        $(
            $out.push(LayoutCheck {
                c_expr: format!("offsetof(struct {}, {})", stringify!($t), c_field!($f $($c)?)),
                rust: std::mem::offset_of!($t, $f),
            });
        )*
    };
}

/// Every size and field offset of the structures this library fills or
/// reads, for the test that compiles them against `verbs.h`.
pub fn layout_checks() -> Vec<LayoutCheck> {
    let mut v = Vec::new();
    layout!(
        v,
        ibv_gid_entry,
        [gid, gid_index, port_num, gid_type, ndev_ifindex]
    );
    layout!(
        v,
        ibv_device,
        [
            _ops,
            node_type,
            transport_type,
            name,
            dev_name,
            dev_path,
            ibdev_path
        ]
    );
    layout!(
        v,
        ibv_context_ops,
        [
            alloc_mw,
            bind_mw,
            dealloc_mw,
            poll_cq,
            req_notify_cq,
            post_srq_recv,
            post_send,
            post_recv,
            _compat_async_event
        ]
    );
    layout!(
        v,
        ibv_cq_ex,
        [
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed,
            comp_mask,
            status,
            wr_id,
            start_poll,
            next_poll,
            end_poll,
            read_opcode,
            read_vendor_err,
            read_byte_len,
            read_imm_data,
            read_qp_num,
            read_src_qp,
            read_wc_flags,
            read_slid,
            read_sl,
            read_dlid_path_bits,
            read_completion_ts,
            read_cvlan,
            read_flow_tag,
            read_tm_info,
            read_completion_wallclock_ns
        ]
    );
    layout!(v, ibv_poll_cq_attr, [comp_mask]);
    layout!(
        v,
        ibv_cq_init_attr_ex,
        [
            cqe,
            cq_context,
            channel,
            comp_vector,
            wc_flags,
            comp_mask,
            flags,
            parent_domain
        ]
    );
    layout!(
        v,
        ibv_context,
        [
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat
        ]
    );
    layout!(
        v,
        verbs_context,
        [
            query_port,
            create_cq_ex,
            query_device_ex,
            create_qp_ex,
            get_srq_num,
            close_xrcd,
            sz,
            context
        ]
    );
    layout!(
        v,
        ibv_device_attr,
        [
            fw_ver,
            node_guid,
            sys_image_guid,
            max_mr_size,
            page_size_cap,
            vendor_id,
            vendor_part_id,
            hw_ver,
            max_qp,
            max_qp_wr,
            device_cap_flags,
            max_sge,
            max_sge_rd,
            max_cq,
            max_cqe,
            max_mr,
            max_pd,
            max_qp_rd_atom,
            max_ee_rd_atom,
            max_res_rd_atom,
            max_qp_init_rd_atom,
            max_ee_init_rd_atom,
            atomic_cap,
            max_ee,
            max_rdd,
            max_mw,
            max_raw_ipv6_qp,
            max_raw_ethy_qp,
            max_mcast_grp,
            max_mcast_qp_attach,
            max_total_mcast_qp_attach,
            max_ah,
            max_fmr,
            max_map_per_fmr,
            max_srq,
            max_srq_wr,
            max_srq_sge,
            max_pkeys,
            local_ca_ack_delay,
            phys_port_cnt
        ]
    );
    layout!(
        v,
        ibv_device_attr_ex,
        [
            orig_attr,
            comp_mask,
            odp_caps,
            completion_timestamp_mask,
            hca_core_clock,
            device_cap_flags_ex,
            tso_caps,
            rss_caps,
            max_wq_type_rq,
            packet_pacing_caps,
            raw_packet_caps,
            tm_caps,
            cq_mod_caps,
            max_dm_size,
            pci_atomic_caps,
            xrc_odp_caps,
            phys_port_cnt_ex
        ]
    );
    layout!(
        v,
        ibv_port_attr,
        [
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            port_cap_flags,
            max_msg_sz,
            bad_pkey_cntr,
            qkey_viol_cntr,
            pkey_tbl_len,
            lid,
            sm_lid,
            lmc,
            max_vl_num,
            sm_sl,
            subnet_timeout,
            init_type_reply,
            active_width,
            active_speed,
            phys_state,
            link_layer,
            flags,
            port_cap_flags2
        ]
    );
    layout!(v, ibv_async_event, [element, event_type]);
    ibv_wc_fields!(layout, v, ibv_wc);
    layout!(v, ibv_pd, [context, handle]);
    layout!(v, ibv_alloc_dm_attr, [length, log_align_req, comp_mask]);
    layout!(v, ibv_mw_bind, [wr_id, send_flags, bind_info]);
    layout!(v, ibv_mw, [context, pd, rkey, handle, type_ as type]);
    layout!(
        v,
        ibv_dm,
        [context, memcpy_to_dm, memcpy_from_dm, comp_mask, handle]
    );
    layout!(v, ibv_mr, [context, pd, addr, length, handle, lkey, rkey]);
    layout!(
        v,
        ibv_global_route,
        [dgid, flow_label, sgid_index, hop_limit, traffic_class]
    );
    layout!(
        v,
        ibv_grh,
        [version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid]
    );
    layout!(
        v,
        ibv_ah_attr,
        [
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num
        ]
    );
    layout!(v, ibv_srq_attr, [max_wr, max_sge, srq_limit]);
    layout!(v, ibv_srq_init_attr, [srq_context, attr]);
    layout!(
        v,
        ibv_qp_cap,
        [
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data
        ]
    );
    layout!(
        v,
        ibv_qp_init_attr,
        [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all]
    );
    layout!(
        v,
        ibv_rx_hash_conf,
        [
            rx_hash_function,
            rx_hash_key_len,
            rx_hash_key,
            rx_hash_fields_mask
        ]
    );
    layout!(
        v,
        ibv_qp_init_attr_ex,
        [
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all,
            comp_mask,
            pd,
            xrcd,
            create_flags,
            max_tso_header,
            rwq_ind_tbl,
            rx_hash_conf,
            source_qpn,
            send_ops_flags
        ]
    );
    layout!(
        v,
        ibv_qp_attr,
        [
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit
        ]
    );
    layout!(v, ibv_sge, [addr, length, lkey]);
    layout!(
        v,
        ibv_send_wr,
        [wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, qp_type, bind_mw]
    );
    layout!(v, ibv_mw_bind_info, [mr, addr, length, mw_access_flags]);
    layout!(v, ibv_recv_wr, [wr_id, next, sg_list, num_sge]);
    layout!(
        v,
        ibv_srq,
        [
            context,
            srq_context,
            pd,
            handle,
            mutex,
            cond,
            events_completed
        ]
    );
    layout!(
        v,
        ibv_qp,
        [
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed
        ]
    );
    layout!(v, ibv_comp_channel, [context, fd, refcnt]);
    layout!(v, ibv_data_buf, [addr, length]);
    layout!(
        v,
        ibv_qp_ex,
        [
            qp_base,
            comp_mask,
            wr_id,
            wr_flags,
            wr_atomic_cmp_swp,
            wr_atomic_fetch_add,
            wr_bind_mw,
            wr_local_inv,
            wr_rdma_read,
            wr_rdma_write,
            wr_rdma_write_imm,
            wr_send,
            wr_send_imm,
            wr_send_inv,
            wr_send_tso,
            wr_set_ud_addr,
            wr_set_xrc_srqn,
            wr_set_inline_data,
            wr_set_inline_data_list,
            wr_set_sge,
            wr_set_sge_list,
            wr_start,
            wr_complete,
            wr_abort,
            wr_atomic_write
        ]
    );
    layout!(
        v,
        ibv_cq,
        [
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed
        ]
    );
    layout!(v, ibv_ah, [context, pd, handle]);
    layout!(
        v,
        mlx5dv_cq_init_attr,
        [comp_mask, cqe_comp_res_format, flags, cqe_size]
    );
    layout!(v, mlx5dv_mkey_init_attr, [pd, create_flags, max_entries]);
    layout!(v, mlx5dv_context_attr, [flags, comp_mask]);
    layout!(v, mlx5dv_devx_umem, [umem_id]);
    layout!(
        v,
        mlx5dv_devx_umem_in,
        [addr, size, access, pgsz_bitmap, comp_mask, dmabuf_fd]
    );
    layout!(
        v,
        mlx5dv_devx_uar,
        [reg_addr, base_addr, page_id, mmap_off, comp_mask]
    );
    layout!(v, mlx5dv_pd, [pdn, comp_mask]);
    layout!(v, mlx5dv_flow_match_parameters, [match_sz, match_buf]);
    layout!(
        v,
        mlx5dv_flow_matcher_attr,
        [
            type_ as type,
            flags,
            priority,
            match_criteria_enable,
            match_mask,
            comp_mask,
            ft_type
        ]
    );
    layout!(v, mlx5dv_flow_action_attr, [type_ as type, obj as qp]);
    layout!(
        v,
        mlx5dv_clock_info,
        [nsec, last_cycles, frac, mult, shift, mask]
    );
    layout!(v, ibv_values_ex, [comp_mask, raw_clock]);
    layout!(v, ibv_flow, [comp_mask, context, handle]);
    layout!(
        v,
        ibv_wq,
        [
            context,
            wq_context,
            pd,
            cq,
            wq_num,
            handle,
            state,
            wq_type,
            post_recv,
            mutex,
            cond,
            events_completed,
            comp_mask
        ]
    );
    layout!(
        v,
        ibv_wq_init_attr,
        [
            wq_context,
            wq_type,
            max_wr,
            max_sge,
            pd,
            cq,
            comp_mask,
            create_flags
        ]
    );
    layout!(
        v,
        ibv_wq_attr,
        [attr_mask, wq_state, curr_wq_state, flags, flags_mask]
    );
    layout!(
        v,
        ibv_rwq_ind_table,
        [context, ind_tbl_handle, ind_tbl_num, comp_mask]
    );
    layout!(
        v,
        ibv_rwq_ind_table_init_attr,
        [log_ind_tbl_size, ind_tbl, comp_mask]
    );
    layout!(
        v,
        ibv_rx_hash_conf,
        [
            rx_hash_function,
            rx_hash_key_len,
            rx_hash_key,
            rx_hash_fields_mask
        ]
    );
    layout!(
        v,
        ibv_flow_attr,
        [comp_mask, type_ as type, size, priority, num_of_specs, port, flags]
    );
    layout!(v, ibv_flow_spec_eth, [type_ as type, size, val, mask]);
    layout!(
        v,
        ibv_flow_eth_filter,
        [dst_mac, src_mac, ether_type, vlan_tag]
    );
    layout!(v, ibv_flow_spec_ipv4, [type_ as type, size, val, mask]);
    layout!(v, ibv_flow_spec_ipv4_ext, [type_ as type, size, val, mask]);
    layout!(
        v,
        ibv_flow_ipv4_ext_filter,
        [src_ip, dst_ip, proto, tos, ttl, flags]
    );
    layout!(v, ibv_flow_spec_ipv6, [type_ as type, size, val, mask]);
    layout!(
        v,
        ibv_flow_ipv6_filter,
        [
            src_ip,
            dst_ip,
            flow_label,
            next_hdr,
            traffic_class,
            hop_limit
        ]
    );
    layout!(v, ibv_flow_spec_tcp_udp, [type_ as type, size, val, mask]);
    layout!(v, mlx5dv_obj, [qp, cq, srq, rwq, dm, ah, pd]);
    layout!(v, mlx5dv_mkey, [lkey, rkey]);
    layout!(v, mlx5dv_mkey_conf_attr, [conf_flags, comp_mask]);
    layout!(
        v,
        mlx5dv_mr_interleaved,
        [addr, bytes_count, bytes_skip, lkey]
    );
    layout!(v, mlx5dv_cqe_comp_caps, [max_num, supported_format]);
    layout!(
        v,
        mlx5dv_sw_parsing_caps,
        [sw_parsing_offloads, supported_qpts]
    );
    layout!(
        v,
        mlx5dv_striding_rq_caps,
        [
            min_single_stride_log_num_of_bytes,
            max_single_stride_log_num_of_bytes,
            min_single_wqe_log_num_of_strides,
            max_single_wqe_log_num_of_strides,
            supported_qpts
        ]
    );
    layout!(
        v,
        mlx5dv_sig_caps,
        [block_size, block_prot, t10dif_bg, crc_type]
    );
    layout!(
        v,
        mlx5dv_dci_streams_caps,
        [max_log_num_concurent, max_log_num_errored]
    );
    layout!(
        v,
        mlx5dv_crypto_caps,
        [
            failed_selftests,
            crypto_engines,
            wrapped_import_method,
            log_max_num_deks,
            flags
        ]
    );
    layout!(
        v,
        mlx5dv_context,
        [
            version,
            flags,
            comp_mask,
            cqe_comp_caps,
            sw_parsing_caps,
            striding_rq_caps,
            tunnel_offloads_caps,
            max_dynamic_bfregs,
            max_clock_info_update_nsec,
            flow_action_flags,
            dc_odp_caps,
            hca_core_clock,
            num_lag_ports,
            sig_caps,
            dci_streams_caps,
            max_wr_memcpy_length,
            crypto_caps
        ]
    );
    layout!(v, mlx5dv_dci_streams, [log_num_concurent, log_num_errored]);
    layout!(v, mlx5dv_dc_init_attr, [dc_type]);
    layout!(
        v,
        mlx5dv_qp_init_attr,
        [comp_mask, create_flags, dc_init_attr, send_ops_flags]
    );
    layout!(
        v,
        mlx5dv_qp_ex,
        [
            comp_mask,
            wr_set_dc_addr,
            wr_mr_interleaved,
            wr_mr_list,
            wr_mkey_configure,
            wr_set_mkey_access_flags,
            wr_set_mkey_layout_list,
            wr_set_mkey_layout_interleaved,
            wr_set_mkey_sig_block,
            wr_raw_wqe,
            wr_set_dc_addr_stream,
            wr_memcpy,
            wr_set_mkey_crypto
        ]
    );
    let dc = std::mem::offset_of!(mlx5dv_dc_init_attr, u);
    for (path, off) in [
        (
            "dct_access_key",
            std::mem::offset_of!(mlx5dv_dc_init_attr_u, dct_access_key),
        ),
        (
            "dci_streams",
            std::mem::offset_of!(mlx5dv_dc_init_attr_u, dci_streams),
        ),
    ] {
        v.push(LayoutCheck {
            c_expr: format!("offsetof(struct mlx5dv_dc_init_attr, {path})"),
            rust: dc + off,
        });
    }
    // Members of unions, by their C paths.
    let wr = std::mem::offset_of!(ibv_send_wr, wr);
    for (path, off) in [
        (
            "wr.rdma.remote_addr",
            std::mem::offset_of!(ibv_send_wr_rdma, remote_addr),
        ),
        ("wr.rdma.rkey", std::mem::offset_of!(ibv_send_wr_rdma, rkey)),
        (
            "wr.atomic.remote_addr",
            std::mem::offset_of!(ibv_send_wr_atomic, remote_addr),
        ),
        (
            "wr.atomic.compare_add",
            std::mem::offset_of!(ibv_send_wr_atomic, compare_add),
        ),
        (
            "wr.atomic.swap",
            std::mem::offset_of!(ibv_send_wr_atomic, swap),
        ),
        (
            "wr.atomic.rkey",
            std::mem::offset_of!(ibv_send_wr_atomic, rkey),
        ),
        ("wr.ud.ah", std::mem::offset_of!(ibv_send_wr_ud, ah)),
        (
            "wr.ud.remote_qpn",
            std::mem::offset_of!(ibv_send_wr_ud, remote_qpn),
        ),
        (
            "wr.ud.remote_qkey",
            std::mem::offset_of!(ibv_send_wr_ud, remote_qkey),
        ),
    ] {
        v.push(LayoutCheck {
            c_expr: format!("offsetof(struct ibv_send_wr, {path})"),
            rust: wr + off,
        });
    }
    v.push(LayoutCheck {
        c_expr: "sizeof(struct mlx5dv_port)".into(),
        rust: MLX5DV_PORT_SIZE,
    });
    v.push(LayoutCheck {
        c_expr: "sizeof(union ibv_gid)".into(),
        rust: std::mem::size_of::<ibv_gid>(),
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles a C program against the installed `infiniband/verbs.h`
    /// (Debian's libibverbs-dev) that prints every size and offset
    /// [`layout_checks`] lists, and compares them with Rust's.
    #[test]
    fn layouts_match_verbs_h() {
        let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
        assert!(
            header.exists(),
            "NOT RUN: {} is missing (apt-get install libibverbs-dev; scripts/test-all.sh does)",
            header.display()
        );
        let checks = layout_checks();
        let mut c = String::from(
            "#include <infiniband/verbs.h>\n#include <infiniband/mlx5dv.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n",
        );
        for k in &checks {
            c.push_str(&format!("  printf(\"%zu\\n\", (size_t){});\n", k.c_expr));
        }
        c.push_str("  return 0;\n}\n");
        let dir = std::env::temp_dir().join(format!("ibverbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, c).unwrap();
        let cc = std::process::Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("running cc");
        assert!(
            cc.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = std::process::Command::new(&exe).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let c_values: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(c_values.len(), checks.len());
        let bad: Vec<String> = checks
            .iter()
            .zip(&c_values)
            .filter(|(k, c)| k.rust != **c)
            .map(|(k, c)| format!("{}: C {c}, Rust {}", k.c_expr, k.rust))
            .collect();
        std::fs::remove_dir_all(&dir).ok();
        assert!(bad.is_empty(), "layouts differ:\n{}", bad.join("\n"));
        assert!(checks.len() > 250, "{} checks", checks.len());
    }
}
