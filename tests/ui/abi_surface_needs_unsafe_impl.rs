// A surface is trusted with memory safety (its mmap must return a real mapping of the asked
// length): implementing it from safe code, without `unsafe impl`, must not compile.
use std::ptr::NonNull;

use mlx5::ffi::surface::{Errno, UverbsSurface};

#[derive(Debug)]
struct Liar;

impl UverbsSurface for Liar {
    unsafe fn write(&self, _cmd: &[u8]) -> Result<usize, Errno> {
        Err(Errno::ENOSYS)
    }
    unsafe fn ioctl(&self, _buf: &mut [u8]) -> Result<(), Errno> {
        Err(Errno::ENOTTY)
    }
    fn mmap(&self, _len: usize, _prot: i32, _offset: u64) -> Result<NonNull<u8>, Errno> {
        // Nothing is mapped here: a `Context` built on this would fault on its first doorbell.
        Ok(NonNull::dangling())
    }
    unsafe fn munmap(&self, _addr: NonNull<u8>, _len: usize) -> Result<(), Errno> {
        Ok(())
    }
    fn describe(&self) -> String {
        "liar".into()
    }
}

fn main() {
    let _ = Liar;
}
