//! Procedures that change a directory: CREATE, MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME
//! and LINK. Each runs as the caller on descriptors of directories already inside the export,
//! with single checked names, so the kernel's own *at calls cannot leave the export.

use std::os::fd::{AsFd, AsRawFd};

use nfs3_types::nfs3::*;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, CWD};
use rustix::io::Errno;

use crate::fs::{check_name, errno, is_type, Ctx, Obj, Res};
use crate::nfs::{apply_sattr, as_caller};
use crate::rpc::Cred;

/// Resolves a directory handle for a change: the directory, or the error with empty wcc.
fn dir_for_change(ctx: &Ctx, fh: &nfs_fh3) -> Res<Obj> {
    let d = ctx.resolve(fh)?;
    if ctx.exports[d.exp].read_only {
        return Err(nfsstat3::NFS3ERR_ROFS);
    }
    if !is_type(&d.st, FileType::Directory) {
        return Err(nfsstat3::NFS3ERR_NOTDIR);
    }
    Ok(d)
}

/// What a creating procedure answers: the new object's handle and attributes.
struct Made {
    fh: post_op_fh3,
    attrs: post_op_attr,
}

fn made(ctx: &Ctx, o: &Obj) -> Made {
    Made {
        fh: ctx
            .handle(o.exp, o.fd.as_fd())
            .map_or(post_op_fh3::None, post_op_fh3::Some),
        attrs: ctx.post_obj(o),
    }
}

/// Sets the mode asked for exactly (the server's umask is not the guest's), then the rest.
fn settle(o: &Obj, s: &sattr3) -> Res<()> {
    let mut rest = s.clone();
    rest.size = set_size3::None;
    if let set_mode3::Some(m) = s.mode {
        #[allow(clippy::unnecessary_cast)]
        if (o.st.st_mode as u32) & 0o7777 == m & 0o7777 {
            rest.mode = set_mode3::None;
        }
    }
    apply_sattr(o, &rest)
}

/// Runs a creating procedure: `f` makes the object (as the caller) and returns it.
fn creating(
    ctx: &Ctx,
    cred: &Cred,
    dir_fh: &nfs_fh3,
    name: &[u8],
    f: impl FnOnce(&Obj) -> Res<Obj>,
) -> (Res<Made>, wcc_data) {
    let dir = match dir_for_change(ctx, dir_fh) {
        Ok(d) => d,
        Err(s) => return (Err(s), wcc_data::default()),
    };
    let r = (|| {
        check_name(name)?;
        let _c = as_caller(ctx, cred)?;
        let o = f(&dir)?;
        Ok(made(ctx, &o))
    })();
    (r, ctx.wcc(&dir))
}

fn mode_of(s: &sattr3, default: u32) -> Mode {
    match s.mode {
        set_mode3::Some(m) => Mode::from_raw_mode(m & 0o7777),
        set_mode3::None => Mode::from_raw_mode(default),
    }
}

const CREATE_FLAGS: OFlags = OFlags::CREATE
    .union(OFlags::EXCL)
    .union(OFlags::RDONLY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NOCTTY);

fn create_file(ctx: &Ctx, dir: &Obj, name: &[u8], mode: Mode) -> Res<Result<Obj, Errno>> {
    let r = rustix::fs::openat2(
        &dir.fd,
        name,
        CREATE_FLAGS,
        mode,
        rustix::fs::ResolveFlags::BENEATH
            | rustix::fs::ResolveFlags::NO_SYMLINKS
            | rustix::fs::ResolveFlags::NO_MAGICLINKS
            | rustix::fs::ResolveFlags::NO_XDEV,
    );
    match r {
        Ok(_) => Ok(Ok(ctx.open_child(dir, name)?)),
        Err(e) => Ok(Err(e)),
    }
}

