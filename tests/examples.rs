//! Every program in `examples/` runs to completion and prints what it did: the binaries
//! `cargo test` builds next to this test (`target/<profile>/examples/`) are run on the
//! emulator in process (no NIC here; on a machine with one they run on it), each with a
//! time limit.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>/examples/<name>`, next to this test's own `deps/` directory.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary in target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.rs"));
    let mtime = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let (built, written) = (mtime(&path), mtime(&source));
    assert!(
        built.is_some() && built >= written,
        "{} is {}: `cargo test` builds the examples with the tests; to run this test alone, \
         `cargo build --release --examples && cargo test --release --test examples`",
        path.display(),
        if built.is_some() {
            "older than its source"
        } else {
            "not built"
        }
    );
    path
}

/// Run example `name` with `args` (and no real-NIC choice forced), at most `limit`; its
/// stdout, after checking it exited 0.
fn run(name: &str, args: &[&str], limit: Duration) -> String {
    let mut child = Command::new(example(name))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn example");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{name} did not finish within {limit:?}; stdout:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        status.success(),
        "{name} failed ({status}); stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn rc_pingpong_round_trips() {
    let out = run("rc_pingpong", &["300"], LIMIT);
    assert!(out.contains("device: mlx5_"), "{out}");
    assert!(out.contains("300 round trips of 64 bytes"), "{out}");
    assert!(out.ends_with("rc_pingpong: ok\n"), "{out}");
}

#[test]
fn rc_pingpong_refuses_a_bad_count() {
    let st = Command::new(example("rc_pingpong"))
        .arg("many")
        .output()
        .expect("run");
    assert!(!st.status.success());
    assert!(
        String::from_utf8_lossy(&st.stderr)
            .starts_with("rc_pingpong: ITERATIONS \"many\": invalid digit"),
        "{st:?}"
    );
}

#[test]
fn rc_pingpong_lowlevel_signals_one_in_eight_on_two_threads() {
    let out = run("rc_pingpong_lowlevel", &["4000"], LIMIT);
    assert!(
        out.contains("4000 messages of 32 bytes pinged and echoed"),
        "{out}"
    );
    // 4000 SENDs, every 8th signaled: exactly 500 completions retire them all.
    assert!(
        out.contains("sender: 500 signaled completions for 4000 SENDs (1 in 8)"),
        "{out}"
    );
    assert!(out.ends_with("rc_pingpong_lowlevel: ok\n"), "{out}");
}

#[test]
fn write_imm_lands_data_and_immediates() {
    let out = run("write_imm", &[], LIMIT);
    for size in [1, 64, 1000, 4096, 65536] {
        assert!(
            out.contains(&format!("says {size} bytes, memory matches")),
            "{size}: {out}"
        );
    }
    assert!(out.contains("immediate 0xc0de0004"), "{out}");
    assert!(out.ends_with("write_imm: ok\n"), "{out}");
}

#[test]
fn error_completion_is_explained_and_the_state_told_truly() {
    let out = run("error_completion", &[], LIMIT);
    assert!(out.contains("status          REM_ACCESS_ERR (10)"), "{out}");
    assert!(
        out.contains("syndrome        REMOTE_ACCESS (0x13)"),
        "{out}"
    );
    assert!(
        out.contains("vendor syndrome REMOTE_ACCESS (0x88)"),
        "{out}"
    );
    assert!(out.contains("opcode          RDMA_WRITE, QP 0x"), "{out}");
    // The completion's `Display`: the status and syndromes, then the explanation lines.
    let shown = out
        .split("as printed with {}:\n")
        .nth(1)
        .expect("the completion printed with {}");
    assert!(shown.starts_with("wr_id 1 REM_ACCESS_ERR qp 0x"), "{out}");
    for line in ["meaning: ", "causes: ", "check: "] {
        assert!(shown.lines().any(|l| l.starts_with(line)), "{line}: {out}");
    }
    for qp in ["A", "B"] {
        assert!(
            out.contains(&format!(
                "QP {qp}: state() = Rts (last state set), query_state() = Err (the kernel's)"
            )),
            "{out}"
        );
    }
    assert!(out.contains("async event: QP_ACCESS_ERR on QP"), "{out}");
    assert!(
        out.contains("posted after the error: WR_FLUSH_ERR"),
        "{out}"
    );
    assert!(out.ends_with("error_completion: ok\n"), "{out}");
}

