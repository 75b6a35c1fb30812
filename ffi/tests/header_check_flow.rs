//! Proves `mlx5_ffi::flow` (the flow steering ABI) against the installed headers: every
//! struct's size and every field's offset and size against `<rdma/ib_user_verbs.h>`, every
//! constant against `<rdma/ib_user_verbs.h>` / `<infiniband/verbs.h>` (where libibverbs
//! repeats the kernel's non-uapi spec numbers as `IBV_FLOW_*`). A C program printing the
//! header's view is compiled with `cc` and its output compared with the Rust view.

use std::fmt::Write as _;
use std::process::Command;

use mlx5_ffi::flow::*;

/// (C struct, Rust size, [(C field, Rust offset, Rust size)]).
type StructRow = (&'static str, usize, Vec<(&'static str, usize, usize)>);

macro_rules! row {
    ($c:literal, $t:ty, { $($cf:literal => $rf:ident),* $(,)? }) => {{
        let z = <$t as zerocopy::FromZeros>::new_zeroed();
        let _ = &z;
        (
            $c,
            size_of::<$t>(),
            vec![$(($cf, std::mem::offset_of!($t, $rf), size_of_val(&z.$rf))),*],
        )
    }};
}

fn structs() -> Vec<StructRow> {
    vec![
        row!("struct ib_uverbs_flow_spec_hdr", IbUverbsFlowSpecHdr,
             { "type" => type_, "size" => size, "reserved" => reserved }),
        row!("struct ib_uverbs_flow_eth_filter", IbUverbsFlowEthFilter,
             { "dst_mac" => dst_mac, "src_mac" => src_mac, "ether_type" => ether_type,
               "vlan_tag" => vlan_tag }),
        row!("struct ib_uverbs_flow_spec_eth", IbUverbsFlowSpecEth,
             { "hdr" => hdr, "val" => val, "mask" => mask }),
        row!("struct ib_uverbs_flow_ipv4_filter", IbUverbsFlowIpv4Filter,
             { "src_ip" => src_ip, "dst_ip" => dst_ip, "proto" => proto, "tos" => tos,
               "ttl" => ttl, "flags" => flags }),
        row!("struct ib_uverbs_flow_spec_ipv4", IbUverbsFlowSpecIpv4,
             { "hdr" => hdr, "val" => val, "mask" => mask }),
        row!("struct ib_uverbs_flow_ipv6_filter", IbUverbsFlowIpv6Filter,
             { "src_ip" => src_ip, "dst_ip" => dst_ip, "flow_label" => flow_label,
               "next_hdr" => next_hdr, "traffic_class" => traffic_class,
               "hop_limit" => hop_limit, "reserved" => reserved }),
        row!("struct ib_uverbs_flow_spec_ipv6", IbUverbsFlowSpecIpv6,
             { "hdr" => hdr, "val" => val, "mask" => mask }),
        row!("struct ib_uverbs_flow_tcp_udp_filter", IbUverbsFlowTcpUdpFilter,
             { "dst_port" => dst_port, "src_port" => src_port }),
        row!("struct ib_uverbs_flow_spec_tcp_udp", IbUverbsFlowSpecTcpUdp,
             { "hdr" => hdr, "val" => val, "mask" => mask }),
        row!("struct ib_uverbs_flow_spec_action_drop", IbUverbsFlowSpecActionDrop,
             { "hdr" => hdr }),
        row!("struct ib_uverbs_flow_attr", IbUverbsFlowAttr,
             { "type" => type_, "size" => size, "priority" => priority,
               "num_of_specs" => num_of_specs, "reserved" => reserved, "port" => port,
               "flags" => flags }),
        row!("struct ib_uverbs_create_flow", IbUverbsCreateFlow,
             { "comp_mask" => comp_mask, "qp_handle" => qp_handle, "flow_attr" => flow_attr }),
        row!("struct ib_uverbs_create_flow_resp", IbUverbsCreateFlowResp,
             { "comp_mask" => comp_mask, "flow_handle" => flow_handle }),
        row!("struct ib_uverbs_destroy_flow", IbUverbsDestroyFlow,
             { "comp_mask" => comp_mask, "flow_handle" => flow_handle }),
    ]
}

