//! The flight recorder (docs/flight-recorder.md): a forced error produces a dump whose `wqe`
//! line for the failing WQE holds the bytes posted and whose `cqe` line is the error CQE; the
//! ring keeps only the last N; off means no records.

mod common;

use std::sync::{Arc, Mutex};

use common::{PairOpts, Rig, pair, poll_n, with_raw};
use mlx5::{
    QpType, RecorderConfig, RecorderDump, RecvWr, SendFlags, SendWr, Sge, Syndrome, WcStatus,
};

/// One parsed record line: kind, queue number, index, sequence number, bytes.
#[derive(Debug, Clone)]
struct Line {
    kind: String,
    queue: u32,
    index: u32,
    seq: u64,
    bytes: Vec<u8>,
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("lowercase hex"))
        .collect()
}

fn qnum(s: &str) -> u32 {
    u32::from_str_radix(s.strip_prefix("0x").expect("0x prefix"), 16).expect("hex number")
}

/// Check the fixed lines and return the header fields (`qp`/`cq` lines as key-value maps) and
/// the records.
fn parse(text: &str) -> (Vec<Vec<String>>, Vec<Line>) {
    let mut it = text.lines();
    assert_eq!(it.next(), Some("mlx5-flight-recorder v1"), "{text}");
    assert!(it.next().unwrap().starts_with("reason "), "{text}");
    let mut heads = Vec::new();
    let mut recs = Vec::new();
    for l in it {
        let f: Vec<&str> = l.split(' ').collect();
        match f[0] {
            "qp" | "cq" => heads.push(f.iter().map(|s| s.to_string()).collect()),
            "wqe" | "rwqe" | "cqe" => {
                assert_eq!(f.len(), 5, "{l}");
                recs.push(Line {
                    kind: f[0].to_string(),
                    queue: qnum(f[1]),
                    index: f[2].parse().unwrap(),
                    seq: f[3].parse().unwrap(),
                    bytes: unhex(f[4]),
                });
            }
            other => panic!("unknown record kind {other:?} in {text}"),
        }
    }
    // Oldest first: sequence numbers strictly increase.
    assert!(recs.windows(2).all(|w| w[0].seq < w[1].seq), "{text}");
    (heads, recs)
}

/// The value after `key` in a header line.
fn field(head: &[String], key: &str) -> String {
    let i = head.iter().position(|k| k == key).expect(key);
    head[i + 1].clone()
}

fn sink() -> (Arc<Mutex<Vec<RecorderDump>>>, RecorderConfig, tempdir::Dir) {
    let dumps = Arc::new(Mutex::new(Vec::new()));
    let d = dumps.clone();
    let dir = tempdir::Dir::new();
    let cfg = RecorderConfig {
        records: 8,
        dir: Some(dir.0.clone()),
        callback: Some(Arc::new(move |x: &RecorderDump| {
            d.lock().unwrap().push(x.clone())
        })),
    };
    (dumps, cfg, dir)
}

mod tempdir {
    use std::path::PathBuf;

    /// A fresh directory, removed on drop.
    pub struct Dir(pub PathBuf);

    impl Dir {
        pub fn new() -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "mlx5-recorder-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }

