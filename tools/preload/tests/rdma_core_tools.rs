//! Unmodified rdma-core and perftest binaries (Debian's `ibverbs-utils`, `perftest`) run on
//! the emulated HCA through `LD_PRELOAD=libmlx5_emu_preload.so`.
//!
//! Expected values come from the emulator itself (`Emulator::hca_info`), not from
//! constants: the tools must show what the emulated device reports.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
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

/// What a finished single-process tool left.
struct Ran {
    status: ExitStatus,
    out: String,
    err: String,
}

/// Run to completion (at most 30 s), capturing output.
fn run(mut cmd: Command) -> Ran {
    let limit = Duration::from_secs(30);
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
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    let status =
        status.unwrap_or_else(|| panic!("{cmd:?} did not finish in {limit:?}\n{out}\n{err}"));
    Ran { status, out, err }
}

/// [`run`], which must succeed; its stdout and stderr.
fn run_ok(cmd: Command) -> (String, String) {
    let program = format!("{:?}", cmd.get_program());
    let r = run(cmd);
    assert!(
        r.status.success(),
        "{program} failed ({}):\n{}\n{}",
        r.status,
        r.out,
        r.err
    );
    (r.out, r.err)
}

#[test]
fn ibv_devices_lists_the_emulated_hca() {
    let info = hca(1, 0);
    let (out, _) = run_ok(local_tool("ibv_devices", &[]));
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
    let (out, _) = run_ok(local_tool("ibv_devices", &[("MLX5_EMU_HCAS", "3")]));
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
    let out = run(cmd).out;
    assert!(!out.contains("mlx5_0"), "{out}");
}

