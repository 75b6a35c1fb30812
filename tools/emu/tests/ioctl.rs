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
    dev.ioctl(&mut b).expect("GET_CONTEXT over ioctl");
    assert_eq!((ncv, core), (1, 1));
    assert_ne!(flags_of(&b, 3) & UVERBS_ATTR_F_VALID_OUTPUT, 0);
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_ASYNC_EVENT, UVERBS_METHOD_ASYNC_EVENT_ALLOC)
        .out_fd(UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE)
        .build()
        .unwrap();
    dev.ioctl(&mut b).expect("ASYNC_EVENT alloc");
    let async_fd = data_of(&b, 0) as i32;
    assert!(async_fd > 2);
    assert_eq!(dev.ioctl(&mut b), Err(Errno(libc::EEXIST)), "only once");
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
    ctx.dev.ioctl(&mut b).expect("CQ_CREATE");
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
    ctx.dev.ioctl(&mut b).expect("QP_CREATE");
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
    let mut pr = IbUverbsQueryPortRespEx::default();
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_PORT)
        .in_u32(UVERBS_ATTR_QUERY_PORT_PORT_NUM, 1)
        .out_ptr(
            UVERBS_ATTR_QUERY_PORT_RESP,
            pr.as_mut_bytes().as_mut_ptr() as u64,
            48,
        )
        .build()
        .unwrap();
    ctx.dev.ioctl(&mut b).unwrap();
    let info = emu.hca_info(0).unwrap();
    assert_eq!(pr.legacy_resp.lid, info.lid);
    let mut e = IbUverbsGidEntry::default();
    for (index, want) in [(0u32, Ok(())), (1, Err(Errno(libc::ENODATA)))] {
        let mut b = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_ENTRY)
            .in_u32(UVERBS_ATTR_QUERY_GID_ENTRY_PORT, 1)
            .in_u32(UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX, index)
            .in_u32(UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, 0)
            .out_ptr(
                UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY,
                e.as_mut_bytes().as_mut_ptr() as u64,
                32,
            )
            .build()
            .unwrap();
        assert_eq!(ctx.dev.ioctl(&mut b), want, "gid index {index}");
    }
    assert_eq!(e.gid.as_bytes(), &info.port_gid);
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
    assert_eq!(ctx.dev.ioctl(&mut bcq), Err(Errno(libc::EBUSY)));
    for q in [&q1, &q2] {
        let mut ev = 99u32;
        let mut b = IoctlBuilder::new(UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY)
            .in_obj(UVERBS_ATTR_DESTROY_QP_HANDLE, q.handle)
            .out_ptr(UVERBS_ATTR_DESTROY_QP_RESP, (&raw mut ev) as u64, 4)
            .build()
            .unwrap();
        ctx.dev.ioctl(&mut b).unwrap();
        assert_eq!(ev, 0);
    }
    ctx.dev.ioctl(&mut bcq).unwrap();
    assert_eq!(cq_resp, [0, 0]);
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_MR_HANDLE, mr)
        .build()
        .unwrap();
    ctx.dev.ioctl(&mut b).unwrap();
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_PD_HANDLE, pd)
        .build()
        .unwrap();
    ctx.dev.ioctl(&mut b).unwrap();
    assert_eq!(
        ctx.dev.ioctl(&mut b),
        Err(Errno(libc::EINVAL)),
        "already destroyed"
    );
    // A mandatory attribute the method does not know; an unknown method.
    let mut b = IoctlBuilder::new(UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_PD_HANDLE, pd)
        .in_u32(0x1002, 0)
        .build()
        .unwrap();
    assert_eq!(ctx.dev.ioctl(&mut b), Err(Errno(libc::EPROTONOSUPPORT)));
    let mut b = IoctlBuilder::new(0x1000, 0x1000).build().unwrap();
    assert_eq!(
        ctx.dev.ioctl(&mut b),
        Err(Errno(libc::EPROTONOSUPPORT)),
        "DEVX is not offered"
    );
}
