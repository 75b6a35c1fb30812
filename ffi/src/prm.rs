//! The mlx5 PRM command mailboxes DEVX carries (`mlx5dv_devx_general_cmd`,
//! `mlx5dv_devx_obj_create/modify/query`): opcodes, firmware statuses, and the bit fields
//! of the mailboxes the emulated firmware reads and writes.
//!
//! No installed header describes these layouts (they live in the kernel's and rdma-core's
//! private `mlx5_ifc.h`); the numbers here are the PRM's, as those headers give them: a
//! field is `(bit offset from the start of the mailbox, width)`, bits counted from the most
//! significant bit of the first big-endian dword, as `MLX5_SET`/`MLX5_GET` count them.
//! The unit tests below pin the accessors; `tools/emu/tests/devx.rs` drives the fields through
//! libmlx5's `mlx5dv_devx_*` calls and UCX.

/// A PRM bit field: offset (bits, from the mailbox start) and width (bits, 1..=64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Bit offset from the start of the mailbox.
    pub bit: u32,
    /// Width in bits (1..=64).
    pub width: u32,
}

impl Field {
    /// A field at `bit` of `width` bits.
    pub const fn new(bit: u32, width: u32) -> Self {
        Field { bit, width }
    }

    /// The same field inside a structure that starts at bit `base` of the mailbox.
    pub const fn at(self, base: u32) -> Self {
        Field {
            bit: self.bit + base,
            width: self.width,
        }
    }

    /// Byte offset of a byte-aligned field (arrays such as GIDs and MACs).
    pub const fn byte(self) -> usize {
        (self.bit / 8) as usize
    }
}

/// Read `f` from `buf`; bits past the end of `buf` read as zero (a short mailbox is
/// zero-filled, as a caller's `char in[...] = {}` is).
pub fn get(buf: &[u8], f: Field) -> u64 {
    let mut v: u64 = 0;
    for i in 0..f.width.min(64) {
        let bit = (f.bit + i) as usize;
        let b = buf.get(bit / 8).map_or(0, |&x| (x >> (7 - bit % 8)) & 1);
        v = (v << 1) | u64::from(b);
    }
    v
}

/// Write the low `f.width` bits of `v` into `buf`; bits past the end of `buf` are dropped.
pub fn set(buf: &mut [u8], f: Field, v: u64) {
    let w = f.width.min(64);
    for i in 0..w {
        let bit = (f.bit + i) as usize;
        let val = ((v >> (w - 1 - i)) & 1) as u8;
        if let Some(x) = buf.get_mut(bit / 8) {
            let m = 1u8 << (7 - bit % 8);
            *x = (*x & !m) | (val * m);
        }
    }
}

/// PRM opcodes.
pub mod op {
    pub const QUERY_HCA_CAP: u16 = 0x100;
    pub const QUERY_ADAPTER: u16 = 0x101;
    pub const CREATE_MKEY: u16 = 0x200;
    pub const QUERY_MKEY: u16 = 0x201;
    pub const DESTROY_MKEY: u16 = 0x202;
    pub const CREATE_CQ: u16 = 0x400;
    pub const CREATE_QP: u16 = 0x500;
    pub const DESTROY_QP: u16 = 0x501;
    pub const RST2INIT_QP: u16 = 0x502;
    pub const INIT2RTR_QP: u16 = 0x503;
    pub const RTR2RTS_QP: u16 = 0x504;
    pub const RTS2RTS_QP: u16 = 0x505;
    pub const SQERR2RTS_QP: u16 = 0x506;
    pub const TO_ERR_QP: u16 = 0x507;
    pub const TO_RST_QP: u16 = 0x50a;
    pub const QUERY_QP: u16 = 0x50b;
    pub const INIT2INIT_QP: u16 = 0x50e;
    pub const CREATE_SRQ: u16 = 0x700;
    pub const CREATE_DCT: u16 = 0x710;
    pub const DESTROY_DCT: u16 = 0x711;
    pub const DRAIN_DCT: u16 = 0x712;
    pub const QUERY_DCT: u16 = 0x713;
    pub const ARM_DCT_FOR_KEY_VIOLATION: u16 = 0x714;
    pub const CREATE_XRQ: u16 = 0x717;
    pub const QUERY_ESW_FUNCTIONS: u16 = 0x740;
    pub const QUERY_ESW_VPORT_CONTEXT: u16 = 0x752;
    pub const QUERY_NIC_VPORT_CONTEXT: u16 = 0x754;
    pub const QUERY_ROCE_ADDRESS: u16 = 0x760;
    pub const QUERY_HCA_VPORT_CONTEXT: u16 = 0x762;
    pub const QUERY_LAG: u16 = 0x842;
    pub const CREATE_RMP: u16 = 0x90c;
    pub const DESTROY_RMP: u16 = 0x90e;
    pub const QUERY_RMP: u16 = 0x90f;
    pub const CREATE_GENERAL_OBJECT: u16 = 0xa00;
}

