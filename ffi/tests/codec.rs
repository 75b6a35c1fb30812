//! Golden-byte tests of the command builders/parsers, the ioctl attribute walker and the
//! mlx5 mmap offset encoding.

use mlx5_ffi::cmd::{
    build_write, build_write_ex, parse_write, read_prefix_zero_fill, tail_is_zero,
};
use mlx5_ffi::ioctl::{
    IbUverbsAttr, IoctlBuilder, RDMA_VERBS_IOCTL, UVERBS_ATTR_CORE_IN, UVERBS_ATTR_CORE_OUT,
    UVERBS_ATTR_F_MANDATORY, UVERBS_ATTR_F_VALID_OUTPUT, UVERBS_ATTR_WRITE_CMD,
    UVERBS_METHOD_INVOKE_WRITE, UVERBS_OBJECT_DEVICE, parse_ioctl, set_attr_output, write_attr,
};
use mlx5_ffi::mlx5::{
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE,
    MLX5_IB_METHOD_UAR_OBJ_ALLOC, MLX5_IB_MMAP_ALLOC_WC, MLX5_IB_MMAP_CLOCK_INFO,
    MLX5_IB_MMAP_CORE_CLOCK, MLX5_IB_MMAP_NC_PAGE, MLX5_IB_MMAP_REGULAR_PAGE, MLX5_IB_OBJECT_UAR,
    Mlx5IbAllocUcontextReqV2, decode_mmap_offset, mmap_offset,
};
use mlx5_ffi::surface::Errno;
use mlx5_ffi::uverbs::{
    IB_USER_VERBS_CMD_ALLOC_PD, IB_USER_VERBS_CMD_GET_CONTEXT, IB_USER_VERBS_CMD_MODIFY_QP,
    IB_USER_VERBS_EX_CMD_QUERY_DEVICE, IbUverbsAllocPd, IbUverbsExQueryDevice, IbUverbsGetContext,
};
use zerocopy::IntoBytes;

#[test]
fn legacy_alloc_pd_golden_bytes() {
    let core = IbUverbsAllocPd {
        response: 0x1122_3344_5566_7788,
    };
    let buf = build_write(IB_USER_VERBS_CMD_ALLOC_PD, core.as_bytes(), &[], 8).unwrap();
    assert_eq!(
        buf,
        [
            0x03, 0, 0, 0, // command 3
            0x04, 0, // in_words: (8 + 8) / 4
            0x02, 0, // out_words: 8 / 4
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // response pointer
        ]
    );
    let parsed = parse_write(&buf).unwrap();
    assert_eq!(parsed.command, IB_USER_VERBS_CMD_ALLOC_PD);
    assert!(!parsed.extended);
    assert_eq!(parsed.response, 0x1122_3344_5566_7788);
    assert_eq!(parsed.core_in, core.as_bytes());
    assert_eq!(parsed.core_out_len, 8);
}

#[test]
fn legacy_get_context_with_driver_data_splits() {
    // The 48-byte GET_CONTEXT that libmlx5 sends: hdr 8 + core 8 + mlx5 req 32; out 8 + 72.
    let core = IbUverbsGetContext { response: 0x7000 };
    let drv = Mlx5IbAllocUcontextReqV2 {
        total_num_bfregs: 16,
        num_low_latency_bfregs: 4,
        flags: 1,
        max_cqe_version: 1,
        lib_caps: 3,
        ..Default::default()
    };
    let buf = build_write(
        IB_USER_VERBS_CMD_GET_CONTEXT,
        core.as_bytes(),
        drv.as_bytes(),
        80,
    )
    .unwrap();
    assert_eq!(buf.len(), 48);
    assert_eq!(buf[..8], [0, 0, 0, 0, 12, 0, 20, 0]);
    let cmd = parse_write(&buf).unwrap().split_legacy(8, 8).unwrap();
    assert_eq!(cmd.response, 0x7000);
    assert_eq!(cmd.driver_in, drv.as_bytes());
    assert_eq!(cmd.driver_out_len, 72);
    let back: Mlx5IbAllocUcontextReqV2 = read_prefix_zero_fill(cmd.driver_in);
    assert_eq!(back, drv);
    // A request shorter than the core part is what the kernel calls ENOSPC.
    assert_eq!(parse_write(&buf[..12]).map(|_| ()), Err(Errno::EINVAL));
    let short = build_write(IB_USER_VERBS_CMD_GET_CONTEXT, &[0; 4], &[], 80).unwrap();
    assert_eq!(
        parse_write(&short).unwrap().split_legacy(8, 8).map(|_| ()),
        Err(Errno::ENOSPC)
    );
}

