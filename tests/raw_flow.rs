//! Flow rules through the driver's CREATE_FLOW call site (`src/flow.rs`,
//! `src/uverbs/flow.rs`) on the emulated Ethernet port: the emulated kernel decodes what
//! the driver encodes and answers as mlx5_ib does. (The RAW_PACKET QP type of the driver is
//! the data-path issue's; until it exists a flow can only be refused: a rule for a UD QP
//! is EINVAL, `ib_uverbs_ex_create_flow`'s answer for a QP type that is not raw.)

mod common;

use std::net::Ipv4Addr;

use common::{EmuRig, PairOpts, Rig, side};
use mlx5::flow::{FlowRule, ipv4_multicast_mac};
use mlx5::{Error, QpType};

#[test]
fn a_rule_for_a_qp_that_is_not_raw_is_refused_as_the_kernel_refuses_it() {
    let rig = EmuRig::roce();
    let s = side(&rig as &dyn Rig, 0, &PairOpts::new(QpType::Ud));
    let g = Ipv4Addr::new(239, 1, 1, 1);
    let rule = FlowRule::new()
        .dst_mac(ipv4_multicast_mac(g))
        .ipv4_dst(g)
        .udp_dst_port(31_001);
    match s.qp.attach_flow(&rule) {
        Err(Error::Uverbs { cmd, errno }) => {
            assert_eq!(cmd, "EX_CREATE_FLOW");
            assert_eq!(errno, nix::errno::Errno::EINVAL);
        }
        other => panic!("expected EINVAL from EX_CREATE_FLOW, got {other:?}"),
    }
}
