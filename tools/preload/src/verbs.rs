//! Names of the uverbs commands and methods, for the trace (`MLX5_EMU_TRACE=1`).
//!
//! The same verb has a different number on each path (a `write()` command number, the
//! `INVOKE_WRITE` tunnel carrying that number, or an ioctl object/method pair), so the trace
//! prints one name for all three: "CREATE_QP" whether libibverbs used `write`, the tunnel
//! or `UVERBS_OBJECT_QP`/`UVERBS_METHOD_QP_CREATE`.

use mlx5_ffi::ioctl::{
    UVERBS_METHOD_ASYNC_EVENT_ALLOC, UVERBS_METHOD_CQ_CREATE, UVERBS_METHOD_CQ_DESTROY,
    UVERBS_METHOD_GET_CONTEXT, UVERBS_METHOD_INFO_HANDLES, UVERBS_METHOD_INVOKE_WRITE,
    UVERBS_METHOD_MR_DESTROY, UVERBS_METHOD_PD_DESTROY, UVERBS_METHOD_QP_CREATE,
    UVERBS_METHOD_QP_DESTROY, UVERBS_METHOD_QUERY_CONTEXT, UVERBS_METHOD_QUERY_GID_ENTRY,
    UVERBS_METHOD_QUERY_GID_TABLE, UVERBS_METHOD_QUERY_PORT, UVERBS_OBJECT_ASYNC_EVENT,
    UVERBS_OBJECT_CQ, UVERBS_OBJECT_DEVICE, UVERBS_OBJECT_MR, UVERBS_OBJECT_PD, UVERBS_OBJECT_QP,
};
use mlx5_ffi::mlx5::{
    MLX5_IB_METHOD_DEVX_OTHER, MLX5_IB_METHOD_UAR_OBJ_ALLOC, MLX5_IB_METHOD_UAR_OBJ_DESTROY,
    MLX5_IB_OBJECT_DEVX, MLX5_IB_OBJECT_UAR,
};
use mlx5_ffi::uverbs::IB_USER_VERBS_CMD_FLAG_EXTENDED;

/// Legacy command names, indexed by command number (`ib_user_verbs.h`).
const WRITE_NAMES: [&str; 41] = [
    "GET_CONTEXT",
    "QUERY_DEVICE",
    "QUERY_PORT",
    "ALLOC_PD",
    "DEALLOC_PD",
    "CREATE_AH",
    "MODIFY_AH",
    "QUERY_AH",
    "DESTROY_AH",
    "REG_MR",
    "REG_SMR",
    "REREG_MR",
    "QUERY_MR",
    "DEREG_MR",
    "ALLOC_MW",
    "BIND_MW",
    "DEALLOC_MW",
    "CREATE_COMP_CHANNEL",
    "CREATE_CQ",
    "RESIZE_CQ",
    "DESTROY_CQ",
    "POLL_CQ",
    "PEEK_CQ",
    "REQ_NOTIFY_CQ",
    "CREATE_QP",
    "QUERY_QP",
    "MODIFY_QP",
    "DESTROY_QP",
    "POST_SEND",
    "POST_RECV",
    "ATTACH_MCAST",
    "DETACH_MCAST",
    "CREATE_SRQ",
    "MODIFY_SRQ",
    "QUERY_SRQ",
    "DESTROY_SRQ",
    "POST_SRQ_RECV",
    "OPEN_XRCD",
    "CLOSE_XRCD",
    "CREATE_XSRQ",
    "OPEN_QP",
];

/// Extended command names from 50 on (`IB_USER_VERBS_EX_CMD_*`).
const EX_NAMES: [&str; 8] = [
    "CREATE_FLOW",
    "DESTROY_FLOW",
    "CREATE_WQ",
    "MODIFY_WQ",
    "DESTROY_WQ",
    "CREATE_RWQ_IND_TBL",
    "DESTROY_RWQ_IND_TBL",
    "MODIFY_CQ",
];

