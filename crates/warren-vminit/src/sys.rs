//! The system calls vminit needs, each wrapped once.

use std::ffi::CString;

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

pub fn mount(
    source: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), String> {
    let (s, t, f, d) = (cstr(source)?, cstr(target)?, cstr(fstype)?, cstr(data)?);
    let fptr = if fstype.is_empty() {
        std::ptr::null()
    } else {
        f.as_ptr()
    };
    let dptr = if data.is_empty() {
        std::ptr::null()
    } else {
        d.as_ptr().cast()
    };
    // SAFETY: every pointer is either null (allowed by mount(2) for fstype and data) or points
    // to a NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), fptr, flags, dptr) };
    if rc != 0 {
        return Err(format!(
            "mount {source} on {target} ({fstype}): {}",
            last_error()
        ));
    }
    Ok(())
}

pub fn sethostname(name: &str) -> Result<(), String> {
    // SAFETY: the pointer and length describe `name`'s bytes, which outlive the call.
    let rc = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    if rc != 0 {
        return Err(format!("sethostname {name}: {}", last_error()));
    }
    Ok(())
}

/// Loads one kernel module from a file; one that is already loaded is fine.
pub fn load_module(path: &str) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    let params = cstr("")?;
    use std::os::fd::AsRawFd;
    // SAFETY: finit_module reads the module from a valid open descriptor and a NUL-terminated
    // parameter string; both outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) };
    if rc != 0 {
        let e = last_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("load module {path}: {e}"));
        }
    }
    Ok(())
}

/// Makes `new_root` the root: move its mount over `/` and chroot into it (the initramfs
/// cannot be pivoted away from).
pub fn switch_root(new_root: &str) -> Result<(), String> {
    std::env::set_current_dir(new_root).map_err(|e| format!("chdir {new_root}: {e}"))?;
    mount(".", "/", "", libc::MS_MOVE, "")?;
    let dot = cstr(".")?;
    // SAFETY: chroot with a NUL-terminated path that outlives the call.
    if unsafe { libc::chroot(dot.as_ptr()) } != 0 {
        return Err(format!("chroot: {}", last_error()));
    }
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))
}

/// Replaces this process with `path`; returns only on failure.
pub fn exec(path: &str, args: &[&str]) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(path)
        .args(&args[1..])
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .exec();
    Err(format!("exec {path}: {err}"))
}
