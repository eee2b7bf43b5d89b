//! Thin, typed wrappers over the syscalls and ioctls the daemon uses, and the only module of
//! the daemon allowed `unsafe` (`#![deny(unsafe_code)]` in lib.rs): besides the calls, the
//! memory kept for secrets ([`Secret`]) and the ownership of a fork's uffd
//! ([`RawUffdMsg::take_fork_uffd`]).
//!
//! The daemon makes its system calls here, on rustix where rustix covers the call (sockets and
//! `SCM_RIGHTS` in `net`, pids, pidfds, signals, waits and limits in `process`, eventfd, poll,
//! pipes, affinity, mappings below), by hand on `libc` where it does not (the userfaultfd
//! ioctls, ptrace, `SO_PEERPIDFD`, `process_vm_readv`, the scheduler's policies, signal
//! dispositions), each `unsafe` block with the reason it is sound. The kernel's uapi
//! structures are defined by hand because Debian 12's headers (and the `libc` crate) predate
//! `UFFDIO_MOVE`, `THREAD_ID` in messages and the feature bits this kernel reports; the
//! `userfaultfd` crate lacks `UFFDIO_MOVE` and the partial-copy count.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

mod net;
mod process;

pub use net::{
    accept, bind_unix, listen, peer_cred, recv_with_fd, recv_with_fd_nonblocking, send_with_fd,
    send_with_fds, seqpacket_socket, set_recv_timeout, shutdown_write, MAX_SENT_FDS, UNIX_PATH_MAX,
};
pub use process::{
    catch_signals, geteuid, getpid, gettid, getuid, ignore_sigpipe, kill, process_gone,
    raise_fd_limit, reap_any, set_child_subreaper, shell_status, take_caught_signal,
    trim_allocator,
};

/// Size of a base page. The daemon manages 4 KiB pages only (x86-64).
pub const PAGE_SIZE: usize = 4096;
/// `PAGE_SIZE` as a `u64`, for address arithmetic.
pub const PAGE_SIZE_U64: u64 = PAGE_SIZE as u64;

/// `UFFD_API`.
pub const UFFD_API: u64 = 0xAA;
/// Message types read from a userfaultfd.
pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// A `fork()` of a process with `EVENT_FORK`; carries the child's new uffd.
pub const UFFD_EVENT_FORK: u8 = 0x13;
/// `mremap()` of a registered range.
pub const UFFD_EVENT_REMAP: u8 = 0x14;
/// `MADV_DONTNEED`/`MADV_FREE` on a registered range.
pub const UFFD_EVENT_REMOVE: u8 = 0x15;
/// `munmap()` of a registered range.
pub const UFFD_EVENT_UNMAP: u8 = 0x16;

/// The fault was a write.
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
/// The fault was a write-protect fault.
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;

pub use crate::wire::{
    REQUIRED_FEATURES, UFFD_FEATURE_EVENT_FORK, UFFD_FEATURE_EVENT_REMAP,
    UFFD_FEATURE_EVENT_REMOVE, UFFD_FEATURE_EVENT_UNMAP, UFFD_FEATURE_MISSING_SHMEM,
    UFFD_FEATURE_MOVE, UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFD_FEATURE_THREAD_ID,
    UFFD_FEATURE_WP_HUGETLBFS_SHMEM,
};

const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

