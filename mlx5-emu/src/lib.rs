//! The ConnectX device model (see docs/ARCHITECTURE.md).
