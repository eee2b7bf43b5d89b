//! `qpl-dyn`: a small binding to Intel QPL (Query Processing Library) that loads `libqpl` at run
//! time.
//!
//! # Why
//!
//! Intel's In-Memory Analytics Accelerator (IAA) compresses and decompresses raw deflate in
//! hardware; the kernel's `iaa_crypto` driver exposes it to zswap as `deflate-iaa`. In userspace the
//! way to it is Intel QPL. The `qpl-sys` bindings are not published on the registry, and linking
//! `libqpl` at build time would make every build of the workspace depend on a library most machines
//! do not have. This crate instead opens `libqpl.so` with [`libloading`] when asked, resolves the
//! four job functions it needs (`qpl_get_job_size`, `qpl_init_job`, `qpl_execute_job`,
//! `qpl_fini_job`) and reports plainly when the library is absent ([`QplError::LibraryNotFound`]).
//!
//! # What it does
//!
//! One [`Job`] is one QPL job structure, allocated at the size `qpl_get_job_size` asks for and
//! reused for any number of operations (QPL's recommended pattern; it is one "context per worker").
//! [`Job::compress`] produces **raw deflate** (no zlib or gzip wrapper, `QPL_FLAG_FIRST |
//! QPL_FLAG_LAST | QPL_FLAG_DYNAMIC_HUFFMAN`), and [`Job::decompress`] inflates raw deflate, so the
//! output is interchangeable with any software raw-deflate implementation (miniz, zlib with
//! `windowBits = -15`). [`Job::new_best`] uses the hardware path when an IAA device is usable and
//! QPL's software path otherwise; [`Job::path`] tells which one was chosen.
//!
//! # Invariants
//!
//! - The job memory lives as long as the [`Job`] and is released with `qpl_fini_job` exactly once.
//! - Every pointer handed to QPL points into a slice that outlives the `qpl_execute_job` call, and
//!   the lengths given are those slices' lengths.
//! - Only the leading, documented fields of `qpl_job` are written; their layout is that of QPL
//!   1.x's `include/qpl/c_api/job.h` (`JobHead` in the source) and the job size is checked to cover it.
//!
//! # Example
//!
//! ```
//! match qpl_dyn::Qpl::load() {
//!     Ok(qpl) => {
//!         let mut job = qpl_dyn::Job::new_best(&qpl).expect("a QPL job");
//!         let page = vec![7u8; 4096];
//!         let mut packed = vec![0u8; 8192];
//!         let n = job.compress(&page, &mut packed).expect("compress");
//!         let mut back = vec![0u8; 4096];
//!         assert_eq!(job.decompress(&packed[..n], &mut back).expect("inflate"), 4096);
//!         assert_eq!(back, page);
//!     }
//!     // Most machines have no libqpl; the error says so and names what was tried.
//!     Err(e) => assert!(e.to_string().contains("libqpl")),
//! }
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

use std::fmt;
use std::sync::Arc;

/// Library names tried, in order, by [`Qpl::load`].
pub const LIBRARY_NAMES: &[&str] = &["libqpl.so", "libqpl.so.1", "libqpl.so.0"];

/// Environment variable that, when set, names the library file [`Qpl::load`] opens instead.
pub const LIBRARY_ENV: &str = "QPL_LIBRARY";

/// `qpl_path_t`: where QPL executes a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionPath {
    /// `qpl_path_auto`: QPL chooses.
    Auto,
    /// `qpl_path_hardware`: an IAA device; fails at job creation when none is usable.
    Hardware,
    /// `qpl_path_software`: QPL's own optimised software implementation on the CPU.
    Software,
}

impl ExecutionPath {
    fn raw(self) -> u32 {
        match self {
            ExecutionPath::Auto => 0,
            ExecutionPath::Hardware => 1,
            ExecutionPath::Software => 2,
        }
    }
}

