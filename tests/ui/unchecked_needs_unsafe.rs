//! The unchecked tier (issue 24) cannot be called from safe code: every one of its calls is an
//! `unsafe fn` whose contract the caller takes on.
use mlx5::{RawCq, RecvQueue, SendFlags, SendQueue, Sge};

fn post(sq: &mut SendQueue, rq: &mut RecvQueue, cq: &mut RawCq, sge: &Sge) {
    sq.send_inline_unchecked(b"x", 1, SendFlags::SIGNALED);
    sq.write_inline_unchecked(b"12345678", 0, 0, 2, SendFlags::SIGNALED);
    sq.unchecked(|b| {
        b.send_inline(b"x", 3, SendFlags::NONE);
        b.send_sge(sge, 4, SendFlags::NONE);
        b.write_inline(b"x", 0, 0, 5, SendFlags::SIGNALED);
    });
    let _ = sq.retire_unchecked(0);
    rq.push_unchecked(6, sge);
    let _ = rq.retire_unchecked(0);
    let _ = sq.poll_unchecked(cq);
    let _ = sq.poll_batch_unchecked(cq, 4, |_| {});
    let _ = rq.poll_unchecked(cq);
}

fn main() {
    let _ = post;
}
