//! Registration, device matching, device and context allocation, device and port queries.

use core::ffi::{c_char, c_int, c_void};
use core::mem::{MaybeUninit, offset_of, size_of};
use std::sync::{Arc, Once};

use crate::abi::*;
use crate::config::{self, Choice};
use crate::private::Private;
use crate::surface::BorrowedCmdFd;
use crate::{cq, fast, guard, objects, qp, xrc};

/// `RDMA_DRIVER_MLX5` (`rdma/ib_user_ioctl_verbs.h`, enum rdma_driver_id).
pub const RDMA_DRIVER_MLX5: u64 = 1;
/// Mellanox's PCI vendor id.
const PCI_VENDOR_MELLANOX: u32 = 0x15b3;
/// The first ConnectX-4 (mlx5) PCI device id; below it are ConnectX-3 (mlx4) parts.
const FIRST_MLX5_DEVICE: u32 = 0x1011;

struct Sync<T>(T);
// SAFETY: the wrapped tables are immutable after construction and only read (by
// libibverbs, from any thread); their pointers name other immutable statics.
unsafe impl<T> core::marker::Sync for Sync<T> {}

static MATCH_TABLE: Sync<[verbs_match_ent; 3]> = Sync([
    verbs_match_ent {
        driver_data: core::ptr::null_mut(),
        u: core::ptr::without_provenance(RDMA_DRIVER_MLX5 as usize),
        vendor: 0,
        device: 0,
        kind: VERBS_MATCH_DRIVER_ID,
    },
    verbs_match_ent {
        driver_data: core::ptr::null_mut(),
        // Every Mellanox PCI function; `match_device` keeps the mlx5 ones.
        u: c"pci:v000015B3d*".as_ptr(),
        vendor: 0,
        device: 0,
        kind: VERBS_MATCH_MODALIAS,
    },
    verbs_match_ent {
        driver_data: core::ptr::null_mut(),
        u: core::ptr::null(),
        vendor: 0,
        device: 0,
        kind: VERBS_MATCH_SENTINEL,
    },
]);

static OPS: Sync<verbs_device_ops> = Sync(verbs_device_ops {
    name: c"libmlx5rs".as_ptr(),
    match_min_abi_version: 1,
    match_max_abi_version: 1,
    match_table: MATCH_TABLE.0.as_ptr(),
    static_providers: core::ptr::null(),
    match_device: Some(match_device),
    alloc_context: Some(alloc_context),
    import_context: None,
    alloc_device: Some(alloc_device),
    uninit_device: Some(uninit_device),
});

/// Our `verbs_device_ops` (what we register).
pub fn ops_ptr() -> *const verbs_device_ops {
    &OPS.0
}

/// Register ours with libibverbs, once per process.
pub fn register_once(p: &'static Private) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: libibverbs' registration with our static, immutable ops table.
        unsafe { (p.register)(ops_ptr()) };
    });
}