pub(crate) fn create(ctx: &Ctx, cred: &Cred, a: CREATE3args<'static>) -> CREATE3res {
    let name = a.where_.name.as_ref();
    let r = creating(ctx, cred, &a.where_.dir, name, |dir| match &a.how {
        createhow3::UNCHECKED(s) | createhow3::GUARDED(s) => {
            let guarded = matches!(a.how, createhow3::GUARDED(_));
            match create_file(ctx, dir, name, mode_of(s, 0o644))? {
                Ok(o) => {
                    settle(&o, s)?;
                    if let set_size3::Some(size) = s.size {
                        if size != 0 {
                            let only = sattr3 {
                                size: set_size3::Some(size),
                                ..Default::default()
                            };
                            apply_sattr(&o, &only)?;
                        }
                    }
                    Ok(o)
                }
                Err(Errno::EXIST) if !guarded => {
                    // UNCHECKED on an existing file: keep it, apply only a size (truncation).
                    let o = ctx.open_child(dir, name)?;
                    if !is_type(&o.st, FileType::RegularFile) {
                        return Err(nfsstat3::NFS3ERR_EXIST);
                    }
                    if let set_size3::Some(size) = s.size {
                        let only = sattr3 {
                            size: set_size3::Some(size),
                            ..Default::default()
                        };
                        apply_sattr(&o, &only)?;
                    }
                    Ok(o)
                }
                Err(e) => Err(errno(e)),
            }
        }
        createhow3::EXCLUSIVE(verf) => {
            // The verifier is kept in the new file's mtime and atime seconds (as knfsd does),
            // so a retransmitted CREATE finds its own file; the client then sets the real ones.
            let v0 = u32::from_be_bytes([verf.0[0], verf.0[1], verf.0[2], verf.0[3]]);
            let v1 = u32::from_be_bytes([verf.0[4], verf.0[5], verf.0[6], verf.0[7]]);
            match create_file(ctx, dir, name, Mode::from_raw_mode(0o600))? {
                Ok(o) => {
                    let ts = Timestamps {
                        last_access: Timespec {
                            tv_sec: i64::from(v1),
                            tv_nsec: 0,
                        },
                        last_modification: Timespec {
                            tv_sec: i64::from(v0),
                            tv_nsec: 0,
                        },
                    };
                    rustix::fs::utimensat(&o.fd, "", &ts, AtFlags::EMPTY_PATH).map_err(errno)?;
                    Ok(o)
                }
                Err(Errno::EXIST) => {
                    let o = ctx.open_child(dir, name)?;
                    #[allow(clippy::unnecessary_cast)]
                    let same = is_type(&o.st, FileType::RegularFile)
                        && o.st.st_mtime as i64 == i64::from(v0)
                        && o.st.st_atime as i64 == i64::from(v1);
                    if same {
                        Ok(o)
                    } else {
                        Err(nfsstat3::NFS3ERR_EXIST)
                    }
                }
                Err(e) => Err(errno(e)),
            }
        }
    });
    match r {
        (Ok(m), dir_wcc) => CREATE3res::Ok(CREATE3resok {
            obj: m.fh,
            obj_attributes: m.attrs,
            dir_wcc,
        }),
        (Err(s), dir_wcc) => CREATE3res::Err((s, CREATE3resfail { dir_wcc })),
    }
}

pub(crate) fn mkdir(ctx: &Ctx, cred: &Cred, a: MKDIR3args<'static>) -> MKDIR3res {
    let name = a.where_.name.as_ref();
    let r = creating(ctx, cred, &a.where_.dir, name, |dir| {
        rustix::fs::mkdirat(&dir.fd, name, mode_of(&a.attributes, 0o755)).map_err(errno)?;
        let o = ctx.open_child(dir, name)?;
        settle(&o, &a.attributes)?;
        Ok(o)
    });
    match r {
        (Ok(m), dir_wcc) => MKDIR3res::Ok(MKDIR3resok {
            obj: m.fh,
            obj_attributes: m.attrs,
            dir_wcc,
        }),
        (Err(s), dir_wcc) => MKDIR3res::Err((s, MKDIR3resfail { dir_wcc })),
    }
}

pub(crate) fn symlink(ctx: &Ctx, cred: &Cred, a: SYMLINK3args<'static>) -> SYMLINK3res {
    let name = a.where_.name.as_ref();
    let target: &[u8] = a.symlink.symlink_data.as_ref();
    let r = creating(ctx, cred, &a.where_.dir, name, |dir| {
        if target.is_empty() || target.contains(&0) {
            return Err(nfsstat3::NFS3ERR_INVAL);
        }
        if target.len() > 4095 {
            return Err(nfsstat3::NFS3ERR_NAMETOOLONG);
        }
        // The target is only text: it is stored, never followed by this server.
        rustix::fs::symlinkat(target, &dir.fd, name).map_err(errno)?;
        let o = ctx.open_child(dir, name)?;
        let mut s = a.symlink.symlink_attributes.clone();
        s.mode = set_mode3::None;
        s.size = set_size3::None;
        apply_sattr(&o, &s)?;
        Ok(o)
    });
    match r {
        (Ok(m), dir_wcc) => SYMLINK3res::Ok(SYMLINK3resok {
            obj: m.fh,
            obj_attributes: m.attrs,
            dir_wcc,
        }),
        (Err(s), dir_wcc) => SYMLINK3res::Err((s, SYMLINK3resfail { dir_wcc })),
    }
}

pub(crate) fn mknod(ctx: &Ctx, cred: &Cred, a: MKNOD3args<'static>) -> MKNOD3res {
    let name = a.where_.name.as_ref();
    let r = creating(ctx, cred, &a.where_.dir, name, |dir| {
        let (ty, s) = match &a.what {
            // Device nodes are refused (the host mounts volumes nodev anyway).
            mknoddata3::NF3CHR(_) | mknoddata3::NF3BLK(_) => return Err(nfsstat3::NFS3ERR_NOTSUPP),
            mknoddata3::NF3SOCK(s) => (FileType::Socket, s),
            mknoddata3::NF3FIFO(s) => (FileType::Fifo, s),
            mknoddata3::default => return Err(nfsstat3::NFS3ERR_BADTYPE),
        };
        rustix::fs::mknodat(&dir.fd, name, ty, mode_of(s, 0o644), 0).map_err(errno)?;
        let o = ctx.open_child(dir, name)?;
        settle(&o, s)?;
        Ok(o)
    });
    match r {
        (Ok(m), dir_wcc) => MKNOD3res::Ok(MKNOD3resok {
            obj: m.fh,
            obj_attributes: m.attrs,
            dir_wcc,
        }),
        (Err(s), dir_wcc) => MKNOD3res::Err((s, MKNOD3resfail { dir_wcc })),
    }
}

