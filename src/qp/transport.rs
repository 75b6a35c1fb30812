//! The XRC initiator's and the DCI's rows of the verbs state machine (the typed objects of
//! `src/xrc.rs` and `src/dc.rs` create these QPs through [`Qp::create`](super::Qp)).

use mlx5_ffi::uverbs::{
    IB_QP_ACCESS_FLAGS, IB_QP_ALT_PATH, IB_QP_AV, IB_QP_CUR_STATE, IB_QP_DEST_QPN,
    IB_QP_EN_SQD_ASYNC_NOTIFY, IB_QP_MAX_QP_RD_ATOMIC, IB_QP_PATH_MIG_STATE, IB_QP_PATH_MTU,
    IB_QP_PKEY_INDEX, IB_QP_PORT, IB_QP_RETRY_CNT, IB_QP_RNR_RETRY, IB_QP_RQ_PSN, IB_QP_SQ_PSN,
    IB_QP_TIMEOUT,
};

use crate::types::{QpState, QpType};

/// The rows of the verbs state machine for the XRC initiator (`ib_modify_qp_is_ok`'s
/// XRC_INI column) and the DCI (which mlx5_ib does not check: these are the attributes
/// libmlx5's users send, `mlx5dv_create_qp(3)`), as (required, optional) masks.
pub(crate) fn initiator_transition(t: QpType, from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    let dci = t == QpType::Dci;
    let rts_req =
        IB_QP_SQ_PSN | IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY | IB_QP_MAX_QP_RD_ATOMIC;
    let retune = if dci {
        0
    } else {
        IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS | IB_QP_ALT_PATH | IB_QP_PATH_MIG_STATE
    };
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) if dci => (IB_QP_PKEY_INDEX | IB_QP_PORT, IB_QP_ACCESS_FLAGS),
        (Reset, Init) => (IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS, 0),
        (Init, Init) => (0, IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS),
        (Init, Rtr) if dci => (
            IB_QP_PATH_MTU,
            IB_QP_AV | IB_QP_PKEY_INDEX | IB_QP_ACCESS_FLAGS,
        ),
        (Init, Rtr) => (
            IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN,
            IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
        ),
        (Rtr, Rts) => (rts_req, retune),
        (Rts, Rts) | (Sqd, Rts) => (0, retune),
        (Rts, Sqd) => (0, IB_QP_EN_SQD_ASYNC_NOTIFY),
        _ => return None,
    })
}
