//! HCA capabilities: what the device can do (max) and what it is set to
//! do (current), per capability type, and the driver's choices.
//!
//! QUERY_HCA_CAP (0x100) with `op_mod = type << 1 | mode` (mode 1 =
//! current, 0 = max) returns one 4 KiB capability page; SET_HCA_CAP (0x109,
//! `op_mod = type << 1`) writes the current page back, changed. The driver
//! copies the kernel's choices (`handle_hca_cap*` in `main.c`) before
//! INIT_HCA, and re-reads every page after it.

use mlx5_hw::ifc::{query_hca_cap_in, query_hca_cap_out, set_hca_cap_in, set_hca_cap_out};
use mlx5_hw::ifc::{AtomicCaps, CmdHcaCap, CmdHcaCap2, DeviceMemCap, OdpCap, RoceCap};
use mlx5_hw::ifc::{QueryHcaCapIn, SetHcaCapIn};
use mlx5_hw::opcode::Opcode;

use crate::cmd::Cmd;
use crate::{Error, Result};

/// Capability types (`MLX5_CAP_*`, the `op_mod >> 1` of QUERY_HCA_CAP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapType {
    /// General device capabilities.
    General = 0x0,
    /// Ethernet offloads (`per_protocol_networking_offload_caps`).
    EthernetOffloads = 0x1,
    /// On-demand paging.
    Odp = 0x2,
    /// Atomic operations.
    Atomic = 0x3,
    /// RoCE.
    Roce = 0x4,
    /// Flow tables (`flow_table_nic_cap`).
    FlowTable = 0x7,
    /// Device memory.
    DevMem = 0xf,
    /// General capabilities, second page.
    General2 = 0x20,
}

/// Capability page size in bytes (the `hca_cap_union`).
pub const CAP_PAGE_BYTES: usize = mlx5_hw::ifc::hca_cap_union::SIZE_BYTES;
/// Byte offset of the capability in the QUERY_HCA_CAP outbox.
const CAP_OFFSET: usize = mlx5_hw::ifc::query_hca_cap_out::CAPABILITY.off / 8;
/// `atomic_req_8B_endianness_mode`: host endianness.
pub const ATOMIC_REQ_MODE_HOST_ENDIANNESS: u8 = mlx5_hw::init::ATOMIC_REQ_MODE_HOST_ENDIANNESS;
/// The kernel's default profile: log_max_qp at most 18.
pub const PROFILE_LOG_MAX_QP: u8 = 18;

/// One capability type's pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapPage {
    /// Current values.
    pub current: Vec<u8>,
    /// Maximum values.
    pub max: Vec<u8>,
}

/// Every capability page the driver read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caps {
    /// General (always present).
    pub general: CapPage,
    /// General 2 (if the max general caps advertise `hca_cap_2`).
    pub general_2: Option<CapPage>,
    /// Atomic (if `atomic`).
    pub atomic: Option<CapPage>,
    /// RoCE (if `roce`).
    pub roce: Option<CapPage>,
    /// ODP (if `pg`).
    pub odp: Option<CapPage>,
    /// Device memory (if `device_memory`).
    pub device_mem: Option<CapPage>,
}

/// The largest value of each `log_*` capability the driver computes with
/// that can mean anything: the PRM's field is wider (5, 6 or 8 bits) than
/// what the objects it sizes can hold. A larger value is firmware's error
/// ([`Error::BadCap`]), never a shift overflow.
pub mod log_limits {
    /// `log_max_qp_sz`: qpc `log_sq_size`/`log_rq_size` are 4 bits.
    pub const LOG_MAX_QP_SZ: u8 = 15;
    /// `log_max_srq_sz`: srqc/wq `log_wq_sz` is 5 bits; a WQE count is u32.
    pub const LOG_MAX_SRQ_SZ: u8 = 31;
    /// `log_max_cq_sz`: cqc `log_cq_size` is 5 bits; a CQE count is u32.
    pub const LOG_MAX_CQ_SZ: u8 = 31;
    /// `log_max_qp`, `log_max_cq`, `log_max_srq`, `log_max_pd`,
    /// `log_max_mkey`: object numbers (qpn, cqn, srqn, pd, mkey index) are
    /// 24 bits.
    pub const LOG_MAX_OBJECTS: u8 = 24;
    /// `log_max_ra_req_qp`, `log_max_ra_res_qp`: qpc `log_sra_max` and
    /// `log_rra_max` are 3 bits.
    pub const LOG_MAX_RA: u8 = 7;
    /// `log_max_msg`: a message length is u32 (2 GiB at most).
    pub const LOG_MAX_MSG: u8 = 31;
}

