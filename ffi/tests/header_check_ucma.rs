//! Proves the ucma mirrors (`mlx5_ffi::ucma`) against the kernel header installed on this
//! machine (`rdma/rdma_user_cm.h` from Debian's linux-libc-dev), and the event numbers and
//! the UD QKey against librdmacm's `rdma/rdma_cma.h` (librdmacm-dev), as
//! `tests/header_check.rs` proves the uverbs ABI: a table lists every struct with every
//! field (they must tile it without gaps) and every constant; a C program prints the
//! header's `sizeof`/`offsetof`/values and the output is compared line by line.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use mlx5_ffi::ucma::{self, cmd, event, option, ps, query};
use zerocopy::FromZeros;

#[derive(Default)]
struct Table {
    c_body: String,
    expected: Vec<String>,
    current: Vec<(String, usize, usize)>,
    errors: Vec<String>,
}

impl Table {
    fn structure(&mut self, cname: &str, size: usize) {
        writeln!(
            self.c_body,
            "  printf(\"S %s %zu\\n\", \"{cname}\", sizeof({cname}));"
        )
        .unwrap();
        self.expected.push(format!("S {cname} {size}"));
        self.current.clear();
    }

    fn field(&mut self, cname: &str, c_field: &str, offset: usize, size: usize) {
        writeln!(
            self.c_body,
            "  printf(\"F %s %s %zu %zu\\n\", \"{cname}\", \"{c_field}\", offsetof({cname}, {c_field}), \
             sizeof((({cname} *)0)->{c_field}));"
        )
        .unwrap();
        self.expected
            .push(format!("F {cname} {c_field} {offset} {size}"));
        self.current.push((c_field.to_owned(), offset, size));
    }

    fn end_struct(&mut self, cname: &str, size: usize) {
        let mut f = std::mem::take(&mut self.current);
        f.sort_by_key(|x| x.1);
        let mut next = 0;
        for (name, off, sz) in &f {
            if *off != next {
                self.errors
                    .push(format!("{cname}: {name} at {off}, expected {next}"));
            }
            next = off + sz;
        }
        if next != size {
            self.errors
                .push(format!("{cname}: fields end at {next}, size {size}"));
        }
    }

    fn constant(&mut self, c_name: &str, value: u64) {
        writeln!(
            self.c_body,
            "  printf(\"C %s %llu\\n\", \"{c_name}\", (unsigned long long)({c_name}));"
        )
        .unwrap();
        self.expected.push(format!("C {c_name} {value}"));
    }
}

macro_rules! structs {
    ($t:ident; $( $ty:ty = $cname:literal { $( $f:ident $(=> $cf:literal)? ),* $(,)? } ),* $(,)?) => {
        $(
            $t.structure($cname, size_of::<$ty>());
            let zero = <$ty as FromZeros>::new_zeroed();
            $(
                let c: &str = None $( .or(Some($cf)) )?.unwrap_or(stringify!($f));
                $t.field($cname, c, std::mem::offset_of!($ty, $f), size_of_val(&zero.$f));
            )*
            $t.end_struct($cname, size_of::<$ty>());
        )*
    };
}

