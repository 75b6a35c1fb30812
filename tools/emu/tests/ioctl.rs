//! The modern kernel's ioctl object methods: a context, CQs and QPs created entirely over
//! RDMA_VERBS_IOCTL carry traffic; destroy methods report their counts; unknown mandatory
//! attributes and methods answer EPROTONOSUPPORT (so libibverbs falls back to write()).

mod common;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Errno, Flavour, RunMode};
use mlx5_ffi::ioctl::*;
use mlx5_ffi::mlx5::*;
use mlx5_hw::opcodes::SendOpcode;
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE};
use zerocopy::IntoBytes;

fn data_of(buf: &[u8], attr_index: usize) -> u64 {
    let o = 24 + 16 * attr_index + 8;
    u64::from_ne_bytes(buf[o..o + 8].try_into().unwrap())
}

fn flags_of(buf: &[u8], attr_index: usize) -> u16 {
    let o = 24 + 16 * attr_index + 4;
    u16::from_ne_bytes([buf[o], buf[o + 1]])
}

/// Open a context entirely over ioctl; returns the Ctx-like pieces.
fn open_ioctl(emu: &Emulator) -> Ctx {
    let dev = emu.open(0).unwrap();
    let req = Mlx5IbAllocUcontextReqV2 {
        total_num_bfregs: 16,
        num_low_latency_bfregs: 4,
        max_cqe_version: 1,
        ..Default::default()
    };
    let mut resp = Mlx5IbAllocUcontextResp::default();
    let mut ncv = 0u32;
    let mut core = 0u64;
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_GET_CONTEXT)
        .out_ptr(
            UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS,
            (&raw mut ncv) as u64,
            4,
        )
        .out_ptr(
            UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT,
            (&raw mut core) as u64,
            8,
        )
        .in_ptr(UVERBS_ATTR_UHW_IN, req.as_bytes().as_ptr() as u64, 32)
        .out_ptr(
            UVERBS_ATTR_UHW_OUT,
            resp.as_mut_bytes().as_mut_ptr() as u64,
            72,
        )
        .build()
        .unwrap();
    dev.cmd_ioctl(&mut b).expect("GET_CONTEXT over ioctl");
    assert_eq!((ncv, core), (1, 1));
    assert_ne!(flags_of(&b, 3) & UVERBS_ATTR_F_VALID_OUTPUT, 0);
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_ASYNC_EVENT, UVERBS_METHOD_ASYNC_EVENT_ALLOC)
        .out_fd(UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE)
        .build()
        .unwrap();
    dev.cmd_ioctl(&mut b).expect("ASYNC_EVENT alloc");
    let async_fd = data_of(&b, 0) as i32;
    assert!(async_fd > 2);
    assert_eq!(dev.cmd_ioctl(&mut b), Err(Errno(libc::EEXIST)), "only once");
    let uars = (0..resp.tot_bfregs / 2)
        .map(|i| {
            dev.mmap(4096, libc::PROT_WRITE, mmap_offset(0, i) * 4096)
                .unwrap()
        })
        .collect();
    Ctx::from_parts(emu.clone(), dev, async_fd, resp, uars)
}

fn create_cq(ctx: &mut Ctx, entries: u32) -> Cq {
    let ncqe = entries.next_power_of_two();
    let buf = Buf::new(ncqe as usize * 64);
    for i in 0..ncqe as usize {
        buf.write(i * 64 + 63, &[0xF0]);
    }
    let db = ctx.db();
    let d = Mlx5IbCreateCq {
        buf_addr: buf.addr(),
        db_addr: db,
        cqe_size: 64,
        ..Default::default()
    };
    let mut resp_cqe = 0u32;
    let mut dr = [0u8; 8];
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE)
        .out_obj(UVERBS_ATTR_CREATE_CQ_HANDLE)
        .in_u32(UVERBS_ATTR_CREATE_CQ_CQE, ncqe - 1)
        .in_u64(UVERBS_ATTR_CREATE_CQ_USER_HANDLE, 0xC0FFEE)
        .in_u32(UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, 0)
        .out_ptr(
            UVERBS_ATTR_CREATE_CQ_RESP_CQE,
            (&raw mut resp_cqe) as u64,
            4,
        )
        .in_ptr(UVERBS_ATTR_UHW_IN, d.as_bytes().as_ptr() as u64, 32)
        .out_ptr(UVERBS_ATTR_UHW_OUT, dr.as_mut_ptr() as u64, 8)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b).expect("CQ_CREATE");
    assert_eq!(resp_cqe, ncqe - 1);
    let handle = data_of(&b, 0) as u32;
    Cq {
        handle,
        cqn: u32::from_ne_bytes(dr[..4].try_into().unwrap()),
        buf,
        db,
        ncqe,
        cqe_size: 64,
        ci: 0,
        arm_sn: 0,
    }
}

