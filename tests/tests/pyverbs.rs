//! rdma-core's own tests (`test_device`, `test_pd`, `test_mr`, `test_cq`,
//! `test_cqex`, `test_qp`, `test_srq`, `test_qpex`, `test_addr`,
//! `test_cq_events`, `test_relaxed_ordering`, `test_atomic`, `test_fork`,
//! `test_flow`, `test_rss_traffic`) on
//! Debian's `python3-pyverbs`, which loads
//! `ibverbs-c` as libibverbs.so.1, against one built-in model function
//! (`MLX5_DEVICES=emu`). The suite is fetched by
//! `scripts/rdma-core-tests.sh` (apt-get source, cached by hash) and run by
//! `tests/pyverbs/run.py`, which writes one line per test; this test
//! prints them, writes them to target/pyverbs-results.txt, and fails if a
//! test of [`MUST_PASS`] (every one that passed when docs/PYVERBS.md was
//! recorded) does not pass, or a module does not load. A second run puts
//! `test_device`, `test_mr` and `test_odp` on a ConnectX-7 model
//! (`emu:cx7`, target/pyverbs-results-cx7.txt, [`MUST_PASS_CX7`]), for what
//! the ConnectX-4 Lx has not: device memory, on-demand paging; a third runs the mlx5
//! direct-verbs modules `test_mlx5_cq`, `test_mlx5_dc`, `test_mlx5_devx`,
//! `test_mlx5_flow`, `test_mlx5_mkey`, `test_mlx5_query_port`, `test_mlx5_timestamp` and
//! `test_mlx5_uar` there
//! (target/pyverbs-results-mlx5.txt, [`MUST_PASS_MLX5`]).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The tests that pass (docs/PYVERBS.md).
const MUST_PASS: &[&str] = &[
    "tests.test_device.DeviceTest.test_dev_list",
    "tests.test_device.DeviceTest.test_open_dev",
    "tests.test_device.DeviceTest.test_phys_port_cnt_ex",
    "tests.test_device.DeviceTest.test_query_device",
    "tests.test_device.DeviceTest.test_query_device_ex",
    "tests.test_device.DeviceTest.test_query_gid",
    "tests.test_device.DeviceTest.test_query_gid_ex",
    "tests.test_device.DeviceTest.test_query_gid_ex_bad_flow",
    "tests.test_device.DeviceTest.test_query_gid_table",
    "tests.test_device.DeviceTest.test_query_gid_table_bad_flow",
    "tests.test_device.DeviceTest.test_query_pkey",
    "tests.test_device.DeviceTest.test_query_port_bad_flow",
    "tests.test_pd.PDTest.test_alloc_pd",
    "tests.test_pd.PDTest.test_dealloc_pd",
    "tests.test_pd.PDTest.test_destroy_pd_twice",
    "tests.test_pd.PDTest.test_multiple_pd_creation",
    "tests.test_mr.MRTest.test_reg_mr_bad_flags",
    "tests.test_mr.MRTest.test_mr_rereg_access",
    "tests.test_mr.MRTest.test_mr_rereg_access_bad_flow",
    "tests.test_mr.MRTest.test_mr_rereg_addr",
    "tests.test_mr.MRTest.test_mr_rereg_atomic",
    "tests.test_mr.MRTest.test_mr_rereg_pd",
    "tests.test_mr.MWTest.test_invalidate_mw_type1",
    "tests.test_mr.MWTest.test_mw_type1",
    "tests.test_mr.MWTest.test_mw_type2",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_dealloc",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_local",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_remote",
    "tests.test_mr.MWTest.test_reg_mw_wrong_type",
    "tests.test_cq.CQAPITest.test_create_cq",
    "tests.test_cq.CQAPITest.test_create_cq_bad_flow",
    "tests.test_cq.CQAPITest.test_create_cq_with_comp_channel",
    "tests.test_cq.CQTest.test_resize_cq",
    "tests.test_cqex.CQEXAPITest.test_create_cq_ex",
    "tests.test_cqex.CQEXAPITest.test_create_cq_ex_bad_flow",
    "tests.test_cqex.CqExTestCase.test_rc_traffic_cq_ex",
    "tests.test_cqex.CqExTestCase.test_ud_traffic_cq_ex",
    "tests.test_flow.FlowTest.test_eth_spec_flow_traffic",
    "tests.test_flow.FlowTest.test_ipv4_spec_flow_traffic",
    "tests.test_flow.FlowTest.test_ipv6_spec_flow_traffic",
    "tests.test_flow.FlowTest.test_tcp_spec_flow_traffic",
    "tests.test_flow.FlowTest.test_udp_spec_flow_traffic",
    "tests.test_rss_traffic.RSSTrafficTest.test_rss_traffic",
    "tests.test_qp.QPTest.test_create_raw_qp_ex_no_attr",
    "tests.test_qp.QPTest.test_create_raw_qp_ex_with_attr",
    "tests.test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_recv_sge",
    "tests.test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_recv_wr",
    "tests.test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_send_sge",
    "tests.test_qp.QPTest.test_create_raw_qp_ex_with_illegal_caps_max_send_wr",
    "tests.test_qp.QPTest.test_create_raw_qp_no_attr",
    "tests.test_qp.QPTest.test_create_raw_qp_with_attr",
    "tests.test_qp.QPTest.test_create_rc_qp_ex_no_attr",
    "tests.test_qp.QPTest.test_create_rc_qp_ex_with_attr",
    "tests.test_qp.QPTest.test_create_rc_qp_no_attr",
    "tests.test_qp.QPTest.test_create_rc_qp_with_attr",
    "tests.test_qp.QPTest.test_create_uc_qp_ex_no_attr",
    "tests.test_qp.QPTest.test_create_uc_qp_ex_with_attr",
    "tests.test_qp.QPTest.test_create_uc_qp_no_attr",
    "tests.test_qp.QPTest.test_create_uc_qp_with_attr",
    "tests.test_qp.QPTest.test_create_ud_qp_ex_no_attr",
    "tests.test_qp.QPTest.test_create_ud_qp_ex_with_attr",
    "tests.test_qp.QPTest.test_create_ud_qp_no_attr",
    "tests.test_qp.QPTest.test_create_ud_qp_with_attr",
    "tests.test_qp.QPTest.test_modify_ud_qp",
    "tests.test_qp.QPTest.test_query_raw_qp",
    "tests.test_qp.QPTest.test_query_rc_qp",
    "tests.test_qp.QPTest.test_query_uc_qp",
    "tests.test_qp.QPTest.test_query_ud_qp",
    "tests.test_srq.SrqTestCase.test_modify_srq_limit",
    "tests.test_srq.SrqTestCase.test_rc_srq_traffic",
    // Session 23: the ibv_wr_* API, AHs, completion events, relaxed ordering.
    "tests.test_qpex.QpExTestCase.test_full_rq_bad_flow",
    "tests.test_qpex.QpExTestCase.test_post_receive_qp_state_bad_flow",
    "tests.test_qpex.QpExTestCase.test_post_send_qp_state_bad_flow",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_atomic_cmp_swp",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_atomic_fetch_add",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_bind_mw",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_rdma_read",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_rdma_read_zero_size",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write_imm",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write_zero_length",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_send",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_send_imm",
    "tests.test_qpex.QpExTestCase.test_qp_ex_ud_send",
    "tests.test_qpex.QpExTestCase.test_qp_ex_ud_send_imm",
    "tests.test_qpex.QpExTestCase.test_qp_ex_ud_zero_size",
    "tests.test_qpex.QpExTestCase.test_rq_with_larger_sgl_bad_flow",
    "tests.test_addr.AHTest.test_create_ah",
    "tests.test_addr.AHTest.test_create_ah_roce",
    "tests.test_addr.AHTest.test_destroy_ah",
    "tests.test_cq_events.CqEventsTestCase.test_cq_events_rc",
    "tests.test_cq_events.CqEventsTestCase.test_cq_events_ud",
    "tests.test_relaxed_ordering.RoTestCase.test_ro_rc_traffic",
    "tests.test_relaxed_ordering.RoTestCase.test_ro_ud_traffic",
    "tests.test_atomic.AtomicTest.test_atomic_cmp_and_swap",
    "tests.test_atomic.AtomicTest.test_atomic_fetch_and_add",
    "tests.test_atomic.AtomicTest.test_atomic_invalid_lkey",
    "tests.test_atomic.AtomicTest.test_atomic_invalid_mr_access",
    "tests.test_atomic.AtomicTest.test_atomic_invalid_qp_access",
    "tests.test_atomic.AtomicTest.test_atomic_invalid_rkey",
    "tests.test_atomic.AtomicTest.test_atomic_non_aligned_addr",
    "tests.test_fork.ForkAPITest.test_is_fork_initialized",
];