#[test]
fn legacy_without_response_has_zero_pointer_only_when_short() {
    let buf = build_write(IB_USER_VERBS_CMD_MODIFY_QP, &[0xAB; 4], &[], 0).unwrap();
    let cmd = parse_write(&buf).unwrap();
    assert_eq!(cmd.response, 0);
    assert_eq!(cmd.core_in, [0xAB; 4]);
}

#[test]
fn extended_query_device_golden_bytes() {
    let core = IbUverbsExQueryDevice::default();
    let buf = build_write_ex(
        IB_USER_VERBS_EX_CMD_QUERY_DEVICE,
        0x1000,
        core.as_bytes(),
        304,
        &[],
        104,
    )
    .unwrap();
    assert_eq!(
        buf,
        [
            0x01, 0, 0, 0x80, // QUERY_DEVICE | FLAG_EXTENDED
            0x01, 0, // in_words: 8 / 8
            0x26, 0, // out_words: 304 / 8 = 38
            0x00, 0x10, 0, 0, 0, 0, 0, 0, // response
            0x00, 0, // provider_in_words
            0x0d, 0, // provider_out_words: 104 / 8 = 13
            0, 0, 0, 0, // cmd_hdr_reserved
            0, 0, 0, 0, 0, 0, 0, 0, // comp_mask, reserved
        ]
    );
    let cmd = parse_write(&buf).unwrap();
    assert!(cmd.extended);
    assert_eq!(cmd.command, IB_USER_VERBS_EX_CMD_QUERY_DEVICE);
    assert_eq!(
        (cmd.response, cmd.core_out_len, cmd.driver_out_len),
        (0x1000, 304, 104)
    );
    assert_eq!(cmd.core_in.len(), 8);
    assert!(cmd.driver_in.is_empty());
}

#[test]
fn malformed_write_commands_are_rejected() {
    let good = build_write_ex(
        IB_USER_VERBS_EX_CMD_QUERY_DEVICE,
        0x1000,
        &[0; 8],
        304,
        &[0; 8],
        104,
    )
    .unwrap();
    assert!(parse_write(&good).is_ok());
    let mut reserved = good.clone();
    reserved[20] = 1; // cmd_hdr_reserved
    assert_eq!(parse_write(&reserved).map(|_| ()), Err(Errno::EINVAL));
    let mut no_resp = good.clone();
    no_resp[8..16].fill(0); // response 0 but out words set
    assert_eq!(parse_write(&no_resp).map(|_| ()), Err(Errno::EINVAL));
    assert_eq!(
        parse_write(&good[..good.len() - 8]).map(|_| ()),
        Err(Errno::EINVAL)
    );
    assert_eq!(parse_write(&[1, 0, 0]).map(|_| ()), Err(Errno::EINVAL));
    let mut bad_flag = good;
    bad_flag[3] = 0x40; // unknown command bits
    assert_eq!(parse_write(&bad_flag).map(|_| ()), Err(Errno::EINVAL));
    // Lengths that cannot be expressed in words.
    assert_eq!(
        build_write(0, &[0; 6], &[], 0).map(|_| ()),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        build_write_ex(1, 1, &[0; 4], 8, &[], 0).map(|_| ()),
        Err(Errno::EINVAL)
    );
}

#[test]
fn zero_fill_and_tail_checks() {
    let v: IbUverbsExQueryDevice = read_prefix_zero_fill(&[1, 0, 0, 0]);
    assert_eq!(
        v,
        IbUverbsExQueryDevice {
            comp_mask: 1,
            reserved: 0
        }
    );
    assert!(tail_is_zero(&[1, 2, 0, 0], 2));
    assert!(!tail_is_zero(&[1, 2, 0, 3], 2));
    assert!(tail_is_zero(&[1], 4));
}

#[test]
fn rdma_verbs_ioctl_number() {
    assert_eq!(RDMA_VERBS_IOCTL, 0xC018_1B01);
}

