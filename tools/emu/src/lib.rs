//! Emulated HCA.
