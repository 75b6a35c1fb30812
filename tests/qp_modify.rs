//! The QP state machine in the driver: `Qp::modify` refuses, by name and before the syscall, a
//! transition the verbs state machine lacks and an attribute missing from or foreign to a
//! transition (the kernel's required/optional masks, per QP type); the MTU is typed; the RC
//! knobs go through `ConnectParams` and reach the kernel (QUERY_QP reads them back).
//!
//! On the old code every refusal below except the missing-attribute ones came back from the
//! kernel as a bare `uverbs command MODIFY_QP failed: EINVAL`, and the missing-attribute ones
//! did not name the transition.

use mlx5::ffi::uverbs::*;
use mlx5::{
    Access, ConnectParams, Context, Cq, CqInit, Error, Mtu, Pd, Qp, QpAttr, QpInitAttr, QpState,
    QpType, RemoteQp,
};
use mlx5_emu::{EmuConfig, Emulator, RunMode};

struct Rig {
    _emu: Emulator,
    ctx: Context,
    pd: Pd,
    cq: Cq,
}

fn rig() -> Rig {
    let emu = Emulator::new(EmuConfig {
        num_hcas: 1,
        mode: RunMode::Stepped,
        ..EmuConfig::default()
    });
    let ctx = Context::open(emu.open(0).expect("emulator open")).expect("Context::open");
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, CqInit::default(), None).unwrap();
    Rig {
        _emu: emu,
        ctx,
        pd,
        cq,
    }
}

impl Rig {
    fn qp(&self, t: QpType) -> Qp {
        Qp::new(&self.pd, &QpInitAttr::new(t, &self.cq, &self.cq)).unwrap()
    }

    /// The QP's own address (loopback connection).
    fn me(&self, qp: &Qp) -> RemoteQp {
        RemoteQp {
            qpn: qp.qpn(),
            psn: 0,
            lid: self.ctx.query_port(1).unwrap().lid,
            gid: None,
        }
    }

    /// A QP of type `t` brought to `st` through the convenience calls.
    fn qp_in(&self, t: QpType, st: QpState) -> Qp {
        let mut qp = self.qp(t);
        let me = self.me(&qp);
        if rank(st) >= 1 {
            qp.to_init_with(1, Access::ALL, 0x1111, &Default::default())
                .unwrap();
        }
        if rank(st) >= 2 {
            qp.to_rtr(&me, Mtu::M1024, 0).unwrap();
        }
        if rank(st) >= 3 {
            qp.to_rts(0, 7).unwrap();
        }
        assert_eq!(qp.state(), st);
        qp
    }
}

/// The rank of a state on the path RESET -> INIT -> RTR -> RTS.
fn rank(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        _ => 3,
    }
}

/// Every attribute a transition may need, with a valid value.
fn full_attr(qp: &Qp, to: QpState) -> QpAttr {
    QpAttr {
        qp_state: Some(to),
        path_mtu: Some(Mtu::M1024),
        qkey: 0x1111,
        dest_qp_num: qp.qpn(),
        qp_access_flags: Access::ALL,
        port_num: 1,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        ..QpAttr::default()
    }
}

/// The state the kernel has (the refusals must not have reached it).
fn kernel_state(qp: &Qp) -> QpState {
    qp.query().unwrap().0
}

#[test]
fn forbidden_transitions_are_named() {
    let r = rig();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        // RESET -> RTR without INIT (the finding), RESET -> RTS, INIT -> RTS, RTR -> RTR.
        for (from, to) in [
            (QpState::Reset, QpState::Rtr),
            (QpState::Reset, QpState::Rts),
            (QpState::Init, QpState::Rts),
            (QpState::Rtr, QpState::Init),
            (QpState::Rts, QpState::Rtr),
        ] {
            let mut qp = r.qp_in(t, from);
            let e = qp.modify(&full_attr(&qp, to), IB_QP_STATE).unwrap_err();
            assert_eq!(
                e,
                Error::QpTransition {
                    qp_type: t,
                    from,
                    to
                },
                "{t} {from} -> {to}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{t} QP {from} -> {to}")),
                "message names the transition: {msg}"
            );
            assert_eq!(kernel_state(&qp), from, "refused before the syscall");
            assert_eq!(qp.state(), from);
        }
        // The convenience call on a QP still in RESET says the same.
        let mut qp = r.qp(t);
        let me = r.me(&qp);
        assert!(matches!(
            qp.to_rtr(&me, Mtu::M1024, 0),
            Err(Error::QpTransition {
                from: QpState::Reset,
                to: QpState::Rtr,
                ..
            })
        ));
        // Attribute-only modify of RTR (RTR -> RTR) does not exist either.
        let mut qp = r.qp_in(t, QpState::Rtr);
        let e = qp
            .modify(&full_attr(&qp, QpState::Rtr), IB_QP_PKEY_INDEX)
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::QpTransition {
                    from: QpState::Rtr,
                    to: QpState::Rtr,
                    ..
                }
            ),
            "{e}"
        );
    }
}

