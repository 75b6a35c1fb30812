//! Findings: `WqRing::new(buf, 4080, 16).chunk64(0)` read 48 bytes past the mapping, and
//! `WqReader` was `Sync` and copied memory its writer might be changing. Both are crate-private
//! now (the ring's 64-byte reads exist only on a send ring of whole blocks).
use std::sync::Arc;

use mlx5::DmaBuf;
use mlx5::mem::wq::{WqReader, WqRing};

fn share(r: WqReader) -> impl Sync {
    r
}

fn main() {
    let buf = Arc::new(DmaBuf::new(4096).unwrap());
    let ring = WqRing::new(buf, 4080, 16);
    let _ = ring.chunk64(0);
    let _ = share(ring.reader());
}
