//! Requests over a device limit are refused before any syscall, with errors that name the
//! attribute, the value and the limit.

mod common;

use common::{PairOpts, Rig, side};
use mlx5::{Cq, CqInit, Error, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, Srq};

fn limit_of(e: &Error) -> (&'static str, u64, u64) {
    match e {
        Error::Limit {
            attr, value, limit, ..
        } => (attr, *value, *limit),
        other => panic!("expected a limit error, got {other:?}"),
    }
}

fn over_limit_creation_is_refused_by_name(rig: &dyn Rig) {
    let s = side(rig, 0, &PairOpts::new(QpType::Rc));
    let dev = s.ctx.device_attr().raw;
    let try_qp = |t: QpType, cap: QpCap| {
        let mut init = QpInitAttr::new(t, &s.cq, &s.cq);
        init.cap = cap;
        Qp::new(&s.pd, &init)
    };
    let base = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };

    // Inline data: the message of the issue.
    let e = try_qp(
        QpType::Rc,
        QpCap {
            max_inline_data: 1100,
            ..base
        },
    )
    .unwrap_err();
    let (attr, value, limit) = limit_of(&e);
    assert_eq!((attr, value), ("max_inline_data", 1100));
    assert!((256..1100).contains(&limit), "limit {limit}");
    assert_eq!(
        e.to_string(),
        format!("max_inline_data 1100 exceeds the device limit {limit} for RC")
    );
    // The limit itself is accepted, and reported back.
    let qp = try_qp(
        QpType::Rc,
        QpCap {
            max_inline_data: limit as u32,
            ..base
        },
    )
    .unwrap();
    assert!(u64::from(qp.cap().max_inline_data) >= limit);
    drop(qp);
    // UD has a larger header (the address vector), so a smaller inline limit.
    let e = try_qp(
        QpType::Ud,
        QpCap {
            max_inline_data: 1100,
            ..base
        },
    )
    .unwrap_err();
    let (_, _, ud_limit) = limit_of(&e);
    assert!(ud_limit < limit);
    assert!(e.to_string().ends_with("for UD"), "{e}");

    let e = try_qp(
        QpType::Rc,
        QpCap {
            max_send_wr: dev.max_qp_wr + 1,
            ..base
        },
    )
    .unwrap_err();
    assert_eq!(
        limit_of(&e),
        (
            "max_send_wr",
            u64::from(dev.max_qp_wr) + 1,
            u64::from(dev.max_qp_wr)
        )
    );
    assert!(e.to_string().contains(&format!(
        "max_send_wr {} exceeds the device limit {}",
        dev.max_qp_wr + 1,
        dev.max_qp_wr
    )));

    let e = try_qp(
        QpType::Uc,
        QpCap {
            max_send_sge: dev.max_sge + 1,
            ..base
        },
    )
    .unwrap_err();
    assert_eq!(limit_of(&e).0, "max_send_sge");
    assert!(e.to_string().contains("for UC"));

    let e = try_qp(
        QpType::Rc,
        QpCap {
            max_recv_sge: dev.max_sge + 1,
            ..base
        },
    )
    .unwrap_err();
    assert_eq!(limit_of(&e).0, "max_recv_sge");

    let e = try_qp(
        QpType::Rc,
        QpCap {
            max_recv_wr: dev.max_qp_wr.saturating_add(1),
            ..base
        },
    )
    .unwrap_err();
    assert_eq!(limit_of(&e).0, "max_recv_wr");

    let e = Cq::new(
        &s.ctx,
        CqInit {
            cqe: dev.max_cqe + 1,
            ..CqInit::default()
        },
        None,
    )
    .unwrap_err();
    let (attr, value, limit) = limit_of(&e);
    assert_eq!((attr, value), ("cqe", u64::from(dev.max_cqe) + 1));
    assert!(limit <= u64::from(dev.max_cqe));
    let e = Cq::new(
        &s.ctx,
        CqInit {
            cqe_size: 96,
            ..CqInit::default()
        },
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                attr: "cqe_size",
                ..
            }
        ),
        "{e:?}"
    );

    let e = Srq::new(&s.pd, dev.max_srq_wr + 1, 1).unwrap_err();
    assert_eq!(limit_of(&e).0, "max_wr");

    // Nothing was created by the refused requests: a normal QP still works.
    let qp = try_qp(QpType::Rc, base).unwrap();
    assert_eq!(qp.state(), QpState::Reset);
}

/// A state transition without a required attribute is refused by name before the syscall.
fn missing_modify_attribute_is_named(rig: &dyn Rig) {
    let mut s = side(rig, 0, &PairOpts::new(QpType::Rc));
    let e =
        s.qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Init),
                ..QpAttr::default()
            },
            1,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QpAttribute {
                attr: "qp_access_flags",
                required: true,
                from: QpState::Reset,
                to: QpState::Init,
                ..
            }
        ),
        "{e:?}"
    );
    s.qp.to_init(1, mlx5::Access::ALL).unwrap();
    let e =
        s.qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                ..QpAttr::default()
            },
            1,
        )
        .unwrap_err();
    assert!(e.to_string().contains("ah_attr"), "{e}");
    let (st, _) = s.qp.query().unwrap();
    assert_eq!(
        st,
        QpState::Init,
        "the refused modify did not reach the kernel"
    );
    let e =
        s.qp.modify(
            &QpAttr {
                port_num: 9,
                ..QpAttr::default()
            },
            1 << 5,
        )
        .unwrap_err();
    assert_eq!(limit_of(&e).0, "port_num");
}

/// The depth a receive queue reports, at creation and through QUERY_QP, is what it accepts.
/// The emulated kernel used to answer QUERY_QP with the depth asked for (3 here) while the
/// ring held 4; mlx5_ib answers the RQ's WQE count, and no send capabilities for a user QP
/// (the driver reports its own, as libmlx5 does).
fn the_reported_receive_depth_is_what_the_queue_holds(rig: &dyn Rig) {
    let s = side(rig, 0, &PairOpts::new(QpType::Rc));
    let mut init = QpInitAttr::new(QpType::Rc, &s.cq, &s.cq);
    init.cap = QpCap {
        max_send_wr: 5,
        max_recv_wr: 3,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp = Qp::new(&s.pd, &init).unwrap();
    let told = qp.cap();
    assert_eq!(told.max_recv_wr, 4, "{told:?}");
    let (_, _, queried) = qp.query_attr().unwrap();
    assert_eq!(queried, told, "QUERY_QP reports the queue as created");
    qp.to_init(1, mlx5::Access::LOCAL_WRITE).unwrap();
    let sge = [s.mr.sge(0, 16)];
    let rq = qp.rq().unwrap();
    for id in 0..u64::from(told.max_recv_wr) {
        rq.push(id, &sge).unwrap();
    }
    assert!(rq.push(99, &sge).is_err(), "one receive past the depth");
    drop(qp);

    // With an SRQ the QP has no receive queue of its own: the kernel reports none.
    let srq = Srq::new(&s.pd, 8, 1).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, &s.cq, &s.cq);
    init.srq = Some(&srq);
    let qp = Qp::new(&s.pd, &init).unwrap();
    let (_, _, queried) = qp.query_attr().unwrap();
    assert_eq!((queried.max_recv_wr, queried.max_recv_sge), (0, 0));
    assert_eq!(queried, qp.cap());
}

scenarios!(
    over_limit_creation_is_refused_by_name,
    missing_modify_attribute_is_named,
    the_reported_receive_depth_is_what_the_queue_holds
);