fn consts() -> Vec<(&'static str, u64)> {
    vec![
        (
            "IB_USER_VERBS_EX_CMD_CREATE_FLOW",
            IB_USER_VERBS_EX_CMD_CREATE_FLOW.into(),
        ),
        (
            "IB_USER_VERBS_EX_CMD_DESTROY_FLOW",
            IB_USER_VERBS_EX_CMD_DESTROY_FLOW.into(),
        ),
        ("IBV_FLOW_SPEC_ETH", IB_FLOW_SPEC_ETH.into()),
        ("IBV_FLOW_SPEC_IPV4", IB_FLOW_SPEC_IPV4.into()),
        ("IBV_FLOW_SPEC_IPV6", IB_FLOW_SPEC_IPV6.into()),
        ("IBV_FLOW_SPEC_TCP", IB_FLOW_SPEC_TCP.into()),
        ("IBV_FLOW_SPEC_UDP", IB_FLOW_SPEC_UDP.into()),
        ("IBV_FLOW_SPEC_INNER", IB_FLOW_SPEC_INNER.into()),
        ("IBV_FLOW_SPEC_ACTION_TAG", IB_FLOW_SPEC_ACTION_TAG.into()),
        ("IBV_FLOW_SPEC_ACTION_DROP", IB_FLOW_SPEC_ACTION_DROP.into()),
        ("IBV_FLOW_ATTR_NORMAL", IB_FLOW_ATTR_NORMAL.into()),
        ("IBV_FLOW_ATTR_ALL_DEFAULT", IB_FLOW_ATTR_ALL_DEFAULT.into()),
        ("IBV_FLOW_ATTR_MC_DEFAULT", IB_FLOW_ATTR_MC_DEFAULT.into()),
        ("IBV_FLOW_ATTR_SNIFFER", IB_FLOW_ATTR_SNIFFER.into()),
        (
            "IBV_FLOW_ATTR_FLAGS_DONT_TRAP",
            IB_FLOW_ATTR_FLAGS_DONT_TRAP.into(),
        ),
        (
            "IBV_FLOW_ATTR_FLAGS_EGRESS",
            IB_FLOW_ATTR_FLAGS_EGRESS.into(),
        ),
    ]
}

#[test]
fn flow_abi_matches_the_installed_headers() {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/ib_user_verbs.h>\n\
         #include <infiniband/verbs.h>\nint main(void) {\n",
    );
    let mut expected = Vec::new();
    for (cs, size, fields) in structs() {
        writeln!(c, "  printf(\"S {cs} %zu\\n\", sizeof({cs}));").unwrap();
        expected.push(format!("S {cs} {size}"));
        let mut covered = 0;
        for (f, off, fsize) in fields {
            writeln!(
                c,
                "  printf(\"F {cs} {f} %zu %zu\\n\", offsetof({cs}, {f}), sizeof((({cs} *)0)->{f}));"
            )
            .unwrap();
            expected.push(format!("F {cs} {f} {off} {fsize}"));
            assert_eq!(off, covered, "{cs}: field {f} leaves a gap or overlaps");
            covered = off + fsize;
        }
        assert_eq!(covered, size, "{cs}: the listed fields do not tile it");
    }
    for (name, v) in consts() {
        writeln!(
            c,
            "  printf(\"C {name} %llu\\n\", (unsigned long long)({name}));"
        )
        .unwrap();
        expected.push(format!("C {name} {v}"));
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("mlx5-ffi-flow-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("check.c"), dir.join("check"));
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let out = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run the C compiler (Debian package gcc)");
    assert!(
        out.status.success(),
        "the header check does not compile (libibverbs-dev and linux-libc-dev installed?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the header check");
    let _ = std::fs::remove_dir_all(&dir);
    let got: Vec<String> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got.len(), expected.len(), "{got:#?}");
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g, e);
    }
}
