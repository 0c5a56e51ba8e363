//! File handles: the kernel's own handle for an object (`name_to_handle_at`), tagged with its
//! export and sealed with a MAC under the server's key, so they survive server restarts and a
//! guest cannot forge one.
//!
//! Layout (at most 64 bytes, NFS3_FHSIZE):
//!
//! | bytes | what |
//! |-------|------|
//! | 0 | version (1) |
//! | 1..5 | export tag (first 4 bytes of SHA-256 of the export's MOUNT path) |
//! | 5..9 | kernel handle type (big-endian i32) |
//! | 9 | kernel handle length n (at most 38) |
//! | 10..10+n | kernel handle bytes |
//! | 10+n..26+n | HMAC-SHA256 over a domain string, the export path and bytes 0..10+n, truncated to 16 bytes |

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use hmac::{Hmac, Mac};
use nfs3_types::nfs3::{nfs_fh3, nfsstat3, NFS3_FHSIZE};
use nfs3_types::xdr_codec::Opaque;
use sha2::{Digest, Sha256};

const VERSION: u8 = 1;
const HEADER: usize = 10;
const MAC_LEN: usize = 16;
/// The largest kernel handle that fits: ext4 uses 8 bytes, tmpfs 12, xfs up to 16.
const MAX_KERNEL_HANDLE: usize = NFS3_FHSIZE - HEADER - MAC_LEN;
const DOMAIN: &[u8] = b"warren-nfs file handle v1";

/// A kernel file handle (`struct file_handle` without the header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KernelHandle {
    pub ty: i32,
    pub bytes: Vec<u8>,
}

/// `struct file_handle` with room for the largest handle the kernel makes (MAX_HANDLE_SZ).
#[repr(C)]
struct HandleBuf {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; 128],
}

/// `name_to_handle_at(fd, "", AT_EMPTY_PATH)`: the handle of the object `fd` refers to.
pub(crate) fn name_to_handle(fd: BorrowedFd<'_>) -> io::Result<KernelHandle> {
    let mut buf = HandleBuf {
        handle_bytes: 128,
        handle_type: 0,
        f_handle: [0; 128],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `fd` is a valid descriptor for the call's duration; the path is a NUL-terminated
    // empty string; `buf` is a `struct file_handle` (same leading fields, repr(C)) whose
    // `handle_bytes` says how much room follows, and `mount_id` is a valid c_int to write.
    let rc = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            (&raw mut buf).cast::<libc::file_handle>(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let n = (buf.handle_bytes as usize).min(buf.f_handle.len());
    Ok(KernelHandle {
        ty: buf.handle_type,
        bytes: buf.f_handle[..n].to_vec(),
    })
}

/// `open_by_handle_at(mount, handle, O_PATH)`: the object, on `mount`'s filesystem. Needs
/// CAP_DAC_READ_SEARCH, so it runs before the caller's ids are taken on.
pub(crate) fn open_by_handle(mount: BorrowedFd<'_>, kh: &KernelHandle) -> io::Result<OwnedFd> {
    let mut buf = HandleBuf {
        handle_bytes: kh.bytes.len() as u32,
        handle_type: kh.ty,
        f_handle: [0; 128],
    };
    let n = kh.bytes.len().min(buf.f_handle.len());
    buf.f_handle[..n].copy_from_slice(&kh.bytes[..n]);
    // SAFETY: `mount` is a valid descriptor; `buf` is a `struct file_handle` whose
    // `handle_bytes` (at most 38 here, checked by the decoder) fits in the array after it.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&raw mut buf).cast::<libc::file_handle>(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this new descriptor, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The tag a handle carries for its export: stable for a MOUNT path across restarts.
pub(crate) fn export_tag(path: &str) -> u32 {
    let d = Sha256::digest(path.as_bytes());
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// Makes and checks handles under one secret key.
pub(crate) struct Codec {
    key: [u8; 32],
}

impl Codec {
    pub fn new(key: [u8; 32]) -> Self {
        Codec { key }
    }

    fn mac(&self, export_path: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .expect("HMAC takes keys of any length");
        m.update(DOMAIN);
        m.update(&(export_path.len() as u32).to_be_bytes());
        m.update(export_path.as_bytes());
        m.update(body);
        m
    }

    /// The NFS handle for `kh` in the export with this tag and path. `None` if the kernel
    /// handle is too large to fit (a filesystem this server cannot serve).
    pub fn encode(&self, tag: u32, export_path: &str, kh: &KernelHandle) -> Option<nfs_fh3> {
        if kh.bytes.len() > MAX_KERNEL_HANDLE {
            return None;
        }
        let mut out = Vec::with_capacity(HEADER + kh.bytes.len() + MAC_LEN);
        out.push(VERSION);
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(&kh.ty.to_be_bytes());
        out.push(kh.bytes.len() as u8);
        out.extend_from_slice(&kh.bytes);
        let tag = self.mac(export_path, &out).finalize().into_bytes();
        out.extend_from_slice(&tag[..MAC_LEN]);
        Some(nfs_fh3 {
            data: Opaque::owned(out),
        })
    }

    /// Checks a handle's form and MAC. `path_of` maps an export tag to (index, MOUNT path).
    /// Anything malformed, for an unknown export, or with a wrong MAC is NFS3ERR_BADHANDLE.
    pub fn decode<'a>(
        &self,
        fh: &[u8],
        path_of: impl Fn(u32) -> Option<(usize, &'a str)>,
    ) -> Result<(usize, KernelHandle), nfsstat3> {
        let bad = nfsstat3::NFS3ERR_BADHANDLE;
        if fh.len() < HEADER + MAC_LEN || fh.len() > NFS3_FHSIZE || fh[0] != VERSION {
            return Err(bad);
        }
        let n = fh[9] as usize;
        if fh.len() != HEADER + n + MAC_LEN {
            return Err(bad);
        }
        let tag = u32::from_be_bytes([fh[1], fh[2], fh[3], fh[4]]);
        let (index, path) = path_of(tag).ok_or(bad)?;
        let (body, mac) = fh.split_at(HEADER + n);
        self.mac(path, body)
            .verify_truncated_left(mac)
            .map_err(|_| bad)?;
        Ok((
            index,
            KernelHandle {
                ty: i32::from_be_bytes([fh[5], fh[6], fh[7], fh[8]]),
                bytes: fh[HEADER..HEADER + n].to_vec(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tamper() {
        let c = Codec::new([7; 32]);
        let kh = KernelHandle {
            ty: 1,
            bytes: vec![1, 2, 3, 4, 5, 6, 7, 8],
        };
        let tag = export_tag("/v0");
        let fh = c.encode(tag, "/v0", &kh).unwrap();
        let lookup = |t: u32| (t == tag).then_some((0usize, "/v0"));
        assert_eq!(c.decode(&fh.data, lookup).unwrap(), (0, kh.clone()));
        for i in 0..fh.data.len() {
            let mut bad = fh.data.to_vec();
            bad[i] ^= 1;
            assert_eq!(
                c.decode(&bad, lookup),
                Err(nfsstat3::NFS3ERR_BADHANDLE),
                "byte {i}"
            );
        }
        for n in 0..fh.data.len() {
            assert!(c.decode(&fh.data[..n], lookup).is_err());
        }
        let other = Codec::new([8; 32]);
        assert!(other.decode(&fh.data, lookup).is_err());
        // The same handle presented as another export's is refused too.
        let lookup_other = |t: u32| (t == tag).then_some((0usize, "/v1"));
        assert!(c.decode(&fh.data, lookup_other).is_err());
    }
}