fn has_net_admin() -> bool {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|c| c & (1 << 12) != 0)
}

/// 10^5 packets of a multicast feed through a namespace's TAP to a raw QP and to a kernel
/// socket: every packet is accounted for by both receivers (received, or in a gap named by
/// its sequence numbers), and both print their latency and CPU figures. Without
/// `CAP_NET_ADMIN` (CI runs as root) the example refuses by name.
#[test]
fn md_feed_accounts_for_every_packet_on_both_receivers() {
    if !has_net_admin() {
        let st = Command::new(example("md_feed")).output().expect("run");
        assert!(!st.status.success());
        let err = String::from_utf8_lossy(&st.stderr);
        assert!(err.contains("CAP_NET_ADMIN"), "{err}");
        return;
    }
    let out = run("md_feed", &["-n", "100000", "-r", "25000"], LIMIT);
    for rx in ["raw QP (NIC ts)", "raw QP (app)", "kernel socket"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(rx))
            .unwrap_or_else(|| panic!("no row for {rx}: {out}"));
        // received, gaps, dup, five percentiles, cpu per packet: all numbers.
        let cols: Vec<&str> = line[rx.len()..].split_whitespace().collect();
        assert_eq!(cols.len(), 9, "{line}");
        assert!(cols.iter().all(|c| c.parse::<f64>().is_ok()), "{line}");
    }
    for rx in ["raw QP", "kernel socket"] {
        assert!(
            out.contains(&format!("{rx}: accounted for 100000 of 100000")),
            "{rx}: {out}"
        );
    }
    assert!(out.ends_with("md_feed: ok\n"), "{out}");
}

/// The README lists every example, and its test command is the one CI runs.
#[test]
fn the_readme_lists_every_example_and_ci_runs_its_test_command() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(root.join("examples"))
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "rs").then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 6, "{names:?}");
    for n in &names {
        assert!(
            readme.contains(&format!("| `{n}` |")),
            "README misses example {n}"
        );
    }
    // The two set-up commands: the main job and the test command, in that order.
    let blocks: Vec<&str> = readme
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .take(2)
        .collect();
    assert_eq!(
        blocks,
        [
            "cargo run --release -p mlx5-tools -- lat send\n",
            "tools/test.sh\n"
        ]
    );
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l == "tools/test.sh"), "{ci}");
    assert!(!ci.contains("cargo test --workspace"), "{ci}");
    let script = std::fs::read_to_string(root.join("tools/test.sh")).unwrap();
    assert!(
        script.contains("cargo test --workspace --release --no-fail-fast")
            && script.contains("-f tools/test-summary.awk"),
        "{script}"
    );
}

/// tools/test.sh's closing line sums every binary's result, failed ones included, and each
/// binary's start is stamped; everything else passes through unchanged.
#[test]
fn the_test_script_ends_with_one_summary_line() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cargo_output = "\
   Compiling mlx5 v0.1.0
     Running tests/a.rs (target/release/deps/a-1)

running 3 tests
test x ... ok
test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s

     Running tests/b.rs (target/release/deps/b-2)
test result: FAILED. 10 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s
   Doc-tests mlx5
test result: ok. 4 passed; 0 failed; 5 ignored; 0 measured; 0 filtered out; finished in 2s
";
    let mut child = Command::new("awk")
        .arg("-f")
        .arg(root.join("tools/test-summary.awk"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("awk");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cargo_output.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("tools/test.sh: 17 passed, 2 failed, 6 ignored (test binaries: 3, ["),
        "{text}"
    );
    assert_eq!(lines.len(), cargo_output.lines().count() + 1, "{text}");
    assert!(
        lines[1].starts_with("[00:0")
            && lines[1].ends_with("Running tests/a.rs (target/release/deps/a-1)"),
        "{text}"
    );
    assert!(lines.contains(&"test result: FAILED. 10 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s"));
}
