//! A look at a call's variable-length fields before it is decoded. `nfs3_types` allocates the
//! length an opaque field declares before reading its bytes, so a 4-byte field saying 4 GiB
//! would cost a 4 GiB allocation (lazily backed, but refused outright under strict
//! overcommit, which aborts). Each opaque is checked here to fit in what is left of the
//! record (itself at most ~1 MiB) and under its protocol limit; the decoding proper is still
//! `nfs3_types`'s.

use std::io::Cursor;

use nfs3_types::nfs3::{sattr3, NFS3_FHSIZE, NFS_PROGRAM};
use nfs3_types::xdr_codec::Unpack;

use crate::nfs::MAX_IO;

/// Longest name or MOUNT path accepted (MNTPATHLEN); NFS names are further held to 255.
const MAX_NAME: usize = 1024;
/// Longest symlink target (PATH_MAX).
const MAX_TARGET: usize = 4096;

/// The offset after an opaque at `at` of at most `max` bytes, if it fits in `args`.
fn opaque(args: &[u8], at: usize, max: usize) -> Option<usize> {
    let len = u32::from_be_bytes(args.get(at..at + 4)?.try_into().ok()?) as usize;
    let end = at + 4 + len.div_ceil(4) * 4;
    (len <= max && end <= args.len()).then_some(end)
}

fn fh(args: &[u8], at: usize) -> Option<usize> {
    opaque(args, at, NFS3_FHSIZE)
}

fn dirop(args: &[u8], at: usize) -> Option<usize> {
    opaque(args, fh(args, at)?, MAX_NAME)
}

/// Whether an NFS call's opaque fields are all within bounds.
pub(crate) fn nfs_args(p: NFS_PROGRAM, args: &[u8]) -> bool {
    use NFS_PROGRAM::*;
    let ok = match p {
        NFSPROC3_NULL => Some(0),
        NFSPROC3_LOOKUP | NFSPROC3_CREATE | NFSPROC3_MKDIR | NFSPROC3_MKNOD | NFSPROC3_REMOVE
        | NFSPROC3_RMDIR => dirop(args, 0),
        NFSPROC3_RENAME => dirop(args, 0).and_then(|o| dirop(args, o)),
        NFSPROC3_LINK => fh(args, 0).and_then(|o| dirop(args, o)),
        // fh, offset (8), count (4), stable (4), data.
        NFSPROC3_WRITE => fh(args, 0).and_then(|o| opaque(args, o + 16, MAX_IO as usize)),
        NFSPROC3_SYMLINK => dirop(args, 0).and_then(|o| {
            // sattr3 has no opaque fields: decoding it only finds where the target starts.
            let mut cur = Cursor::new(args.get(o..)?);
            let (_, n) = sattr3::unpack(&mut cur).ok()?;
            opaque(args, o + n, MAX_TARGET)
        }),
        _ => fh(args, 0),
    };
    ok.is_some()
}

/// Whether a MOUNT path argument is within bounds.
pub(crate) fn mount_path(args: &[u8]) -> bool {
    opaque(args, 0, MAX_NAME).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        let mut a = 8u32.to_be_bytes().to_vec();
        a.extend_from_slice(&[1; 8]);
        assert!(nfs_args(NFS_PROGRAM::NFSPROC3_GETATTR, &a));
        assert!(!nfs_args(NFS_PROGRAM::NFSPROC3_LOOKUP, &a));
        let huge = u32::MAX.to_be_bytes();
        assert!(!nfs_args(NFS_PROGRAM::NFSPROC3_GETATTR, &huge));
        assert!(!nfs_args(NFS_PROGRAM::NFSPROC3_GETATTR, &[]));
        let mut d = a.clone();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"abc\0");
        assert!(nfs_args(NFS_PROGRAM::NFSPROC3_LOOKUP, &d));
        d.truncate(d.len() - 1);
        assert!(!nfs_args(NFS_PROGRAM::NFSPROC3_LOOKUP, &d));
    }
}