/// `1 << value` of capability `field`, or [`Error::BadCap`] naming it when
/// `value` exceeds `max` (see [`log_limits`]).
pub fn pow2_cap(field: &'static str, value: u8, max: u8) -> Result<u32> {
    if value > max {
        return Err(Error::BadCap {
            field,
            value: value.into(),
            max: max.into(),
        });
    }
    Ok(1u32 << value)
}

impl Caps {
    /// `1 << log_max_qp_sz`: WQEs in a send or receive queue, at most.
    pub fn max_qp_sz(&self) -> Result<u32> {
        let v = self.gen().log_max_qp_sz();
        pow2_cap("log_max_qp_sz", v, log_limits::LOG_MAX_QP_SZ)
    }
    /// `1 << log_max_srq_sz`: WQEs in an SRQ, at most.
    pub fn max_srq_sz(&self) -> Result<u32> {
        let v = self.gen().log_max_srq_sz();
        pow2_cap("log_max_srq_sz", v, log_limits::LOG_MAX_SRQ_SZ)
    }
    /// `1 << log_max_cq_sz`: CQEs in a CQ, at most.
    pub fn max_cq_sz(&self) -> Result<u32> {
        let v = self.gen().log_max_cq_sz();
        pow2_cap("log_max_cq_sz", v, log_limits::LOG_MAX_CQ_SZ)
    }
    /// `1 << log_max_qp`: QPs.
    pub fn max_qp(&self) -> Result<u32> {
        let v = self.gen().log_max_qp();
        pow2_cap("log_max_qp", v, log_limits::LOG_MAX_OBJECTS)
    }
    /// `1 << log_max_cq`: CQs.
    pub fn max_cq(&self) -> Result<u32> {
        let v = self.gen().log_max_cq();
        pow2_cap("log_max_cq", v, log_limits::LOG_MAX_OBJECTS)
    }
    /// `1 << log_max_srq`: SRQs.
    pub fn max_srq(&self) -> Result<u32> {
        let v = self.gen().log_max_srq();
        pow2_cap("log_max_srq", v, log_limits::LOG_MAX_OBJECTS)
    }
    /// `1 << log_max_pd`: protection domains.
    pub fn max_pd(&self) -> Result<u32> {
        let v = self.gen().log_max_pd();
        pow2_cap("log_max_pd", v, log_limits::LOG_MAX_OBJECTS)
    }
    /// `1 << log_max_mkey`: memory keys.
    pub fn max_mkey(&self) -> Result<u32> {
        let v = self.gen().log_max_mkey();
        pow2_cap("log_max_mkey", v, log_limits::LOG_MAX_OBJECTS)
    }
    /// `1 << log_max_ra_req_qp`: RDMA reads and atomics a QP may have
    /// outstanding as requester.
    pub fn max_ra_req_qp(&self) -> Result<u32> {
        let v = self.gen().log_max_ra_req_qp();
        pow2_cap("log_max_ra_req_qp", v, log_limits::LOG_MAX_RA)
    }
    /// `1 << log_max_ra_res_qp`: the same as responder.
    pub fn max_ra_res_qp(&self) -> Result<u32> {
        let v = self.gen().log_max_ra_res_qp();
        pow2_cap("log_max_ra_res_qp", v, log_limits::LOG_MAX_RA)
    }
    /// `1 << log_max_msg`: the longest message, in bytes.
    pub fn max_msg(&self) -> Result<u32> {
        let v = self.gen().log_max_msg();
        pow2_cap("log_max_msg", v, log_limits::LOG_MAX_MSG)
    }

    /// The EQs the function may create, as Linux's `mlx5_max_eq_cap_get`
    /// reads them: `max_num_eqs_24b` (general 2), else `max_num_eqs`, else
    /// `1 << log_max_eq`.
    pub fn max_eqs(&self) -> u32 {
        if let Some(n) = self.gen2().map(|g| g.max_num_eqs_24b()).filter(|n| *n != 0) {
            return n;
        }
        let g = self.gen();
        match g.max_num_eqs() {
            0 => 1u32 << g.log_max_eq(),
            n => n.into(),
        }
    }

    /// Current general caps.
    pub fn gen(&self) -> CmdHcaCap<&[u8]> {
        CmdHcaCap::new_unchecked(&self.general.current[..])
    }
    /// Maximum general caps.
    pub fn gen_max(&self) -> CmdHcaCap<&[u8]> {
        CmdHcaCap::new_unchecked(&self.general.max[..])
    }
    /// Current general-2 caps.
    pub fn gen2(&self) -> Option<CmdHcaCap2<&[u8]>> {
        self.general_2
            .as_ref()
            .map(|p| CmdHcaCap2::new_unchecked(&p.current[..]))
    }
    /// Current atomic caps.
    pub fn atomic(&self) -> Option<AtomicCaps<&[u8]>> {
        self.atomic
            .as_ref()
            .map(|p| AtomicCaps::new_unchecked(&p.current[..]))
    }
    /// Current RoCE caps.
    pub fn roce(&self) -> Option<RoceCap<&[u8]>> {
        self.roce
            .as_ref()
            .map(|p| RoceCap::new_unchecked(&p.current[..]))
    }
    /// Current ODP caps.
    pub fn odp(&self) -> Option<OdpCap<&[u8]>> {
        self.odp
            .as_ref()
            .map(|p| OdpCap::new_unchecked(&p.current[..]))
    }
    /// Current device-memory caps.
    pub fn device_mem(&self) -> Option<DeviceMemCap<&[u8]>> {
        self.device_mem
            .as_ref()
            .map(|p| DeviceMemCap::new_unchecked(&p.current[..]))
    }