const UFFDIO_API: u64 = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: u64 = ior(0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_WAKE: u64 = ior(0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_COPY: u64 = iowr(0x03, std::mem::size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, std::mem::size_of::<UffdioZeropage>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());
/// `UFFDIO_MOVE`, for a call the daemon runs inside a process (the kernel refuses moves
/// between address spaces): `struct uffdio_move` is five 64-bit words, dst, src, len, mode and
/// the bytes moved (written back by the kernel).
pub const UFFDIO_MOVE: u64 = iowr(0x05, 40);
/// `UFFDIO_MOVE` mode: a hole in the source counts as moved.
pub const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u64 = 1 << 1;
/// `UFFDIO_COPY` mode: fill the page, leave the faulting threads asleep.
const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1 << 0;

/// One message read from a userfaultfd (`struct uffd_msg`, 32 bytes).
///
/// Neither `Clone` nor constructible outside this module but empty (`Default`): a FORK message
/// comes only from [`Uffd::read_msgs`] and carries a descriptor the kernel installed for its
/// reader, which [`RawUffdMsg::take_fork_uffd`] hands out once.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RawUffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    arg: [u64; 3],
}

/// A decoded userfaultfd message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UffdEvent {
    /// A fault at `address` (page aligned by the reader), `flags` are `UFFD_PAGEFAULT_FLAG_*`.
    PageFault {
        /// Faulting address, rounded down to its page.
        address: u64,
        /// `UFFD_PAGEFAULT_FLAG_*`.
        flags: u64,
        /// Thread id of the faulting thread (`UFFD_FEATURE_THREAD_ID`).
        ptid: u32,
    },
    /// `fork()`: the child's uffd, already installed in the daemon's fd table
    /// ([`RawUffdMsg::take_fork_uffd`] takes it).
    Fork {
        /// The new file descriptor's number.
        ufd: RawFd,
    },
    /// `mremap()`.
    Remap {
        /// Old start.
        from: u64,
        /// New start.
        to: u64,
        /// Old length.
        len: u64,
    },
    /// `MADV_DONTNEED` / `MADV_FREE`.
    Remove {
        /// Start (inclusive).
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// `munmap()`.
    Unmap {
        /// Start (inclusive).
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// A message type this daemon does not know.
    Unknown(u8),
}

/// `event` of a FORK message whose descriptor was taken (no kernel message has it).
const UFFD_EVENT_FORK_TAKEN: u8 = 0xff;

impl RawUffdMsg {
    /// The child's userfaultfd of a FORK message, owned by the caller from now on: `None` for
    /// any other message, and for a FORK whose descriptor was taken already.
    pub fn take_fork_uffd(&mut self) -> Option<Uffd> {
        if self.event != UFFD_EVENT_FORK {
            return None;
        }
        self.event = UFFD_EVENT_FORK_TAKEN;
        // SAFETY: a FORK message is only ever written by the kernel (`read_msgs`; the fields
        // are private and the type cannot be cloned), which installed this descriptor in our
        // table for its reader; the message is marked taken above, so it is owned once.
        let fd = unsafe { OwnedFd::from_raw_fd(self.arg[0] as u32 as RawFd) };
        Some(Uffd { fd })
    }

    /// Decodes the message.
    pub fn decode(&self) -> UffdEvent {
        match self.event {
            UFFD_EVENT_PAGEFAULT => UffdEvent::PageFault {
                address: self.arg[1] & !(PAGE_SIZE_U64 - 1),
                flags: self.arg[0],
                ptid: self.arg[2] as u32,
            },
            UFFD_EVENT_FORK => UffdEvent::Fork {
                ufd: self.arg[0] as u32 as RawFd,
            },
            UFFD_EVENT_REMAP => UffdEvent::Remap {
                from: self.arg[0],
                to: self.arg[1],
                len: self.arg[2],
            },
            UFFD_EVENT_REMOVE => UffdEvent::Remove {
                start: self.arg[0],
                end: self.arg[1],
            },
            UFFD_EVENT_UNMAP => UffdEvent::Unmap {
                start: self.arg[0],
                end: self.arg[1],
            },
            other => UffdEvent::Unknown(other),
        }
    }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn cvt_isize(rc: isize) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// A userfaultfd owned by the daemon (received from an agent or from a fork event).
///
/// All range ioctls act on the address space of the process that created the uffd, wherever
/// they are called from (checked on this machine, see DESIGN.md).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

/// Outcome of a fill ioctl (`UFFDIO_COPY`, `UFFDIO_ZEROPAGE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// The page was filled.
    Filled,
    /// The page was already present (`EEXIST`): harmless.
    Exists,
    /// A non-cooperative event is pending (`EAGAIN`): read it, then retry.
    Again,
    /// The range is gone (`ENOENT`/`EFAULT`/`ESRCH`): the mapping or the process went away.
    Gone,
}

/// For poll, and for passing it to an agent (`SCM_RIGHTS`).
impl AsFd for Uffd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Uffd {
    /// Takes ownership of `fd`.
    pub fn from_owned(fd: OwnedFd) -> Self {
        Uffd { fd }
    }

    /// The descriptor, given up.
    pub fn into_owned(self) -> OwnedFd {
        self.fd
    }

    /// The number, for the ioctls.
    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Creates a userfaultfd in the calling process (used by benchmarks and tests, where the
    /// daemon's own memory is the client). Negotiates `features`.
    pub fn create_local(features: u64) -> io::Result<(Self, u64)> {
        // SAFETY: plain syscall with integer arguments.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        let fd = if fd < 0 {
            let dev = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/userfaultfd")?;
            // SAFETY: USERFAULTFD_IOC_NEW takes the flags as an integer argument.
            let fd =
                unsafe { libc::ioctl(dev.as_raw_fd(), 0xAA00, libc::O_CLOEXEC | libc::O_NONBLOCK) };
            cvt(fd)?
        } else {
            fd as RawFd
        };
        let uffd = Uffd {
            // SAFETY: `fd` is a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        };
        let granted = uffd.api(features)?;
        Ok((uffd, granted))
    }

    /// `UFFDIO_API` on a uffd that has not had it yet: enables `features` and returns those
    /// the kernel reports. The privilege some features need (`EVENT_FORK`: `CAP_SYS_PTRACE`) is
    /// the caller's, so the daemon does this for agents whose process has dropped it.
    pub fn api(&self, features: u64) -> io::Result<u64> {
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: `api` is a valid `struct uffdio_api` for the duration of the call.
        cvt(unsafe { libc::ioctl(self.raw(), UFFDIO_API, &mut api) })?;
        Ok(api.features)
    }

    /// Sets `O_NONBLOCK` on the open file description.
    pub fn set_nonblocking(&self) -> io::Result<()> {
        let flags = rustix::fs::fcntl_getfl(&self.fd)?;
        rustix::fs::fcntl_setfl(&self.fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        Ok(())
    }

    /// Reads up to `buf.len()` messages without blocking; returns how many were read.
    pub fn read_msgs(&self, buf: &mut [RawUffdMsg]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: `buf` is valid for writes of `bytes` bytes; RawUffdMsg is plain old data.
        let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), bytes) };
        let n = cvt_isize(n)?;
        Ok(n / std::mem::size_of::<RawUffdMsg>())
    }

    /// Registers `[start, start+len)` for missing and write-protect faults.
    pub fn register(&self, start: u64, len: u64, wp: bool) -> io::Result<()> {
        let mut mode = UFFDIO_REGISTER_MODE_MISSING;
        if wp {
            mode |= UFFDIO_REGISTER_MODE_WP;
        }
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode,
            ioctls: 0,
        };
        // SAFETY: `reg` is a valid `struct uffdio_register`.
        cvt(unsafe { libc::ioctl(self.raw(), UFFDIO_REGISTER, &mut reg) })?;
        Ok(())
    }

    /// Unregisters a range.
    pub fn unregister(&self, start: u64, len: u64) -> io::Result<()> {
        let mut range = UffdioRange { start, len };
        // SAFETY: `range` is a valid `struct uffdio_range`.
        cvt(unsafe { libc::ioctl(self.raw(), UFFDIO_UNREGISTER, &mut range) })?;
        Ok(())
    }

    fn fill_result(rc: libc::c_int) -> io::Result<Fill> {
        if rc == 0 {
            return Ok(Fill::Filled);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EEXIST) => Ok(Fill::Exists),
            Some(libc::EAGAIN) => Ok(Fill::Again),
            Some(libc::ENOENT) | Some(libc::EFAULT) | Some(libc::ESRCH) => Ok(Fill::Gone),
            _ => Err(err),
        }
    }

    /// `UFFDIO_COPY` of `src` (whole pages, in the daemon) to `dst` (in the client), waking
    /// the faulting threads.
    pub fn copy(&self, dst: u64, src: &[u8]) -> io::Result<Fill> {
        self.copy_run(dst, src).0
    }

    /// `UFFDIO_COPY` of one page that leaves the faulting threads asleep
    /// (`UFFDIO_COPY_MODE_DONTWAKE`): they go on at a later [`Uffd::wake`].
    pub fn copy_dontwake(&self, dst: u64, src: &[u8]) -> io::Result<Fill> {
        self.copy_mode(dst, src, UFFDIO_COPY_MODE_DONTWAKE).0
    }

    /// `UFFDIO_COPY` of a run of pages, waking the faulting threads. Returns the outcome and
    /// how many whole pages were filled from the start of the run (a run can stop part way:
    /// at a page that is present, or when an event becomes pending).
    pub fn copy_run(&self, dst: u64, src: &[u8]) -> (io::Result<Fill>, usize) {
        self.copy_mode(dst, src, 0)
    }

    /// [`Uffd::copy_run`] of a fault's run (the faulting page first), falling back to the
    /// faulting page alone when the run filled nothing: one `UFFDIO_COPY` stays within one VMA
    /// and is refused whole (`ENOENT`) when the run crosses into another (a mapping split by
    /// an `mprotect` since the daemon learned it), or stops at a page already present.
    pub fn copy_run_or_first(&self, dst: u64, src: &[u8]) -> (io::Result<Fill>, usize) {
        match self.copy_run(dst, src) {
            (_, 0) if src.len() > PAGE_SIZE => self.copy_run(dst, &src[..PAGE_SIZE]),
            r => r,
        }
    }

    fn copy_mode(&self, dst: u64, src: &[u8], mode: u64) -> (io::Result<Fill>, usize) {
        debug_assert_eq!(src.len() % PAGE_SIZE, 0);
        let mut c = UffdioCopy {
            dst,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode,
            copy: 0,
        };
        // SAFETY: as in `copy`.
        let rc = unsafe { libc::ioctl(self.raw(), UFFDIO_COPY, &mut c) };
        let r = Self::fill_result(rc);
        let pages = match r {
            Ok(Fill::Filled) => src.len() / PAGE_SIZE,
            _ if c.copy > 0 => (c.copy as usize / PAGE_SIZE).min(src.len() / PAGE_SIZE),
            _ => 0,
        };
        (r, pages)
    }

    /// `UFFDIO_ZEROPAGE` of one page, waking the faulting threads.
    pub fn zeropage(&self, dst: u64) -> io::Result<Fill> {
        let mut z = UffdioZeropage {
            range: UffdioRange {
                start: dst,
                len: PAGE_SIZE_U64,
            },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: `z` is a valid `struct uffdio_zeropage`.
        let rc = unsafe { libc::ioctl(self.raw(), UFFDIO_ZEROPAGE, &mut z) };
        Self::fill_result(rc)
    }

    /// Write-protects (`wp = true`) or un-write-protects a range; un-protecting wakes waiters.
    pub fn writeprotect(&self, start: u64, len: u64, wp: bool) -> io::Result<Fill> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange { start, len },
            mode: if wp { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
        };
        // SAFETY: `w` is a valid `struct uffdio_writeprotect`.
        let rc = unsafe { libc::ioctl(self.raw(), UFFDIO_WRITEPROTECT, &mut w) };
        Self::fill_result(rc)
    }

    /// Wakes threads waiting on faults in a range (they retry the access).
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let mut range = UffdioRange { start, len };
        // SAFETY: `range` is a valid `struct uffdio_range`.
        cvt(unsafe { libc::ioctl(self.raw(), UFFDIO_WAKE, &mut range) })?;
        Ok(())
    }
}

