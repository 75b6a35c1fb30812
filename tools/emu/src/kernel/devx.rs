//! DEVX: the PRM command channel of a DEVX context (`MLX5_IB_ALLOC_UCTX_DEVX`), as
//! mlx5_ib passes it to the firmware, and the emulated firmware's answers.
//!
//! - general commands (`MLX5_IB_METHOD_DEVX_OTHER`): QUERY_HCA_CAP (general, ODP, atomic,
//!   RoCE, general 2) answered from `caps.rs`; the other general commands mlx5_ib lets
//!   through get the firmware's "bad opcode" (status in the output mailbox, `EREMOTEIO`);
//! - DEVX objects (`MLX5_IB_OBJECT_DEVX_OBJ`): QPs (RC and DC initiator) and DC targets
//!   (`kernel/devx_qp.rs`), on the emulator's existing QP model; any other object the
//!   firmware does not create (bad opcode, `EREMOTEIO`);
//! - user memory (`MLX5_IB_OBJECT_DEVX_UMEM`): registered ranges named by id in the QPC;
//! - UAR: libmlx5's legacy dynamic UARs on a static-bfreg context (mmap `ALLOC_WC`, then
//!   `MLX5_IB_METHOD_DEVX_QUERY_UAR` for the device index);
//! - event channels (`MLX5_IB_OBJECT_DEVX_ASYNC_EVENT_FD`) and subscriptions; the emulator
//!   raises `SRQ_LAST_WQE` when a DEVX QP on an SRQ enters the error state.
//!
//! What is answered, and why, is in `docs/emulator-kernel.md`.

use mlx5_ffi::prm::{self, Field, cap_type, hca_cap, hdr, op, status};

use super::{EINVAL, caps};
use crate::abi::Errno;
use crate::fds::EventChannel;
pub(crate) use crate::model::devx::{Channel, Object, Umem};
use crate::state::World;

/// `EREMOTEIO`: mlx5_ib's answer when the firmware fails a DEVX command (`mlx5_cmd_do`);
/// the output mailbox carries the status and syndrome.
pub(super) const EREMOTEIO: Errno = Errno(libc::EREMOTEIO);
/// Bytes of every mailbox header (`general_obj_in_cmd_hdr` / `_out_`): the minimum the
/// DEVX methods accept (`UVERBS_ATTR_MIN_SIZE`), else EINVAL.
pub(super) const HDR_BYTES: usize = 16;
/// Event type of `SRQ_LAST_WQE` (PRM event 0x13).
pub(super) const EVENT_SRQ_LAST_WQE: u16 = 0x13;
/// DC over DEVX (DCI QPs and DCT objects, `kernel/devx_qp.rs`) is implemented: the general capability page
/// announces `dct` when the device has DC (`caps::FEATURES.dc`) and this is on.
pub(super) const DEVX_DC: bool = true;
/// The QP-affiliated events a subscription may name (PRM event types).
const QP_EVENTS: [u16; 8] = [0x01, 0x02, 0x05, 0x06, 0x10, 0x11, 0x12, 0x13];

/// Write a firmware answer: `out` (produced) into a zeroed mailbox of `len` bytes.
fn mailbox(len: usize, produced: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let n = len.min(produced.len());
    v[..n].copy_from_slice(&produced[..n]);
    v
}

/// A failed firmware command: status and syndrome in a header-sized mailbox.
pub(super) fn fw_error(st: u8, syndrome: u32) -> Vec<u8> {
    let mut out = vec![0u8; HDR_BYTES];
    prm::set(&mut out, hdr::STATUS, u64::from(st));
    prm::set(&mut out, hdr::SYNDROME, u64::from(syndrome));
    out
}

/// The firmware's answer to a command: Ok(output) or Err(output with a failed status).
pub(super) type FwResult = Result<Vec<u8>, Vec<u8>>;

/// The general commands mlx5_ib's DEVX passes to the firmware (`devx_is_general_cmd`: the
/// queries that name no object). Anything else is EINVAL before the firmware sees it.
fn is_general(opcode: u16) -> bool {
    matches!(
        opcode,
        op::QUERY_HCA_CAP
            | op::QUERY_ADAPTER
            | op::QUERY_NIC_VPORT_CONTEXT
            | op::QUERY_ROCE_ADDRESS
            | op::QUERY_HCA_VPORT_CONTEXT
            | op::QUERY_ESW_VPORT_CONTEXT
            | op::QUERY_ESW_FUNCTIONS
            | op::QUERY_LAG
    )
}

