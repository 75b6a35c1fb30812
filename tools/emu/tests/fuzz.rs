//! Command fuzzing: mutated write() and ioctl(INVOKE_WRITE) commands through every handler
//! must never crash the emulator; every answer is success or a plain errno.
//!
//! `MLX5_EMU_FUZZ_ITERS` sets the number of mutated commands (default 1,000,000 in a release
//! build, 100,000 in a debug build, where every integer overflow would panic: the emulated
//! kernel must not have any).
//! Pointer fields that the kernel *writes through* (responses, and a new CQ's doorbell record,
//! whose arm word the emulated kernel initializes) are only ever mutated to a valid scratch
//! area, NULL or an unmapped address, so the harness cannot corrupt itself;
//! everything else (sizes, handles, flags, masks, read-only pointers) is mutated freely.
//! Commands that hand out file descriptors (GET_CONTEXT, CREATE_COMP_CHANNEL) are not sent
//! after mutation, so the harness does not run out of descriptors.

mod common;

use common::*;
use mlx5_emu::Errno;
use mlx5_ffi::ioctl::*;
use mlx5_ffi::mlx5::*;
use mlx5_ffi::uverbs::*;
use zerocopy::IntoBytes;

/// A template: the command buffer and the byte offsets of response pointers in it.
struct Template {
    ioctl: bool,
    buf: Vec<u8>,
    out_ptrs: Vec<usize>,
}

fn legacy(command: u32, core: &[u8], driver: &[u8], out_len: usize, scratch: u64) -> Template {
    let mut core = core.to_vec();
    let has_ptr = !matches!(
        command,
        IB_USER_VERBS_CMD_DEALLOC_PD
            | IB_USER_VERBS_CMD_DEREG_MR
            | IB_USER_VERBS_CMD_MODIFY_QP
            | IB_USER_VERBS_CMD_MODIFY_SRQ
            | IB_USER_VERBS_CMD_DESTROY_AH
    );
    if has_ptr {
        core[..8].copy_from_slice(&scratch.to_ne_bytes());
    }
    let buf = mlx5_ffi::cmd::build_write(command, &core, driver, out_len).unwrap();
    Template {
        ioctl: false,
        buf,
        out_ptrs: if has_ptr { vec![8] } else { vec![] },
    }
}