fn cstr(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The PCI device id in a `pci:v000015B3d00001017sv...` modalias.
fn pci_ids(modalias: &str) -> Option<(u32, u32)> {
    let rest = modalias.strip_prefix("pci:v")?;
    let vendor = u32::from_str_radix(rest.get(..8)?, 16).ok()?;
    let dev = rest.get(8..)?.strip_prefix('d')?;
    let device = u32::from_str_radix(dev.get(..8)?, 16).ok()?;
    Some((vendor, device))
}

unsafe extern "C" fn match_device(sysfs: *mut verbs_sysfs_dev) -> bool {
    guard("match_device", || {
        // SAFETY: libibverbs passes its live sysfs device record.
        let s = unsafe { &*sysfs };
        if s.match_.is_null() {
            return false;
        }
        let name = cstr(&s.ibdev_name);
        // SAFETY: `match_` points into our match table (libibverbs found it there).
        let kind = unsafe { (*s.match_).kind };
        if kind == VERBS_MATCH_MODALIAS {
            let ma = cstr(&s.modalias);
            match pci_ids(&ma) {
                Some((PCI_VENDOR_MELLANOX, d)) if d >= FIRST_MLX5_DEVICE => {}
                _ => return false,
            }
        }
        match config::choice_for(&name, |k| std::env::var(k).ok()) {
            Ok(Choice::Ours) => true,
            Ok(Choice::Libmlx5) => false,
            Err(msg) => {
                eprintln!("libmlx5rs: {msg}; {name} stays with libmlx5");
                false
            }
        }
    })
}

/// Our device: the libibverbs record first.
#[repr(C)]
struct ProvDevice {
    vdev: verbs_device,
}

unsafe extern "C" fn alloc_device(_sysfs: *mut verbs_sysfs_dev) -> *mut verbs_device {
    guard("alloc_device", || {
        // SAFETY: all-zero is a valid `verbs_device` (null pointers, zero counts), which
        // libibverbs then fills (try_driver).
        let d: Box<ProvDevice> = Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
        Box::into_raw(d).cast::<verbs_device>()
    })
}

unsafe extern "C" fn uninit_device(dev: *mut verbs_device) {
    guard("uninit_device", || {
        // SAFETY: `dev` came from `alloc_device` (Box<ProvDevice>, the record at offset 0).
        drop(unsafe { Box::from_raw(dev.cast::<ProvDevice>()) });
    })
}

/// Our context: libibverbs' `verbs_context` first (its `ibv_context` is its last member).
#[repr(C)]
pub struct ProvContext {
    pub vctx: verbs_context,
    pub st: MaybeUninit<CtxState>,
}

/// What the provider keeps per context.
pub struct CtxState {
    pub ctx: mlx5::Context,
    pub single_threaded: bool,
    /// libmlx5's BlueFlame knobs (`config::bf_policy`), for every QP of the context.
    pub bf_policy: mlx5::BfPolicy,
    pub name: String,
    pub log: bool,
    pub private: &'static Private,
}

/// The provider context of a libibverbs context.
///
/// # Safety
/// `c` must be the `ibv_context` of a live context made by [`alloc_context`].
pub unsafe fn state<'a>(c: *mut ibv_context) -> &'a CtxState {
    // SAFETY: per the contract, `c` is `vctx.context` inside a ProvContext whose `st` was
    // initialized by alloc_context before it returned.
    unsafe {
        let base = c
            .byte_sub(offset_of!(verbs_context, context))
            .cast::<ProvContext>();
        (*base).st.assume_init_ref()
    }
}

/// An `Error` as the errno a verb returns, printing the message under `MLX5RS_LOG=1`.
pub fn errno_of(st: &CtxState, what: &str, e: &mlx5::Error) -> c_int {
    use mlx5::Error as E;
    let n = match e {
        E::Uverbs { errno, .. } | E::Os { errno, .. } => *errno as c_int,
        E::Unsupported { .. } => libc::EOPNOTSUPP,
        E::BadResponse { .. } => libc::EIO,
        E::AbiVersion { .. } => libc::ENOSYS,
        _ => libc::EINVAL,
    };
    if st.log {
        eprintln!("libmlx5rs: {}: {what}: {e}", st.name);
    }
    n
}

pub fn set_errno(n: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = n };
}

