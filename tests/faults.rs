//! A lossy fabric (5% drop, 1% duplicate, 1% reorder, from a seed): RC retransmission is the
//! device's job; the driver must still see every SEND delivered once, in order, and every send
//! completion once.

mod common;

use common::{EmuRig, PairOpts, pair};
use mlx5::{QpType, RecvWr, SendFlags, SendWr, WcStatus, WorkCompletion};
use mlx5_emu::{EmuConfig, FaultConfig, RunMode};

const N: u64 = 20_000;

#[test]
fn rc_over_a_lossy_fabric_delivers_in_order_exactly_once() {
    let rig = EmuRig::with(EmuConfig {
        num_hcas: 2,
        mode: RunMode::Stepped,
        fault: FaultConfig {
            seed: 42,
            drop_ppm: 50_000,
            dup_ppm: 10_000,
            reorder_ppm: 10_000,
            delay_ns: 0,
        },
        ..EmuConfig::default()
    });
    let mut o = PairOpts::new(QpType::Rc);
    o = o.caps(64, 256, 1, 1, 16);
    o.cqe = 1024;
    let (mut a, mut b) = pair(&rig, o);
    let mut posted_recv = 0u64;
    let mut sent = 0u64;
    let mut send_done = 0u64;
    let mut recv_done = 0u64;
    let mut wcs = [WorkCompletion::default(); 64];
    let mut idle = 0;
    while recv_done < N || send_done < N {
        while posted_recv < N && posted_recv - recv_done < 200 {
            let off = (posted_recv % 256) * 16;
            let sge = [b.mr.sge(off, 16)];
            b.qp.post_recv(&[RecvWr {
                wr_id: posted_recv,
                sg_list: &sge,
            }])
            .unwrap();
            posted_recv += 1;
        }
        while sent < N && a.qp.sq_ref().free() > 0 && sent < recv_done + 150 {
            let p = sent.to_le_bytes();
            let parts: [&[u8]; 1] = [&p];
            a.qp.post_send(&[SendWr::send_inline(sent, &parts, SendFlags::SIGNALED)])
                .unwrap();
            sent += 1;
        }
        let k = a.cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            assert_eq!(
                (wc.wr_id, wc.status),
                (send_done, WcStatus::SUCCESS),
                "{wc:?}"
            );
            send_done += 1;
        }
        let m = b.cq.poll(&mut wcs);
        for wc in &wcs[..m] {
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (recv_done, WcStatus::SUCCESS, 8),
                "{wc:?}"
            );
            let off = (recv_done % 256) as usize * 16;
            assert_eq!(
                b.buf.read_u64(off),
                recv_done,
                "payload of message {recv_done}"
            );
            recv_done += 1;
        }
        if k + m == 0 {
            idle += 1;
            assert!(
                idle < 1_000_000,
                "stalled: sent {sent}, completed {send_done}, received {recv_done}"
            );
            rig.emu.step();
        } else {
            idle = 0;
        }
    }
    let c = rig.emu.counters(0);
    let cb = rig.emu.counters(1);
    eprintln!(
        "{N} messages: requester packets {} dropped {} ; responder duplicates {} out-of-sequence {}",
        c.packets_sent,
        c.packets_dropped + cb.packets_dropped,
        cb.duplicate_request,
        cb.out_of_sequence
    );
    assert!(c.packets_sent > N, "retransmissions happened");
}
