//! Whether a download is worth gzip: a client's `Accept-Encoding: gzip` allows compression
//! but does not require it. Compressing data that does not shrink (archives, images, model
//! weights, anything already compressed or random) costs the sandbox one core for nothing and
//! caps the download at the compressor's speed, so such files are sent as they are.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;

use flate2::write::GzEncoder;
use flate2::Compression;

/// Below this size a file is compressed without looking: the sample would be the file.
const SAMPLE_FROM: u64 = 256 * 1024;
/// Bytes read at each sampled offset.
const SAMPLE: usize = 32 * 1024;
/// Compressed to more than this share of the sample, the file is sent as it is.
const KEEP_RATIO: f64 = 0.9;

/// True if the file at hand (of length `len`, when known) is worth compressing: small files
/// and files of unknown length (pseudo-files, pipes) always are; larger ones if samples from
/// their start, middle and end shrink by at least a tenth at gzip's fastest level. Reads with
/// `pread`, so the file's offset is left where it was. Costs about a millisecond.
pub fn worth_compressing(file: &File, len: Option<u64>) -> bool {
    let Some(len) = len.filter(|l| *l >= SAMPLE_FROM) else {
        return true;
    };
    let sample = SAMPLE as u64;
    let offsets = [0, (len / 2).saturating_sub(sample / 2), len - sample];
    let mut buf = vec![0u8; SAMPLE];
    let mut encoder = GzEncoder::new(Vec::with_capacity(SAMPLE), Compression::fast());
    let mut read = 0usize;
    for offset in offsets {
        let n = match file.read_at(&mut buf, offset) {
            Ok(n) => n,
            // Unreadable here means unreadable for the download too: let that path report it.
            Err(_) => return true,
        };
        if encoder.write_all(&buf[..n]).is_err() {
            return true;
        }
        read += n;
    }
    match encoder.finish() {
        Ok(out) if read > 0 => (out.len() as f64) <= KEEP_RATIO * read as f64,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    /// Bytes no compressor shrinks (xorshift: deterministic, no extra crate).
    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn text_is_compressed_and_noise_is_not() {
        let text: Vec<u8> = b"2026-12-04 INFO request served in 3 ms\n"
            .iter()
            .copied()
            .cycle()
            .take(1 << 20)
            .collect();
        assert!(worth_compressing(
            &file_with(&text),
            Some(text.len() as u64)
        ));
        let random = noise(1 << 20);
        assert!(!worth_compressing(
            &file_with(&random),
            Some(random.len() as u64)
        ));
    }

    #[test]
    fn small_and_unsized_files_are_always_compressed() {
        let random = noise(64 * 1024);
        assert!(worth_compressing(
            &file_with(&random),
            Some(random.len() as u64)
        ));
        assert!(worth_compressing(&file_with(&random), None));
    }

    #[test]
    fn a_compressible_middle_is_noticed() {
        // Noise at both ends, text in the middle: the middle sample keeps it compressed as
        // long as the whole sample shrinks enough; all-noise samples do not.
        let mut bytes = noise(1 << 20);
        let mid = bytes.len() / 2;
        bytes[mid - SAMPLE..mid + SAMPLE].fill(b'a');
        let len = bytes.len() as u64;
        // One of three samples is pure text: the whole shrinks by about a third.
        assert!(worth_compressing(&file_with(&bytes), Some(len)));
    }
}