fn kernel_table() -> Table {
    let mut t = Table::default();
    structs! { t;
        ucma::RdmaUcmCmdHdr = "struct rdma_ucm_cmd_hdr" { cmd, r#in => "in", out },
        ucma::RdmaUcmCreateId = "struct rdma_ucm_create_id" { uid, response, ps, qp_type, reserved },
        ucma::RdmaUcmCreateIdResp = "struct rdma_ucm_create_id_resp" { id },
        ucma::RdmaUcmDestroyId = "struct rdma_ucm_destroy_id" { response, id, reserved },
        ucma::RdmaUcmDestroyIdResp = "struct rdma_ucm_destroy_id_resp" { events_reported },
        ucma::RdmaUcmBindIp = "struct rdma_ucm_bind_ip" { response, addr, id },
        ucma::RdmaUcmBind = "struct rdma_ucm_bind" { id, addr_size, reserved, addr },
        ucma::RdmaUcmResolveIp = "struct rdma_ucm_resolve_ip" { src_addr, dst_addr, id, timeout_ms },
        ucma::RdmaUcmResolveAddr = "struct rdma_ucm_resolve_addr" {
            id, timeout_ms, src_size, dst_size, reserved, src_addr, dst_addr
        },
        ucma::RdmaUcmResolveRoute = "struct rdma_ucm_resolve_route" { id, timeout_ms },
        ucma::RdmaUcmQuery = "struct rdma_ucm_query" { response, id, option },
        ucma::IbUserPathRec = "struct ib_user_path_rec" {
            dgid, sgid, dlid, slid, raw_traffic, flow_label, reversible, mtu, pkey, hop_limit,
            traffic_class, numb_path, sl, mtu_selector, rate_selector, rate,
            packet_life_time_selector, packet_life_time, preference
        },
        ucma::RdmaUcmQueryRouteResp = "struct rdma_ucm_query_route_resp" {
            node_guid, ib_route, src_addr, dst_addr, num_paths, port_num, reserved, ibdev_index,
            reserved1
        },
        ucma::RdmaUcmQueryAddrResp = "struct rdma_ucm_query_addr_resp" {
            node_guid, port_num, reserved, pkey, src_size, dst_size, src_addr, dst_addr,
            ibdev_index, reserved1
        },
        ucma::IbPathRecData = "struct ib_path_rec_data" { flags, reserved, path_rec },
        ucma::RdmaUcmQueryPathResp = "struct rdma_ucm_query_path_resp" { num_paths, reserved },
        ucma::RdmaUcmConnParam = "struct rdma_ucm_conn_param" {
            qp_num, qkey, private_data, private_data_len, srq, responder_resources,
            initiator_depth, flow_control, retry_count, rnr_retry_count, valid
        },
        ucma::RdmaUcmUdParam = "struct rdma_ucm_ud_param" {
            qp_num, qkey, ah_attr, private_data, private_data_len, reserved
        },
        ucma::RdmaUcmEce = "struct rdma_ucm_ece" { vendor_id, attr_mod },
        ucma::RdmaUcmConnect = "struct rdma_ucm_connect" { conn_param, id, reserved, ece },
        ucma::RdmaUcmListen = "struct rdma_ucm_listen" { id, backlog },
        ucma::RdmaUcmAccept = "struct rdma_ucm_accept" { uid, conn_param, id, reserved, ece },
        ucma::RdmaUcmReject = "struct rdma_ucm_reject" {
            id, private_data_len, reason, reserved, private_data
        },
        ucma::RdmaUcmDisconnect = "struct rdma_ucm_disconnect" { id },
        ucma::RdmaUcmInitQpAttr = "struct rdma_ucm_init_qp_attr" { response, id, qp_state },
        ucma::RdmaUcmNotify = "struct rdma_ucm_notify" { id, event },
        ucma::RdmaUcmJoinIpMcast = "struct rdma_ucm_join_ip_mcast" { response, uid, addr, id },
        ucma::RdmaUcmJoinMcast = "struct rdma_ucm_join_mcast" {
            response, uid, id, addr_size, join_flags, addr
        },
        ucma::RdmaUcmGetEvent = "struct rdma_ucm_get_event" { response },
        ucma::IbUverbsAttachMcast = "struct ib_uverbs_attach_mcast" {
            gid, qp_handle, mlid, reserved
        },
        ucma::IbUverbsAttachMcast = "struct ib_uverbs_detach_mcast" {
            gid, qp_handle, mlid, reserved
        },
        ucma::RdmaUcmEventResp = "struct rdma_ucm_event_resp" {
            uid, id, event, status, param, reserved, ece
        },
        ucma::RdmaUcmSetOption = "struct rdma_ucm_set_option" {
            optval, id, level, optname, optlen
        },
        ucma::RdmaUcmMigrateId = "struct rdma_ucm_migrate_id" { response, id, fd },
        ucma::RdmaUcmMigrateResp = "struct rdma_ucm_migrate_resp" { events_reported },
        ucma::IbUverbsQpAttr = "struct ib_uverbs_qp_attr" {
            qp_attr_mask, qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn,
            sq_psn, dest_qp_num, qp_access_flags, ah_attr, alt_ah_attr, max_send_wr,
            max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, pkey_index,
            alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
            max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, reserved
        },
    }
    // The union members inside the event response.
    t.field(
        "struct rdma_ucm_event_resp",
        "param.conn",
        std::mem::offset_of!(ucma::RdmaUcmEventResp, param),
        size_of::<ucma::RdmaUcmConnParam>(),
    );
    t.field(
        "struct rdma_ucm_event_resp",
        "param.ud",
        std::mem::offset_of!(ucma::RdmaUcmEventResp, param),
        size_of::<ucma::RdmaUcmUdParam>(),
    );
    t.current.clear();
    for (name, v) in [
        (
            "RDMA_USER_CM_ABI_VERSION",
            u64::from(ucma::RDMA_USER_CM_ABI_VERSION),
        ),
        ("RDMA_MAX_PRIVATE_DATA", ucma::RDMA_MAX_PRIVATE_DATA as u64),
        ("RDMA_USER_CM_CMD_CREATE_ID", cmd::CREATE_ID.into()),
        ("RDMA_USER_CM_CMD_DESTROY_ID", cmd::DESTROY_ID.into()),
        ("RDMA_USER_CM_CMD_BIND_IP", cmd::BIND_IP.into()),
        ("RDMA_USER_CM_CMD_RESOLVE_IP", cmd::RESOLVE_IP.into()),
        ("RDMA_USER_CM_CMD_RESOLVE_ROUTE", cmd::RESOLVE_ROUTE.into()),
        ("RDMA_USER_CM_CMD_QUERY_ROUTE", cmd::QUERY_ROUTE.into()),
        ("RDMA_USER_CM_CMD_CONNECT", cmd::CONNECT.into()),
        ("RDMA_USER_CM_CMD_LISTEN", cmd::LISTEN.into()),
        ("RDMA_USER_CM_CMD_ACCEPT", cmd::ACCEPT.into()),
        ("RDMA_USER_CM_CMD_REJECT", cmd::REJECT.into()),
        ("RDMA_USER_CM_CMD_DISCONNECT", cmd::DISCONNECT.into()),
        ("RDMA_USER_CM_CMD_INIT_QP_ATTR", cmd::INIT_QP_ATTR.into()),
        ("RDMA_USER_CM_CMD_GET_EVENT", cmd::GET_EVENT.into()),
        ("RDMA_USER_CM_CMD_GET_OPTION", cmd::GET_OPTION.into()),
        ("RDMA_USER_CM_CMD_SET_OPTION", cmd::SET_OPTION.into()),
        ("RDMA_USER_CM_CMD_NOTIFY", cmd::NOTIFY.into()),
        ("RDMA_USER_CM_CMD_JOIN_IP_MCAST", cmd::JOIN_IP_MCAST.into()),
        ("RDMA_USER_CM_CMD_LEAVE_MCAST", cmd::LEAVE_MCAST.into()),
        ("RDMA_USER_CM_CMD_MIGRATE_ID", cmd::MIGRATE_ID.into()),
        ("RDMA_USER_CM_CMD_QUERY", cmd::QUERY.into()),
        ("RDMA_USER_CM_CMD_BIND", cmd::BIND.into()),
        ("RDMA_USER_CM_CMD_RESOLVE_ADDR", cmd::RESOLVE_ADDR.into()),
        ("RDMA_USER_CM_CMD_JOIN_MCAST", cmd::JOIN_MCAST.into()),
        ("RDMA_USER_CM_CMD_JOIN_MCAST + 1", cmd::COUNT.into()),
        ("RDMA_PS_IPOIB", ps::IPOIB.into()),
        ("RDMA_PS_IB", ps::IB.into()),
        ("RDMA_PS_TCP", ps::TCP.into()),
        ("RDMA_PS_UDP", ps::UDP.into()),
        ("RDMA_USER_CM_QUERY_ADDR", query::ADDR.into()),
        ("RDMA_USER_CM_QUERY_PATH", query::PATH.into()),
        ("RDMA_USER_CM_QUERY_GID", query::GID.into()),
        ("RDMA_OPTION_ID", option::ID.into()),
        ("RDMA_OPTION_IB", option::IB.into()),
        ("RDMA_OPTION_ID_TOS", option::ID_TOS.into()),
        ("RDMA_OPTION_ID_REUSEADDR", option::ID_REUSEADDR.into()),
        ("RDMA_OPTION_ID_AFONLY", option::ID_AFONLY.into()),
        ("RDMA_OPTION_ID_ACK_TIMEOUT", option::ID_ACK_TIMEOUT.into()),
        ("RDMA_OPTION_IB_PATH", option::IB_PATH.into()),
        ("AF_INET", ucma::af::INET.into()),
        ("AF_INET6", ucma::af::INET6.into()),
        ("AF_IB", ucma::af::IB.into()),
    ] {
        t.constant(name, v);
    }
    t
}

fn librdmacm_table() -> Table {
    let mut t = Table::default();
    for (name, v) in [
        ("RDMA_CM_EVENT_ADDR_RESOLVED", event::ADDR_RESOLVED),
        ("RDMA_CM_EVENT_ADDR_ERROR", event::ADDR_ERROR),
        ("RDMA_CM_EVENT_ROUTE_RESOLVED", event::ROUTE_RESOLVED),
        ("RDMA_CM_EVENT_ROUTE_ERROR", event::ROUTE_ERROR),
        ("RDMA_CM_EVENT_CONNECT_REQUEST", event::CONNECT_REQUEST),
        ("RDMA_CM_EVENT_CONNECT_RESPONSE", event::CONNECT_RESPONSE),
        ("RDMA_CM_EVENT_CONNECT_ERROR", event::CONNECT_ERROR),
        ("RDMA_CM_EVENT_UNREACHABLE", event::UNREACHABLE),
        ("RDMA_CM_EVENT_REJECTED", event::REJECTED),
        ("RDMA_CM_EVENT_ESTABLISHED", event::ESTABLISHED),
        ("RDMA_CM_EVENT_DISCONNECTED", event::DISCONNECTED),
        ("RDMA_CM_EVENT_DEVICE_REMOVAL", event::DEVICE_REMOVAL),
        ("RDMA_CM_EVENT_MULTICAST_JOIN", event::MULTICAST_JOIN),
        ("RDMA_CM_EVENT_MULTICAST_ERROR", event::MULTICAST_ERROR),
        ("RDMA_CM_EVENT_ADDR_CHANGE", event::ADDR_CHANGE),
        ("RDMA_CM_EVENT_TIMEWAIT_EXIT", event::TIMEWAIT_EXIT),
        ("RDMA_UDP_QKEY", ucma::RDMA_UDP_QKEY),
    ] {
        t.constant(name, v.into());
    }
    t
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cc() -> Command {
    Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_owned()))
}

