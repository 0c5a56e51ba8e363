//! Checking an erofs image without mounting it.
//!
//! A cached image is trusted on every sandbox start, so a cheap structural check runs each time
//! it is looked up: the superblock magic, a sane block size, the superblock checksum that
//! mkfs.erofs writes by default, and that the file is as long as the superblock says (the usual
//! result of a disk filling up mid-copy). It reads one block, so it costs microseconds. A full
//! content check is [`crate::ImagePath::verify_digest`].

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{ImageError, Result};

/// `EROFS_SUPER_MAGIC_V1` from the kernel's `fs/erofs/erofs_fs.h`.
pub const EROFS_MAGIC: u32 = 0xE0F5_E1E2;
/// The superblock starts 1 KiB into the image (room for a boot sector).
const SUPER_OFFSET: usize = 1024;
/// The fixed part of the on-disk superblock.
const SUPER_SIZE: usize = 128;
/// `EROFS_FEATURE_COMPAT_SB_CHKSUM`: the superblock carries a crc32c.
const FEATURE_COMPAT_SB_CHKSUM: u32 = 0x1;

/// What the superblock of a valid image says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErofsInfo {
    /// Filesystem block size in bytes.
    pub block_size: u32,
    /// Blocks in use; `blocks * block_size` is the filesystem's length.
    pub blocks: u64,
    /// Number of inodes.
    pub inodes: u64,
    /// Whether a superblock checksum was present (and therefore verified).
    pub checksummed: bool,
    /// Length of the file.
    pub file_size: u64,
}

/// Checks that `path` is a complete erofs image: magic, block size, superblock checksum (when
/// the image has one) and length. Returns what the superblock says.
pub fn verify_image(path: &Path) -> Result<ErofsInfo> {
    let corrupt = |reason: String| ImageError::CorruptImage {
        path: path.to_owned(),
        reason,
    };
    let mut file = File::open(path).map_err(ImageError::io("open", path))?;
    let file_size = file.metadata().map_err(ImageError::io("stat", path))?.len();
    if file_size < (SUPER_OFFSET + SUPER_SIZE) as u64 {
        return Err(corrupt(format!(
            "file is {file_size} bytes, shorter than a superblock"
        )));
    }

    let mut head = vec![0u8; SUPER_OFFSET + SUPER_SIZE];
    file.read_exact(&mut head)
        .map_err(ImageError::io("read superblock of", path))?;
    let sb = &head[SUPER_OFFSET..];
    let magic = le32(sb, 0);
    if magic != EROFS_MAGIC {
        return Err(corrupt(format!(
            "bad magic {magic:#010x}, expected {EROFS_MAGIC:#010x}"
        )));
    }
    let blkszbits = sb[12];
    if !(9..=16).contains(&blkszbits) {
        return Err(corrupt(format!("block size 2^{blkszbits} is out of range")));
    }
    let block_size = 1u32 << blkszbits;
    let feature_compat = le32(sb, 8);
    let inodes = le64(sb, 16);
    let blocks = u64::from(le32(sb, 36));

    let needed = blocks * u64::from(block_size);
    if needed > file_size {
        return Err(corrupt(format!(
            "truncated: the superblock describes {needed} bytes, the file has {file_size}"
        )));
    }

    let checksummed = feature_compat & FEATURE_COMPAT_SB_CHKSUM != 0;
    if checksummed {
        // Same range and convention as the kernel's erofs_superblock_csum_verify(): the rest
        // of the first block from the superblock on, checksum field zeroed, crc32c seeded with
        // ~0 and not inverted at the end.
        let block = block_size as usize;
        let len = if block > SUPER_OFFSET {
            block - SUPER_OFFSET
        } else {
            block
        };
        let mut region = vec![0u8; len];
        file.seek(SeekFrom::Start(SUPER_OFFSET as u64))
            .and_then(|_| file.read_exact(&mut region))
            .map_err(ImageError::io("read superblock of", path))?;
        let expected = le32(&region, 4);
        region[4..8].fill(0);
        let actual = crc32c_update(!0, &region);
        if actual != expected {
            return Err(corrupt(format!(
                "superblock checksum {actual:#010x} does not match the recorded {expected:#010x}"
            )));
        }
    }

    Ok(ErofsInfo {
        block_size,
        blocks,
        inodes,
        checksummed,
        file_size,
    })
}

fn le32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

fn le64(buf: &[u8], at: usize) -> u64 {
    u64::from(le32(buf, at)) | (u64::from(le32(buf, at + 4)) << 32)
}

/// Raw CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) without pre- or post-inversion,
/// like the kernel's `crc32c(seed, data, len)`. Bitwise: it runs over one block per check, so
/// a table or a crate would buy nothing.
fn crc32c_update(mut crc: u32, data: &[u8]) -> u32 {
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The catalogue check value of CRC-32C over "123456789" (with the usual inversions).
        assert_eq!(!crc32c_update(!0, b"123456789"), 0xE306_9283);
    }
}
