//! Connections: records in, calls dispatched concurrently (bounded), replies out in the order
//! they finish.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use nfs3_types::rpc::accept_stat_data;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use crate::fs::Ctx;
use crate::rpc::{self, Incoming};
use crate::{creds, mount, nfs};

/// Connections served at once (a guest's kernel uses one or two).
const MAX_CONNECTIONS: usize = 64;
/// Calls in flight per connection: bounds memory (each may hold a 1 MiB record) and threads.
const MAX_IN_FLIGHT: usize = 32;

const PMAP_PROGRAM: u32 = nfs3_types::portmap::PROGRAM;
const MOUNT_PROGRAM: u32 = nfs3_types::mount::PROGRAM;
const NFS_PROGRAM: u32 = nfs3_types::nfs3::PROGRAM;

pub(crate) async fn serve(ctx: Arc<Ctx>, listener: TcpListener) -> io::Result<()> {
    let port = listener.local_addr()?.port();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!("accepting an NFS connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!("refusing an NFS connection from {peer}: too many connections");
            continue;
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(ctx, sock, port).await {
                tracing::debug!("NFS connection from {peer} ended: {e}");
            }
            drop(slot);
        });
    }
}

async fn connection(ctx: Arc<Ctx>, sock: TcpStream, port: u16) -> io::Result<()> {
    let _ = sock.set_nodelay(true);
    let (mut rd, mut wr) = sock.into_split();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            wr.write_all(&reply).await?;
        }
        wr.shutdown().await
    });
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut result = Ok(());
    loop {
        let mut record = Vec::new();
        match rpc::read_record(&mut rd, &mut record).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        let call = match rpc::parse_call(&record) {
            Incoming::Ignore => continue,
            Incoming::Reply(r) => {
                if tx.send(r).await.is_err() {
                    break;
                }
                continue;
            }
            Incoming::Call(c) => c,
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let (ctx, tx) = (ctx.clone(), tx.clone());
        tokio::spawn(async move {
            let reply = answer(ctx, call, record, port).await;
            let _ = tx.send(reply).await;
            drop(permit);
        });
    }
    drop(tx);
    // The writer ends once every call in flight has sent its reply.
    match writer.await {
        Ok(r) => result.and(r),
        Err(e) => Err(io::Error::other(e)),
    }
}

async fn answer(ctx: Arc<Ctx>, call: rpc::Call, record: Vec<u8>, port: u16) -> Vec<u8> {
    let xid = call.xid;
    let mismatch = |v| rpc::accept_error(xid, accept_stat_data::PROG_MISMATCH { low: v, high: v });
    match (call.prog, call.vers) {
        (PMAP_PROGRAM, 2) => mount::portmap(port, xid, call.proc_, &record[call.args_at..]),
        (PMAP_PROGRAM, _) => mismatch(2),
        (MOUNT_PROGRAM, 3) | (NFS_PROGRAM, 3) => {
            let r = tokio::task::spawn_blocking(move || {
                if !creds::is_root_now() {
                    // A thread left with a caller's ids would be a bug; never serve from it.
                    tracing::error!("a server thread is not running as root; aborting");
                    std::process::abort();
                }
                let args = &record[call.args_at..];
                if call.prog == MOUNT_PROGRAM {
                    mount::mount(&ctx, xid, call.proc_, args)
                } else {
                    nfs::dispatch(&ctx, &call.cred, xid, call.proc_, args)
                }
            })
            .await;
            r.unwrap_or_else(|_| rpc::accept_error(xid, accept_stat_data::SYSTEM_ERR))
        }
        (MOUNT_PROGRAM, _) | (NFS_PROGRAM, _) => mismatch(3),
        _ => rpc::accept_error(xid, accept_stat_data::PROG_UNAVAIL),
    }
}