/// A fresh private anonymous read-write mapping of `bytes` (the demo's and the benchmark
/// clients' memory; they unmap it, or leave it to their exit).
pub fn map_anonymous(bytes: usize) -> io::Result<*mut u8> {
    use rustix::mm::{MapFlags, ProtFlags};
    // SAFETY: a new private anonymous mapping at an address of the kernel's choosing touches no
    // existing memory.
    let p = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            bytes,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }?;
    Ok(p.cast())
}

/// A private anonymous read-write mapping owned by this value: unmapped when it is dropped
/// (the demo's memory).
#[derive(Debug)]
pub struct AnonMap {
    // INVARIANT: `ptr` is the start of a mapping of `len` bytes, readable and writable, that
    // only this value refers to, from `new` to `drop`.
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl AnonMap {
    /// Maps `len` bytes ([`map_anonymous`]).
    pub fn new(len: usize) -> io::Result<Self> {
        let p = map_anonymous(len)?;
        let ptr =
            std::ptr::NonNull::new(p).ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        Ok(AnonMap { ptr, len })
    }

    /// The whole mapping.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: by the type's invariant the `len` bytes at `ptr` are mapped read-write and
        // reached only through this value, borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: by the type's invariant the mapping is ours alone; no slice of it outlives
        // this value (they borrow it).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Memory for secrets (a key): a private anonymous mapping, locked (never written to swap),
/// left out of core dumps and of children forked before they exec. Wiped, unlocked and unmapped
/// on drop.
#[derive(Debug)]
pub struct SecretPages {
    // INVARIANT: `ptr` is the start of a private anonymous read-write mapping of `len` bytes,
    // locked, that this value alone unmaps.
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; what is stored there, and who may
// reach it, is the owner's business (it hands out only a raw pointer).
unsafe impl Send for SecretPages {}
// SAFETY: see `Send`.
unsafe impl Sync for SecretPages {}

impl SecretPages {
    /// Maps and locks `len` bytes (a multiple of the page size), zero-filled. An `mlock`
    /// failure names `RLIMIT_MEMLOCK`. `MADV_DONTDUMP` and `MADV_DONTFORK` are best effort
    /// (both exist since Linux 3.4 and cannot fail on such a mapping).
    pub fn new(len: usize) -> io::Result<Self> {
        use rustix::mm::{Advice, MapFlags, ProtFlags};
        // SAFETY: a fresh private anonymous mapping at an address the kernel chooses.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        let pages = SecretPages { ptr, len };
        // SAFETY: mlock and madvise of the mapping just made, which only `pages` reaches.
        unsafe {
            rustix::mm::mlock(p, len).map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!(
                        "mlock of {len} bytes: {e}; raise RLIMIT_MEMLOCK (ulimit -l) or turn \
                         encryption off (--encrypt off)"
                    ),
                )
            })?;
            let _ = rustix::mm::madvise(p, len, Advice::LinuxDontDump);
            let _ = rustix::mm::madvise(p, len, Advice::LinuxDontFork);
        }
        Ok(pages)
    }

    /// The start of the mapping (valid for reads and writes of `len` bytes while `self` lives).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapping's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Overwrites every byte of the mapping with zeros (volatile writes; nothing may hold a
    /// reference into it, which `&mut self` ensures for what this value hands out).
    pub fn wipe_all(&mut self) {
        // SAFETY: the mapping is `len` bytes of plain memory, this value's alone (INVARIANT),
        // and `&mut self` excludes every other use of it meanwhile.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) };
        wipe(bytes);
    }

    /// Whether the mapping's first page is resident (`mincore`).
    pub fn first_page_resident(&self) -> io::Result<bool> {
        let mut vec = [0u8; 1];
        // SAFETY: mincore(2) on this value's mapping (at least a page), one byte of output.
        let rc = unsafe {
            libc::mincore(
                self.ptr.as_ptr().cast(),
                PAGE_SIZE.min(self.len),
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec[0] & 1 == 1)
    }
}

impl Drop for SecretPages {
    fn drop(&mut self) {
        self.wipe_all();
        let p = self.ptr.as_ptr().cast();
        // SAFETY: by the type's invariant the mapping is this value's alone; the owner keeps
        // no reference into it past its own drop, which runs before this one.
        unsafe {
            let _ = rustix::mm::munlock(p, self.len);
            let _ = rustix::mm::munmap(p, self.len);
        }
    }
}

/// Overwrites `buf` with zeros in a way the compiler may not elide (volatile writes, then a
/// fence): for secrets about to go out of scope.
pub fn wipe(buf: &mut [u8]) {
    for b in buf.iter_mut() {
        // SAFETY: `b` is a valid, aligned, exclusive reference to a byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// A value of type `T` in memory of its own ([`SecretPages`]: locked, out of core dumps and
/// children), built from a seed of `SEED` bytes drawn into that same memory; the seed is wiped
/// once the value is built, and every byte of the mapping when the value is dropped.
/// For a key schedule that must never reach swap, a dump or a forked child.
pub struct Secret<T, const SEED: usize> {
    // INVARIANT: `pages` (at least `Self::BYTES` long, page aligned) holds at offset
    // `Self::VALUE_AT` an initialised `T`, written once by `new` and only read after; its
    // first `SEED` bytes are zeros. `T` is only reached through `&self` (`get`), so this value
    // is `Send`/`Sync` when `T` is (`SecretPages` is both; the `PhantomData` carries `T`'s).
    pages: SecretPages,
    _value: std::marker::PhantomData<T>,
}

impl<T, const SEED: usize> Secret<T, SEED> {
    /// Where the value lies: after the seed, aligned for `T`.
    const VALUE_AT: usize = SEED.next_multiple_of(std::mem::align_of::<T>());
    /// Bytes mapped: the seed and the value, whole pages.
    const BYTES: usize = (Self::VALUE_AT + std::mem::size_of::<T>()).next_multiple_of(PAGE_SIZE);

    /// Maps the memory, has `fill` write the seed, builds the value from it with `build`,
    /// wipes the seed. On an error the memory is wiped and unmapped.
    pub fn new(
        fill: impl FnOnce(&mut [u8; SEED]) -> io::Result<()>,
        build: impl FnOnce(&[u8; SEED]) -> io::Result<T>,
    ) -> io::Result<Self> {
        const { assert!(std::mem::align_of::<T>() <= PAGE_SIZE) };
        let pages = SecretPages::new(Self::BYTES).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("memory for a secret ({} bytes): {e}", Self::BYTES),
            )
        })?;
        let built = {
            // SAFETY: the mapping is `BYTES >= SEED` bytes, zero filled (plain bytes are valid
            // whatever they hold), page aligned (enough for a byte array), and only this
            // reference reaches it until the block ends.
            let seed = unsafe { &mut *pages.as_ptr().cast::<[u8; SEED]>() };
            let built = fill(seed).and_then(|()| build(seed));
            wipe(seed);
            built
        };
        match built {
            Ok(value) => {
                // SAFETY: `VALUE_AT + size_of::<T>() <= BYTES`, aligned for `T` (the mapping
                // is page aligned and `align_of::<T>() <= PAGE_SIZE`); nothing is there yet.
                unsafe { pages.as_ptr().add(Self::VALUE_AT).cast::<T>().write(value) };
                Ok(Secret {
                    pages,
                    _value: std::marker::PhantomData,
                })
            }
            Err(e) => Err(e), // (`pages` wipes and unmaps the memory)
        }
    }

