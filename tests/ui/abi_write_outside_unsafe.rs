// `write` hands the kernel the user pointers embedded in the command (the response pointer
// here aims at the bytes of a `&str`): calling it from safe code must not compile.
use mlx5::ffi::surface::{UverbsFd, UverbsSurface};

fn main() {
    let fd = UverbsFd::open(std::path::Path::new("/dev/null")).unwrap();
    let victim = "not a response buffer";
    let mut cmd = vec![0u8; 16];
    cmd[8..16].copy_from_slice(&(victim.as_ptr() as u64).to_ne_bytes());
    let _ = fd.write(&cmd);
}