fn create_qp(ctx: &mut Ctx, pd: u32, cq: &Cq) -> Qp {
    let (sq, rq, shift) = (64u32, 16u32, 5u32);
    let buf = Buf::new(((rq as usize) << shift) + sq as usize * 64);
    let db = ctx.db();
    let uidx = 0x200 + db as u32 % 0x1000;
    let d = Mlx5IbCreateQp {
        buf_addr: buf.addr(),
        db_addr: db,
        sq_wqe_count: sq,
        rq_wqe_count: rq,
        rq_wqe_shift: shift,
        uidx,
        ..Default::default()
    };
    let cap = IbUverbsQpCap {
        max_send_wr: 32,
        max_recv_wr: rq,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let mut rcap = IbUverbsQpCap::default();
    let mut qpn = 0u32;
    let mut dr = [0u8; 40];
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE)
        .out_obj(UVERBS_ATTR_CREATE_QP_HANDLE)
        .in_obj(UVERBS_ATTR_CREATE_QP_PD_HANDLE, pd)
        .in_obj(UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, cq.handle)
        .in_obj(UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, cq.handle)
        .in_u64(UVERBS_ATTR_CREATE_QP_USER_HANDLE, 7)
        .in_ptr(
            UVERBS_ATTR_CREATE_QP_CAP,
            cap.as_bytes().as_ptr() as u64,
            20,
        )
        .in_u32(UVERBS_ATTR_CREATE_QP_TYPE, u32::from(RC))
        .out_ptr(
            UVERBS_ATTR_CREATE_QP_RESP_CAP,
            rcap.as_mut_bytes().as_mut_ptr() as u64,
            20,
        )
        .out_ptr(UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, (&raw mut qpn) as u64, 4)
        .in_ptr(UVERBS_ATTR_UHW_IN, d.as_bytes().as_ptr() as u64, 56)
        .out_ptr(UVERBS_ATTR_UHW_OUT, dr.as_mut_ptr() as u64, 40)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b).expect("QP_CREATE");
    assert_eq!(rcap.max_recv_wr, rq);
    let bfreg = u32::from_ne_bytes(dr[..4].try_into().unwrap());
    Qp {
        handle: data_of(&b, 0) as u32,
        qpn,
        uidx,
        qp_type: RC,
        buf,
        db,
        sq_cnt: sq,
        rq_cnt: rq,
        rq_shift: shift,
        sq_pi: 0,
        rq_pi: 0,
        bfreg,
        bf_half: 0,
    }
}