    /// The value.
    pub fn get(&self) -> &T {
        // SAFETY: initialised by `new` and never written again while `self` lives (INVARIANT).
        unsafe { &*self.pages.as_ptr().add(Self::VALUE_AT).cast::<T>() }
    }

    /// Whether every byte of the seed reads zero (for tests: the seed was wiped).
    pub fn seed_is_wiped(&self) -> bool {
        // SAFETY: the seed's bytes are initialised plain bytes that nothing writes while
        // `self` is borrowed (INVARIANT).
        let seed = unsafe { &*self.pages.as_ptr().cast::<[u8; SEED]>() };
        seed.iter().all(|&b| b == 0)
    }

    /// Whether the memory is resident (`mincore`: locked memory is).
    pub fn resident(&self) -> io::Result<bool> {
        self.pages.first_page_resident()
    }
}

impl<T, const SEED: usize> std::fmt::Debug for Secret<T, SEED> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)") // never its bytes
    }
}

impl<T, const SEED: usize> Drop for Secret<T, SEED> {
    fn drop(&mut self) {
        // SAFETY: the value was initialised by `new` and is dropped here once; nothing reads
        // it after (INVARIANT). `pages` then wipes the mapping and unmaps it.
        unsafe {
            std::ptr::drop_in_place(self.pages.as_ptr().add(Self::VALUE_AT).cast::<T>());
        }
    }
}

/// Allocates `len` bytes of `file` from its start (`fallocate(2)`, mode 0): later writes into
/// them cannot fail for lack of space.
pub fn allocate_file(file: &std::fs::File, len: u64) -> io::Result<()> {
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len)?;
    Ok(())
}

/// A shared mapping of a file (a pmem device or a file standing in for one), read and written
/// by copying bytes at checked offsets.
#[derive(Debug)]
pub struct SharedFileMap {
    // INVARIANT: `ptr` is the start of a shared read-write mapping of `len` bytes that this
    // value alone unmaps, from `new` to `drop`.
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    sync: bool,
}

// SAFETY: the mapping is plain shared memory; every access copies bytes of a range checked
// against `len` through raw pointers (no reference into it is ever handed out), and the
// callers (a backend whose slots are written before they are published and read only while
// referenced) never access one range from two threads at once.
unsafe impl Send for SharedFileMap {}
// SAFETY: see `Send`.
unsafe impl Sync for SharedFileMap {}

impl SharedFileMap {
    /// Maps the first `len` bytes of `file`, shared: with `MAP_SYNC` where the file is on DAX
    /// (then `is_sync`), an ordinary shared mapping otherwise.
    pub fn new(file: &std::fs::File, len: usize) -> io::Result<Self> {
        use rustix::mm::{MapFlags, ProtFlags};
        let prot = ProtFlags::READ | ProtFlags::WRITE;
        // SAFETY: a fresh mapping of a descriptor we hold, at an address the kernel chooses:
        // nothing else is mapped there, and only this value reaches it.
        let synced = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                MapFlags::SHARED_VALIDATE | MapFlags::SYNC,
                file,
                0,
            )
        };
        let (p, sync) = match synced {
            Ok(p) => (p, true),
            // SAFETY: as above.
            Err(_) => (
                unsafe {
                    rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, file, 0)?
                },
                false,
            ),
        };
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))?;
        Ok(SharedFileMap { ptr, len, sync })
    }

    /// Whether the mapping is `MAP_SYNC` (the file is on DAX).
    pub fn is_sync(&self) -> bool {
        self.sync
    }

    /// The mapping's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: u64, n: usize) -> io::Result<usize> {
        let off = usize::try_from(offset).unwrap_or(usize::MAX);
        if off.checked_add(n).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "an access of {n} bytes at {offset:#x} beyond the mapping's {} bytes",
                    self.len
                ),
            ));
        }
        Ok(off)
    }

    /// Copies `data` into the mapping at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let off = self.check(offset, data.len())?;
        // SAFETY: `off..off + len` lies in the mapping (checked), which `data`, a slice of
        // the caller's, does not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
        Ok(())
    }

    /// Copies the mapping's bytes at `offset` into `out`.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let off = self.check(offset, out.len())?;
        // SAFETY: as in `write_at`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }
}

impl Drop for SharedFileMap {
    fn drop(&mut self) {
        // SAFETY: by the type's invariant the mapping is this value's alone, and no reference
        // into it exists (accesses copy through raw pointers).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Waits until one of `fds` is readable, hung up or in
/// error, or until `timeout_ms` passes (negative: no limit); returns the ready mask. A signal
/// during the wait restarts it.
pub fn poll_read(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> io::Result<Vec<bool>> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|&fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
        .collect();
    let timeout = u64::try_from(timeout_ms).ok().map(|ms| Timespec {
        tv_sec: (ms / 1000) as i64,
        tv_nsec: ((ms % 1000) * 1_000_000) as i64,
    });
    loop {
        match rustix::event::poll(&mut pfds, timeout.as_ref()) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => return Ok(pfds.iter().map(|p| !p.revents().is_empty()).collect()),
        }
    }
}

/// An eventfd used to wake threads blocked in `poll`.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

/// For poll.
impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl EventFd {
    /// Creates a non-blocking eventfd (close-on-exec).
    pub fn new() -> io::Result<Self> {
        use rustix::event::EventfdFlags;
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(EventFd { fd })
    }
    /// Makes it readable.
    pub fn signal(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
    /// Consumes pending signals.
    pub fn drain(&self) {
        let mut v = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut v);
    }
}

/// The daemon's lifeline: a pipe whose write end only the daemon holds (close-on-exec, never
/// written), so that its read end, handed to every agent with the answer to its greeting,
/// hangs up (`POLLHUP`) when the daemon exits, and tells nothing else. An agent in a pid
/// namespace below the daemon's cannot look the daemon up by number; a pidfd of the daemon
/// would tell it the same, but would also let a sandboxed process signal the daemon across its
/// namespace.
#[derive(Debug)]
pub struct Lifeline {
    read: OwnedFd,
    _write: OwnedFd,
}

impl Lifeline {
    /// A new lifeline (both ends close-on-exec: no child of the daemon keeps the write end).
    pub fn new() -> io::Result<Self> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        Ok(Lifeline {
            read,
            _write: write,
        })
    }
}