/// Every required bit of each step of RESET -> INIT -> RTR -> RTS, dropped, is named as
/// missing; every bit the step does not take, added, is named as not allowed; the exact
/// required mask then succeeds. For RC, UC and UD.
#[test]
fn missing_and_extra_attributes_are_named_per_qp_type() {
    let r = rig();
    let all_bits: Vec<u32> = (1..=20)
        .map(|b| 1u32 << b)
        .filter(|&b| b != IB_QP_CAP)
        .collect();
    // (type, from, to, required, optional) as the verbs state machine has them.
    let pkey_port = IB_QP_PKEY_INDEX | IB_QP_PORT;
    let path = IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN;
    let steps = [
        (
            QpType::Rc,
            QpState::Reset,
            QpState::Init,
            pkey_port | IB_QP_ACCESS_FLAGS,
            0,
        ),
        (
            QpType::Uc,
            QpState::Reset,
            QpState::Init,
            pkey_port | IB_QP_ACCESS_FLAGS,
            0,
        ),
        (
            QpType::Ud,
            QpState::Reset,
            QpState::Init,
            pkey_port | IB_QP_QKEY,
            0,
        ),
        (
            QpType::Rc,
            QpState::Init,
            QpState::Rtr,
            path | IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER,
            IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
        ),
        (
            QpType::Uc,
            QpState::Init,
            QpState::Rtr,
            path,
            IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
        ),
        (
            QpType::Ud,
            QpState::Init,
            QpState::Rtr,
            0,
            IB_QP_PKEY_INDEX | IB_QP_QKEY,
        ),
        (
            QpType::Rc,
            QpState::Rtr,
            QpState::Rts,
            IB_QP_SQ_PSN
                | IB_QP_TIMEOUT
                | IB_QP_RETRY_CNT
                | IB_QP_RNR_RETRY
                | IB_QP_MAX_QP_RD_ATOMIC,
            IB_QP_CUR_STATE
                | IB_QP_ALT_PATH
                | IB_QP_ACCESS_FLAGS
                | IB_QP_MIN_RNR_TIMER
                | IB_QP_PATH_MIG_STATE,
        ),
        (
            QpType::Uc,
            QpState::Rtr,
            QpState::Rts,
            IB_QP_SQ_PSN,
            IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PATH_MIG_STATE,
        ),
        (
            QpType::Ud,
            QpState::Rtr,
            QpState::Rts,
            IB_QP_SQ_PSN,
            IB_QP_CUR_STATE | IB_QP_QKEY,
        ),
    ];
    for (t, from, to, req, opt) in steps {
        let mut qp = r.qp_in(t, from);
        let attr = full_attr(&qp, to);
        let ctx = format!("{t} {from} -> {to}");
        for &bit in &all_bits {
            let e = if req & bit != 0 {
                qp.modify(&attr, (IB_QP_STATE | req) & !bit).unwrap_err()
            } else if opt & bit == 0 {
                qp.modify(&attr, IB_QP_STATE | req | bit).unwrap_err()
            } else {
                continue;
            };
            match &e {
                Error::QpAttribute {
                    qp_type,
                    from: f,
                    to: tt,
                    attr,
                    required,
                } => {
                    assert_eq!((*qp_type, *f, *tt), (t, from, to), "{ctx}: {e}");
                    assert_eq!(*required, req & bit != 0, "{ctx} bit {bit:#x}: {e}");
                    let msg = e.to_string();
                    assert!(
                        msg.contains(attr) && msg.contains(&format!("{t} QP {from} -> {to}")),
                        "{msg}"
                    );
                }
                other => panic!("{ctx} bit {bit:#x}: expected QpAttribute, got {other:?}"),
            }
            assert_eq!(kernel_state(&qp), from, "{ctx}: refused before the syscall");
        }
        // Optional attributes the driver cannot express are refused as unsupported.
        for bit in [IB_QP_ALT_PATH, IB_QP_PATH_MIG_STATE, IB_QP_CUR_STATE] {
            if opt & bit != 0 {
                let e = qp.modify(&attr, IB_QP_STATE | req | bit).unwrap_err();
                assert!(
                    matches!(e, Error::Unsupported { .. }),
                    "{ctx} {bit:#x}: {e:?}"
                );
            }
        }
        qp.modify(&attr, IB_QP_STATE | req)
            .unwrap_or_else(|e| panic!("{ctx} with the required mask: {e}"));
        assert_eq!(kernel_state(&qp), to);
    }
}

