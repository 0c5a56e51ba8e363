//! Serves directories over NFSv3 by hand, for trying a guest's mount:
//!
//! ```text
//! WARREN_NFS_KEY=<64 hex digits> cargo run -p warren-nfs --example serve -- \
//!     127.0.0.1:2049 /v0=/srv/vol0 /v1=/srv/vol1:ro
//! ```
//!
//! then, in a guest: `mount -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,\
//! mountproto=tcp,nolock <addr>:/v0 /mnt`. Without WARREN_NFS_KEY a random key is used (the
//! handles then do not survive a restart).

use std::net::SocketAddr;

use warren_nfs::Export;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: serve ADDR:PORT /path=DIR[:ro]...";
    let listen: SocketAddr = args.next().expect(usage).parse().expect(usage);
    let exports: Vec<Export> = args
        .map(|a| {
            let (path, dir) = a.split_once('=').expect(usage);
            let (dir, read_only) = match dir.strip_suffix(":ro") {
                Some(d) => (d, true),
                None => (dir, false),
            };
            Export {
                path: path.into(),
                root: dir.into(),
                read_only,
            }
        })
        .collect();
    let mut key = [0u8; 32];
    match std::env::var("WARREN_NFS_KEY") {
        Ok(hex) if hex.len() == 64 => {
            for (i, k) in key.iter_mut().enumerate() {
                *k = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("WARREN_NFS_KEY: hex");
            }
        }
        _ => getrandom::fill(&mut key).expect("random key"),
    }
    eprintln!("serving {} export(s) on {listen}", exports.len());
    warren_nfs::run(listen, exports, key)
}
