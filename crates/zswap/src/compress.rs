//! Page compressors: one algorithm per pool, contexts reused per worker.
//!
//! A context compresses any length: one page (the kernel zswap's unit, also for large folios) or
//! a multi-page unit of a large folio (`Config::multi_page_unit_pages`), whose entries then share
//! one object.

use crate::PAGE_SIZE;
use std::sync::Arc;

/// The compression algorithm of a pool (the kernel's `zswap.compressor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compressor {
    /// LZ4 block format (lz4_flex's block API): the fastest.
    Lz4,
    /// Zstandard at `level` (1..=19 sensible; negative levels are zstd's fast modes), frames
    /// without checksum, content size or dictionary id.
    Zstd {
        /// zstd compression level.
        level: i32,
    },
    /// Raw deflate (RFC 1951) in software (miniz_oxide), at `level` 1..=9.
    Deflate {
        /// deflate level.
        level: u8,
    },
    /// Raw deflate through Intel QPL: on an IAA device when one is usable, on QPL's software
    /// path otherwise (the kernel's `deflate-iaa`). Needs libqpl at run time. Decompression of
    /// its output also works with [`Compressor::Deflate`] and the reverse.
    DeflateIaa,
}

impl Compressor {
    /// The kernel's name for this compressor.
    pub fn name(&self) -> &'static str {
        match self {
            Compressor::Lz4 => "lz4",
            Compressor::Zstd { .. } => "zstd",
            Compressor::Deflate { .. } => "deflate",
            Compressor::DeflateIaa => "deflate-iaa",
        }
    }
}

/// A compressor failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The compressor could not be set up (libqpl absent, zstd context allocation failed, a
    /// level out of range).
    #[error("compressor {name} is unavailable: {reason}")]
    Unavailable {
        /// Compressor name.
        name: &'static str,
        /// Why.
        reason: String,
    },
    /// Compression failed (not the same as compressing poorly, which is not an error here).
    #[error("{name} compression failed: {reason}")]
    Compress {
        /// Compressor name.
        name: &'static str,
        /// Why.
        reason: String,
    },
    /// The stored bytes are not a valid compressed page.
    #[error("{name} decompression failed: {reason}")]
    Decompress {
        /// Compressor name.
        name: &'static str,
        /// Why.
        reason: String,
    },
    /// The stored bytes decompressed to the wrong length.
    #[error("{name} decompressed {got} bytes, expected {expected}")]
    WrongLength {
        /// Compressor name.
        name: &'static str,
        /// Bytes produced.
        got: usize,
        /// Bytes expected (one page).
        expected: usize,
    },
}

/// Worst-case output size of one page for any supported compressor; outputs above a page are
/// rejected anyway, this only has to be large enough for the compressors not to fail.
pub(crate) const SCRATCH_SIZE: usize = 2 * PAGE_SIZE + 1024;

enum Inner {
    Lz4,
    Zstd {
        c: zstd::bulk::Compressor<'static>,
        d: zstd::bulk::Decompressor<'static>,
    },
    Deflate {
        c: Box<miniz_oxide::deflate::core::CompressorOxide>,
        d: Box<miniz_oxide::inflate::core::DecompressorOxide>,
    },
    Iaa {
        job: qpl_dyn::Job,
    },
}

/// One compression context: a compressor and a decompressor with their state, reused for every
/// page a worker handles. This is also the "raw compressor" the benchmarks compare the store with.
pub struct PageCodec {
    kind: Compressor,
    inner: Inner,
}

impl std::fmt::Debug for PageCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageCodec")
            .field("compressor", &self.kind)
            .finish_non_exhaustive()
    }
}

fn unavailable(kind: Compressor, reason: impl ToString) -> CodecError {
    CodecError::Unavailable {
        name: kind.name(),
        reason: reason.to_string(),
    }
}

