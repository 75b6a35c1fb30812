// Split halves borrow the QP: it cannot be modified (nor split again) while they are in use.
fn demo(qp: &mut mlx5::Qp) {
    let (sq, _rq) = qp.split();
    qp.to_error().unwrap();
    let _ = sq.outstanding();
}

fn main() {}