#[test]
fn the_mtu_is_typed() {
    let r = rig();
    for (m, bytes, code) in [
        (Mtu::M256, 256, 1),
        (Mtu::M512, 512, 2),
        (Mtu::M1024, 1024, 3),
        (Mtu::M2048, 2048, 4),
        (Mtu::M4096, 4096, 5),
    ] {
        assert_eq!((m.bytes(), m.code()), (bytes, code));
        assert_eq!(Mtu::from_bytes(bytes), Some(m));
        assert_eq!(Mtu::from_code(code), Some(m));
        assert_eq!(Mtu::try_from(code), Ok(m));
    }
    for bad in [0u8, 6, 255] {
        assert_eq!(Mtu::try_from(bad), Err(bad));
    }
    assert_eq!(Mtu::from_bytes(1500), None);
    for t in [QpType::Rc, QpType::Uc] {
        let mut qp = r.qp_in(t, QpState::Init);
        let me = r.me(&qp);
        // The finding: a byte count cast to the code's type is 0.
        #[allow(clippy::cast_possible_truncation)]
        for bad in [4096u16 as u8, 0, 6] {
            let e = qp.to_rtr(&me, bad, 0).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidArgument {
                        attr: "path_mtu",
                        ..
                    }
                ),
                "{t} mtu code {bad}: {e:?}"
            );
        }
        let mut a = full_attr(&qp, QpState::Rtr);
        a.path_mtu = None;
        let mask = IB_QP_STATE | IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN;
        let mask = mask
            | if t == QpType::Rc {
                IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER
            } else {
                0
            };
        let e = qp.modify(&a, mask).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    attr: "path_mtu",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(kernel_state(&qp), QpState::Init);
        // The raw code still works for existing callers, and the typed value reaches the kernel.
        qp.to_rtr(&me, 5u8, 0).unwrap();
        assert_eq!(qp.query_attr().unwrap().1.path_mtu, Some(Mtu::M4096));
    }
}

/// Every knob of `ConnectParams` reaches the kernel, read back with QUERY_QP.
#[test]
fn connect_params_reach_the_kernel() {
    let r = rig();
    let mut qp = r.qp(QpType::Rc);
    let gid = r.ctx.query_gid(1, 0).unwrap();
    let me = RemoteQp {
        gid: Some(gid),
        ..r.me(&qp)
    };
    let p = ConnectParams::new()
        .pkey_index(0)
        .mtu(Mtu::M2048)
        .sl(3)
        .sgid_index(0)
        .hop_limit(7)
        .traffic_class(0x28)
        .flow_label(0x1_2345)
        .max_dest_rd_atomic(2)
        .min_rnr_timer(5)
        .timeout(18)
        .retry_cnt(3)
        .rnr_retry(4)
        .max_rd_atomic(1);
    qp.to_init_with(1, Access::ALL, 0, &p).unwrap();
    qp.to_rtr_with(&me, &p).unwrap();
    qp.to_rts_with(0x42, &p).unwrap();
    let (st, a, _) = qp.query_attr().unwrap();
    assert_eq!(st, QpState::Rts);
    assert_eq!(a.path_mtu, Some(Mtu::M2048));
    assert_eq!(a.ah_attr.sl, 3);
    let g = a.ah_attr.grh.expect("GRH");
    assert_eq!(
        (
            g.dgid,
            g.sgid_index,
            g.hop_limit,
            g.traffic_class,
            g.flow_label
        ),
        (gid, 0, 7, 0x28, 0x1_2345)
    );
    assert_eq!((a.max_dest_rd_atomic, a.min_rnr_timer), (2, 5));
    assert_eq!(
        (
            a.timeout,
            a.retry_cnt,
            a.rnr_retry,
            a.max_rd_atomic,
            a.sq_psn
        ),
        (18, 3, 4, 1, 0x42)
    );
    assert_eq!(a.pkey_index, 0);

    // The documented defaults are what the convenience calls send.
    let mut qp = r.qp(QpType::Rc);
    let me = r.me(&qp);
    qp.to_init(1, Access::ALL).unwrap();
    qp.to_rtr(&me, Mtu::M1024, 0).unwrap();
    qp.to_rts(0, 6).unwrap();
    let (_, a, _) = qp.query_attr().unwrap();
    let d = ConnectParams::default();
    assert_eq!(d, ConnectParams::new());
    assert_eq!(
        (
            a.path_mtu,
            a.min_rnr_timer,
            a.timeout,
            a.retry_cnt,
            a.rnr_retry
        ),
        (Some(Mtu::M1024), 12, 14, 7, 6)
    );
    assert!(a.ah_attr.grh.is_none());
}