/// Errors from loading QPL or running a job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QplError {
    /// No `libqpl` could be opened.
    #[error(
        "Intel QPL is not installed: could not open libqpl (tried {tried}): {reason}; install \
         Intel QPL (libqpl.so) or set QPL_LIBRARY to its path to use deflate on IAA"
    )]
    LibraryNotFound {
        /// The names or paths tried.
        tried: String,
        /// The loader's message for the last one tried.
        reason: String,
    },
    /// `libqpl` was opened but lacks a function this crate needs.
    #[error("libqpl has no symbol {symbol}: {reason} (a QPL 1.x library is required)")]
    MissingSymbol {
        /// The function name.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
    /// `qpl_get_job_size` reported a size too small to be a `qpl_job`.
    #[error("qpl_get_job_size returned {size} bytes, less than the {min} of the qpl_job header")]
    BadJobSize {
        /// Size returned.
        size: u32,
        /// Size of the fields this crate writes.
        min: usize,
    },
    /// A QPL call returned a non-zero `qpl_status`.
    #[error("{call} failed on the {path:?} path with qpl_status {status}")]
    Status {
        /// The function that failed.
        call: &'static str,
        /// The path the job runs on.
        path: ExecutionPath,
        /// The raw `qpl_status` value (see QPL's `status.h`).
        status: u32,
    },
    /// The output buffer was too small (`QPL_STS_MORE_OUTPUT_NEEDED`).
    #[error("output buffer of {capacity} bytes is too small")]
    OutputTooSmall {
        /// Bytes available for output.
        capacity: usize,
    },
    /// A buffer is larger than QPL's 32-bit length fields allow.
    #[error("buffer of {len} bytes exceeds QPL's 4 GiB limit")]
    BufferTooLarge {
        /// The offending length.
        len: usize,
    },
}

type GetJobSizeFn = unsafe extern "C" fn(u32, *mut u32) -> u32;
type InitJobFn = unsafe extern "C" fn(u32, *mut u8) -> u32;
type ExecuteJobFn = unsafe extern "C" fn(*mut u8) -> u32;
type FiniJobFn = unsafe extern "C" fn(*mut u8) -> u32;

/// A loaded `libqpl`. Cheap to share: jobs keep an [`Arc`] to it.
pub struct Qpl {
    get_job_size: GetJobSizeFn,
    init_job: InitJobFn,
    execute_job: ExecuteJobFn,
    fini_job: FiniJobFn,
    name: String,
    // Kept last so the function pointers above are never used after the library is closed:
    // they are only reachable through `&self`, which cannot outlive this field.
    _lib: libloading::Library,
}

impl fmt::Debug for Qpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qpl")
            .field("library", &self.name)
            .finish_non_exhaustive()
    }
}

impl Qpl {
    /// Opens `libqpl` (the path in `$QPL_LIBRARY` if set, else [`LIBRARY_NAMES`] through the
    /// dynamic loader's search path) and resolves the job API.
    pub fn load() -> Result<Arc<Qpl>, QplError> {
        let names: Vec<String> = match std::env::var(LIBRARY_ENV) {
            Ok(path) if !path.is_empty() => vec![path],
            _ => LIBRARY_NAMES.iter().map(|s| s.to_string()).collect(),
        };
        let mut reason = String::new();
        for name in &names {
            match Self::load_from(name) {
                Ok(q) => return Ok(q),
                Err(QplError::LibraryNotFound { reason: r, .. }) => reason = r,
                Err(e) => return Err(e),
            }
        }
        Err(QplError::LibraryNotFound {
            tried: names.join(", "),
            reason,
        })
    }

    /// Opens the library at `name` (a file name searched by the loader, or a path).
    pub fn load_from(name: &str) -> Result<Arc<Qpl>, QplError> {
        // SAFETY: opening a shared library runs its initialisers. libqpl's initialisers only set
        // up its dispatcher tables; we trust the library named by the caller or the system
        // loader's search path, as any dynamically linked program does.
        let lib =
            unsafe { libloading::Library::new(name) }.map_err(|e| QplError::LibraryNotFound {
                tried: name.to_string(),
                reason: e.to_string(),
            })?;
        // SAFETY: the types given match the C prototypes in QPL 1.x `job.h`:
        // `qpl_status qpl_get_job_size(qpl_path_t, uint32_t*)` where both enums are `int`-sized.
        let get_job_size = unsafe { symbol::<GetJobSizeFn>(&lib, "qpl_get_job_size") }?;
        // SAFETY: `qpl_status qpl_init_job(qpl_path_t, qpl_job*)`.
        let init_job = unsafe { symbol::<InitJobFn>(&lib, "qpl_init_job") }?;
        // SAFETY: `qpl_status qpl_execute_job(qpl_job*)`.
        let execute_job = unsafe { symbol::<ExecuteJobFn>(&lib, "qpl_execute_job") }?;
        // SAFETY: `qpl_status qpl_fini_job(qpl_job*)`.
        let fini_job = unsafe { symbol::<FiniJobFn>(&lib, "qpl_fini_job") }?;
        Ok(Arc::new(Qpl {
            get_job_size,
            init_job,
            execute_job,
            fini_job,
            name: name.to_string(),
            _lib: lib,
        }))
    }

