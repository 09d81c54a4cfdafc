//! Card profiles: PCI identity, BAR size, MSI-X vectors, firmware version,
//! and the capability pages firmware reports (ConnectX-4's taken from a real
//! card's bring-up trace; later generations raise a few fields).

use std::collections::BTreeMap;

use mlx5_hw::bits::BitField;
use mlx5_hw::ifc::{
    atomic_caps, cmd_hca_cap, cmd_hca_cap_2, device_mem_cap, flow_table_nic_cap,
    flow_table_prop_layout, odp_scheme_cap, per_protocol_networking_offload_caps as eth_cap,
    roce_cap,
};

/// The ConnectX-4 capability pages and QUERY_ADAPTER block, from the trace.
const CX4_DATA: &str = include_str!("../profiles/connectx4-caps.txt");

/// Size of one capability page (QUERY_HCA_CAP payload), in bytes.
pub const CAP_PAGE_SIZE: usize = mlx5_hw::ifc::hca_cap_union::SIZE_BYTES;

/// Capability types (QUERY_HCA_CAP op_mod >> 1) the model answers.
pub mod cap_type {
    /// General device capabilities (`cmd_hca_cap`).
    pub const GENERAL: u16 = 0x0;
    /// Ethernet offloads.
    pub const ETHERNET_OFFLOADS: u16 = 0x1;
    /// On-demand paging.
    pub const ODP: u16 = 0x2;
    /// Atomic operations.
    pub const ATOMIC: u16 = 0x3;
    /// RoCE.
    pub const ROCE: u16 = 0x4;
    /// NIC flow tables.
    pub const FLOW_TABLE: u16 = 0x7;
    /// E-Switch flow tables (FDB), for an e-switch manager.
    pub const ESWITCH_FLOW_TABLE: u16 = 0x8;
    /// E-Switch, for an e-switch manager.
    pub const ESWITCH: u16 = 0x9;
    /// Device memory.
    pub const DEV_MEM: u16 = 0xf;
    /// General device capabilities, second page (`cmd_hca_cap_2`).
    pub const GENERAL_2: u16 = 0x20;
}

/// A ConnectX generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Profile {
    /// ConnectX-4 Lx (0x1015), firmware 14.12.1220: the traced card (firmware
    /// 14.x and board MT_2430110027 are the Lx's; a ConnectX-4 runs 12.x).
    #[default]
    ConnectX4Lx,
    /// ConnectX-5 (0x1017).
    ConnectX5,
    /// ConnectX-6 (0x101b).
    ConnectX6,
    /// ConnectX-7 (0x1021).
    ConnectX7,
}

impl Profile {
    /// Every profile.
    pub const ALL: [Profile; 4] = [
        Profile::ConnectX4Lx,
        Profile::ConnectX5,
        Profile::ConnectX6,
        Profile::ConnectX7,
    ];

    /// PCI device id.
    pub const fn device_id(self) -> u16 {
        match self {
            Profile::ConnectX4Lx => 0x1015,
            Profile::ConnectX5 => 0x1017,
            Profile::ConnectX6 => 0x101b,
            Profile::ConnectX7 => 0x1021,
        }
    }

    /// The chip's hardware id (crspace register 0xf0014, bits 15:0, as
    /// mstflint's device table names them).
    pub const fn hw_id(self) -> u32 {
        match self {
            Profile::ConnectX4Lx => 0x20b,
            Profile::ConnectX5 => 0x20d,
            Profile::ConnectX6 => 0x20f,
            Profile::ConnectX7 => 0x218,
        }
    }

    /// PCI subsystem id (the Mellanox retail board ids).
    pub const fn subsystem_id(self) -> u16 {
        match self {
            Profile::ConnectX4Lx => 0x0008,
            Profile::ConnectX5 => 0x0008,
            Profile::ConnectX6 => 0x0006,
            Profile::ConnectX7 => 0x0020,
        }
    }

    /// PCI revision id.
    pub const fn revision(self) -> u8 {
        0x00
    }