/// `MLX5_IB_METHOD_DEVX_OTHER` on a DEVX context: EINVAL for what mlx5_ib refuses
/// before the firmware (a short mailbox, a command that is not a general one), else the
/// firmware's answer.
pub(super) fn general(w: &World, ctx: u64, cmd: &[u8], out_len: usize) -> Result<FwResult, Errno> {
    if cmd.len() < HDR_BYTES || out_len < HDR_BYTES {
        return Err(EINVAL);
    }
    let opcode = prm::get(cmd, hdr::OPCODE) as u16;
    if !is_general(opcode) {
        return Err(EINVAL);
    }
    Ok(match opcode {
        op::QUERY_HCA_CAP => query_hca_cap(w, ctx, cmd),
        _ => Err(fw_error(status::BAD_OP, 0)),
    })
}

/// The output mailbox of a firmware answer, `out_len` bytes, and the method's errno:
/// mlx5_ib copies the mailbox back either way and fails a command the firmware failed
/// with EREMOTEIO (`mlx5_cmd_do`).
pub(super) fn fw_out(r: FwResult, out_len: usize) -> (Vec<u8>, Result<(), Errno>) {
    match r {
        Ok(v) => (mailbox(out_len, &v), Ok(())),
        Err(v) => (mailbox(out_len, &v), Err(EREMOTEIO)),
    }
}

