// A receive half is `Send` (move it to its thread) but not `Sync`: two threads cannot share one.
fn share<T: Sync>(_: &T) {}

fn demo(qp: &mut mlx5::Qp) {
    let (_sq, rq) = qp.split();
    share(&rq.unwrap());
}

fn main() {}
