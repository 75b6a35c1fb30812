//! Configuration from environment variables.
//!
//! | variable | values | default |
//! |---|---|---|
//! | `MLX5_EMU_FLAVOUR` | `write` (no ioctl: `ENOTTY`), `eproto` (every method `EPROTONOSUPPORT`), `modern` | `modern` |
//! | `MLX5_EMU_HCAS` | number of HCAs, 1..=16 (`mlx5_0`.. / `uverbs0`..) | 1 |
//! | `MLX5_EMU_CQE_VERSION` | 0 or 1 | 1 |
//! | `MLX5_EMU_BF_REG_SIZE` | BlueFlame register size in bytes, 0 = no BlueFlame | 512 |
//! | `MLX5_EMU_DYN_UAR` | `1`: contexts asking for dynamic UARs get them (`tot_bfregs = 0`, `UAR_OBJ_ALLOC`; modern flavour) | off |
//! | `MLX5_EMU_LINK_LAYER` | `ib` (InfiniBand port), `eth` (Ethernet: a RoCE port with RoCE v1/v2 GIDs; aliases `ethernet`, `roce`) | `ib` |
//! | `MLX5_EMU_ETH_MIN_INLINE` | Ethernet ports: header bytes a raw send WQE must inline: `none` (ConnectX-5), `l2` (18 bytes) | `none` |
//! | `MLX5_EMU_FABRIC` | `udp` (RoCEv2 over loopback UDP: processes reach each other), `inprocess` | `udp` |
//! | `MLX5_EMU_NODE` | LID of HCA 0, 1..=254 (HCA i gets node + i); unset: first free | unset |
//! | `MLX5_EMU_PCAP` | write every packet this process puts on the fabric to this pcap file | unset |
//! | `MLX5_EMU_FAULT_SEED`, `MLX5_EMU_DROP_PPM`, `MLX5_EMU_DUP_PPM`, `MLX5_EMU_REORDER_PPM`, `MLX5_EMU_CORRUPT_PPM`, `MLX5_EMU_DELAY_NS` | fabric fault injection | 0 |
//! | `MLX5_EMU_WQE_LOG` | append one line per send WQE the device fetches to this file | unset |
//! | `MLX5_EMU_TRACE` | `1`: one line per intercepted device call on stderr | off |
//! | `MLX5_EMU_KEEP_SYSFS` | `1`: do not delete the fake sysfs tree at exit | off |
//! | `MLX5_EMU_SYSCALL_TRAP` | `0`: do not intercept the `mmap`/`munmap` system calls that bypass libc (no seccomp filter; `docs/emulator-preload.md`) | on |
//!
//! A malformed value is reported once on stderr and the default is used: the host program
//! keeps running.

use mlx5_emu::{EmuConfig, Fabric, FaultConfig, Flavour, LinkLayer, RunMode};

/// Largest `MLX5_EMU_HCAS` accepted (minor numbers 192.. stay below 256).
pub(crate) const MAX_HCAS: usize = 16;

/// Everything the shim reads from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// The emulator configuration (always [`RunMode::Threaded`]: the device runs by itself).
    pub(crate) emu: EmuConfig,
    /// Trace every device call on stderr.
    pub(crate) trace: bool,
    /// Keep the sysfs tree after exit.
    pub(crate) keep_sysfs: bool,
    /// Log every fetched send WQE to this file (`Emulator::log_wqes_to`).
    pub(crate) wqe_log: Option<std::path::PathBuf>,
    /// Intercept `mmap`/`munmap` system calls that bypass libc (the `trap` module).
    pub(crate) syscall_trap: bool,
}