/// "CREATE_QP (cmd 0x18)", "EX_QUERY_DEVICE (cmd 0x80000001)" or "cmd 0x..".
pub(crate) fn write_cmd(cmd: u32) -> String {
    let ex = cmd & IB_USER_VERBS_CMD_FLAG_EXTENDED != 0;
    let n = (cmd & !IB_USER_VERBS_CMD_FLAG_EXTENDED) as usize;
    let name = WRITE_NAMES.get(n).or_else(|| {
        n.checked_sub(50)
            .and_then(|i| EX_NAMES.get(i))
            .filter(|_| ex)
    });
    match name {
        Some(name) if ex => format!("EX_{name} (cmd {cmd:#x})"),
        Some(name) => format!("{name} (cmd {cmd:#x})"),
        None => format!("cmd {cmd:#x}"),
    }
}

/// The verb of an ioctl method call; `write_cmd` is the `UVERBS_ATTR_WRITE_CMD` value of an
/// `INVOKE_WRITE`, if present.
pub(crate) fn ioctl_method(object: u16, method: u16, write_cmd_attr: Option<u64>) -> String {
    let name = match (object, method) {
        (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE) => {
            return match write_cmd_attr.and_then(|c| u32::try_from(c).ok()) {
                Some(c) => format!("INVOKE_WRITE {}", write_cmd(c)),
                None => "INVOKE_WRITE (no command)".to_string(),
            };
        }
        (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INFO_HANDLES) => "INFO_HANDLES",
        (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_PORT) => "QUERY_PORT",
        (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_GET_CONTEXT) => "GET_CONTEXT",
        (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_CONTEXT) => "QUERY_CONTEXT",
        (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_TABLE) => "QUERY_GID_TABLE",
        (UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_ENTRY) => "QUERY_GID_ENTRY",
        (UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY) => "DEALLOC_PD",
        (UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE) => "CREATE_CQ",
        (UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_DESTROY) => "DESTROY_CQ",
        (UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE) => "CREATE_QP",
        (UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY) => "DESTROY_QP",
        (UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY) => "DEREG_MR",
        (UVERBS_OBJECT_ASYNC_EVENT, UVERBS_METHOD_ASYNC_EVENT_ALLOC) => "ASYNC_EVENT_ALLOC",
        (MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_OTHER) => "MLX5_DEVX_OTHER",
        (MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_ALLOC) => "MLX5_UAR_OBJ_ALLOC",
        (MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_DESTROY) => "MLX5_UAR_OBJ_DESTROY",
        _ => "",
    };
    if name.is_empty() {
        format!("object {object:#x} method {method:#x}")
    } else {
        format!("{name} (object {object:#x} method {method:#x})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5_ffi::uverbs::{
        IB_USER_VERBS_CMD_CREATE_QP, IB_USER_VERBS_CMD_OPEN_QP, IB_USER_VERBS_EX_CMD_MODIFY_CQ,
    };

    #[test]
    fn names_follow_the_kernel_numbering() {
        assert_eq!(
            write_cmd(IB_USER_VERBS_CMD_CREATE_QP),
            "CREATE_QP (cmd 0x18)"
        );
        assert_eq!(write_cmd(IB_USER_VERBS_CMD_OPEN_QP), "OPEN_QP (cmd 0x28)");
        assert_eq!(write_cmd(0x8000_0001), "EX_QUERY_DEVICE (cmd 0x80000001)");
        let modify_cq = IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_EX_CMD_MODIFY_CQ;
        assert!(write_cmd(modify_cq).starts_with("EX_MODIFY_CQ"));
        // Extended-only numbers are not legacy commands.
        assert_eq!(write_cmd(57), "cmd 0x39");
        assert_eq!(write_cmd(41), "cmd 0x29");
    }

    #[test]
    fn the_same_verb_has_one_name_on_every_path() {
        let tunnel = ioctl_method(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE, Some(24));
        assert_eq!(tunnel, "INVOKE_WRITE CREATE_QP (cmd 0x18)");
        let method = ioctl_method(UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE, None);
        assert!(method.starts_with("CREATE_QP "), "{method}");
        assert_eq!(ioctl_method(0x77, 3, None), "object 0x77 method 0x3");
    }
}