unsafe extern "C" fn alloc_context(
    device: *mut ibv_device,
    cmd_fd: c_int,
    _private: *mut c_void,
) -> *mut verbs_context {
    guard("alloc_context", || {
        let Some(p) = crate::private::get() else {
            set_errno(libc::ENOSYS);
            return core::ptr::null_mut();
        };
        // SAFETY: the private call of ABI 34, with our wrapper's size and the verbs_context
        // at offset 0; it takes ownership of cmd_fd (closes it on failure).
        let raw = unsafe {
            (p.init_and_alloc_context)(
                device,
                cmd_fd,
                size_of::<ProvContext>(),
                core::ptr::null_mut(),
                RDMA_DRIVER_MLX5 as u32,
            )
        };
        if raw.is_null() {
            return core::ptr::null_mut();
        }
        let pc = raw.cast::<ProvContext>();
        // SAFETY: `device` is libibverbs' live device record.
        let name = cstr(unsafe { &(*device).name });
        let log = config::log_enabled();
        let surface = Arc::new(BorrowedCmdFd::new(cmd_fd, name.clone()));
        let fail = |why: String| {
            eprintln!("libmlx5rs: cannot open {name}: {why}");
            // SAFETY: `pc` is the context just made; nothing else holds it. uninit closes
            // cmd_fd, which a failed alloc_context must do.
            unsafe {
                (p.uninit_context)(&mut (*pc).vctx);
                libc::free(raw);
            }
            set_errno(libc::EIO);
            core::ptr::null_mut()
        };
        let ctx = match mlx5::Context::open(surface) {
            Ok(c) => c,
            Err(e) => return fail(e.to_string()),
        };
        // libibverbs closes async_fd in verbs_uninit_context: hand it a duplicate.
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor the context owns.
        let async_fd = unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&ctx.async_fd()),
                libc::F_DUPFD_CLOEXEC,
                0,
            )
        };
        if async_fd < 0 {
            return fail(format!(
                "dup of the async fd: {}",
                std::io::Error::last_os_error()
            ));
        }
        let single_threaded = config::single_threaded();
        if log {
            eprintln!(
                "libmlx5rs: opened {name} ({}), {}",
                ctx.describe(),
                if single_threaded {
                    "single-threaded (no locks)"
                } else {
                    "locks on"
                }
            );
        }
        // SAFETY: `pc` is ours; `st` is written once here, before libibverbs sees the context.
        unsafe {
            (*pc).vctx.context.async_fd = async_fd;
            (*pc).vctx.context.num_comp_vectors = ctx.num_comp_vectors() as c_int;
            (*pc).st.write(CtxState {
                ctx,
                single_threaded,
                bf_policy: config::bf_policy(|k| std::env::var(k).ok()),
                name,
                log,
                private: p,
            });
            (p.set_ops)(&mut (*pc).vctx, context_ops(single_threaded));
        }
        // SAFETY: `pc` is the live context made above.
        unsafe { &raw mut (*pc).vctx }
    })
}

unsafe extern "C" fn free_context(c: *mut ibv_context) {
    guard("free_context", || {
        // SAFETY: `c` is a context of ours; libibverbs frees nothing of the wrapper itself.
        unsafe {
            let base = c
                .byte_sub(offset_of!(verbs_context, context))
                .cast::<ProvContext>();
            let p = (*base).st.assume_init_ref().private;
            (*base).st.assume_init_drop();
            (p.uninit_context)(&mut (*base).vctx);
            libc::free(base.cast());
        }
    })
}