impl Config {
    /// Parse from a variable lookup (`std::env::var` in the shim, a table in tests).
    /// Returns the configuration and one message per rejected value.
    pub(crate) fn parse(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut warnings = Vec::new();
        // Threaded: the device runs by itself. UDP: the rdma-core tools are pairs of processes.
        let mut emu = EmuConfig {
            mode: RunMode::Threaded,
            fabric: Fabric::Udp,
            ..EmuConfig::default()
        };
        if let Some(v) = get("MLX5_EMU_FLAVOUR") {
            match v.trim().to_ascii_lowercase().as_str() {
                "write" | "write-only" | "writeonly" => emu.flavour = Flavour::WriteOnly,
                "eproto" => emu.flavour = Flavour::Eproto,
                "modern" | "ioctl" => emu.flavour = Flavour::Modern,
                _ => warnings.push(format!(
                    "MLX5_EMU_FLAVOUR={v:?} is not one of write|eproto|modern; using modern"
                )),
            }
        }
        if let Some(v) = get("MLX5_EMU_HCAS") {
            match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_HCAS).contains(&n) => emu.num_hcas = n,
                _ => warnings.push(format!(
                    "MLX5_EMU_HCAS={v:?} is not a number in 1..={MAX_HCAS}; using 1"
                )),
            }
        }
        if let Some(v) = get("MLX5_EMU_CQE_VERSION") {
            match v.trim().parse::<u8>() {
                Ok(n @ 0..=1) => emu.cqe_version = n,
                _ => warnings.push(format!("MLX5_EMU_CQE_VERSION={v:?} is not 0 or 1; using 1")),
            }
        }
        if let Some(v) = get("MLX5_EMU_BF_REG_SIZE") {
            match v.trim().parse::<u32>() {
                Ok(n) if n == 0 || (n.is_power_of_two() && (64..=2048).contains(&n)) => {
                    emu.bf_reg_size = n
                }
                _ => warnings.push(format!(
                    "MLX5_EMU_BF_REG_SIZE={v:?} is not 0 or a power of two in 64..=2048; using 512"
                )),
            }
        }
        if let Some(v) = get("MLX5_EMU_LINK_LAYER") {
            match v.trim().to_ascii_lowercase().as_str() {
                "ib" | "infiniband" => emu.link_layer = LinkLayer::InfiniBand,
                "eth" | "ethernet" | "roce" => emu.link_layer = LinkLayer::Ethernet,
                _ => warnings.push(format!("MLX5_EMU_LINK_LAYER={v:?} is not ib|eth; using ib")),
            }
        }
        if let Some(v) = get("MLX5_EMU_ETH_MIN_INLINE") {
            match v.trim().to_ascii_lowercase().as_str() {
                "none" => emu.eth_min_inline = mlx5_emu::EthMinInline::None,
                "l2" => emu.eth_min_inline = mlx5_emu::EthMinInline::L2,
                _ => warnings.push(format!(
                    "MLX5_EMU_ETH_MIN_INLINE={v:?} is not none|l2; using none"
                )),
            }
        }
        if let Some(v) = get("MLX5_EMU_FABRIC") {
            match v.trim().to_ascii_lowercase().as_str() {
                "udp" => emu.fabric = Fabric::Udp,
                "inprocess" | "in-process" | "local" => emu.fabric = Fabric::InProcess,
                _ => warnings.push(format!(
                    "MLX5_EMU_FABRIC={v:?} is not udp|inprocess; using udp"
                )),
            }
        }
        if let Some(v) = get("MLX5_EMU_NODE") {
            match v.trim().parse::<u16>() {
                Ok(n @ 1..=254) => emu.node = Some(n),
                _ => warnings.push(format!(
                    "MLX5_EMU_NODE={v:?} is not in 1..=254; picking a free one"
                )),
            }
        }
        if let Some(v) = get("MLX5_EMU_PCAP").filter(|v| !v.is_empty()) {
            emu.pcap = Some(v.into());
        }
        let mut number = |name: &str, slot: &mut u64, max: u64| {
            if let Some(v) = get(name) {
                match v.trim().parse::<u64>() {
                    Ok(n) if n <= max => *slot = n,
                    _ => warnings.push(format!(
                        "{name}={v:?} is not a number in 0..={max}; using 0"
                    )),
                }
            }
        };
        let (mut seed, mut delay) = (0, 0);
        let (mut drop, mut dup, mut reorder, mut corrupt) = (0, 0, 0, 0);
        number("MLX5_EMU_FAULT_SEED", &mut seed, u64::MAX);
        number("MLX5_EMU_DROP_PPM", &mut drop, 1_000_000);
        number("MLX5_EMU_DUP_PPM", &mut dup, 1_000_000);
        number("MLX5_EMU_REORDER_PPM", &mut reorder, 1_000_000);
        number("MLX5_EMU_CORRUPT_PPM", &mut corrupt, 1_000_000);
        number("MLX5_EMU_DELAY_NS", &mut delay, 10_000_000_000);
        // The ppm values are bounded by 1e6 above, so they fit in u32.
        let ppm = |v: u64| u32::try_from(v).unwrap_or(1_000_000);
        emu.fault = FaultConfig {
            seed,
            drop_ppm: ppm(drop),
            dup_ppm: ppm(dup),
            reorder_ppm: ppm(reorder),
            delay_ns: delay,
        };
        emu.corrupt_ppm = ppm(corrupt);
        let flag = |name: &str| get(name).is_some_and(|v| !matches!(v.trim(), "" | "0"));
        emu.dyn_uar = flag("MLX5_EMU_DYN_UAR");
        emu.tap = mlx5_emu::TapConfig::from_env();
        let cfg = Config {
            emu,
            trace: flag("MLX5_EMU_TRACE"),
            keep_sysfs: flag("MLX5_EMU_KEEP_SYSFS"),
            syscall_trap: get("MLX5_EMU_SYSCALL_TRAP").is_none_or(|v| v.trim() != "0"),
            wqe_log: get("MLX5_EMU_WQE_LOG")
                .filter(|v| !v.is_empty())
                .map(Into::into),
        };
        (cfg, warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> (Config, Vec<String>) {
        Config::parse(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_are_one_threaded_modern_hca() {
        let (cfg, warnings) = parse(&[]);
        assert!(warnings.is_empty());
        assert_eq!(cfg.emu.num_hcas, 1);
        assert_eq!(cfg.emu.mode, RunMode::Threaded);
        assert_eq!(cfg.emu.flavour, Flavour::Modern);
        assert_eq!(cfg.emu.fabric, Fabric::Udp);
        assert_eq!(cfg.emu.node, None);
        assert_eq!(cfg.emu.fault, FaultConfig::default());
        assert_eq!(cfg.emu.link_layer, LinkLayer::InfiniBand);
        assert!(!cfg.trace && !cfg.keep_sysfs);
        assert_eq!(cfg.wqe_log, None);
        assert!(!cfg.emu.dyn_uar);
        assert!(cfg.syscall_trap);
    }

    #[test]
    fn every_variable_is_honoured() {
        let (cfg, warnings) = parse(&[
            ("MLX5_EMU_FLAVOUR", "Write"),
            ("MLX5_EMU_HCAS", "3"),
            ("MLX5_EMU_CQE_VERSION", "0"),
            ("MLX5_EMU_BF_REG_SIZE", "0"),
            ("MLX5_EMU_TRACE", "1"),
            ("MLX5_EMU_KEEP_SYSFS", "yes"),
            ("MLX5_EMU_FABRIC", "inprocess"),
            ("MLX5_EMU_NODE", "7"),
            ("MLX5_EMU_PCAP", "/tmp/x.pcap"),
            ("MLX5_EMU_FAULT_SEED", "42"),
            ("MLX5_EMU_DROP_PPM", "50000"),
            ("MLX5_EMU_DUP_PPM", "10000"),
            ("MLX5_EMU_REORDER_PPM", "20000"),
            ("MLX5_EMU_CORRUPT_PPM", "30000"),
            ("MLX5_EMU_DELAY_NS", "1000"),
            ("MLX5_EMU_WQE_LOG", "/tmp/wqes.log"),
            ("MLX5_EMU_DYN_UAR", "1"),
            ("MLX5_EMU_LINK_LAYER", "RoCE"),
            ("MLX5_EMU_ETH_MIN_INLINE", "L2"),
            ("MLX5_EMU_SYSCALL_TRAP", "0"),
        ]);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.emu.flavour, Flavour::WriteOnly);
        assert_eq!(cfg.emu.num_hcas, 3);
        assert_eq!(cfg.emu.cqe_version, 0);
        assert_eq!(cfg.emu.bf_reg_size, 0);
        assert!(cfg.trace && cfg.keep_sysfs);
        assert_eq!(
            cfg.wqe_log.as_deref(),
            Some(std::path::Path::new("/tmp/wqes.log"))
        );
        assert_eq!(cfg.emu.fabric, Fabric::InProcess);
        assert!(cfg.emu.dyn_uar);
        assert!(!cfg.syscall_trap);
        assert_eq!(cfg.emu.link_layer, LinkLayer::Ethernet);
        assert_eq!(cfg.emu.eth_min_inline, mlx5_emu::EthMinInline::L2);
        assert_eq!(cfg.emu.node, Some(7));
        assert_eq!(
            cfg.emu.pcap.as_deref(),
            Some(std::path::Path::new("/tmp/x.pcap"))
        );
        let f = cfg.emu.fault;
        assert_eq!((f.seed, f.delay_ns), (42, 1000));
        assert_eq!(
            (f.drop_ppm, f.dup_ppm, f.reorder_ppm, cfg.emu.corrupt_ppm),
            (50_000, 10_000, 20_000, 30_000)
        );
        assert_eq!(
            parse(&[("MLX5_EMU_FLAVOUR", "eproto")]).0.emu.flavour,
            Flavour::Eproto
        );
    }

    #[test]
    fn bad_values_warn_and_keep_defaults() {
        let (cfg, warnings) = parse(&[
            ("MLX5_EMU_FLAVOUR", "ancient"),
            ("MLX5_EMU_HCAS", "0"),
            ("MLX5_EMU_CQE_VERSION", "2"),
            ("MLX5_EMU_BF_REG_SIZE", "500"),
            ("MLX5_EMU_TRACE", "0"),
            ("MLX5_EMU_FABRIC", "ethernet"),
            ("MLX5_EMU_NODE", "255"),
            ("MLX5_EMU_DROP_PPM", "1000001"),
            ("MLX5_EMU_LINK_LAYER", "fddi"),
            ("MLX5_EMU_ETH_MIN_INLINE", "tcp"),
        ]);
        assert_eq!(warnings.len(), 9, "{warnings:?}");
        assert!(warnings[0].contains("ancient"));
        assert_eq!(cfg, parse(&[]).0);
        assert!(!cfg.trace);
        assert!(!parse(&[("MLX5_EMU_HCAS", "17")]).1.is_empty());
    }
}