/// Firmware command statuses (`status` of every output mailbox).
pub mod status {
    pub const OK: u8 = 0x0;
    pub const BAD_OP: u8 = 0x2;
    pub const BAD_PARAM: u8 = 0x3;
    pub const BAD_RES: u8 = 0x5;
    pub const LIM: u8 = 0x8;
    pub const BAD_RES_STATE: u8 = 0x9;
    pub const BAD_QP_STATE: u8 = 0x10;
    pub const BAD_INP_LEN: u8 = 0x50;
}

/// QUERY_HCA_CAP `op_mod`: bit 0 current (1) or maximum (0), bits 1.. the capability type.
pub mod cap_type {
    pub const GENERAL: u16 = 0x0;
    pub const ETHERNET_OFFLOADS: u16 = 0x1;
    pub const ODP: u16 = 0x2;
    pub const ATOMIC: u16 = 0x3;
    pub const ROCE: u16 = 0x4;
    pub const NIC_FLOW_TABLE: u16 = 0x7;
    pub const QOS: u16 = 0xc;
    pub const DEVICE_MEMORY: u16 = 0xf;
    pub const CRYPTO: u16 = 0x1a;
    pub const GENERAL_2: u16 = 0x20;
}

/// Every input mailbox's header.
pub mod hdr {
    use super::Field;
    pub const OPCODE: Field = Field::new(0x00, 16);
    pub const UID: Field = Field::new(0x10, 16);
    pub const OP_MOD: Field = Field::new(0x30, 16);
    /// The object number of the QP commands (`qpn` of modify/query/destroy).
    pub const QPN: Field = Field::new(0x48, 24);
    /// Every output mailbox's status and syndrome.
    pub const STATUS: Field = Field::new(0x00, 8);
    pub const SYNDROME: Field = Field::new(0x20, 32);
}

