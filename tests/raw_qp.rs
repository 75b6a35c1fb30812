//! The driver's RAW_PACKET QP (`src/raw.rs`) on the emulated Ethernet port: frames sent with
//! inline headers and checksum offload arrive through a steering rule with the CQE's packet
//! flags and timestamps; VLAN insertion; batch receive re-posts its slots; bad input is
//! refused by name. The same scenarios run on a real NIC (`#[ignore]`, `MLX5_TEST_DEVICE`).

mod common;

use std::net::Ipv4Addr;

use common::{EmuRig, Rig};
use mlx5::flow::FlowRule;
use mlx5::raw::{
    FramePayload, L3Type, L4Type, MAX_INLINE_HEADERS, RawQp, RawQpInit, RawSendError, RxFrame,
    TxOffload,
};
use mlx5::{Access, Context, Cq, CqInit, DmaBuf, Pd, RawCq, SendFlags};

const SRC_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const DST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const PORT: u16 = 31_337;

/// The port's MAC: the node GUID without its bytes 3 and 4 (docs/raw-ethernet.md).
fn mac_of(ctx: &Context) -> [u8; 6] {
    let g = ctx.device_attr().node_guid;
    [g[0], g[1], g[2], g[5], g[6], g[7]]
}

/// RFC 1071 over `data` (an odd byte padded with zero), folded, not complemented.
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

/// An Ethernet/IPv4/UDP frame with `payload`; checksums zero (for the device to fill) or,
/// with `fill`, computed here.
fn udp_frame(src: [u8; 6], dst: [u8; 6], payload: &[u8], fill: bool) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&SRC_IP.octets());
    ip[16..20].copy_from_slice(&DST_IP.octets());
    if fill {
        let c = !(sum16(&ip, 0) as u16);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
    }
    f.extend_from_slice(&ip);
    let ulen = (8 + payload.len()) as u16;
    let mut udp = [0u8; 8];
    udp[0..2].copy_from_slice(&40_000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&ulen.to_be_bytes());
    if fill {
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&SRC_IP.octets());
        pseudo.extend_from_slice(&DST_IP.octets());
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&ulen.to_be_bytes());
        let acc = sum16(&pseudo, 0);
        let acc = sum16(&udp, acc);
        let c = !(sum16(payload, acc) as u16);
        udp[6..8].copy_from_slice(&if c == 0 { 0xffff } else { c }.to_be_bytes());
    }
    f.extend_from_slice(&udp);
    f.extend_from_slice(payload);
    f
}

/// Both checksums of an Ethernet/IPv4/UDP frame verify (independent of the device's code).
fn checksums_good(f: &[u8]) -> bool {
    let ip = &f[14..34];
    if sum16(ip, 0) != 0xffff {
        return false;
    }
    let udp = &f[34..];
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&ip[12..20]);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(udp.len() as u16).to_be_bytes());
    sum16(udp, sum16(&pseudo, 0)) == 0xffff
}

struct End {
    ctx: Context,
    pd: Pd,
    scq: Cq,
    qp: RawQp,
    rcq: Option<RawCq>,
}

fn end(rig: &dyn Rig, side: usize, rx_frames: u32) -> End {
    let ctx = rig.open(side);
    let pd = Pd::new(&ctx).expect("PD");
    let scq = Cq::new(&ctx, CqInit::default(), None).expect("send CQ");
    let rcq = Cq::new(
        &ctx,
        CqInit {
            cqe: 1024,
            ..CqInit::default()
        },
        None,
    )
    .expect("recv CQ");
    let mut init = RawQpInit::new(&scq, &rcq);
    init.rx_frames = rx_frames;
    init.sq_sig_all = true;
    let mut qp = RawQp::new(&pd, &init).expect("RawQp::new");
    qp.activate(1).expect("activate");
    let rcq = rcq.into_raw().ok();
    End {
        ctx,
        pd,
        scq,
        qp,
        rcq,
    }
}

/// Receive until `n` frames arrived (or the rig gave up), keeping each frame's bytes.
fn recv_n(rig: &dyn Rig, e: &mut End, n: usize) -> Vec<(RxFrame, Vec<u8>)> {
    let mut got = Vec::new();
    let rcq = e.rcq.as_mut().expect("raw CQ");
    for _ in 0..200_000 {
        if got.len() >= n {
            break;
        }
        e.qp.recv_batch(rcq, 16, |f, d| {
            let mut b = vec![0; d.len()];
            d.read(0, &mut b);
            got.push((*f, b));
        })
        .expect("recv_batch");
        rig.progress();
    }
    got
}