/// Compile and run the table's program against `headers`; compare with the Rust side.
fn check(t: &Table, headers: &[(&str, &str)], tag: &str) {
    assert!(
        t.errors.is_empty(),
        "field tiling errors:\n{}",
        t.errors.join("\n")
    );
    let dir = TempDir(
        std::env::temp_dir().join(format!("mlx5-ffi-ucma-check-{tag}-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    let mut program =
        String::from("#include <stdio.h>\n#include <stddef.h>\n#include <sys/socket.h>\n");
    for (h, _) in headers {
        writeln!(program, "#include <{h}>").unwrap();
    }
    write!(program, "int main(void) {{\n{}  return 0;\n}}\n", t.c_body).unwrap();
    let src = dir.0.join("check.c");
    let exe = dir.0.join("check");
    std::fs::write(&src, &program).unwrap();
    let out = cc().arg("-o").arg(&exe).arg(&src).output().expect("run cc");
    let pkgs: Vec<&str> = headers.iter().map(|h| h.1).collect();
    assert!(
        out.status.success(),
        "compiling the check program failed (install {pkgs:?}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the check program");
    assert!(run.status.success());
    let stdout = String::from_utf8(run.stdout).unwrap();
    let got: Vec<&str> = stdout.lines().collect();
    assert_eq!(got.len(), t.expected.len(), "line count differs");
    let bad: Vec<String> = got
        .iter()
        .zip(&t.expected)
        .filter(|(c, r)| *c != *r)
        .map(|(c, r)| format!("  C header: {c}\n  Rust:     {r}"))
        .collect();
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn ucma_layouts_and_constants_match_rdma_user_cm_h() {
    check(
        &kernel_table(),
        &[
            ("rdma/rdma_user_cm.h", "linux-libc-dev"),
            ("rdma/ib_user_sa.h", "linux-libc-dev"),
        ],
        "kernel",
    );
}

#[test]
fn event_numbers_and_udp_qkey_match_librdmacm() {
    check(
        &librdmacm_table(),
        &[("rdma/rdma_cma.h", "librdmacm-dev")],
        "librdmacm",
    );
}

#[test]
fn socket_addresses_round_trip_and_garbage_is_refused() {
    use ucma::SockAddr;
    let v4 = SockAddr::V4 {
        ip: [127, 1, 0, 3],
        port: 7174,
    };
    let mut b = [0u8; 128];
    v4.encode(&mut b);
    assert_eq!(SockAddr::decode(&b), Some(v4));
    assert_eq!(v4.ipv4(), Some([127, 1, 0, 3]));
    let v6 = SockAddr::V6 {
        ip: v4.ip16(),
        port: 1,
        scope: 0,
    };
    v6.encode(&mut b);
    assert_eq!(SockAddr::decode(&b), Some(v6));
    assert_eq!(v6.ipv4(), Some([127, 1, 0, 3]));
    assert_eq!(SockAddr::decode(&[0xff, 0xff, 0, 0]), None);
    assert_eq!(SockAddr::decode(&[2, 0]), None);
    assert_eq!(SockAddr::decode(&[]), None);
}