    /// Human name.
    pub const fn name(self) -> &'static str {
        match self {
            Profile::ConnectX4Lx => "ConnectX-4 Lx",
            Profile::ConnectX5 => "ConnectX-5",
            Profile::ConnectX6 => "ConnectX-6",
            Profile::ConnectX7 => "ConnectX-7",
        }
    }

    /// Short name (`cx4lx`).
    pub const fn short(self) -> &'static str {
        match self {
            Profile::ConnectX4Lx => "cx4lx",
            Profile::ConnectX5 => "cx5",
            Profile::ConnectX6 => "cx6",
            Profile::ConnectX7 => "cx7",
        }
    }

    /// BAR0 size in bytes (32 MiB on ConnectX-4/5, 64 MiB later).
    pub const fn bar0_size(self) -> u64 {
        match self {
            Profile::ConnectX4Lx | Profile::ConnectX5 => 32 << 20,
            Profile::ConnectX6 | Profile::ConnectX7 => 64 << 20,
        }
    }

    /// The PCIe link the card trains to: (speed, width), speed as the link
    /// capabilities register encodes it (3 = 8 GT/s Gen3, 4 = 16 GT/s Gen4,
    /// 5 = 32 GT/s Gen5). ConnectX-4 Lx: Gen3 x8; ConnectX-5: Gen3 x16;
    /// ConnectX-6: Gen4 x16; ConnectX-7: Gen5 x16.
    pub const fn pcie_link(self) -> (u8, u8) {
        match self {
            Profile::ConnectX4Lx => (3, 8),
            Profile::ConnectX5 => (3, 16),
            Profile::ConnectX6 => (4, 16),
            Profile::ConnectX7 => (5, 16),
        }
    }

    /// MSI-X vectors.
    pub const fn msix_vectors(self) -> u32 {
        match self {
            Profile::ConnectX4Lx => 64,
            Profile::ConnectX5 => 64,
            Profile::ConnectX6 | Profile::ConnectX7 => 128,
        }
    }

    /// Firmware version (major, minor, subminor).
    pub const fn fw_version(self) -> (u16, u16, u16) {
        match self {
            Profile::ConnectX4Lx => (14, 12, 1220),
            Profile::ConnectX5 => (16, 35, 2000),
            Profile::ConnectX6 => (20, 39, 1002),
            Profile::ConnectX7 => (28, 39, 1002),
        }
    }

    /// Pages firmware asks for at boot (QUERY_PAGES op_mod 1; CX4: the trace).
    pub const fn boot_pages(self) -> u32 {
        match self {
            Profile::ConnectX4Lx => 6,
            _ => 8,
        }
    }

    /// Pages firmware asks for before INIT_HCA (QUERY_PAGES op_mod 2; CX4: the trace).
    pub const fn init_pages(self) -> u32 {
        match self {
            Profile::ConnectX4Lx => 0x3244,
            Profile::ConnectX5 => 0x2c00,
            Profile::ConnectX6 | Profile::ConnectX7 => 0x2400,
        }
    }

    /// The ISSI values firmware supports (bit i = ISSI i; CX4: the trace).
    pub const fn supported_issi(self) -> u32 {
        0x2
    }

    /// The capability pages of this profile.
    pub fn caps(self) -> CapPages {
        let mut caps = CapPages::parse(CX4_DATA);
        if self != Profile::ConnectX4Lx {
            caps.raise(self);
        }
        // Firmware 14.12 gives the device (internal timer) frequency only in
        // MHz (275 in the trace); later firmware also fills
        // device_frequency_khz, the one field Linux 6.12 reads (it refuses
        // to start the PTP clock on 0). Same frequency, in kHz.
        {
            use mlx5_hw::ifc::cmd_hca_cap as g;
            let mhz = caps.get(cap_type::GENERAL, g::DEVICE_FREQUENCY_MHZ);
            if caps.get(cap_type::GENERAL, g::DEVICE_FREQUENCY_KHZ) == 0 {
                caps.set_both(cap_type::GENERAL, g::DEVICE_FREQUENCY_KHZ, mhz * 1000);
            }
        }
        // An e-switch manager answers QUERY_HCA_CAP for the e-switch pages
        // (Linux queries them whenever eswitch_manager is set). The traced
        // kernel never asked, so their contents are unknown: they offer
        // nothing (no FDB, no e-switch features).
        if caps.get(
            cap_type::GENERAL,
            mlx5_hw::ifc::cmd_hca_cap::ESWITCH_MANAGER,
        ) == 1
        {
            for ty in [cap_type::ESWITCH_FLOW_TABLE, cap_type::ESWITCH] {
                caps.cur.entry(ty).or_insert_with(|| vec![0; CAP_PAGE_SIZE]);
                caps.max.entry(ty).or_insert_with(|| vec![0; CAP_PAGE_SIZE]);
            }
        }
        caps
    }
}