        pub fn files(&self) -> Vec<PathBuf> {
            std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect()
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The bytes a 1-SGE signaled SEND's WQE starts with (control and data segments), encoded here
/// from the PRM layout independently of the driver.
fn send_wqe_head(wqe_index: u16, qpn: u32, sge: &Sge) -> [u8; 32] {
    let mut w = [0u8; 32];
    w[1..3].copy_from_slice(&wqe_index.to_be_bytes());
    w[3] = 0x0a; // SEND
    w[4..7].copy_from_slice(&qpn.to_be_bytes()[1..]);
    w[7] = 2; // ds: ctrl + one data segment
    w[11] = 0x08; // CQ update (signaled)
    w[16..20].copy_from_slice(&sge.length.to_be_bytes());
    w[20..24].copy_from_slice(&sge.lkey.to_be_bytes());
    w[24..32].copy_from_slice(&sge.addr.to_be_bytes());
    w
}

/// A SEND with a bad lkey after `good` good ones: the dump taken on its error CQE, through the
/// verbs poller or (`raw`) the low-level one.
fn forced_error(rig: &dyn Rig, raw: bool) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc));
    let (dumps, cfg, dir) = sink();
    a.qp.enable_recorder(&cfg).unwrap();
    a.cq.enable_recorder(&cfg).unwrap();
    let good = 3u64;
    for i in 0..good {
        let sge = [b.mr.sge(64 * i, 64)];
        b.qp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &sge,
        }])
        .unwrap();
    }
    for i in 0..good {
        let sge = [a.mr.sge(0, 40 + i as u32)];
        a.qp.post_send(&[SendWr::send(i, &sge, SendFlags::SIGNALED)])
            .unwrap();
    }
    let wcs = poll_n(rig, &mut a.cq, good as usize);
    assert!(wcs.iter().all(|w| w.status == WcStatus::SUCCESS), "{wcs:?}");
    assert!(dumps.lock().unwrap().is_empty(), "no dump without an error");

    let bad = Sge {
        lkey: a.mr.lkey() ^ 0x00ff_ff00,
        ..a.mr.sge(128, 64)
    };
    let at = a.qp.sq_ref().producer();
    a.qp.post_send(&[SendWr::send(99, &[bad], SendFlags::SIGNALED)])
        .unwrap();
    // The bytes the device was given, read from the ring right after posting.
    let mut posted = vec![0u8; 64];
    a.qp.sq_ref().wqe_bytes(at, &mut posted);
    assert_eq!(
        posted[..32],
        send_wqe_head(at as u16, a.qp.qpn(), &bad),
        "the WQE as encoded from the PRM"
    );

    if raw {
        with_raw(&mut a.cq, &a.ctx, |cq| {
            let c = loop {
                if let Some(c) = cq.next() {
                    break c;
                }
                rig.progress();
            };
            cq.publish_ci();
            assert_eq!(c.status(), WcStatus::LOC_PROT_ERR);
            assert_eq!(c.wqe_counter(), at as u16);
        });
    } else {
        let wc = poll_n(rig, &mut a.cq, 1)[0];
        assert_eq!(
            (wc.wr_id, wc.status, wc.syndrome),
            (99, WcStatus::LOC_PROT_ERR, Syndrome::LOCAL_PROT)
        );
    }

    let dumps = dumps.lock().unwrap().clone();
    assert_eq!(dumps.len(), 1, "one dump for the one error CQE: {dumps:?}");
    let d = &dumps[0];
    assert!(
        d.reason.contains("LOC_PROT_ERR") && d.reason.contains("requester"),
        "{}",
        d.reason
    );
    let path = d.path.as_ref().expect("written to the directory");
    assert_eq!(dir.files(), vec![path.clone()]);
    assert_eq!(std::fs::read_to_string(path).unwrap(), d.text);

    let (heads, recs) = parse(&d.text);
    let qp = heads.iter().find(|h| h[0] == "qp").expect("qp line");
    assert_eq!(qnum(&qp[1]), a.qp.qpn());
    assert_eq!(field(qp, "type"), "RC");
    assert_eq!(field(qp, "state"), "RTS");
    assert_eq!(field(qp, "sq_pi"), (at + 1).to_string());
    assert_eq!(field(qp, "sq_dbrec"), (at + 1).to_string());
    let cq = heads.iter().find(|h| h[0] == "cq").expect("cq line");
    assert_eq!(qnum(&cq[1]), a.cq.cqn());
    assert_eq!(field(cq, "cqe_size"), "64");
    assert_eq!(field(cq, "ci"), (good + 1).to_string());

    let wqes: Vec<_> = recs.iter().filter(|r| r.kind == "wqe").collect();
    assert_eq!(wqes.len(), good as usize + 1, "{recs:?}");
    let failing = wqes.last().unwrap();
    assert_eq!(failing.queue, a.qp.qpn());
    assert_eq!(failing.index, at);
    assert_eq!(failing.bytes, posted, "the failing WQE exactly as posted");

    let cqes: Vec<_> = recs.iter().filter(|r| r.kind == "cqe").collect();
    assert_eq!(cqes.len(), good as usize + 1);
    let e = cqes.last().unwrap();
    assert_eq!((e.queue, e.index), (a.cq.cqn(), good as u32));
    assert_eq!(e.bytes.len(), 64);
    assert_eq!(e.bytes[0x3f] >> 4, 0xd, "REQ_ERR");
    assert_eq!(e.bytes[0x37], Syndrome::LOCAL_PROT.0, "syndrome");
    assert_eq!(
        u16::from_be_bytes([e.bytes[0x3c], e.bytes[0x3d]]),
        at as u16
    );
    assert!(failing.seq < e.seq, "the WQE is recorded before its CQE");
    // Good completions of the earlier WQEs, each after its WQE.
    for (w, c) in wqes.iter().zip(&cqes).take(good as usize) {
        assert_eq!(c.bytes[0x3f] >> 4, 0x0, "REQ");
        assert_eq!(
            u16::from_be_bytes([c.bytes[0x3c], c.bytes[0x3d]]),
            w.index as u16
        );
        assert!(w.seq < c.seq);
    }
}