    /// Reads every page the general caps say exist.
    pub fn query_all(cmd: &Cmd) -> Result<Self> {
        let general = query_page(cmd, CapType::General)?;
        let (cur, max) = (
            CmdHcaCap::new_unchecked(&general.current[..]),
            CmdHcaCap::new_unchecked(&general.max[..]),
        );
        let opt = |want: bool, t| -> Result<Option<CapPage>> {
            if want {
                query_page(cmd, t).map(Some)
            } else {
                Ok(None)
            }
        };
        let general_2 = opt(max.hca_cap_2(), CapType::General2)?;
        let atomic = opt(cur.atomic(), CapType::Atomic)?;
        let roce = opt(cur.roce(), CapType::Roce)?;
        let odp = opt(cur.pg(), CapType::Odp)?;
        let device_mem = opt(cur.device_memory(), CapType::DevMem)?;
        Ok(Self {
            general,
            general_2,
            atomic,
            roce,
            odp,
            device_mem,
        })
    }
}

/// QUERY_HCA_CAP of one type and mode (`current` true = current values).
pub fn query_cap(cmd: &Cmd, t: CapType, current: bool) -> Result<Vec<u8>> {
    let mut inb = [0u8; query_hca_cap_in::SIZE_BYTES];
    QueryHcaCapIn::new_unchecked(&mut inb[..])
        .set_opcode(Opcode::QueryHcaCap.to_raw())
        .set_op_mod(((t as u16) << 1) | u16::from(current));
    let out = cmd.exec(&inb, query_hca_cap_out::SIZE_BYTES)?;
    let mut page = out[CAP_OFFSET.min(out.len())..].to_vec();
    page.resize(CAP_PAGE_BYTES, 0);
    Ok(page)
}

/// Current and max of one type.
pub fn query_page(cmd: &Cmd, t: CapType) -> Result<CapPage> {
    Ok(CapPage {
        current: query_cap(cmd, t, true)?,
        max: query_cap(cmd, t, false)?,
    })
}

/// SET_HCA_CAP of one type with `page` as the new current values.
pub fn set_cap(cmd: &Cmd, t: CapType, page: &[u8]) -> Result<()> {
    let mut inb = vec![0u8; set_hca_cap_in::SIZE_BYTES];
    SetHcaCapIn::new_unchecked(&mut inb[..])
        .set_opcode(Opcode::SetHcaCap.to_raw())
        .set_op_mod((t as u16) << 1);
    let n = page.len().min(CAP_PAGE_BYTES);
    inb[CAP_OFFSET..CAP_OFFSET + n].copy_from_slice(&page[..n]);
    cmd.exec(&inb, set_hca_cap_out::SIZE_BYTES).map(|_| ())
}

/// Host page shift (the kernel's PAGE_SHIFT).
pub fn host_page_shift() -> u32 {
    // The driver maps memory in 4 KiB units; a host with larger pages is
    // detected through the page size the OS reports.
    static SHIFT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SHIFT.get_or_init(|| page_size().trailing_zeros())
}

fn page_size() -> usize {
    // sysconf is safe to call but `libc::sysconf` is an `unsafe fn` binding:
    // read it from the auxiliary files instead, falling back to 4 KiB.
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("KernelPageSize:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<usize>().ok())
                })
        })
        .map(|kb| kb * 1024)
        .unwrap_or(4096)
}