#[test]
fn objects_created_over_ioctl_carry_traffic() {
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        flavour: Flavour::Modern,
        ..EmuConfig::default()
    });
    let mut ctx = open_ioctl(&emu);
    assert_eq!(ctx.resp.cqe_version, 1);
    // QUERY_PORT and the GID entries.
    let pr = query_port_ex(&ctx);
    let info = emu.hca_info(0).unwrap();
    assert_eq!(pr.legacy_resp.lid, info.lid);
    let e = gid_entry(&ctx, 0);
    assert_eq!(e.map(|_| ()), Ok(()), "gid index 0");
    assert_eq!(
        gid_entry(&ctx, 1).map(|_| ()),
        Err(Errno(libc::ENODATA)),
        "gid index 1"
    );
    assert_eq!(e.unwrap().gid.as_bytes(), &info.port_gid);
    // Objects.
    let pd = ctx.alloc_pd();
    let mut cq = create_cq(&mut ctx, 32);
    let q1 = create_qp(&mut ctx, pd, &cq);
    let mut q2 = create_qp(&mut ctx, pd, &cq);
    bring_up(&ctx, &q1, info.lid, q2.qpn, Knobs::default());
    bring_up(&ctx, &q2, info.lid, q1.qpn, Knobs::default());
    let mut q1 = q1;
    let m = Buf::new(4096);
    let (mr, lkey, _) = ctx.reg_mr(pd, m.addr(), 4096, ALL_ACCESS).unwrap();
    m.write(0, b"via ioctl objects");
    q2.post_recv(&[(m.addr() + 2048, 64, lkey)]);
    let i = q1.build_send(
        SendOpcode::SEND,
        0,
        FM_CE_SE_CQ_UPDATE,
        [0; 4],
        DataSeg::new(17, lkey, m.addr()).as_bytes(),
    );
    q1.ring(&ctx, i, Ring::Doorbell);
    emu.run_until_idle();
    assert_eq!(drain(&mut cq).len(), 2);
    assert_eq!(m.read(2048, 17), b"via ioctl objects");
    // Destroy over ioctl: QP (events_reported), CQ busy until its QPs are gone, then ok.
    let mut cq_resp = [0u32; 2];
    let mut bcq = IoctlBuilder::new(UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_CQ_HANDLE, cq.handle)
        .out_ptr(UVERBS_ATTR_DESTROY_CQ_RESP, cq_resp.as_mut_ptr() as u64, 8)
        .build()
        .unwrap();
    assert_eq!(ctx.dev.cmd_ioctl(&mut bcq), Err(Errno(libc::EBUSY)));
    for q in [&q1, &q2] {
        let mut ev = 99u32;
        let mut b = IoctlBuilder::new(UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY)
            .in_obj(UVERBS_ATTR_DESTROY_QP_HANDLE, q.handle)
            .out_ptr(UVERBS_ATTR_DESTROY_QP_RESP, (&raw mut ev) as u64, 4)
            .build()
            .unwrap();
        ctx.dev.cmd_ioctl(&mut b).unwrap();
        assert_eq!(ev, 0);
    }
    ctx.dev.cmd_ioctl(&mut bcq).unwrap();
    assert_eq!(cq_resp, [0, 0]);
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_MR_HANDLE, mr)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b).unwrap();
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_PD_HANDLE, pd)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b).unwrap();
    assert_eq!(
        ctx.dev.cmd_ioctl(&mut b),
        Err(Errno(libc::EINVAL)),
        "already destroyed"
    );
    // A mandatory attribute the method does not know; an unknown method.
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_PD_HANDLE, pd)
        .in_u32(0x1002, 0)
        .build()
        .unwrap();
    assert_eq!(ctx.dev.cmd_ioctl(&mut b), Err(Errno(libc::EPROTONOSUPPORT)));
    let mut b = IoctlBuilder::new(0x1000, 0x1000).build().unwrap();
    assert_eq!(
        ctx.dev.cmd_ioctl(&mut b),
        Err(Errno(libc::EINVAL)),
        "DEVX_OTHER without its mandatory CMD_IN (tests/unsupported.rs has the DEVX answers)"
    );
    let mut b = IoctlBuilder::new(0x1000, 0x1007).build().unwrap();
    assert_eq!(
        ctx.dev.cmd_ioctl(&mut b),
        Err(Errno(libc::EPROTONOSUPPORT)),
        "a method that does not exist"
    );
}

fn alloc_uar(ctx: &Ctx, ty: u32) -> Result<(u32, u64, u32, u32), Errno> {
    let (mut off, mut len, mut id) = (0u64, 0u32, 0u32);
    let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_ALLOC)
        .out_obj(MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE)
        .in_u32(MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, ty)
        .out_ptr(
            MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET,
            (&raw mut off) as u64,
            8,
        )
        .out_ptr(
            MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
            (&raw mut len) as u64,
            4,
        )
        .out_ptr(MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID, (&raw mut id) as u64, 4)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b)?;
    Ok((data_of(&b, 0) as u32, off, len, id))
}

