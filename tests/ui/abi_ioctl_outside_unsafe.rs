// `ioctl` lets the kernel write through the pointer attributes of the buffer: calling it from
// safe code must not compile.
use mlx5::ffi::surface::{UverbsFd, UverbsSurface};

fn main() {
    let fd = UverbsFd::open(std::path::Path::new("/dev/null")).unwrap();
    let mut buf = vec![0u8; 24];
    let _ = fd.ioctl(&mut buf);
}
