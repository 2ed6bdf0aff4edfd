//! Pseudo-filesystems shedder may need: bpffs for pins (tracefs for the tests' tools). Mounted when
//! absent (the machines this runs on may boot without them).

use std::{ffi::CString, io, path::Path};

pub const BPFFS: &str = "/sys/fs/bpf";
pub const TRACEFS: &str = "/sys/kernel/tracing";

pub const BPF_FS_MAGIC: i64 = 0xcafe4a11;
const TRACEFS_MAGIC: i64 = 0x74726163;

pub fn fs_magic(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: zeroed statfs is a valid out-parameter; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

fn ensure_mounted(path: &str, fstype: &str, magic: i64) -> io::Result<()> {
    let p = Path::new(path);
    if fs_magic(p).ok() == Some(magic) {
        return Ok(());
    }
    std::fs::create_dir_all(p)?;
    let target = CString::new(path).expect("static path");
    let fs = CString::new(fstype).expect("static fstype");
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            fs.as_ptr(),
            target.as_ptr(),
            fs.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(
            err.kind(),
            format!("mount -t {fstype} {fstype} {path}: {err}"),
        ));
    }
    Ok(())
}

/// Mount bpffs at /sys/fs/bpf if nothing is mounted there.
pub fn ensure_bpffs() -> io::Result<()> {
    ensure_mounted(BPFFS, "bpf", BPF_FS_MAGIC)
}

/// Mount tracefs at /sys/kernel/tracing if nothing is mounted there.
pub fn ensure_tracefs() -> io::Result<()> {
    ensure_mounted(TRACEFS, "tracefs", TRACEFS_MAGIC)
}