/// QUERY_HCA_CAP: the capability pages of the emulated HCA, derived from `caps.rs` and the
/// port (current and maximum are the same: nothing is configurable).
fn query_hca_cap(w: &World, ctx: u64, cmd: &[u8]) -> FwResult {
    let op_mod = prm::get(cmd, hdr::OP_MOD) as u16;
    let ty = op_mod >> 1;
    let hca = w.contexts.get(&ctx).map_or(0, |c| c.hca);
    let roce = w.hcas[hca].info.is_roce();
    let mut out = vec![0u8; hca_cap::OUT_BYTES];
    let page = |f: Field| f.at(hca_cap::PAGE);
    let mut put = |f: Field, v: u64| prm::set(&mut out, page(f), v);
    let f = caps::FEATURES;
    match ty {
        cap_type::GENERAL => {
            put(
                hca_cap::LOG_MAX_SRQ_SZ,
                u64::from(log2(caps::MAX_SRQ_WR + 1)),
            );
            put(hca_cap::LOG_MAX_QP_SZ, u64::from(log2(caps::MAX_QP_WR)));
            put(hca_cap::LOG_MAX_QP, u64::from(caps::LOG_MAX_QP));
            put(hca_cap::LOG_MAX_SRQ, u64::from(caps::LOG_MAX_QP));
            put(hca_cap::LOG_MAX_CQ_SZ, u64::from(log2(caps::MAX_CQE + 1)));
            put(hca_cap::LOG_MAX_CQ, u64::from(caps::LOG_MAX_QP));
            put(hca_cap::LOG_MAX_MKEY, 24);
            put(hca_cap::LOG_MAX_EQ, 4);
            let ra = u64::from(log2(caps::MAX_RD_ATOM));
            put(hca_cap::LOG_MAX_RA_REQ_QP, ra);
            put(hca_cap::LOG_MAX_RA_RES_QP, ra);
            if f.dc {
                put(hca_cap::LOG_MAX_RA_REQ_DC, ra);
                put(hca_cap::LOG_MAX_RA_RES_DC, ra);
            }
            put(
                hca_cap::PORT_TYPE,
                if roce {
                    hca_cap::PORT_TYPE_ETH
                } else {
                    hca_cap::PORT_TYPE_IB
                },
            );
            put(hca_cap::NUM_PORTS, 1);
            put(hca_cap::LOG_MAX_MSG, u64::from(caps::LOG_MAX_MSG));
            put(hca_cap::MAX_TC, 0);
            put(hca_cap::CQE_VERSION, 1);
            // No UMR: indirect keys cannot change atomic access.
            put(hca_cap::UMR_MODIFY_ATOMIC_DISABLED, 1);
            // KSM keys through CREATE_MKEY (kernel/devx_mkey.rs).
            put(hca_cap::FIXED_BUFFER_SIZE, 1);
            put(hca_cap::DCT, u64::from(f.dc && DEVX_DC));
            put(hca_cap::ETH_NET_OFFLOADS, u64::from(roce && f.raw_packet));
            put(hca_cap::ROCE, u64::from(roce));
            put(hca_cap::ATOMIC, u64::from(f.ext_atomics));
            put(hca_cap::XRC, u64::from(f.xrc));
            put(hca_cap::UD, 1);
            put(hca_cap::UC, 1);
            put(hca_cap::RC, 1);
            let bf = w.cfg.bf_reg_size;
            if bf.is_power_of_two() {
                put(hca_cap::LOG_BF_REG_SIZE, u64::from(bf.trailing_zeros()));
            }
            put(hca_cap::LOG_MAX_PD, 24);
            if f.xrc {
                put(hca_cap::LOG_MAX_XRCD, 24);
            }
            put(hca_cap::LOG_MAX_RMP, u64::from(caps::LOG_MAX_QP));
            // UAR pages of 4 KiB (2^(12 + 0)).
            put(hca_cap::LOG_UAR_PAGE_SZ, 0);
        }
        cap_type::ATOMIC if f.ext_atomics => {
            use hca_cap::*;
            put(
                ATOMIC_OPERATIONS,
                ATOMIC_OPS_CMP_SWAP
                    | ATOMIC_OPS_FETCH_ADD
                    | ATOMIC_OPS_MASKED_CMP_SWAP
                    | ATOMIC_OPS_MASKED_FETCH_ADD,
            );
            put(ATOMIC_SIZE_QP, 4 | 8);
            if f.dc {
                put(ATOMIC_SIZE_DC, 4 | 8);
            }
            // The responder works on host-order operands (device/responder.rs `do_atomic`):
            // 8-byte requests in host endianness (mode 1).
            put(ATOMIC_REQ_8B_ENDIANNESS_MODE, 1);
        }
        // On-demand paging (every ODP bit clear), QoS (no packet pacing), device memory (no
        // MEMIC), crypto, the NIC flow table page and the second general page: a page of
        // zeros, i.e. none of it, as libmlx5 and UCX read it. The Ethernet pages exist on a
        // RoCE port only.
        cap_type::ODP
        | cap_type::GENERAL_2
        | cap_type::QOS
        | cap_type::DEVICE_MEMORY
        | cap_type::CRYPTO
        | cap_type::NIC_FLOW_TABLE => {}
        cap_type::ROCE | cap_type::ETHERNET_OFFLOADS if roce => {}
        _ => return Err(fw_error(status::BAD_PARAM, 0)),
    }
    Ok(out)
}

/// floor(log2(n)) for n > 0 (0 for 0).
fn log2(n: u32) -> u32 {
    n.checked_ilog2().unwrap_or(0)
}

/// UMEM_REG: register `[addr, addr + len)`; (handle, umem id).
pub(super) fn umem_reg(
    w: &mut World,
    ctx: u64,
    addr: u64,
    len: u64,
    access: u32,
) -> Result<(u32, u32), Errno> {
    // ib_umem_get: a zero or wrapping length is EINVAL; unmapped memory EFAULT.
    if len == 0 || addr.checked_add(len).is_none() {
        return Err(EINVAL);
    }
    // Access flags of ib_umem (local write, remote read/write/atomic, relaxed ordering).
    let known = mlx5_ffi::uverbs::access::LOCAL_WRITE
        | mlx5_ffi::uverbs::access::REMOTE_WRITE
        | mlx5_ffi::uverbs::access::REMOTE_READ
        | mlx5_ffi::uverbs::access::REMOTE_ATOMIC
        | mlx5_ffi::uverbs::access::RELAXED_ORDERING;
    if access & !known != 0 {
        return Err(EINVAL);
    }
    crate::mem::probe(addr, len)?;
    let c = w.contexts.get_mut(&ctx).ok_or(EINVAL)?;
    let handle = c.next_handle;
    c.next_handle += 1;
    c.devx.next_umem += 1;
    let id = c.devx.next_umem;
    c.devx.umems.insert(
        id,
        Umem {
            handle,
            addr,
            len,
            users: 0,
        },
    );
    Ok((handle, id))
}