/// Capability pages (current and max per type) and the QUERY_ADAPTER block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapPages {
    /// Current values, by capability type.
    pub cur: BTreeMap<u16, Vec<u8>>,
    /// Maximum values, by capability type.
    pub max: BTreeMap<u16, Vec<u8>>,
    /// The `query_adapter_param_block`.
    pub adapter: Vec<u8>,
}

impl CapPages {
    /// Parses the profile text format (sections `[cap <type> cur|max]` and
    /// `[query_adapter]`, hex lines `off: dw dw dw dw`). Lines that do not
    /// parse are skipped with a warning; it never panics.
    pub fn parse(text: &str) -> Self {
        let mut cur = BTreeMap::new();
        let mut max = BTreeMap::new();
        let mut adapter = vec![0u8; 0x100];
        enum Sect {
            None,
            Cur(u16),
            Max(u16),
            Adapter,
        }
        let mut sect = Sect::None;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            if let Some(h) = line.strip_prefix('[') {
                let h = h.trim_end_matches(']');
                let w: Vec<&str> = h.split_whitespace().collect();
                sect = match w.as_slice() {
                    ["cap", t, k] => {
                        let t =
                            u16::from_str_radix(t.trim_start_matches("0x"), 16).unwrap_or(0xffff);
                        match *k {
                            "cur" => Sect::Cur(t),
                            "max" => Sect::Max(t),
                            _ => Sect::None,
                        }
                    }
                    ["query_adapter"] => Sect::Adapter,
                    _ => {
                        tracing::warn!(line = n + 1, "profile: unknown section");
                        Sect::None
                    }
                };
                match sect {
                    Sect::Cur(t) => {
                        cur.insert(t, vec![0u8; CAP_PAGE_SIZE]);
                    }
                    Sect::Max(t) => {
                        max.insert(t, vec![0u8; CAP_PAGE_SIZE]);
                    }
                    _ => {}
                }
                continue;
            }
            let Some((off, words)) = line.split_once(':') else {
                tracing::warn!(line = n + 1, "profile: not a hex line");
                continue;
            };
            let Ok(off) = usize::from_str_radix(off.trim(), 16) else {
                continue;
            };
            let buf: &mut Vec<u8> = match sect {
                Sect::Cur(t) => match cur.get_mut(&t) {
                    Some(b) => b,
                    None => continue,
                },
                Sect::Max(t) => match max.get_mut(&t) {
                    Some(b) => b,
                    None => continue,
                },
                Sect::Adapter => &mut adapter,
                Sect::None => continue,
            };
            for (i, w) in words.split_whitespace().enumerate() {
                let Ok(v) = u32::from_str_radix(w, 16) else {
                    continue;
                };
                let at = off + i * 4;
                if let Some(d) = buf.get_mut(at..at + 4) {
                    d.copy_from_slice(&v.to_be_bytes());
                }
            }
        }
        // Types the card reports with an all-zero page (not in the trace:
        // ODP without `pg`, no device memory, no general_2 page).
        for t in [cap_type::ODP, cap_type::DEV_MEM, cap_type::GENERAL_2] {
            cur.entry(t).or_insert_with(|| vec![0u8; CAP_PAGE_SIZE]);
            max.entry(t).or_insert_with(|| vec![0u8; CAP_PAGE_SIZE]);
        }
        Self { cur, max, adapter }
    }

    /// Reads a field of a current page.
    pub fn get(&self, ty: u16, f: BitField) -> u64 {
        self.cur.get(&ty).map_or(0, |p| f.get(p))
    }

    fn set_both(&mut self, ty: u16, f: BitField, v: u64) {
        for m in [&mut self.cur, &mut self.max] {
            if let Some(p) = m.get_mut(&ty) {
                f.set(p, v);
            }
        }
    }

    /// What later generations add over ConnectX-4 (a few real raises).
    fn raise(&mut self, p: Profile) {
        use cap_type::*;
        // ConnectX-5: DCT, device memory, general_2 page, ODP, 64 KiB-page
        // UARs per 4 KiB, more QPs.
        self.set_both(GENERAL, cmd_hca_cap::DCT, 1);
        self.set_both(GENERAL, cmd_hca_cap::HCA_CAP_2, 1);
        self.set_both(GENERAL, cmd_hca_cap::DEVICE_MEMORY, 1);
        self.set_both(GENERAL, cmd_hca_cap::PG, 1);
        self.set_both(GENERAL, cmd_hca_cap::FAST_TEARDOWN, 1);
        self.set_both(GENERAL, cmd_hca_cap::UAR_4K, 0);
        if let Some(m) = self.max.get_mut(&GENERAL) {
            cmd_hca_cap::UAR_4K.set(m, 1);
        }
        self.set_both(DEV_MEM, device_mem_cap::MEMIC, 1);
        self.set_both(DEV_MEM, device_mem_cap::LOG_MIN_MEMIC_ALLOC_SIZE, 6);
        // MEMIC: 128 KiB on ConnectX-5, 256 KiB later, at the top of BAR0
        // (fw/memic.rs); allocations aligned up to 64 << 12 (256 KiB).
        let memic = if p == Profile::ConnectX5 {
            128 << 10
        } else {
            256 << 10
        };
        self.set_both(DEV_MEM, device_mem_cap::MAX_MEMIC_SIZE, memic);
        self.set_both(DEV_MEM, device_mem_cap::MEMIC_BAR_SIZE, memic);
        self.set_both(
            DEV_MEM,
            device_mem_cap::MEMIC_BAR_START_ADDR,
            p.bar0_size() - memic,
        );
        self.set_both(DEV_MEM, device_mem_cap::LOG_MAX_MEMIC_ADDR_ALIGNMENT, 12);
        self.set_both(GENERAL_2, cmd_hca_cap_2::SW_VHCA_ID_VALID, 0);
        // 8-byte atomics in host byte order on request (ConnectX-5 and
        // later; 14.12 of the trace offers network order only): the driver
        // may set atomic_req_8B_endianness_mode up to 1 (Linux's
        // handle_hca_cap_atomic does, and mlx5_ib then reports ATOMIC_HCA).
        self.set_both(
            ATOMIC,
            atomic_caps::SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1,
            1,
        );
        if let Some(m) = self.max.get_mut(&ATOMIC) {
            atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE
                .set(m, u64::from(mlx5_hw::init::ATOMIC_REQ_MODE_HOST_ENDIANNESS));
        }
        self.raise_odp();
        // Memory windows (`imaicl`; mlx5_ib offers alloc_mw, type 1 and
        // 2B, only on it): 14.12 of the trace reports 0; ConnectX-5 and
        // later firmware report it (`ibv_devinfo -v` under upstream
        // mlx5_ib lists MEM_WINDOW and MEM_WINDOW_TYPE_2B on 16.x and
        // 20.x).
        self.set_both(GENERAL, cmd_hca_cap::IMAICL, 1);
        // VLAN insertion by the device from the Ethernet segment
        // (`wqe_vlan_insert`): ConnectX-5 and later (mlx5e asks for it on
        // a WQE without inline headers; 14.12 of the trace reports 0, and
        // mlx5e then always inlines a tagged frame's L2 headers with the
        // tag, MLX5E_SQ_STATE_VLAN_NEED_L2_INLINE).
        self.set_both(ETHERNET_OFFLOADS, eth_cap::WQE_VLAN_INSERT, 1);
        // Enhanced multi-packet send WQEs (ConnectX-5 and later; 14.12 of
        // the trace offers the legacy MPW only): mlx5e sends linear SKBs
        // without inline headers through them by default
        // (`mlx5e_tx_mpwqe_supported`), DPDK's mlx5 PMD its eMPW bursts.
        self.set_both(ETHERNET_OFFLOADS, eth_cap::ENHANCED_MULTI_PKT_SEND_WQE, 1);
        // An RQ's Q counter set chosen by MODIFY_RQ (its counter_set_id
        // bitmask bit): 14.12 of the trace reports 0, and mlx5_ib then
        // leaves a verbs WQ and a raw packet QP's RQ on no set ("Receive
        // WQ counters are not supported on current FW"), so the frames
        // they drop for want of a WQE are counted nowhere (DPDK's mlx5 PMD,
        // its queues through verbs, reports no `imissed`); later firmware
        // reports it and mlx5_ib binds them to the port's set at RST2RDY.
        self.set_both(GENERAL, cmd_hca_cap::MODIFY_RQ_COUNTER_SET_ID, 1);
        // The vport's local loopback under the driver's control (the NIC
        // vport context's disable_{uc,mc}_local_lb): 14.12 of the trace
        // reports neither, so the loopback there stays on; on later firmware
        // mlx5_core turns it off at load and mlx5_ib on while a second user
        // transport domain or a self-loopback raw packet QP exists, so a
        // single DPDK process does not hear its own multicast sends.
        self.set_both(GENERAL, cmd_hca_cap::DISABLE_LOCAL_LB_UC, 1);
        self.set_both(GENERAL, cmd_hca_cap::DISABLE_LOCAL_LB_MC, 1);
        // UMR WQEs on an Ethernet SQ (`reg_umr_sq`) with the translation
        // behind a pointer through the reserved lkey (`umr_ptr_rlky`):
        // 14.12 of the trace reports neither, and mlx5e there keeps to
        // linked-list RQs; on later firmware it maps its striding RQs'
        // pages by UMR from its control SQ (`mlx5e_check_fragmented_striding_rq_cap`),
        // its default receive queue on those cards.
        self.set_both(ETHERNET_OFFLOADS, eth_cap::REG_UMR_SQ, 1);
        self.set_both(GENERAL, cmd_hca_cap::UMR_PTR_RLKY, 1);
        // NIC RX flow tables that chain (Linux's FS_CHAINING_CAPS:
        // flow_modify_en, modify_root, identified_miss_table_mode,
        // flow_table_modify): 14.12 of the trace reports modify_root only,
        // and Linux then makes no NIC RX bypass namespace, so mlx5_ib's
        // `ibv_create_flow` and mlx5dv's flow matchers fail with
        // EOPNOTSUPP (no `flow_steering` a raw packet QP can use); later
        // firmware reports all four, and the model runs what they allow
        // (MODIFY_FLOW_TABLE of the miss table, SET_FLOW_TABLE_ENTRY
        // modifying an entry in place).
        let rx = flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE.off;
        for f in [
            flow_table_prop_layout::FLOW_MODIFY_EN,
            flow_table_prop_layout::IDENTIFIED_MISS_TABLE_MODE,
            flow_table_prop_layout::FLOW_TABLE_MODIFY,
        ] {
            self.set_both(FLOW_TABLE, f.at(rx), 1);
        }
        // Matching on the IP version, outer and inner (14.12 of the trace
        // announces neither): with `inner_ip_version` Linux's mlx5e makes
        // its inner traffic-type table (GRE packets steered by their inner
        // headers to TIRs that hash them, `mlx5_tunnel_inner_ft_supported`)
        // and asks every RSS TIR to parse tunnels (`tunneled_offload_en`),
        // as on ConnectX-5 and later; the parser fills both fields. The
        // prop layouts announce the same fields, as the trace's do.
        {
            use mlx5_hw::ifc::flow_table_fields_supported as fs;
            let layouts = [
                flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE,
                flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_RECEIVE_SNIFFER,
                flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_TRANSMIT,
                flow_table_nic_cap::FLOW_TABLE_PROPERTIES_NIC_TRANSMIT_SNIFFER,
            ];
            for l in layouts {
                for set in [
                    flow_table_prop_layout::FT_FIELD_SUPPORT,
                    flow_table_prop_layout::FT_FIELD_BITMASK_SUPPORT,
                ] {
                    for f in [fs::OUTER_IP_VERSION, fs::INNER_IP_VERSION] {
                        self.set_both(FLOW_TABLE, f.at(l.off + set.off), 1);
                    }
                }
            }
        }
        // Flow counters: 14.12 of the trace reports max_flow_counter 0, so
        // ALLOC_FLOW_COUNTER has nothing to give (rdma-core's DevX counter
        // tests and mlx5dv_dr's counter action fail there, test_mlx5_dr's
        // ALLOC_FLOW_COUNTER at :321); later firmware offers them: here
        // 2^24, in DevX bulks of up to 2^23 (`flow_counter_bulk_log_size`),
        // and NIC RX entries that count into them (one counter an entry:
        // `log_max_flow_counter` stays 0). NIC TX and the sniffers keep
        // the trace's `flow_counter` 0 (SET_FLOW_TABLE_ENTRY refuses a
        // counter there), though their walks would count one
        // (`Plan::egress`, `Plan::sniff`): no driver here asks for one.
        // `flow_counter_bulk_alloc` stays the trace's 0 (Linux's
        // fs_counters.c then allocates its counters one by one).
        self.set_both(GENERAL, cmd_hca_cap::MAX_FLOW_COUNTER_31_16, 0x100);
        self.set_both(GENERAL, cmd_hca_cap::LOG_MAX_FLOW_COUNTER_BULK, 23);
        self.set_both(FLOW_TABLE, flow_table_prop_layout::FLOW_COUNTER.at(rx), 1);
        // DevX (firmware 16.2x and later): user contexts, UMEMs (also
        // under uid 0), the user context capabilities Linux asks for at
        // CREATE_UCTX (RAW_TX, INTERNAL_DEV_RES). The table sizes are the
        // model's. general_obj_types lists the types the model creates of
        // those the firmware has: none on ConnectX-5/6 (no crypto engine
        // on those parts), the DEK on ConnectX-7 (below).
        self.set_both(GENERAL, cmd_hca_cap::LOG_MAX_UCTX, crate::fw::LOG_MAX_UCTX);
        self.set_both(GENERAL, cmd_hca_cap::LOG_MAX_UMEM, crate::fw::LOG_MAX_UMEM);
        self.set_both(GENERAL, cmd_hca_cap::UMEM_UID_0, 1);
        self.set_both(GENERAL, cmd_hca_cap::UCTX_CAP, crate::fw::UCTX_CAPS);
        self.set_both(GENERAL, cmd_hca_cap::GENERAL_OBJ_TYPES, 0);
        if p == Profile::ConnectX6 || p == Profile::ConnectX7 {
            // ConnectX-6 and later: RoCE v2 only over UDP port 4791, more QPs.
            self.set_both(ROCE, roce_cap::R_ROCE_DEST_UDP_PORT, 4791);
            // Relaxed ordering of memory-key DMA (mkc
            // relaxed_ordering_write/read), set by CREATE_MKEY only: the
            // UMR variants (`relaxed_ordering_*_umr`) are later firmware's.
            self.set_both(GENERAL, cmd_hca_cap::RELAXED_ORDERING_WRITE, 1);
            self.set_both(GENERAL, cmd_hca_cap::RELAXED_ORDERING_READ, 1);
            // DCI streams (the model's bounds: 16 streams, up to 16 in error).
            self.set_both(GENERAL, cmd_hca_cap::LOG_MAX_DCI_STREAM_CHANNELS, 4);
            self.set_both(GENERAL, cmd_hca_cap::LOG_MAX_DCI_ERRORED_STREAMS, 4);
            // The QP context extension (RTS2RTS with qpc_ext: the DCI
            // stream reset; libmlx5's mlx5dv_dci_stream_id_reset refuses
            // with EOPNOTSUPP without it).
            self.set_both(GENERAL, cmd_hca_cap::QPC_EXTENSION, 1);
            // Striding RQs of 8 to 256 strides (`ext_stride_num_range`):
            // mlx5e's linear striding RQ at MTU 1500 is 128 strides of 2
            // KiB per 256 KiB WQE, below the base range's 512, and without
            // the extended range it keeps a linked-list RQ instead
            // (`mlx5e_rx_mpwqe_is_linear_skb`).
            self.set_both(GENERAL, cmd_hca_cap::EXT_STRIDE_NUM_RANGE, 1);
            if p == Profile::ConnectX7 {
                // QUERY_QP reports which QPs' data is written in order
                // (rdma-core's `qp_data_in_order`). The out-of-order
                // placement caps (`dp_ordering_ooo_all_*`) are
                // ConnectX-8's: no profile offers them.
                self.set_both(GENERAL, cmd_hca_cap::QP_DATA_IN_ORDER, 1);
            }
            if let Some(m) = self.max.get_mut(&GENERAL) {
                cmd_hca_cap::LOG_MAX_QP.set(m, 0x18);
            }
        }
        if p == Profile::ConnectX7 {
            // ConnectX-7 (28.x): data encryption keys as general objects.
            let dek = 1u64 << mlx5_hw::devx::GENERAL_OBJECT_TYPES_ENCRYPTION_KEY;
            self.set_both(GENERAL, cmd_hca_cap::GENERAL_OBJ_TYPES, dek);
            self.set_both(GENERAL, cmd_hca_cap::LOG_MAX_DEK, crate::fw::LOG_MAX_DEK);
            // MEMIC atomics (MODIFY_MEMIC, fw/memic_op.rs): increment and
            // test-and-set, 1-8 byte accesses (16-byte ones are the
            // card's too, but no trapped MMIO access is that wide).
            let ops = (1u64 << mlx5_hw::init::MEMIC_OP_ATOMIC_INCREMENT)
                | (1u64 << mlx5_hw::init::MEMIC_OP_ATOMIC_TEST_AND_SET);
            self.set_both(DEV_MEM, device_mem_cap::MEMIC_OPERATIONS, ops);
            self.set_both(
                DEV_MEM,
                device_mem_cap::MEMIC_ATOMIC_INCREMENT_SIZE_SUP,
                0xf,
            );
            self.set_both(
                DEV_MEM,
                device_mem_cap::MEMIC_ATOMIC_TEST_AND_SET_SIZE_SUP,
                0xf,
            );
        }
    }
}

