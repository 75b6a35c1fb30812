//! Checked copies from and to the host program's memory.
//!
//! The buffers given to the intercepted `write`/`ioctl` come from the program, as they would
//! to the kernel; a bad pointer must give `EFAULT`, not a crash. The emulator's own user-copy
//! functions do exactly that check.

use mlx5_emu::Errno;

/// Copy `len` bytes at `addr` of this process into a new buffer.
pub(crate) fn read(addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
    mlx5_emu::copy_from_user(addr as u64, len)
}

/// Copy `data` to `addr` of this process.
pub(crate) fn write(addr: usize, data: &[u8]) -> Result<(), Errno> {
    mlx5_emu::copy_to_user(addr as u64, data)
}

#[cfg(test)]
mod tests {
    #[test]
    fn copies_round_trip_and_bad_pointers_fault() {
        let src = [1u8, 2, 3, 4, 5];
        assert_eq!(super::read(src.as_ptr() as usize, 5).unwrap(), src);
        let mut dst = [0u8; 3];
        super::write(dst.as_mut_ptr() as usize, &[7, 8, 9]).unwrap();
        assert_eq!(dst, [7, 8, 9]);
        assert_eq!(super::read(8, 16).unwrap_err(), mlx5_emu::Errno::EFAULT);
        assert_eq!(super::write(8, &[1]).unwrap_err(), mlx5_emu::Errno::EFAULT);
        assert!(super::read(8, 0).unwrap().is_empty());
    }
}
