//! Bad input on the wire: the server answers what it can (GARBAGE_ARGS, PROC_UNAVAIL, an auth
//! error) or closes that connection, and keeps serving others.

mod common;

use std::time::Duration;

use common::*;
use nfs3_client::nfs3_types::nfs3::{nfs_fh3, GETATTR3args};
use nfs3_client::nfs3_types::rpc::{
    accept_stat_data, auth_flavor, call_body, msg_body, opaque_auth, reply_body, rpc_msg,
};
use nfs3_client::nfs3_types::xdr_codec::{Opaque, Pack, Unpack};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn call(prog: u32, vers: u32, proc_: u32, cred: opaque_auth<'static>, args: &[u8]) -> Vec<u8> {
    let msg = rpc_msg {
        xid: 42,
        body: msg_body::CALL(call_body {
            rpcvers: 2,
            prog,
            vers,
            proc: proc_,
            cred,
            verf: opaque_auth::default(),
        }),
    };
    let mut body = Vec::new();
    msg.pack(&mut body).unwrap();
    body.extend_from_slice(args);
    let mut out = ((body.len() as u32) | 0x8000_0000).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

async fn reply(s: &mut TcpStream) -> reply_body<'static> {
    let mut hdr = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut hdr))
        .await
        .expect("a reply")
        .unwrap();
    let len = u32::from_be_bytes(hdr) & 0x7fff_ffff;
    let mut buf = vec![0u8; len as usize];
    s.read_exact(&mut buf).await.unwrap();
    let (m, _) = rpc_msg::unpack(&mut std::io::Cursor::new(buf)).unwrap();
    assert_eq!(m.xid, 42);
    match m.body {
        msg_body::REPLY(r) => r,
        msg_body::CALL(_) => panic!("a call back"),
    }
}

fn accepted(r: reply_body<'_>) -> accept_stat_data {
    match r {
        reply_body::MSG_ACCEPTED(a) => a.reply_data,
        reply_body::MSG_DENIED(d) => panic!("denied: {d:?}"),
    }
}

