//! The emulated HCAs' addresses where programs look: `getifaddrs(3)` under the preload
//! lists the host's entries first, then one `lo:<ibdev>` entry per HCA carrying its address
//! `127.1.x.y` (the address of its IPv4-mapped RoCE GID), and the list still frees cleanly
//! (`c/ifaddrs.c`: 1000 getifaddrs/freeifaddrs cycles after the first).

use std::path::PathBuf;
use std::process::Command;

fn run(tag: &str, env: &[(&str, &str)]) -> String {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/ifaddrs.c");
    let exe = std::env::temp_dir().join(format!("mlx5-ifaddrs-{}-{tag}", std::process::id()));
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
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && text.ends_with("done\n"),
        "{}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn entries(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .filter(|l| l.starts_with("IF "))
        .map(|l| l.split_whitespace().skip(1).collect())
        .collect()
}

#[test]
fn each_hca_has_its_address_on_the_interface_list() {
    let text = run(
        "eth",
        &[("MLX5_EMU_HCAS", "2"), ("MLX5_EMU_LINK_LAYER", "eth")],
    );
    let ifs = entries(&text);
    // ours come after the host's (the host's loopback is there, first)
    let first_ours = ifs
        .iter()
        .position(|e| e[0].starts_with("lo:mlx5_"))
        .unwrap_or_else(|| panic!("no emulated entry in\n{text}"));
    assert!(first_ours > 0, "{text}");
    assert!(
        ifs[..first_ours].iter().any(|e| e[1] == "127.0.0.1"),
        "{text}"
    );
    let ours = &ifs[first_ours..];
    assert_eq!(ours.len(), 2, "{text}");
    for (i, e) in ours.iter().enumerate() {
        let dev = format!("mlx5_{i}");
        assert_eq!(e[0], format!("lo:{dev}"), "{text}");
        assert!(e[1].starts_with("127.1."), "{text}");
        assert_eq!(e[2], "255.255.0.0", "{text}");
        // IFF_UP | IFF_LOOPBACK | IFF_RUNNING
        assert_eq!(e[3], "0x49", "{text}");
        // the same address as the HCA's IPv4-mapped RoCE v2 GID
        assert!(
            text.contains(&format!("GID {dev} {}\n", e[1])),
            "{dev}: {}\n{text}",
            e[1]
        );
    }
    assert_ne!(ours[0][1], ours[1][1], "{text}");
}

#[test]
fn an_infiniband_port_is_listed_too() {
    let text = run("ib", &[]);
    let ifs = entries(&text);
    let ours: Vec<_> = ifs.iter().filter(|e| e[0] == "lo:mlx5_0").collect();
    assert_eq!(ours.len(), 1, "{text}");
    assert!(ours[0][1].starts_with("127.1."), "{text}");
}