#[test]
fn invoke_write_probe_golden_bytes() {
    let buf = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE)
        .in_u32(UVERBS_ATTR_WRITE_CMD, 1)
        .build()
        .unwrap();
    assert_eq!(
        buf,
        [
            0x28, 0, // length 40
            0, 0, // object DEVICE
            0, 0, // method INVOKE_WRITE
            1, 0, // num_attrs
            0, 0, 0, 0, 0, 0, 0, 0, // reserved1
            1, 0, 0, 0, // driver_id mlx5
            0, 0, 0, 0, // reserved2
            2, 0, // attr_id WRITE_CMD
            4, 0, // len
            1, 0, // flags MANDATORY
            0, 0, // attr_data
            1, 0, 0, 0, 0, 0, 0, 0, // data = QUERY_DEVICE
        ]
    );
}

#[test]
fn ioctl_walk_find_and_write_back() {
    let mut buf = IoctlBuilder::new(MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_ALLOC)
        .out_obj(MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE)
        .in_inline(MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, &[1, 0, 0, 0])
        .unwrap()
        .optional()
        .in_ptr(UVERBS_ATTR_CORE_IN, 0xdead_0000, 40)
        .out_ptr(UVERBS_ATTR_CORE_OUT, 0xbeef_0000, 12)
        .build()
        .unwrap();
    let view = parse_ioctl(&buf).unwrap();
    assert_eq!(
        (view.hdr.object_id, view.hdr.method_id, view.hdr.num_attrs),
        (0x1008, 0x1000, 4)
    );
    let ids: Vec<u16> = view.attrs().map(|a| a.attr_id).collect();
    assert_eq!(ids, [0x1000, 0x1001, 0, 1]);
    let (i, ty) = view.find(MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE).unwrap();
    assert_eq!(i, 1);
    assert_eq!(ty.flags, 0, "optional() clears MANDATORY");
    assert_eq!(ty.inline_bytes(), Some(&[1u8, 0, 0, 0][..]));
    let (_, core_in) = view.find(UVERBS_ATTR_CORE_IN).unwrap();
    assert_eq!(
        (core_in.data, core_in.len, core_in.inline_bytes()),
        (0xdead_0000, 40, None)
    );
    assert!(view.find(0x1234).is_none());

    set_attr_output(&mut buf, MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, 77).unwrap();
    let (_, h) = parse_ioctl(&buf)
        .unwrap()
        .find(MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE)
        .unwrap();
    assert_eq!(h.data, 77);
    assert_eq!(
        h.flags,
        UVERBS_ATTR_F_MANDATORY | UVERBS_ATTR_F_VALID_OUTPUT
    );
    assert_eq!(buf[24 + 8], 77, "handle stored in attribute 0's data");
    assert_eq!(set_attr_output(&mut buf, 0x1234, 1), Err(Errno::EINVAL));
    assert_eq!(
        write_attr(&mut buf, 4, &IbUverbsAttr::default()),
        Err(Errno::EINVAL)
    );
}

#[test]
fn malformed_ioctl_buffers_are_rejected() {
    let good = IoctlBuilder::new(0, 0)
        .in_u32(2, 1)
        .in_u64(0, 5)
        .build()
        .unwrap();
    assert!(parse_ioctl(&good).is_ok());
    assert_eq!(
        parse_ioctl(&good[..30]).map(|_| ()),
        Err(Errno::EINVAL),
        "buffer shorter than length"
    );
    let mut len = good.clone();
    len[0] = 40; // length disagrees with num_attrs
    assert_eq!(parse_ioctl(&len).map(|_| ()), Err(Errno::EINVAL));
    let mut rsv = good.clone();
    rsv[8] = 1;
    assert_eq!(parse_ioctl(&rsv).map(|_| ()), Err(Errno::EPROTONOSUPPORT));
    let mut attr_rsv = good.clone();
    attr_rsv[24 + 7] = 1;
    assert_eq!(parse_ioctl(&attr_rsv).map(|_| ()), Err(Errno::EINVAL));
    let dup = IoctlBuilder::new(0, 0)
        .in_u32(2, 1)
        .in_u32(2, 1)
        .build()
        .unwrap();
    assert_eq!(parse_ioctl(&dup).map(|_| ()), Err(Errno::EINVAL));
    assert_eq!(
        IoctlBuilder::new(0, 0).in_inline(1, &[0; 9]).map(|_| ()),
        Err(Errno::EINVAL)
    );
}