/// `query_hca_cap_out`: 16 bytes of header, then the capability page.
pub mod hca_cap {
    use super::Field;
    /// Bytes of the output mailbox (header + a 4 KiB page).
    pub const OUT_BYTES: usize = 0x10 + 0x1000;
    /// Where the page starts, bits.
    pub const PAGE: u32 = 0x80;
    /// `cmd_hca_cap` fields (offsets within the page).
    pub const LOG_MAX_SRQ_SZ: Field = Field::new(0x80, 8);
    pub const LOG_MAX_QP_SZ: Field = Field::new(0x88, 8);
    pub const LOG_MAX_QP: Field = Field::new(0x9b, 5);
    pub const LOG_MAX_SRQ: Field = Field::new(0xab, 5);
    pub const LOG_MAX_CQ_SZ: Field = Field::new(0xc8, 8);
    pub const LOG_MAX_CQ: Field = Field::new(0xdb, 5);
    pub const LOG_MAX_MKEY: Field = Field::new(0xea, 6);
    pub const LOG_MAX_EQ: Field = Field::new(0xfc, 4);
    pub const LOG_MAX_RA_REQ_DC: Field = Field::new(0x12a, 6);
    pub const LOG_MAX_RA_RES_DC: Field = Field::new(0x13a, 6);
    pub const LOG_MAX_RA_REQ_QP: Field = Field::new(0x14a, 6);
    pub const LOG_MAX_RA_RES_QP: Field = Field::new(0x15a, 6);
    pub const PORT_TYPE: Field = Field::new(0x1b6, 2);
    pub const NUM_PORTS: Field = Field::new(0x1b8, 8);
    pub const LOG_MAX_MSG: Field = Field::new(0x1c3, 5);
    pub const MAX_TC: Field = Field::new(0x1cc, 4);
    pub const CQE_VERSION: Field = Field::new(0x1fc, 4);
    /// KSM memory keys (fixed-size translation entries) are supported.
    pub const FIXED_BUFFER_SIZE: Field = Field::new(0x108, 1);
    pub const UMR_MODIFY_ATOMIC_DISABLED: Field = Field::new(0x208, 1);
    pub const DCT: Field = Field::new(0x21a, 1);
    pub const ETH_NET_OFFLOADS: Field = Field::new(0x21c, 1);
    pub const ROCE: Field = Field::new(0x21d, 1);
    pub const ATOMIC: Field = Field::new(0x21e, 1);
    pub const PG: Field = Field::new(0x227, 1);
    pub const XRC: Field = Field::new(0x23c, 1);
    pub const UD: Field = Field::new(0x23d, 1);
    pub const UC: Field = Field::new(0x23e, 1);
    pub const RC: Field = Field::new(0x23f, 1);
    pub const LOG_BF_REG_SIZE: Field = Field::new(0x26b, 5);
    pub const LAG_DCT: Field = Field::new(0x276, 2);
    pub const NUM_LAG_PORTS: Field = Field::new(0x27c, 4);
    pub const LOG_MAX_PD: Field = Field::new(0x32b, 5);
    pub const LOG_MAX_XRCD: Field = Field::new(0x33b, 5);
    pub const LOG_MAX_RMP: Field = Field::new(0x383, 5);
    pub const LOG_UAR_PAGE_SZ: Field = Field::new(0x490, 16);
    /// `atomic_caps` fields (offsets within the page).
    pub const ATOMIC_REQ_8B_ENDIANNESS_MODE: Field = Field::new(0x40, 2);
    pub const ATOMIC_OPERATIONS: Field = Field::new(0x90, 16);
    pub const ATOMIC_SIZE_QP: Field = Field::new(0xb0, 16);
    pub const ATOMIC_SIZE_DC: Field = Field::new(0xd0, 16);
    /// `atomic_operations` bits.
    pub const ATOMIC_OPS_CMP_SWAP: u64 = 1 << 0;
    pub const ATOMIC_OPS_FETCH_ADD: u64 = 1 << 1;
    pub const ATOMIC_OPS_MASKED_CMP_SWAP: u64 = 1 << 2;
    pub const ATOMIC_OPS_MASKED_FETCH_ADD: u64 = 1 << 3;
    /// `port_type` values.
    pub const PORT_TYPE_IB: u64 = 0;
    pub const PORT_TYPE_ETH: u64 = 1;
}

/// The QP commands: `create_qp_in`, the `*2*_qp_in` transitions (same layout: header,
/// `qpn`, `opt_param_mask`, a QPC at 0xc0), `query_qp_out` (QPC at 0xc0 too).
pub mod qp {
    use super::Field;
    /// Bytes of `create_qp_in` without the page list, and of the transition inputs.
    pub const IN_BYTES: usize = 0x110;
    /// Bytes of the transitions' and `create_qp`'s output.
    pub const OUT_BYTES: usize = 0x10;
    /// Bytes of `query_qp_out` without the page list.
    pub const QUERY_OUT_BYTES: usize = 0x110;
    /// Bytes of `modify_qp_in` (2ERR / 2RST) and `query_qp_in`.
    pub const SHORT_IN_BYTES: usize = 0x10;
    pub const OPT_PARAM_MASK: Field = Field::new(0x80, 32);
    /// `opt_param_mask` bits: remote read, atomic, write enables.
    pub const OPTPAR_RRE: u64 = 1 << 1;
    pub const OPTPAR_RAE: u64 = 1 << 2;
    pub const OPTPAR_RWE: u64 = 1 << 3;
    /// Where the QPC starts, bits.
    pub const QPC: u32 = 0xc0;
    pub const WQ_UMEM_OFFSET: Field = Field::new(0x800, 64);
    pub const WQ_UMEM_ID: Field = Field::new(0x840, 32);
    pub const WQ_UMEM_VALID: Field = Field::new(0x860, 1);
    /// `create_qp_out.qpn`.
    pub const OUT_QPN: Field = Field::new(0x48, 24);
}