/// The read end (to hand a copy to an agent: `SCM_RIGHTS`).
impl AsFd for Lifeline {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }
}

/// `flock(fd, LOCK_EX | LOCK_NB)` (`exclusive`) or `LOCK_SH | LOCK_NB`: `Ok(true)` when taken,
/// `Ok(false)` when another open file description holds a conflicting lock.
pub fn try_flock(fd: impl AsFd, exclusive: bool) -> io::Result<bool> {
    use rustix::fs::FlockOperation;
    let op = if exclusive {
        FlockOperation::NonBlockingLockExclusive
    } else {
        FlockOperation::NonBlockingLockShared
    };
    match rustix::fs::flock(fd, op) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A pidfd: readable when the process has exited.
#[derive(Debug)]
pub struct PidFd {
    fd: OwnedFd,
}

/// For poll, and to hand a copy to a client (`SCM_RIGHTS`).
impl AsFd for PidFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl PidFd {
    /// Opens a pidfd for `pid`.
    pub fn open(pid: i32) -> io::Result<Self> {
        Ok(PidFd {
            fd: process::pidfd_open(pid)?,
        })
    }
    /// Whether the process has exited (non-blocking check).
    pub fn exited(&self) -> bool {
        matches!(poll_read(&[self.fd.as_fd()], 0).as_deref(), Ok([true]))
    }

    /// The pidfd of the process at the other end of a connected Unix socket (`SO_PEERPIDFD`,
    /// Linux 6.5): the process that connected, whatever became of its number since. By hand:
    /// rustix 1.1 has no `SO_PEERPIDFD`.
    pub fn of_peer(sock: impl AsFd) -> io::Result<Self> {
        let mut fd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` and `len` are live and sized for SO_PEERPIDFD.
        cvt(unsafe {
            libc::getsockopt(
                sock.as_fd().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERPIDFD,
                (&mut fd as *mut libc::c_int).cast(),
                &mut len,
            )
        })?;
        Ok(PidFd {
            // SAFETY: the kernel installed `fd` for us; nothing else owns it.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Sends `sig` to the process (`pidfd_send_signal`): never to another process that got
    /// its number after it exited.
    /// `sig` is a named signal (`EINVAL` otherwise).
    pub fn send_signal(&self, sig: i32) -> io::Result<()> {
        process::pidfd_send_signal(&self.fd, sig)
    }
}

/// Reads `out.len()` bytes at `addr` of process `pid` through its `/proc/PID/mem`, which never
/// waits for a userfaultfd (a page that is not present in a registered range fails with `EIO`)
/// and never makes the reading thread's fault one a handler must serve. Only call it for a page
/// known present if the address may be ordinary anonymous memory: the read would map the zero
/// page there.
pub fn read_mem_at(pid: i32, addr: u64, out: &mut [u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    f.read_exact_at(out, addr)
}

/// Reads runs of pages of another process through its `/proc/PID/mem` (one `pread` per run),
/// which never faults a page in: a page that is not mapped (removed or unmapped by the program
/// since it was chosen, or discarded after `MADV_FREE`) fails with `EIO` there. With
/// `process_vm_readv` the same read raised a userfault that the handler had to fill, and the
/// zero page it filled could land in a new mapping the program had just made at that address.
///
/// Returns the addresses of the pages that could not be read (their bytes in `out` are left as
/// they were); an error when the address space is gone or the file cannot be read at all.
pub fn read_mem(
    mem: &std::fs::File,
    runs: &[(u64, usize)],
    out: &mut [u8],
) -> io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let mut missing = Vec::new();
    let mut at = 0usize;
    for &(addr, len) in runs {
        let mut done = 0usize;
        while done < len {
            let buf = &mut out[at + done..at + len];
            match mem.read_at(buf, addr + done as u64) {
                // The address space has no users left (the process exited).
                Ok(0) => return Err(io::Error::from_raw_os_error(libc::ESRCH)),
                Ok(n) => done += n,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EFAULT)) => {
                    // The page at `done` is not mapped: skip it.
                    missing.push(addr + done as u64);
                    done += PAGE_SIZE;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            // (A read ends at a page boundary when it meets a page it cannot read.)
            done = done.min(len);
        }
        at += len;
    }
    Ok(missing)
}

/// The page frame number of each page of `runs` (address, pages) of another process, from
/// its `/proc/PID/pagemap` (one `pread` per run): 0 for a page not present. Frame numbers are
/// shown only to a reader with `CAP_SYS_ADMIN` (the daemon runs as root); without it every
/// page reads as frame 0, which callers take as "unknown".
pub fn read_frames(pagemap: &std::fs::File, runs: &[(u64, usize)]) -> io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    const PRESENT: u64 = 1 << 63;
    const PFN_MASK: u64 = (1 << 55) - 1;
    let mut frames = Vec::with_capacity(runs.iter().map(|r| r.1).sum());
    let mut buf = Vec::new();
    for &(addr, pages) in runs {
        buf.resize(pages * 8, 0);
        pagemap.read_exact_at(&mut buf, addr / PAGE_SIZE as u64 * 8)?;
        frames.extend(buf.chunks_exact(8).map(|e| {
            let v = u64::from_le_bytes(e.try_into().expect("8 bytes"));
            if v & PRESENT != 0 {
                v & PFN_MASK
            } else {
                0
            }
        }));
    }
    Ok(frames)
}

/// Reads pages of another process with `process_vm_readv`, one iovec per run.
///
/// Only call this for pages known to be present: on a missing page in a registered range the
/// read raises a fault on the uffd and waits for its handler (DESIGN.md).
pub fn read_remote(pid: i32, runs: &[(u64, usize)], out: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: out.len(),
    };
    let remote: Vec<libc::iovec> = runs
        .iter()
        .map(|&(addr, len)| libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        })
        .collect();
    // SAFETY: `local` describes `out`, valid for writes; the remote iovecs are only addresses
    // in the other process, which the kernel checks.
    let n = unsafe {
        libc::process_vm_readv(
            pid,
            &local,
            1,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    cvt_isize(n)
}

/// Writes `data` into another process at `addr` with `process_vm_writev`. Only for memory no
/// userfaultfd covers (the daemon's own pages in a process without an agent).
pub fn write_remote(pid: i32, addr: u64, data: &[u8]) -> io::Result<()> {
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` describes `data`, valid for reads; the remote iovec is only an address
    // in the other process, which the kernel checks.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    match cvt_isize(n)? {
        n if n == data.len() => Ok(()),
        _ => Err(io::Error::from_raw_os_error(libc::EFAULT)),
    }
}

/// The CPU the calling thread runs on (a hint).
pub fn current_cpu() -> usize {
    rustix::thread::sched_getcpu()
}

/// A PM QoS CPU latency request (`/dev/cpu_dma_latency`), in force while this value lives:
/// idle CPUs of the whole machine then avoid idle states that take longer than the limit to
/// leave (0: they poll instead of halting). The kernel drops the request when the file closes
/// (so also when the daemon dies).
#[derive(Debug)]
pub struct CpuLatencyRequest {
    file: std::fs::File,
}

impl CpuLatencyRequest {
    /// The value that constrains nothing (the kernel's `PM_QOS_CPU_LATENCY_DEFAULT_VALUE`).
    pub const NO_CONSTRAINT_US: u32 = 2_000_000_000;

    /// Asks for an exit latency of at most `us` microseconds.
    pub fn new(us: u32) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/cpu_dma_latency")?;
        let mut req = CpuLatencyRequest { file };
        req.set(us)?;
        Ok(req)
    }

    /// Changes the limit (one write; the kernel re-evaluates idle CPUs when the machine-wide
    /// limit changes).
    pub fn set(&mut self, us: u32) -> io::Result<()> {
        use std::io::Write;
        let value = i32::try_from(us).unwrap_or(i32::MAX);
        self.file.write_all(&value.to_ne_bytes())
    }
}