/// What must pass on a ConnectX-7 model (`emu:cx7`), which has what the
/// ConnectX-4 Lx lacks: device memory (MEMIC) through `ibv_alloc_dm`,
/// `ibv_memcpy_to_dm`/`from_dm`, `ibv_reg_dm_mr` and traffic to it; and
/// memory windows there too.
const MUST_PASS_CX7: &[&str] = &[
    "tests.test_device.DMTest.test_create_dm",
    "tests.test_device.DMTest.test_create_dm_bad_flow",
    "tests.test_device.DMTest.test_destroy_dm",
    "tests.test_device.DMTest.test_destroy_dm_bad_flow",
    "tests.test_device.DMTest.test_dm_read",
    "tests.test_device.DMTest.test_dm_write",
    "tests.test_device.DMTest.test_dm_write_bad_flow",
    "tests.test_device.DeviceTest.test_dev_list",
    "tests.test_device.DeviceTest.test_open_dev",
    "tests.test_device.DeviceTest.test_phys_port_cnt_ex",
    "tests.test_device.DeviceTest.test_query_device",
    "tests.test_device.DeviceTest.test_query_device_ex",
    "tests.test_device.DeviceTest.test_query_gid",
    "tests.test_device.DeviceTest.test_query_gid_ex",
    "tests.test_device.DeviceTest.test_query_gid_ex_bad_flow",
    "tests.test_device.DeviceTest.test_query_gid_table",
    "tests.test_device.DeviceTest.test_query_gid_table_bad_flow",
    "tests.test_device.DeviceTest.test_query_pkey",
    "tests.test_device.DeviceTest.test_query_port_bad_flow",
    "tests.test_mr.DeviceMemoryAPITest.test_create_dm_mr",
    "tests.test_mr.DeviceMemoryAPITest.test_dm_bad_access",
    "tests.test_mr.DeviceMemoryAPITest.test_dm_bad_registration",
    "tests.test_mr.DeviceMemoryTest.test_dm_atomic_cmp_swp",
    "tests.test_mr.DeviceMemoryTest.test_dm_atomic_fetch_add",
    "tests.test_mr.DeviceMemoryTest.test_dm_remote_read_traffic",
    "tests.test_mr.DeviceMemoryTest.test_dm_remote_traffic",
    "tests.test_mr.DeviceMemoryTest.test_dm_remote_write_traffic_imm",
    "tests.test_mr.DeviceMemoryTest.test_dm_traffic",
    "tests.test_mr.MRTest.test_reg_mr_bad_flags",
    "tests.test_mr.MRTest.test_mr_rereg_access",
    "tests.test_mr.MRTest.test_mr_rereg_access_bad_flow",
    "tests.test_mr.MRTest.test_mr_rereg_addr",
    "tests.test_mr.MRTest.test_mr_rereg_atomic",
    "tests.test_mr.MRTest.test_mr_rereg_pd",
    "tests.test_mr.MWTest.test_invalidate_mw_type1",
    "tests.test_mr.MWTest.test_mw_type1",
    "tests.test_mr.MWTest.test_mw_type2",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_dealloc",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_local",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_remote",
    "tests.test_mr.MWTest.test_reg_mw_wrong_type",
    "tests.test_odp.OdpTestCase.test_odp_async_prefetch_rc_traffic",
    "tests.test_odp.OdpTestCase.test_odp_implicit_async_prefetch_rc_traffic",
    "tests.test_odp.OdpTestCase.test_odp_implicit_rc_traffic",
    "tests.test_odp.OdpTestCase.test_odp_implicit_sync_prefetch_rc_traffic",
    "tests.test_odp.OdpTestCase.test_odp_prefetch_async_no_page_fault_rc_traffic",
    "tests.test_odp.OdpTestCase.test_odp_prefetch_sync_no_page_fault_rc_traffic",
    "tests.test_odp.OdpTestCase.test_odp_rc_atomic_cmp_and_swp",
    "tests.test_odp.OdpTestCase.test_odp_rc_atomic_fetch_and_add",
    "tests.test_odp.OdpTestCase.test_odp_rc_mixed_mr",
    "tests.test_odp.OdpTestCase.test_odp_rc_rdma_read",
    "tests.test_odp.OdpTestCase.test_odp_rc_rdma_write",
    "tests.test_odp.OdpTestCase.test_odp_rc_traffic",
    "tests.test_odp.OdpTestCase.test_odp_sync_prefetch_rc_traffic",
    "tests.test_odp.OdpTestCase.test_odp_ud_traffic",
];

