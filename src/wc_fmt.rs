//! How work completions print: names over numbers.
//!
//! [`WcOpcode`] prints by name (`SEND`, `RDMA_WRITE`, `RECV_RDMA_WITH_IMM`, ...) in both `Debug`
//! and `Display`; an opcode the verbs enum does not name prints as `WcOpcode(0x..)`.
//! [`WorkCompletion`]'s `Display` is one line for a success; an error adds the syndrome pair (the vendor
//! byte decoded) and the explanation from the `mlx5-hw` table, as three more lines that begin with `meaning:`,
//! `causes:` and `check:`.

use core::fmt;

use mlx5_hw::cqe::explain;
use mlx5_hw::syndrome::vendor_meaning;

use crate::wr::{WcFlags, WcOpcode, WorkCompletion};

impl WcOpcode {
    /// Every opcode of `enum ibv_wc_opcode` this driver can report or a user may meet, with its
    /// name (the verbs name without the `IBV_WC_` prefix).
    pub const NAMES: &'static [(WcOpcode, &'static str)] = &[
        (WcOpcode::SEND, "SEND"),
        (WcOpcode::RDMA_WRITE, "RDMA_WRITE"),
        (WcOpcode::RDMA_READ, "RDMA_READ"),
        (WcOpcode::COMP_SWAP, "COMP_SWAP"),
        (WcOpcode::FETCH_ADD, "FETCH_ADD"),
        (WcOpcode(5), "BIND_MW"),
        (WcOpcode(6), "LOCAL_INV"),
        (WcOpcode(7), "TSO"),
        (WcOpcode(8), "FLUSH"),
        (WcOpcode(9), "ATOMIC_WRITE"),
        (WcOpcode::RECV, "RECV"),
        (WcOpcode::RECV_RDMA_WITH_IMM, "RECV_RDMA_WITH_IMM"),
    ];

    /// The verbs name of this opcode, `None` for a value `enum ibv_wc_opcode` does not name.
    pub fn name(self) -> Option<&'static str> {
        Self::NAMES
            .iter()
            .find(|(o, _)| *o == self)
            .map(|(_, n)| *n)
    }
}

impl fmt::Debug for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "WcOpcode({:#x})", self.0),
        }
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl fmt::Display for WorkCompletion {
    /// `wr_id 7 SEND SUCCESS qp 0x12 byte_len 64` for a success (plus `imm 0x..`, `src_qp`,
    /// `slid`, ... where set); for an error, the opcode is left out (undefined in `ibv_wc`) and
    /// `syndrome NAME(0x..) vendor_err 0x..` plus the explanation lines follow.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wr_id {}", self.wr_id)?;
        if !self.is_ok() {
            write!(
                f,
                " {} qp {:#x} syndrome {:?} vendor_err {:#04x}",
                self.status, self.qp_num, self.syndrome, self.vendor_err.0
            )?;
            match (vendor_meaning(self.vendor_err), self.vendor_err.name()) {
                (Some(m), _) => write!(f, " ({m})")?,
                (None, Some(n)) => write!(f, " ({n})")?,
                (None, None) => {}
            }
            if let Some(x) = explain(self.syndrome, self.vendor_err) {
                for (k, t) in x.lines() {
                    write!(f, "\n{k}: {t}")?;
                }
            }
            return Ok(());
        }
        write!(
            f,
            " {} {} qp {:#x} byte_len {}",
            self.opcode, self.status, self.qp_num, self.byte_len
        )?;
        if self.wc_flags.contains(WcFlags::WITH_IMM) {
            write!(f, " imm 0x{:08x}", u32::from_be_bytes(self.imm_data))?;
        }
        if self.wc_flags.contains(WcFlags::WITH_INV) {
            write!(f, " invalidated_rkey {:#x}", self.invalidated_rkey)?;
        }
        if self.wc_flags.contains(WcFlags::GRH) {
            f.write_str(" grh")?;
        }
        if self.opcode.0 >= WcOpcode::RECV.0 {
            write!(
                f,
                " src_qp {:#x} slid {} sl {}",
                self.src_qp, self.slid, self.sl
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::{Syndrome, VendorSyndrome, WcStatus};

    #[test]
    fn opcodes_print_by_name_in_debug_and_display() {
        for (o, n) in WcOpcode::NAMES {
            assert_eq!(format!("{o:?}"), *n);
            assert_eq!(format!("{o}"), *n);
        }
        assert_eq!(
            format!("{:?}", WcOpcode::RECV_RDMA_WITH_IMM),
            "RECV_RDMA_WITH_IMM"
        );
        assert_eq!(format!("{:?}", WcOpcode(0x77)), "WcOpcode(0x77)");
        let wc = WorkCompletion {
            opcode: WcOpcode::RDMA_WRITE,
            ..Default::default()
        };
        assert!(format!("{wc:?}").contains("opcode: RDMA_WRITE"));
    }

    #[test]
    fn success_is_one_line_with_names() {
        let wc = WorkCompletion {
            wr_id: 7,
            opcode: WcOpcode::RECV,
            byte_len: 64,
            qp_num: 0x12,
            src_qp: 0x34,
            wc_flags: WcFlags::WITH_IMM,
            imm_data: [0xde, 0xad, 0xbe, 0xef],
            ..Default::default()
        };
        let s = wc.to_string();
        assert_eq!(
            s,
            "wr_id 7 RECV SUCCESS qp 0x12 byte_len 64 imm 0xdeadbeef src_qp 0x34 slid 0 sl 0"
        );
    }

    #[test]
    fn error_shows_syndromes_and_the_explanation() {
        let wc = WorkCompletion {
            wr_id: 3,
            status: WcStatus::RETRY_EXC_ERR,
            syndrome: Syndrome::TRANSPORT_RETRY_EXC,
            vendor_err: VendorSyndrome::TRANSPORT_RETRY_EXC,
            qp_num: 0x21,
            ..Default::default()
        };
        let s = wc.to_string();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 4, "{s}");
        assert_eq!(
            lines[0],
            "wr_id 3 RETRY_EXC_ERR qp 0x21 syndrome TRANSPORT_RETRY_EXC(0x15) vendor_err 0x81 (requester transport: request timeout, retry counter exceeded)"
        );
        assert!(lines[1].starts_with("meaning: transport retry counter exceeded"));
        assert!(lines[2].starts_with("causes: ") && lines[2].contains("RTR/RTS"));
        assert!(lines[3].starts_with("check: ") && lines[3].contains("retry_cnt"));
        // An unknown syndrome pair still prints, without explanation lines.
        let wc = WorkCompletion {
            status: WcStatus::GENERAL_ERR,
            syndrome: Syndrome(0x77),
            vendor_err: VendorSyndrome(0x4e),
            ..Default::default()
        };
        let s = wc.to_string();
        assert_eq!(s.lines().count(), 1);
        assert!(
            s.ends_with("syndrome Syndrome(0x77) vendor_err 0x4e"),
            "{s}"
        );
    }
}