fn templates(ctx: &mut Ctx, scratch: u64, mem: &Buf) -> Vec<Template> {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8, 64, -1);
    let qp = ctx.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    let (mr, _, _) = ctx.reg_mr(pd, mem.addr(), 4096, ALL_ACCESS).unwrap();
    let db = ctx.db();
    let mut t = vec![
        legacy(IB_USER_VERBS_CMD_QUERY_DEVICE, &[0u8; 8], &[], 176, scratch),
        legacy(
            IB_USER_VERBS_CMD_QUERY_PORT,
            IbUverbsQueryPort {
                port_num: 1,
                ..Default::default()
            }
            .as_bytes(),
            &[],
            40,
            scratch,
        ),
        legacy(IB_USER_VERBS_CMD_ALLOC_PD, &[0u8; 8], &[], 8, scratch),
        legacy(
            IB_USER_VERBS_CMD_DEALLOC_PD,
            &pd.to_ne_bytes(),
            &[],
            0,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_REG_MR,
            IbUverbsRegMr {
                start: mem.addr(),
                length: 4096,
                hca_va: mem.addr(),
                pd_handle: pd,
                access_flags: 7,
                ..Default::default()
            }
            .as_bytes(),
            &[],
            12,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_DEREG_MR,
            &mr.to_ne_bytes(),
            &[],
            0,
            scratch,
        ),
        {
            let mut t = legacy(
                IB_USER_VERBS_CMD_CREATE_CQ,
                IbUverbsCreateCq {
                    cqe: 7,
                    comp_channel: -1,
                    ..Default::default()
                }
                .as_bytes(),
                Mlx5IbCreateCq {
                    buf_addr: mem.addr(),
                    db_addr: db,
                    cqe_size: 64,
                    ..Default::default()
                }
                .as_bytes(),
                16,
                scratch,
            );
            // The emulated kernel writes the new CQ's arm record (db_addr + 4, kernel/cq.rs):
            // db_addr is a pointer the kernel writes through (a bit flip of it once pointed
            // into this harness's heap, 1 run in ~60: the crash was the harness's own).
            t.out_ptrs
                .push(size_of::<IbUverbsCmdHdr>() + size_of::<IbUverbsCreateCq>() + 8);
            t
        },
        legacy(
            IB_USER_VERBS_CMD_DESTROY_CQ,
            IbUverbsDestroyCq {
                cq_handle: cq.handle,
                ..Default::default()
            }
            .as_bytes(),
            &[],
            8,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_CREATE_QP,
            IbUverbsCreateQp {
                pd_handle: pd,
                send_cq_handle: cq.handle,
                recv_cq_handle: cq.handle,
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                qp_type: RC,
                ..Default::default()
            }
            .as_bytes(),
            Mlx5IbCreateQp {
                buf_addr: mem.addr(),
                db_addr: db,
                sq_wqe_count: 8,
                rq_wqe_count: 4,
                rq_wqe_shift: 4,
                uidx: 5,
                ..Default::default()
            }
            .as_bytes(),
            72,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_QUERY_QP,
            IbUverbsQueryQp {
                qp_handle: qp.handle,
                attr_mask: 0,
                ..Default::default()
            }
            .as_bytes(),
            &[],
            128,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_MODIFY_QP,
            IbUverbsModifyQp {
                qp_handle: qp.handle,
                attr_mask: 0x39,
                qp_state: 1,
                port_num: 1,
                ..Default::default()
            }
            .as_bytes(),
            &[],
            0,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_DESTROY_QP,
            IbUverbsDestroyQp {
                qp_handle: qp.handle,
                ..Default::default()
            }
            .as_bytes(),
            &[],
            4,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_CREATE_SRQ,
            IbUverbsCreateSrq {
                pd_handle: pd,
                max_wr: 3,
                max_sge: 1,
                ..Default::default()
            }
            .as_bytes(),
            Mlx5IbCreateSrq {
                buf_addr: mem.addr(),
                db_addr: db,
                ..Default::default()
            }
            .as_bytes(),
            24,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_MODIFY_SRQ,
            &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            &[],
            0,
            scratch,
        ),
        legacy(IB_USER_VERBS_CMD_QUERY_SRQ, &[0u8; 16], &[], 16, scratch),
        legacy(IB_USER_VERBS_CMD_DESTROY_SRQ, &[0u8; 16], &[], 4, scratch),
        legacy(
            IB_USER_VERBS_CMD_CREATE_AH,
            &{
                let mut c = [0u8; 56];
                c[16..20].copy_from_slice(&pd.to_ne_bytes());
                c[48] = 2;
                c[54] = 1;
                c
            },
            &[],
            4,
            scratch,
        ),
        legacy(
            IB_USER_VERBS_CMD_DESTROY_AH,
            &0u32.to_ne_bytes(),
            &[],
            0,
            scratch,
        ),
    ];
    let ex = mlx5_ffi::cmd::build_write_ex(
        IB_USER_VERBS_CMD_QUERY_DEVICE,
        scratch,
        &[0u8; 8],
        304,
        &[],
        104,
    )
    .unwrap();
    t.push(Template {
        ioctl: false,
        buf: ex,
        out_ptrs: vec![8],
    });
    let io = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE)
        .in_u64(UVERBS_ATTR_WRITE_CMD, u64::from(IB_USER_VERBS_CMD_ALLOC_PD))
        .in_u64(UVERBS_ATTR_CORE_IN, 0)
        .out_ptr(UVERBS_ATTR_CORE_OUT, scratch, 4)
        .out_ptr(UVERBS_ATTR_UHW_OUT, scratch + 64, 4)
        .build()
        .unwrap();
    t.push(Template {
        ioctl: true,
        buf: io,
        out_ptrs: vec![24 + 16 * 2 + 8, 24 + 16 * 3 + 8],
    });
    let io = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_INVOKE_WRITE)
        .in_u64(
            UVERBS_ATTR_WRITE_CMD,
            u64::from(IB_USER_VERBS_CMD_QUERY_PORT),
        )
        .in_ptr(UVERBS_ATTR_CORE_IN, scratch + 4096, 16)
        .out_ptr(UVERBS_ATTR_CORE_OUT, scratch, 40)
        .build()
        .unwrap();
    t.push(Template {
        ioctl: true,
        buf: io,
        out_ptrs: vec![24 + 16 * 2 + 8],
    });
    // Object methods: QUERY_PORT, CQ create, QP destroy, PD destroy.
    let io = IoctlBuilder::new(UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_PORT)
        .in_u32(UVERBS_ATTR_QUERY_PORT_PORT_NUM, 1)
        .out_ptr(UVERBS_ATTR_QUERY_PORT_RESP, scratch, 48)
        .build()
        .unwrap();
    t.push(method_tpl(io));
    let d = Mlx5IbCreateCq {
        buf_addr: mem.addr(),
        db_addr: db,
        cqe_size: 64,
        ..Default::default()
    };
    scratch_write(scratch + 8192, d.as_bytes());
    let io = IoctlBuilder::new(UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE)
        .out_obj(UVERBS_ATTR_CREATE_CQ_HANDLE)
        .in_u32(UVERBS_ATTR_CREATE_CQ_CQE, 7)
        .in_u32(UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, 0)
        .out_ptr(UVERBS_ATTR_CREATE_CQ_RESP_CQE, scratch, 4)
        .in_ptr(UVERBS_ATTR_UHW_IN, scratch + 8192, 32)
        .out_ptr(UVERBS_ATTR_UHW_OUT, scratch + 64, 8)
        .build()
        .unwrap();
    t.push(method_tpl(io));
    let io = IoctlBuilder::new(UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_QP_HANDLE, qp.handle)
        .out_ptr(UVERBS_ATTR_DESTROY_QP_RESP, scratch, 4)
        .build()
        .unwrap();
    t.push(method_tpl(io));
    let io = IoctlBuilder::new(UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY)
        .in_obj(UVERBS_ATTR_DESTROY_PD_HANDLE, pd)
        .build()
        .unwrap();
    t.push(method_tpl(io));
    t
}

