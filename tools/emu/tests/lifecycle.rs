//! What the emulator holds, and for how long, and the order a failing queue completes in:
//! completion channels release their descriptors when the user closes them (20,000
//! create/close cycles: the process's descriptor count stays flat; was +2 per cycle, then
//! EMFILE), a closed channel's reused descriptor number is not taken for the channel
//! (EBADF), the device thread is joined when the last handle of an `Emulator` drops (was:
//! up to 19 threads alive at once over 2,000 cycles), and after a forged response no
//! success completion follows a flush (was: READ flushed, then WRITE_IMM SUCCESS, then the
//! failing SEND's error).
//!
//! The tests count the process's descriptors and threads, so they run one at a time.

mod common;

use std::sync::Mutex;

use common::*;
use mlx5_emu::{EmuConfig, Emulator, Fabric, RunMode, WakeMode, roce_icrc};
use mlx5_ffi::uverbs::*;
use mlx5_hw::opcodes::{SendOpcode, Syndrome};
use mlx5_hw::wqe::{DataSeg, FM_CE_SE_CQ_UPDATE, RaddrSeg};
use zerocopy::IntoBytes;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc").count()
}

/// The device threads left once those that were joined have been reaped: `pthread_join`
/// returns at the exiting thread's tid-clear wake-up, which the kernel sends before it removes
/// the task from `/proc/self/task`, so a joined thread preempted in between is still listed
/// for a moment (seen once at load 15). Up to 10 ms of grace, far below the lifetime of the
/// unjoined threads this test exists to catch (they piled up over many cycles).
fn settled_emu_threads() -> usize {
    let mut n = emu_threads();
    for _ in 0..200 {
        if n == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
        n = emu_threads();
    }
    n
}

fn emu_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim() == "mlx5-emu")
        .count()
}

fn close(fd: i32) {
    // SAFETY: closing a descriptor this test owns (the user end of a channel).
    assert_eq!(unsafe { libc::close(fd) }, 0);
}

/// CREATE_CQ on completion channel `fd`: Ok(handle) or the errno.
fn create_cq_on(ctx: &mut Ctx, fd: i32, cq_buf: &Buf) -> Result<u32, mlx5_emu::Errno> {
    let db = ctx.db();
    let c = IbUverbsCreateCq {
        response: 0,
        user_handle: 1,
        cqe: 7,
        comp_vector: 0,
        comp_channel: fd,
        reserved: 0,
    };
    let d = mlx5_ffi::mlx5::Mlx5IbCreateCq {
        buf_addr: cq_buf.addr(),
        db_addr: db,
        cqe_size: 64,
        ..Default::default()
    };
    let (o, _) = write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_CREATE_CQ,
        c.as_bytes(),
        d.as_bytes(),
        8,
        8,
    )?;
    Ok(u32::from_ne_bytes([o[0], o[1], o[2], o[3]]))
}

fn destroy_cq(ctx: &Ctx, handle: u32) {
    let c = IbUverbsDestroyCq {
        response: 0,
        cq_handle: handle,
        reserved: 0,
    };
    write_cmd(
        &ctx.dev,
        IB_USER_VERBS_CMD_DESTROY_CQ,
        c.as_bytes(),
        &[],
        8,
        0,
    )
    .expect("DESTROY_CQ");
}

#[test]
fn completion_channels_release_their_descriptors_when_closed() {
    let _one = serial();
    let emu = stepped(1);
    let mut ctx = Ctx::open(&emu, 0);
    let cq_buf = Buf::new(8 * 64);
    let before = open_fds();
    for i in 0..20_000 {
        let fd = ctx.comp_channel();
        if i % 1000 == 0 {
            // A channel in use by a CQ outlives its descriptor (the CQ holds it, as the
            // kernel's CQ holds a reference to the event file), and goes with the CQ.
            let cq = create_cq_on(&mut ctx, fd, &cq_buf).expect("CQ on an open channel");
            close(fd);
            assert!(open_fds() <= before + 3, "cycle {i}: {} fds", open_fds());
            destroy_cq(&ctx, cq);
        } else {
            close(fd);
        }
    }
    let after = open_fds();
    assert!(
        after <= before + 2,
        "descriptors after 20,000 channels: {before} -> {after}"
    );
}

#[test]
fn a_reused_descriptor_number_is_not_taken_for_a_closed_channel() {
    let _one = serial();
    let emu = stepped(1);
    let mut ctx = Ctx::open(&emu, 0);
    let cq_buf = Buf::new(8 * 64);
    let fd = ctx.comp_channel();
    close(fd);
    // The lowest free number is the one just closed: a file that is no channel takes it.
    let f = std::fs::File::open("/dev/null").expect("/dev/null");
    let reused = std::os::fd::AsRawFd::as_raw_fd(&f);
    assert_eq!(reused, fd, "the number was reused");
    assert_eq!(
        create_cq_on(&mut ctx, reused, &cq_buf),
        Err(mlx5_emu::Errno(libc::EBADF)),
        "lookup_get_fd_uobject: not a completion channel"
    );
    // An open channel still works.
    let ch = ctx.comp_channel();
    let cq = create_cq_on(&mut ctx, ch, &cq_buf).expect("CQ");
    destroy_cq(&ctx, cq);
    close(ch);
}