/// rdma-core's mlx5 direct-verbs tests that pass on a ConnectX-7 model
/// (docs/PYVERBS.md): mlx5dv CQs (CQE sizes, `MLX5_CQE_SIZE`, scatter to
/// CQE per QP), DC QPs (DCIs with and without streams, stream errors and
/// resets, the DCT over an SRQ) and indirect mkeys (KLM lists and
/// interleaved layouts through both UMR APIs, remote invalidation),
/// completion timestamps (device clock and wall clock) and the raw clock.
const MUST_PASS_MLX5: &[&str] = &[
    "tests.test_mlx5_cq.DvCqTest.test_dv_cq_cqe_size_128",
    "tests.test_mlx5_cq.DvCqTest.test_dv_cq_cqe_size_64",
    "tests.test_mlx5_cq.DvCqTest.test_dv_cq_cqe_size_environment_var",
    "tests.test_mlx5_cq.DvCqTest.test_dv_cq_cqe_size_with_bad_size",
    "tests.test_mlx5_cq.DvCqTest.test_dv_cq_traffic",
    "tests.test_mlx5_cq.DvCqTest.test_scatter_to_cqe_control_by_qp",
    "tests.test_mlx5_dc.DCTest.test_dc_rdma_write",
    "tests.test_mlx5_dc.DCTest.test_dc_rdma_write_stream",
    "tests.test_mlx5_dc.DCTest.test_dc_send",
    "tests.test_mlx5_dc.DCTest.test_dc_send_stream_bad_flow",
    "tests.test_mlx5_dc.DCTest.test_dc_send_stream_bad_flow_qp",
    "tests.test_mlx5_dc.DCTest.test_odp_dc_traffic",
    "tests.test_mlx5_devx.Mlx5DevxRcTrafficTest.test_devx_rc_qp_send_imm_traffic",
    "tests.test_mlx5_flow.Mlx5MatcherTest.test_create_empty_matcher",
    "tests.test_mlx5_flow.Mlx5MatcherTest.test_create_smac_matcher",
    "tests.test_mlx5_flow.Mlx5MatcherTest.test_smac_matcher_to_qp_flow",
    "tests.test_mlx5_mkey.Mlx5MkeyTest.test_mkey_interleaved",
    "tests.test_mlx5_mkey.Mlx5MkeyTest.test_mkey_interleaved_new_api",
    "tests.test_mlx5_mkey.Mlx5MkeyTest.test_mkey_list",
    "tests.test_mlx5_mkey.Mlx5MkeyTest.test_mkey_list_bad_flow",
    "tests.test_mlx5_mkey.Mlx5MkeyTest.test_mkey_list_new_api",
    "tests.test_mlx5_mkey.Mlx5MkeyTest.test_mkey_remote_invalidate",
    "tests.test_mlx5_mkey.Mlx5MkeyTest.test_odp_mkey_list_new_api",
    "tests.test_mlx5_query_port.Mlx5DVQueryPortTestCase.test_dv_query_port",
    "tests.test_mlx5_timestamp.TimeAPITest.test_query_rt_values",
    "tests.test_mlx5_timestamp.TimeStampTest.test_timestamp_free_running_rc_traffic",
    "tests.test_mlx5_timestamp.TimeStampTest.test_timestamp_free_running_recv_raw_traffic",
    "tests.test_mlx5_timestamp.TimeStampTest.test_timestamp_free_running_send_raw_traffic",
    "tests.test_mlx5_timestamp.TimeStampTest.test_timestamp_real_time_raw_traffic",
    "tests.test_mlx5_timestamp.TimeStampTest.test_timestamp_real_time_rc_traffic",
    "tests.test_mlx5_uar.Mlx5UarTestCase.test_alloc_uar",
];

