//! The port counters in the emulated sysfs: `class/infiniband/<ibdev>/ports/1/counters/`
//! (the IB port counters, named as mlx5_ib's sysfs names them) and `ports/1/hw_counters/`
//! (the mlx5 `hw_counters` the emulator keeps), from the emulated device's `Counters`.
//!
//! The files are rewritten (each to a temporary name, then renamed: a reader sees an old or
//! a new value, never half of one) when the tree is made, every [`REFRESH`] by a background
//! thread, and at exit: a reader (the program itself, `cat`, `mlx5 counters --emu-pid PID`
//! from another shell) is at most [`REFRESH`] behind the device. With `MLX5_EMU_KEEP_SYSFS`
//! the tree outlives the process with the counters as they were at its exit.
//!
//! `port_xmit_data`/`port_rcv_data` are octets / 4 as IB counts them
//! (mlx5-emu `device/counters.rs`); `port_rcv_errors` is the received packets the device
//! could not parse (bad ICRC, truncated); `unicast_*` equal the packet counts (multicast
//! copies included); the link-level error counters are 0 (the emulated link has none).

use std::io;
use std::path::Path;
use std::time::Duration;

use mlx5_emu::{Counters, Emulator};

/// How often the background thread rewrites the files.
// The unit-test build has no shim (the hooks that call these).
#[cfg_attr(test, allow(dead_code))]
pub(crate) const REFRESH: Duration = Duration::from_millis(100);

/// The files of `ports/1/counters/` and their values.
pub(crate) fn port_counters(c: &Counters) -> [(&'static str, u64); 21] {
    [
        ("symbol_error", 0),
        ("link_error_recovery", 0),
        ("link_downed", 0),
        ("port_rcv_errors", c.rx_bad_packets),
        ("port_rcv_remote_physical_errors", 0),
        ("port_rcv_switch_relay_errors", 0),
        ("port_xmit_discards", 0),
        ("port_xmit_constraint_errors", 0),
        ("port_rcv_constraint_errors", 0),
        ("local_link_integrity_errors", 0),
        ("excessive_buffer_overrun_errors", 0),
        ("VL15_dropped", 0),
        ("port_xmit_data", c.port_xmit_octets / 4),
        ("port_rcv_data", c.port_rcv_octets / 4),
        ("port_xmit_packets", c.port_xmit_packets),
        ("port_rcv_packets", c.port_rcv_packets),
        ("port_xmit_wait", 0),
        ("unicast_xmit_packets", c.port_xmit_packets),
        ("unicast_rcv_packets", c.port_rcv_packets),
        ("multicast_xmit_packets", 0),
        ("multicast_rcv_packets", 0),
    ]
}

/// Write both directories of one HCA under `port` (`.../ports/1`): every value to its
/// temporary file first, then the renames in one quick pass, so that a reader of several
/// files rarely sees two refreshes mixed (each file is always whole). One writer at a time
/// (the refresher and the exit write share the temporary names).
#[cfg(test)]
pub(crate) fn write(port: &Path, c: &Counters) -> io::Result<()> {
    let _one = ONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    write_locked(port, c)
}

/// One writer at a time: the refresher and the exit write share the temporary names.
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Set by the exit write: the refresher starts no write after it (the process ends while
/// it runs, and a write cut between its files and its renames would leave `.name.new`
/// files in a kept tree).
static FINAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn write_locked(port: &Path, c: &Counters) -> io::Result<()> {
    let (d, h) = (port.join("counters"), port.join("hw_counters"));
    std::fs::create_dir_all(&d)?;
    std::fs::create_dir_all(&h)?;
    let files = port_counters(c)
        .into_iter()
        .map(|(n, v)| (&d, n, v))
        .chain(c.hw_counters().map(|(n, v)| (&h, n, v)));
    let mut staged = Vec::with_capacity(64);
    for (dir, n, v) in files {
        let tmp = dir.join(format!(".{n}.new"));
        std::fs::write(&tmp, format!("{v}\n"))?;
        staged.push((tmp, dir.join(n)));
    }
    for (tmp, to) in staged {
        std::fs::rename(tmp, to)?;
    }
    Ok(())
}

/// Write the counters of every HCA of `emu` in the tree at `root`.
// The unit-test build has no shim (the hooks that call these).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn write_all(root: &Path, emu: &Emulator) -> io::Result<()> {
    for_each_port(root, emu, |port, c| {
        let _one = ONE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if FINAL.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        // An idle device's counters do not move: rewriting its ~60 files ten times a second
        // cost an idle server a quarter of a core. Only what changed since the last write
        // is written (the files always hold the last values written).
        let mut last = LAST
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.iter().any(|(p, prev)| p == port && prev == c) {
            return Ok(());
        }
        write_locked(port, c)?;
        match last.iter_mut().find(|(p, _)| p == port) {
            Some(e) => e.1 = *c,
            None => last.push((port.to_path_buf(), *c)),
        }
        Ok(())
    })
}

/// What the refresher last wrote for each port directory.
static LAST: std::sync::Mutex<Vec<(std::path::PathBuf, Counters)>> =
    std::sync::Mutex::new(Vec::new());

/// `f(port directory, counters)` for every HCA of `emu` in the tree at `root`.
fn for_each_port(
    root: &Path,
    emu: &Emulator,
    mut f: impl FnMut(&Path, &Counters) -> io::Result<()>,
) -> io::Result<()> {
    for i in 0..emu.num_hcas() {
        let Some(info) = emu.hca_info(i) else {
            continue;
        };
        let port = root
            .join("class/infiniband")
            .join(&info.name)
            .join("ports/1");
        f(&port, &emu.counters(i))?;
    }
    Ok(())
}

/// The last write, at exit: waits for a refresh in progress to finish, writes every HCA's
/// counters, and stops the refresher from starting another.
// The unit-test build has no shim (the hooks that call these).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn write_final(root: &Path, emu: &Emulator) -> io::Result<()> {
    let _one = ONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    FINAL.store(true, std::sync::atomic::Ordering::Release);
    for_each_port(root, emu, write_locked)
}