/// The value after `name:` in `ibv_devinfo` output `out` (run in `flavour`).
fn devinfo_field(out: &str, name: &str, flavour: &str) -> String {
    out.lines()
        .find_map(|l| {
            l.trim_start()
                .strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no {name} in ibv_devinfo ({flavour}):\n{out}"))
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
    let (out, err) = run_ok(cmd);
    let field = |name: &str| devinfo_field(&out, name, flavour);
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
    // The flavour decides which path carried the commands.
    let ok = |path: &str| {
        err.lines()
            .filter(|l| l.contains(&format!("mlx5-emu-preload: {path} fd")) && l.contains("-> ok"))
            .count()
    };
    match flavour {
        // ioctl fails (ENOTTY / EPROTONOSUPPORT): everything went through write().
        "write" | "eproto" => assert!(ok("ioctl") == 0 && ok("write") > 0, "{err}"),
        // A modern kernel: the ioctl framework (INVOKE_WRITE or methods), no write().
        _ => assert!(ok("ioctl") > 0 && ok("write") == 0, "{err}"),
    }
    if flavour == "write" {
        assert!(err.contains("-> ENOTTY"), "{err}");
    }
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
    let (_, err) = run_ok(local_tool("ibv_devinfo", &[("MLX5_EMU_TRACE", "1")]));
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
    let tree = tree_of(&run_ok(local_tool("ibv_devices", &[("MLX5_EMU_TRACE", "1")])).1);
    assert!(!tree.exists(), "{} left behind", tree.display());

    let keep = [("MLX5_EMU_TRACE", "1"), ("MLX5_EMU_KEEP_SYSFS", "1")];
    let tree = tree_of(&run_ok(local_tool("ibv_devices", &keep)).1);
    let abi = fs::read_to_string(tree.join("class/infiniband_verbs/abi_version"));
    fs::remove_dir_all(&tree).expect("kept tree");
    assert_eq!(abi.expect("kept tree has abi_version").trim(), "6");

    // A tree left by a killed process (its pid is gone) is removed by the next user.
    let mut dead = Command::new("true").spawn().expect("spawn true");
    let dead_pid = dead.id();
    dead.wait().expect("wait true");
    let stale = std::env::temp_dir().join(format!("mlx5-emu-sysfs.{dead_pid}"));
    fs::create_dir_all(stale.join("class/infiniband_verbs")).unwrap();
    run_ok(local_tool("ibv_devices", &[]));
    let left = stale.exists();
    let _ = fs::remove_dir_all(&stale);
    assert!(!left, "stale tree {} not removed", stale.display());
}

#[test]
fn every_interposed_call_behaves_like_the_kernel_device() {
    let probe = env!("CARGO_BIN_EXE_mlx5-emu-preload-probe");
    let (out, err) = run_ok(local_tool(probe, &[]));
    let dev = "chr 231:192"; // the `dev` file of uverbs0 in the sysfs tree
    let expected = [
        format!("stat={dev}"),
        format!("fstatat={dev}"),
        "statx=ok 231:192".to_string(),
        "access=ok".to_string(),
        "uverbs1=ENOENT".to_string(),
        "open=ok".to_string(),
        format!("fstat={dev}"),
        format!("fstatat_empty={dev}"),
        "short_write=EINVAL".to_string(),
        "bad_pointer_write=EFAULT".to_string(),
        "other_ioctl=ENOTTY".to_string(),
        "bad_pointer_ioctl=EFAULT".to_string(),
        "private_mmap=EINVAL".to_string(),
        format!("dup={dev} fcntl_dupfd={dev} dup2={dev} dup3={dev}"),
        "close_range=ok after=EBADF".to_string(),
        "reused_same_number=true reused=chr 1:3".to_string(),
        "netlink_rdma=EPROTONOSUPPORT".to_string(),
        "netlink_route=ok".to_string(),
    ];
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, expected, "{err}");
    // The control: without the shim there is no device node at all.
    let mut cmd = local_tool(probe, &[]);
    cmd.env_remove("LD_PRELOAD");
    let out = run(cmd).out;
    assert!(out.starts_with("stat=ENOENT\n"), "{out}");
}

#[test]
fn ordinary_io_of_the_host_program_is_untouched() {
    let dir = std::env::temp_dir().join(format!("mlx5-emu-preload-io.{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let script =
        "printf 'hello\\n' > f && cat f f > g && wc -c < g && ls /dev/null && exec 3<f && cat <&3";
    let mut cmd = tool("sh", &[]);
    cmd.current_dir(&dir).args(["-c", script]);
    let r = run(cmd);
    fs::remove_dir_all(&dir).unwrap();
    assert!(r.status.success(), "{}\n{}", r.out, r.err);
    assert_eq!(r.out, "12\n/dev/null\nhello\n");
    // A malformed setting is reported, never fatal.
    let (out, err) = run_ok(local_tool("ibv_devices", &[("MLX5_EMU_HCAS", "many")]));
    assert!(out.contains("mlx5_0"), "{out}\n{err}");
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

/// A TCP port nobody listens on now (the kernel's pick), for a tool's connection exchange.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local address").port()
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
        .find("LID ")
        .unwrap_or_else(|| panic!("no LID in {line:?}"))
        + "LID ".len();
    // "0x0001", or (printf's "%#04x" of zero, as perftest prints a RoCE port's LID) "0000".
    let rest = &line[at..];
    let hex: String = rest
        .strip_prefix("0x")
        .unwrap_or(rest)
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u16::from_str_radix(&hex, 16).unwrap_or_else(|_| panic!("bad LID in {line:?}"))
}

/// The GID printed with the `"<which> address:"` of a tool's output: on the same line after
/// `GID ` (ibv_*_pingpong), or on the next line after `GID:` (perftest).
fn printed_gid(out: &str, which: &str) -> String {
    let mut lines = out.lines().map(str::trim);
    let line = lines
        .find(|l| l.starts_with(&format!("{which} address:")))
        .unwrap_or_else(|| panic!("no {which} address in:\n{out}"));
    if let Some(at) = line.find("GID ") {
        return line[at + 4..].trim().to_string();
    }
    lines
        .next()
        .and_then(|l| l.strip_prefix("GID:"))
        .map(|g| g.trim().to_string())
        .unwrap_or_else(|| panic!("no GID after {line:?} in:\n{out}"))
}

/// `text` with every run of white space made one space (perftest aligns its columns).
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What a successful run prints.
#[derive(Clone, Debug)]
struct Success {
    /// Text in the client's output (and the server's, with `server_too`), compared with runs
    /// of white space collapsed to one space.
    text: String,
    /// Whether the server prints the result as well (perftest's servers of one-sided and
    /// bandwidth tests do not).
    server_too: bool,
}

/// Both sides print `text`.
fn both(text: &str) -> Success {
    Success {
        text: text.to_string(),
        server_too: true,
    }
}

/// Only the client prints `text`.
fn client_only(text: &str) -> Success {
    Success {
        text: text.to_string(),
        server_too: false,
    }
}

/// Server and client of a two-process tool, each on its own emulator, talking over the
/// emulator's UDP fabric. Both must connect their QPs through the emulated kernel
/// (CREATE_QP, then MODIFY_QP to RTR, and to RTS on the client), run the whole exchange,
/// exit 0 and print `success`; each must see the other's LID as the remote one.
fn two_process(program: &str, args: &[&str], flavour: &str, success: Success) {
    two_process_env(program, args, &[("MLX5_EMU_FLAVOUR", flavour)], &success);
}

/// [`two_process`] with extra `MLX5_EMU_*` settings for both sides; `{side}` in a value
/// becomes `server` or `client`. Returns the shim's trace of the server and the client.
fn two_process_env(
    program: &str,
    args: &[&str],
    extra: &[(&str, &str)],
    success: &Success,
) -> [String; 2] {
    // One pair at a time: four processes with device threads on a 2-core machine starve each
    // other's retransmission timers (seen as a rare transport-retry failure under load).
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let port = free_port();
    let env_for = |side: &str| -> Vec<(String, String)> {
        let mut env = vec![("MLX5_EMU_TRACE".to_string(), "1".to_string())];
        env.extend(
            extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.replace("{side}", side))),
        );
        env
    };
    let with_env = |side: &str| {
        let mut cmd = tool(program, &[]);
        cmd.envs(env_for(side));
        cmd
    };
    let port_s = port.to_string();
    let mut cmd = with_env("server");
    cmd.args(["-d", "mlx5_0", "-p", &port_s]).args(args);
    let mut server = Bg::start(cmd, &format!("{program}-{port}-server"));
    assert!(
        wait_until(Duration::from_secs(20), || listening(port)),
        "{program} server never listened on {port}:\n{}\n{}",
        server.stdout(),
        server.stderr()
    );
    let mut cmd = with_env("client");
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
    // Every QP goes INIT -> RTR (-> RTS: always on the client, which sends; perftest's
    // passive bandwidth servers stop at RTR).
    let connected = |b: &Bg, per_qp: usize| {
        let qps = b.ok_verbs("CREATE_QP");
        qps >= 1 && b.ok_verbs("MODIFY_QP") >= per_qp * qps
    };
    assert!(
        connected(&server, 2) && connected(&client, 3),
        "{program}: QPs not connected\n{}",
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
                words(&bg.stdout()).contains(&success.text),
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
    let roce = extra
        .iter()
        .any(|&(k, v)| k == "MLX5_EMU_LINK_LAYER" && v == "eth");
    if roce {
        // A RoCE port has no LID: the peers are told apart (and found) by their GIDs.
        assert_eq!(printed_lid(&s, "local"), 0, "{}", report());
        assert_eq!(printed_gid(&c, "remote"), printed_gid(&s, "local"));
        assert_eq!(printed_gid(&s, "remote"), printed_gid(&c, "local"));
        assert_ne!(
            printed_gid(&s, "local"),
            printed_gid(&c, "local"),
            "{}",
            report()
        );
    } else {
        assert_ne!(
            printed_lid(&s, "local"),
            printed_lid(&c, "local"),
            "{}",
            report()
        );
    }
    [server.stderr(), client.stderr()]
}

/// An `ibv_*_pingpong` run of `iters` round trips of `size` bytes plus `more` arguments; both
/// sides must report the bytes moved (`size * iters * 2`). Returns the two traces.
fn pingpong(
    program: &str,
    iters: u32,
    size: u32,
    more: &[&str],
    env: &[(&str, &str)],
) -> [String; 2] {
    let (n, s) = (iters.to_string(), size.to_string());
    let mut args = vec!["-n", n.as_str(), "-s", s.as_str()];
    args.extend_from_slice(more);
    let bytes = u64::from(size) * u64::from(iters) * 2;
    two_process_env(program, &args, env, &both(&format!("{bytes} bytes in")))
}

const MODERN: [(&str, &str); 1] = [("MLX5_EMU_FLAVOUR", "modern")];

#[test]
fn ibv_rc_pingpong_runs_between_two_processes() {
    pingpong("ibv_rc_pingpong", 100, 4096, &[], &MODERN);
}

#[test]
fn ibv_rc_pingpong_runs_with_its_defaults() {
    // No options at all: 1000 round trips of 4096 bytes, both ways.
    let bytes = 4096u64 * 1000 * 2;
    two_process_env(
        "ibv_rc_pingpong",
        &[],
        &MODERN,
        &both(&format!("{bytes} bytes in")),
    );
}

#[test]
fn ibv_rc_pingpong_runs_on_a_write_only_kernel_with_events_and_checks() {
    // -e: completion channel + CQ arm; -c: payload validation; 32 B: inline sends.
    // MLX5_EMU_WQE_LOG: both devices log every send WQE they fetch.
    let log = std::env::temp_dir().join(format!("mlx5-emu-preload.{}.wqes", std::process::id()));
    let _ = fs::remove_file(&log);
    let log_s = log.to_string_lossy().into_owned();
    let env = [
        ("MLX5_EMU_FLAVOUR", "write"),
        ("MLX5_EMU_WQE_LOG", log_s.as_str()),
    ];
    pingpong("ibv_rc_pingpong", 50, 32, &["-e", "-c"], &env);
    let wqes = fs::read_to_string(&log).unwrap_or_default();
    let _ = fs::remove_file(&log);
    // Each side posts one SEND per iteration.
    let sends = wqes.lines().filter(|l| l.contains("qpn=")).count();
    assert!(sends >= 100, "{sends} WQEs logged:\n{wqes}");
}

#[test]
fn ibv_rc_pingpong_runs_with_dynamic_uars() {
    // libmlx5 asks for dynamic UARs (lib_caps DYN_UAR); with MLX5_EMU_DYN_UAR the emulated
    // kernel grants them: no static UAR pages, one UAR object per CQ/QP page instead.
    let traces = pingpong(
        "ibv_rc_pingpong",
        50,
        1024,
        &[],
        &[("MLX5_EMU_DYN_UAR", "1")],
    );
    for trace in traces {
        assert!(ok_verbs(&trace, "MLX5_UAR_OBJ_ALLOC") >= 1, "{trace}");
        assert_eq!(
            ok_verbs(&trace, "MLX5_UAR_OBJ_ALLOC"),
            ok_verbs(&trace, "MLX5_UAR_OBJ_DESTROY"),
            "{trace}"
        );
    }
}

#[test]
fn ibv_rc_pingpong_runs_with_global_routing() {
    // -g 0: GID index 0 in the address vector (GRH), GIDs exchanged over TCP.
    pingpong("ibv_rc_pingpong", 50, 1024, &["-g", "0"], &MODERN);
}

const ROCE: [(&str, &str); 2] = [
    ("MLX5_EMU_FLAVOUR", "modern"),
    ("MLX5_EMU_LINK_LAYER", "eth"),
];

/// `ibv_devinfo -v` on a RoCE port: Ethernet link layer, no LID, the RoCE v1/v2 GID table
/// (over the ioctl GID query, or from the fake sysfs on a write-only kernel).
fn devinfo_roce(flavour: &str) {
    let mut cmd = local_tool(
        "ibv_devinfo",
        &[
            ("MLX5_EMU_FLAVOUR", flavour),
            ("MLX5_EMU_LINK_LAYER", "eth"),
        ],
    );
    cmd.arg("-v");
    let (out, _) = run_ok(cmd);
    let field = |name: &str| devinfo_field(&out, name, flavour);
    assert_eq!(field("link_layer"), "Ethernet", "{out}");
    assert_eq!(field("port_lid"), "0");
    assert_eq!(field("sm_lid"), "0");
    assert_eq!(field("state"), "PORT_ACTIVE (4)");
    assert_eq!(field("active_mtu"), "1024 (3)");
    assert_eq!(field("port_cap_flags"), "0x04010000");
    // The same node (NODE) as `hca()` describes, on an Ethernet port.
    let info = hca(1, 0);
    let mac = {
        let g = info.node_guid.to_be_bytes();
        [g[0], g[1], g[2], g[5], g[6], g[7]]
    };
    let ll = format!(
        "fe80:0000:0000:0000:{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}",
        mac[0] ^ 2,
        mac[1],
        mac[2],
        mac[3],
        mac[4],
        mac[5]
    );
    let v4 = format!("0000:0000:0000:0000:0000:ffff:7f01:{:04x}", info.lid);
    // ibv_devinfo prints "GID[ i]: <gid>, <type>"; it shortens RoCE v2 GIDs to their
    // textual form.
    let g0 = field("GID[  0]");
    let g2 = field("GID[  2]");
    assert_eq!(g0, format!("{ll}, RoCE v1"));
    assert!(field("GID[  1]").ends_with(", RoCE v2"), "{out}");
    assert_eq!(g2, format!("{v4}, RoCE v1"));
    assert_eq!(
        field("GID[  3]"),
        format!("::ffff:127.1.0.{}, RoCE v2", info.lid)
    );
    assert!(!out.contains("GID[  4]"), "four valid GIDs:\n{out}");
}

#[test]
fn ibv_devinfo_verbose_shows_a_roce_port() {
    devinfo_roce("modern");
}

#[test]
fn ibv_devinfo_verbose_shows_a_roce_port_from_sysfs_on_a_write_only_kernel() {
    devinfo_roce("write");
}

#[test]
fn ibv_rc_pingpong_runs_on_a_roce_port_by_the_ipv4_roce_v2_gid() {
    // -g 3: ::ffff:127.1.0.n, RoCE v2; the QPs are routed by GID (LID 0 on both sides).
    pingpong("ibv_rc_pingpong", 50, 4096, &["-g", "3"], &ROCE);
}

#[test]
fn ibv_rc_pingpong_runs_on_a_roce_port_on_a_write_only_kernel() {
    // The GID comes from the fake sysfs, CREATE_AH/MODIFY_QP through write().
    pingpong(
        "ibv_rc_pingpong",
        20,
        1024,
        &["-g", "3"],
        &[
            ("MLX5_EMU_FLAVOUR", "write"),
            ("MLX5_EMU_LINK_LAYER", "eth"),
        ],
    );
}

#[test]
fn ibv_ud_pingpong_runs_on_a_roce_port() {
    // Address handles with a GRH: libmlx5 asks the kernel for the destination MAC
    // (CREATE_AH with driver data) and builds RoCE address vectors.
    let traces = pingpong("ibv_ud_pingpong", 50, 1024, &["-g", "3"], &ROCE);
    for t in &traces {
        assert!(ok_verbs(t, "CREATE_AH") >= 1, "{t}");
    }
}

#[test]
fn ib_send_lat_runs_on_a_roce_port() {
    two_process_env(
        "ib_send_lat",
        &["-n", "100", "-x", "3"],
        &ROCE,
        &both("t_avg"),
    );
}

#[test]
fn ibv_uc_pingpong_runs_between_two_processes() {
    pingpong(
        "ibv_uc_pingpong",
        50,
        4096,
        &[],
        &[("MLX5_EMU_FLAVOUR", "eproto")],
    );
}

#[test]
fn ibv_ud_pingpong_runs_between_two_processes() {
    pingpong("ibv_ud_pingpong", 50, 1024, &[], &MODERN);
}

#[test]
fn ibv_srq_pingpong_runs_between_two_processes() {
    // 16 RC QPs sharing one SRQ on each side.
    pingpong("ibv_srq_pingpong", 50, 4096, &[], &MODERN);
}

#[test]
fn ibv_rc_pingpong_survives_a_lossy_fabric() {
    // 5% drops, 1% duplicates, 2% reordering on both sides' wire: RC retransmission and
    // duplicate detection must still deliver every message once, in order (-c checks
    // every payload).
    let faults = [
        ("MLX5_EMU_FAULT_SEED", "7"),
        ("MLX5_EMU_DROP_PPM", "50000"),
        ("MLX5_EMU_DUP_PPM", "10000"),
        ("MLX5_EMU_REORDER_PPM", "20000"),
    ];
    pingpong("ibv_rc_pingpong", 100, 1024, &["-c"], &faults);
}

#[test]
fn each_side_captures_its_packets_with_mlx5_emu_pcap() {
    let base = std::env::temp_dir().join(format!("mlx5-emu-preload.{}", std::process::id()));
    let pattern = format!("{}.{{side}}.pcap", base.display());
    let (iters, size) = (20, 256);
    pingpong(
        "ibv_ud_pingpong",
        iters,
        size,
        &[],
        &[("MLX5_EMU_PCAP", pattern.as_str())],
    );
    for side in ["server", "client"] {
        let path = PathBuf::from(pattern.replace("{side}", side));
        let bytes = fs::read(&path).unwrap_or_default();
        let _ = fs::remove_file(&path);
        // pcap global header (24 B, magic a1b2c3d4 in either byte order), then one
        // Ethernet/IPv4/UDP 4791 record per UD SEND of `size` bytes at least.
        assert!(
            bytes.len() > 24 + (iters * size) as usize,
            "{side}: {} bytes",
            bytes.len()
        );
        let magic = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        assert!(
            matches!(magic, 0xa1b2_c3d4 | 0xd4c3_b2a1),
            "{side}: magic {magic:#x}"
        );
    }
}

#[test]
fn ib_send_lat_runs_between_two_processes() {
    two_process("ib_send_lat", &["-n", "100"], "modern", both("t_avg"));
}

#[test]
fn ib_write_lat_runs_between_two_processes() {
    two_process("ib_write_lat", &["-n", "100"], "eproto", both("t_avg"));
}

#[test]
fn ib_read_and_atomic_lat_run_between_two_processes() {
    // The responder of READ and atomics is passive: only the client prints results.
    two_process(
        "ib_read_lat",
        &["-n", "100"],
        "modern",
        client_only("t_avg"),
    );
    two_process(
        "ib_atomic_lat",
        &["-n", "100"],
        "write",
        client_only("t_avg"),
    );
}

/// A perftest bandwidth run of `iters` messages of `size` bytes (perftest's default 64 KiB
/// when `None`): the client's result line starts with "<size> <iters>".
fn bw(program: &str, iters: u32, size: Option<u32>, flavour: &str) {
    let n = iters.to_string();
    let s = size.map(|s| s.to_string());
    let mut args = vec!["-n", n.as_str()];
    if let Some(s) = &s {
        args.extend(["-s", s.as_str()]);
    }
    let line = format!("{} {iters}", size.unwrap_or(65536));
    two_process(program, &args, flavour, client_only(&line));
}

#[test]
fn ib_write_bw_runs_between_two_processes() {
    // 4 KiB messages (one packet each), then perftest's default 64 KiB (16 packets each).
    bw("ib_write_bw", 500, Some(4096), "modern");
    bw("ib_write_bw", 50, None, "modern");
}

#[test]
fn ib_send_and_read_bw_run_between_two_processes() {
    bw("ib_send_bw", 50, None, "modern");
    bw("ib_read_bw", 50, None, "write");
}