#[test]
fn rdma_core_tests_on_pyverbs_over_the_c_library() {
    run_suite(
        "emu",
        &[
            "test_device",
            "test_pd",
            "test_mr",
            "test_cq",
            "test_cqex",
            "test_qp",
            "test_srq",
            "test_qpex",
            "test_addr",
            "test_cq_events",
            "test_relaxed_ordering",
            "test_atomic",
            "test_fork",
            "test_flow",
            "test_rss_traffic",
        ],
        MUST_PASS,
        "pyverbs-results.txt",
    );
}

#[test]
fn rdma_core_memory_tests_on_a_connectx7_model() {
    run_suite(
        "emu:cx7",
        &["test_device", "test_mr", "test_odp"],
        MUST_PASS_CX7,
        "pyverbs-results-cx7.txt",
    );
}

#[test]
fn rdma_core_mlx5dv_tests_on_a_connectx7_model() {
    assert!(
        Path::new("/usr/lib/python3/dist-packages/scapy").exists(),
        "NOT RUN: python3-scapy is missing (rdma-core's DevX tests build their \
         commands with it; scripts/test-all.sh installs it)"
    );
    run_suite(
        "emu:cx7",
        &[
            "test_mlx5_cq",
            "test_mlx5_dc",
            "test_mlx5_devx",
            "test_mlx5_flow",
            "test_mlx5_mkey",
            "test_mlx5_query_port",
            "test_mlx5_timestamp",
            "test_mlx5_uar",
        ],
        MUST_PASS_MLX5,
        "pyverbs-results-mlx5.txt",
    );
}