/// Rewrite the files every [`REFRESH`] until the tree is gone.
// The unit-test build has no shim (the hooks that call these).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn start_refresher(root: std::path::PathBuf, emu: &'static Emulator) {
    let _ = std::thread::Builder::new()
        .name("mlx5-emu-counters".into())
        .spawn(move || {
            loop {
                std::thread::sleep(REFRESH);
                if !root.exists() || write_all(&root, emu).is_err() {
                    return;
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_counters_are_octets_over_four_and_the_names_are_mlx5_ibs() {
        let c = Counters {
            port_xmit_octets: 4 * 1000 + 3,
            port_rcv_octets: 48,
            port_xmit_packets: 5,
            port_rcv_packets: 2,
            rx_bad_packets: 1,
            out_of_buffer: 9,
            ..Counters::default()
        };
        let p = port_counters(&c);
        let get = |n: &str| p.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        assert_eq!(get("port_xmit_data"), Some(1000));
        assert_eq!(get("port_rcv_data"), Some(12));
        assert_eq!(get("port_xmit_packets"), Some(5));
        assert_eq!(get("port_rcv_packets"), Some(2));
        assert_eq!(get("port_rcv_errors"), Some(1));
        let dir =
            std::env::temp_dir().join(format!("mlx5-emu-counters-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write(&dir, &c).unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
        assert_eq!(read("counters/port_xmit_data"), "1000\n");
        assert_eq!(read("hw_counters/out_of_buffer"), "9\n");
        assert!(!dir.join("counters/.port_xmit_data.new").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_writers_leave_no_temporary_file() {
        // The refresher and the exit write once raced on the same temporary name and left
        // an empty `.NAME.new` in a kept tree.
        let dir =
            std::env::temp_dir().join(format!("mlx5-emu-counters-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let dir = &dir;
                s.spawn(move || {
                    for i in 0..20 {
                        let c = Counters {
                            port_xmit_packets: t * 1000 + i,
                            ..Counters::default()
                        };
                        write(dir, &c).unwrap();
                    }
                });
            }
        });
        for sub in ["counters", "hw_counters"] {
            for e in std::fs::read_dir(dir.join(sub)).unwrap() {
                let name = e.unwrap().file_name().into_string().unwrap();
                assert!(!name.starts_with('.'), "{sub}/{name} left behind");
                let v = std::fs::read_to_string(dir.join(sub).join(&name)).unwrap();
                assert!(v.trim().parse::<u64>().is_ok(), "{sub}/{name}: {v:?}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_refresher_rewrites_only_what_changed() {
        // An idle server's refresher rewrote every file ten times a second (a quarter of a
        // core); an unchanged port is now left alone, a changed one is written.
        let emu = mlx5_emu::Emulator::new(mlx5_emu::EmuConfig::default());
        let root =
            std::env::temp_dir().join(format!("mlx5-emu-counters-idle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let name = emu.hca_info(0).unwrap().name;
        let port = root.join("class/infiniband").join(&name).join("ports/1");
        write_all(&root, &emu).unwrap();
        let file = port.join("counters/port_xmit_packets");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "0\n");
        std::fs::remove_file(&file).unwrap();
        write_all(&root, &emu).unwrap();
        assert!(!file.exists(), "unchanged counters rewritten");
        // Another tree (another port directory) is written the first time.
        let root2 = root.join("second");
        write_all(&root2, &emu).unwrap();
        let file2 = root2
            .join("class/infiniband")
            .join(&name)
            .join("ports/1/counters/port_xmit_packets");
        assert!(file2.exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