fn send_done(rig: &dyn Rig, e: &mut End, n: usize) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut raw = std::mem::replace(
        &mut e.scq,
        Cq::new(&e.ctx, CqInit::default(), None).unwrap(),
    )
    .into_raw()
    .unwrap_or_else(|_| panic!("into_raw"));
    for _ in 0..200_000 {
        if out.len() >= n {
            break;
        }
        for c in raw.by_ref() {
            out.push(e.qp.send_done(&c).expect("send_done"));
        }
        raw.publish_ci();
        rig.progress();
    }
    e.scq = raw.into_verbs();
    out
}

fn pair(rig: &dyn Rig) -> (End, End, mlx5::flow::Flow, [u8; 6], [u8; 6]) {
    let a = end(rig, 0, 64);
    let b = end(rig, 1, 64);
    let (ma, mb) = (mac_of(&a.ctx), mac_of(&b.ctx));
    let rule = FlowRule::new()
        .dst_mac(mb)
        .ipv4_dst(DST_IP)
        .udp_dst_port(PORT);
    let flow = b.qp.attach_flow(&rule).expect("attach_flow");
    (a, b, flow, ma, mb)
}

fn frames_with_offload_arrive_with_their_flags_and_timestamps(rig: &dyn Rig) {
    let (mut a, mut b, _flow, ma, mb) = pair(rig);
    let hl = a.qp.min_inline().max(14);
    let mut sent = Vec::new();
    for i in 0..20u32 {
        let payload: Vec<u8> = (0..(10 + i * 7)).map(|k| (k as u8) ^ (i as u8)).collect();
        let f = udp_frame(ma, mb, &payload, false);
        let off = TxOffload {
            ip_csum: true,
            l4_csum: true,
            vlan: None,
        };
        a.qp.send(
            &f[..hl],
            FramePayload::Inline(&f[hl..]),
            off,
            SendFlags::SIGNALED,
            u64::from(i),
        )
        .expect("send");
        sent.push(payload);
    }
    a.qp.ring();
    let got = recv_n(rig, &mut b, sent.len());
    assert_eq!(got.len(), sent.len(), "every frame arrives");
    let mut last = 0;
    for ((fr, bytes), payload) in got.iter().zip(&sent) {
        assert_eq!(fr.status, mlx5::WcStatus::SUCCESS);
        assert_eq!(fr.len as usize, 42 + payload.len());
        assert_eq!(&bytes[42..], &payload[..], "payload intact");
        assert_eq!(&bytes[0..6], &mb);
        assert_eq!(fr.l3, L3Type::Ipv4);
        assert_eq!(fr.l4, L4Type::Udp);
        assert!(
            fr.l3_ok && fr.l4_ok,
            "device-computed checksums verify: {fr:?}"
        );
        assert!(checksums_good(bytes), "and verify independently");
        assert_eq!(fr.vlan_tci, None);
        assert!(fr.timestamp_ns >= last, "receive timestamps monotonic");
        last = fr.timestamp_ns;
    }
    let done = send_done(rig, &mut a, sent.len());
    assert_eq!(done.len(), sent.len());
    for (i, (id, ts)) in done.iter().enumerate() {
        assert_eq!(*id, i as u64, "send completions in order");
        // One emulated clock for both ports: a frame's send and receive stamps are close.
        assert!(*ts > 0);
        assert!(
            ts.abs_diff(got[i].0.timestamp_ns) < 1_000_000_000,
            "send {ts}, receive {:?}",
            got[i].0
        );
    }
    assert!(last > 0, "the clock ran");
    assert!(
        done.windows(2).all(|w| w[0].1 <= w[1].1),
        "send timestamps monotonic"
    );
}

fn gathered_payload_and_bad_checksums_are_delivered_with_the_bits_clear(rig: &dyn Rig) {
    let (mut a, mut b, _flow, ma, mb) = pair(rig);
    let buf = std::sync::Arc::new(DmaBuf::new(4096).unwrap());
    let mr = a.pd.reg_mr(&buf, Access::LOCAL_WRITE).unwrap();
    // A frame with right checksums computed here, gathered from memory, no offload.
    let good = udp_frame(ma, mb, b"gathered payload of a raw frame", true);
    assert!(checksums_good(&good));
    let mut bad = good.clone();
    bad[24] ^= 0x55; // the IPv4 checksum
    bad[40] ^= 0x01; // and the UDP checksum
    buf.write(0, &good);
    buf.write(1024, &bad);
    let hl = a.qp.min_inline();
    for (i, off) in [0u64, 1024].into_iter().enumerate() {
        let sge = mr.sge(off + hl as u64, (good.len() - hl) as u32);
        let hdr = if off == 0 { &good[..hl] } else { &bad[..hl] };
        a.qp.send(
            hdr,
            FramePayload::Gather(&[sge]),
            TxOffload::default(),
            SendFlags::SIGNALED,
            i as u64,
        )
        .expect("send");
    }
    a.qp.ring();
    let got = recv_n(rig, &mut b, 2);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1, good);
    assert!(got[0].0.l3_ok && got[0].0.l4_ok);
    assert_eq!(
        got[1].1, bad,
        "a frame with bad checksums is delivered, not dropped"
    );
    assert!(!got[1].0.l3_ok && !got[1].0.l4_ok, "{:?}", got[1].0);
}

