// A CQ is polled through the verbs poller or the raw one, never both: `into_raw` takes the
// `Cq` by value, so the verbs poller is gone.
fn demo(mut cq: mlx5::Cq) {
    let mut raw = cq.into_raw().unwrap();
    let _ = raw.next();
    let mut wcs = [mlx5::WorkCompletion::default(); 4];
    cq.poll(&mut wcs);
}

fn main() {}
