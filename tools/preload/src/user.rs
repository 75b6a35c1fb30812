//! Checked copies from and to the host program's memory.
//!
//! The buffers given to the intercepted `write`/`ioctl` come from the program, as they would
//! to the kernel; a bad pointer must give `EFAULT`, not a crash. `process_vm_readv` and
//! `process_vm_writev` on our own pid do exactly that check.

use mlx5_emu::Errno;

/// Copy `len` bytes at `addr` of this process into a new buffer.
pub(crate) fn read(addr: usize, len: usize) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; len];
    if len == 0 {
        return Ok(buf);
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` describes our own `buf` (len writable bytes); the kernel checks
    // `remote` and fails with EFAULT instead of faulting.
    let n = unsafe {
        libc::process_vm_readv(std::process::id() as libc::pid_t, &local, 1, &remote, 1, 0)
    };
    if n != len as isize {
        return Err(Errno::EFAULT);
    }
    Ok(buf)
}

/// Copy `data` to `addr` of this process.
pub(crate) fn write(addr: usize, data: &[u8]) -> Result<(), Errno> {
    if data.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` describes our own `data` (only read by the kernel); the kernel checks
    // `remote` and fails with EFAULT instead of faulting.
    let n = unsafe {
        libc::process_vm_writev(std::process::id() as libc::pid_t, &local, 1, &remote, 1, 0)
    };
    if n != data.len() as isize {
        return Err(Errno::EFAULT);
    }
    Ok(())
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
