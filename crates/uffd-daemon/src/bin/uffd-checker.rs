//! `uffd-checker`: a client that makes the daemon's hard cases happen and checks every byte.
//!
//! Run under the daemon with a limit well below its footprint so that pages are evicted
//! between steps: `uffd-daemon run --limit 8M -- uffd-checker all`. Steps: kernel-mode faults
//! (read(2)/write(2) on evicted pages), fork (the child sees its copy-on-write snapshot while
//! the parent writes), mremap (move and grow), munmap + a new mapping at the same address,
//! MADV_DONTNEED, and a thread that writes and drops pages of readahead runs.
//! Every page is compared against a model after every step; the exit status is
//! 0 only when all of them match. `uffd-checker hold` fills memory, prints `READY <pid>` and
//! verifies it in a loop forever (for the daemon-killed test).

use std::io::Write;

use uffd_daemon::demo::{check_page, fill_page};

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;

/// What a page should hold: the pattern of (index, generation), or zeros.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Want {
    Pattern(u64, u64),
    Zero,
}

struct Region {
    base: *mut u8,
    pages: usize,
    want: Vec<Want>,
    name: &'static str,
}

fn map(bytes: usize) -> *mut u8 {
    uffd_daemon::sys::map_anonymous(bytes).expect("mmap failed")
}

impl Region {
    fn new(name: &'static str, bytes: usize) -> Self {
        Region {
            base: map(bytes),
            pages: bytes / PAGE,
            want: vec![Want::Zero; bytes / PAGE],
            name,
        }
    }
    fn page(&self, i: usize) -> &[u8] {
        assert!(i < self.pages);
        // SAFETY: `i` is within the mapping, which lives as long as the Region.
        unsafe { std::slice::from_raw_parts(self.base.add(i * PAGE), PAGE) }
    }
    fn page_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.pages);
        // SAFETY: as in `page`, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(i * PAGE), PAGE) }
    }
    fn write(&mut self, i: usize, tag: u64, generation: u64) {
        fill_page(self.page_mut(i), tag, generation);
        self.want[i] = Want::Pattern(tag, generation);
    }
}

fn rss_anon_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Writes a scratch region so that the daemon has to evict older pages.
fn pressure(scratch: &mut Region, round: u64) {
    for i in 0..scratch.pages {
        scratch.write(i, 1_000_000 + i as u64, round);
    }
}

fn report(step: &str, bad: usize, failures: &mut usize) {
    if bad == 0 {
        println!("checker: OK {step} (RssAnon {} KiB)", rss_anon_kib());
    } else {
        println!("checker: FAIL {step}: {bad} bad pages");
        *failures += bad;
    }
    let _ = std::io::stdout().flush();
}

/// The regions the steps work on, and the failures so far.
struct Checker {
    a: Region,
    scratch: Region,
    failures: usize,
}

/// Every step in order; 0 when every page of every step matched.
fn all() -> i32 {
    let mut c = Checker::fill();
    c.kernel_mode_faults();
    c.fork();
    let (mut moved, mut grown) = c.mremap();
    c.munmap();
    c.dontneed();
    c.readahead();
    c.finally(&mut moved, &mut grown)
}

impl Checker {
    /// A (32 MiB) filled, then pushed out by the scratch region.
    fn fill() -> Self {
        let mut c = Checker {
            a: Region::new("A", 32 * MIB),
            scratch: Region::new("scratch", 16 * MIB),
            failures: 0,
        };
        for i in 0..c.a.pages {
            c.a.write(i, i as u64, 0);
        }
        c.pressure(0);
        c.report("fill", c.a.verify("fill"));
        c
    }

    fn pressure(&mut self, round: u64) {
        pressure(&mut self.scratch, round);
    }

    fn report(&mut self, step: &str, bad: usize) {
        report(step, bad, &mut self.failures);
    }