/// REMOVE and RMDIR: unlink a name, as the caller.
fn unlink(ctx: &Ctx, cred: &Cred, a: &diropargs3<'_>, flags: AtFlags) -> (Res<()>, wcc_data) {
    let dir = match dir_for_change(ctx, &a.dir) {
        Ok(d) => d,
        Err(s) => return (Err(s), wcc_data::default()),
    };
    let name = a.name.as_ref();
    let r = check_name(name).and_then(|()| {
        let _c = as_caller(ctx, cred)?;
        rustix::fs::unlinkat(&dir.fd, name, flags).map_err(errno)
    });
    (r, ctx.wcc(&dir))
}

pub(crate) fn remove(ctx: &Ctx, cred: &Cred, a: REMOVE3args<'static>) -> REMOVE3res {
    match unlink(ctx, cred, &a.object, AtFlags::empty()) {
        (Ok(()), dir_wcc) => REMOVE3res::Ok(REMOVE3resok { dir_wcc }),
        (Err(s), dir_wcc) => REMOVE3res::Err((s, REMOVE3resfail { dir_wcc })),
    }
}

pub(crate) fn rmdir(ctx: &Ctx, cred: &Cred, a: RMDIR3args<'static>) -> RMDIR3res {
    match unlink(ctx, cred, &a.object, AtFlags::REMOVEDIR) {
        (Ok(()), dir_wcc) => RMDIR3res::Ok(RMDIR3resok { dir_wcc }),
        (Err(s), dir_wcc) => RMDIR3res::Err((s, RMDIR3resfail { dir_wcc })),
    }
}

pub(crate) fn rename(ctx: &Ctx, cred: &Cred, a: RENAME3args<'static, 'static>) -> RENAME3res {
    let fail = |s| RENAME3res::Err((s, RENAME3resfail::default()));
    let from = match dir_for_change(ctx, &a.from.dir) {
        Ok(d) => d,
        Err(s) => return fail(s),
    };
    let to = match dir_for_change(ctx, &a.to.dir) {
        Ok(d) => d,
        Err(s) => return fail(s),
    };
    let r = (|| {
        if from.exp != to.exp {
            return Err(nfsstat3::NFS3ERR_XDEV);
        }
        check_name(a.from.name.as_ref())?;
        check_name(a.to.name.as_ref())?;
        let _c = as_caller(ctx, cred)?;
        rustix::fs::renameat(&from.fd, a.from.name.as_ref(), &to.fd, a.to.name.as_ref())
            .map_err(errno)
    })();
    let (fromdir_wcc, todir_wcc) = (ctx.wcc(&from), ctx.wcc(&to));
    match r {
        Ok(()) => RENAME3res::Ok(RENAME3resok {
            fromdir_wcc,
            todir_wcc,
        }),
        Err(s) => RENAME3res::Err((
            s,
            RENAME3resfail {
                fromdir_wcc,
                todir_wcc,
            },
        )),
    }
}

pub(crate) fn link(ctx: &Ctx, cred: &Cred, a: LINK3args<'static>) -> LINK3res {
    let fail = |s| {
        LINK3res::Err((
            s,
            LINK3resfail {
                file_attributes: post_op_attr::None,
                linkdir_wcc: wcc_data::default(),
            },
        ))
    };
    let file = match ctx.resolve(&a.file) {
        Ok(f) => f,
        Err(s) => return fail(s),
    };
    let dir = match dir_for_change(ctx, &a.link.dir) {
        Ok(d) => d,
        Err(s) => return fail(s),
    };
    let name = a.link.name.as_ref();
    let r = (|| {
        if file.exp != dir.exp {
            return Err(nfsstat3::NFS3ERR_XDEV);
        }
        if is_type(&file.st, FileType::Directory) {
            return Err(nfsstat3::NFS3ERR_ISDIR);
        }
        check_name(name)?;
        let _c = as_caller(ctx, cred)?;
        // Linking by descriptor through its /proc magic link (AT_EMPTY_PATH would need
        // CAP_DAC_READ_SEARCH, which the caller's ids do not carry). The kernel still applies
        // its hardlink protections for the caller.
        let path = format!("/proc/self/fd/{}", file.fd.as_raw_fd());
        rustix::fs::linkat(CWD, path.as_str(), &dir.fd, name, AtFlags::SYMLINK_FOLLOW)
            .map_err(errno)
    })();
    let file_attributes = ctx.post_obj(&file);
    let linkdir_wcc = ctx.wcc(&dir);
    match r {
        Ok(()) => LINK3res::Ok(LINK3resok {
            file_attributes,
            linkdir_wcc,
        }),
        Err(s) => LINK3res::Err((
            s,
            LINK3resfail {
                file_attributes,
                linkdir_wcc,
            },
        )),
    }
}
