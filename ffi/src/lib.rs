//! Kernel ABI.