    /// Step 1: Kernel-mode faults: write(2) reads an evicted page, read(2) writes into one.
    fn kernel_mode_faults(&mut self) {
        let a = &mut self.a;
        pressure(&mut self.scratch, 1);
        let mut fds = [0; 2];
        // SAFETY: pipe with a valid array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: page 3 and page 5 of A are valid for PAGE bytes; the pipe holds one page.
        unsafe {
            assert_eq!(
                libc::write(fds[1], a.page(3).as_ptr().cast(), PAGE),
                PAGE as isize
            );
            assert_eq!(
                libc::read(fds[0], a.page_mut(5).as_mut_ptr().cast(), PAGE),
                PAGE as isize
            );
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        a.want[5] = a.want[3];
        let bad = a.verify("kernel-mode faults");
        self.report("kernel-mode faults", bad);
    }

    /// Step 2: Fork: the child must see the snapshot taken at fork, whatever the parent does next.
    fn fork(&mut self) {
        self.pressure(2);
        let a = &mut self.a;
        let snapshot = a.want.clone();
        let mut go = [0; 2];
        // SAFETY: pipe with a valid array.
        assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
        // SAFETY: fork; the child only touches its own copy of memory and exits with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut b = [0u8; 1];
            // SAFETY: read one byte into a live buffer: wait for the parent to finish writing.
            unsafe { libc::read(go[0], b.as_mut_ptr().cast(), 1) };
            a.want = snapshot;
            let mut bad = a.verify("fork child (snapshot)");
            for i in (0..a.pages).step_by(2) {
                a.write(i, i as u64, 7);
            }
            pressure(&mut self.scratch, 9);
            bad += a.verify("fork child (own writes)");
            // SAFETY: _exit in the child.
            unsafe { libc::_exit(if bad == 0 { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork failed");
        for i in 0..a.pages / 2 {
            a.write(i, i as u64, 3); // parent writes after the fork, before the child reads
        }
        // SAFETY: write one byte from a live buffer.
        unsafe { libc::write(go[1], b"g".as_ptr().cast(), 1) };
        let mut status = 0;
        // SAFETY: waitpid for our child with a valid status pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let child_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        self.report(
            "fork (child saw its snapshot and its own writes)",
            usize::from(!child_ok),
        );
        self.pressure(3);
        let bad = self.a.verify("fork parent");
        self.report("fork (parent kept its own writes)", bad);
    }

    /// Step 3: mremap: move 8 MiB of A elsewhere, then grow a region; the moved part and the
    /// grown region, to be checked at the end.
    fn mremap(&mut self) -> (Region, Region) {
        self.pressure(4);
        let a = &mut self.a;
        let moved_pages = 8 * MIB / PAGE;
        let first = 8 * MIB / PAGE;
        let target = map(8 * MIB);
        // SAFETY: moving part of A onto `target` (MREMAP_FIXED replaces that reservation).
        let newp = unsafe {
            libc::mremap(
                a.base.add(first * PAGE).cast(),
                8 * MIB,
                8 * MIB,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                target.cast::<libc::c_void>(),
            )
        };
        assert_eq!(
            newp.cast::<u8>(),
            target,
            "mremap failed: {}",
            std::io::Error::last_os_error()
        );
        let mut moved = Region {
            base: target,
            pages: moved_pages,
            want: a.want[first..first + moved_pages].to_vec(),
            name: "A-moved",
        };
        // The old range is unmapped now: stop tracking it in A.
        for w in &mut a.want[first..first + moved_pages] {
            *w = Window::Unmapped.into();
        }
        self.pressure(5);
        let bad = moved.verify("mremap move");
        self.report("mremap move", bad);
        let mut c = Region::new("C", 4 * MIB);
        for i in 0..c.pages {
            c.write(i, 500_000 + i as u64, 0);
        }
        self.pressure(6);
        // SAFETY: growing C; MAYMOVE lets the kernel move it.
        let grown = unsafe { libc::mremap(c.base.cast(), 4 * MIB, 8 * MIB, libc::MREMAP_MAYMOVE) };
        assert_ne!(grown, libc::MAP_FAILED, "mremap grow failed");
        c.base = grown.cast();
        c.pages = 8 * MIB / PAGE;
        c.want.resize(c.pages, Want::Zero);
        self.pressure(7);
        let bad = c.verify("mremap grow");
        self.report("mremap grow", bad);
        for i in 0..moved.pages {
            moved.write(i, 800_000 + i as u64, 1);
        }
        (moved, c)
    }

    /// Step 4: munmap part of A with evicted pages, map fresh memory there: it must read zeros.
    fn munmap(&mut self) {
        self.pressure(8);
        let a = &mut self.a;
        let un = 16 * MIB / PAGE;
        let un_pages = 4 * MIB / PAGE;
        // SAFETY: unmapping and remapping a part of A that we own; nothing references it.
        unsafe {
            assert_eq!(libc::munmap(a.base.add(un * PAGE).cast(), 4 * MIB), 0);
            let p = libc::mmap(
                a.base.add(un * PAGE).cast(),
                4 * MIB,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            assert_eq!(p.cast::<u8>(), a.base.add(un * PAGE));
        }
        for w in &mut a.want[un..un + un_pages] {
            *w = Want::Zero;
        }
        let bad = a.verify("munmap");
        self.report("munmap + new mapping reads zeros", bad);
    }

    /// Step 5: MADV_DONTNEED over evicted and resident pages: zeros there, the rest intact.
    fn dontneed(&mut self) {
        self.pressure(9);
        let a = &mut self.a;
        let dn = 20 * MIB / PAGE;
        for i in dn..dn + 64 {
            a.write(i, i as u64, 11); // some of the range resident, the rest evicted
        }
        // SAFETY: madvise on a part of A that we own.
        let rc =
            unsafe { libc::madvise(a.base.add(dn * PAGE).cast(), 4 * MIB, libc::MADV_DONTNEED) };
        assert_eq!(rc, 0);
        for w in &mut a.want[dn..dn + 4 * MIB / PAGE] {
            *w = Want::Zero;
        }
        self.pressure(10);
        let bad = self.a.verify("dontneed");
        self.report("MADV_DONTNEED reads zeros", bad);
    }

    /// Step 6: Readahead. On a sequential run of faults the daemon restores the evicted pages after
    /// the faulting one with it (a window growing to 16 pages). Here the woken thread at once
    /// writes the next page and drops the one after it (MADV_DONTNEED): pages that readahead
    /// restored, or that a daemon copying a run in two steps would still be copying. The
    /// writes must stay, the dropped pages read zeros, the others keep their contents. A's
    /// last quarter still holds its first fill.
    fn readahead(&mut self) {
        let ra = 24 * MIB / PAGE;
        for round in 0..3u64 {
            self.pressure(20 + round);
            let a = &mut self.a;
            let mut i = ra;
            while i + 4 <= a.pages {
                // SAFETY: page `i` of A is mapped; a volatile read so that it really faults.
                unsafe { std::ptr::read_volatile(a.page(i).as_ptr()) };
                a.write(i + 1, i as u64 + 1, 30 + round);
                // SAFETY: madvise on a page of A that we own.
                let rc = unsafe {
                    libc::madvise(a.base.add((i + 2) * PAGE).cast(), PAGE, libc::MADV_DONTNEED)
                };
                assert_eq!(rc, 0);
                a.want[i + 2] = Want::Zero;
                i += 4;
            }
            let bad = self.a.verify("readahead");
            self.report("readahead: writes and drops next to restored runs", bad);
        }
    }

    /// Step 7: Everything, once more, after more pressure; the exit status.
    fn finally(&mut self, moved: &mut Region, grown: &mut Region) -> i32 {
        self.pressure(11);
        let bad = self.a.verify("final A")
            + moved.verify("final moved")
            + grown.verify("final C")
            + self.scratch.verify("final scratch");
        self.report("final", bad);
        if self.failures == 0 {
            println!("checker: ALL OK");
            0
        } else {
            println!("checker: {} failures", self.failures);
            1
        }
    }
}

/// Pages of A that were moved away are no longer mapped.
enum Window {
    Unmapped,
}
impl From<Window> for Want {
    fn from(_: Window) -> Want {
        // Encoded as a pattern no page ever holds; verify_mapped skips it.
        Want::Pattern(u64::MAX, u64::MAX)
    }
}

impl Region {
    /// Compares every page with the model; pages moved away (unmapped) are skipped.
    fn verify(&self, step: &str) -> usize {
        let mut bad = 0;
        for i in 0..self.pages {
            let ok = match self.want[i] {
                Want::Pattern(u64::MAX, u64::MAX) => true,
                Want::Pattern(t, g) => check_page(self.page(i), t, g),
                Want::Zero => self.page(i).iter().all(|&b| b == 0),
            };
            if !ok {
                bad += 1;
                if bad <= 3 {
                    println!(
                        "MISMATCH {step}: region {} page {i}: want {:?}",
                        self.name, self.want[i]
                    );
                }
            }
        }
        bad
    }
}

fn hold() -> i32 {
    let mut a = Region::new("A", 32 * MIB);
    for i in 0..a.pages {
        a.write(i, i as u64, 0);
    }
    println!("READY {}", std::process::id());
    let _ = std::io::stdout().flush();
    for round in 0.. {
        let bad = a.verify("hold");
        println!("round {round}: {bad} bad pages");
        let _ = std::io::stdout().flush();
        if bad != 0 {
            return 1;
        }
    }
    0
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let code = match mode.as_str() {
        "all" => all(),
        "hold" => hold(),
        other => {
            eprintln!("uffd-checker: unknown mode {other:?} (all, hold)");
            2
        }
    };
    std::process::exit(code);
}
