//! Command opcodes: the 16-bit `opcode` field at the start of every command
//! inbox (`MLX5_CMD_OP_*` of Linux's `mlx5_ifc.h`).
//!
//! Names are the ones Linux's `mlx5_command_str()` prints (the constant
//! without its `MLX5_CMD_OP_` prefix). The few opcodes `mlx5_command_str()`
//! does not list (`QUERY_SF_PARTITION`, `MODIFY_MEMIC`, the XRQ DC/error
//! parameter commands, `SET_DELAY_DROP_PARAMS`,
//! `QUERY_PACKET_REFORMAT_CONTEXT`, `SYNC_STEERING`, `GENERATE_WQE` and
//! `QUERY_VUID`, spelled `MLX5_CMD_OPCODE_QUERY_VUID`) are named the same way.

use crate::macros::prm_enum;

prm_enum! {
    /// A command opcode (`MLX5_CMD_OP_*`), as in the inbox's first 16 bits.
    pub enum Opcode: u16, unknown = "unknown command opcode" {
        /// Queries HCA capabilities (op_mod = cap type << 1 | current).
        QueryHcaCap = 0x100 => "QUERY_HCA_CAP",
        /// Queries adapter information.
        QueryAdapter = 0x101 => "QUERY_ADAPTER",
        /// Initializes the HCA.
        InitHca = 0x102 => "INIT_HCA",
        /// Tears down the HCA.
        TeardownHca = 0x103 => "TEARDOWN_HCA",
        /// Enables the HCA function.
        EnableHca = 0x104 => "ENABLE_HCA",
        /// Disables the HCA function.
        DisableHca = 0x105 => "DISABLE_HCA",
        /// Queries how many pages firmware needs.
        QueryPages = 0x107 => "QUERY_PAGES",
        /// Gives pages to firmware or takes them back.
        ManagePages = 0x108 => "MANAGE_PAGES",
        /// Sets HCA capabilities (op_mod = cap type << 1).
        SetHcaCap = 0x109 => "SET_HCA_CAP",
        /// Queries the supported interface step sequence IDs.
        QueryIssi = 0x10a => "QUERY_ISSI",
        /// Sets the interface step sequence ID.
        SetIssi = 0x10b => "SET_ISSI",
        /// Sets the driver version string.
        SetDriverVersion = 0x10d => "SET_DRIVER_VERSION",
        /// Queries the sub-function partition.
        QuerySfPartition = 0x111 => "QUERY_SF_PARTITION",
        /// Allocates a sub-function.
        AllocSf = 0x113 => "ALLOC_SF",
        /// Frees a sub-function.
        DeallocSf = 0x114 => "DEALLOC_SF",
        /// Suspends a vHCA.
        SuspendVhca = 0x115 => "SUSPEND_VHCA",
        /// Resumes a vHCA.
        ResumeVhca = 0x116 => "RESUME_VHCA",
        /// Queries the vHCA migration state.
        QueryVhcaMigrationState = 0x117 => "QUERY_VHCA_MIGRATION_STATE",
        /// Saves the vHCA state.
        SaveVhcaState = 0x118 => "SAVE_VHCA_STATE",
        /// Loads the vHCA state.
        LoadVhcaState = 0x119 => "LOAD_VHCA_STATE",
        /// Creates a memory key.
        CreateMkey = 0x200 => "CREATE_MKEY",
        /// Queries a memory key.
        QueryMkey = 0x201 => "QUERY_MKEY",
        /// Destroys a memory key.
        DestroyMkey = 0x202 => "DESTROY_MKEY",
        /// Queries the special contexts (reserved lkey, null mkey, ...).
        QuerySpecialContexts = 0x203 => "QUERY_SPECIAL_CONTEXTS",
        /// Resumes a WQE stalled on an ODP page fault.
        PageFaultResume = 0x204 => "PAGE_FAULT_RESUME",
        /// Allocates device memory (MEMIC).
        AllocMemic = 0x205 => "ALLOC_MEMIC",
        /// Frees device memory (MEMIC).
        DeallocMemic = 0x206 => "DEALLOC_MEMIC",
        /// Modifies device memory (MEMIC).
        ModifyMemic = 0x207 => "MODIFY_MEMIC",
        /// Creates an event queue.
        CreateEq = 0x301 => "CREATE_EQ",
        /// Destroys an event queue.
        DestroyEq = 0x302 => "DESTROY_EQ",
        /// Queries an event queue.
        QueryEq = 0x303 => "QUERY_EQ",
        /// Generates an EQE (test).
        GenEqe = 0x304 => "GEN_EQE",
        /// Creates a completion queue.
        CreateCq = 0x400 => "CREATE_CQ",
        /// Destroys a completion queue.
        DestroyCq = 0x401 => "DESTROY_CQ",
        /// Queries a completion queue.
        QueryCq = 0x402 => "QUERY_CQ",
        /// Modifies a completion queue.
        ModifyCq = 0x403 => "MODIFY_CQ",
        /// Creates a queue pair.
        CreateQp = 0x500 => "CREATE_QP",
        /// Destroys a queue pair.
        DestroyQp = 0x501 => "DESTROY_QP",
        /// Moves a queue pair from reset to init.
        Rst2InitQp = 0x502 => "RST2INIT_QP",
        /// Moves a queue pair from init to ready-to-receive.
        Init2RtrQp = 0x503 => "INIT2RTR_QP",
        /// Moves a queue pair from ready-to-receive to ready-to-send.
        Rtr2RtsQp = 0x504 => "RTR2RTS_QP",
        /// Modifies a queue pair in ready-to-send.
        Rts2RtsQp = 0x505 => "RTS2RTS_QP",
        /// Moves a queue pair from send-queue error to ready-to-send.
        Sqerr2RtsQp = 0x506 => "SQERR2RTS_QP",
        /// Moves a queue pair to the error state.
        ToErrQp = 0x507 => "2ERR_QP",
        /// Moves a queue pair to the reset state.
        ToRstQp = 0x50a => "2RST_QP",
        /// Queries a queue pair.
        QueryQp = 0x50b => "QUERY_QP",
        /// Moves a queue pair from send-queue drained to ready-to-send.
        SqdRtsQp = 0x50c => "SQD_RTS_QP",
        /// Modifies a queue pair in init.
        Init2InitQp = 0x50e => "INIT2INIT_QP",
        /// Creates a protection signature value.
        CreatePsv = 0x600 => "CREATE_PSV",
        /// Destroys a protection signature value.
        DestroyPsv = 0x601 => "DESTROY_PSV",
        /// Creates a shared receive queue.
        CreateSrq = 0x700 => "CREATE_SRQ",
        /// Destroys a shared receive queue.
        DestroySrq = 0x701 => "DESTROY_SRQ",
        /// Queries a shared receive queue.
        QuerySrq = 0x702 => "QUERY_SRQ",
        /// Arms an RQ or SRQ limit event.
        ArmRq = 0x703 => "ARM_RQ",
        /// Creates an XRC SRQ.
        CreateXrcSrq = 0x705 => "CREATE_XRC_SRQ",
        /// Destroys an XRC SRQ.
        DestroyXrcSrq = 0x706 => "DESTROY_XRC_SRQ",
        /// Queries an XRC SRQ.
        QueryXrcSrq = 0x707 => "QUERY_XRC_SRQ",
        /// Arms an XRC SRQ.
        ArmXrcSrq = 0x708 => "ARM_XRC_SRQ",
        /// Creates a DC target.
        CreateDct = 0x710 => "CREATE_DCT",
        /// Destroys a DC target.
        DestroyDct = 0x711 => "DESTROY_DCT",
        /// Drains a DC target.
        DrainDct = 0x712 => "DRAIN_DCT",
        /// Queries a DC target.
        QueryDct = 0x713 => "QUERY_DCT",
        /// Arms a DCT for key-violation events.
        ArmDctForKeyViolation = 0x714 => "ARM_DCT_FOR_KEY_VIOLATION",
        /// Creates an XRQ.
        CreateXrq = 0x717 => "CREATE_XRQ",
        /// Destroys an XRQ.
        DestroyXrq = 0x718 => "DESTROY_XRQ",
        /// Queries an XRQ.
        QueryXrq = 0x719 => "QUERY_XRQ",
        /// Arms an XRQ.
        ArmXrq = 0x71a => "ARM_XRQ",
        /// Queries an XRQ DC parameters entry.
        QueryXrqDcParamsEntry = 0x725 => "QUERY_XRQ_DC_PARAMS_ENTRY",
        /// Sets an XRQ DC parameters entry.
        SetXrqDcParamsEntry = 0x726 => "SET_XRQ_DC_PARAMS_ENTRY",
        /// Queries XRQ error parameters.
        QueryXrqErrorParams = 0x727 => "QUERY_XRQ_ERROR_PARAMS",
        /// Releases an XRQ from its error state.
        ReleaseXrqError = 0x729 => "RELEASE_XRQ_ERROR",
        /// Modifies an XRQ.
        ModifyXrq = 0x72a => "MODIFY_XRQ",
        /// Queries e-switch functions.
        QueryEswFunctions = 0x740 => "QUERY_ESW_FUNCTIONS",
        /// Queries a vport state.
        QueryVportState = 0x750 => "QUERY_VPORT_STATE",
        /// Modifies a vport state.
        ModifyVportState = 0x751 => "MODIFY_VPORT_STATE",
        /// Queries an e-switch vport context.
        QueryEswVportContext = 0x752 => "QUERY_ESW_VPORT_CONTEXT",
        /// Modifies an e-switch vport context.
        ModifyEswVportContext = 0x753 => "MODIFY_ESW_VPORT_CONTEXT",
        /// Queries a NIC vport context.
        QueryNicVportContext = 0x754 => "QUERY_NIC_VPORT_CONTEXT",
        /// Modifies a NIC vport context.
        ModifyNicVportContext = 0x755 => "MODIFY_NIC_VPORT_CONTEXT",
        /// Queries a RoCE address (GID entry).
        QueryRoceAddress = 0x760 => "QUERY_ROCE_ADDRESS",
        /// Sets a RoCE address (GID entry).
        SetRoceAddress = 0x761 => "SET_ROCE_ADDRESS",
        /// Queries an HCA vport context.
        QueryHcaVportContext = 0x762 => "QUERY_HCA_VPORT_CONTEXT",
        /// Modifies an HCA vport context.
        ModifyHcaVportContext = 0x763 => "MODIFY_HCA_VPORT_CONTEXT",
        /// Queries HCA vport GIDs.
        QueryHcaVportGid = 0x764 => "QUERY_HCA_VPORT_GID",
        /// Queries HCA vport P_Keys.
        QueryHcaVportPkey = 0x765 => "QUERY_HCA_VPORT_PKEY",
        /// Queries the vNIC environment counters.
        QueryVnicEnv = 0x76f => "QUERY_VNIC_ENV",
        /// Queries vport counters.
        QueryVportCounter = 0x770 => "QUERY_VPORT_COUNTER",
        /// Allocates a queue counter set.
        AllocQCounter = 0x771 => "ALLOC_Q_COUNTER",
        /// Frees a queue counter set.
        DeallocQCounter = 0x772 => "DEALLOC_Q_COUNTER",
        /// Queries a queue counter set.
        QueryQCounter = 0x773 => "QUERY_Q_COUNTER",
        /// Sets monitor counters.
        SetMonitorCounter = 0x774 => "SET_MONITOR_COUNTER",
        /// Arms monitor counters.
        ArmMonitorCounter = 0x775 => "ARM_MONITOR_COUNTER",
        /// Sets a packet-pacing rate limit.
        SetPpRateLimit = 0x780 => "SET_PP_RATE_LIMIT",
        /// Queries a rate limit.
        QueryRateLimit = 0x781 => "QUERY_RATE_LIMIT",
        /// Creates a scheduling element.
        CreateSchedulingElement = 0x782 => "CREATE_SCHEDULING_ELEMENT",
        /// Destroys a scheduling element.
        DestroySchedulingElement = 0x783 => "DESTROY_SCHEDULING_ELEMENT",
        /// Queries a scheduling element.
        QuerySchedulingElement = 0x784 => "QUERY_SCHEDULING_ELEMENT",
        /// Modifies a scheduling element.
        ModifySchedulingElement = 0x785 => "MODIFY_SCHEDULING_ELEMENT",
        /// Creates a QoS para-vport.
        CreateQosParaVport = 0x786 => "CREATE_QOS_PARA_VPORT",
        /// Destroys a QoS para-vport.
        DestroyQosParaVport = 0x787 => "DESTROY_QOS_PARA_VPORT",
        /// Allocates a protection domain.
        AllocPd = 0x800 => "ALLOC_PD",
        /// Frees a protection domain.
        DeallocPd = 0x801 => "DEALLOC_PD",
        /// Allocates a UAR page.
        AllocUar = 0x802 => "ALLOC_UAR",
        /// Frees a UAR page.
        DeallocUar = 0x803 => "DEALLOC_UAR",
        /// Configures interrupt moderation.
        ConfigIntModeration = 0x804 => "CONFIG_INT_MODERATION",
        /// Reads or writes an access register.
        AccessReg = 0x805 => "ACCESS_REG",
        /// Attaches a QP to a multicast group.
        AttachToMcg = 0x806 => "ATTACH_TO_MCG",
        /// Detaches a QP from a multicast group.
        DetachFromMcg = 0x807 => "DETACH_FROM_MCG",
        /// Reads the dropped-packet log.
        GetDroppedPacketLog = 0x80a => "GET_DROPPED_PACKET_LOG",
        /// Sends a MAD to the device's subnet management agent.
        MadIfc = 0x50d => "MAD_IFC",
        /// Queries MAD demultiplexing.
        QueryMadDemux = 0x80b => "QUERY_MAD_DEMUX",
        /// Sets MAD demultiplexing.
        SetMadDemux = 0x80c => "SET_MAD_DEMUX",
        /// Does nothing (command interface test).
        Nop = 0x80d => "NOP",
        /// Allocates an XRC domain.
        AllocXrcd = 0x80e => "ALLOC_XRCD",
        /// Frees an XRC domain.
        DeallocXrcd = 0x80f => "DEALLOC_XRCD",
        /// Allocates a transport domain.
        AllocTransportDomain = 0x816 => "ALLOC_TRANSPORT_DOMAIN",
        /// Frees a transport domain.
        DeallocTransportDomain = 0x817 => "DEALLOC_TRANSPORT_DOMAIN",
        /// Queries congestion control status.
        QueryCongStatus = 0x822 => "QUERY_CONG_STATUS",
        /// Modifies congestion control status.
        ModifyCongStatus = 0x823 => "MODIFY_CONG_STATUS",
        /// Queries congestion control parameters.
        QueryCongParams = 0x824 => "QUERY_CONG_PARAMS",
        /// Modifies congestion control parameters.
        ModifyCongParams = 0x825 => "MODIFY_CONG_PARAMS",
        /// Queries congestion control statistics.
        QueryCongStatistics = 0x826 => "QUERY_CONG_STATISTICS",
        /// Adds a VXLAN UDP destination port.
        AddVxlanUdpDport = 0x827 => "ADD_VXLAN_UDP_DPORT",
        /// Deletes a VXLAN UDP destination port.
        DeleteVxlanUdpDport = 0x828 => "DELETE_VXLAN_UDP_DPORT",
        /// Sets an L2 table entry.
        SetL2TableEntry = 0x829 => "SET_L2_TABLE_ENTRY",
        /// Queries an L2 table entry.
        QueryL2TableEntry = 0x82a => "QUERY_L2_TABLE_ENTRY",
        /// Deletes an L2 table entry.
        DeleteL2TableEntry = 0x82b => "DELETE_L2_TABLE_ENTRY",
        /// Sets wake-on-LAN / reset-on-LAN modes.
        SetWolRol = 0x830 => "SET_WOL_ROL",
        /// Queries wake-on-LAN / reset-on-LAN modes.
        QueryWolRol = 0x831 => "QUERY_WOL_ROL",
        /// Creates a link aggregation.
        CreateLag = 0x840 => "CREATE_LAG",
        /// Modifies a link aggregation.
        ModifyLag = 0x841 => "MODIFY_LAG",
        /// Queries a link aggregation.
        QueryLag = 0x842 => "QUERY_LAG",
        /// Destroys a link aggregation.
        DestroyLag = 0x843 => "DESTROY_LAG",
        /// Creates a vport link aggregation.
        CreateVportLag = 0x844 => "CREATE_VPORT_LAG",
        /// Destroys a vport link aggregation.
        DestroyVportLag = 0x845 => "DESTROY_VPORT_LAG",
        /// Creates a transport interface receive.
        CreateTir = 0x900 => "CREATE_TIR",
        /// Modifies a transport interface receive.
        ModifyTir = 0x901 => "MODIFY_TIR",
        /// Destroys a transport interface receive.
        DestroyTir = 0x902 => "DESTROY_TIR",
        /// Queries a transport interface receive.
        QueryTir = 0x903 => "QUERY_TIR",
        /// Creates a send queue.
        CreateSq = 0x904 => "CREATE_SQ",
        /// Modifies a send queue.
        ModifySq = 0x905 => "MODIFY_SQ",
        /// Destroys a send queue.
        DestroySq = 0x906 => "DESTROY_SQ",
        /// Queries a send queue.
        QuerySq = 0x907 => "QUERY_SQ",
        /// Creates a receive queue.
        CreateRq = 0x908 => "CREATE_RQ",
        /// Modifies a receive queue.
        ModifyRq = 0x909 => "MODIFY_RQ",
        /// Sets delay-drop parameters.
        SetDelayDropParams = 0x910 => "SET_DELAY_DROP_PARAMS",
        /// Destroys a receive queue.
        DestroyRq = 0x90a => "DESTROY_RQ",
        /// Queries a receive queue.
        QueryRq = 0x90b => "QUERY_RQ",
        /// Creates a receive memory pool.
        CreateRmp = 0x90c => "CREATE_RMP",
        /// Modifies a receive memory pool.
        ModifyRmp = 0x90d => "MODIFY_RMP",
        /// Destroys a receive memory pool.
        DestroyRmp = 0x90e => "DESTROY_RMP",
        /// Queries a receive memory pool.
        QueryRmp = 0x90f => "QUERY_RMP",
        /// Creates a transport interface send.
        CreateTis = 0x912 => "CREATE_TIS",
        /// Modifies a transport interface send.
        ModifyTis = 0x913 => "MODIFY_TIS",
        /// Destroys a transport interface send.
        DestroyTis = 0x914 => "DESTROY_TIS",
        /// Queries a transport interface send.
        QueryTis = 0x915 => "QUERY_TIS",
        /// Creates an RQ table.
        CreateRqt = 0x916 => "CREATE_RQT",
        /// Modifies an RQ table.
        ModifyRqt = 0x917 => "MODIFY_RQT",
        /// Destroys an RQ table.
        DestroyRqt = 0x918 => "DESTROY_RQT",
        /// Queries an RQ table.
        QueryRqt = 0x919 => "QUERY_RQT",
        /// Sets the flow table root.
        SetFlowTableRoot = 0x92f => "SET_FLOW_TABLE_ROOT",
        /// Creates a flow table.
        CreateFlowTable = 0x930 => "CREATE_FLOW_TABLE",
        /// Destroys a flow table.
        DestroyFlowTable = 0x931 => "DESTROY_FLOW_TABLE",
        /// Queries a flow table.
        QueryFlowTable = 0x932 => "QUERY_FLOW_TABLE",
        /// Creates a flow group.
        CreateFlowGroup = 0x933 => "CREATE_FLOW_GROUP",
        /// Destroys a flow group.
        DestroyFlowGroup = 0x934 => "DESTROY_FLOW_GROUP",
        /// Queries a flow group.
        QueryFlowGroup = 0x935 => "QUERY_FLOW_GROUP",
        /// Sets a flow table entry.
        SetFlowTableEntry = 0x936 => "SET_FLOW_TABLE_ENTRY",
        /// Queries a flow table entry.
        QueryFlowTableEntry = 0x937 => "QUERY_FLOW_TABLE_ENTRY",
        /// Deletes a flow table entry.
        DeleteFlowTableEntry = 0x938 => "DELETE_FLOW_TABLE_ENTRY",
        /// Allocates a flow counter.
        AllocFlowCounter = 0x939 => "ALLOC_FLOW_COUNTER",
        /// Frees a flow counter.
        DeallocFlowCounter = 0x93a => "DEALLOC_FLOW_COUNTER",
        /// Queries a flow counter.
        QueryFlowCounter = 0x93b => "QUERY_FLOW_COUNTER",
        /// Modifies a flow table.
        ModifyFlowTable = 0x93c => "MODIFY_FLOW_TABLE",
        /// Allocates a packet reformat context.
        AllocPacketReformatContext = 0x93d => "ALLOC_PACKET_REFORMAT_CONTEXT",
        /// Frees a packet reformat context.
        DeallocPacketReformatContext = 0x93e => "DEALLOC_PACKET_REFORMAT_CONTEXT",
        /// Queries a packet reformat context.
        QueryPacketReformatContext = 0x93f => "QUERY_PACKET_REFORMAT_CONTEXT",
        /// Allocates a modify-header context.
        AllocModifyHeaderContext = 0x940 => "ALLOC_MODIFY_HEADER_CONTEXT",
        /// Frees a modify-header context.
        DeallocModifyHeaderContext = 0x941 => "DEALLOC_MODIFY_HEADER_CONTEXT",
        /// Queries a modify-header context.
        QueryModifyHeaderContext = 0x942 => "QUERY_MODIFY_HEADER_CONTEXT",
        /// Creates an FPGA queue pair.
        FpgaCreateQp = 0x960 => "FPGA_CREATE_QP",
        /// Modifies an FPGA queue pair.
        FpgaModifyQp = 0x961 => "FPGA_MODIFY_QP",
        /// Queries an FPGA queue pair.
        FpgaQueryQp = 0x962 => "FPGA_QUERY_QP",
        /// Destroys an FPGA queue pair.
        FpgaDestroyQp = 0x963 => "FPGA_DESTROY_QP",
        /// Queries FPGA queue pair counters.
        FpgaQueryQpCounters = 0x964 => "FPGA_QUERY_QP_COUNTERS",
        /// Creates a general object.
        CreateGeneralObject = 0xa00 => "CREATE_GENERAL_OBJECT",
        /// Modifies a general object.
        ModifyGeneralObject = 0xa01 => "MODIFY_GENERAL_OBJECT",
        /// Queries a general object.
        QueryGeneralObject = 0xa02 => "QUERY_GENERAL_OBJECT",
        /// Destroys a general object.
        DestroyGeneralObject = 0xa03 => "DESTROY_GENERAL_OBJECT",
        /// Creates a user context.
        CreateUctx = 0xa04 => "CREATE_UCTX",
        /// Destroys a user context.
        DestroyUctx = 0xa06 => "DESTROY_UCTX",
        /// Creates a user memory region.
        CreateUmem = 0xa08 => "CREATE_UMEM",
        /// Destroys a user memory region.
        DestroyUmem = 0xa0a => "DESTROY_UMEM",
        /// Synchronizes steering caches.
        SyncSteering = 0xb00 => "SYNC_STEERING",
        /// Queries the vHCA state.
        QueryVhcaState = 0xb0d => "QUERY_VHCA_STATE",
        /// Modifies the vHCA state.
        ModifyVhcaState = 0xb0e => "MODIFY_VHCA_STATE",
        /// Synchronizes crypto caches.
        SyncCrypto = 0xb12 => "SYNC_CRYPTO",
        /// Allows another vHCA to access objects of this function.
        AllowOtherVhcaAccess = 0xb16 => "ALLOW_OTHER_VHCA_ACCESS",
        /// Has firmware generate and post a WQE.
        GenerateWqe = 0xb17 => "GENERATE_WQE",
        /// Queries the vendor unique ID.
        QueryVuid = 0xb22 => "QUERY_VUID",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_mlx5_ifc_h() {
        assert_eq!(Opcode::QueryHcaCap.to_raw(), 0x100);
        assert_eq!(Opcode::ManagePages.to_raw(), 0x108);
        assert_eq!(Opcode::CreateEq.to_raw(), 0x301);
        assert_eq!(Opcode::CreateCq.to_raw(), 0x400);
        assert_eq!(Opcode::ToErrQp.to_raw(), 0x507);
        assert_eq!(Opcode::MadIfc.to_raw(), 0x50d);
        assert_eq!(Opcode::CreateDct.to_raw(), 0x710);
        assert_eq!(Opcode::AccessReg.to_raw(), 0x805);
        assert_eq!(Opcode::CreateUmem.to_raw(), 0xa08);
        assert_eq!(Opcode::QueryVuid.to_raw(), 0xb22);
        assert_eq!(Opcode::ALL.len(), 200);
    }

    #[test]
    fn names_are_mlx5_command_str() {
        assert_eq!(Opcode::CreateCq.name(), "CREATE_CQ");
        assert_eq!(Opcode::ToRstQp.name(), "2RST_QP");
        assert_eq!(Opcode::from(0x10bu16).name(), "SET_ISSI");
        assert_eq!(Opcode::CreateCq.to_string(), "CREATE_CQ(0x400)");
        assert_eq!(
            Opcode::from(0x1234u16).to_string(),
            "unknown command opcode(0x1234)"
        );
    }

    #[test]
    fn every_value_round_trips_and_is_unique() {
        let mut seen = std::collections::HashSet::new();
        for op in Opcode::ALL {
            assert!(seen.insert(op.to_raw()), "duplicate {op}");
            assert_eq!(Opcode::from(u16::from(*op)), *op);
        }
        assert_eq!(Opcode::from(0xffffu16), Opcode::Unknown(0xffff));
        assert_eq!(u16::from(Opcode::Unknown(0xffff)), 0xffff);
    }
}
