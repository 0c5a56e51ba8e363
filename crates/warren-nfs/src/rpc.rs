//! ONC RPC over TCP (RFC 5531): record marking, call headers, credentials and replies. The XDR
//! types are `nfs3_types`'s; this module only frames them and checks the lengths a hostile
//! client controls before they turn into allocations.

use std::io::{self, Cursor};

use nfs3_types::rpc::{
    accept_stat_data, accepted_reply, auth_flavor, auth_stat, auth_unix, fragment_header, msg_body,
    opaque_auth, rejected_reply, reply_body, rpc_msg, RPC_VERSION_2,
};
use nfs3_types::xdr_codec::{Pack, Unpack};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The largest record accepted: a 1 MiB WRITE plus its call header, credentials and arguments.
pub(crate) const MAX_RECORD: usize = (1 << 20) + 16 * 1024;

/// RFC 5531: an opaque_auth body is at most 400 bytes.
const MAX_AUTH_BODY: u32 = 400;
/// RFC 5531 (AUTH_SYS): at most 16 supplementary groups, a machine name of at most 255 bytes.
const MAX_AUTH_GIDS: u32 = 16;
const MAX_MACHINE_NAME: u32 = 255;

/// Who the caller is: AUTH_UNIX ids, or nobody for AUTH_NONE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

/// The ids an AUTH_NONE caller gets.
pub(crate) const NOBODY: u32 = 65534;

impl Cred {
    fn nobody() -> Self {
        Cred {
            uid: NOBODY,
            gid: NOBODY,
            gids: Vec::new(),
        }
    }
}

/// A parsed call: its header and where its arguments start in the record.
#[derive(Debug)]
pub(crate) struct Call {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    pub cred: Cred,
    pub args_at: usize,
}

/// What to do with a record.
#[derive(Debug)]
pub(crate) enum Incoming {
    Call(Call),
    /// Answer with this (already framed) reply and go on.
    Reply(Vec<u8>),
    /// Not a call (a reply, or too short to carry an xid): drop it.
    Ignore,
}

/// Reads one record (all its fragments). `Ok(false)` is a clean end of stream before a record.
/// A record over [`MAX_RECORD`] is an error: the connection is closed.
pub(crate) async fn read_record<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> io::Result<bool> {
    buf.clear();
    let mut first = true;
    loop {
        let mut hdr = [0u8; 4];
        if first {
            // A clean close between records is the normal end of a connection.
            match r.read_exact(&mut hdr).await {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
                Err(e) => return Err(e),
            }
        } else {
            r.read_exact(&mut hdr).await?;
        }
        first = false;
        let hdr = fragment_header::from(hdr);
        let len = hdr.fragment_length() as usize;
        if buf.len() + len > MAX_RECORD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "RPC record over the size limit",
            ));
        }
        let start = buf.len();
        buf.resize(start + len, 0);
        r.read_exact(&mut buf[start..]).await?;
        if hdr.eof() {
            return Ok(true);
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let bytes = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(bytes.try_into().ok()?))
}

fn pad4(n: u32) -> usize {
    (n as usize).div_ceil(4) * 4
}

/// Parses a record's call header and credentials.
pub(crate) fn parse_call(record: &[u8]) -> Incoming {
    let Some(xid) = u32_at(record, 0) else {
        return Incoming::Ignore;
    };
    if u32_at(record, 4) != Some(0) {
        // A reply (or garbage in the message type): nothing to answer.
        return Incoming::Ignore;
    }
    // `Opaque::unpack` allocates the length it reads before reading the bytes, so the two
    // opaque_auth lengths a client sends are bounded here first (xid, type, rpcvers, prog, vers,
    // proc, cred flavor = 28 bytes, then the cred length).
    if let Some(cred_len) = u32_at(record, 28) {
        if cred_len > MAX_AUTH_BODY {
            return Incoming::Reply(denied(xid, auth_stat::AUTH_BADCRED));
        }
        if let Some(verf_len) = u32_at(record, 32 + pad4(cred_len) + 4) {
            if verf_len > MAX_AUTH_BODY {
                return Incoming::Reply(denied(xid, auth_stat::AUTH_BADVERF));
            }
        }
    }
    let mut cur = Cursor::new(record);
    let msg = match rpc_msg::unpack(&mut cur) {
        Ok((m, _)) => m,
        // An unknown auth flavor fails to decode as well as plain garbage does.
        Err(_) => return Incoming::Reply(denied(xid, auth_stat::AUTH_BADCRED)),
    };
    let msg_body::CALL(call) = msg.body else {
        return Incoming::Ignore;
    };
    if call.rpcvers != RPC_VERSION_2 {
        return Incoming::Reply(frame(
            &rpc_msg {
                xid,
                body: msg_body::REPLY(reply_body::MSG_DENIED(rejected_reply::rpc_mismatch(
                    RPC_VERSION_2,
                    RPC_VERSION_2,
                ))),
            },
            None::<&nfs3_types::xdr_codec::Void>,
        ));
    }
    let cred = match parse_cred(&call.cred) {
        Ok(c) => c,
        Err(stat) => return Incoming::Reply(denied(xid, stat)),
    };
    Incoming::Call(Call {
        xid,
        prog: call.prog,
        vers: call.vers,
        proc_: call.proc,
        cred,
        args_at: cur.position() as usize,
    })
}