impl CapPages {
    /// On-demand paging as ConnectX-5 and later report it (the transport
    /// page-fault scheme; `mlx5_ib`'s `internal_fill_odp_caps`): RC, XRC
    /// and DC send, receive, write, read, atomic and SRQ receive, UD send
    /// and SRQ receive, UC nothing; and what implicit ODP needs
    /// (`fixed_buffer_size`, `null_mkey`, `umr_extended_translation_offset`).
    fn raise_odp(&mut self) {
        use cap_type::*;
        // send, receive, write, read, atomic, srq_receive: bits 31..26.
        const ALL: u64 = 0xfc00_0000;
        const SEND_SRQ: u64 = 0x8400_0000;
        self.set_both(ODP, odp_scheme_cap::RC_ODP_CAPS, ALL);
        self.set_both(ODP, odp_scheme_cap::XRC_ODP_CAPS, ALL);
        self.set_both(ODP, odp_scheme_cap::DC_ODP_CAPS, ALL);
        self.set_both(ODP, odp_scheme_cap::UD_ODP_CAPS, SEND_SRQ);
        self.set_both(GENERAL, cmd_hca_cap::FIXED_BUFFER_SIZE, 1);
        self.set_both(GENERAL, cmd_hca_cap::NULL_MKEY, 1);
        self.set_both(GENERAL, cmd_hca_cap::UMR_EXTENDED_TRANSLATION_OFFSET, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_profile_offers_signature_or_crypto_mkeys() {
        // Not modelled (no BSF, no crypto engine): off in every profile, so
        // mlx5_ib and libmlx5 refuse signature and crypto mkeys and
        // rdma-core's tests for them skip (ARCHITECTURE, known gaps).
        for p in Profile::ALL {
            let c = p.caps();
            for f in [
                cmd_hca_cap::SHO,
                cmd_hca_cap::SIGERR_CQE,
                cmd_hca_cap::CRYPTO,
            ] {
                assert_eq!(c.get(cap_type::GENERAL, f), 0, "{p:?} {f:?}");
            }
        }
    }

    #[test]
    fn cx4_caps_decode_to_the_trace_values() {
        let c = Profile::ConnectX4Lx.caps();
        assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::LOG_MAX_QP), 0xe);
        assert_eq!(c.max[&cap_type::GENERAL].len(), CAP_PAGE_SIZE);
        assert_eq!(
            cmd_hca_cap::LOG_MAX_QP.get(&c.max[&cap_type::GENERAL]),
            0x17
        );
        assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::LOG_MAX_EQ), 8);
        assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::UAR_SZ), 5);
        assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::LOG_BF_REG_SIZE), 9);
        assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::ROCE), 1);
        assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::CMDIF_CHECKSUM), 0);
        assert_eq!(
            cmd_hca_cap::CMDIF_CHECKSUM.get(&c.max[&cap_type::GENERAL]),
            3
        );
        // QUERY_ADAPTER: ieee_vendor_id 0x0002c9, vsd_vendor_id 0x15b3.
        assert_eq!(&c.adapter[0x18..0x1c], &[0, 0, 0x02, 0xc9]);
        for t in [
            cap_type::ODP,
            cap_type::DEV_MEM,
            cap_type::GENERAL_2,
            cap_type::ATOMIC,
        ] {
            assert!(c.cur.contains_key(&t) && c.max.contains_key(&t));
        }
    }

    #[test]
    fn qpc_extension_with_dci_streams() {
        for (p, v) in [
            (Profile::ConnectX4Lx, 0),
            (Profile::ConnectX5, 0),
            (Profile::ConnectX6, 1),
            (Profile::ConnectX7, 1),
        ] {
            let c = p.caps();
            assert_eq!(
                c.get(cap_type::GENERAL, cmd_hca_cap::QPC_EXTENSION),
                v,
                "{p:?}"
            );
            assert_eq!(
                c.get(cap_type::GENERAL, cmd_hca_cap::LOG_MAX_DCI_STREAM_CHANNELS) != 0,
                v == 1
            );
        }
    }

    #[test]
    fn later_generations_raise_caps() {
        let c = Profile::ConnectX5.caps();
        assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::DCT), 1);
        assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::DEVICE_MEMORY), 1);
        assert_eq!(
            Profile::ConnectX4Lx
                .caps()
                .get(cap_type::GENERAL, cmd_hca_cap::DCT),
            0
        );
    }

    #[test]
    fn memory_windows_from_connectx5_on() {
        // The trace's 14.12 reports imaicl 0 (max and current); mlx5_ib
        // then offers no alloc_mw. Later firmware reports it.
        for p in Profile::ALL {
            let c = p.caps();
            let want = u64::from(p != Profile::ConnectX4Lx);
            for page in [&c.cur, &c.max] {
                let g = &page[&cap_type::GENERAL];
                assert_eq!(cmd_hca_cap::IMAICL.get(g), want, "{p:?}");
            }
        }
    }

    #[test]
    fn odp_caps_from_connectx5_on() {
        use mlx5_hw::ifc::{odp_cap, odp_per_transport_service_cap as t};
        let cx4 = Profile::ConnectX4Lx.caps();
        assert_eq!(cx4.get(cap_type::ODP, odp_scheme_cap::RC_ODP_CAPS), 0);
        for p in [Profile::ConnectX5, Profile::ConnectX6, Profile::ConnectX7] {
            let c = p.caps();
            let rc = &c.cur[&cap_type::ODP][odp_scheme_cap::RC_ODP_CAPS.off / 8..];
            for f in [
                t::SEND,
                t::RECEIVE,
                t::WRITE,
                t::READ,
                t::ATOMIC,
                t::SRQ_RECEIVE,
            ] {
                assert_eq!(f.get(rc), 1, "{p:?}");
            }
            let ud = &c.cur[&cap_type::ODP][odp_scheme_cap::UD_ODP_CAPS.off / 8..];
            assert_eq!((t::SEND.get(ud), t::WRITE.get(ud)), (1, 0));
            assert_eq!(c.get(cap_type::ODP, odp_cap::MEM_PAGE_FAULT), 0);
            assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::PG), 1);
            assert_eq!(c.get(cap_type::GENERAL, cmd_hca_cap::NULL_MKEY), 1);
        }
    }

    #[test]
    fn flow_counters_from_connectx5_on_for_nic_rx_entries() {
        use flow_table_nic_cap as n;
        let prop =
            |c: &CapPages, t: BitField, f: BitField| c.get(cap_type::FLOW_TABLE, f.at(t.off));
        for p in Profile::ALL {
            let c = p.caps();
            let later = p != Profile::ConnectX4Lx;
            let max = c.get(cap_type::GENERAL, cmd_hca_cap::MAX_FLOW_COUNTER_31_16) << 16
                | c.get(cap_type::GENERAL, cmd_hca_cap::MAX_FLOW_COUNTER_15_0);
            assert_eq!(max, if later { 1 << 24 } else { 0 }, "{p:?}");
            assert_eq!(
                c.get(cap_type::GENERAL, cmd_hca_cap::LOG_MAX_FLOW_COUNTER_BULK),
                if later { 23 } else { 0 }
            );
            assert_eq!(
                c.get(cap_type::GENERAL, cmd_hca_cap::FLOW_COUNTER_BULK_ALLOC),
                0
            );
            let rx = n::FLOW_TABLE_PROPERTIES_NIC_RECEIVE;
            let fc = flow_table_prop_layout::FLOW_COUNTER;
            assert_eq!(prop(&c, rx, fc), u64::from(later), "{p:?}");
            // Only NIC RX frames are steered: no other type counts.
            for t in [
                n::FLOW_TABLE_PROPERTIES_NIC_TRANSMIT,
                n::FLOW_TABLE_PROPERTIES_NIC_RECEIVE_SNIFFER,
                n::FLOW_TABLE_PROPERTIES_NIC_TRANSMIT_SNIFFER,
            ] {
                assert_eq!(prop(&c, t, fc), 0, "{p:?}");
            }
        }
    }

    #[test]
    fn garbage_does_not_panic() {
        let c = CapPages::parse(
            "[cap zz cur]\nxx: 1 2\n[cap 0x0 cur]\n ffff: 1 2 3 4\n0ff0: zz 00000001\n[weird]\n",
        );
        assert_eq!(c.cur[&0][0xff7], 1);
    }
}
