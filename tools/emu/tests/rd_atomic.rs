//! The requester never holds more than `max_rd_atomic` READs/atomics outstanding -- an
//! answered one still counts while it waits behind an unanswered one, because the responder
//! keeps replay state for only that many -- and a lost answer is asked for again. The peer
//! is a plain UDP socket that sees every request and answers by hand.

mod common;

use std::collections::BTreeSet;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode, roce_icrc};
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{AtomicSeg, DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

const PEER_QPN: u32 = 0x00_D00D;
const PSN: u32 = 0x100;
const RC_FETCH_ADD: u8 = 0x14;
const RC_ATOMIC_ACK: u8 = 0x12;

/// An atomic acknowledgement of `psn` carrying `orig`, from node `src` to `dst`.
fn atomic_ack(qpn: u32, psn: u32, orig: u64, src: u16, dst: u16) -> Vec<u8> {
    let mut v = vec![RC_ATOMIC_ACK, 0x40, 0xff, 0xff];
    v.extend_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
    v.extend_from_slice(&(psn & 0xff_ffff).to_be_bytes());
    v.extend_from_slice(&1u32.to_be_bytes()); // AETH: ACK, MSN 1
    v.extend_from_slice(&orig.to_be_bytes());
    let icrc = roce_icrc(&v, src, dst).expect("longer than a BTH");
    v.extend_from_slice(&icrc.to_le_bytes());
    v
}

#[test]
fn no_more_than_max_rd_atomic_outstanding_answered_or_not() {
    let (peer, peer_lid) = bind_node(150..=199);
    peer.set_nonblocking(true).unwrap();
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        ..EmuConfig::default()
    });
    let lid = emu.hca_info(0).unwrap().lid;
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(16, 64, -1);
    let mut qp = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    let k = Knobs::default();
    to_init(&a, &qp, ALL_ACCESS);
    a.modify(&rtr_modify(&qp, peer_lid, PEER_QPN, k))
        .expect("RTR");
    let mut m = modify_base(&qp);
    m.qp_state = 3;
    m.attr_mask = M_STATE | M_SQ_PSN | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_MAX_RD;
    m.sq_psn = PSN;
    m.timeout = k.timeout;
    m.retry_cnt = k.retry_cnt;
    m.rnr_retry = k.rnr_retry;
    m.max_rd_atomic = 2;
    a.modify(&m).expect("RTS");
    let local = Buf::new(64 * 8);
    let (_, lkey, _) = a.reg_mr(pd, local.addr(), 64 * 8, ALL_ACCESS).unwrap();
    let mut last = 0;
    for i in 0..6u64 {
        let segs = [
            RaddrSeg::new(0x1000, 0x42).as_bytes(),
            AtomicSeg::new(1, 0).as_bytes(),
            DataSeg::new(8, lkey, local.addr() + i * 8).as_bytes(),
        ]
        .concat();
        last = qp.build_send(SendOpcode::ATOMIC_FA, 0, FM_CE_SE_CQ_UPDATE, [0; 4], &segs);
    }
    qp.ring(&a, last, Ring::Doorbell);
    // The PSNs of the fetch-add requests the peer has seen (retransmissions included).
    let mut seen = BTreeSet::new();
    let collect = |seen: &mut BTreeSet<u32>, steps: usize| {
        let mut buf = [0u8; 256];
        for _ in 0..steps {
            emu.step();
            std::thread::sleep(std::time::Duration::from_micros(200));
            while let Ok((n, _)) = peer.recv_from(&mut buf) {
                assert!(
                    n >= 12 + 28 && buf[0] == RC_FETCH_ADD,
                    "a fetch-add request"
                );
                seen.insert(u32::from_be_bytes(buf[8..12].try_into().unwrap()) & 0xff_ffff);
            }
        }
    };
    collect(&mut seen, 3);
    assert_eq!(seen, [PSN, PSN + 1].into(), "two outstanding, not six");
    // Answer the second only: it is done, but it waits behind the first, so it still holds
    // one of the two slots -- no third request. The answer after an unanswered request is
    // an implied NAK: the first is asked for again.
    peer.send_to(
        &atomic_ack(qp.qpn, PSN + 1, 41, peer_lid, lid),
        node_addr(lid),
    )
    .unwrap();
    seen.clear();
    collect(&mut seen, 3);
    assert_eq!(seen, [PSN].into(), "the first asked again, nothing new");
    assert!(drain(&mut cq).is_empty(), "nothing retires out of order");
    // Answer the first: both retire (in order, with their values), two new ones go out.
    peer.send_to(&atomic_ack(qp.qpn, PSN, 40, peer_lid, lid), node_addr(lid))
        .unwrap();
    seen.clear();
    collect(&mut seen, 3);
    assert_eq!(seen, [PSN + 2, PSN + 3].into());
    let c = drain(&mut cq);
    assert_eq!(
        c.iter()
            .map(|c| (c.opcode, c.wqe_counter))
            .collect::<Vec<_>>(),
        [(0, 0), (0, 1)]
    );
    assert_eq!(local.read(0, 8), 40u64.to_ne_bytes());
    assert_eq!(local.read(8, 8), 41u64.to_ne_bytes());
}
