//! The words every layer of the driver speaks: the QP transport type and state, the path MTU,
//! the scatter/gather element, and the bit-set helper of the flag types. Imports nothing of the
//! crate, so that the error type, the rings and the objects can all name them.

use mlx5_ffi::uverbs::{IB_MTU_256, IB_MTU_512, IB_MTU_1024, IB_MTU_2048, IB_MTU_4096};
use mlx5_ffi::uverbs::{qp_state, qp_type};

/// QP transport type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// XRC initiator (`IBV_QPT_XRC_SEND`): RC whose every WQE names the remote XRC SRQ in a
    /// 16-byte segment right after the control segment.
    XrcSend,
    /// DC initiator (mlx5 DCI, a driver QP type): RC semantics, every WQE carries the target's
    /// 48-byte address vector (DCT number and access key) after the control segment.
    Dci,
    /// Raw Ethernet (`IBV_QPT_RAW_PACKET`): every WQE carries a 32-byte Ethernet segment with
    /// the packet's first bytes inline after the control segment.
    RawPacket,
}

impl QpType {
    pub(crate) fn ib_value(self) -> u8 {
        match self {
            QpType::Rc => qp_type::RC,
            QpType::Uc => qp_type::UC,
            QpType::Ud => qp_type::UD,
            QpType::XrcSend => qp_type::XRC_INI,
            QpType::Dci => qp_type::DRIVER,
            QpType::RawPacket => qp_type::RAW_PACKET,
        }
    }

    /// RC or UC: no transport segment between the control segment and the operation's own
    /// (the WQEs of the plain send paths).
    pub(crate) const fn is_plain_connected(self) -> bool {
        matches!(self, QpType::Rc | QpType::Uc)
    }

    pub(crate) fn limit_context(self) -> &'static str {
        match self {
            QpType::Rc => "for RC",
            QpType::Uc => "for UC",
            QpType::Ud => "for UD",
            QpType::XrcSend => "for XRC_SEND",
            QpType::Dci => "for DCI",
            QpType::RawPacket => "for RAW_PACKET",
        }
    }
}

impl core::fmt::Display for QpType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::XrcSend => "XRC_SEND",
            QpType::Dci => "DCI",
            QpType::RawPacket => "RAW_PACKET",
        })
    }
}

/// QP state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialized: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: everything outstanding is flushed.
    Err,
}

impl QpState {
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            QpState::Reset => qp_state::RESET,
            QpState::Init => qp_state::INIT,
            QpState::Rtr => qp_state::RTR,
            QpState::Rts => qp_state::RTS,
            QpState::Sqd => qp_state::SQD,
            QpState::Sqe => qp_state::SQE,
            QpState::Err => qp_state::ERR,
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            qp_state::RESET => QpState::Reset,
            qp_state::INIT => QpState::Init,
            qp_state::RTR => QpState::Rtr,
            qp_state::RTS => QpState::Rts,
            qp_state::SQD => QpState::Sqd,
            qp_state::SQE => QpState::Sqe,
            qp_state::ERR => QpState::Err,
            _ => return None,
        })
    }
}

impl core::fmt::Display for QpState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        })
    }
}

/// Path MTU (`enum ibv_mtu`): the largest payload of one packet on the path. The verbs ABI
/// carries it as a code (`IB_MTU_256` = 1 ... `IB_MTU_4096` = 5), never as a byte count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    M256,
    /// 512 bytes.
    M512,
    /// 1024 bytes.
    M1024,
    /// 2048 bytes.
    M2048,
    /// 4096 bytes.
    M4096,
}

impl Mtu {
    /// The `IB_MTU_*` code the kernel takes (1..=5).
    pub const fn code(self) -> u8 {
        (match self {
            Mtu::M256 => IB_MTU_256,
            Mtu::M512 => IB_MTU_512,
            Mtu::M1024 => IB_MTU_1024,
            Mtu::M2048 => IB_MTU_2048,
            Mtu::M4096 => IB_MTU_4096,
        }) as u8
    }

    /// The MTU of an `IB_MTU_*` code (as in [`PortAttr::active_mtu`](crate::PortAttr)), if
    /// valid.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code as u32 {
            IB_MTU_256 => Mtu::M256,
            IB_MTU_512 => Mtu::M512,
            IB_MTU_1024 => Mtu::M1024,
            IB_MTU_2048 => Mtu::M2048,
            IB_MTU_4096 => Mtu::M4096,
            _ => return None,
        })
    }

    /// The MTU in bytes.
    pub const fn bytes(self) -> u32 {
        256 << (self.code() - 1)
    }

    /// The MTU of exactly `bytes` (256, 512, 1024, 2048 or 4096), if it is one.
    pub const fn from_bytes(bytes: u32) -> Option<Self> {
        Some(match bytes {
            256 => Mtu::M256,
            512 => Mtu::M512,
            1024 => Mtu::M1024,
            2048 => Mtu::M2048,
            4096 => Mtu::M4096,
            _ => return None,
        })
    }
}

/// From an `IB_MTU_*` code; the error is the refused code. (A byte count such as
/// `4096u16 as u8` is 0 and refused.)
impl TryFrom<u8> for Mtu {
    type Error = u8;
    fn try_from(code: u8) -> core::result::Result<Self, u8> {
        Mtu::from_code(code).ok_or(code)
    }
}

/// A scatter/gather element (`struct ibv_sge`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Start address (in a registered memory region).
    pub addr: u64,
    /// Length in bytes. Zero-length SGEs are skipped (a data segment of 0 means 2 GiB).
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

/// Implements `contains` and `|` for a `pub struct $name(pub u32)` bit set.
macro_rules! bit_set {
    ($name:ident) => {
        impl $name {
            /// The empty set (no bit set), as `bitflags` types spell it.
            pub const fn empty() -> Self {
                Self(0)
            }

            /// Whether no bit is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// The raw bits, as the verbs ABI carries them.
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// Whether every bit of `other` is set.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether any bit of `other` is set.
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }

            /// The bits of `self` and of `other`.
            pub const fn union(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }

            /// The bits of `self` that are not in `other`.
            pub const fn difference(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }
        }

        impl core::ops::BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }

        impl core::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }

        impl core::ops::BitAnd for $name {
            type Output = Self;
            fn bitand(self, rhs: Self) -> Self {
                Self(self.0 & rhs.0)
            }
        }
    };
}
pub(crate) use bit_set;
