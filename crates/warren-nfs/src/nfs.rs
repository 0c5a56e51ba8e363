//! NFSv3 (RFC 1813): dispatch, and the procedures on single objects (attributes, data, the
//! filesystem's numbers). Directory-changing procedures are in `dirops`, listings in `readdir`.

use std::os::fd::{AsFd, AsRawFd};

use nfs3_types::nfs3::*;
use nfs3_types::rpc::accept_stat_data;
use nfs3_types::xdr_codec::Opaque;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, CWD};

use crate::creds::{self, AsCaller};
use crate::fs::{self, errno, is_type, Ctx, Obj, Res};
use crate::rpc::{self, Cred};
use crate::{dirops, guard, readdir};

/// The largest READ or WRITE (rtmax and wtmax in FSINFO).
pub(crate) const MAX_IO: u32 = 1 << 20;

/// Runs the caller's ids on this thread until the guard drops.
pub(crate) fn as_caller<'a>(ctx: &'a Ctx, cred: &Cred) -> Res<AsCaller<'a>> {
    creds::become_caller(&ctx.base, cred).map_err(|e| {
        tracing::error!("taking on the caller's ids: {e}");
        nfsstat3::NFS3ERR_SERVERFAULT
    })
}

/// Decodes the arguments, runs the procedure and frames its result. Runs on a blocking thread.
pub(crate) fn dispatch(ctx: &Ctx, cred: &Cred, xid: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
    macro_rules! call {
        ($ty:ty, $f:expr) => {
            match rpc::decode::<$ty>(args) {
                Some(a) => rpc::success(xid, &$f(ctx, cred, a)),
                None => rpc::accept_error(xid, accept_stat_data::GARBAGE_ARGS),
            }
        };
    }
    let Ok(p) = NFS_PROGRAM::try_from(proc_) else {
        return rpc::accept_error(xid, accept_stat_data::PROC_UNAVAIL);
    };
    if !guard::nfs_args(p, args) {
        return rpc::accept_error(xid, accept_stat_data::GARBAGE_ARGS);
    }
    use NFS_PROGRAM::*;
    match p {
        NFSPROC3_NULL => call!(nfs3_types::xdr_codec::Void, |_, _, v| v),
        NFSPROC3_GETATTR => call!(GETATTR3args, getattr),
        NFSPROC3_SETATTR => call!(SETATTR3args, setattr),
        NFSPROC3_LOOKUP => call!(LOOKUP3args<'static>, lookup),
        NFSPROC3_ACCESS => call!(ACCESS3args, access),
        NFSPROC3_READLINK => call!(READLINK3args, readlink),
        NFSPROC3_READ => call!(READ3args, read),
        NFSPROC3_WRITE => call!(WRITE3args<'static>, write),
        NFSPROC3_CREATE => call!(CREATE3args<'static>, dirops::create),
        NFSPROC3_MKDIR => call!(MKDIR3args<'static>, dirops::mkdir),
        NFSPROC3_SYMLINK => call!(SYMLINK3args<'static>, dirops::symlink),
        NFSPROC3_MKNOD => call!(MKNOD3args<'static>, dirops::mknod),
        NFSPROC3_REMOVE => call!(REMOVE3args<'static>, dirops::remove),
        NFSPROC3_RMDIR => call!(RMDIR3args<'static>, dirops::rmdir),
        NFSPROC3_RENAME => call!(RENAME3args<'static, 'static>, dirops::rename),
        NFSPROC3_LINK => call!(LINK3args<'static>, dirops::link),
        NFSPROC3_READDIR => call!(READDIR3args, readdir::readdir),
        NFSPROC3_READDIRPLUS => call!(READDIRPLUS3args, readdir::readdirplus),
        NFSPROC3_FSSTAT => call!(FSSTAT3args, fsstat),
        NFSPROC3_FSINFO => call!(FSINFO3args, fsinfo),
        NFSPROC3_PATHCONF => call!(PATHCONF3args, pathconf),
        NFSPROC3_COMMIT => call!(COMMIT3args, commit),
    }
}

fn getattr(ctx: &Ctx, _: &Cred, a: GETATTR3args) -> GETATTR3res {
    match ctx.resolve(&a.object) {
        Ok(o) => GETATTR3res::Ok(GETATTR3resok {
            obj_attributes: ctx.fattr(o.exp, &o.st),
        }),
        Err(s) => GETATTR3res::Err((s, Default::default())),
    }
}

fn timespec(t: nfstime3) -> Timespec {
    Timespec {
        tv_sec: i64::from(t.seconds),
        tv_nsec: i64::from(t.nseconds.min(999_999_999)),
    }
}

const NOW: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: rustix::fs::UTIME_NOW,
};
const OMIT: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: rustix::fs::UTIME_OMIT,
};

/// Applies a sattr3 to `o`, as the caller (the kernel decides who may chown, chmod, truncate
/// or set times). Order: owner, then mode (chown clears set-id bits), size, and times last
/// (a truncate moves mtime).
pub(crate) fn apply_sattr(o: &Obj, s: &sattr3) -> Res<()> {
    let uid = match s.uid {
        set_uid3::Some(u) => Some(rustix::fs::Uid::from_raw(u)),
        set_uid3::None => None,
    };
    let gid = match s.gid {
        set_gid3::Some(g) => Some(rustix::fs::Gid::from_raw(g)),
        set_gid3::None => None,
    };
    if uid.is_some() || gid.is_some() {
        rustix::fs::chownat(&o.fd, "", uid, gid, AtFlags::EMPTY_PATH).map_err(errno)?;
    }
    if let set_mode3::Some(m) = s.mode {
        // Symlinks have no mode of their own on Linux: nothing to set.
        if !is_type(&o.st, FileType::Symlink) {
            let path = format!("/proc/self/fd/{}", o.fd.as_raw_fd());
            rustix::fs::chmodat(
                CWD,
                path.as_str(),
                Mode::from_raw_mode(m & 0o7777),
                AtFlags::empty(),
            )
            .map_err(errno)?;
        }
    }
    if let set_size3::Some(size) = s.size {
        if is_type(&o.st, FileType::Directory) {
            return Err(nfsstat3::NFS3ERR_ISDIR);
        }
        if !is_type(&o.st, FileType::RegularFile) {
            return Err(nfsstat3::NFS3ERR_INVAL);
        }
        let f = fs::reopen(o.fd.as_fd(), OFlags::WRONLY)?;
        rustix::fs::ftruncate(&f, size).map_err(errno)?;
    }
    let atime = match s.atime {
        set_atime::DONT_CHANGE => OMIT,
        set_atime::SET_TO_SERVER_TIME => NOW,
        set_atime::SET_TO_CLIENT_TIME(t) => timespec(t),
    };
    let mtime = match s.mtime {
        set_mtime::DONT_CHANGE => OMIT,
        set_mtime::SET_TO_SERVER_TIME => NOW,
        set_mtime::SET_TO_CLIENT_TIME(t) => timespec(t),
    };
    if atime.tv_nsec != rustix::fs::UTIME_OMIT || mtime.tv_nsec != rustix::fs::UTIME_OMIT {
        let ts = Timestamps {
            last_access: atime,
            last_modification: mtime,
        };
        rustix::fs::utimensat(&o.fd, "", &ts, AtFlags::EMPTY_PATH).map_err(errno)?;
    }
    Ok(())
}

fn setattr(ctx: &Ctx, cred: &Cred, a: SETATTR3args) -> SETATTR3res {
    let o = match ctx.resolve(&a.object) {
        Ok(o) => o,
        Err(s) => return SETATTR3res::Err((s, Default::default())),
    };
    let fail = |s| {
        SETATTR3res::Err((
            s,
            SETATTR3resfail {
                obj_wcc: ctx.wcc(&o),
            },
        ))
    };
    if ctx.exports[o.exp].read_only {
        return fail(nfsstat3::NFS3ERR_ROFS);
    }
    if let sattrguard3::Some(t) = a.guard {
        if fs::ctime(&o.st) != t {
            return fail(nfsstat3::NFS3ERR_NOT_SYNC);
        }
    }
    let r = match as_caller(ctx, cred) {
        Ok(_c) => apply_sattr(&o, &a.new_attributes),
        Err(s) => Err(s),
    };
    match r {
        Ok(()) => SETATTR3res::Ok(SETATTR3resok {
            obj_wcc: ctx.wcc(&o),
        }),
        Err(s) => fail(s),
    }
}

fn lookup(ctx: &Ctx, cred: &Cred, a: LOOKUP3args<'static>) -> LOOKUP3res {
    let dir = match ctx.resolve(&a.what.dir) {
        Ok(d) => d,
        Err(s) => return LOOKUP3res::Err((s, Default::default())),
    };
    let r = (|| {
        let _c = as_caller(ctx, cred)?;
        let o = ctx.lookup(&dir, a.what.name.as_ref())?;
        let fh = ctx.handle(o.exp, o.fd.as_fd())?;
        Ok((o, fh))
    })();
    match r {
        Ok((o, fh)) => LOOKUP3res::Ok(LOOKUP3resok {
            object: fh,
            obj_attributes: post_op_attr::Some(ctx.fattr(o.exp, &o.st)),
            dir_attributes: ctx.post_obj(&dir),
        }),
        Err(s) => LOOKUP3res::Err((
            s,
            LOOKUP3resfail {
                dir_attributes: ctx.post_obj(&dir),
            },
        )),
    }
}

fn access(ctx: &Ctx, cred: &Cred, a: ACCESS3args) -> ACCESS3res {
    let o = match ctx.resolve(&a.object) {
        Ok(o) => o,
        Err(s) => return ACCESS3res::Err((s, Default::default())),
    };
    let is_dir = is_type(&o.st, FileType::Directory);
    let mut granted = 0;
    if let Ok(_c) = as_caller(ctx, cred) {
        let may = |m| fs::may_access(o.fd.as_fd(), m);
        let want = a.access;
        if want & ACCESS3_READ != 0 && may(libc::R_OK) {
            granted |= ACCESS3_READ;
        }
        let x = ACCESS3_LOOKUP | ACCESS3_EXECUTE;
        if want & x != 0 && may(libc::X_OK) {
            granted |= if is_dir {
                ACCESS3_LOOKUP
            } else {
                ACCESS3_EXECUTE
            } & want;
        }
        let w = ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_DELETE;
        if want & w != 0 && !ctx.exports[o.exp].read_only && may(libc::W_OK) {
            granted |= want & w;
        }
    }
    ACCESS3res::Ok(ACCESS3resok {
        obj_attributes: post_op_attr::Some(ctx.fattr(o.exp, &o.st)),
        access: granted,
    })
}

fn readlink(ctx: &Ctx, cred: &Cred, a: READLINK3args) -> READLINK3res<'static> {
    let o = match ctx.resolve(&a.symlink) {
        Ok(o) => o,
        Err(s) => return READLINK3res::Err((s, Default::default())),
    };
    let attrs = post_op_attr::Some(ctx.fattr(o.exp, &o.st));
    if !is_type(&o.st, FileType::Symlink) {
        return READLINK3res::Err((
            nfsstat3::NFS3ERR_INVAL,
            READLINK3resfail {
                symlink_attributes: attrs,
            },
        ));
    }
    let r = as_caller(ctx, cred)
        .and_then(|_c| rustix::fs::readlinkat(&o.fd, "", Vec::new()).map_err(errno));
    match r {
        Ok(target) => READLINK3res::Ok(READLINK3resok {
            symlink_attributes: attrs,
            data: nfspath3(Opaque::owned(target.into_bytes())),
        }),
        Err(s) => READLINK3res::Err((
            s,
            READLINK3resfail {
                symlink_attributes: attrs,
            },
        )),
    }
}

/// Regular files only: a directory is ISDIR, anything else INVAL.
fn regular(o: &Obj) -> Res<()> {
    if is_type(&o.st, FileType::RegularFile) {
        Ok(())
    } else if is_type(&o.st, FileType::Directory) {
        Err(nfsstat3::NFS3ERR_ISDIR)
    } else {
        Err(nfsstat3::NFS3ERR_INVAL)
    }
}

fn read(ctx: &Ctx, cred: &Cred, a: READ3args) -> READ3res<'static> {
    let o = match ctx.resolve(&a.file) {
        Ok(o) => o,
        Err(s) => return READ3res::Err((s, Default::default())),
    };
    let r = (|| {
        regular(&o)?;
        let _c = as_caller(ctx, cred)?;
        let f = fs::reopen(o.fd.as_fd(), OFlags::RDONLY)?;
        let want = a.count.min(MAX_IO) as usize;
        let mut buf = vec![0u8; want];
        let mut n = 0;
        while n < want {
            let off = a.offset.saturating_add(n as u64);
            match rustix::io::pread(&f, &mut buf[n..], off) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(errno(e)),
            }
        }
        buf.truncate(n);
        let st = rustix::fs::fstat(&f).map_err(errno)?;
        #[allow(clippy::unnecessary_cast)]
        let eof = a.offset.saturating_add(n as u64) >= st.st_size as u64;
        Ok((buf, eof, st))
    })();
    match r {
        Ok((data, eof, st)) => READ3res::Ok(READ3resok {
            file_attributes: post_op_attr::Some(ctx.fattr(o.exp, &st)),
            count: data.len() as u32,
            eof,
            data: Opaque::owned(data),
        }),
        Err(s) => READ3res::Err((
            s,
            READ3resfail {
                file_attributes: ctx.post_obj(&o),
            },
        )),
    }
}

fn write(ctx: &Ctx, cred: &Cred, a: WRITE3args<'static>) -> WRITE3res {
    let o = match ctx.resolve(&a.file) {
        Ok(o) => o,
        Err(s) => return WRITE3res::Err((s, Default::default())),
    };
    let r = (|| {
        if ctx.exports[o.exp].read_only {
            return Err(nfsstat3::NFS3ERR_ROFS);
        }
        regular(&o)?;
        if a.count > MAX_IO || (a.count as usize) > a.data.len() {
            return Err(nfsstat3::NFS3ERR_INVAL);
        }
        let data = &a.data[..a.count as usize];
        let _c = as_caller(ctx, cred)?;
        let f = fs::reopen(o.fd.as_fd(), OFlags::WRONLY)?;
        let mut n = 0;
        while n < data.len() {
            let off = a.offset.saturating_add(n as u64);
            match rustix::io::pwrite(&f, &data[n..], off) {
                Ok(0) => return Err(nfsstat3::NFS3ERR_IO),
                Ok(k) => n += k,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(errno(e)),
            }
        }
        match a.stable {
            stable_how::UNSTABLE => {}
            stable_how::DATA_SYNC => rustix::fs::fdatasync(&f).map_err(errno)?,
            stable_how::FILE_SYNC => rustix::fs::fsync(&f).map_err(errno)?,
        }
        Ok(n)
    })();
    match r {
        Ok(n) => WRITE3res::Ok(WRITE3resok {
            file_wcc: ctx.wcc(&o),
            count: n as u32,
            committed: a.stable,
            verf: writeverf3(ctx.verf),
        }),
        Err(s) => WRITE3res::Err((
            s,
            WRITE3resfail {
                file_wcc: ctx.wcc(&o),
            },
        )),
    }
}

fn commit(ctx: &Ctx, _: &Cred, a: COMMIT3args) -> COMMIT3res {
    let o = match ctx.resolve(&a.file) {
        Ok(o) => o,
        Err(s) => {
            return COMMIT3res::Err((
                s,
                COMMIT3resfail {
                    file_wcc: Default::default(),
                },
            ))
        }
    };
    // Flushing what was already written needs no permission of the caller's: it runs as root.
    let r = if is_type(&o.st, FileType::RegularFile) {
        fs::reopen(o.fd.as_fd(), OFlags::RDONLY).and_then(|f| rustix::fs::fsync(&f).map_err(errno))
    } else {
        Ok(())
    };
    match r {
        Ok(()) => COMMIT3res::Ok(COMMIT3resok {
            file_wcc: ctx.wcc(&o),
            verf: writeverf3(ctx.verf),
        }),
        Err(s) => COMMIT3res::Err((
            s,
            COMMIT3resfail {
                file_wcc: ctx.wcc(&o),
            },
        )),
    }
}

fn fsstat(ctx: &Ctx, _: &Cred, a: FSSTAT3args) -> FSSTAT3res {
    let o = match ctx.resolve(&a.fsroot) {
        Ok(o) => o,
        Err(s) => return FSSTAT3res::Err((s, Default::default())),
    };
    match rustix::fs::fstatvfs(&o.fd) {
        Ok(v) => FSSTAT3res::Ok(FSSTAT3resok {
            obj_attributes: post_op_attr::Some(ctx.fattr(o.exp, &o.st)),
            tbytes: v.f_blocks.saturating_mul(v.f_frsize),
            fbytes: v.f_bfree.saturating_mul(v.f_frsize),
            abytes: v.f_bavail.saturating_mul(v.f_frsize),
            tfiles: v.f_files,
            ffiles: v.f_ffree,
            afiles: v.f_favail,
            invarsec: 0,
        }),
        Err(e) => FSSTAT3res::Err((
            errno(e),
            FSSTAT3resfail {
                obj_attributes: ctx.post_obj(&o),
            },
        )),
    }
}

fn fsinfo(ctx: &Ctx, _: &Cred, a: FSINFO3args) -> FSINFO3res {
    let o = match ctx.resolve(&a.fsroot) {
        Ok(o) => o,
        Err(s) => return FSINFO3res::Err((s, Default::default())),
    };
    FSINFO3res::Ok(FSINFO3resok {
        obj_attributes: post_op_attr::Some(ctx.fattr(o.exp, &o.st)),
        rtmax: MAX_IO,
        rtpref: MAX_IO,
        rtmult: 4096,
        wtmax: MAX_IO,
        wtpref: MAX_IO,
        wtmult: 4096,
        dtpref: 64 * 1024,
        maxfilesize: i64::MAX as u64,
        time_delta: nfstime3 {
            seconds: 0,
            nseconds: 1,
        },
        properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
    })
}

fn pathconf(ctx: &Ctx, _: &Cred, a: PATHCONF3args) -> PATHCONF3res {
    let o = match ctx.resolve(&a.object) {
        Ok(o) => o,
        Err(s) => return PATHCONF3res::Err((s, Default::default())),
    };
    let name_max = rustix::fs::fstatvfs(&o.fd).map_or(255, |v| v.f_namemax.min(255) as u32);
    PATHCONF3res::Ok(PATHCONF3resok {
        obj_attributes: post_op_attr::Some(ctx.fattr(o.exp, &o.st)),
        // ext4's EXT4_LINK_MAX.
        linkmax: 65000,
        name_max,
        no_trunc: true,
        chown_restricted: true,
        case_insensitive: false,
        case_preserving: true,
    })
}
