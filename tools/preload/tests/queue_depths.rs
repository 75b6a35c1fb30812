//! Queue depths through unmodified libibverbs/libmlx5 on the emulated HCA: what a program is
//! told a receive queue holds is what it accepts, and what the kernel reports on a query is
//! what mlx5_ib reports (`c/queue_depths.c` prints the figures).
//!
//! mlx5_ib's QUERY_QP answers a user QP's `max_recv_wr` with the RQ's WQE count (the depth as
//! created, a power of two) and its `max_recv_sge` with the data segments a receive WQE holds;
//! the emulated kernel used to echo the depth asked for at creation, so a program that asked
//! for 1 receive and queried was told 1 while the queue took 4. An SRQ's query answers the
//! kernel's depth, which counts libmlx5's wait queue (mlx5_ib: the WQE count less one), so it
//! is larger than what ibv_create_srq told; libmlx5 accepts what it told.

use std::path::PathBuf;
use std::process::Command;

/// Runs the probe with `env`: (exit success, stdout, stderr).
fn probe(env: &[(&str, &str)]) -> (bool, String, String) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/queue_depths.c");
    let exe = std::env::temp_dir().join(format!(
        "mlx5-queue-depths-{}-{}",
        std::process::id(),
        env.len()
    ));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    mlx5_emu::cprog::compile_verbs_program(&cc, &["-O1", "-Wall", "-Werror"], &src, &exe)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(&exe);
    cmd.env(
        "LD_PRELOAD",
        mlx5_emu::cprog::preload_so().unwrap_or_else(|e| panic!("{e}")),
    )
    .env_remove("SYSFS_PATH");
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_EMU_") && k != "MLX5_EMU_PRELOAD_SO" || k.starts_with("MLX_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("MLX5_EMU_FABRIC", "inprocess");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the probe");
    let _ = std::fs::remove_file(&exe);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run_probe() -> String {
    let (ok, stdout, stderr) = probe(&[]);
    assert!(ok, "probe failed\n{stdout}\n{stderr}");
    stdout
}

/// `(kind, asked, [told, query, ...])` per line.
fn lines(out: &str) -> Vec<(String, u32, Vec<u32>)> {
    out.lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let nums = w[2..]
                .chunks(2)
                .map(|p| p[1].parse().expect("number"))
                .collect();
            (w[0].to_string(), w[1].parse().expect("asked"), nums)
        })
        .collect()
}

#[test]
fn a_receive_queue_accepts_exactly_the_depth_the_program_is_told() {
    let out = run_probe();
    let l = lines(&out);
    assert_eq!(l.len(), 12, "{out}");
    for (kind, ask, v) in &l {
        if kind == "qp" {
            let (told, query, sge, accepted) = (v[0], v[1], v[2], v[3]);
            // libmlx5 sizes the RQ: the asked depth rounded up to a power of two (a 64-byte
            // ring at least).
            assert!(told >= *ask && told.is_power_of_two(), "{out}");
            // The kernel reports the RQ as created (failed on the old emulated kernel: it
            // echoed the asked depth, 1 for a queue that took 4).
            assert_eq!(query, told, "{out}");
            assert_eq!(accepted, told, "{out}");
            assert!(sge >= 1, "{out}");
        } else {
            let (told, query, accepted) = (v[0], v[1], v[2]);
            assert_eq!(accepted, told, "{out}");
            assert!(told >= *ask && query > told, "{out}");
            // mlx5_ib: the SRQ's WQE count (a power of two) less one.
            assert!((query + 1).is_power_of_two(), "{out}");
        }
    }
}

/// Free huge pages of the default size (`HugePages_Free` in /proc/meminfo).
fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// libmlx5 puts queue buffers in huge pages when asked (`MLX_{QP,SRQ,CQ}_ALLOC_TYPE=HUGE`:
/// SysV shared memory with SHM_HUGETLB), and the emulated kernel pins them as mlx5_ib does:
/// every queue is created and works. Without free huge pages libmlx5 itself fails with ENOMEM
/// before any command reaches the kernel, as on any machine; `.ci/run` reserves a few huge
/// pages so CI takes the first branch.
#[test]
fn queues_in_huge_pages_are_accepted() {
    let huge = [
        ("MLX_QP_ALLOC_TYPE", "HUGE"),
        ("MLX_SRQ_ALLOC_TYPE", "HUGE"),
        ("MLX_CQ_ALLOC_TYPE", "HUGE"),
    ];
    let free = free_huge_pages();
    let (ok, stdout, stderr) = probe(&huge);
    if free >= 8 {
        assert!(ok, "{free} free huge pages\n{stdout}\n{stderr}");
        assert_eq!(lines(&stdout).len(), 12, "{stdout}");
    } else if !ok {
        assert!(
            stderr.contains("Cannot allocate memory"),
            "{free} free huge pages: libmlx5's ENOMEM expected\n{stdout}\n{stderr}"
        );
    }
}