#[test]
fn device_threads_are_joined_when_the_emulator_drops() {
    let _one = serial();
    for mode in [WakeMode::Fault, WakeMode::Poll] {
        for i in 0..1000 {
            let emu = Emulator::with_wake(EmuConfig::default(), mode);
            if i % 2 == 0 {
                // With a context (and so a surface holding the world) too.
                let dev = emu.open(0).expect("open");
                drop(emu);
                drop(dev);
            } else {
                drop(emu);
            }
            assert_eq!(
                settled_emu_threads(),
                0,
                "{mode:?}, cycle {i}: device threads alive"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// A forged response: the completion order of a queue that fails with requests in flight.

const PEER_QPN: u32 = 0x00_BEEF;
const FIRST_PSN: u32 = 0x100;
const RC_ACK: u8 = 0x11;

/// An ACK-type response (BTH, AETH with `syndrome`, ICRC) to QP `qpn` at `psn`.
fn ack(qpn: u32, psn: u32, syndrome: u8, src: u16, dst: u16) -> Vec<u8> {
    let mut v = vec![RC_ACK, 0x40, 0xff, 0xff];
    v.extend_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
    v.extend_from_slice(&(psn & 0xff_ffff).to_be_bytes());
    v.extend_from_slice(&(u32::from(syndrome) << 24 | 1).to_be_bytes());
    let icrc = roce_icrc(&v, src, dst).expect("longer than a BTH");
    v.extend_from_slice(&icrc.to_le_bytes());
    v
}

#[test]
fn no_success_completion_follows_a_flush_after_a_forged_response() {
    let _one = serial();
    let (peer, peer_lid) = bind_node(200..=250);
    peer.set_read_timeout(Some(std::time::Duration::from_millis(20)))
        .expect("timeout");
    let emu = Emulator::new(EmuConfig {
        mode: RunMode::Stepped,
        fabric: Fabric::Udp,
        ..EmuConfig::default()
    });
    let lid = emu.hca_info(0).expect("hca").lid;
    let mut a = Ctx::open(&emu, 0);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(16, 64, -1);
    let mut qp = a.create_qp(pd, &cq, &cq, RC, 16, 8, None);
    bring_up(&a, &qp, peer_lid, PEER_QPN, Knobs::default());
    let m = Buf::new(64);
    let (_, lkey, _) = a.reg_mr(pd, m.addr(), 64, ALL_ACCESS).expect("mr");
    let local = DataSeg::new(8, lkey, m.addr());
    let raddr = RaddrSeg::new(0x1000, 0x42);
    let ops = [
        (
            SendOpcode::RDMA_READ,
            [raddr.as_bytes(), local.as_bytes()].concat(),
        ),
        (
            SendOpcode::RDMA_WRITE_IMM,
            [raddr.as_bytes(), local.as_bytes()].concat(),
        ),
        (SendOpcode::SEND, local.as_bytes().to_vec()),
    ];
    let mut idx = Vec::new();
    for (op, segs) in &ops {
        idx.push(qp.build_send(*op, 0, FM_CE_SE_CQ_UPDATE, [0; 4], segs));
    }
    qp.ring(&a, idx[2], Ring::Doorbell);
    let mut seen = 0;
    let mut buf = [0u8; 2048];
    for _ in 0..200 {
        emu.step();
        if peer.recv_from(&mut buf).is_ok() {
            seen += 1;
        }
        if seen == 3 {
            break;
        }
    }
    assert_eq!(seen, 3, "the three requests reached the peer");
    // A forged ACK for the WRITE_IMM (PSN +1; the READ's data never came), then a response
    // with a reserved AETH syndrome for the SEND (PSN +2).
    // A few steps each: in stepped mode an idle step moves virtual time to the next
    // timer, and the READ's retransmissions (unanswered) must not run out its retries.
    let send = |pkt: Vec<u8>| {
        peer.send_to(&pkt, node_addr(lid)).expect("send");
        for _ in 0..3 {
            emu.step();
        }
    };
    send(ack(qp.qpn, FIRST_PSN + 1, 0x1f, peer_lid, lid));
    send(ack(qp.qpn, FIRST_PSN + 2, 0x40, peer_lid, lid));
    emu.run_until_idle();
    let cqes = drain(&mut cq);
    assert_eq!(cqes.len(), 3, "one completion per WR: {cqes:?}");
    let order: Vec<u16> = cqes.iter().map(|c| c.wqe_counter).collect();
    assert_eq!(order, idx, "in WQE order: {cqes:?}");
    let flush = Syndrome::WR_FLUSH.0;
    let is_err = |c: &Cqe| c.opcode == 13;
    let first_flush = cqes
        .iter()
        .position(|c| is_err(c) && c.syndrome == flush)
        .unwrap_or(cqes.len());
    assert!(
        cqes[first_flush..]
            .iter()
            .all(|c| is_err(c) && c.syndrome == flush),
        "nothing but flushes after the first flush: {cqes:?}"
    );
    let errors: Vec<&Cqe> = cqes
        .iter()
        .filter(|c| is_err(c) && c.syndrome != flush)
        .collect();
    assert_eq!(errors.len(), 1, "one error completion: {cqes:?}");
    assert_eq!(errors[0].syndrome, Syndrome::BAD_RESP.0);
    let err_at = cqes
        .iter()
        .position(|c| is_err(c) && c.syndrome != flush)
        .expect("an error");
    assert!(
        err_at < first_flush,
        "the error before the flushes: {cqes:?}"
    );
}