/// The machine's physical memory in bytes (`sysconf`: a C library call; rustix has none).
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf with constant arguments.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as u64) * (size.max(0) as u64)
}

/// CPUs online in the machine (not only those this process may run on: the clients may run on
/// the others).
pub fn nr_cpus() -> usize {
    // SAFETY: sysconf with a constant argument.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

/// The CPU a thread last ran on, from `/proc/<pid>/task/<tid>/stat` (field 39).
pub fn thread_last_cpu(pid: i32, tid: u32) -> Option<usize> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split(' ').nth(36)?.parse().ok()
}

/// Pins the calling thread to one CPU; false if the kernel refused (a CPU outside the
/// thread's cpuset, or offline).
pub fn pin_to_cpu(cpu: usize) -> bool {
    use rustix::thread::CpuSet;
    if cpu >= CpuSet::MAX_CPU {
        return false;
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).is_ok()
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> Vec<usize> {
    use rustix::thread::CpuSet;
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => Vec::new(),
    }
}

/// Moves the calling thread to `SCHED_IDLE` (it then runs only when nothing else on its CPU
/// wants to); false if refused.
pub fn set_sched_idle() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid sched_param for the calling thread (pid 0).
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 }
}

/// Makes the calling thread `SCHED_FIFO` at `priority` (children would start at the normal
/// policy: `SCHED_RESET_ON_FORK`). Needs `CAP_SYS_NICE` (or an RLIMIT_RTPRIO allowance).
pub fn set_sched_fifo(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a valid sched_param for the calling thread (pid 0).
    let r = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Moves the calling thread off `cpu` to another CPU it may run on: its affinity is narrowed
/// to the others (the kernel migrates it at once), then given back whole, so the scheduler
/// stays free to place it later. False when `cpu` is the only CPU it may run on or a call
/// fails (the thread then stays where it was, with its affinity unchanged).
pub fn move_off_cpu(cpu: usize) -> bool {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let Ok(all) = sched_getaffinity(None) else {
        return false;
    };
    if cpu >= CpuSet::MAX_CPU || !all.is_set(cpu) {
        return false;
    }
    let mut others = all;
    others.unset(cpu);
    if others.count() == 0 {
        return false;
    }
    let moved = sched_setaffinity(None, &others).is_ok();
    // Restores the mask read at the start.
    let _ = sched_setaffinity(None, &all);
    moved
}

/// CPU time the calling thread has used, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Voluntary context switches of the calling thread so far.
pub fn thread_voluntary_switches() -> u64 {
    // SAFETY: rusage is plain data; getrusage writes it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_nvcsw as u64
}

/// Starts writeback of `[offset, offset + len)` of `file` to its device, without waiting
/// (`sync_file_range` with `WRITE`).
pub fn start_writeback(file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    sync_file_range(file, offset, len, libc::SYNC_FILE_RANGE_WRITE)
}

fn sync_file_range(file: &std::fs::File, offset: u64, len: u64, flags: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: sync_file_range(2) on a descriptor the caller owns, with integer arguments.
    let r = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            flags,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `[offset, offset + len)` of `file` through to its device and waits until it is
/// there (`sync_file_range` with `WAIT_BEFORE | WRITE | WAIT_AFTER`: data only, no metadata,
/// which a swap file that dies with the daemon does not need); an error the device reports for
/// the range comes back here. rustix has no `sync_file_range`.
pub fn write_through(file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    sync_file_range(
        file,
        offset,
        len,
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER,
    )
}

// ---------------------------------------------------------------------------------------------
// ptrace, for agentless management (`inject.rs`): the calls that stop one thread of a program,
// run a system call in it, and give it back exactly as it was.

/// `PTRACE_EVENT_STOP`: a stop of a `PTRACE_SEIZE`d thread (`PTRACE_INTERRUPT`, group-stop).
pub const PTRACE_EVENT_STOP: i32 = 128;
/// `PTRACE_EVENT_EXEC`.
pub const PTRACE_EVENT_EXEC: i32 = 4;

/// The registers of a stopped tracee (x86-64 `struct user_regs_struct`).
pub type Regs = libc::user_regs_struct;

/// A `Regs` of zeros (to be filled by [`ptrace_getregs`]).
pub fn empty_regs() -> Regs {
    // SAFETY: user_regs_struct is plain data (integers only); all zeros is a valid value.
    unsafe { std::mem::zeroed() }
}

fn ptrace_call(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: every request made through this function takes integer `addr` and `data`
    // arguments (SEIZE, INTERRUPT, SINGLESTEP, DETACH, SETOPTIONS): the kernel reads no memory
    // of ours for them.
    let r = unsafe { libc::ptrace(req, tid, addr, data) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// `PTRACE_SEIZE` of thread `tid` with `options` (`PTRACE_O_*`): no stop, no signal.
pub fn ptrace_seize(tid: i32, options: u32) -> io::Result<()> {
    ptrace_call(libc::PTRACE_SEIZE, tid, 0, options as usize).map(drop)
}

/// `PTRACE_INTERRUPT`: a seized thread stops (`PTRACE_EVENT_STOP`) as soon as it can.
pub fn ptrace_interrupt(tid: i32) -> io::Result<()> {
    ptrace_call(libc::PTRACE_INTERRUPT, tid, 0, 0).map(drop)
}

/// The address of a stopped tracee's rseq area (`PTRACE_GET_RSEQ_CONFIGURATION`; 0: none).
pub fn ptrace_rseq_area(tid: i32) -> io::Result<u64> {
    #[repr(C)]
    #[derive(Default)]
    struct RseqConfiguration {
        rseq_abi_pointer: u64,
        rseq_abi_size: u32,
        signature: u32,
        flags: u32,
        pad: u32,
    }
    const PTRACE_GET_RSEQ_CONFIGURATION: libc::c_uint = 0x420f;
    let mut conf = RseqConfiguration::default();
    // SAFETY: the request writes at most `addr` bytes (the structure's size) to `data`, which
    // points to `conf`.
    let r = unsafe {
        libc::ptrace(
            PTRACE_GET_RSEQ_CONFIGURATION,
            tid,
            std::mem::size_of::<RseqConfiguration>(),
            &mut conf as *mut RseqConfiguration,
        )
    };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(conf.rseq_abi_pointer)
}

/// `PTRACE_SINGLESTEP`, delivering `sig` (0: none).
pub fn ptrace_singlestep(tid: i32, sig: i32) -> io::Result<()> {
    ptrace_call(libc::PTRACE_SINGLESTEP, tid, 0, sig as usize).map(drop)
}

/// `PTRACE_DETACH`, delivering `sig` (0: none).
pub fn ptrace_detach(tid: i32, sig: i32) -> io::Result<()> {
    ptrace_call(libc::PTRACE_DETACH, tid, 0, sig as usize).map(drop)
}

/// `PTRACE_GETREGS` of a stopped tracee.
pub fn ptrace_getregs(tid: i32) -> io::Result<Regs> {
    let mut regs = empty_regs();
    // SAFETY: PTRACE_GETREGS writes one user_regs_struct to `data`, which points to `regs`.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &mut regs as *mut Regs) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(regs)
}

/// `PTRACE_SETREGS` of a stopped tracee.
pub fn ptrace_setregs(tid: i32, regs: &Regs) -> io::Result<()> {
    // SAFETY: PTRACE_SETREGS reads one user_regs_struct from `data`, which points to `regs`.
    let r = unsafe { libc::ptrace(libc::PTRACE_SETREGS, tid, 0usize, regs as *const Regs) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes a command's child a tracee of the thread that spawns it (`PTRACE_TRACEME` between
/// fork and exec): it stops with `SIGTRAP` right after its exec, before its first instruction.
/// The spawning thread must be the one that makes every later ptrace call on it.
pub fn trace_me_at_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only makes one raw
    // system call (async-signal-safe), touching no memory of the parent's locks or allocator.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0usize, 0usize) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// What `waitpid` said of a tracee.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceeState {
    /// Stopped: the signal (`SIGTRAP` for a step, the stop signal for a group-stop) and the
    /// ptrace event (0, `PTRACE_EVENT_STOP`, `PTRACE_EVENT_EXEC`, ...).
    Stopped {
        /// `WSTOPSIG`.
        sig: i32,
        /// `status >> 16`.
        event: i32,
    },
    /// Exited or killed; the status as a shell gives it (128 + N for signal N).
    Exited(i32),
}

/// `waitpid(tid, __WALL | WNOHANG)`: `None` while the tracee has nothing to report.
pub fn wait_tracee(tid: i32) -> io::Result<Option<TraceeState>> {
    let mut st: libc::c_int = 0;
    // SAFETY: waitpid with a valid status pointer.
    let r = unsafe { libc::waitpid(tid, &mut st, libc::__WALL | libc::WNOHANG) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 {
        return Ok(None);
    }
    Ok(Some(decode_wait_status(st)))
}

/// Decodes a `waitpid` status.
pub fn decode_wait_status(st: libc::c_int) -> TraceeState {
    if libc::WIFSTOPPED(st) {
        TraceeState::Stopped {
            sig: libc::WSTOPSIG(st),
            event: (st >> 16) & 0xff,
        }
    } else if libc::WIFEXITED(st) {
        TraceeState::Exited(libc::WEXITSTATUS(st))
    } else {
        TraceeState::Exited(128 + libc::WTERMSIG(st))
    }
}

/// `tgkill(pid, tid, sig)`.
pub fn tgkill(pid: i32, tid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `tid` (a number in the daemon's pid namespace) names a live thread of the daemon
/// itself: `tgkill(getpid(), tid, 0)`, which checks that the thread exists in this thread group
/// without a path lookup (a `stat` of `/proc/self/task/TID` took 4.5% of all CPU samples in a
/// profile of a random-access workload).
pub fn is_own_thread(tid: u32) -> bool {
    let Ok(tid) = i32::try_from(tid) else {
        return false;
    };
    tid > 0 && tgkill(std::process::id() as i32, tid, 0).is_ok()
}

/// Whether processes `a` and `b` share one address space (`kcmp(KCMP_VM)`: a `vfork` or
/// `clone(CLONE_VM)` child and its parent; needs `PTRACE_MODE_READ` on both).
pub fn same_address_space(a: i32, b: i32) -> io::Result<bool> {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: plain syscall with integer arguments (the two pointer-sized ones unused by
    // KCMP_VM).
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_VM, 0usize, 0usize) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r == 0)
}

impl PidFd {
    /// A copy of descriptor `fd` of the process (`pidfd_getfd`, close-on-exec here).
    pub fn get_fd(&self, fd: i32) -> io::Result<OwnedFd> {
        Ok(rustix::process::pidfd_getfd(
            &self.fd,
            fd,
            rustix::process::PidfdGetfdFlags::empty(),
        )?)
    }
}

/// Fills `buf` with random bytes (`getrandom`).
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match rustix::rand::getrandom(&mut buf[done..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `struct procmap_query` (`linux/fs.h`, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = 0xC000_0000
    | ((std::mem::size_of::<ProcmapQuery>() as libc::c_ulong) << 16)
    | ((b'f' as libc::c_ulong) << 8)
    | 17;

/// The mapping of the process whose `/proc/PID/maps` is `maps` that covers `addr`, as
/// `[start, end)`: `Ok(None)` when none does. One `PROCMAP_QUERY` ioctl (Linux 6.11), not a
/// read of the whole maps text; `ENOTTY` on older kernels.
pub fn vma_covering(maps: &std::fs::File, addr: u64) -> io::Result<Option<(u64, u64)>> {
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr,
        ..Default::default()
    };
    // SAFETY: a valid descriptor and a properly sized, initialised struct the kernel fills;
    // no name or build-id buffer is asked for (their sizes are 0).
    let r = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
    if r == 0 {
        return Ok(Some((q.vma_start, q.vma_end)));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOENT) => Ok(None),
        _ => Err(e),
    }
}

/// What `PROCMAP_QUERY` tells of one mapping: enough to name a shared page by identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmaInfo {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// `MAP_SHARED` (`PROCMAP_QUERY_VMA_SHARED`).
    pub shared: bool,
    /// Readable and writable.
    pub rw: bool,
    /// Offset in the mapped file, in bytes.
    pub offset: u64,
    /// Device of the mapped inode (`major`, `minor`).
    pub dev: (u32, u32),
    /// Inode number (0 for private anonymous memory).
    pub inode: u64,
    /// The mapping's name as `/proc/PID/maps` shows it (`/dev/zero (deleted)`, `[heap]`).
    pub name: String,
}

/// The mapping covering `addr` with its identity (inode, offset, name): one `PROCMAP_QUERY`
/// (Linux 6.11); `Ok(None)` when no mapping covers it, `ENOTTY` on older kernels.
pub fn vma_info(maps: &std::fs::File, addr: u64) -> io::Result<Option<VmaInfo>> {
    let mut name = [0u8; 256];
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr,
        vma_name_size: name.len() as u32,
        vma_name_addr: name.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: a valid descriptor and a properly sized, initialised struct the kernel fills;
    // the name buffer is `name`, alive and `vma_name_size` bytes long for the call; no
    // build-id buffer is asked for (its size is 0).
    let r = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        };
    }
    let n = (q.vma_name_size as usize).min(name.len());
    let name = String::from_utf8_lossy(&name[..n])
        .trim_end_matches('\0')
        .to_string();
    Ok(Some(VmaInfo {
        start: q.vma_start,
        end: q.vma_end,
        shared: q.vma_flags & 8 != 0,
        rw: q.vma_flags & 3 == 3,
        offset: q.vma_offset,
        dev: (q.dev_major, q.dev_minor),
        inode: q.inode,
        name,
    }))
}

/// The inode of a shared anonymous mapping, opened read-write through
/// `/proc/PID/map_files/START-END` (needs `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE` in the
/// initial namespace): reads and punches of its pages that fault no one. Returns the file and
/// its `(st_dev, st_ino)`.
pub fn open_map_file(pid: i32, start: u64, end: u64) -> io::Result<(std::fs::File, (u64, u64))> {
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))?;
    let m = f.metadata()?;
    Ok((f, (m.dev(), m.ino())))
}

/// `(st_dev, st_ino)` of an open file.
pub fn file_identity(f: &std::fs::File) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// Reads `out.len()` bytes at `offset` of a shmem file (a hole reads as zeros and stays a
/// hole: `SGP_READ`).
pub fn shmem_read(f: &std::fs::File, offset: u64, out: &mut [u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(out, offset)
}

/// Writes `data` at `offset` of a shmem file (a hole gets a page: no userfault is raised).
pub fn shmem_write(f: &std::fs::File, offset: u64, data: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(data, offset)
}

/// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: the pages leave the page cache and every mapper's
/// page table (uffd-wp markers stay), and raise no userfaultfd event.
pub fn punch_hole(f: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    use rustix::fs::FallocateFlags;
    rustix::fs::fallocate(
        f,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )?;
    Ok(())
}

/// The data extents of a shmem file in `[0, size)`, as `[start, end)` byte ranges
/// (`SEEK_DATA`/`SEEK_HOLE`): the pages present in the page cache.
pub fn data_extents(f: &std::fs::File, size: u64) -> io::Result<Vec<(u64, u64)>> {
    use rustix::fs::SeekFrom;
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        let start = match rustix::fs::seek(f, SeekFrom::Data(pos)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = match rustix::fs::seek(f, SeekFrom::Hole(start)) {
            Ok(e) => e,
            Err(rustix::io::Errno::NXIO) => size,
            Err(e) => return Err(e.into()),
        };
        out.push((start, end.min(size)));
        pos = end;
    }
    Ok(out)
}

#[cfg(test)]
mod procmap_tests {
    /// The query finds the mapping of a buffer of this process, and nothing at address 0.
    #[test]
    fn vma_covering_finds_a_mapping_of_this_process() {
        let len = 16 * super::PAGE_SIZE;
        // SAFETY: an anonymous mapping of our own, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let maps = std::fs::File::open("/proc/self/maps").unwrap();
        let a = p as u64;
        let (s, e) = super::vma_covering(&maps, a + 5 * super::PAGE_SIZE_U64)
            .unwrap()
            .unwrap();
        assert!(s <= a && e >= a + len as u64, "{s:#x}..{e:#x} for {a:#x}");
        assert_eq!(super::vma_covering(&maps, 0).unwrap(), None);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's own threads are its own, while they live; another process's, or a
    /// number no thread has, is not.
    #[test]
    fn own_threads_are_told_from_others() {
        let me = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        assert!(is_own_thread(me));
        assert!(is_own_thread(std::process::id()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(rustix::thread::gettid().as_raw_nonzero().get() as u32)
                .unwrap();
            let _ = stop_rx.recv();
        });
        let other = rx.recv().unwrap();
        assert!(is_own_thread(other));
        drop(stop_tx);
        t.join().unwrap();
        // (`join` returns at the thread's clear-tid wake, a moment before it is released.)
        let ended = std::time::Instant::now();
        while is_own_thread(other) && ended.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            !is_own_thread(other),
            "a thread that ended is no longer ours"
        );
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(
            !is_own_thread(child.id()),
            "a child process is not a thread of ours"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!is_own_thread(0));
        assert!(!is_own_thread(u32::MAX));
    }

    /// A secret is built from its seed, which is wiped; its value is dropped once, with it; a
    /// seed or build error gives the error back and builds nothing.
    #[test]
    fn secret_builds_wipes_and_drops_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct Counted([u8; 4], u64);
        impl Drop for Counted {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let s = Secret::<Counted, 4>::new(
            |seed| {
                seed.copy_from_slice(b"abcd");
                Ok(())
            },
            |seed| Ok(Counted(*seed, 7)),
        )
        .unwrap();
        assert_eq!((&s.get().0, s.get().1), (b"abcd", 7));
        assert!(s.seed_is_wiped());
        assert!(s.resident().unwrap());
        assert_eq!(DROPS.load(Ordering::SeqCst), 0);
        drop(s);
        assert_eq!(DROPS.load(Ordering::SeqCst), 1);
        let e = Secret::<Counted, 4>::new(|_| Err(io::Error::other("no seed")), |_| unreachable!());
        assert_eq!(e.err().unwrap().to_string(), "no seed");
        let e = Secret::<Counted, 4>::new(|_| Ok(()), |_| Err(io::Error::other("no value")));
        assert_eq!(e.err().unwrap().to_string(), "no value");
        assert_eq!(
            DROPS.load(Ordering::SeqCst),
            1,
            "nothing built, nothing dropped"
        );
        // A value larger than a page, aligned more than its seed.
        let big = Secret::<[u64; 1000], 3>::new(|_| Ok(()), |_| Ok([9u64; 1000])).unwrap();
        assert!(big.get().iter().all(|&w| w == 9));
    }

    /// Only a FORK message hands out a descriptor (FORKs themselves: tests/daemon.rs, the
    /// checker's fork step).
    #[test]
    fn only_a_fork_message_gives_a_uffd() {
        let mut empty = RawUffdMsg::default();
        assert!(empty.take_fork_uffd().is_none());
    }

    /// Whether the calling thread runs `SCHED_FIFO`.
    fn is_sched_fifo() -> bool {
        // SAFETY: sched_getscheduler on the calling thread.
        let p = unsafe { libc::sched_getscheduler(0) };
        p & !libc::SCHED_RESET_ON_FORK == libc::SCHED_FIFO
    }

    /// A thread moved off its CPU runs elsewhere, and keeps its whole affinity.
    #[test]
    fn move_off_cpu_moves_and_keeps_the_affinity() {
        std::thread::spawn(|| {
            let size = std::mem::size_of::<libc::cpu_set_t>();
            // SAFETY: cpu_set_t is plain data; a valid set for the calling thread.
            let mut before: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut before) }, 0);
            // SAFETY: CPU_COUNT on a valid set.
            if unsafe { libc::CPU_COUNT(&before) } < 2 {
                return; // one CPU: nowhere to go (the call must say so)
            }
            for _ in 0..20 {
                let here = current_cpu();
                assert!(move_off_cpu(here), "could not move off CPU {here}");
                assert_ne!(current_cpu(), here, "still on CPU {here}");
            }
            // SAFETY: as above.
            let mut after: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut after) }, 0);
            // SAFETY: CPU_EQUAL on valid sets.
            let same = unsafe { libc::CPU_EQUAL(&before, &after) };
            assert!(same, "affinity changed");
        })
        .join()
        .unwrap();
    }

    /// As root: a thread made `SCHED_FIFO` is, and a thread it starts is not (reset on fork).
    #[test]
    fn sched_fifo_is_set_and_not_inherited() {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        std::thread::spawn(move || {
            assert!(!is_sched_fifo());
            match set_sched_fifo(1) {
                Ok(()) => assert!(is_sched_fifo()),
                Err(e) => {
                    assert!(!root, "root cannot set SCHED_FIFO: {e}");
                    return;
                }
            }
            let child = std::thread::spawn(is_sched_fifo).join().unwrap();
            assert!(
                !child,
                "a thread started by a SCHED_FIFO handler inherited it"
            );
        })
        .join()
        .unwrap();
    }
}
