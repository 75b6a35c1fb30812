// The CQE ring is not reachable from safe code: no `first_half` of an entry the device may own.
use mlx5::mmio::access::CqeRing;

fn main() {}