fn parse_cred(cred: &opaque_auth<'_>) -> Result<Cred, auth_stat> {
    match cred.flavor {
        auth_flavor::AUTH_NULL => Ok(Cred::nobody()),
        auth_flavor::AUTH_UNIX => {
            let body: &[u8] = cred.body.as_ref();
            // `Vec<u32>::unpack` reserves the count it reads: bound it (and the machine name
            // before it, which decides where the count is) first.
            let name_len = u32_at(body, 4).ok_or(auth_stat::AUTH_BADCRED)?;
            if name_len > MAX_MACHINE_NAME {
                return Err(auth_stat::AUTH_BADCRED);
            }
            let ngids = u32_at(body, 8 + pad4(name_len) + 8).ok_or(auth_stat::AUTH_BADCRED)?;
            if ngids > MAX_AUTH_GIDS {
                return Err(auth_stat::AUTH_BADCRED);
            }
            let mut cur = Cursor::new(body);
            let (a, _) = auth_unix::unpack(&mut cur).map_err(|_| auth_stat::AUTH_BADCRED)?;
            if cur.position() as usize != body.len() {
                return Err(auth_stat::AUTH_BADCRED);
            }
            Ok(Cred {
                uid: a.uid,
                gid: a.gid,
                gids: a.gids,
            })
        }
        _ => Err(auth_stat::AUTH_TOOWEAK),
    }
}

/// Decodes a procedure's arguments, which must fill the rest of the record exactly.
pub(crate) fn decode<T: Unpack>(args: &[u8]) -> Option<T> {
    let mut cur = Cursor::new(args);
    let (v, _) = T::unpack(&mut cur).ok()?;
    (cur.position() as usize == args.len()).then_some(v)
}

/// Frames a message (and a result after it) as one record of one fragment.
fn frame<T: Pack>(msg: &rpc_msg<'_, '_>, res: Option<&T>) -> Vec<u8> {
    let len = msg.packed_size() + res.map_or(0, Pack::packed_size);
    let mut out = Vec::with_capacity(len + 4);
    out.extend_from_slice(&[0; 4]);
    // Packing into a Vec only fails for an object over 4 GiB, which no reply here is.
    if msg.pack(&mut out).is_err() || res.map(|r| r.pack(&mut out)).transpose().is_err() {
        out.truncate(4);
    }
    let body = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&(body | fragment_header::EOF_FLAG).to_be_bytes());
    out
}

fn accepted(xid: u32, data: accept_stat_data) -> rpc_msg<'static, 'static> {
    rpc_msg {
        xid,
        body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data: data,
        })),
    }
}

/// A successful reply carrying `res`.
pub(crate) fn success<T: Pack>(xid: u32, res: &T) -> Vec<u8> {
    frame(&accepted(xid, accept_stat_data::SUCCESS), Some(res))
}

/// An accepted call that failed at the RPC level (GARBAGE_ARGS, PROC_UNAVAIL, ...).
pub(crate) fn accept_error(xid: u32, data: accept_stat_data) -> Vec<u8> {
    frame(&accepted(xid, data), None::<&nfs3_types::xdr_codec::Void>)
}

/// A call refused for its credentials.
pub(crate) fn denied(xid: u32, stat: auth_stat) -> Vec<u8> {
    frame(
        &rpc_msg {
            xid,
            body: msg_body::REPLY(reply_body::MSG_DENIED(rejected_reply::auth_error(stat))),
        },
        None::<&nfs3_types::xdr_codec::Void>,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_record(cred: opaque_auth<'static>, tail: &[u8]) -> Vec<u8> {
        let msg = rpc_msg {
            xid: 7,
            body: msg_body::CALL(nfs3_types::rpc::call_body {
                rpcvers: 2,
                prog: 100003,
                vers: 3,
                proc: 0,
                cred,
                verf: opaque_auth::default(),
            }),
        };
        let mut out = Vec::new();
        msg.pack(&mut out).unwrap();
        out.extend_from_slice(tail);
        out
    }

    #[test]
    fn parses_auth_unix() {
        let a = auth_unix {
            stamp: 1,
            machinename: b"vm".to_vec().into(),
            uid: 1000,
            gid: 100,
            gids: vec![4, 5],
        };
        let rec = call_record(opaque_auth::auth_unix(&a), &[1, 2, 3, 4]);
        let Incoming::Call(c) = parse_call(&rec) else {
            panic!("not a call")
        };
        assert_eq!(
            c.cred,
            Cred {
                uid: 1000,
                gid: 100,
                gids: vec![4, 5]
            }
        );
        assert_eq!(&rec[c.args_at..], &[1, 2, 3, 4]);
    }

    #[test]
    fn refuses_huge_gid_counts_and_garbage() {
        let mut body = Vec::new();
        for v in [1u32, 0, 0, 0, 0xffff_ffff] {
            body.extend_from_slice(&v.to_be_bytes());
        }
        let cred = opaque_auth {
            flavor: auth_flavor::AUTH_UNIX,
            body: body.into(),
        };
        assert!(matches!(
            parse_call(&call_record(cred, &[])),
            Incoming::Reply(_)
        ));
        // Every prefix and a few corruptions of a valid call never panic.
        let rec = call_record(opaque_auth::default(), &[]);
        for n in 0..rec.len() {
            let _ = parse_call(&rec[..n]);
            let mut bad = rec.clone();
            bad[n] ^= 0xff;
            let _ = parse_call(&bad);
        }
    }
}