/// QPC fields (offsets within the QPC).
pub mod qpc {
    use super::Field;
    pub const STATE: Field = Field::new(0x00, 4);
    pub const ST: Field = Field::new(0x08, 8);
    pub const PM_STATE: Field = Field::new(0x13, 2);
    pub const OFFLOAD_TYPE: Field = Field::new(0x18, 4);
    pub const WQ_SIGNATURE: Field = Field::new(0x20, 1);
    pub const PD: Field = Field::new(0x28, 24);
    pub const MTU: Field = Field::new(0x40, 3);
    pub const LOG_MSG_MAX: Field = Field::new(0x43, 5);
    pub const LOG_RQ_SIZE: Field = Field::new(0x49, 4);
    pub const LOG_RQ_STRIDE: Field = Field::new(0x4d, 3);
    pub const NO_SQ: Field = Field::new(0x50, 1);
    pub const LOG_SQ_SIZE: Field = Field::new(0x51, 4);
    pub const UAR_PAGE: Field = Field::new(0x68, 24);
    pub const FULL_HANDSHAKE: Field = Field::new(0x83, 1);
    pub const USER_INDEX: Field = Field::new(0x88, 24);
    pub const REMOTE_QPN: Field = Field::new(0xa8, 24);
    /// The primary address path starts here (an `ads`).
    pub const PRIMARY_PATH: u32 = 0xc0;
    pub const LOG_ACK_REQ_FREQ: Field = Field::new(0x380, 4);
    pub const LOG_SRA_MAX: Field = Field::new(0x388, 3);
    pub const RETRY_COUNT: Field = Field::new(0x38d, 3);
    pub const RNR_RETRY: Field = Field::new(0x390, 3);
    pub const NEXT_SEND_PSN: Field = Field::new(0x3c8, 24);
    pub const CQN_SND: Field = Field::new(0x3e8, 24);
    pub const LOG_RRA_MAX: Field = Field::new(0x488, 3);
    pub const ATOMIC_MODE: Field = Field::new(0x48c, 4);
    pub const RRE: Field = Field::new(0x490, 1);
    pub const RWE: Field = Field::new(0x491, 1);
    pub const RAE: Field = Field::new(0x492, 1);
    pub const MIN_RNR_NAK: Field = Field::new(0x4a3, 5);
    pub const NEXT_RCV_PSN: Field = Field::new(0x4a8, 24);
    pub const CQN_RCV: Field = Field::new(0x4e8, 24);
    pub const DBR_ADDR: Field = Field::new(0x500, 64);
    pub const Q_KEY: Field = Field::new(0x540, 32);
    pub const RQ_TYPE: Field = Field::new(0x565, 3);
    pub const SRQN_RMPN_XRQN: Field = Field::new(0x568, 24);
    pub const DC_ACCESS_KEY: Field = Field::new(0x640, 64);
    pub const DBR_UMEM_VALID: Field = Field::new(0x683, 1);
    pub const DBR_UMEM_ID: Field = Field::new(0x720, 32);

    /// `st` values.
    pub const ST_RC: u64 = 0x0;
    pub const ST_UC: u64 = 0x1;
    pub const ST_UD: u64 = 0x2;
    pub const ST_XRC: u64 = 0x3;
    pub const ST_DCI: u64 = 0x5;
    /// `state` values.
    pub const STATE_RST: u64 = 0x0;
    pub const STATE_INIT: u64 = 0x1;
    pub const STATE_RTR: u64 = 0x2;
    pub const STATE_RTS: u64 = 0x3;
    pub const STATE_SQER: u64 = 0x4;
    pub const STATE_ERR: u64 = 0x6;
    pub const STATE_SQD: u64 = 0x7;
    /// `rq_type` values.
    pub const RQ_REGULAR: u64 = 0x0;
    pub const RQ_SRQ: u64 = 0x1;
    pub const RQ_ZERO: u64 = 0x3;
}