#[test]
fn mmap_offsets_golden() {
    // (cmd, index, expected page offset); byte offsets as observed with 4 KiB pages.
    let cases = [
        (MLX5_IB_MMAP_REGULAR_PAGE, 0, 0x0),
        (MLX5_IB_MMAP_REGULAR_PAGE, 7, 0x7),
        (MLX5_IB_MMAP_NC_PAGE, 1, 0x301),
        (MLX5_IB_MMAP_CORE_CLOCK, 0, 0x500),
        (MLX5_IB_MMAP_CLOCK_INFO, 0, 0x700),
        (MLX5_IB_MMAP_ALLOC_WC, 0x1234, 0x12_06_34),
        (MLX5_IB_MMAP_ALLOC_WC, 0x00ff_ffff, 0xffff_06ff),
    ];
    for (cmd, index, pgoff) in cases {
        assert_eq!(mmap_offset(cmd, index), pgoff, "cmd {cmd} index {index:#x}");
        assert_eq!(decode_mmap_offset(pgoff), Some((cmd, index)));
    }
    assert_eq!(mmap_offset(MLX5_IB_MMAP_CORE_CLOCK, 0) * 4096, 0x50_0000);
    assert_eq!(decode_mmap_offset(u64::MAX), None);
    assert_eq!(decode_mmap_offset(0xff_ffff_0000), Some((0, 0xffff_ff00)));
    assert_eq!(
        decode_mmap_offset(0x100_0000_0000),
        None,
        "index would exceed 32 bits"
    );
}

#[test]
fn errno_display_names() {
    assert_eq!(Errno::EINVAL.to_string(), "EINVAL (22)");
    assert_eq!(
        format!("{:?}", Errno::EPROTONOSUPPORT),
        "EPROTONOSUPPORT (93)"
    );
    assert_eq!(Errno(9999).to_string(), "errno 9999");
    assert_eq!(
        Errno::from(std::io::Error::from_raw_os_error(2)),
        Errno::ENOENT
    );
    assert_eq!(std::io::Error::from(Errno::ENOTTY).raw_os_error(), Some(25));
}

#[test]
fn split_uses_the_core_size_table() {
    use mlx5_ffi::cmd::core_sizes;
    use mlx5_ffi::uverbs::{
        IB_USER_VERBS_CMD_CREATE_CQ, IB_USER_VERBS_CMD_QUERY_PORT, IbUverbsCreateCq,
    };
    // CREATE_CQ as observed: core 32 / 8, mlx5 32 / 8.
    let core = IbUverbsCreateCq {
        response: 0x4000,
        cqe: 511,
        comp_channel: -1,
        ..Default::default()
    };
    let buf = build_write(IB_USER_VERBS_CMD_CREATE_CQ, core.as_bytes(), &[7; 32], 16).unwrap();
    let cmd = parse_write(&buf).unwrap().split().unwrap();
    assert_eq!(
        (
            cmd.core_in.len(),
            cmd.driver_in,
            cmd.core_out_len,
            cmd.driver_out_len
        ),
        (32, &[7u8; 32][..], 8, 8)
    );
    assert_eq!(cmd.response, 0x4000);
    // MODIFY_QP has no response pointer: the first payload bytes are the dgid, not a pointer.
    let buf = build_write(IB_USER_VERBS_CMD_MODIFY_QP, &[0xff; 112], &[], 0).unwrap();
    let cmd = parse_write(&buf).unwrap().split().unwrap();
    assert_eq!((cmd.response, cmd.core_in.len()), (0, 112));
    assert_eq!(
        parse_write(&build_write(42, &[0; 8], &[], 0).unwrap())
            .unwrap()
            .split()
            .map(|_| ()),
        Err(Errno::EOPNOTSUPP)
    );
    // Sizes observed in the write() commands rdma-core sends (libibverbs on the emulator).
    let s = core_sizes(IB_USER_VERBS_CMD_QUERY_PORT, false).unwrap();
    assert_eq!((s.req, s.resp), (16, 40));
    let s = core_sizes(IB_USER_VERBS_EX_CMD_QUERY_DEVICE, true).unwrap();
    assert_eq!((s.req, s.resp), (8, 304));
    assert_eq!(
        core_sizes(IB_USER_VERBS_CMD_MODIFY_QP, false).map(|s| s.resp),
        Some(0)
    );
}
