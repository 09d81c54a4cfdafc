//! Shared helpers for the end-to-end tests.
pub mod backend;
pub mod function_contract;
pub mod hugepages;
pub mod qemu_guest;
pub mod replay;
pub mod tally;
pub mod usermem_rdma;
pub mod wait;

/// The real ConnectX-4 firmware trace the repo carries, parsed:
/// `$MLX5_TRACE` or `tests/data/traces/connectx4-mlx5_core-bringup.txt`
/// (from the Snabb project, Apache-2.0; see the README beside it).
///
/// # Panics
/// If the trace cannot be read or parsed (tests want that loud).
pub fn connectx4_trace() -> Vec<mlx5_hw::trace::TracedCommand> {
    let path = std::env::var_os("MLX5_TRACE")
        .map_or_else(connectx4_trace_in_repo, std::path::PathBuf::from);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading the ConnectX-4 trace {}: {e} (set MLX5_TRACE to its path)",
            path.display()
        )
    });
    mlx5_hw::trace::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Where the repo keeps the ConnectX-4 trace.
pub fn connectx4_trace_in_repo() -> std::path::PathBuf {
    std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/traces/connectx4-mlx5_core-bringup.txt"
    ))
}
