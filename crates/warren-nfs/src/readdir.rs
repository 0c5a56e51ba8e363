//! READDIR and READDIRPLUS. Cookies are the filesystem's own directory offsets (`d_off`, ext4's
//! hash positions), so they stay valid across server restarts; the cookie verifier is unused
//! (always zero).

use std::os::fd::AsFd;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{List, Pack};
use rustix::fs::{FileType, OFlags, RawDir, SeekFrom};

use crate::fs::{self, errno, is_type, Ctx, Obj, Res};
use crate::nfs::as_caller;
use crate::rpc::Cred;

/// Replies are capped here whatever the client asks for.
const MAX_REPLY: usize = 1 << 20;

/// Calls `f(name, fileid, cookie)` for each entry after `cookie` until it returns false.
/// Returns whether the end of the directory was reached.
fn entries(
    ctx: &Ctx,
    dir: &Obj,
    cookie: u64,
    mut f: impl FnMut(&[u8], u64, u64) -> bool,
) -> Res<bool> {
    let d = fs::reopen(dir.fd.as_fd(), OFlags::RDONLY | OFlags::DIRECTORY)?;
    if cookie != 0 {
        rustix::fs::seek(&d, SeekFrom::Start(cookie)).map_err(|_| nfsstat3::NFS3ERR_BAD_COOKIE)?;
    }
    let at_root =
        dir.st.st_dev == ctx.exports[dir.exp].dev && dir.st.st_ino == ctx.exports[dir.exp].root_ino;
    let mut buf = Vec::with_capacity(32 * 1024);
    let mut it = RawDir::new(&d, buf.spare_capacity_mut());
    while let Some(ent) = it.next() {
        let ent = ent.map_err(errno)?;
        let name = ent.file_name().to_bytes();
        // ".." at the export's root is the root itself: nothing outside is shown.
        let ino = if at_root && name == b".." {
            ctx.exports[dir.exp].root_ino
        } else {
            ent.ino()
        };
        if !f(name, ino, ent.next_entry_cookie()) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn resolve_dir(ctx: &Ctx, fh: &nfs_fh3) -> Res<Obj> {
    let d = ctx.resolve(fh)?;
    if !is_type(&d.st, FileType::Directory) {
        return Err(nfsstat3::NFS3ERR_NOTDIR);
    }
    Ok(d)
}

pub(crate) fn readdir(ctx: &Ctx, cred: &Cred, a: READDIR3args) -> READDIR3res<'static> {
    let dir = match resolve_dir(ctx, &a.dir) {
        Ok(d) => d,
        Err(s) => return READDIR3res::Err((s, Default::default())),
    };
    let dir_attributes = post_op_attr::Some(ctx.fattr(dir.exp, &dir.st));
    // status, attributes, verifier, end of list, eof.
    let mut size = 4 + dir_attributes.packed_size() + 8 + 4 + 4;
    let limit = (a.count as usize).min(MAX_REPLY);
    let mut list = Vec::new();
    let r = as_caller(ctx, cred).and_then(|_c| {
        entries(ctx, &dir, a.cookie, |name, ino, cookie| {
            let e = entry3 {
                fileid: ino,
                name: filename3(name.to_vec().into()),
                cookie,
            };
            let n = 4 + e.packed_size();
            if size + n > limit {
                return false;
            }
            size += n;
            list.push(e);
            true
        })
    });
    match r {
        Ok(false) if list.is_empty() => READDIR3res::Err((
            nfsstat3::NFS3ERR_TOOSMALL,
            READDIR3resfail { dir_attributes },
        )),
        Ok(eof) => READDIR3res::Ok(READDIR3resok {
            dir_attributes,
            cookieverf: cookieverf3::default(),
            reply: dirlist3 {
                entries: List(list),
                eof,
            },
        }),
        Err(s) => READDIR3res::Err((s, READDIR3resfail { dir_attributes })),
    }
}

pub(crate) fn readdirplus(ctx: &Ctx, cred: &Cred, a: READDIRPLUS3args) -> READDIRPLUS3res<'static> {
    let dir = match resolve_dir(ctx, &a.dir) {
        Ok(d) => d,
        Err(s) => return READDIRPLUS3res::Err((s, Default::default())),
    };
    let dir_attributes = post_op_attr::Some(ctx.fattr(dir.exp, &dir.st));
    let mut size = 4 + dir_attributes.packed_size() + 8 + 4 + 4;
    let limit = (a.maxcount as usize).min(MAX_REPLY);
    let dir_limit = a.dircount as usize;
    let mut dir_size = 0;
    let mut list = Vec::new();
    let r = as_caller(ctx, cred).and_then(|_c| {
        entries(ctx, &dir, a.cookie, |name, ino, cookie| {
            // "." and ".." come without attributes or handles; every other name is looked up
            // (as the caller, never through a symlink) for them.
            let (attrs, fh) = if name == b"." || name == b".." {
                (post_op_attr::None, post_op_fh3::None)
            } else {
                match ctx.open_child(&dir, name) {
                    Ok(o) => (
                        post_op_attr::Some(ctx.fattr(o.exp, &o.st)),
                        ctx.handle(o.exp, o.fd.as_fd())
                            .map_or(post_op_fh3::None, post_op_fh3::Some),
                    ),
                    Err(_) => (post_op_attr::None, post_op_fh3::None),
                }
            };
            let e = entryplus3 {
                fileid: ino,
                name: filename3(name.to_vec().into()),
                cookie,
                name_attributes: attrs,
                name_handle: fh,
            };
            let n = 4 + e.packed_size();
            // dircount counts what READDIR would have sent: fileid, name and cookie.
            let d = 8 + 4 + name.len().div_ceil(4) * 4 + 8;
            if size + n > limit || (!list.is_empty() && dir_size + d > dir_limit) {
                return false;
            }
            size += n;
            dir_size += d;
            list.push(e);
            true
        })
    });
    match r {
        Ok(false) if list.is_empty() => READDIRPLUS3res::Err((
            nfsstat3::NFS3ERR_TOOSMALL,
            READDIRPLUS3resfail { dir_attributes },
        )),
        Ok(eof) => READDIRPLUS3res::Ok(READDIRPLUS3resok {
            dir_attributes,
            cookieverf: cookieverf3::default(),
            reply: dirlistplus3 {
                entries: List(list),
                eof,
            },
        }),
        Err(s) => READDIRPLUS3res::Err((s, READDIRPLUS3resfail { dir_attributes })),
    }
}