/// The address path (`ads`; offsets within it).
pub mod ads {
    use super::Field;
    pub const PKEY_INDEX: Field = Field::new(0x10, 16);
    pub const GRH: Field = Field::new(0x28, 1);
    pub const MLID: Field = Field::new(0x29, 7);
    pub const RLID: Field = Field::new(0x30, 16);
    pub const ACK_TIMEOUT: Field = Field::new(0x40, 5);
    pub const SRC_ADDR_INDEX: Field = Field::new(0x48, 8);
    pub const STAT_RATE: Field = Field::new(0x54, 4);
    pub const HOP_LIMIT: Field = Field::new(0x58, 8);
    pub const TCLASS: Field = Field::new(0x64, 8);
    pub const FLOW_LABEL: Field = Field::new(0x6c, 20);
    /// 16 bytes.
    pub const RGID_RIP: Field = Field::new(0x80, 128);
    pub const DSCP: Field = Field::new(0x10a, 6);
    pub const UDP_SPORT: Field = Field::new(0x110, 16);
    pub const ETH_PRIO: Field = Field::new(0x121, 3);
    pub const SL: Field = Field::new(0x124, 4);
    pub const VHCA_PORT_NUM: Field = Field::new(0x128, 8);
    /// 6 bytes (47..32 then 31..0).
    pub const RMAC: Field = Field::new(0x130, 48);
}

/// `create_dct_in` (the DCT context at 0x80) and `create_dct_out`.
pub mod dct {
    use super::Field;
    pub const IN_BYTES: usize = 0x80;
    pub const OUT_BYTES: usize = 0x10;
    /// Where the DCT context starts, bits.
    pub const DCTC: u32 = 0x80;
    pub const OUT_DCTN: Field = Field::new(0x48, 24);
    /// `query_dct_out`: header then the DCT context at 0x80.
    pub const QUERY_OUT_BYTES: usize = 0x80;
    /// `destroy_dct_in` / `drain_dct_in` / `query_dct_in`: `dctn`.
    pub const IN_DCTN: Field = Field::new(0x48, 24);
    /// DCT context fields (offsets within it).
    pub const STATE: Field = Field::new(0x04, 4);
    pub const USER_INDEX: Field = Field::new(0x28, 24);
    pub const CQN: Field = Field::new(0x48, 24);
    pub const RRE: Field = Field::new(0x6c, 1);
    pub const RWE: Field = Field::new(0x6d, 1);
    pub const RAE: Field = Field::new(0x6e, 1);
    pub const MIN_RNR_NAK: Field = Field::new(0x93, 5);
    pub const SRQN_XRQN: Field = Field::new(0xa8, 24);
    pub const PD: Field = Field::new(0xc8, 24);
    pub const TCLASS: Field = Field::new(0xe0, 8);
    pub const FLOW_LABEL: Field = Field::new(0xec, 20);
    pub const DC_ACCESS_KEY: Field = Field::new(0x100, 64);
    pub const MTU: Field = Field::new(0x145, 3);
    pub const PORT: Field = Field::new(0x148, 8);
    pub const PKEY_INDEX: Field = Field::new(0x150, 16);
    pub const MY_ADDR_INDEX: Field = Field::new(0x168, 8);
    pub const HOP_LIMIT: Field = Field::new(0x178, 8);
    /// DCT `state` values.
    pub const STATE_ACTIVE: u64 = 0x1;
}

/// `create_rmp_in` (an RMP context at 0x100, its WQ at 0x280) and `create_rmp_out`.
pub mod rmp {
    use super::Field;
    pub const IN_BYTES: usize = 0x110;
    pub const OUT_BYTES: usize = 0x10;
    pub const OUT_RMPN: Field = Field::new(0x48, 24);
    /// `destroy_rmp_in.rmpn`.
    pub const IN_RMPN: Field = Field::new(0x48, 24);
    pub const STATE: Field = Field::new(0x108, 4);
    /// Where the WQ context starts, bits.
    pub const WQ: u32 = 0x280;
    /// WQ context fields (offsets within it).
    pub const WQ_TYPE: Field = Field::new(0x00, 4);
    pub const WQ_SIGNATURE: Field = Field::new(0x04, 1);
    pub const PD: Field = Field::new(0x48, 24);
    pub const DBR_ADDR: Field = Field::new(0x80, 64);
    pub const LOG_WQ_STRIDE: Field = Field::new(0x10c, 4);
    pub const LOG_WQ_SZ: Field = Field::new(0x11b, 5);
    pub const DBR_UMEM_ID: Field = Field::new(0x140, 32);
    pub const WQ_UMEM_ID: Field = Field::new(0x160, 32);
    /// `state`: ready.
    pub const STATE_RDY: u64 = 0x1;
    /// `wq_type`: linked list and cyclic (no striding).
    pub const WQ_LINKED_LIST: u64 = 0x0;
    pub const WQ_CYCLIC: u64 = 0x1;
}

