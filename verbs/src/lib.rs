//! The user-space mlx5 driver (see docs/ARCHITECTURE.md).