/// Knobs outside their IB encoding are refused by name before the syscall.
#[test]
fn connect_params_out_of_range_are_named() {
    let r = rig();
    let limit = |e: Error| match e {
        Error::Limit { attr, value, .. } => (attr, value),
        other => panic!("expected Limit, got {other:?}"),
    };
    let mut qp = r.qp_in(QpType::Rc, QpState::Init);
    let me = r.me(&qp);
    let e = qp
        .to_rtr_with(&me, &ConnectParams::new().sl(16))
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { attr: "sl", .. }),
        "{e:?}"
    );
    let e = qp
        .to_rtr_with(&me, &ConnectParams::new().flow_label(1 << 20))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                attr: "flow_label",
                ..
            }
        ),
        "{e:?}"
    );
    let e = qp
        .to_rtr_with(&me, &ConnectParams::new().min_rnr_timer(32))
        .unwrap_err();
    assert_eq!(limit(e), ("min_rnr_timer", 32));
    let e = qp
        .to_rtr_with(&me, &ConnectParams::new().max_dest_rd_atomic(255))
        .unwrap_err();
    assert_eq!(limit(e), ("max_dest_rd_atomic", 255));
    assert_eq!(kernel_state(&qp), QpState::Init);
    qp.to_rtr_with(&me, &ConnectParams::new()).unwrap();
    for (p, name, v) in [
        (ConnectParams::new().timeout(32), "timeout", 32),
        (ConnectParams::new().retry_cnt(8), "retry_cnt", 8),
        (ConnectParams::new().rnr_retry(8), "rnr_retry", 8),
        (
            ConnectParams::new().max_rd_atomic(255),
            "max_rd_atomic",
            255,
        ),
    ] {
        let e = qp.to_rts_with(0, &p).unwrap_err();
        assert_eq!(limit(e), (name, v));
    }
    let e = qp.to_rts_with(1 << 24, &ConnectParams::new()).unwrap_err();
    assert_eq!(limit(e), ("sq_psn", 1 << 24));
    assert_eq!(kernel_state(&qp), QpState::Rtr);
    qp.to_rts_with(0, &ConnectParams::new()).unwrap();
    assert_eq!(kernel_state(&qp), QpState::Rts);
}

/// Random walks over the state machine: random target states and random attribute masks,
/// with valid values. Whatever the driver accepts the kernel must accept too (the driver's
/// table is never looser than the kernel's: no bare EINVAL), whatever the driver refuses is
/// refused by name and leaves the kernel's state as it was, and an accepted modify moves the
/// kernel to the asked state.
#[test]
fn random_walks_agree_with_the_kernel() {
    let r = rig();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let states = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Err,
    ];
    let (mut accepted, mut refused) = (0u32, 0u32);
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let mut qp = r.qp(t);
        for step in 0..3000 {
            let from = qp.state();
            let to = states[(next() % states.len() as u64) as usize];
            // Mostly masks near what transitions need, sometimes anything.
            let bits = next() as u32 & 0x1F_FFFE & !IB_QP_CAP;
            let mask = match next() % 4 {
                0 => IB_QP_STATE | bits,
                1 => IB_QP_STATE | (bits & next() as u32),
                2 => bits & next() as u32 & next() as u32,
                _ => IB_QP_STATE,
            };
            let mut attr = full_attr(&qp, to);
            if mask & IB_QP_STATE == 0 {
                attr.qp_state = None;
            }
            let want = if mask & IB_QP_STATE != 0 { to } else { from };
            match qp.modify(&attr, mask) {
                Ok(()) => {
                    accepted += 1;
                    assert_eq!(
                        kernel_state(&qp),
                        want,
                        "{t} step {step}: {from} -> {to} mask {mask:#x}"
                    );
                }
                Err(
                    e @ (Error::QpTransition { .. }
                    | Error::QpAttribute { .. }
                    | Error::Unsupported { .. }),
                ) => {
                    refused += 1;
                    assert_eq!(kernel_state(&qp), from, "{t} step {step}: {e}");
                }
                Err(e) => panic!("{t} step {step}: {from} -> {want} mask {mask:#x}: {e:?}"),
            }
        }
    }
    eprintln!("{accepted} accepted, {refused} refused");
    // Both outcomes were exercised.
    assert!(
        accepted > 300 && refused > 300,
        "{accepted} accepted, {refused} refused"
    );
}
