//! 1,000,000 RDMA WRITEs (8 bytes inline), signaled every 16th WR, unsignaled ones reported
//! through `report_unsignaled`: every wr_id is seen exactly once, in order, and the 16-bit WQE
//! index wraps more than 15 times.

mod common;

use std::time::Instant;

use common::{PairOpts, Rig, pair};
use mlx5::{QpType, SendFlags, SendWr, WcFlags, WcStatus, WorkCompletion, WrOp};

const TOTAL: u64 = 1_000_000;

fn million_writes_every_wr_id_once(rig: &dyn Rig) {
    let mut o = PairOpts::new(QpType::Rc);
    o = o.caps(64, 1, 1, 1, 8);
    o.report_unsignaled = true;
    o.cqe = 256;
    let (mut a, b) = pair(rig, o);
    let geo = a.qp.sq_ref().geometry();
    assert_eq!(geo.wqe_size, 64, "8-byte inline RC WRITE fits one WQEBB");
    let raddr = b.mr.addr();
    let rkey = b.mr.rkey();
    let t0 = Instant::now();
    let mut next_post = 0u64;
    let mut next_seen = 0u64;
    let mut signaled_seen = 0u64;
    let mut wcs = [WorkCompletion::default(); 64];
    let mut payloads = [[0u8; 8]; 16];
    let mut idle = 0u32;
    while next_seen < TOTAL {
        // Post a chain of up to 16 WRs (one doorbell), as room allows.
        let room = u64::from(a.qp.sq_ref().free())
            .min(16)
            .min(TOTAL - next_post);
        if room > 0 {
            let n = room as usize;
            for (k, p) in payloads.iter_mut().take(n).enumerate() {
                *p = (next_post + k as u64).to_le_bytes();
            }
            let parts: Vec<[&[u8]; 1]> = payloads[..n].iter().map(|p| [&p[..]]).collect();
            let wrs: Vec<SendWr<'_>> = (0..n)
                .map(|k| {
                    let id = next_post + k as u64;
                    let flags = if id % 16 == 15 || id == TOTAL - 1 {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    };
                    SendWr::new(id, WrOp::Write { raddr, rkey }, &[], flags).with_inline(&parts[k])
                })
                .collect();
            a.qp.post_send(&wrs).expect("post");
            next_post += room;
        }
        let k = a.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            assert_eq!(wc.status, WcStatus::SUCCESS, "{wc:?}");
            assert_eq!(
                wc.wr_id, next_seen,
                "wr_ids must come exactly once, in order"
            );
            let unsignaled = wc.wc_flags.contains(WcFlags::UNSIGNALED);
            let should_signal = wc.wr_id % 16 == 15 || wc.wr_id == TOTAL - 1;
            assert_eq!(unsignaled, !should_signal, "{wc:?}");
            if !unsignaled {
                signaled_seen += 1;
            }
            next_seen += 1;
        }
        if k == 0 {
            idle += 1;
            assert!(idle < 10_000_000, "stalled at {next_seen}");
            rig.progress();
        } else {
            idle = 0;
        }
    }
    let dt = t0.elapsed();
    assert_eq!(signaled_seen, TOTAL / 16 + u64::from(TOTAL % 16 != 0));
    assert_eq!(a.qp.sq_ref().outstanding(), 0);
    // The SQ ring (geo.wqe_cnt WQEBBs) wrapped this many times; the 16-bit WQE index in the
    // control segment (and the doorbell record) wrapped `index_wraps` times.
    let producer = u64::from(a.qp.sq_ref().producer());
    let ring_wraps = producer / u64::from(geo.wqe_cnt);
    let index_wraps = producer / 65536;
    assert!(ring_wraps > 15, "only {ring_wraps} wraps of the SQ ring");
    assert!(
        index_wraps >= 15,
        "only {index_wraps} wraps of the 16-bit WQE index"
    );
    assert_eq!(b.buf.read_u64(0), TOTAL - 1, "the last WRITE landed");
    if let Some(c) = rig.counters(0) {
        assert!(c.wqes_executed >= TOTAL);
        assert!(c.inline_wqes >= TOTAL);
    }
    eprintln!(
        "{TOTAL} WRs in {:.2?}: {:.0} ns/WR (driver + emulator), {} signaled CQEs, SQ ring wrapped {} times, WQE index {} times",
        dt,
        dt.as_nanos() as f64 / TOTAL as f64,
        signaled_seen,
        ring_wraps,
        index_wraps
    );
}

scenarios!(million_writes_every_wr_id_once);