    /// The library name or path that was opened.
    pub fn library_name(&self) -> &str {
        &self.name
    }
}

/// Resolves `name` in `lib` as a function pointer of type `T`.
///
/// # Safety
///
/// `T` must be the exact function-pointer type of the C symbol, and the returned pointer must not
/// be called after `lib` is dropped.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &'static str) -> Result<T, QplError> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    // SAFETY: the caller guarantees `T` is the symbol's type; we copy the pointer out and the
    // caller keeps `lib` alive for as long as the pointer is used.
    let sym = unsafe { lib.get::<T>(&bytes) }.map_err(|e| QplError::MissingSymbol {
        symbol: name,
        reason: e.to_string(),
    })?;
    Ok(*sym)
}

/// The leading fields of QPL 1.x's `qpl_job` (include/qpl/c_api/job.h), the only ones written.
#[repr(C)]
struct JobHead {
    next_in_ptr: *mut u8,
    available_in: u32,
    total_in: u32,
    next_out_ptr: *mut u8,
    available_out: u32,
    total_out: u32,
    op: u32,
    flags: u32,
    crc: u32,
    xor_checksum: u32,
    last_bit_offset: u32,
    level: u32,
}

const OP_DECOMPRESS: u32 = 0x00;
const OP_COMPRESS: u32 = 0x01;
const FLAG_FIRST: u32 = 0x0001;
const FLAG_LAST: u32 = 0x0002;
const FLAG_DYNAMIC_HUFFMAN: u32 = 0x2000;
const FLAG_OMIT_VERIFY: u32 = 0x4000;
const LEVEL_DEFAULT: u32 = 1;
const STS_OK: u32 = 0;
const STS_MORE_OUTPUT_NEEDED: u32 = 2;

/// One initialised `qpl_job`, reused across operations.
pub struct Job {
    qpl: Arc<Qpl>,
    // INVARIANT: `mem` holds at least `size_of::<JobHead>()` bytes, is 8-byte aligned, and was
    // initialised by a successful `qpl_init_job` on `path`; it is never moved out of the box.
    mem: Box<[u64]>,
    path: ExecutionPath,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("path", &self.path)
            .field("bytes", &(self.mem.len() * 8))
            .finish()
    }
}

// SAFETY: a QPL job is plain memory owned by this value; QPL keeps no thread affinity for it (its
// documentation allows a job to be executed from any thread, one at a time). `&mut self` on every
// operation ensures one at a time.
unsafe impl Send for Job {}

impl Job {
    /// Creates a job on `path`. [`ExecutionPath::Hardware`] fails when no IAA device is usable.
    pub fn new(qpl: &Arc<Qpl>, path: ExecutionPath) -> Result<Job, QplError> {
        let mut size = 0u32;
        // SAFETY: `size` is a valid `uint32_t*` for the duration of the call.
        let status = unsafe { (qpl.get_job_size)(path.raw(), &mut size) };
        if status != STS_OK {
            return Err(QplError::Status {
                call: "qpl_get_job_size",
                path,
                status,
            });
        }
        let min = std::mem::size_of::<JobHead>();
        if (size as usize) < min {
            return Err(QplError::BadJobSize { size, min });
        }
        let words = (size as usize).div_ceil(8);
        let mut mem = vec![0u64; words].into_boxed_slice();
        // SAFETY: `mem` is `size` bytes or more of zeroed, 8-byte aligned memory, as
        // `qpl_init_job` requires, and stays at this address (boxed) for the job's life.
        let status = unsafe { (qpl.init_job)(path.raw(), mem.as_mut_ptr().cast::<u8>()) };
        if status != STS_OK {
            return Err(QplError::Status {
                call: "qpl_init_job",
                path,
                status,
            });
        }
        Ok(Job {
            qpl: Arc::clone(qpl),
            mem,
            path,
        })
    }

