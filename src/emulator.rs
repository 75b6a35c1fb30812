//! The emulated ConnectX HCA in this process (cargo feature `emulator`): run a program, a
//! test or an example with no NIC, unchanged.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A real ConnectX if device discovery finds one, else an emulated HCA in this process.
//! let hca = mlx5::emulator::Hca::first_or_emulated();
//! let ctx = hca.open()?;
//! println!("{hca}: {} ports", ctx.device_attr().raw.phys_port_cnt);
//!
//! // Or always the emulator, two HCAs on one fabric:
//! use mlx5::emulator::{EmuConfig, Emulator};
//! let emu = Emulator::new(EmuConfig { num_hcas: 2, ..EmuConfig::default() });
//! let ctx1 = mlx5::Context::open(emu.open(1)?)?; // `Errno` is a std::error::Error too
//! # drop((ctx, ctx1));
//! # Ok(())
//! # }
//! ```
//!
//! The emulator's device runs on its own thread (`RunMode::Threaded`, the default) and ends
//! with the last context opened on it. Programs that cannot be rebuilt with this feature reach
//! the same emulator through `mlx5 emu run -- PROGRAM` ([`crate::devices`] honours the
//! `SYSFS_PATH` that sets).

use crate::context::Context;
use crate::device::{Device, devices};
use crate::error::{Error, Result};

pub use mlx5_emu::{EmuConfig, Emulator, Errno, Fabric, LinkLayer, RunMode};

/// Where contexts are opened: a real device or an in-process emulator.
#[derive(Debug, Clone)]
pub enum Hca {
    /// A device found by [`devices`] (sysfs, or `SYSFS_PATH`).
    Device(Device),
    /// The emulated HCAs of an in-process [`Emulator`].
    Emulated(Emulator),
}

impl Hca {
    /// The first mlx5 device discovery finds; if there is none (no RDMA support at all, or
    /// discovery fails, e.g. on an unsupported uverbs ABI), a new threaded [`Emulator`] with
    /// one HCA.
    pub fn first_or_emulated() -> Hca {
        match devices().ok().and_then(|list| list.into_iter().next()) {
            Some(d) => Hca::Device(d),
            None => Hca::Emulated(Emulator::new(EmuConfig::default())),
        }
    }

    /// Whether this is the emulator.
    pub fn is_emulated(&self) -> bool {
        matches!(self, Hca::Emulated(_))
    }

    /// Open a context: on the device (configured from the libmlx5 environment variables), or
    /// on HCA 0 of the emulator.
    ///
    /// # Errors
    /// As [`Device::open`] and [`Context::open`].
    pub fn open(&self) -> Result<Context> {
        match self {
            Hca::Device(d) => d.open(),
            Hca::Emulated(emu) => open_emulated(emu, 0),
        }
    }
}

impl core::fmt::Display for Hca {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Hca::Device(d) => write!(f, "{} ({})", d.name, d.dev_path.display()),
            Hca::Emulated(_) => f.write_str("mlx5_0 (emulated ConnectX in this process)"),
        }
    }
}

/// [`Context::open`] on HCA `hca` of `emu`.
///
/// # Errors
/// [`Error::Os`] naming the open with `ENODEV` if `emu` has no HCA `hca`; as
/// [`Context::open`].
pub fn open_emulated(emu: &Emulator, hca: usize) -> Result<Context> {
    let surface = emu.open(hca).map_err(|e| Error::Os {
        op: "open(emulated HCA)",
        errno: crate::error::Errno::from_raw(e.0),
    })?;
    Context::open(surface)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emulated_hca_opens_and_a_missing_one_is_named() {
        let emu = Emulator::new(EmuConfig::default());
        let hca = Hca::Emulated(emu.clone());
        assert!(hca.is_emulated());
        assert!(hca.to_string().contains("emulated"));
        let ctx = hca.open().unwrap();
        assert!(ctx.query_port(1).is_ok());
        let e = open_emulated(&emu, 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "open(emulated HCA) failed: ENODEV (No such device)"
        );
        // Every error type of the API converts into `Box<dyn Error>`.
        let boxed: Vec<Box<dyn std::error::Error>> = vec![
            e.into(),
            emu.open(7).unwrap_err().into(),
            crate::wr::PostError::BadOpcode.into(),
        ];
        assert!(boxed[1].to_string().contains("ENODEV"), "{}", boxed[1]);
    }
}
