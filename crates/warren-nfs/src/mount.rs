//! MOUNT v3 (RFC 1813 appendix I) and the PORTMAP v2 GETPORT a client may ask first: both on
//! the NFS port itself, so a guest mounts with `port=N,mountport=N` and needs no rpcbind.

use nfs3_types::mount::{
    dirpath, export_node, exports, fhandle3, mountlist, mountres3, mountres3_ok, mountstat3,
    MOUNT_PROGRAM,
};
use nfs3_types::portmap::{mapping, pmaplist, IPPROTO_TCP, PMAP_PROG};
use nfs3_types::rpc::accept_stat_data;
use nfs3_types::xdr_codec::{List, Opaque, Void};

use crate::fs::Ctx;
use crate::rpc;

const AUTH_NULL: u32 = 0;
const AUTH_UNIX: u32 = 1;

/// MOUNT: runs on a blocking thread (MNT makes the root's handle).
pub(crate) fn mount(ctx: &Ctx, xid: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
    let garbage = || rpc::accept_error(xid, accept_stat_data::GARBAGE_ARGS);
    let Ok(p) = MOUNT_PROGRAM::try_from(proc_) else {
        return rpc::accept_error(xid, accept_stat_data::PROC_UNAVAIL);
    };
    let has_path = matches!(
        p,
        MOUNT_PROGRAM::MOUNTPROC3_MNT | MOUNT_PROGRAM::MOUNTPROC3_UMNT
    );
    if has_path && !crate::guard::mount_path(args) {
        return garbage();
    }
    match p {
        MOUNT_PROGRAM::MOUNTPROC3_NULL => match rpc::decode::<Void>(args) {
            Some(v) => rpc::success(xid, &v),
            None => garbage(),
        },
        MOUNT_PROGRAM::MOUNTPROC3_MNT => {
            let Some(path) = rpc::decode::<dirpath<'static>>(args) else {
                return garbage();
            };
            let res = match ctx.export_index(path.0.as_ref()) {
                Some(i) => match ctx.root_handle(i) {
                    Ok(fh) => mountres3::Ok(mountres3_ok {
                        fhandle: fhandle3(fh.data),
                        auth_flavors: vec![AUTH_UNIX, AUTH_NULL],
                    }),
                    Err(_) => mountres3::Err(mountstat3::MNT3ERR_SERVERFAULT),
                },
                None => mountres3::Err(mountstat3::MNT3ERR_NOENT),
            };
            rpc::success(xid, &res)
        }
        // No mount list is kept: it is advisory, and a guest's mounts are its own business.
        MOUNT_PROGRAM::MOUNTPROC3_DUMP => match rpc::decode::<Void>(args) {
            Some(_) => rpc::success(xid, &mountlist::default()),
            None => garbage(),
        },
        MOUNT_PROGRAM::MOUNTPROC3_UMNT => match rpc::decode::<dirpath<'static>>(args) {
            Some(_) => rpc::success(xid, &Void),
            None => garbage(),
        },
        MOUNT_PROGRAM::MOUNTPROC3_UMNTALL => match rpc::decode::<Void>(args) {
            Some(_) => rpc::success(xid, &Void),
            None => garbage(),
        },
        MOUNT_PROGRAM::MOUNTPROC3_EXPORT => match rpc::decode::<Void>(args) {
            Some(_) => {
                let list: exports<'_, '_> = List(
                    ctx.exports
                        .iter()
                        .map(|e| export_node {
                            ex_dir: dirpath(Opaque::borrowed(e.path.as_bytes())),
                            ex_groups: List(Vec::new()),
                        })
                        .collect(),
                );
                rpc::success(xid, &list)
            }
            None => garbage(),
        },
    }
}

/// PORTMAP: GETPORT answers this server's own port for NFS v3 and MOUNT v3 over TCP.
pub(crate) fn portmap(port: u16, xid: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
    let garbage = || rpc::accept_error(xid, accept_stat_data::GARBAGE_ARGS);
    let ours = [nfs3_types::nfs3::PROGRAM, nfs3_types::mount::PROGRAM];
    match PMAP_PROG::try_from(proc_) {
        Ok(PMAP_PROG::PMAPPROC_NULL) => match rpc::decode::<Void>(args) {
            Some(v) => rpc::success(xid, &v),
            None => garbage(),
        },
        Ok(PMAP_PROG::PMAPPROC_GETPORT) => match rpc::decode::<mapping>(args) {
            Some(m) => {
                let served = ours.contains(&m.prog) && m.vers == 3 && m.prot == IPPROTO_TCP;
                rpc::success(xid, &if served { u32::from(port) } else { 0 })
            }
            None => garbage(),
        },
        Ok(PMAP_PROG::PMAPPROC_DUMP) => match rpc::decode::<Void>(args) {
            Some(_) => {
                let list: pmaplist = List(
                    ours.iter()
                        .map(|&prog| mapping {
                            prog,
                            vers: 3,
                            prot: IPPROTO_TCP,
                            port: u32::from(port),
                        })
                        .collect(),
                );
                rpc::success(xid, &list)
            }
            None => garbage(),
        },
        _ => rpc::accept_error(xid, accept_stat_data::PROC_UNAVAIL),
    }
}