fn forced_error_verbs(rig: &dyn Rig) {
    forced_error(rig, false);
}

fn forced_error_raw(rig: &dyn Rig) {
    forced_error(rig, true);
}

/// A WRITE to a bad rkey: the responder's NAK comes back as REM_ACCESS_ERR, dumped.
fn bad_rkey_write(rig: &dyn Rig) {
    let (mut a, b) = pair(rig, PairOpts::new(QpType::Rc));
    let (dumps, cfg, _dir) = sink();
    a.qp.enable_recorder(&cfg).unwrap();
    a.cq.enable_recorder(&cfg).unwrap();
    let sge = [a.mr.sge(0, 16)];
    let at = a.qp.sq_ref().producer();
    let op = mlx5::WrOp::Write {
        raddr: b.mr.addr(),
        rkey: b.mr.rkey() ^ 0x0101_0100,
    };
    a.qp.post_send(&[SendWr::new(7, op, &sge, SendFlags::SIGNALED)])
        .unwrap();
    let mut posted = vec![0u8; 64];
    a.qp.sq_ref().wqe_bytes(at, &mut posted);
    let wc = poll_n(rig, &mut a.cq, 1)[0];
    assert_eq!(wc.status, WcStatus::REM_ACCESS_ERR);
    let dumps = dumps.lock().unwrap().clone();
    assert_eq!(dumps.len(), 1);
    assert!(
        dumps[0].reason.contains("REM_ACCESS_ERR"),
        "{}",
        dumps[0].reason
    );
    let (_, recs) = parse(&dumps[0].text);
    let w = recs.iter().find(|r| r.kind == "wqe").expect("wqe line");
    assert_eq!((w.index, &w.bytes), (at, &posted));
    let c = recs.iter().find(|r| r.kind == "cqe").expect("cqe line");
    assert_eq!(c.bytes[0x3f] >> 4, 0xd);
    assert_eq!(c.bytes[0x37], Syndrome::REMOTE_ACCESS.0);
}

