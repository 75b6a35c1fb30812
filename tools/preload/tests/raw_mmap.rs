//! A program with its own `mmap`/`munmap` (as UCX's bistro hooks make one) runs on the
//! emulated HCA: `c/raw_mmap.c` defines both itself and issues the system calls directly, so
//! libmlx5's UAR mapping of the uverbs descriptor never passes a libc-level hook. The
//! preload's seccomp trap serves it (`docs/emulator-preload.md`); the doorbells libmlx5 rings
//! on that page reach the device, which wakes on them (no 10 ms clock tick per operation).

use std::path::PathBuf;
use std::process::Command;

/// Compile `c/raw_mmap.c` once per test, run it with `args` and `env`.
fn run(tag: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/raw_mmap.c");
    let exe = std::env::temp_dir().join(format!("mlx5-raw-mmap-{}-{tag}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    mlx5_emu::cprog::compile_verbs_program(&cc, &["-O1", "-Wall", "-Werror"], &src, &exe)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(&exe);
    cmd.args(args)
        .env(
            "LD_PRELOAD",
            mlx5_emu::cprog::preload_so().unwrap_or_else(|e| panic!("{e}")),
        )
        .env_remove("SYSFS_PATH");
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("MLX5_EMU_FABRIC", "inprocess");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the program");
    let _ = std::fs::remove_file(&exe);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The numbers after `key` on each line that starts with it.
fn numbers(out: &str, key: &str) -> Vec<Vec<u64>> {
    out.lines()
        .filter_map(|l| l.strip_prefix(key))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect()
        })
        .collect()
}

#[test]
fn doorbells_on_a_uar_mapped_below_libc_are_executed() {
    let (ok, out, err) = run("plain", &[], &[("MLX5_EMU_TRACE", "1")]);
    assert!(ok, "the program failed\n{out}\n{err}");
    let ops = numbers(&out, "ops ");
    assert_eq!(ops.len(), 1, "{out}");
    // Every doorbell woke the device: with a device that only noticed doorbells on its
    // 10 ms clock tick an operation would take milliseconds.
    let (n, ns) = (ops[0][0], ops[0][1]);
    assert_eq!(n, 200);
    assert!(
        ns < 2_000_000,
        "{ns} ns per operation: the doorbell did not wake the device"
    );
    assert!(
        out.contains("direct uar ok\n") && out.contains("forwarded ok\n"),
        "{out}"
    );
    // The program's own hooks saw the UAR mappings and their removal (they are not
    // libc's), and each reached the emulator: every device mapping made is unmapped.
    let hooked = numbers(&out, "hooked mmap ");
    assert!(hooked[0][0] >= 2 && hooked[0][1] >= 2, "{out}");
    let maps = err
        .lines()
        .filter(|l| l.contains(" mmap fd ") && l.contains("-> ok"))
        .count();
    let unmaps = err
        .lines()
        .filter(|l| l.contains(" munmap ") && l.contains("-> ok"))
        .count();
    assert!(maps >= 2, "no device mapping reached the emulator\n{err}");
    assert_eq!(maps, unmaps, "device mappings left behind\n{err}");
}

#[test]
fn without_the_trap_the_uar_mapping_reaches_the_kernel() {
    // The failure the trap exists for: the kernel's /dev/null cannot map a UAR page.
    let (ok, out, err) = run("off", &[], &[("MLX5_EMU_SYSCALL_TRAP", "0")]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("ibv_open_device") && err.contains("No such device"),
        "{err}"
    );
}

#[test]
fn a_program_started_by_exec_inherits_the_filter_and_runs_again() {
    let (ok, out, err) = run("exec", &["exec"], &[]);
    assert!(ok, "the program or its exec'ed image failed\n{out}\n{err}");
    assert_eq!(numbers(&out, "ops ").len(), 2, "{out}\n{err}");
    assert_eq!(out.matches("forwarded ok\n").count(), 2, "{out}");
}
