//! A layer blob as a tar stream: gzip, zstd or uncompressed, told by its first bytes.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

use crate::PullError;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

fn is_zstd_skippable(head: &[u8]) -> bool {
    // Skippable frames (magic 0x184D2A50..=0x184D2A5F, little-endian), which zstd:chunked
    // layers carry.
    head.len() >= 4 && head[0] & 0xf0 == 0x50 && head[1..4] == [0x2a, 0x4d, 0x18]
}

/// Opens a cached layer as an uncompressed tar stream.
pub(crate) fn open(path: &Path, media_type: &str) -> Result<Box<dyn Read>, PullError> {
    let file = File::open(path)
        .map_err(|e| PullError::io(format!("opening the cached layer {}", path.display()), e))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let head = reader
        .fill_buf()
        .map_err(|e| PullError::io(format!("reading the cached layer {}", path.display()), e))?;
    if head.starts_with(&GZIP_MAGIC) {
        return Ok(Box::new(flate2::bufread::MultiGzDecoder::new(reader)));
    }
    if head.starts_with(&ZSTD_MAGIC) || is_zstd_skippable(head) {
        return Ok(Box::new(ZstdFrames::new(reader)));
    }
    if media_type.contains("gzip") || media_type.contains("zstd") {
        return Err(PullError::bad(format!(
            "layer {} says it is {media_type}, but is not compressed that way",
            path.display()
        )));
    }
    Ok(Box::new(reader))
}

/// Decodes every frame of a zstd stream in turn (the decoder itself stops after one), and
/// steps over skippable frames.
struct ZstdFrames<R: BufRead> {
    src: R,
    dec: FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(src: R) -> Self {
        ZstdFrames {
            src,
            dec: FrameDecoder::new(),
            in_frame: false,
        }
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.in_frame {
                while self.dec.can_collect() == 0 && !self.dec.is_finished() {
                    self.dec
                        .decode_blocks(&mut self.src, BlockDecodingStrategy::UptoBlocks(1))
                        .map_err(io::Error::other)?;
                }
                let n = self.dec.read(buf)?;
                if n > 0 {
                    return Ok(n);
                }
                self.in_frame = false;
            }
            if self.src.fill_buf()?.is_empty() {
                return Ok(0);
            }
            match self.dec.reset(&mut self.src) {
                Ok(()) => self.in_frame = true,
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let skipped = io::copy(
                        &mut (&mut self.src).take(u64::from(length)),
                        &mut io::sink(),
                    )?;
                    if skipped != u64::from(length) {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "zstd skippable frame cut short",
                        ));
                    }
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruzstd::encoding::{compress_to_vec, CompressionLevel};

    #[test]
    fn zstd_frames_and_skippable_frames_all_decode() {
        let mut blob = compress_to_vec(&b"hello "[..], CompressionLevel::Fastest);
        blob.extend_from_slice(&[0x5e, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 9, 9, 9]);
        blob.extend(compress_to_vec(&b"world"[..], CompressionLevel::Fastest));
        let mut out = String::new();
        ZstdFrames::new(&blob[..]).read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello world");
    }
}