/// The ring keeps the last N records per queue: 4 records, 10 SENDs and their receives.
fn ring_keeps_last_n(rig: &dyn Rig) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc));
    let cfg = RecorderConfig::new(4);
    a.qp.enable_recorder(&cfg).unwrap();
    a.cq.enable_recorder(&cfg).unwrap();
    b.qp.enable_recorder(&cfg).unwrap();
    b.cq.enable_recorder(&cfg).unwrap();
    let n = 10u64;
    let mut starts = Vec::new();
    for i in 0..n {
        let rs = [b.mr.sge(0, 64)];
        b.qp.post_recv(&[RecvWr {
            wr_id: 100 + i,
            sg_list: &rs,
        }])
        .unwrap();
        starts.push(a.qp.sq_ref().producer());
        let sge = [a.mr.sge(0, 64)];
        a.qp.post_send(&[SendWr::send(i, &sge, SendFlags::SIGNALED)])
            .unwrap();
    }
    poll_n(rig, &mut a.cq, n as usize);
    poll_n(rig, &mut b.cq, n as usize);
    let (heads, recs) = parse(&a.qp.recorder_dump().expect("on"));
    assert!(
        field(heads.iter().find(|h| h[0] == "qp").unwrap(), "outstanding") == "0",
        "{heads:?}"
    );
    let w: Vec<u32> = recs
        .iter()
        .filter(|r| r.kind == "wqe")
        .map(|r| r.index)
        .collect();
    assert_eq!(w, starts[6..], "the last 4 WQEs, oldest first");
    let c: Vec<u32> = recs
        .iter()
        .filter(|r| r.kind == "cqe")
        .map(|r| r.index)
        .collect();
    assert_eq!(c, vec![6, 7, 8, 9], "the last 4 CQEs by consumer index");
    let (_, recs) = parse(&b.qp.recorder_dump().expect("on"));
    let r: Vec<&Line> = recs.iter().filter(|r| r.kind == "rwqe").collect();
    assert_eq!(
        r.iter().map(|r| r.index).collect::<Vec<_>>(),
        vec![6, 7, 8, 9]
    );
    // A receive WQE is its data segment: length, lkey, address.
    assert_eq!(r[0].bytes[..4], 64u32.to_be_bytes());
    assert_eq!(r[0].bytes[4..8], b.mr.lkey().to_be_bytes());
    // The recorder does not change what is posted or completed: more traffic still flows.
    let rs = [b.mr.sge(0, 8)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 500,
        sg_list: &rs,
    }])
    .unwrap();
    a.qp.post_send(&[SendWr::send(50, &[a.mr.sge(0, 8)], SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(poll_n(rig, &mut a.cq, 1)[0].wr_id, 50);
    assert_eq!(poll_n(rig, &mut b.cq, 1)[0].wr_id, 500);
}

/// Off (the default) means no records and no dumps: the QP's recorder alone does not dump
/// (only a recording CQ sees CQEs), and a QP without one has nothing to dump.
fn off_means_no_records(rig: &dyn Rig) {
    let (mut a, _b) = pair(rig, PairOpts::new(QpType::Rc));
    assert!(a.qp.recorder_dump().is_none());
    assert!(a.cq.recorder_dump().is_none());
    let (dumps, cfg, dir) = sink();
    a.qp.enable_recorder(&cfg).unwrap();
    assert!(a.qp.enable_recorder(&cfg).is_err(), "enabled twice");
    let bad = Sge {
        lkey: a.mr.lkey() ^ 0x00ff_ff00,
        ..a.mr.sge(0, 8)
    };
    a.qp.post_send(&[SendWr::send(1, &[bad], SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(poll_n(rig, &mut a.cq, 1)[0].status, WcStatus::LOC_PROT_ERR);
    assert!(dumps.lock().unwrap().is_empty());
    assert!(dir.files().is_empty());
    // On demand: the QP's WQE, no CQ line and no CQE (the CQ does not record).
    let (heads, recs) = parse(&a.qp.recorder_dump().unwrap());
    assert_eq!(heads.len(), 1);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].kind, "wqe");
}

/// The send queue records finished WQEs before it rings them; a CQE of an earlier WQE then
/// finds the recorded position ahead of the doorbell record, which must record nothing more
/// (it once walked on past the producer, over WQEs never posted).
fn recorded_ahead_of_the_doorbell(rig: &dyn Rig) {
    let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc));
    let cfg = RecorderConfig::new(16);
    a.qp.enable_recorder(&cfg).unwrap();
    a.cq.enable_recorder(&cfg).unwrap();
    for i in 0..3 {
        let rs = [b.mr.sge(0, 64)];
        b.qp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &rs,
        }])
        .unwrap();
    }
    let sge = a.mr.sge(0, 8);
    // WR 0 rung at once; WRs 1 and 2 built but not rung: posting WR 2 records WR 1.
    let sq = a.qp.sq();
    sq.send(SendFlags::SIGNALED)
        .unwrap()
        .sge(&sge)
        .unwrap()
        .finish(0);
    sq.ring();
    sq.send(SendFlags::SIGNALED)
        .unwrap()
        .sge(&sge)
        .unwrap()
        .finish(1);
    sq.send(SendFlags::SIGNALED)
        .unwrap()
        .sge(&sge)
        .unwrap()
        .finish(2);
    // WR 0's CQE makes the poller record what the doorbell record publishes (WR 0 only).
    let wc = poll_n(rig, &mut a.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (0, WcStatus::SUCCESS));
    let (_, recs) = parse(&a.qp.recorder_dump().unwrap());
    let w: Vec<u32> = recs
        .iter()
        .filter(|r| r.kind == "wqe")
        .map(|r| r.index)
        .collect();
    assert_eq!(w, vec![0, 1, 2], "each WQE once, nothing past the producer");
    a.qp.sq().ring();
    assert_eq!(poll_n(rig, &mut a.cq, 2).len(), 2);
}