/// Whether the server closes the connection (rather than answering) within a few seconds.
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_never_takes_the_server_down() {
    let vol = ext4(16);
    let srv = start(vec![export("/v0", &vol.mnt, false)], KEY).await;
    let addr = srv.addr;
    let nfs = 100_003;

    // Random bytes, then a hang-up.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut x = 0x1234_5678_u32;
    let junk: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let _ = s.write_all(&junk).await;
    drop(s);

    // A record over the limit closes the connection.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&0xffff_fff0_u32.to_be_bytes()).await.unwrap();
    let _ = s.write_all(&[0u8; 4096]).await;
    assert!(closed(&mut s).await);
    // So do endless small fragments adding up past it.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let frag = [&(60_000u32).to_be_bytes()[..], &[0u8; 60_000][..]].concat();
    for _ in 0..40 {
        if s.write_all(&frag).await.is_err() {
            break;
        }
    }
    assert!(closed(&mut s).await);

    // Truncated or overlong arguments: GARBAGE_ARGS.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut args = Vec::new();
    GETATTR3args {
        object: nfs_fh3 {
            data: Opaque::owned(vec![1; 32]),
        },
    }
    .pack(&mut args)
    .unwrap();
    for bad in [
        &args[..args.len() - 4],
        &[&args[..], &[0, 0, 0, 0]].concat()[..],
        &[0xff; 8][..],
    ] {
        s.write_all(&call(nfs, 3, 1, opaque_auth::default(), bad))
            .await
            .unwrap();
        assert!(matches!(
            accepted(reply(&mut s).await),
            accept_stat_data::GARBAGE_ARGS
        ));
    }
    // A handle length of 4 GiB is garbage too, not a 4 GiB allocation's worth of trouble.
    let mut huge = 0xffff_ffff_u32.to_be_bytes().to_vec();
    huge.extend_from_slice(&[0; 16]);
    s.write_all(&call(nfs, 3, 1, opaque_auth::default(), &huge))
        .await
        .unwrap();
    assert!(matches!(
        accepted(reply(&mut s).await),
        accept_stat_data::GARBAGE_ARGS
    ));
    // So are a name (LOOKUP) and WRITE data declaring 4 GiB after a fine handle.
    let fh = [&32u32.to_be_bytes()[..], &[1; 32]].concat();
    let lookup = [&fh[..], &0xffff_fff0_u32.to_be_bytes()[..], b"name"].concat();
    s.write_all(&call(nfs, 3, 3, opaque_auth::default(), &lookup))
        .await
        .unwrap();
    assert!(matches!(
        accepted(reply(&mut s).await),
        accept_stat_data::GARBAGE_ARGS
    ));
    let write = [
        &fh[..],
        &[0; 16],
        &0xffff_fff0_u32.to_be_bytes()[..],
        b"data",
    ]
    .concat();
    s.write_all(&call(nfs, 3, 7, opaque_auth::default(), &write))
        .await
        .unwrap();
    assert!(matches!(
        accepted(reply(&mut s).await),
        accept_stat_data::GARBAGE_ARGS
    ));
    let mnt = [&0xffff_fff0_u32.to_be_bytes()[..], b"/v0\0"].concat();
    s.write_all(&call(100_005, 3, 1, opaque_auth::default(), &mnt))
        .await
        .unwrap();
    assert!(matches!(
        accepted(reply(&mut s).await),
        accept_stat_data::GARBAGE_ARGS
    ));
    // Unknown procedure, program and version.
    s.write_all(&call(nfs, 3, 99, opaque_auth::default(), &[]))
        .await
        .unwrap();
    assert!(matches!(
        accepted(reply(&mut s).await),
        accept_stat_data::PROC_UNAVAIL
    ));
    s.write_all(&call(nfs, 2, 0, opaque_auth::default(), &[]))
        .await
        .unwrap();
    assert!(matches!(
        accepted(reply(&mut s).await),
        accept_stat_data::PROG_MISMATCH { low: 3, high: 3 }
    ));
    s.write_all(&call(100_021, 4, 0, opaque_auth::default(), &[]))
        .await
        .unwrap();
    assert!(matches!(
        accepted(reply(&mut s).await),
        accept_stat_data::PROG_UNAVAIL
    ));
    // AUTH_UNIX with a huge group count, and an unknown flavour: denied.
    let mut body = Vec::new();
    for v in [1u32, 0, 0, 0, 1_000_000_000] {
        body.extend_from_slice(&v.to_be_bytes());
    }
    let cred = opaque_auth {
        flavor: auth_flavor::AUTH_UNIX,
        body: Opaque::owned(body),
    };
    s.write_all(&call(nfs, 3, 0, cred, &[])).await.unwrap();
    assert!(matches!(reply(&mut s).await, reply_body::MSG_DENIED(_)));
    let mut raw = call(nfs, 3, 0, opaque_auth::default(), &[]);
    raw[4 + 24..4 + 28].copy_from_slice(&6u32.to_be_bytes()); // RPCSEC_GSS
    s.write_all(&raw).await.unwrap();
    assert!(matches!(reply(&mut s).await, reply_body::MSG_DENIED(_)));
    // A call split into fragments is one record.
    let whole = call(nfs, 3, 0, opaque_auth::default(), &[]);
    let body = &whole[4..];
    let (a, b) = body.split_at(12);
    let mut split = (a.len() as u32).to_be_bytes().to_vec();
    split.extend_from_slice(a);
    split.extend_from_slice(&((b.len() as u32) | 0x8000_0000).to_be_bytes());
    split.extend_from_slice(b);
    s.write_all(&split).await.unwrap();
    assert!(matches!(
        accepted(reply(&mut s).await),
        accept_stat_data::SUCCESS
    ));

    // And the server still serves a real client.
    let mut c = mount(addr, "/v0", Some((0, 0, vec![]))).await;
    c.c.null().await.unwrap();
    let root = c.root.clone();
    c.create(&root, "still-here", 0o644).await.unwrap();
    assert!(vol.mnt.join("still-here").exists());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_entry_serves() {
    let vol = ext4(16);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let exports = vec![export("/v0", &vol.mnt, false)];
    // `run` serves forever on a runtime of its own; the thread ends with the test process.
    std::thread::spawn(move || warren_nfs::run(addr, exports, KEY));
    let mut c = None;
    for _ in 0..100 {
        if let Ok(m) = try_mount(addr, "/v0", Some((0, 0, vec![]))).await {
            c = Some(m);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = c.expect("mounting from the helper entry");
    let root = c.root.clone();
    c.mkdir(&root, "from-run", 0o755).await.unwrap();
    assert!(vol.mnt.join("from-run").is_dir());
    // Not a Vol drop in the middle of serving: a lazy unmount if the helper still holds it.
    drop(c);
}
