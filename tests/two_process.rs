//! Two processes, each with its own emulated HCA, connected by the emulator's UDP fabric
//! (RoCEv2 framing on loopback) with packet loss, duplication and reordering: 10,000 RC SENDs
//! from this driver in one process arrive at this driver in the other, in order, exactly once.
//!
//! The test runs itself a second time as the receiving child (same test, selected by an
//! environment variable); the two exchange LID and QPN over the child's stdin/stdout.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{EmuRig, PairOpts, side};
use mlx5::{QpType, RecvWr, RemoteQp, SendFlags, SendWr, WcStatus, WorkCompletion};
use mlx5_emu::{EmuConfig, Fabric, FaultConfig, RunMode};

const N: u64 = 10_000;
const ROLE: &str = "MLX5_TWO_PROCESS_ROLE";
const TAG: &str = "MLX5TP";

fn rig(seed: u64) -> EmuRig {
    EmuRig::with(EmuConfig {
        num_hcas: 1,
        mode: RunMode::Threaded,
        fabric: Fabric::Udp,
        node: None,
        fault: FaultConfig {
            seed,
            drop_ppm: 50_000,
            dup_ppm: 10_000,
            reorder_ppm: 10_000,
            delay_ns: 0,
        },
        ..EmuConfig::default()
    })
}

fn opts() -> PairOpts {
    let mut o = PairOpts::new(QpType::Rc);
    o = o.caps(128, 512, 1, 1, 16);
    o.cqe = 2048;
    o
}

fn parse(line: &str) -> (u16, u32) {
    // libtest may print "test <name> ... " on the same line before the test's own output.
    let at = line.find(TAG).expect("tagged line");
    let mut it = line[at + TAG.len()..].split_whitespace();
    let lid = it.next().and_then(|v| v.parse().ok()).expect("lid");
    let qpn = it.next().and_then(|v| v.parse().ok()).expect("qpn");
    (lid, qpn)
}

/// End the process if the test has not finished in `secs`: a stalled peer must fail the test,
/// never hang the test run.
fn watchdog(who: &'static str, secs: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(secs));
        eprintln!("{who}: no progress in {secs} s, giving up");
        std::process::exit(3);
    });
}

/// The receiving side (child process).
fn child() {
    watchdog("two-process child", 170);
    let rig = rig(7);
    let mut s = side(&rig, 0, &opts());
    let lid = s.ctx.query_port(1).unwrap().lid;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{TAG} {lid} {}", s.qp.qpn()).unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let (plid, pqpn) = parse(&line);
    s.qp.to_init(1, mlx5::Access::ALL).unwrap();
    s.qp.to_rtr(
        &RemoteQp {
            qpn: pqpn,
            psn: 1,
            lid: plid,
            gid: None,
        },
        3,
        0,
    )
    .unwrap();
    s.qp.to_rts(2, 7).unwrap();
    let mut posted = 0u64;
    let mut got = 0u64;
    let mut wcs = [WorkCompletion::default(); 64];
    let deadline = Instant::now() + Duration::from_secs(120);
    while got < N {
        while posted < N && posted - got < 400 {
            let sge = [s.mr.sge((posted % 512) * 16, 16)];
            s.qp.post_recv(&[RecvWr {
                wr_id: posted,
                sg_list: &sge,
            }])
            .unwrap();
            posted += 1;
        }
        let k = s.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (got, WcStatus::SUCCESS, 8),
                "{wc:?}"
            );
            assert_eq!(
                s.buf.read_u64((got % 512) as usize * 16),
                got,
                "payload of message {got}"
            );
            got += 1;
        }
        assert!(
            Instant::now() < deadline,
            "child: only {got} of {N} messages"
        );
        if k == 0 {
            std::thread::yield_now();
        }
    }
    writeln!(out, "{TAG} {got} 0").unwrap();
    out.flush().unwrap();
    // Stay up until the parent has its last ACKs (it closes our stdin when done).
    let _ = std::io::stdin().lock().read_line(&mut line);
}

#[test]
fn two_processes_over_a_lossy_udp_fabric() {
    if std::env::var(ROLE).as_deref() == Ok("child") {
        child();
        return;
    }
    watchdog("two-process parent", 180);
    let exe = std::env::current_exe().unwrap();
    let mut kid = Command::new(exe)
        .args([
            "--exact",
            "two_processes_over_a_lossy_udp_fabric",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "child")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut kid_out = BufReader::new(kid.stdout.take().unwrap());
    let mut kid_in = kid.stdin.take().unwrap();
    let mut line = String::new();
    let tagged = |r: &mut BufReader<std::process::ChildStdout>, line: &mut String| loop {
        line.clear();
        assert!(r.read_line(line).unwrap() > 0, "child exited early");
        if line.contains(TAG) {
            break;
        }
    };
    tagged(&mut kid_out, &mut line);
    let (clid, cqpn) = parse(&line);

    let rig = rig(11);
    let mut s = side(&rig, 0, &opts());
    let lid = s.ctx.query_port(1).unwrap().lid;
    assert_ne!(
        lid, clid,
        "the two processes have different fabric addresses"
    );
    writeln!(kid_in, "{TAG} {lid} {}", s.qp.qpn()).unwrap();
    kid_in.flush().unwrap();
    s.qp.to_init(1, mlx5::Access::ALL).unwrap();
    s.qp.to_rtr(
        &RemoteQp {
            qpn: cqpn,
            psn: 2,
            lid: clid,
            gid: None,
        },
        3,
        0,
    )
    .unwrap();
    s.qp.to_rts(1, 7).unwrap();

    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut done = 0u64;
    let mut wcs = [WorkCompletion::default(); 64];
    while done < N {
        while sent < N && s.qp.sq_ref().free() > 0 && sent < done + 100 {
            let p = sent.to_le_bytes();
            let parts: [&[u8]; 1] = [&p];
            s.qp.post_send(&[SendWr::send_inline(sent, &parts, SendFlags::SIGNALED)])
                .unwrap();
            sent += 1;
        }
        let k = s.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            assert_eq!((wc.wr_id, wc.status), (done, WcStatus::SUCCESS), "{wc:?}");
            done += 1;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "parent: only {done} of {N} completions"
        );
        if k == 0 {
            std::thread::yield_now();
        }
    }
    tagged(&mut kid_out, &mut line);
    assert_eq!(
        parse(&line).0 as u64 % 65536,
        N % 65536,
        "the child received all messages"
    );
    drop(kid_in);
    let status = kid.wait().unwrap();
    assert!(status.success(), "child failed: {status:?}");
    let c = rig.emu.counters(0);
    eprintln!(
        "{N} RC SENDs across processes in {:.2?}: {} packets sent, {} dropped, {} retransmission timeouts",
        t0.elapsed(),
        c.packets_sent,
        c.packets_dropped,
        c.local_ack_timeout_err
    );
    assert!(c.packets_sent > N, "losses forced retransmissions");
}
