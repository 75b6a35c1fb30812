//! `mlx5 counters`: a fake sysfs tree (SYSFS_PATH) is read right, deltas follow the files,
//! garbage in a counter file is a named error, and on the emulator N SENDs give deltas of N on
//! the counters that count them.

use std::path::{Path, PathBuf};
use std::process::Command;

use mlx5_emu::Counters;
use mlx5_tools::cli::CountersArgs;
use mlx5_tools::counters::{
    deltas, emu_sample, parse_debug_counters, parse_value, read_sysfs, run, sysfs_device,
};

fn tree(tag: &str) -> PathBuf {
    let root =
        std::env::temp_dir().join(format!("mlx5-counters-test.{}.{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let put = |rel: &str, v: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, v).unwrap();
    };
    let d = "class/infiniband/mlx5_3/ports";
    put(&format!("{d}/1/counters/port_xmit_data"), "123456\n");
    put(&format!("{d}/1/counters/port_rcv_packets"), "7\n");
    put(&format!("{d}/1/counters/symbol_error"), "0\n");
    // A writer's temporary file, empty: not a counter (and no error).
    put(&format!("{d}/1/counters/.port_rcv_packets.new"), "");
    put(&format!("{d}/1/hw_counters/out_of_sequence"), "0\n");
    put(&format!("{d}/1/hw_counters/rnr_nak_retry_err"), "5\n");
    put(
        &format!("{d}/2/counters/port_xmit_data"),
        "18446744073709551615\n",
    );
    put(
        "class/infiniband/mlx5_9/ports/1/counters/port_xmit_data",
        "1\n",
    );
    root
}

fn args() -> CountersArgs {
    CountersArgs {
        dev: None,
        interval: None,
        count: None,
        port: None,
        emu: false,
        emu_pid: None,
        load: None,
        ops: 100,
        all: false,
    }
}

fn set(root: &Path, rel: &str, v: &str) {
    std::fs::write(root.join("class/infiniband/mlx5_3/ports").join(rel), v).unwrap();
}

#[test]
fn fake_sysfs_tree_is_read_right() {
    let root = tree("read");
    assert_eq!(sysfs_device(&root, None).unwrap(), "mlx5_3");
    assert_eq!(sysfs_device(&root, Some("mlx5_9")).unwrap(), "mlx5_9");
    let e = sysfs_device(&root, Some("mlx5_7")).unwrap_err();
    assert!(
        e.contains("no device \"mlx5_7\"") && e.contains("mlx5_3, mlx5_9"),
        "{e}"
    );
    let s = read_sysfs(&root, "mlx5_3", None).unwrap();
    assert_eq!(s.get("port1/counters", "port_xmit_data"), Some(123_456));
    assert_eq!(s.get("port1/counters", "port_rcv_packets"), Some(7));
    assert_eq!(s.get("port1/counters", "symbol_error"), Some(0));
    assert_eq!(s.get("port1/hw_counters", "rnr_nak_retry_err"), Some(5));
    assert_eq!(s.get("port1/hw_counters", "out_of_sequence"), Some(0));
    assert_eq!(s.get("port2/counters", "port_xmit_data"), Some(u64::MAX));
    assert_eq!(s.counters.len(), 6);
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    let one = read_sysfs(&root, "mlx5_3", Some(2)).unwrap();
    assert_eq!(one.counters.len(), 1);
    let e = read_sysfs(&root, "mlx5_3", Some(3)).unwrap_err();
    assert!(e.contains("has no port 3 (ports: 1, 2)"), "{e}");
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn deltas_follow_the_files_between_samples() {
    let root = tree("delta");
    let mut outs = Vec::new();
    let mut k = 0;
    let a = CountersArgs {
        dev: Some("mlx5_3".into()),
        port: Some(1),
        interval: Some(0.0),
        count: Some(3),
        ..args()
    };
    run(&a, &root, &mut |s| {
        outs.push(s.to_owned());
        k += 1;
        if k == 1 {
            set(&root, "1/counters/port_xmit_data", "123556\n");
            set(&root, "1/hw_counters/rnr_nak_retry_err", "8\n");
        }
    })
    .unwrap();
    assert_eq!(outs.len(), 3);
    assert!(
        outs[0].contains("mlx5_3") && outs[0].contains("sample 1"),
        "{}",
        outs[0]
    );
    let line = |o: &str, name: &str| -> Vec<String> {
        o.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing in\n{o}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(line(&outs[0], "port1/counters/port_xmit_data")[1], "123456");
    assert!(
        outs[0].contains("(2 counters at 0 not shown"),
        "{}",
        outs[0]
    );
    let x = line(&outs[1], "port1/counters/port_xmit_data");
    assert_eq!((x[1].as_str(), x[2].as_str()), ("123556", "+100"));
    let x = line(&outs[1], "port1/hw_counters/rnr_nak_retry_err");
    assert_eq!((x[1].as_str(), x[2].as_str()), ("8", "+3"));
    assert!(
        !outs[1].contains("port_rcv_packets"),
        "unchanged counters are not shown"
    );
    assert!(outs[2].contains("(no counter changed)"), "{}", outs[2]);
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn garbage_in_a_counter_file_is_a_named_error() {
    for (bad, want) in [
        ("12abc\n", "\"12abc\" is not a counter value"),
        ("\n", "empty: no counter value"),
        ("-3\n", "\"-3\" is not a counter value"),
        ("99999999999999999999999\n", "is not a counter value"),
    ] {
        let root = tree("garbage");
        set(&root, "1/counters/port_rcv_packets", bad);
        let e = read_sysfs(&root, "mlx5_3", None).unwrap_err();
        assert!(e.contains("port1/counters/port_rcv_packets"), "{e}");
        assert!(e.contains(want), "{bad:?}: {e}");
        let _ = std::fs::remove_dir_all(root);
    }
    assert_eq!(parse_value(" 42 \n"), Ok(42));
    let long = "x".repeat(500);
    let e = parse_value(&long).unwrap_err();
    assert!(e.len() < 120, "the quote is cut: {e}");
}

#[test]
fn binary_honours_sysfs_path() {
    let root = tree("bin");
    let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args(["counters", "-a"])
        .env("SYSFS_PATH", &root)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(so.starts_with("mlx5_3 ("), "{so}");
    for (name, v) in [
        ("port1/counters/port_xmit_data", "123456"),
        ("port1/counters/symbol_error", "0"),
        ("port1/hw_counters/rnr_nak_retry_err", "5"),
        ("port2/counters/port_xmit_data", "18446744073709551615"),
    ] {
        assert!(
            so.lines().any(|l| {
                let t: Vec<&str> = l.split_whitespace().collect();
                t == [name, v]
            }),
            "{name} {v} missing:\n{so}"
        );
    }
    set(&root, "2/counters/port_xmit_data", "lots\n");
    let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args(["counters", "-d", "mlx5_3"])
        .env("SYSFS_PATH", &root)
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(
        se.contains("port2/counters/port_xmit_data") && se.contains("\"lots\""),
        "{se}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args(["counters", "--interval=-1"])
        .env("SYSFS_PATH", &root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("interval"));
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn emulator_deltas_match_the_sends_done() {
    let mut p = mlx5_tools::live::Pair::new().unwrap();
    p.emulator().count_link(true);
    let s0 = emu_sample(&p.emulator().counters(0));
    p.sends(25, 64).unwrap();
    let s1 = emu_sample(&p.emulator().counters(0));
    let d = deltas(&s0, &s1);
    let get = |g: &str, n: &str| {
        d.iter()
            .find(|(c, _)| c.group == g && c.name == n)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{g}/{n} missing"))
    };
    assert_eq!(get("device", "wqes_executed"), 25);
    assert_eq!(get("device", "inline_wqes"), 0);
    // one CQE for each SEND and one for each receive
    assert_eq!(get("device", "cqes_written"), 50);
    assert!(get("device", "packets_sent") >= 25);
    assert!(get("device", "doorbells") >= 1);
    // the host-device link: one 64-byte payload read per SEND; per SEND three DMA writes of
    // 64 bytes (the data placed, the receive CQE, the send CQE)
    assert_eq!(get("link", "payload_reads"), 25);
    assert_eq!(get("link", "payload_read_bytes"), 25 * 64);
    assert_eq!(get("link", "dma_writes"), 75);
    assert_eq!(get("link", "dma_write_bytes"), 75 * 64);
    for n in Counters::HW_COUNTER_NAMES {
        if n.contains("err") || n.contains("exceeded") || n == "out_of_buffer" {
            assert_eq!(get("hw_counters", n), 0, "{n}");
        }
    }
}

#[test]
fn emulator_load_through_the_command() {
    let a = CountersArgs {
        emu: true,
        emu_pid: None,
        load: Some("send".into()),
        ops: 40,
        interval: Some(0.0),
        count: Some(3),
        ..args()
    };
    let mut outs = Vec::new();
    run(&a, Path::new("/nonexistent"), &mut |s| {
        outs.push(s.to_owned())
    })
    .unwrap();
    assert_eq!(outs.len(), 3);
    assert!(outs[0].contains("(emulated): sample 1"), "{}", outs[0]);
    for o in &outs[1..] {
        assert!(o.contains("(load: 40 SENDs of 64 bytes)"), "{o}");
        let row = |name: &str| -> Vec<String> {
            o.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("{name} missing in\n{o}"))
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(row("device/wqes_executed")[2], "+40", "{o}");
        assert_eq!(row("device/cqes_written")[2], "+80", "{o}");
        assert_eq!(row("link/payload_reads")[2], "+40", "{o}");
    }
    // the cumulative value after two intervals
    let last: Vec<&str> = outs[2]
        .lines()
        .find(|l| l.trim_start().starts_with("device/wqes_executed"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(last[1], "80");
    // a wrong device name for the emulator is refused
    let e = run(
        &CountersArgs {
            emu: true,
            emu_pid: None,
            dev: Some("mlx5_7".into()),
            ..args()
        },
        Path::new("/nonexistent"),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.contains("no emulated device \"mlx5_7\""), "{e}");
}

#[test]
fn every_emulator_counter_is_listed_generically() {
    // Distinct values per field: each listed counter must agree with Counters::get.
    let c = Counters {
        doorbells: 1,
        bf_writes: 2,
        wqes_executed: 3,
        req_cqe_error: 4,
        out_of_sequence: 5,
        ..Counters::default()
    };
    let s = emu_sample(&c);
    for n in Counters::HW_COUNTER_NAMES {
        assert_eq!(s.get("hw_counters", n), c.get(n), "{n}");
    }
    assert_eq!(s.get("device", "doorbells"), Some(1));
    assert_eq!(s.get("device", "wqes_executed"), Some(3));
    for x in &s.counters {
        if let Some(v) = c.get(&x.name) {
            assert_eq!(x.value, v, "{}", x.name);
        }
    }
    // every field of the Debug form is there (new fields appear without a change here)
    let fields = format!("{c:?}").matches(": ").count();
    assert_eq!(s.counters.len(), fields);
    // the parser itself: nesting, arrays, non-numbers
    // Read only through Debug, which dead-code analysis ignores.
    #[expect(dead_code)]
    #[derive(Debug)]
    struct Inner {
        mmio_writes: u64,
        dma_bytes: u64,
    }
    #[expect(dead_code)]
    #[derive(Debug)]
    struct Outer {
        a: u64,
        on: bool,
        name: &'static str,
        link: Inner,
        lanes: [u32; 2],
        b: u8,
    }
    let o = Outer {
        a: 7,
        on: true,
        name: "x, y: 3",
        link: Inner {
            mmio_writes: 11,
            dma_bytes: 4096,
        },
        lanes: [1, 2],
        b: 9,
    };
    let v = parse_debug_counters(&format!("{o:?}")).unwrap();
    let want: Vec<(String, u64)> = [
        ("a", 7),
        ("link.mmio_writes", 11),
        ("link.dma_bytes", 4096),
        ("lanes[0]", 1),
        ("lanes[1]", 2),
        ("b", 9),
    ]
    .iter()
    .map(|(n, v)| ((*n).to_owned(), *v))
    .collect();
    assert_eq!(v, want);
    assert_eq!(
        parse_debug_counters(&format!("{o:#?}")).unwrap(),
        want,
        "pretty Debug too"
    );
    assert!(parse_debug_counters("garbage").is_err());
    assert!(parse_debug_counters("X { a: 1").is_err());
    // deep nesting is refused, not a stack overflow
    let deep = format!("X {{ a: {}1{} }}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(parse_debug_counters(&deep).is_err());
    let deep = format!("X {{ {} }}", "a: Y { ".repeat(50_000));
    assert!(parse_debug_counters(&deep).is_err());
}

#[test]
fn no_device_in_sysfs_falls_back_to_the_emulator() {
    let root =
        std::env::temp_dir().join(format!("mlx5-counters-test.{}.empty", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let mut outs = Vec::new();
    run(&args(), &root, &mut |s| outs.push(s.to_owned())).unwrap();
    assert!(outs[0].starts_with("no RDMA device under "), "{outs:?}");
    assert!(
        outs[1].starts_with("mlx5_0 (emulated): sample 1"),
        "{outs:?}"
    );
    // a device name that sysfs does not have, while sysfs has others, stays an error
    let full = tree("fallback");
    let e = run(
        &CountersArgs {
            dev: Some("mlx5_0".into()),
            ..args()
        },
        &full,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.contains("no device \"mlx5_0\""), "{e}");
    let _ = std::fs::remove_dir_all(root);
    let _ = std::fs::remove_dir_all(full);
}
