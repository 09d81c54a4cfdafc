//! Owning one PCI function from user space (see docs/ARCHITECTURE.md).