#[test]
fn dynamic_uars_when_configured() {
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        dyn_uar: true,
        ..EmuConfig::default()
    });
    let dev = emu.open(0).unwrap();
    let req = Mlx5IbAllocUcontextReqV2 {
        total_num_bfregs: 16,
        num_low_latency_bfregs: 4,
        max_cqe_version: 1,
        lib_caps: MLX5_LIB_CAP_4K_UAR | MLX5_LIB_CAP_DYN_UAR,
        ..Default::default()
    };
    let (core, drv) = write_cmd(
        &dev,
        mlx5_ffi::uverbs::IB_USER_VERBS_CMD_GET_CONTEXT,
        &[0u8; 8],
        req.as_bytes(),
        8,
        72,
    )
    .unwrap();
    let resp = <Mlx5IbAllocUcontextResp as zerocopy::FromBytes>::read_from_bytes(&drv).unwrap();
    assert_eq!(resp.tot_bfregs, 0, "dynamic UARs granted");
    assert_eq!(
        dev.mmap(4096, libc::PROT_WRITE, 0).map(|_| ()),
        Err(Errno(libc::EINVAL)),
        "legacy UAR mmaps are refused"
    );
    let async_fd = i32::from_ne_bytes(core[..4].try_into().unwrap());
    let mut ctx = Ctx::from_parts(emu.clone(), dev.clone(), async_fd, resp, Vec::new());
    let (_, nc_off, nc_len, nc_id) = alloc_uar(&ctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC).unwrap();
    let (bf_handle, bf_off, _, bf_id) = alloc_uar(&ctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF).unwrap();
    assert_eq!(nc_len, 4096);
    assert_ne!(nc_id, bf_id);
    let nc = dev.mmap(4096, libc::PROT_WRITE, nc_off).unwrap();
    let bf = dev.mmap(4096, libc::PROT_WRITE, bf_off).unwrap();
    ctx.uars = vec![nc, bf];
    let pd = ctx.alloc_pd();
    // CQ: a UAR page is mandatory.
    let cqbuf = Buf::new(4096);
    let db = ctx.db();
    let c = mlx5_ffi::uverbs::IbUverbsCreateCq {
        cqe: 31,
        comp_channel: -1,
        ..Default::default()
    };
    let mut d = Mlx5IbCreateCq {
        buf_addr: cqbuf.addr(),
        db_addr: db,
        cqe_size: 64,
        ..Default::default()
    };
    let r = write_cmd(&ctx.dev, 18, c.as_bytes(), d.as_bytes(), 8, 8);
    assert_eq!(r.map(|_| ()), Err(Errno(libc::EINVAL)));
    d.flags = MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX;
    d.uar_page_index = nc_id as u16;
    for i in 0..32 {
        cqbuf.write(i * 64 + 63, &[0xF0]);
    }
    let (o, dr) = write_cmd(&ctx.dev, 18, c.as_bytes(), d.as_bytes(), 8, 8).unwrap();
    let mut cq = Cq {
        handle: u32::from_ne_bytes(o[..4].try_into().unwrap()),
        cqn: u32::from_ne_bytes(dr[..4].try_into().unwrap()),
        buf: cqbuf,
        db,
        ncqe: 32,
        cqe_size: 64,
        ci: 0,
        arm_sn: 0,
    };
    // QPs on the BF UAR.
    let mk = |ctx: &mut Ctx| {
        let qbuf = Buf::new(16 * 32 + 64 * 64);
        let qdb = ctx.db();
        let core = mlx5_ffi::uverbs::IbUverbsCreateQp {
            pd_handle: pd,
            send_cq_handle: cq.handle,
            recv_cq_handle: cq.handle,
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 2,
            qp_type: RC,
            ..Default::default()
        };
        let d = Mlx5IbCreateQp {
            buf_addr: qbuf.addr(),
            db_addr: qdb,
            sq_wqe_count: 64,
            rq_wqe_count: 16,
            rq_wqe_shift: 5,
            flags: MLX5_QP_FLAG_UAR_PAGE_INDEX,
            uidx: 0x300 + qdb as u32 % 0x100,
            bfreg_index: bf_id,
            ..Default::default()
        };
        let (o, dr) = write_cmd(&ctx.dev, 24, core.as_bytes(), d.as_bytes(), 32, 40).unwrap();
        assert_eq!(
            u32::from_ne_bytes(dr[..4].try_into().unwrap()),
            0x8000_0000,
            "MLX5_IB_INVALID_BFREG"
        );
        Qp {
            handle: u32::from_ne_bytes(o[..4].try_into().unwrap()),
            qpn: u32::from_ne_bytes(o[4..8].try_into().unwrap()),
            uidx: d.uidx,
            qp_type: RC,
            buf: qbuf,
            db: qdb,
            sq_cnt: 64,
            rq_cnt: 16,
            rq_shift: 5,
            sq_pi: 0,
            rq_pi: 0,
            bfreg: 4, // ctx.uars[1] (the BF page), register 0
            bf_half: 0,
        }
    };
    let mut q1 = mk(&mut ctx);
    let mut q2 = mk(&mut ctx);
    let lid = emu.hca_info(0).unwrap().lid;
    bring_up(&ctx, &q1, lid, q2.qpn, Knobs::default());
    bring_up(&ctx, &q2, lid, q1.qpn, Knobs::default());
    let m = Buf::new(4096);
    let (_, lkey, _) = ctx.reg_mr(pd, m.addr(), 4096, ALL_ACCESS).unwrap();
    m.write(0, b"dynamic uar");
    q2.post_recv(&[(m.addr() + 1024, 64, lkey)]);
    let i = q1.build_send(
        SendOpcode::SEND,
        0,
        FM_CE_SE_CQ_UPDATE,
        [0; 4],
        DataSeg::new(11, lkey, m.addr()).as_bytes(),
    );
    q1.ring(&ctx, i, Ring::BlueFlame);
    emu.run_until_idle();
    assert_eq!(drain(&mut cq).len(), 2);
    assert_eq!(m.read(1024, 11), b"dynamic uar");
    assert_eq!(emu.counters(0).bf_writes, 1);
    // Destroyed UARs can no longer be mapped.
    let mut b = IoctlBuilder::new(MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_DESTROY)
        .in_obj(MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE, bf_handle)
        .build()
        .unwrap();
    ctx.dev.cmd_ioctl(&mut b).unwrap();
    assert_eq!(
        dev.mmap(4096, libc::PROT_WRITE, bf_off).map(|_| ()),
        Err(Errno(libc::EINVAL))
    );
}