    /// Creates a job on the hardware path when an IAA device is usable, else on the software path.
    pub fn new_best(qpl: &Arc<Qpl>) -> Result<Job, QplError> {
        Job::new(qpl, ExecutionPath::Hardware).or_else(|_| Job::new(qpl, ExecutionPath::Software))
    }

    /// The path this job executes on.
    pub fn path(&self) -> ExecutionPath {
        self.path
    }

    /// Compresses `src` into `dst` as one raw deflate stream; returns the compressed length.
    pub fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, QplError> {
        let flags = FLAG_FIRST | FLAG_LAST | FLAG_DYNAMIC_HUFFMAN | FLAG_OMIT_VERIFY;
        self.run(OP_COMPRESS, flags, src, dst)
    }

    /// Inflates the raw deflate stream `src` into `dst`; returns the decompressed length.
    pub fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, QplError> {
        self.run(OP_DECOMPRESS, FLAG_FIRST | FLAG_LAST, src, dst)
    }

    fn run(&mut self, op: u32, flags: u32, src: &[u8], dst: &mut [u8]) -> Result<usize, QplError> {
        let available_in =
            u32::try_from(src.len()).map_err(|_| QplError::BufferTooLarge { len: src.len() })?;
        let available_out =
            u32::try_from(dst.len()).map_err(|_| QplError::BufferTooLarge { len: dst.len() })?;
        let job = self.mem.as_mut_ptr().cast::<JobHead>();
        // SAFETY: by the type invariant `job` points to at least `size_of::<JobHead>()` bytes of
        // 8-byte aligned memory that we own exclusively (`&mut self`); the fields written are
        // plain integers and pointers at QPL 1.x's layout.
        unsafe {
            (*job).next_in_ptr = src.as_ptr().cast_mut();
            (*job).available_in = available_in;
            (*job).total_in = 0;
            (*job).next_out_ptr = dst.as_mut_ptr();
            (*job).available_out = available_out;
            (*job).total_out = 0;
            (*job).op = op;
            (*job).flags = flags;
            (*job).crc = 0;
            (*job).xor_checksum = 0;
            (*job).last_bit_offset = 0;
            (*job).level = LEVEL_DEFAULT;
        }
        // SAFETY: the job was initialised by `qpl_init_job` (type invariant); its input pointer
        // and length describe `src` (QPL only reads it) and its output pointer and length `dst`,
        // both borrowed for the whole call.
        let status = unsafe { (self.qpl.execute_job)(job.cast::<u8>()) };
        match status {
            STS_OK => {}
            STS_MORE_OUTPUT_NEEDED => {
                return Err(QplError::OutputTooSmall {
                    capacity: dst.len(),
                })
            }
            _ => {
                return Err(QplError::Status {
                    call: "qpl_execute_job",
                    path: self.path,
                    status,
                })
            }
        }
        // SAFETY: as above; QPL wrote `total_out`, a plain integer.
        let total_out = unsafe { (*job).total_out } as usize;
        Ok(total_out.min(dst.len()))
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // SAFETY: the job was initialised (type invariant) and is finalised exactly once, here.
        let _ = unsafe { (self.qpl.fini_job)(self.mem.as_mut_ptr().cast::<u8>()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_clear_error() {
        let err = Qpl::load_from("/nonexistent/libqpl.so").expect_err("no such file");
        let msg = err.to_string();
        assert!(msg.contains("libqpl"), "{msg}");
        assert!(msg.contains("/nonexistent/libqpl.so"), "{msg}");
        assert!(matches!(err, QplError::LibraryNotFound { .. }));
    }

    #[test]
    fn job_head_layout_matches_qpl_1x() {
        assert_eq!(std::mem::offset_of!(JobHead, next_out_ptr), 16);
        assert_eq!(std::mem::offset_of!(JobHead, op), 32);
        assert_eq!(std::mem::offset_of!(JobHead, level), 52);
    }
}

/// Compiles and runs the README's example as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