fn vlan_insertion_puts_the_tag_after_the_macs(rig: &dyn Rig) {
    let a = end(rig, 0, 0);
    let mut b = end(rig, 1, 16);
    let (ma, mb) = (mac_of(&a.ctx), mac_of(&b.ctx));
    let mut a = a;
    let _flow =
        b.qp.attach_flow(&FlowRule::new().dst_mac(mb).vlan(0x123).expect("vlan"))
            .expect("attach_flow");
    let f = udp_frame(ma, mb, b"tagged", true);
    let off = TxOffload {
        vlan: Some(0x2123), // PCP 1, VID 0x123
        ..TxOffload::default()
    };
    // Tag inserted by the device (no header inline) and by the driver (headers inline).
    let hl = a.qp.min_inline();
    let hdr_sw = &f[..14];
    if hl == 0 {
        a.qp.send(&[], FramePayload::Inline(&f), off, SendFlags::SIGNALED, 1)
            .unwrap();
    }
    a.qp.send(
        hdr_sw,
        FramePayload::Inline(&f[14..]),
        off,
        SendFlags::SIGNALED,
        2,
    )
    .unwrap();
    a.qp.ring();
    let want = if hl == 0 { 2 } else { 1 };
    let got = recv_n(rig, &mut b, want);
    assert_eq!(got.len(), want);
    for (fr, bytes) in &got {
        let mut tagged = f.clone();
        tagged.splice(12..12, [0x81, 0x00, 0x21, 0x23]);
        assert_eq!(bytes, &tagged, "the tag follows the MACs");
        assert_eq!(fr.len as usize, f.len() + 4);
        assert_eq!(fr.vlan_tci, None, "not stripped");
    }
}

fn batch_receive_reposts_every_slot(rig: &dyn Rig) {
    let (mut a, mut b, _flow, ma, mb) = pair(rig);
    let hl = a.qp.min_inline();
    // Three times the 64 slots: only re-posted slots can take the later frames.
    let total = 192u32;
    let mut got = 0usize;
    let mut seqs = Vec::new();
    for i in 0..total {
        let f = udp_frame(ma, mb, &i.to_be_bytes(), false);
        let off = TxOffload {
            ip_csum: true,
            l4_csum: true,
            vlan: None,
        };
        loop {
            match a.qp.send(
                &f[..hl],
                FramePayload::Inline(&f[hl..]),
                off,
                SendFlags::NONE,
                0,
            ) {
                Ok(()) => break,
                Err(RawSendError::Post(mlx5::PostError::Full { .. })) => {
                    a.qp.ring();
                    let _ = send_done(rig, &mut a, 1);
                }
                Err(e) => panic!("{e}"),
            }
        }
        if i % 32 == 31 {
            a.qp.ring();
            let r = recv_n(rig, &mut b, 32);
            got += r.len();
            for (_, bytes) in r {
                seqs.push(u32::from_be_bytes(bytes[42..46].try_into().unwrap()));
            }
        }
    }
    assert_eq!(got, total as usize);
    assert_eq!(seqs, (0..total).collect::<Vec<_>>(), "in order, none lost");
    assert_eq!(
        b.qp.qp().rq().unwrap().outstanding(),
        64,
        "every slot posted again"
    );
}