/// UMEM_DEREG: EBUSY while an object uses it (the firmware refuses DESTROY_UMEM), EINVAL
/// for a handle that is no umem.
pub(super) fn umem_dereg(w: &mut World, ctx: u64, handle: u32) -> Result<(), Errno> {
    let c = w.contexts.get_mut(&ctx).ok_or(EINVAL)?;
    let (&id, u) = c
        .devx
        .umems
        .iter()
        .find(|(_, u)| u.handle == handle)
        .ok_or(EINVAL)?;
    if u.users > 0 {
        return Err(Errno(libc::EBUSY));
    }
    c.devx.umems.remove(&id);
    Ok(())
}

/// The address of `[off, off + len)` of umem `id`, if it lies inside it.
pub(super) fn umem_range(w: &World, ctx: u64, id: u32, off: u64, len: u64) -> Option<u64> {
    let u = w.contexts.get(&ctx)?.devx.umems.get(&id)?;
    let end = off.checked_add(len)?;
    (end <= u.len).then(|| u.addr + off)
}

/// Take (+1) or drop (-1) a use of umem `id`.
pub(super) fn umem_use(w: &mut World, ctx: u64, id: u32, delta: i32) {
    if let Some(u) = w
        .contexts
        .get_mut(&ctx)
        .and_then(|c| c.devx.umems.get_mut(&id))
    {
        u.users = u.users.saturating_add_signed(delta);
    }
}

/// ASYNC_EVENT_FD_ALLOC: a new channel; the user's descriptor.
pub(super) fn event_channel(w: &mut World, ctx: u64, flags: u32) -> Result<i32, Errno> {
    use mlx5_ffi::mlx5::MLX5_IB_UAPI_DEVX_CR_EV_CH_FLAGS_OMIT_DATA as OMIT;
    if flags & !OMIT != 0 {
        return Err(EINVAL);
    }
    let omit_data = flags & OMIT != 0;
    let c = w.contexts.get_mut(&ctx).ok_or(EINVAL)?;
    // The user closes a channel's descriptor to destroy it: drop those first.
    c.devx.channels.retain(|ch| !ch.ch.user_closed());
    let ch = EventChannel::new(8 + if omit_data { 0 } else { EQE_BYTES })?;
    let fd = ch.user_fd;
    c.devx.channels.push(Channel {
        ch,
        omit_data,
        subs: Vec::new(),
    });
    Ok(fd)
}

/// Bytes of the event data (an EQE) that follows the cookie without `OMIT_DATA`.
const EQE_BYTES: usize = 64;

/// DEVX_SUBSCRIBE_EVENT: events `types` of the object behind `handle` go to channel `fd`
/// with `cookie`. EBADF for a descriptor that is no event channel of this context, EINVAL
/// for an unknown object, no event, or an event the object cannot raise.
pub(super) fn subscribe(
    w: &mut World,
    ctx: u64,
    fd: i32,
    handle: Option<u32>,
    types: &[u16],
    cookie: u64,
) -> Result<(), Errno> {
    let c = w.contexts.get_mut(&ctx).ok_or(EINVAL)?;
    let Some(i) = c
        .devx
        .channels
        .iter()
        .position(|ch| ch.ch.user_fd == fd && !ch.ch.user_closed())
    else {
        return Err(Errno(libc::EBADF));
    };
    // Unaffiliated events (no object): none of them is raised by this HCA; accepted as
    // the kernel accepts them, never delivered.
    let obj = match handle {
        None => None,
        Some(h) => match c.devx.objects.get(&h) {
            Some(Object::Qp { qpn, .. }) => Some(*qpn),
            Some(Object::Dct { dctn }) => Some(*dctn),
            Some(Object::Rmp { .. } | Object::Mkey { .. }) => return Err(EINVAL),
            None => match c.handles.get(&h) {
                Some(crate::state::Obj::Qp(qpn)) => Some(*qpn),
                _ => return Err(EINVAL),
            },
        },
    };
    if types.is_empty() || obj.is_some() && types.iter().any(|t| !QP_EVENTS.contains(t)) {
        return Err(EINVAL);
    }
    if let Some(qpn) = obj {
        let ch = &mut c.devx.channels[i];
        for &t in types {
            ch.subs.push((qpn, t, cookie));
        }
    }
    Ok(())
}

