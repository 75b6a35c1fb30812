//! `mlx5 emu run` for any program: a Rust program that uses the driver's own discovery
//! (`mlx5::devices()`, which honours `SYSFS_PATH` as libibverbs does) finds the emulated HCA
//! and passes traffic through the preload front door; and the preload library is found next
//! to the binary or built there on first use.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5::{
    Access, Cq, CqInit, DmaBuf, Pd, Qp, QpInitAttr, QpType, RecvWr, RemoteQp, SendFlags, SendWr,
    WorkCompletion,
};
use mlx5_tools::app::preload_build_args;

/// Set in the environment of this test binary when it runs as the user program.
const CHILD: &str = "MLX5_EMU_RUN_TEST_CHILD";

/// The user program: discovery, open, one SEND between two QPs of the device found.
fn child() {
    let devs = mlx5::devices().expect("devices() under mlx5 emu run");
    let dev = devs.first().expect("an mlx5 device");
    println!(
        "found {} at {} (sysfs {})",
        dev.name,
        dev.dev_path.display(),
        dev.sysfs_dir.display()
    );
    let ctx = dev.open().expect("open");
    let pd = Pd::new(&ctx).unwrap();
    let cq = |ctx| Cq::new(ctx, CqInit::default(), None).unwrap();
    let (mut acq, mut bcq) = (cq(&ctx), cq(&ctx));
    let mut a = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &acq, &acq)).unwrap();
    let mut b = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &bcq, &bcq)).unwrap();
    let lid = ctx.query_port(1).unwrap().lid;
    let addr = |qp: &Qp| RemoteQp {
        qpn: qp.qpn(),
        psn: 0,
        lid,
        gid: None,
    };
    let (ra, rb) = (addr(&a), addr(&b));
    for (qp, r) in [(&mut a, &rb), (&mut b, &ra)] {
        qp.to_init(1, Access::LOCAL_WRITE).unwrap();
        qp.to_rtr(r, mlx5::Mtu::M1024, 0).unwrap();
        qp.to_rts(0, 0).unwrap();
    }
    let buf = Arc::new(DmaBuf::new(4096).unwrap());
    let mr = pd.reg_mr(&buf, Access::LOCAL_WRITE).unwrap();
    b.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[mr.sge(2048, 64)],
    }])
    .unwrap();
    buf.write(0, b"through the front door");
    a.post_send(&[SendWr::send(1, &[mr.sge(0, 22)], SendFlags::SIGNALED)])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut wc = [WorkCompletion::default(); 1];
    for cq in [&mut acq, &mut bcq] {
        while cq.poll(&mut wc) == 0 {
            assert!(Instant::now() < deadline, "no completion");
        }
        assert!(wc[0].is_ok(), "{wc:?}");
    }
    let mut got = [0u8; 22];
    buf.read(2048, &mut got);
    println!("received {:?}", String::from_utf8_lossy(&got));
}

#[test]
fn a_program_using_mlx5_devices_finds_the_emulated_hca_under_emu_run() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    // This test binary, started again under `mlx5 emu run` (no --so: the library next to the
    // binary, built there if missing), runs `child`.
    let me = std::env::current_exe().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mlx5"))
        .args(["emu", "run", "--"])
        .arg(&me)
        .args([
            "--exact",
            "a_program_using_mlx5_devices_finds_the_emulated_hca_under_emu_run",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env_remove("MLX5_EMU_PRELOAD_SO")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    // The emulated HCA, through the interposed character device and the shim's sysfs tree
    // (not /sys: SYSFS_PATH was followed).
    assert!(
        text.contains("found mlx5_0 at /dev/infiniband/uverbs0 (sysfs "),
        "{text}\n{err}"
    );
    assert!(
        !text.contains("(sysfs /sys/class/infiniband/"),
        "{text}\n{err}"
    );
    assert!(
        text.contains("received \"through the front door\""),
        "{text}\n{err}"
    );
}

#[test]
fn the_preload_library_is_built_in_the_binarys_own_target_dir_and_profile() {
    let root = std::env::temp_dir().join(format!("mlx5-emu-run-plan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("target/release")).unwrap();
    std::fs::create_dir_all(root.join("target/aarch64-unknown-linux-gnu/bench")).unwrap();
    std::fs::create_dir_all(root.join("elsewhere/bin")).unwrap();
    std::fs::write(root.join("target/CACHEDIR.TAG"), "").unwrap();
    let s = |dir: &str| {
        preload_build_args(&root.join(dir)).map(|a| {
            a.iter()
                .map(|x| x.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        })
    };
    let target = root.join("target").to_string_lossy().into_owned();
    let release = s("target/release").unwrap();
    assert_eq!(
        &release[3..],
        [
            "-p",
            "mlx5-emu-preload",
            "--target-dir",
            &target,
            "--release"
        ]
    );
    assert!(release[2].ends_with("Cargo.toml"), "{release:?}");
    let cross = s("target/aarch64-unknown-linux-gnu/bench").unwrap();
    assert_eq!(
        &cross[6..],
        [
            &target,
            "--profile",
            "bench",
            "--target",
            "aarch64-unknown-linux-gnu"
        ]
    );
    let debug = s("target/debug").unwrap();
    assert_eq!(debug.len(), 7, "{debug:?}");
    let e = s("elsewhere/bin").unwrap_err();
    assert!(e.contains("not a cargo output directory"), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}