unsafe extern "C" fn query_device_ex(
    c: *mut ibv_context,
    _input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard("query_device_ex", || {
        // SAFETY: `c` is ours.
        let st = unsafe { state(c) };
        let (r, drv) = match st.ctx.query_device_ex() {
            Ok(x) => x,
            Err(e) => return errno_of(st, "query_device_ex", &e),
        };
        let b = &r.base;
        // SAFETY: all-zero is a valid ibv_device_attr_ex (integers and a char array).
        let mut a: ibv_device_attr_ex = unsafe { MaybeUninit::zeroed().assume_init() };
        let fw = format!(
            "{}.{}.{:04}",
            (b.fw_ver >> 32) & 0xffff,
            (b.fw_ver >> 16) & 0xffff,
            b.fw_ver & 0xffff
        );
        for (d, s) in a.orig_attr.fw_ver.iter_mut().zip(fw.bytes().take(63)) {
            *d = s as c_char;
        }
        let o = &mut a.orig_attr;
        o.node_guid = b.node_guid;
        o.sys_image_guid = b.sys_image_guid;
        o.max_mr_size = b.max_mr_size;
        o.page_size_cap = b.page_size_cap;
        o.vendor_id = b.vendor_id;
        o.vendor_part_id = b.vendor_part_id;
        o.hw_ver = b.hw_ver;
        o.max_qp = b.max_qp as c_int;
        o.max_qp_wr = b.max_qp_wr as c_int;
        o.device_cap_flags = b.device_cap_flags;
        o.max_sge = b.max_sge as c_int;
        o.max_sge_rd = b.max_sge_rd as c_int;
        o.max_cq = b.max_cq as c_int;
        o.max_cqe = b.max_cqe as c_int;
        o.max_mr = b.max_mr as c_int;
        o.max_pd = b.max_pd as c_int;
        o.max_qp_rd_atom = b.max_qp_rd_atom as c_int;
        o.max_ee_rd_atom = b.max_ee_rd_atom as c_int;
        o.max_res_rd_atom = b.max_res_rd_atom as c_int;
        o.max_qp_init_rd_atom = b.max_qp_init_rd_atom as c_int;
        o.max_ee_init_rd_atom = b.max_ee_init_rd_atom as c_int;
        o.atomic_cap = b.atomic_cap;
        o.max_ee = b.max_ee as c_int;
        o.max_rdd = b.max_rdd as c_int;
        o.max_mw = b.max_mw as c_int;
        o.max_raw_ipv6_qp = b.max_raw_ipv6_qp as c_int;
        o.max_raw_ethy_qp = b.max_raw_ethy_qp as c_int;
        o.max_mcast_grp = b.max_mcast_grp as c_int;
        o.max_mcast_qp_attach = b.max_mcast_qp_attach as c_int;
        o.max_total_mcast_qp_attach = b.max_total_mcast_qp_attach as c_int;
        o.max_ah = b.max_ah as c_int;
        o.max_fmr = b.max_fmr as c_int;
        o.max_map_per_fmr = b.max_map_per_fmr as c_int;
        o.max_srq = b.max_srq as c_int;
        o.max_srq_wr = b.max_srq_wr as c_int;
        o.max_srq_sge = b.max_srq_sge as c_int;
        o.max_pkeys = b.max_pkeys;
        o.local_ca_ack_delay = b.local_ca_ack_delay;
        o.phys_port_cnt = b.phys_port_cnt;
        a.comp_mask = 0;
        a.odp_caps = ibv_odp_caps {
            general_caps: r.odp_caps.general_caps,
            rc_odp_caps: r.odp_caps.per_transport_caps.rc_odp_caps,
            uc_odp_caps: r.odp_caps.per_transport_caps.uc_odp_caps,
            ud_odp_caps: r.odp_caps.per_transport_caps.ud_odp_caps,
        };
        a.completion_timestamp_mask = r.timestamp_mask;
        a.hca_core_clock = r.hca_core_clock;
        a.device_cap_flags_ex = r.device_cap_flags_ex;
        a.tso_caps = ibv_tso_caps {
            max_tso: drv.tso_caps.max_tso,
            supported_qpts: drv.tso_caps.supported_qpts,
        };
        a.rss_caps = ibv_rss_caps {
            supported_qpts: r.rss_caps.supported_qpts,
            max_rwq_indirection_tables: r.rss_caps.max_rwq_indirection_tables,
            max_rwq_indirection_table_size: r.rss_caps.max_rwq_indirection_table_size,
            rx_hash_fields_mask: drv.rss_caps.rx_hash_fields_mask,
            rx_hash_function: drv.rss_caps.rx_hash_function,
        };
        a.max_wq_type_rq = r.max_wq_type_rq;
        a.packet_pacing_caps = ibv_packet_pacing_caps {
            qp_rate_limit_min: drv.packet_pacing_caps.qp_rate_limit_min,
            qp_rate_limit_max: drv.packet_pacing_caps.qp_rate_limit_max,
            supported_qpts: drv.packet_pacing_caps.supported_qpts,
        };
        a.raw_packet_caps = r.raw_packet_caps;
        a.tm_caps = ibv_tm_caps {
            max_rndv_hdr_size: r.tm_caps.max_rndv_hdr_size,
            max_num_tags: r.tm_caps.max_num_tags,
            flags: r.tm_caps.flags,
            max_ops: r.tm_caps.max_ops,
            max_sge: r.tm_caps.max_sge,
        };
        a.cq_mod_caps = ibv_cq_moderation_caps {
            max_cq_count: r.cq_moderation_caps.max_cq_moderation_count,
            max_cq_period: r.cq_moderation_caps.max_cq_moderation_period,
        };
        a.max_dm_size = r.max_dm_size;
        a.xrc_odp_caps = r.xrc_odp_caps;
        a.phys_port_cnt_ex = u32::from(b.phys_port_cnt);
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's `attr` has `attr_size` writable bytes (libibverbs' contract);
        // we copy at most that many, and at most our struct's size.
        unsafe {
            core::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), attr.cast::<u8>(), n)
        };
        0
    })
}

