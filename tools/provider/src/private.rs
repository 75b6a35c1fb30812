//! The private libibverbs calls, resolved at load time from the loaded libibverbs by
//! version node (`dlvsym(.., "IBVERBS_PRIVATE_34")`), with the ABI check that guards them.
//!
//! The provider does not link libibverbs: a process without it (a shell under `LD_PRELOAD`)
//! pays nothing, and the symbols come from whatever libibverbs the program loaded. They are
//! used only if (1) that library exports the version node `IBVERBS_PRIVATE_34` and (2) its
//! file is the release whose `driver.h` the private layouts in `abi.rs` were read from
//! (`libibverbs.so.1.14.44.*`, rdma-core 44): the private ABI number stayed 34 across
//! releases whose `verbs_context_ops` differ, so the number alone does not prove the table.
//! Anything else is refused with one stderr line naming what was found.

use core::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::abi::{PRIVATE_ABI, ibv_device, verbs_context, verbs_context_ops, verbs_device_ops};

/// The rdma-core release whose private layouts `abi.rs` pins.
pub const PINNED_RELEASE: u32 = 44;

pub type RegisterFn = unsafe extern "C" fn(*const verbs_device_ops);
pub type InitAllocFn =
    unsafe extern "C" fn(*mut ibv_device, c_int, usize, *mut verbs_context, u32) -> *mut c_void;
pub type SetOpsFn = unsafe extern "C" fn(*mut verbs_context, *const verbs_context_ops);
pub type UninitFn = unsafe extern "C" fn(*mut verbs_context);

/// The private entry points of the loaded libibverbs.
#[derive(Clone, Copy, Debug)]
pub struct Private {
    pub register: RegisterFn,
    pub init_and_alloc_context: InitAllocFn,
    pub set_ops: SetOpsFn,
    pub uninit_context: UninitFn,
}

fn vsym(name: &CStr) -> *mut c_void {
    // SAFETY: both strings are NUL-terminated and outlive the call; RTLD_NEXT searches the
    // objects loaded after this one (libibverbs), never our own unversioned definition.
    unsafe {
        libc::dlvsym(
            libc::RTLD_NEXT,
            name.as_ptr(),
            c"IBVERBS_PRIVATE_34".as_ptr(),
        )
    }
}

/// libibverbs' own `verbs_register_driver_34`, if the loaded libibverbs has ABI 34.
pub fn real_register() -> Option<RegisterFn> {
    let p = vsym(c"verbs_register_driver_34");
    // SAFETY: a non-null `verbs_register_driver_34@IBVERBS_PRIVATE_34` has this signature
    // (driver.h of ABI 34).
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, RegisterFn>(p) })
}

/// Whether a libibverbs is in the process at all.
pub fn libibverbs_loaded() -> bool {
    // SAFETY: a NUL-terminated name; the result is only compared with null.
    !unsafe { libc::dlsym(libc::RTLD_NEXT, c"ibv_get_device_list".as_ptr()) }.is_null()
}

/// The private calls, or `None` (refused, with the reason printed once).
pub fn get() -> Option<&'static Private> {
    static P: OnceLock<Result<Private, String>> = OnceLock::new();
    let r = P.get_or_init(resolve);
    match r {
        Ok(p) => Some(p),
        Err(why) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!("libmlx5rs: not registering: {why}; libmlx5 serves every device")
            });
            None
        }
    }
}

fn resolve() -> Result<Private, String> {
    let Some(register) = real_register() else {
        return Err(match other_abi() {
            Some(n) => format!(
                "the loaded libibverbs has the private ABI IBVERBS_PRIVATE_{n}, this provider \
                 supports only {PRIVATE_ABI}"
            ),
            None => format!("the loaded libibverbs does not export {PRIVATE_ABI}"),
        });
    };
    let file = library_file(register as *const c_void);
    match release_of(&file) {
        Some(PINNED_RELEASE) => {}
        Some(n) => {
            return Err(format!(
                "{file} is rdma-core {n}; the {PRIVATE_ABI} layouts here are rdma-core \
                 {PINNED_RELEASE}'s (docs/provider.md: adding an ABI)"
            ));
        }
        None => {
            return Err(format!(
                "cannot tell the rdma-core release of {file:?} (expected libibverbs.so.1.<n>.{PINNED_RELEASE}.<m>)"
            ));
        }
    }
    let need = |name: &CStr| {
        let p = vsym(name);
        if p.is_null() {
            Err(format!(
                "libibverbs lacks {}@{PRIVATE_ABI}",
                name.to_string_lossy()
            ))
        } else {
            Ok(p)
        }
    };
    let (a, s, u) = (
        need(c"_verbs_init_and_alloc_context")?,
        need(c"verbs_set_ops")?,
        need(c"verbs_uninit_context")?,
    );
    // SAFETY: each symbol is the ABI-34 function of that name, whose signature the type
    // states (driver.h of rdma-core 44, checked above to be the loaded release).
    unsafe {
        Ok(Private {
            register,
            init_and_alloc_context: core::mem::transmute::<*mut c_void, InitAllocFn>(a),
            set_ops: core::mem::transmute::<*mut c_void, SetOpsFn>(s),
            uninit_context: core::mem::transmute::<*mut c_void, UninitFn>(u),
        })
    }
}

/// The ABI number of a libibverbs without ABI 34 (`verbs_register_driver_<n>`), if any.
fn other_abi() -> Option<u32> {
    (1..=200u32).find(|n| {
        let name = std::ffi::CString::new(format!("verbs_register_driver_{n}")).unwrap_or_default();
        // SAFETY: a NUL-terminated name; the result is only compared with null.
        !unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }.is_null()
    })
}

/// The real path of the object that defines `addr`.
fn library_file(addr: *const c_void) -> String {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `info` is writable; dladdr fills it or returns 0.
    let ok = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    if ok == 0 {
        return String::new();
    }
    // SAFETY: dladdr succeeded, so `info` is initialized.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return String::new();
    }
    // SAFETY: `dli_fname` is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname.cast::<c_char>()) }
        .to_string_lossy()
        .into_owned();
    std::fs::canonicalize(&name)
        .map(|p| p.display().to_string())
        .unwrap_or(name)
}

/// `.../libibverbs.so.1.14.44.0` -> 44 (the rdma-core release is the third number).
pub fn release_of(file: &str) -> Option<u32> {
    let base = file.rsplit('/').next()?;
    let rest = base.strip_prefix("libibverbs.so.")?;
    let mut it = rest.split('.');
    let (_, _, rel) = (it.next()?, it.next()?, it.next()?);
    rel.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn release_is_read_from_the_file_name() {
        assert_eq!(
            super::release_of("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0"),
            Some(44)
        );
        assert_eq!(super::release_of("/x/libibverbs.so.1.14.57.0"), Some(57));
        assert_eq!(super::release_of("/x/libibverbs.so.1"), None);
        assert_eq!(super::release_of("/x/libfoo.so.1.14.44.0"), None);
    }
}