/// An ioctl object-method template (its attribute values are never mutated).
fn method_tpl(buf: Vec<u8>) -> Template {
    Template {
        ioctl: true,
        buf,
        out_ptrs: vec![],
    }
}

/// Store bytes into the harness's own scratch area.
fn scratch_write(addr: u64, bytes: &[u8]) {
    for (i, &b) in bytes.iter().enumerate() {
        let p = std::ptr::with_exposed_provenance_mut::<u8>(addr as usize + i);
        // SAFETY: `addr..addr+len` lies inside the 1 MiB scratch Buf the harness owns.
        unsafe { p.write_volatile(b) };
    }
}

fn fd_producing(t: &Template, buf: &[u8]) -> bool {
    if t.ioctl && buf.len() >= 6 {
        let (obj, meth) = (
            u16::from_ne_bytes([buf[2], buf[3]]),
            u16::from_ne_bytes([buf[4], buf[5]]),
        );
        if matches!((obj, meth), (0, 3) | (16, 0)) {
            return true;
        }
    }
    let cmd = if t.ioctl {
        (0..buf.len().saturating_sub(24) / 16)
            .map(|i| 24 + 16 * i)
            .find(|&o| buf.get(o..o + 2) == Some(&UVERBS_ATTR_WRITE_CMD.to_ne_bytes()[..]))
            .and_then(|o| buf.get(o + 8..o + 12))
            .map_or(1, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    } else {
        buf.get(0..4)
            .map_or(1, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    matches!(cmd & 0xff, 0 | 17)
}

#[test]
fn a_million_mutated_commands_do_not_crash() {
    let iters: usize = std::env::var("MLX5_EMU_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            100_000
        } else {
            1_000_000
        });
    let emu = stepped(1);
    let scratch = Buf::new(1 << 20);
    let mem = Buf::new(64 * 1024);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Valid, NULL, unmapped, kernel half, and the top of the address space (where a response
    // pointer plus a response length overflows 64 bits).
    let bad_ptrs = [
        scratch.addr(),
        0,
        0x1000,
        0xffff_8000_0000_0000,
        u64::MAX,
        u64::MAX - 7,
        (1 << 47) - 8,
    ];
    let interesting: [u32; 8] = [0, 1, 2, 3, 0xff, 0xffff, 0x8000_0000, 0xffff_ffff];
    let mut ok = 0usize;
    let mut errs = std::collections::BTreeMap::<i32, usize>::new();
    let mut done = 0;
    while done < iters {
        let mut ctx = Ctx::open(&emu, 0);
        let t = templates(&mut ctx, scratch.addr(), &mem);
        for _ in 0..5000 {
            if done >= iters {
                break;
            }
            done += 1;
            let tpl = &t[rng.pick(t.len())];
            let mut b = tpl.buf.clone();
            for _ in 0..=rng.pick(4) {
                match rng.pick(6) {
                    0 if !b.is_empty() => {
                        let i = rng.pick(b.len());
                        b[i] ^= 1 << rng.pick(8);
                    }
                    1 if b.len() >= 4 => {
                        let i = rng.pick(b.len() - 3) & !3;
                        b[i..i + 4].copy_from_slice(&interesting[rng.pick(8)].to_ne_bytes());
                    }
                    2 => b.truncate(rng.pick(b.len() + 1)),
                    3 => b.extend((0..rng.pick(24)).map(|_| rng.next() as u8)),
                    4 if !b.is_empty() => {
                        let i = rng.pick(b.len());
                        b[i] = rng.next() as u8;
                    }
                    _ => {}
                }
            }
            // Response pointers: only valid, NULL or unmapped.
            for &o in &tpl.out_ptrs {
                if b.len() >= o + 8 {
                    let n = if rng.pick(8) == 0 { bad_ptrs.len() } else { 1 };
                    let p = bad_ptrs[rng.pick(n)];
                    b[o..o + 8].copy_from_slice(&p.to_ne_bytes());
                }
            }
            if tpl.ioctl {
                // Also keep pointers of every attribute that could be an output sane.
                for i in 0..b.len().saturating_sub(24) / 16 {
                    let o = 24 + 16 * i;
                    let id = u16::from_ne_bytes([b[o], b[o + 1]]);
                    let invoke = u16::from_ne_bytes([b[2], b[3]]) == UVERBS_OBJECT_DEVICE
                        && u16::from_ne_bytes([b[4], b[5]]) == UVERBS_METHOD_INVOKE_WRITE;
                    if !invoke {
                        // Object methods: attribute values stay as in the template (small
                        // handles/values or scratch pointers), whatever else was mutated, or
                        // (1 in 8) become an extreme address, which names no memory at all.
                        let orig = tpl
                            .buf
                            .get(o + 8..o + 16)
                            .map_or(scratch.addr().to_ne_bytes(), |x| {
                                x.try_into().unwrap_or([0; 8])
                            });
                        let v = if rng.pick(8) == 0 {
                            bad_ptrs[1 + rng.pick(bad_ptrs.len() - 1)].to_ne_bytes()
                        } else {
                            orig
                        };
                        b[o + 8..o + 16].copy_from_slice(&v);
                    } else if id != UVERBS_ATTR_CORE_IN
                        && id != UVERBS_ATTR_WRITE_CMD
                        && id != UVERBS_ATTR_UHW_IN
                    {
                        // Outputs: the scratch area, or (1 in 8) an extreme address.
                        let p = if rng.pick(8) == 0 {
                            bad_ptrs[1 + rng.pick(bad_ptrs.len() - 1)]
                        } else {
                            scratch.addr()
                        };
                        b[o + 8..o + 16].copy_from_slice(&p.to_ne_bytes());
                    }
                }
            }
            if fd_producing(tpl, &b) {
                continue;
            }
            let r = if tpl.ioctl {
                ctx.dev.cmd_ioctl(&mut b).map(|_| 0)
            } else {
                ctx.dev.cmd_write(&b)
            };
            match r {
                Ok(_) => ok += 1,
                Err(Errno(e)) => {
                    assert!(e > 0 && e < 200, "odd errno {e}");
                    *errs.entry(e).or_default() += 1;
                }
            }
        }
        // SAFETY: closing the async fd this context handed out (the harness owns it).
        unsafe { libc::close(ctx.async_fd) };
    }
    println!("{done} mutated commands: {ok} accepted, errors by errno: {errs:?}");
    assert!(ok > 0 && !errs.is_empty());
}
