//! Unmodified rdma-core and perftest binaries (Debian's `ibverbs-utils`, `perftest`) run on
//! the emulated HCA through `LD_PRELOAD=libmlx5_emu_preload.so`.
//!
//! Expected values come from the emulator itself (`Emulator::hca_info`), not from
//! constants: the tools must show what the emulated device reports.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use mlx5_emu::{EmuConfig, Emulator, Fabric, HcaInfo, RunMode};

/// The shim, built by cargo next to this test binary (`<profile>/deps/<test>` and
/// `<profile>/libmlx5_emu_preload.so`); `MLX5_EMU_PRELOAD_SO` overrides.
fn preload_so() -> PathBuf {
    if let Some(p) = std::env::var_os("MLX5_EMU_PRELOAD_SO") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    let name = "libmlx5_emu_preload.so";
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let p = dir.join(name);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{name} not found next to {}; build the crate first",
        exe.display()
    );
}

/// Node (LID of HCA 0) given to the single-process tools. They run on the in-process
/// fabric, so the identity is fixed by the node alone and cannot collide with other
/// processes' UDP addresses.
const NODE: u16 = 7;

/// Identity of HCA `i` of an emulator with `num_hcas` HCAs whose HCA 0 is node [`NODE`].
fn hca(num_hcas: usize, i: usize) -> HcaInfo {
    let emu = Emulator::new(EmuConfig {
        num_hcas,
        mode: RunMode::Stepped,
        fabric: Fabric::InProcess,
        node: Some(NODE),
        ..EmuConfig::default()
    });
    emu.hca_info(i).expect("HCA exists")
}

/// A single-process tool on the in-process fabric, HCA 0 at node [`NODE`].
fn local_tool(program: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = tool(program, env);
    cmd.env("MLX5_EMU_FABRIC", "inprocess")
        .env("MLX5_EMU_NODE", NODE.to_string());
    cmd
}

/// `0002c90300abcdef` (ibv_devices) and `0002:c903:00ab:cdef` (ibv_devinfo).
fn guid_plain(g: u64) -> String {
    format!("{g:016x}")
}

fn guid_colons(g: u64) -> String {
    let s = guid_plain(g);
    format!("{}:{}:{}:{}", &s[0..4], &s[4..8], &s[8..12], &s[12..16])
}