fn bad_frames_are_refused_by_name(rig: &dyn Rig) {
    let mut a = end(rig, 0, 0);
    let long = [0u8; MAX_INLINE_HEADERS + 1];
    let e =
        a.qp.send(
            &long,
            FramePayload::Inline(&[]),
            TxOffload::default(),
            SendFlags::NONE,
            0,
        )
        .unwrap_err();
    assert_eq!(
        e,
        RawSendError::HeadersTooLong {
            len: MAX_INLINE_HEADERS + 1,
            max: MAX_INLINE_HEADERS
        }
    );
    assert!(e.to_string().contains("exceed"));
    let vlan = TxOffload {
        vlan: Some(1),
        ..TxOffload::default()
    };
    if a.qp.min_inline() == 0 {
        let e =
            a.qp.send(
                &[0; 8],
                FramePayload::Inline(&[0; 60]),
                vlan,
                SendFlags::NONE,
                0,
            )
            .unwrap_err();
        assert_eq!(e, RawSendError::VlanWithoutMacs { len: 8 });
    }
    let e =
        a.qp.send(
            &[0; 16],
            FramePayload::Inline(&[0; 60]),
            vlan,
            SendFlags::NONE,
            0,
        )
        .unwrap_err();
    assert!(
        matches!(e, RawSendError::HeadersTooLong { len: 20, .. }),
        "{e:?}"
    );
    let big = vec![0u8; 4096];
    let e =
        a.qp.send(
            &[0; 18][..a.qp.min_inline()],
            FramePayload::Inline(&big),
            TxOffload::default(),
            SendFlags::NONE,
            0,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            RawSendError::Post(mlx5::PostError::InlineTooLarge { .. })
        ),
        "{e:?}"
    );
    // Nothing was written: the queue is empty.
    assert_eq!(a.qp.qp().sq_ref().outstanding(), 0);
}

/// A frame that found no receive posted waits in the port's buffer and is delivered once
/// the receive is posted, without any doorbell (posting a receive writes only the doorbell
/// record): 4 slots, 5 frames per round, the 5th taken after the batch re-posts the slots.
/// Prints the time from the re-post to the held frame's arrival (the device's look at the
/// receive doorbell record; before it polled while frames were held: its 10 ms clock tick).
/// Emulator only: a NIC without flow control drops such a frame (`out_of_buffer`).
fn a_held_frame_follows_the_posted_receive(rig: &dyn Rig) {
    let mut a = end(rig, 0, 0);
    let mut b = end(rig, 1, 4);
    let (ma, mb) = (mac_of(&a.ctx), mac_of(&b.ctx));
    let _flow =
        b.qp.attach_flow(&FlowRule::new().dst_mac(mb).udp_dst_port(PORT))
            .expect("attach_flow");
    let hl = a.qp.min_inline();
    let rounds = 20u32;
    let mut waits = Vec::new();
    let mut seen = Vec::new();
    for r in 0..rounds {
        for i in 0..5u32 {
            let f = udp_frame(ma, mb, &(r * 5 + i).to_be_bytes(), false);
            a.qp.send(
                &f[..hl],
                FramePayload::Inline(&f[hl..]),
                TxOffload::default(),
                SendFlags::SIGNALED,
                u64::from(i),
            )
            .expect("send");
        }
        a.qp.ring();
        // All five left A: four are in B's slots, the fifth waits for one.
        assert_eq!(send_done(rig, &mut a, 5).len(), 5);
        let first = recv_n(rig, &mut b, 4);
        assert_eq!(first.len(), 4, "round {r}: the four slots");
        let t = std::time::Instant::now();
        let fifth = recv_n(rig, &mut b, 1);
        waits.push(t.elapsed());
        assert_eq!(fifth.len(), 1, "round {r}: the held frame");
        seen.extend(
            first
                .iter()
                .chain(&fifth)
                .map(|(_, d)| u32::from_be_bytes(d[42..46].try_into().expect("sequence"))),
        );
    }
    assert_eq!(
        seen,
        (0..rounds * 5).collect::<Vec<_>>(),
        "every frame, in order"
    );
    waits.sort();
    eprintln!(
        "held frame after the re-post: p50 {:?}, max {:?} ({rounds} rounds)",
        waits[waits.len() / 2],
        waits[waits.len() - 1]
    );
}

/// The emulator's Ethernet port (stepped), and the `#[ignore]`d real-NIC twins.
mod on_emulator {
    #[test]
    fn frames_with_offload_arrive_with_their_flags_and_timestamps() {
        // Threaded: the device clock is real time (stepped, it stands still).
        let rig = super::EmuRig::with(mlx5_emu::EmuConfig {
            num_hcas: 2,
            mode: mlx5_emu::RunMode::Threaded,
            link_layer: mlx5_emu::LinkLayer::Ethernet,
            ..mlx5_emu::EmuConfig::default()
        });
        super::frames_with_offload_arrive_with_their_flags_and_timestamps(&rig);
    }
    #[test]
    fn gathered_payload_and_bad_checksums_are_delivered_with_the_bits_clear() {
        super::gathered_payload_and_bad_checksums_are_delivered_with_the_bits_clear(
            &super::EmuRig::roce(),
        );
    }
    #[test]
    fn vlan_insertion_puts_the_tag_after_the_macs() {
        super::vlan_insertion_puts_the_tag_after_the_macs(&super::EmuRig::roce());
    }
    #[test]
    fn batch_receive_reposts_every_slot() {
        super::batch_receive_reposts_every_slot(&super::EmuRig::roce());
    }
    #[test]
    fn bad_frames_are_refused_by_name() {
        super::bad_frames_are_refused_by_name(&super::EmuRig::roce());
    }
    #[test]
    fn a_held_frame_follows_the_posted_receive() {
        // Threaded: the device thread must notice the posted receive by itself.
        let rig = super::EmuRig::with(mlx5_emu::EmuConfig {
            num_hcas: 2,
            mode: mlx5_emu::RunMode::Threaded,
            link_layer: mlx5_emu::LinkLayer::Ethernet,
            ..mlx5_emu::EmuConfig::default()
        });
        super::a_held_frame_follows_the_posted_receive(&rig);
    }
}