/// Runs rdma-core's `modules` on pyverbs over ibverbs-c against the
/// function `devices` names (`MLX5_DEVICES`); fails if one of
/// `must_pass` does not pass or a module does not load.
fn run_suite(devices: &str, modules: &[&str], must_pass: &[&str], results_file: &str) {
    assert!(
        Path::new("/usr/lib/python3/dist-packages/pyverbs").exists(),
        "NOT RUN: python3-pyverbs is missing (scripts/test-all.sh installs it)"
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let b = Command::new(cargo)
        .current_dir(root())
        .args(["build", "-q", "-p", "ibverbs-c"])
        .output()
        .unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let target = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    // A directory per suite: the suites run at once.
    let lib = target.join(format!("ibverbs-{}", results_file.trim_end_matches(".txt")));
    std::fs::create_dir_all(&lib).unwrap();
    for n in ["libibverbs.so.1", "libmlx5.so.1", "libefa.so.1"] {
        let l = lib.join(n);
        let _ = std::fs::remove_file(&l);
        std::os::unix::fs::symlink("../libibverbs.so", &l).unwrap();
    }
    let fetch = Command::new(root().join("scripts/rdma-core-tests.sh"))
        .output()
        .unwrap();
    assert!(
        fetch.status.success(),
        "NOT RUN: rdma-core's tests could not be fetched:\n{}",
        String::from_utf8_lossy(&fetch.stderr)
    );
    let src = String::from_utf8(fetch.stdout).unwrap().trim().to_string();
    let out = target.join(results_file);
    let run = Command::new("/usr/bin/python3")
        .arg(root().join("tests/pyverbs/run.py"))
        .arg(&src)
        .arg(&out)
        .args(modules)
        .env("LD_LIBRARY_PATH", &lib)
        .env("MLX5_DEVICES", devices)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "run.py died (a crash is a failure):\n{log}"
    );
    let results = std::fs::read_to_string(&out).unwrap();
    eprintln!("{results}");
    let status_of = |t: &str| {
        results
            .lines()
            .find(|l| l.split('\t').nth(1) == Some(t))
            .and_then(|l| l.split('\t').next())
            .unwrap_or("missing")
            .to_string()
    };
    let import_errors: Vec<&str> = results
        .lines()
        .filter(|l| l.contains("\timport: "))
        .collect();
    assert!(
        import_errors.is_empty(),
        "modules did not load:\n{}",
        import_errors.join("\n")
    );
    let regressed: Vec<String> = must_pass
        .iter()
        .filter(|t| status_of(t) != "pass")
        .map(|t| format!("{t}: {}", status_of(t)))
        .collect();
    assert!(
        regressed.is_empty(),
        "no longer pass:\n{}\n{log}",
        regressed.join("\n")
    );
    let passed = results.lines().filter(|l| l.starts_with("pass\t")).count();
    eprintln!(
        "{passed} rdma-core tests pass on ibverbs-c over {devices} (results in {})",
        out.display()
    );
}