/// CREATE_MKEY / DESTROY_MKEY (`create_mkey_in`, `mkc`, `klm`): an indirect memory key
/// whose translation is a list of (key, address) entries.
pub mod mkey {
    use super::Field;
    /// Where the memory key context starts in `create_mkey_in`, bits.
    pub const MKC: u32 = 0x80;
    /// `create_mkey_in.mkey_umem_valid`.
    pub const UMEM_VALID: Field = Field::new(0x61, 1);
    /// `create_mkey_in.translations_octword_actual_size`.
    pub const ACTUAL_SIZE: Field = Field::new(0x300, 32);
    /// Where the translation entries start in `create_mkey_in`, bytes.
    pub const ENTRIES_BYTE: usize = 0x110;
    /// `create_mkey_out.mkey_index`; also `destroy_mkey_in.mkey_index`.
    pub const INDEX: Field = Field::new(0x48, 24);
    pub const OUT_BYTES: usize = 0x10;
    /// mkc fields (offsets within it).
    pub const FREE: Field = Field::new(0x01, 1);
    pub const ACCESS_MODE_4_2: Field = Field::new(0x03, 3);
    pub const UMR_EN: Field = Field::new(0x10, 1);
    pub const A: Field = Field::new(0x11, 1);
    pub const RW: Field = Field::new(0x12, 1);
    pub const RR: Field = Field::new(0x13, 1);
    pub const LW: Field = Field::new(0x14, 1);
    pub const LR: Field = Field::new(0x15, 1);
    pub const ACCESS_MODE_1_0: Field = Field::new(0x16, 2);
    pub const QPN: Field = Field::new(0x20, 24);
    pub const MKEY_7_0: Field = Field::new(0x38, 8);
    pub const LENGTH64: Field = Field::new(0x60, 1);
    pub const BSF_EN: Field = Field::new(0x61, 1);
    pub const PD: Field = Field::new(0x68, 24);
    pub const START_ADDR: Field = Field::new(0x80, 64);
    pub const LEN: Field = Field::new(0xc0, 64);
    pub const TRANSLATIONS_OCTWORD_SIZE: Field = Field::new(0x1a0, 32);
    pub const LOG_ENTITY_SIZE: Field = Field::new(0x1db, 5);
    /// `access_mode`: KLM (entries of their own byte count) and KSM (entries of
    /// 2^log_entity_size bytes each).
    pub const MODE_KLM: u64 = 0x2;
    pub const MODE_KSM: u64 = 0x3;
    /// One KLM/KSM entry (16 bytes): byte count (KLM only), key, address.
    pub const ENTRY_BYTES: usize = 16;
    pub const E_BYTE_COUNT: Field = Field::new(0x00, 32);
    pub const E_MKEY: Field = Field::new(0x20, 32);
    pub const E_ADDRESS: Field = Field::new(0x40, 64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_ignore_bits_past_the_end() {
        let mut b = [0u8; 8];
        set(&mut b, Field::new(0, 16), 0x0500);
        assert_eq!(&b[..2], &[0x05, 0x00]);
        set(&mut b, Field::new(40, 24), 0xabcdef);
        assert_eq!(&b[5..8], &[0xab, 0xcd, 0xef]);
        assert_eq!(get(&b, Field::new(40, 24)), 0xabcdef);
        set(&mut b, Field::new(19, 2), 3);
        assert_eq!(b[2], 0b0001_1000);
        assert_eq!(get(&b, Field::new(19, 2)), 3);
        // Past the end: reads zero, writes nothing.
        assert_eq!(get(&b, Field::new(60, 16)), 0xf000);
        set(&mut b, Field::new(64, 32), u64::MAX);
        assert_eq!(b.len(), 8);
        let mut w = [0u8; 16];
        set(&mut w, Field::new(0, 64), 0x0102_0304_0506_0708);
        assert_eq!(get(&w, Field::new(0, 64)), 0x0102_0304_0506_0708);
        assert_eq!(&w[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