mod on_hardware {
    #[test]
    #[ignore = "needs a ConnectX with an Ethernet port: set MLX5_TEST_DEVICE=mlx5_0"]
    fn frames_with_offload_arrive_with_their_flags_and_timestamps() {
        match super::common::HwRig::from_env() {
            Some(rig) => super::frames_with_offload_arrive_with_their_flags_and_timestamps(&rig),
            None => eprintln!("MLX5_TEST_DEVICE not set; nothing to run"),
        }
    }
    #[test]
    #[ignore = "needs a ConnectX with an Ethernet port: set MLX5_TEST_DEVICE=mlx5_0"]
    fn gathered_payload_and_bad_checksums_are_delivered_with_the_bits_clear() {
        match super::common::HwRig::from_env() {
            Some(rig) => {
                super::gathered_payload_and_bad_checksums_are_delivered_with_the_bits_clear(&rig)
            }
            None => eprintln!("MLX5_TEST_DEVICE not set; nothing to run"),
        }
    }
    #[test]
    #[ignore = "needs a ConnectX with an Ethernet port: set MLX5_TEST_DEVICE=mlx5_0"]
    fn vlan_insertion_puts_the_tag_after_the_macs() {
        match super::common::HwRig::from_env() {
            Some(rig) => super::vlan_insertion_puts_the_tag_after_the_macs(&rig),
            None => eprintln!("MLX5_TEST_DEVICE not set; nothing to run"),
        }
    }
    #[test]
    #[ignore = "needs a ConnectX with an Ethernet port: set MLX5_TEST_DEVICE=mlx5_0"]
    fn batch_receive_reposts_every_slot() {
        match super::common::HwRig::from_env() {
            Some(rig) => super::batch_receive_reposts_every_slot(&rig),
            None => eprintln!("MLX5_TEST_DEVICE not set; nothing to run"),
        }
    }
    #[test]
    #[ignore = "needs a ConnectX with an Ethernet port: set MLX5_TEST_DEVICE=mlx5_0"]
    fn bad_frames_are_refused_by_name() {
        match super::common::HwRig::from_env() {
            Some(rig) => super::bad_frames_are_refused_by_name(&rig),
            None => eprintln!("MLX5_TEST_DEVICE not set; nothing to run"),
        }
    }
}

/// Clear `cap` from this thread's effective set (capget/capset, version 3).
fn drop_effective(cap: u32) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: the header and the two data structs are the layout capget/capset take for
    // version 3; both outlive the calls.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    assert_eq!(r, 0, "capget");
    d[(cap / 32) as usize].effective &= !(1 << (cap % 32));
    // SAFETY: as above.
    let r = unsafe { libc::syscall(libc::SYS_capset, &h, d.as_ptr()) };
    assert_eq!(r, 0, "capset");
}

#[test]
fn without_cap_net_raw_creation_is_refused_by_name() {
    let rig = EmuRig::roce();
    std::thread::scope(|s| {
        s.spawn(|| {
            drop_effective(13);
            assert!(!mlx5::qp::has_cap_net_raw());
            let ctx = rig.open(0);
            let pd = Pd::new(&ctx).unwrap();
            let cq = Cq::new(&ctx, CqInit::default(), None).unwrap();
            match RawQp::new(&pd, &RawQpInit::new(&cq, &cq)) {
                Err(e @ mlx5::Error::Os { errno, .. }) => {
                    assert_eq!(errno, nix::errno::Errno::EPERM);
                    assert!(e.to_string().contains("CAP_NET_RAW"), "{e}");
                }
                other => panic!("expected EPERM naming CAP_NET_RAW, got {other:?}"),
            }
        });
    });
}