unsafe extern "C" fn query_port(c: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    guard("query_port", || {
        // SAFETY: `c` is ours.
        let st = unsafe { state(c) };
        let p = match st.ctx.query_port(port) {
            Ok(p) => p.raw,
            Err(e) => return errno_of(st, "query_port", &e),
        };
        let a = ibv_port_attr {
            state: u32::from(p.state),
            max_mtu: u32::from(p.max_mtu),
            active_mtu: u32::from(p.active_mtu),
            gid_tbl_len: p.gid_tbl_len as c_int,
            port_cap_flags: p.port_cap_flags,
            max_msg_sz: p.max_msg_sz,
            bad_pkey_cntr: p.bad_pkey_cntr,
            qkey_viol_cntr: p.qkey_viol_cntr,
            pkey_tbl_len: p.pkey_tbl_len,
            lid: p.lid,
            sm_lid: p.sm_lid,
            lmc: p.lmc,
            max_vl_num: p.max_vl_num,
            sm_sl: p.sm_sl,
            subnet_timeout: p.subnet_timeout,
            init_type_reply: p.init_type_reply,
            active_width: p.active_width,
            active_speed: p.active_speed,
            phys_state: p.phys_state,
            link_layer: p.link_layer,
            flags: p.flags,
            port_cap_flags2: 0,
        };
        // SAFETY: libibverbs passes a full `ibv_port_attr` (it pads short user buffers).
        unsafe { attr.write(a) };
        0
    })
}

macro_rules! op {
    ($s:ident, $name:literal, $f:expr, $t:ty) => {
        // SAFETY: erasing a function pointer's type for the C table; libibverbs calls it
        // through the slot's real type, which `$t` spells (driver.h of ABI 34).
        $s[slot($name)] = Some(unsafe { core::mem::transmute::<$t, unsafe extern "C" fn()>($f) });
    };
}

/// The `verbs_context_ops` we serve: with the data path's locks, or (`single_threaded`)
/// without any lock code.
fn context_ops(single_threaded: bool) -> *const verbs_context_ops {
    static LOCKED: std::sync::OnceLock<Sync<verbs_context_ops>> = std::sync::OnceLock::new();
    static ST: std::sync::OnceLock<Sync<verbs_context_ops>> = std::sync::OnceLock::new();
    let t = if single_threaded { &ST } else { &LOCKED };
    let t = t.get_or_init(|| {
        let mut s: [Fp; VERBS_CONTEXT_OPS_SLOTS] = [None; VERBS_CONTEXT_OPS_SLOTS];
        type Ctx = *mut ibv_context;
        op!(s, "free_context", free_context, unsafe extern "C" fn(Ctx));
        op!(
            s,
            "query_device_ex",
            query_device_ex,
            unsafe extern "C" fn(Ctx, *const c_void, *mut ibv_device_attr_ex, usize) -> c_int
        );
        op!(
            s,
            "query_port",
            query_port,
            unsafe extern "C" fn(Ctx, u8, *mut ibv_port_attr) -> c_int
        );
        objects::fill_ops(&mut s);
        cq::fill_ops(&mut s);
        qp::fill_ops(&mut s);
        xrc::fill_ops(&mut s);
        fast::fill_ops(&mut s, !single_threaded);
        Sync(verbs_context_ops { slots: s })
    });
    &t.0
}

pub(crate) use op;