/// Raise event `ty` of object `num` of `ctx` on every channel subscribed to it.
pub(super) fn raise(w: &mut World, ctx: u64, num: u32, ty: u16) {
    let Some(c) = w.contexts.get_mut(&ctx) else {
        return;
    };
    for ch in &mut c.devx.channels {
        for &(n, t, cookie) in &ch.subs {
            if n != num || t != ty {
                continue;
            }
            let mut rec = cookie.to_ne_bytes().to_vec();
            if !ch.omit_data {
                // The EQE: its type at byte 1, the QP number (BE) at data + 4.
                let mut eqe = [0u8; EQE_BYTES];
                eqe[1] = ty as u8;
                eqe[0x20 + 4..0x20 + 8].copy_from_slice(&(num & 0xff_ffff).to_be_bytes());
                rec.extend_from_slice(&eqe);
            }
            ch.ch.push(&rec);
        }
    }
}

/// Forget the subscriptions of object `num` (destroyed).
pub(super) fn unsubscribe(w: &mut World, ctx: u64, num: u32) {
    if let Some(c) = w.contexts.get_mut(&ctx) {
        for ch in &mut c.devx.channels {
            ch.subs.retain(|s| s.0 != num);
        }
    }
}

/// Whether `opcode` creates an object mlx5_ib's DEVX knows (`devx_is_obj_create_cmd`):
/// others are EINVAL before the firmware sees them.
pub(super) fn is_create(opcode: u16) -> bool {
    matches!(
        opcode,
        op::CREATE_QP
            | op::CREATE_DCT
            | op::CREATE_MKEY
            | op::CREATE_CQ
            | op::CREATE_SRQ
            | op::CREATE_XRQ
            | op::CREATE_RMP
            | op::CREATE_GENERAL_OBJECT
    )
}

/// mmap of `MLX5_IB_MMAP_ALLOC_WC` page `index` (`pgoff` as mapped): libmlx5's dynamic UAR
/// on a context with static bfregs, allocated by the mmap itself as mlx5_ib's `uar_mmap`
/// does. EPERM without write-combining, EINVAL on a dynamic-UAR context, for an index past
/// the dynamic pages or one already mapped; ENOMEM once every dynamic page is taken.
pub(super) fn alloc_legacy_uar(
    w: &mut World,
    ctx: u64,
    pgoff: u64,
    index: usize,
) -> Result<(), Errno> {
    if w.cfg.bf_reg_size == 0 {
        return Err(Errno(libc::EPERM));
    }
    let c = w.contexts.get_mut(&ctx).ok_or(EINVAL)?;
    if c.dyn_uar || index >= super::MAX_DYN_UARS || c.dyn_pages.values().any(|d| d.1 == pgoff) {
        return Err(EINVAL);
    }
    let k = c.next_dyn as usize;
    if k >= super::MAX_DYN_UARS {
        return Err(Errno(libc::ENOMEM));
    }
    c.next_dyn += 1;
    let page = c.uar_pages + 2 + k;
    c.dyn_pages
        .insert(super::DYN_PAGE_ID_BASE + k as u32, (page, pgoff));
    c.uar_active.push(page);
    Ok(())
}

/// DEVX_QUERY_UAR: the device index (page id) of the user's dynamic bfreg `user_idx` (two
/// bfregs per page, `mlx5_insert_dyn_uuars`); EINVAL if its page was never mapped.
pub(super) fn query_uar(w: &World, ctx: u64, user_idx: u32) -> Result<u32, Errno> {
    use mlx5_ffi::mlx5::MLX5_IB_MMAP_ALLOC_WC;
    let c = w.contexts.get(&ctx).ok_or(EINVAL)?;
    let i = u64::from(user_idx / 2);
    if i as usize >= super::MAX_DYN_UARS {
        return Err(EINVAL);
    }
    let pgoff = (u64::from(MLX5_IB_MMAP_ALLOC_WC) << 8) | (i & 0xff) | ((i >> 8) << 16);
    c.dyn_pages
        .iter()
        .find(|(_, d)| d.1 == pgoff)
        .map(|(&id, _)| id)
        .ok_or(EINVAL)
}
