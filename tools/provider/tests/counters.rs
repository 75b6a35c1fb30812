//! The IB port counters of the emulated sysfs (`ports/1/counters/`), counted as IB counts
//! them: PortXmitData/PortRcvData are the octets from the LRH to the ICRC, VCRC excluded,
//! divided by 4 (IBA 16.1.3.5). A UD SEND of S bytes on the emulated IB port (no GRH) is
//! LRH 8 + BTH 12 + DETH 8 + S padded to 4 + ICRC 4 octets.

mod common;
use common::{PAIRINGS, Side, pair, preload_env};

fn ud_words(s: u64) -> u64 {
    (8 + 12 + 8 + s.next_multiple_of(4) + 4) / 4
}

/// `tests/c/port_counters.c`: N UD SENDs of S bytes from a QP to itself, the counters read
/// by the program from `$SYSFS_PATH` before and after; then 3 with no receive posted, which
/// the port receives and `hw_counters/out_of_buffer` counts.
fn port_counters(side: Side, n: u64, s: u64) -> String {
    let dir = std::env::temp_dir().join(format!(
        "mlx5rs-counters-{}-{}-{s}",
        std::process::id(),
        side.name()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("port_counters");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/port_counters.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-O1", "-Wall", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-libverbs")
        .output()
        .unwrap_or_else(|e| panic!("{cc}: {e} (install gcc and libibverbs-dev)"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::process::Command::new(&exe)
        .args([n.to_string(), s.to_string()])
        .envs(preload_env(side))
        .env("MLX5_EMU_FABRIC", "inprocess")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}

#[test]
fn a_program_reads_n_ud_sends_of_s_bytes_in_its_sysfs_port_counters() {
    for side in [Side::Ours, Side::Libmlx5] {
        for (n, s) in [(100, 512), (37, 1001), (5, 0)] {
            let w = n * ud_words(s);
            let want = format!(
                "port_xmit_packets +{n}\nport_xmit_data +{w}\nport_rcv_packets +{n}\nport_rcv_data +{w}\nport_rcv_errors +0\nport_xmit_discards +0\nno receive posted: out_of_buffer +3 port_rcv_packets +3\n"
            );
            assert_eq!(port_counters(side, n, s), want, "{side:?} N={n} S={s}");
        }
    }
}

fn read_counter(tree: &std::path::Path, group: &str, name: &str) -> u64 {
    let p = tree
        .join("class/infiniband/mlx5_0/ports/1")
        .join(group)
        .join(name);
    let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    t.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}: {t:?}", p.display()))
}

#[test]
fn both_sides_of_ibv_ud_pingpong_count_its_packets_in_the_kept_sysfs_trees() {
    // Each side sends N datagrams of S bytes and receives N: with MLX5_EMU_KEEP_SYSFS the
    // trees stay after the processes exit, with the counters as they were at exit.
    let (n, s) = (20u64, 1024u64);
    let (server, client) = PAIRINGS[1];
    let tmp = std::env::temp_dir().join(format!("mlx5rs-kept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let tmp_s = tmp.display().to_string();
    pair(
        "ibv_ud_pingpong",
        &["-n", &n.to_string(), "-s", &s.to_string()],
        "-p",
        server,
        client,
        &[("TMPDIR", tmp_s.as_str()), ("MLX5_EMU_KEEP_SYSFS", "1")],
    );
    let trees: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("mlx5-emu-sysfs."))
        })
        .collect();
    assert_eq!(trees.len(), 2, "{trees:?}");
    for t in &trees {
        let got = |n| read_counter(t, "counters", n);
        assert_eq!(got("port_xmit_packets"), n, "{}", t.display());
        assert_eq!(got("port_rcv_packets"), n, "{}", t.display());
        assert_eq!(got("port_xmit_data"), n * ud_words(s), "{}", t.display());
        assert_eq!(got("port_rcv_data"), n * ud_words(s), "{}", t.display());
        assert_eq!(got("port_rcv_errors"), 0);
        assert_eq!(got("symbol_error"), 0);
        for g in ["counters", "hw_counters"] {
            let d = t.join("class/infiniband/mlx5_0/ports/1").join(g);
            for e in std::fs::read_dir(&d).unwrap() {
                let name = e.unwrap().file_name().into_string().unwrap();
                assert!(!name.starts_with('.'), "a temporary file left: {g}/{name}");
            }
        }
        // The mlx5 hw_counters are there, as numbers; a UD pingpong has no RC events.
        for h in [
            "out_of_sequence",
            "out_of_buffer",
            "duplicate_request",
            "local_ack_timeout_err",
        ] {
            assert_eq!(read_counter(t, "hw_counters", h), 0, "{h}");
        }
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}
