//! Proves the XRC/DC mirrors of `mlx5_ffi::xrc_dc` (and the DC fields of the mlx5 QP driver
//! data they rely on) against the installed headers: a C program prints each struct's size,
//! each field's offset and size, and each constant; the same lines are computed from the Rust
//! side and compared. The fields listed for a struct must tile it (no field left out).

use std::fmt::Write as _;
use std::process::Command;

use mlx5_ffi::mlx5::Mlx5IbCreateQp;
use mlx5_ffi::xrc_dc::*;

/// (C struct, size, [(C field, offset, size)]).
type StructRow = (&'static str, usize, Vec<(&'static str, usize, usize)>);

macro_rules! row {
    ($t:ty, $c:literal, [$($f:ident $(=> $cf:literal)?),* $(,)?]) => {{
        let z = <$t as Default>::default();
        let fields = vec![$((
            { let n: &'static str = stringify!($f); $( let n = $cf; )? n },
            std::mem::offset_of!($t, $f),
            size_of_val(&z.$f),
        )),*];
        ($c, size_of::<$t>(), fields)
    }};
}

fn structs() -> Vec<StructRow> {
    vec![
        row!(
            IbUverbsOpenXrcd,
            "struct ib_uverbs_open_xrcd",
            [response, fd, oflags]
        ),
        row!(
            IbUverbsOpenXrcdResp,
            "struct ib_uverbs_open_xrcd_resp",
            [xrcd_handle]
        ),
        row!(
            IbUverbsCloseXrcd,
            "struct ib_uverbs_close_xrcd",
            [xrcd_handle]
        ),
        row!(
            IbUverbsOpenQp,
            "struct ib_uverbs_open_qp",
            [response, user_handle, pd_handle, qpn, qp_type, reserved]
        ),
    ]
}

fn consts() -> Vec<(&'static str, u64)> {
    vec![
        (
            "UVERBS_METHOD_XRCD_DESTROY",
            u64::from(UVERBS_METHOD_XRCD_DESTROY),
        ),
        (
            "UVERBS_ATTR_DESTROY_XRCD_HANDLE",
            u64::from(UVERBS_ATTR_DESTROY_XRCD_HANDLE),
        ),
        ("IBV_QPT_DRIVER", u64::from(IBV_QPT_DRIVER)),
        ("MLX5DV_DCTYPE_DCT", u64::from(MLX5DV_DCTYPE_DCT)),
        ("MLX5DV_DCTYPE_DCI", u64::from(MLX5DV_DCTYPE_DCI)),
        // The DC access key is the union partner of `sq_buf_addr` at offset 40.
        (
            "offsetof(struct mlx5_ib_create_qp, access_key)",
            std::mem::offset_of!(Mlx5IbCreateQp, sq_buf_addr) as u64,
        ),
        ("sizeof(((struct mlx5_ib_create_qp *)0)->access_key)", 8),
    ]
}

#[test]
fn xrc_and_dc_layouts_and_constants_match_installed_headers() {
    let mut body = String::new();
    let mut expected = Vec::new();
    for (c, size, fields) in structs() {
        writeln!(body, "  printf(\"S %zu\\n\", sizeof({c}));").unwrap();
        expected.push(format!("S {size}"));
        let mut next = 0;
        for (f, off, fsize) in &fields {
            assert_eq!(*off, next, "{c}: field {f} leaves a gap or overlaps");
            next = off + fsize;
            writeln!(
                body,
                "  printf(\"F {f} %zu %zu\\n\", offsetof({c}, {f}), sizeof((({c} *)0)->{f}));"
            )
            .unwrap();
            expected.push(format!("F {f} {off} {fsize}"));
        }
        assert_eq!(next, size, "{c}: the listed fields do not cover the struct");
    }
    for (c, v) in consts() {
        writeln!(body, "  printf(\"C %llu\\n\", (unsigned long long)({c}));").unwrap();
        expected.push(format!("C {v}"));
    }
    let program = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/ib_user_verbs.h>\n\
         #include <rdma/ib_user_ioctl_cmds.h>\n#include <rdma/mlx5-abi.h>\n\
         #include <infiniband/verbs.h>\n#include <infiniband/mlx5dv.h>\n\
         int main(void) {{\n{body}  return 0;\n}}\n"
    );
    let dir = std::env::temp_dir().join(format!("mlx5-xrc-dc-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("check.c"), dir.join("check"));
    std::fs::write(&src, program).unwrap();
    let out = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run cc (Debian package gcc)");
    assert!(
        out.status.success(),
        "compiling the check failed (headers from linux-libc-dev, libibverbs-dev):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the check program");
    let _ = std::fs::remove_dir_all(&dir);
    let got = String::from_utf8(run.stdout).unwrap();
    let got: Vec<&str> = got.lines().collect();
    assert_eq!(got, expected);
}