/// A small deterministic generator (xorshift64*), so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The adversary of the recorder's claim "the last N WQEs posted and CQEs seen, exactly as
/// posted and seen, oldest first": random chains of gathered and inline SENDs of random sizes
/// (1 to 3 WQEBBs each) on a 16-WR send queue, so the ring wraps many times with WQEs of
/// mixed sizes straddling its end; a random N per seed (1 to 9) and on-demand dumps at random
/// points. Every dump's `wqe` records must be the last N WQEs with the bytes read from the ring
/// right after posting, its `cqe` records the last N CQEs with consecutive consumer indices,
/// each naming (wqe_counter) the WQE it completes and recorded after it.
fn random_traffic_keeps_exactly_the_last_n(rig: &dyn Rig) {
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (mut a, mut b) = pair(rig, PairOpts::new(QpType::Rc).caps(16, 64, 1, 1, 128));
        let n = 1 + rng.below(9) as usize;
        let cfg = RecorderConfig::new(n);
        a.qp.enable_recorder(&cfg).unwrap();
        a.cq.enable_recorder(&cfg).unwrap();
        let payload: Vec<u8> = (0..200u32).map(|i| (i * 7 + seed as u32) as u8).collect();
        // (WQEBB counter, bytes) of every WQE posted, in order.
        let mut posted: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut dumps_checked = 0;
        for step in 0..120u64 {
            let k = 1 + rng.below(3) as usize;
            for i in 0..k {
                let sge = [b.mr.sge(256 * i as u64, 256)];
                b.qp.post_recv(&[RecvWr {
                    wr_id: i as u64,
                    sg_list: &sge,
                }])
                .unwrap();
            }
            let lens: Vec<usize> = (0..k).map(|_| rng.below(129) as usize).collect();
            let inline: Vec<bool> = (0..k).map(|_| rng.below(2) == 0).collect();
            let sges: Vec<[Sge; 1]> = lens
                .iter()
                .map(|&l| [a.mr.sge(0, l.max(1) as u32)])
                .collect();
            let datas: Vec<[&[u8]; 1]> = lens.iter().map(|&l| [&payload[..l]]).collect();
            let wrs: Vec<SendWr<'_>> = (0..k)
                .map(|i| {
                    let id = step * 4 + i as u64;
                    if inline[i] {
                        SendWr::send_inline(id, &datas[i], SendFlags::SIGNALED)
                    } else {
                        SendWr::send(id, &sges[i], SendFlags::SIGNALED)
                    }
                })
                .collect();
            let mut c = a.qp.sq_ref().producer();
            a.qp.post_send(&wrs).unwrap();
            // Walk the chain's WQEs by their ds and keep each one's bytes as posted.
            for _ in 0..k {
                let mut ctrl = [0u8; 64];
                a.qp.sq_ref().wqe_bytes(c, &mut ctrl);
                let ds = u32::from(ctrl[7] & 0x3f);
                let bbs = (ds * 16).div_ceil(64);
                assert!((1..=3).contains(&bbs), "seed {seed} step {step}: ds {ds}");
                let mut w = vec![0u8; bbs as usize * 64];
                a.qp.sq_ref().wqe_bytes(c, &mut w);
                assert_eq!(u16::from_be_bytes([w[1], w[2]]), c as u16);
                posted.push((c, w));
                c = c.wrapping_add(bbs);
            }
            assert_eq!(c, a.qp.sq_ref().producer(), "seed {seed} step {step}");
            let wcs = poll_n(rig, &mut a.cq, k);
            assert!(wcs.iter().all(|w| w.status == WcStatus::SUCCESS), "{wcs:?}");
            let wcs = poll_n(rig, &mut b.cq, k);
            assert!(wcs.iter().all(|w| w.status == WcStatus::SUCCESS), "{wcs:?}");

            if rng.below(4) != 0 && step != 119 {
                continue;
            }
            dumps_checked += 1;
            let text = a.qp.recorder_dump().expect("the recorder is on");
            let (_, recs) = parse(&text);
            let wqes: Vec<&Line> = recs.iter().filter(|r| r.kind == "wqe").collect();
            let cqes: Vec<&Line> = recs.iter().filter(|r| r.kind == "cqe").collect();
            let keep = n.min(posted.len());
            let want = &posted[posted.len() - keep..];
            assert_eq!(wqes.len(), keep, "seed {seed} step {step} N {n}:\n{text}");
            for (r, (at, bytes)) in wqes.iter().zip(want) {
                assert_eq!(
                    (r.queue, r.index),
                    (a.qp.qpn(), *at),
                    "seed {seed} step {step}"
                );
                assert_eq!(
                    &r.bytes, bytes,
                    "seed {seed} step {step}: WQE {at} as posted"
                );
            }
            // Every WR is signaled: CQE j completes WQE j.
            assert_eq!(cqes.len(), keep, "seed {seed} step {step} N {n}:\n{text}");
            let first = posted.len() - keep;
            for (j, r) in cqes.iter().enumerate() {
                assert_eq!((r.queue, r.index), (a.cq.cqn(), (first + j) as u32));
                assert_eq!(r.bytes[0x3f] >> 4, 0x0, "REQ");
                let counter = u16::from_be_bytes([r.bytes[0x3c], r.bytes[0x3d]]);
                assert_eq!(
                    counter,
                    posted[first + j].0 as u16,
                    "seed {seed} step {step}"
                );
                assert!(wqes[j].seq < r.seq, "a WQE is recorded before its CQE");
            }
        }
        assert!(dumps_checked >= 20, "seed {seed}: {dumps_checked} dumps");
        assert!(
            posted.last().unwrap().0 > 16 * 8,
            "seed {seed}: the ring wrapped several times"
        );
    }
}

scenarios!(
    forced_error_verbs,
    forced_error_raw,
    bad_rkey_write,
    ring_keeps_last_n,
    off_means_no_records,
    recorded_ahead_of_the_doorbell,
    random_traffic_keeps_exactly_the_last_n
);