impl PageCodec {
    /// A context for `kind`. For [`Compressor::DeflateIaa`] this opens libqpl (once per process)
    /// and fails with [`CodecError::Unavailable`] naming libqpl when it is absent.
    pub fn new(kind: Compressor) -> Result<PageCodec, CodecError> {
        let inner = match kind {
            Compressor::Lz4 => Inner::Lz4,
            Compressor::Zstd { level } => {
                use zstd::zstd_safe::CParameter;
                let (lo, hi) = (
                    zstd::zstd_safe::min_c_level(),
                    zstd::zstd_safe::max_c_level(),
                );
                if level < lo || level > hi {
                    return Err(unavailable(
                        kind,
                        format!("level {level} outside {lo}..={hi}"),
                    ));
                }
                let mut c = zstd::bulk::Compressor::new(level).map_err(|e| unavailable(kind, e))?;
                for p in [
                    CParameter::ChecksumFlag(false),
                    CParameter::ContentSizeFlag(false),
                    CParameter::DictIdFlag(false),
                ] {
                    c.set_parameter(p).map_err(|e| unavailable(kind, e))?;
                }
                let d = zstd::bulk::Decompressor::new().map_err(|e| unavailable(kind, e))?;
                Inner::Zstd { c, d }
            }
            Compressor::Deflate { level } => {
                if !(1..=9).contains(&level) {
                    return Err(unavailable(kind, format!("level {level} outside 1..=9")));
                }
                let flags = miniz_oxide::deflate::core::create_comp_flags_from_zip_params(
                    i32::from(level),
                    -15,
                    0,
                );
                Inner::Deflate {
                    c: Box::new(miniz_oxide::deflate::core::CompressorOxide::new(flags)),
                    d: Box::default(),
                }
            }
            Compressor::DeflateIaa => {
                let qpl = shared_qpl().map_err(|e| unavailable(kind, e))?;
                Inner::Iaa {
                    job: qpl_dyn::Job::new_best(&qpl).map_err(|e| unavailable(kind, e))?,
                }
            }
        };
        Ok(PageCodec { kind, inner })
    }

    /// The algorithm of this context.
    pub fn compressor(&self) -> Compressor {
        self.kind
    }

    /// For [`Compressor::DeflateIaa`], the QPL path in use (hardware or software).
    pub fn qpl_path(&self) -> Option<qpl_dyn::ExecutionPath> {
        match &self.inner {
            Inner::Iaa { job } => Some(job.path()),
            _ => None,
        }
    }

    /// Compresses `src` (any length up to a few pages) into `dst`, which must hold at least
    /// `src.len() * 2 + 1024` bytes; returns the compressed length.
    pub fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let name = self.kind.name();
        let fail = |reason: String| CodecError::Compress { name, reason };
        match &mut self.inner {
            Inner::Lz4 => lz4_flex::block::compress_into(src, dst).map_err(|e| fail(e.to_string())),
            Inner::Zstd { c, .. } => c
                .compress_to_buffer(src, dst)
                .map_err(|e| fail(e.to_string())),
            Inner::Deflate { c, .. } => {
                use miniz_oxide::deflate::core::{compress, TDEFLFlush, TDEFLStatus};
                c.reset();
                let (status, read, written) = compress(c, src, dst, TDEFLFlush::Finish);
                if status == TDEFLStatus::Done && read == src.len() {
                    Ok(written)
                } else {
                    Err(fail(format!(
                        "status {status:?} after {read} of {} bytes",
                        src.len()
                    )))
                }
            }
            Inner::Iaa { job } => job.compress(src, dst).map_err(|e| fail(e.to_string())),
        }
    }

    /// Decompresses `src` into exactly `dst.len()` bytes; anything else is an error.
    pub fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let name = self.kind.name();
        let fail = |reason: String| CodecError::Decompress { name, reason };
        let got = match &mut self.inner {
            Inner::Lz4 => {
                lz4_flex::block::decompress_into(src, dst).map_err(|e| fail(e.to_string()))?
            }
            Inner::Zstd { d, .. } => d
                .decompress_to_buffer(src, dst)
                .map_err(|e| fail(e.to_string()))?,
            Inner::Deflate { d, .. } => inflate_raw(d, src, dst).map_err(fail)?,
            Inner::Iaa { job } => job.decompress(src, dst).map_err(|e| fail(e.to_string()))?,
        };
        if got != dst.len() {
            return Err(CodecError::WrongLength {
                name,
                got,
                expected: dst.len(),
            });
        }
        Ok(())
    }
}