/// The kernel's general-cap choices (`handle_hca_cap`), applied to a copy
/// of the current page given the max page and the host's page shift.
pub fn general_choices(cur: &[u8], max: &[u8], page_shift: u32) -> Vec<u8> {
    let mut set = cur.to_vec();
    set.resize(CAP_PAGE_BYTES, 0);
    let m = CmdHcaCap::new_unchecked(max);
    let c = CmdHcaCap::new_unchecked(cur);
    let mut s = CmdHcaCap::new_unchecked(&mut set[..]);
    // pkey table of 128 entries (firmware encoding 0).
    s.set_pkey_table_size(0);
    s.set_log_max_qp(PROFILE_LOG_MAX_QP.min(m.log_max_qp()));
    s.set_cmdif_checksum(0);
    if m.uar_4k() && page_shift > 12 {
        s.set_uar_4k(true);
    }
    s.set_log_uar_page_sz(page_shift.saturating_sub(12) as u16);
    if m.cache_line_128byte() {
        // x86 and arm64 caches use 64-byte lines.
        s.set_cache_line_128byte(false);
    }
    if m.dct() {
        s.set_dct(true);
    }
    if m.pci_sync_for_fw_update_event() {
        s.set_pci_sync_for_fw_update_event(true);
    }
    if m.pci_sync_for_fw_update_with_driver_unload() {
        s.set_pci_sync_for_fw_update_with_driver_unload(true);
    }
    if m.pcie_reset_using_hotreset_method() {
        s.set_pcie_reset_using_hotreset_method(true);
    }
    if m.num_vhca_ports() != 0 {
        s.set_num_vhca_ports(m.num_vhca_ports());
    }
    if m.release_all_pages() {
        s.set_release_all_pages(true);
    }
    if m.mkey_by_name() {
        s.set_mkey_by_name(true);
    }
    if m.num_total_dynamic_vf_msix() != 0 {
        s.set_num_total_dynamic_vf_msix(m.num_total_dynamic_vf_msix());
    }
    if c.roce_rw_supported() && m.roce() {
        s.set_roce(true);
    }
    set
}

/// Applies the kernel's SET_HCA_CAP calls: general, then ATOMIC (requester
/// endianness = host) and ROCE (`sw_r_roce_src_udp_port`) where it does.
pub fn set_kernel_choices(cmd: &Cmd) -> Result<()> {
    let gen = query_page(cmd, CapType::General)?;
    let set = general_choices(&gen.current, &gen.max, host_page_shift());
    set_cap(cmd, CapType::General, &set)?;
    let c = CmdHcaCap::new_unchecked(&gen.current[..]);
    if c.atomic() {
        let a = query_page(cmd, CapType::Atomic)?;
        if AtomicCaps::new_unchecked(&a.current[..]).supported_atomic_req_8B_endianness_mode_1() {
            let mut set = vec![0u8; CAP_PAGE_BYTES];
            AtomicCaps::new_unchecked(&mut set[..])
                .set_atomic_req_8B_endianness_mode(ATOMIC_REQ_MODE_HOST_ENDIANNESS);
            set_cap(cmd, CapType::Atomic, &set)?;
        }
    }
    if c.roce() {
        let r = query_page(cmd, CapType::Roce)?;
        let (rc, rm) = (
            RoceCap::new_unchecked(&r.current[..]),
            RoceCap::new_unchecked(&r.max[..]),
        );
        if !rc.sw_r_roce_src_udp_port() && rm.sw_r_roce_src_udp_port() {
            let mut set = r.current.clone();
            let qp_ooo = rm.qp_ooo_transmit_default();
            let mut s = RoceCap::new_unchecked(&mut set[..]);
            s.set_sw_r_roce_src_udp_port(true);
            if qp_ooo {
                s.set_qp_ooo_transmit_default(true);
            }
            set_cap(cmd, CapType::Roce, &set)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn general_choices_follow_the_kernel() {
        let cur = vec![0u8; CAP_PAGE_BYTES];
        let mut max = vec![0u8; CAP_PAGE_BYTES];
        {
            let mut m = CmdHcaCap::new_unchecked(&mut max[..]);
            m.set_log_max_qp(24)
                .set_dct(true)
                .set_release_all_pages(true)
                .set_uar_4k(true)
                .set_cmdif_checksum(3);
        }
        let mut cur2 = cur.clone();
        CmdHcaCap::new_unchecked(&mut cur2[..]).set_cmdif_checksum(2);
        let set = general_choices(&cur2, &max, 12);
        let s = CmdHcaCap::new_unchecked(&set[..]);
        assert_eq!(s.log_max_qp(), 18);
        assert!(s.dct());
        assert!(s.release_all_pages());
        assert!(!s.uar_4k(), "4 KiB host pages: no uar_4k");
        assert_eq!(s.cmdif_checksum(), 0);
        assert_eq!(s.log_uar_page_sz(), 0);
        let set = general_choices(&cur, &max, 16);
        let s = CmdHcaCap::new_unchecked(&set[..]);
        assert!(s.uar_4k());
        assert_eq!(s.log_uar_page_sz(), 4);
        // A small device keeps its own limit.
        CmdHcaCap::new_unchecked(&mut max[..])
            .set_log_max_qp(10)
            .set_dct(false);
        let set = general_choices(&cur, &max, 12);
        let s = CmdHcaCap::new_unchecked(&set[..]);
        assert_eq!(s.log_max_qp(), 10);
        assert!(!s.dct());
    }
}
