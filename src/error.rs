//! The control-path error type. Fast-path errors are small `Copy` enums next to their operation
//! ([`PostError`](crate::PostError)); error completions are data, not errors.

use core::fmt;

pub use nix::errno::Errno;

/// Everything that can go wrong on the control path (open, create, modify, query, destroy).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The kernel (or the emulated kernel) rejected a uverbs command.
    Uverbs {
        /// The command, e.g. `"CREATE_QP"`.
        cmd: &'static str,
        /// The errno it returned.
        errno: Errno,
    },
    /// An OS call outside uverbs failed (open, mmap, madvise, sysfs read, poll, read).
    Os {
        /// What was being done, e.g. `"mmap(MAP_HUGETLB)"`.
        op: &'static str,
        /// The errno.
        errno: Errno,
    },
    /// A request exceeds a device or ABI limit; detected before any syscall.
    Limit {
        /// The attribute, named as in verbs (`max_inline_data`, `max_send_wr`, ...).
        attr: &'static str,
        /// The requested value.
        value: u64,
        /// The largest allowed value.
        limit: u64,
        /// Where the limit comes from, e.g. `"for RC"`, `"of the device"`.
        context: &'static str,
    },
    /// An argument is invalid for a reason other than a numeric limit.
    InvalidArgument {
        /// The attribute.
        attr: &'static str,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// An object of one device context was handed to an object or call of another (a CQ of
    /// context B to a QP on a PD of context A, ...). Kernel handles are numbers in a
    /// per-context table, so the kernel would resolve the handle in the wrong table; this is
    /// detected before any syscall.
    ContextMismatch {
        /// The object that belongs to another context, e.g. `"send_cq"`.
        object: &'static str,
        /// The object whose context it had to share, e.g. `"pd"`.
        with: &'static str,
    },
    /// A QP state transition the verbs state machine does not have for this QP type (RESET→RTR
    /// without INIT, SQE→RTS on RC, ...); detected before any syscall.
    QpTransition {
        /// The QP's transport.
        qp_type: crate::types::QpType,
        /// The state the QP is in (as last set through this driver).
        from: crate::types::QpState,
        /// The state asked for.
        to: crate::types::QpState,
    },
    /// An attribute the transition requires is missing from the mask, or one it does not take
    /// is in it (the kernel's required/optional masks); detected before any syscall.
    QpAttribute {
        /// The QP's transport.
        qp_type: crate::types::QpType,
        /// The state the QP is in.
        from: crate::types::QpState,
        /// The state asked for (the same one when only attributes are modified).
        to: crate::types::QpState,
        /// The attribute, named as the [`QpAttr`](crate::QpAttr) field.
        attr: &'static str,
        /// `true`: required but missing; `false`: present but not allowed.
        required: bool,
    },
    /// The device, kernel or this driver lacks something needed.
    Unsupported {
        /// What is missing.
        what: &'static str,
    },
    /// The kernel answered something this driver cannot use.
    BadResponse {
        /// The command whose answer was bad.
        cmd: &'static str,
        /// What was wrong with it.
        what: &'static str,
    },
    /// An ABI version in sysfs is outside the supported range.
    AbiVersion {
        /// Which ABI (`"uverbs"` or `"mlx5 provider"`).
        what: &'static str,
        /// Version found.
        found: u32,
        /// Lowest supported.
        min: u32,
        /// Highest supported.
        max: u32,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Uverbs { cmd, errno } => {
                write!(
                    f,
                    "uverbs command {cmd} failed: {errno:?} ({})",
                    errno.desc()
                )
            }
            Error::Os { op, errno } => write!(f, "{op} failed: {errno:?} ({})", errno.desc()),
            Error::Limit {
                attr,
                value,
                limit,
                context,
            } => {
                write!(
                    f,
                    "{attr} {value} exceeds the device limit {limit} {context}"
                )
            }
            Error::InvalidArgument { attr, reason } => write!(f, "invalid {attr}: {reason}"),
            Error::ContextMismatch { object, with } => {
                write!(f, "{object} belongs to another device context than {with}")
            }
            Error::QpTransition { qp_type, from, to } => write!(
                f,
                "{qp_type} QP {from} -> {to} is not a transition of the QP state machine"
            ),
            Error::QpAttribute {
                qp_type,
                from,
                to,
                attr,
                required,
            } => {
                let what = if *required {
                    "requires"
                } else {
                    "does not take"
                };
                write!(f, "{qp_type} QP {from} -> {to} {what} attribute {attr}")
            }
            Error::Unsupported { what } => write!(f, "unsupported: {what}"),
            Error::BadResponse { cmd, what } => write!(f, "bad response to {cmd}: {what}"),
            Error::AbiVersion {
                what,
                found,
                min,
                max,
            } => {
                write!(
                    f,
                    "{what} ABI version {found} is not supported (need {min}..={max})"
                )
            }
        }
    }
}

impl std::error::Error for Error {}

/// Result with the control-path [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;

impl Error {
    /// A failed uverbs command from a raw errno value.
    pub(crate) fn uverbs(cmd: &'static str, errno: i32) -> Self {
        Error::Uverbs {
            cmd,
            errno: Errno::from_raw(errno),
        }
    }

    /// Check `value <= limit`.
    pub(crate) fn check_limit(
        attr: &'static str,
        value: u64,
        limit: u64,
        context: &'static str,
    ) -> Result<()> {
        if value > limit {
            Err(Error::Limit {
                attr,
                value,
                limit,
                context,
            })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_message_names_attribute_value_and_limit() {
        let e = Error::check_limit("max_inline_data", 1100, 944, "for RC").unwrap_err();
        assert_eq!(
            e.to_string(),
            "max_inline_data 1100 exceeds the device limit 944 for RC"
        );
        let e = Error::uverbs("CREATE_QP", libc::EINVAL);
        assert!(e.to_string().contains("CREATE_QP"));
        assert!(e.to_string().contains("EINVAL"));
    }
}