/// Inflates raw deflate `src` into `dst` with a reused miniz decompressor; returns bytes written.
pub(crate) fn inflate_raw(
    d: &mut miniz_oxide::inflate::core::DecompressorOxide,
    src: &[u8],
    dst: &mut [u8],
) -> Result<usize, String> {
    use miniz_oxide::inflate::core::{decompress, inflate_flags};
    use miniz_oxide::inflate::TINFLStatus;
    d.init();
    let flags = inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF;
    let (status, _read, written) = decompress(d, src, dst, 0, flags);
    match status {
        TINFLStatus::Done => Ok(written),
        other => Err(format!("inflate status {other:?} after {written} bytes")),
    }
}

fn shared_qpl() -> Result<Arc<qpl_dyn::Qpl>, String> {
    static QPL: std::sync::OnceLock<Result<Arc<qpl_dyn::Qpl>, String>> = std::sync::OnceLock::new();
    QPL.get_or_init(|| qpl_dyn::Qpl::load().map_err(|e| e.to_string()))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_page(seed: u8) -> Vec<u8> {
        (0..PAGE_SIZE)
            .map(|i| ((i / 7) as u8).wrapping_mul(seed) ^ (i as u8 & 0x0f))
            .collect()
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "zstd is a C library: miri cannot call foreign functions (zstd is one of the codecs it tries)"
    )]
    fn software_codecs_round_trip_and_reject_garbage() {
        for kind in [
            Compressor::Lz4,
            Compressor::Zstd { level: 3 },
            Compressor::Deflate { level: 6 },
        ] {
            let mut codec = PageCodec::new(kind).expect("software codec");
            let page = sample_page(3);
            let mut buf = vec![0u8; SCRATCH_SIZE];
            let n = codec.compress(&page, &mut buf).expect("compress");
            assert!(n < PAGE_SIZE, "{kind:?} compressed to {n}");
            let mut out = vec![0u8; PAGE_SIZE];
            codec.decompress(&buf[..n], &mut out).expect("decompress");
            assert_eq!(out, page);
            // Truncated input never yields a full page silently.
            assert!(
                codec.decompress(&buf[..n / 2], &mut out).is_err(),
                "{kind:?}"
            );
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "zstd is a C library: miri cannot call foreign functions"
    )]
    fn zstd_frames_carry_no_checksum_or_size() {
        let mut codec = PageCodec::new(Compressor::Zstd { level: 1 }).expect("zstd");
        let page = vec![5u8; PAGE_SIZE];
        let mut buf = vec![0u8; SCRATCH_SIZE];
        let n = codec.compress(&page, &mut buf).expect("compress");
        // Frame header descriptor is the byte after the 4-byte magic: bit 2 is the checksum
        // flag, bits 6-7 the content size field size, bits 0-1 the dictionary id size.
        let fhd = buf[4];
        assert_eq!(fhd & 0b100, 0, "checksum flag set");
        assert_eq!(fhd & 0b11, 0, "dictionary id present");
        assert_eq!(fhd >> 6, 0, "content size present");
        assert_eq!(
            fhd & 0b0010_0000,
            0,
            "single-segment implies a content size"
        );
        assert!(n > 0);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "libqpl is loaded with dlopen: miri cannot call foreign functions"
    )]
    fn deflate_iaa_without_libqpl_says_so() {
        match PageCodec::new(Compressor::DeflateIaa) {
            Ok(codec) => assert!(codec.qpl_path().is_some()),
            Err(e) => assert!(e.to_string().contains("libqpl"), "{e}"),
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "zstd is a C library: miri cannot call foreign functions"
    )]
    fn bad_levels_are_rejected() {
        assert!(PageCodec::new(Compressor::Deflate { level: 0 }).is_err());
        assert!(PageCodec::new(Compressor::Zstd { level: 1000 }).is_err());
    }
}