fn gid_colons(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// A command with the shim preloaded and a clean `MLX5_EMU_*` environment.
fn tool(program: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("LD_PRELOAD", preload_so());
    for (k, _) in std::env::vars() {
        if k.starts_with("MLX5_EMU_") && k != "MLX5_EMU_PRELOAD_SO" {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("SYSFS_PATH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Wait for `child` at most `limit`; kill it if it is still running. `None` = killed.
fn wait_limited(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        sleep(Duration::from_millis(20));
    }
}

/// Run to completion (bounded), capturing output.
fn run(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let status = wait_limited(&mut child, limit);
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let status =
        status.unwrap_or_else(|| panic!("{cmd:?} did not finish in {limit:?}\n{stdout}\n{stderr}"));
    Output {
        status,
        stdout: stdout.into_bytes(),
        stderr: stderr.into_bytes(),
    }
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn ibv_devices_lists_the_emulated_hca() {
    let info = hca(1, 0);
    let o = run(local_tool("ibv_devices", &[]), Duration::from_secs(30));
    let (out, err) = text(&o);
    assert!(o.status.success(), "ibv_devices failed: {out}\n{err}");
    let line = out
        .lines()
        .find(|l| l.contains(&info.name))
        .unwrap_or_else(|| panic!("no {}: {out}", info.name));
    assert!(line.contains(&guid_plain(info.node_guid)), "{line}");
    assert_eq!(
        out.lines().filter(|l| l.contains("mlx5_")).count(),
        1,
        "{out}"
    );
}

#[test]
fn ibv_devices_lists_every_configured_hca() {
    let o = run(
        local_tool("ibv_devices", &[("MLX5_EMU_HCAS", "3")]),
        Duration::from_secs(30),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "ibv_devices failed: {out}\n{err}");
    for i in 0..3 {
        let info = hca(3, i);
        assert!(
            out.lines()
                .any(|l| l.contains(&info.name) && l.contains(&guid_plain(info.node_guid))),
            "{} missing: {out}",
            info.name
        );
    }
}

#[test]
fn without_the_shim_no_device_is_found() {
    // The control: the machine itself has no RDMA device, so the listing above is ours.
    let mut cmd = tool("ibv_devices", &[]);
    cmd.env_remove("LD_PRELOAD");
    let o = run(cmd, Duration::from_secs(30));
    let (out, _) = text(&o);
    assert!(!out.contains("mlx5_0"), "{out}");
}

/// `ibv_devinfo -v` in one kernel ABI flavour: device attributes (QUERY_DEVICE), port
/// attributes (QUERY_PORT) and GID 0 all as the emulator reports them.
fn devinfo_verbose(flavour: &str) {
    let info = hca(1, 0);
    let mut cmd = local_tool(
        "ibv_devinfo",
        &[("MLX5_EMU_FLAVOUR", flavour), ("MLX5_EMU_TRACE", "1")],
    );
    cmd.arg("-v");
    let o = run(cmd, Duration::from_secs(30));
    let (out, err) = text(&o);
    assert!(
        o.status.success(),
        "ibv_devinfo -v ({flavour}) failed: {out}\n{err}"
    );
    let field = |name: &str| -> String {
        out.lines()
            .find_map(|l| {
                l.trim_start()
                    .strip_prefix(&format!("{name}:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {name} in ibv_devinfo ({flavour}):\n{out}"))
    };
    assert_eq!(field("hca_id"), info.name);
    assert_eq!(field("transport"), "InfiniBand (0)");
    assert_eq!(field("fw_ver"), info.fw_ver);
    assert_eq!(field("node_guid"), guid_colons(info.node_guid));
    assert_eq!(field("sys_image_guid"), guid_colons(info.sys_image_guid));
    assert_eq!(field("vendor_id"), format!("{:#06x}", info.vendor_id));
    assert_eq!(field("vendor_part_id"), info.vendor_part_id.to_string());
    assert_eq!(field("phys_port_cnt"), "1");
    assert!(field("max_qp").parse::<u32>().is_ok_and(|n| n > 0));
    assert!(field("max_cqe").parse::<u32>().is_ok_and(|n| n > 0));
    assert_eq!(field("state"), "PORT_ACTIVE (4)");
    assert_eq!(field("port_lid"), info.lid.to_string());
    assert_eq!(field("link_layer"), "InfiniBand");
    assert_eq!(field("GID[  0]"), gid_colons(&info.port_gid));
    // The device was really opened through the shim.
    assert!(err.contains("open uverbs0 -> fd"), "{err}");
}

#[test]
fn ibv_devinfo_verbose_on_a_modern_kernel() {
    devinfo_verbose("modern");
}

#[test]
fn ibv_devinfo_verbose_on_a_write_only_kernel() {
    devinfo_verbose("write");
}

#[test]
fn ibv_devinfo_verbose_when_every_ioctl_method_is_unsupported() {
    devinfo_verbose("eproto");
}

#[test]
fn device_calls_reach_the_emulator_and_everything_is_released() {
    let o = run(
        local_tool("ibv_devinfo", &[("MLX5_EMU_TRACE", "1")]),
        Duration::from_secs(30),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let count = |needle: &str| err.lines().filter(|l| l.contains(needle)).count();
    let maps = err
        .lines()
        .filter(|l| l.contains(" mmap fd ") && l.contains("-> ok"))
        .count();
    let unmaps = err
        .lines()
        .filter(|l| l.contains(" munmap ") && l.contains("-> ok"))
        .count();
    assert!(maps > 0, "no UAR mapping made: {err}");
    assert_eq!(
        maps, unmaps,
        "every emulated mapping is unmapped at close:\n{err}"
    );
    assert_eq!(count("open uverbs0 -> fd"), 1, "{err}");
    assert_eq!(count("close fd"), 1, "{err}");
    // GET_CONTEXT succeeded (through write, the INVOKE_WRITE tunnel or its ioctl method).
    assert_eq!(ok_verbs(&err, "GET_CONTEXT"), 1, "{err}");
}

#[test]
fn the_sysfs_tree_is_private_and_removed_at_exit() {
    let tree_of = |err: &str| -> PathBuf {
        let line = err
            .lines()
            .find(|l| l.contains("sysfs tree "))
            .unwrap_or_else(|| panic!("{err}"));
        let rest = &line[line.find("sysfs tree ").unwrap() + "sysfs tree ".len()..];
        PathBuf::from(rest.split(' ').next().unwrap())
    };
    let o = run(
        local_tool("ibv_devices", &[("MLX5_EMU_TRACE", "1")]),
        Duration::from_secs(30),
    );
    let tree = tree_of(&text(&o).1);
    assert!(!tree.exists(), "{} left behind", tree.display());

    let o = run(
        local_tool(
            "ibv_devices",
            &[("MLX5_EMU_TRACE", "1"), ("MLX5_EMU_KEEP_SYSFS", "1")],
        ),
        Duration::from_secs(30),
    );
    let tree = tree_of(&text(&o).1);
    let abi = fs::read_to_string(tree.join("class/infiniband_verbs/abi_version"));
    fs::remove_dir_all(&tree).expect("kept tree");
    assert_eq!(abi.expect("kept tree has abi_version").trim(), "6");
}

#[test]
fn ordinary_io_of_the_host_program_is_untouched() {
    let dir = std::env::temp_dir().join(format!("mlx5-emu-preload-io.{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let script =
        "printf 'hello\\n' > f && cat f f > g && wc -c < g && ls /dev/null && exec 3<f && cat <&3";
    let mut cmd = tool("sh", &[]);
    cmd.current_dir(&dir).args(["-c", script]);
    let o = run(cmd, Duration::from_secs(30));
    let (out, err) = text(&o);
    fs::remove_dir_all(&dir).unwrap();
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(out, "12\n/dev/null\nhello\n");
    // A malformed setting is reported, never fatal.
    let o = run(
        local_tool("ibv_devices", &[("MLX5_EMU_HCAS", "many")]),
        Duration::from_secs(30),
    );
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("mlx5_0"), "{out}\n{err}");
    assert!(err.contains("MLX5_EMU_HCAS"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Two-process tools.

/// A background tool whose stderr (the shim's trace) goes to a file we can watch.
struct Bg {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Bg {
    fn start(mut cmd: Command, tag: &str) -> Bg {
        let file = |ext: &str| {
            let name = format!("mlx5-emu-preload.{}.{tag}.{ext}", std::process::id());
            std::env::temp_dir().join(name)
        };
        let (out, err) = (file("out"), file("err"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).unwrap())
            .stderr(fs::File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Bg { child, out, err }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Successful calls of `verb` so far, whichever path (write, INVOKE_WRITE, ioctl
    /// method) carried it: the shim's trace names the verb the same way on all three.
    fn ok_verbs(&self, verb: &str) -> usize {
        ok_verbs(&self.stderr(), verb)
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.out);
        let _ = fs::remove_file(&self.err);
    }
}

fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        sleep(Duration::from_millis(50));
    }
    cond()
}

/// Successful calls of `verb` in a trace (see [`Bg::ok_verbs`]).
fn ok_verbs(trace: &str, verb: &str) -> usize {
    let needle = format!(" {verb} (");
    trace
        .lines()
        .filter(|l| l.contains(&needle) && l.contains("-> ok"))
        .count()
}

/// Whether some socket listens on TCP `port` (IPv4 or IPv6), from `/proc/net/tcp*`.
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                // local_address is column 1 ("ADDR:PORT"), st column 3 (0A = LISTEN).
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
    })
}

/// The LID in the line `"<which> address: LID 0x..."` of a tool's output (both tools
/// print one, with differing spacing).
fn printed_lid(out: &str, which: &str) -> u16 {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(&format!("{which} address:")))
        .unwrap_or_else(|| panic!("no {which} address in:\n{out}"));
    let at = line
        .find("LID 0x")
        .unwrap_or_else(|| panic!("no LID in {line:?}"))
        + "LID 0x".len();
    let hex: String = line[at..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u16::from_str_radix(&hex, 16).unwrap_or_else(|_| panic!("bad LID in {line:?}"))
}

/// What a successful run prints.
#[derive(Clone, Copy, Debug)]
struct Success {
    /// Text in the client's output (and the server's, with `server_too`).
    text: &'static str,
    /// Whether the server prints the result as well (the perftest bandwidth servers do not).
    server_too: bool,
}

/// Both sides print `text`.
const fn both(text: &'static str) -> Success {
    Success {
        text,
        server_too: true,
    }
}

/// Server and client of a two-process tool, each on its own emulator, talking over the
/// emulator's UDP fabric. Both must take their QP to RTS through the emulated kernel
/// (CREATE_QP, then three successful MODIFY_QP), run the whole exchange, exit 0 and print
/// `success`; each must see the other's LID as the remote one.
fn two_process(program: &str, port: u16, args: &[&str], flavour: &str, success: Success) {
    let env = [("MLX5_EMU_TRACE", "1"), ("MLX5_EMU_FLAVOUR", flavour)];
    let port_s = port.to_string();
    let mut cmd = tool(program, &env);
    cmd.args(["-d", "mlx5_0", "-p", &port_s]).args(args);
    let mut server = Bg::start(cmd, &format!("{program}-{port}-server"));
    assert!(
        wait_until(Duration::from_secs(20), || listening(port)),
        "{program} server never listened on {port}:\n{}\n{}",
        server.stdout(),
        server.stderr()
    );
    let mut cmd = tool(program, &env);
    cmd.args(["-d", "mlx5_0", "-p", &port_s])
        .args(args)
        .arg("localhost");
    let mut client = Bg::start(cmd, &format!("{program}-{port}-client"));
    let limit = Duration::from_secs(90);
    let client_status = wait_limited(&mut client.child, limit);
    let server_status = wait_limited(&mut server.child, Duration::from_secs(10));
    let report = || {
        format!(
            "server:\n{}\n{}\nclient:\n{}\n{}",
            server.stdout(),
            server.stderr(),
            client.stdout(),
            client.stderr()
        )
    };
    let at_rts = |b: &Bg| {
        let qps = b.ok_verbs("CREATE_QP");
        qps >= 1 && b.ok_verbs("MODIFY_QP") == 3 * qps
    };
    assert!(
        at_rts(&server) && at_rts(&client),
        "{program}: not both at RTS\n{}",
        report()
    );
    for (who, status, bg) in [
        ("client", client_status, &client),
        ("server", server_status, &server),
    ] {
        let status =
            status.unwrap_or_else(|| panic!("{program} {who} did not finish\n{}", report()));
        assert!(
            status.success(),
            "{program} {who} failed ({status})\n{}",
            report()
        );
        if who == "client" || success.server_too {
            assert!(
                bg.stdout().contains(success.text),
                "{program} {who} lacks {:?}\n{}",
                success.text,
                report()
            );
        }
    }
    let (s, c) = (server.stdout(), client.stdout());
    assert_eq!(
        printed_lid(&c, "remote"),
        printed_lid(&s, "local"),
        "{}",
        report()
    );
    assert_eq!(
        printed_lid(&s, "remote"),
        printed_lid(&c, "local"),
        "{}",
        report()
    );
    assert_ne!(
        printed_lid(&s, "local"),
        printed_lid(&c, "local"),
        "{}",
        report()
    );
}

#[test]
fn ibv_rc_pingpong_runs_between_two_processes() {
    // 100 round trips of 4096 bytes each way: the pingpong tools report size * iters * 2.
    let args = ["-n", "100", "-s", "4096"];
    two_process(
        "ibv_rc_pingpong",
        18711,
        &args,
        "modern",
        both("819200 bytes in"),
    );
}

#[test]
fn ibv_rc_pingpong_runs_on_a_write_only_kernel_with_events_and_checks() {
    // -e: completion channel + CQ arm; -c: payload validation; 32 B: inline sends.
    let args = ["-n", "50", "-s", "32", "-e", "-c"];
    two_process(
        "ibv_rc_pingpong",
        18712,
        &args,
        "write",
        both("3200 bytes in"),
    );
}

#[test]
fn ibv_uc_pingpong_runs_between_two_processes() {
    let args = ["-n", "50", "-s", "4096"];
    two_process(
        "ibv_uc_pingpong",
        18715,
        &args,
        "eproto",
        both("409600 bytes in"),
    );
}

#[test]
fn ibv_ud_pingpong_runs_between_two_processes() {
    let args = ["-n", "50", "-s", "1024"];
    two_process(
        "ibv_ud_pingpong",
        18716,
        &args,
        "modern",
        both("102400 bytes in"),
    );
}

#[test]
fn ibv_srq_pingpong_runs_between_two_processes() {
    // 16 RC QPs sharing one SRQ on each side.
    let args = ["-n", "50", "-s", "4096"];
    two_process(
        "ibv_srq_pingpong",
        18717,
        &args,
        "modern",
        both("409600 bytes in"),
    );
}

#[test]
fn ib_send_lat_runs_between_two_processes() {
    two_process(
        "ib_send_lat",
        18713,
        &["-n", "100"],
        "modern",
        both("t_avg"),
    );
}

#[test]
fn ib_write_lat_runs_between_two_processes() {
    two_process(
        "ib_write_lat",
        18714,
        &["-n", "100"],
        "eproto",
        both("t_avg"),
    );
}

#[test]
fn ib_read_and_atomic_lat_run_between_two_processes() {
    two_process(
        "ib_read_lat",
        18718,
        &["-n", "100"],
        "modern",
        both("t_avg"),
    );
    two_process(
        "ib_atomic_lat",
        18719,
        &["-n", "100"],
        "write",
        both("t_avg"),
    );
}

#[test]
fn ib_write_bw_runs_between_two_processes() {
    // 4 KiB messages (the emulator's wire carries a message in one datagram: see report).
    let args = ["-n", "500", "-s", "4096"];
    let success = Success {
        text: "4096       500",
        server_too: false,
    };
    two_process("ib_write_bw", 18720, &args, "modern", success);
}
