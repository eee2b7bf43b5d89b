//! What the daemon knows of one client address space: the state of every managed page.
//!
//! ```text
//!            fault (zero fill)             reclaim picks it           contents stored
//!   (none) ──────────────────▶ Resident ─────────────────▶ Evicting ─────────────────▶ Dropping
//!     ▲                          ▲  ▲       (write-protected)   │                          │
//!     │ REMOVE/UNMAP             │  └──── write raced, page ────┘          agent moved it   │
//!     │ (any state)              │        removed, I/O error                     out        ▼
//!     └──────────────────────────┴───────────── fault (restore from slot) ◀──────── Evicted
//! ```
//!
//! A `Dropping` page the agent could not move (shared after a fork, pinned for I/O) goes back
//! to `Resident`; one it moved holding other bytes than reclaim stored (written through a pin
//! in between) becomes `Evicted` with a copy of those bytes (`reclaim/`).
//!
//! Every transition happens under the [`Mm`]'s state lock, so the fault handler (the only
//! reader of the uffd, which sees faults and events in the kernel's order) and the reclaim
//! thread never disagree. A page is counted resident in every state but `Evicted`.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

use mglru::{AccessSource, Arrival, Hint, PageId, PageType, Policy};
use parking_lot::Mutex;

use crate::agent_conn::AgentConn;
use crate::config::{PolicyConfig, PolicyKind};
use crate::stats::Stats;
use crate::sys::{EventFd, PidFd, Uffd, PAGE_SIZE_U64};

pub(crate) use crate::pagetable::{Page, PageTable, ZERO_SLOT};

/// The policy's id of the page at `addr`.
pub(crate) fn page_id(addr: u64) -> PageId {
    addr >> 12
}

/// A replacement policy for one address space.
pub(crate) type BoxedPolicy = Box<dyn Policy + Send>;

/// A new policy as configured.
pub(crate) fn new_policy(cfg: &PolicyConfig) -> BoxedPolicy {
    match cfg.kind {
        PolicyKind::Mglru => Box::new(
            mglru::Mglru::new(mglru::Config {
                // Shadow entries leave the policy with their victims (`take_shadow`, kept in
                // the page table's word); the bound only matters for a shadow that stays
                // behind (a victim whose word is gone before the policy is asked for it).
                max_shadows: cfg.max_shadows,
                ..mglru::Config::default()
            })
            .expect("the default mglru configuration is valid"),
        ),
        PolicyKind::Clock => Box::new(mglru::Clock::new()),
    }
}

/// The page table and ranges of one address space.
pub(crate) struct MmState {
    /// Managed pages by address.
    pub pages: PageTable,
    /// The replacement policy: holds exactly the pages in state `Resident`.
    pub policy: BoxedPolicy,
    /// Pages counted resident.
    pub resident: usize,
    /// Registered ranges `[start, end)`, sorted and disjoint.
    pub ranges: Vec<(u64, u64)>,
    /// Ranges whose registration failed (not retried), or that the daemon leaves alone.
    pub refused: Vec<(u64, u64)>,
    /// Locked (mlock) ranges still registered: never chosen as victims; unregistered once
    /// every page in them is resident.
    pub locked: Vec<(u64, u64)>,
    /// Ranges a program thread said it is about to lock (`LOCK`), with when it said so: never
    /// victims until the census has seen the lock (then `locked`, and left alone).
    pub lock_requests: Vec<(u64, u64, std::time::Instant)>,
    /// Resident pages a DROP could not move because they are shared: with a forked child, or
    /// left shared after it exited (`UFFDIO_MOVE` takes only pages the process owns alone,
    /// and the kernel marks a page so again only at a write). The next DROP asks the agent to
    /// unshare them (`DROP_RUN_UNSHARE`); until then they are not victims.
    pub unshare: std::collections::BTreeSet<u64>,
    /// Pages unshared since the last fork: one refused again is pinned (for I/O), not shared,
    /// and is not unshared again (a DROP of pages that never move would keep reclaim from
    /// seeing that it cannot make progress).
    pub unshared: std::collections::BTreeSet<u64>,
    /// Pages refused again after being unshared: pinned for I/O (io_uring fixed buffers, RDMA,
    /// vfio, an O_DIRECT read in flight), which `UFFDIO_MOVE` refuses. Not victims until their
    /// wait is over; each refusal doubles the wait ([`PINNED_WAIT_MIN`] to
    /// [`PINNED_WAIT_MAX`]), as the kernel's reclaim puts a page it cannot unmap back on the
    /// active list and comes to it again only after aging. Without this, reclaim chose the
    /// pages of a pinned buffer again and again, storing each and having it refused.
    pub pinned: std::collections::BTreeMap<u64, PinnedPage>,
    /// Ranges a hold let go (`supervisor/hold.rs`): refused while the process is held, registered again
    /// when a trace hold ends; a fork child's own to register.
    pub hold_let_go: Vec<(u64, u64)>,
}

/// How long a page refused as pinned is left out of the victims first.
pub(crate) const PINNED_WAIT_MIN: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest it is left out (a long-term pin: a registered buffer).
pub(crate) const PINNED_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(64);

/// A page refused as pinned: left out of the victims until `until`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PinnedPage {
    /// When it may be chosen again.
    pub until: std::time::Instant,
    /// How long it was left out this time.
    pub wait: std::time::Duration,
}

impl std::fmt::Debug for MmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmState")
            .field("pages", &self.pages.len())
            .field("policy", &self.policy.name())
            .field("resident", &self.resident)
            .field("ranges", &self.ranges)
            .finish()
    }
}

/// One client address space (a process, until it execs or exits).
#[derive(Debug)]
pub(crate) struct Mm {
    /// Daemon-wide id.
    pub id: u64,
    /// Its userfaultfd.
    pub uffd: Uffd,
    /// The process id, in the daemon's pid namespace; 0 until a forked child is bound to its
    /// process (`bind.rs`).
    pub pid: AtomicI32,
    /// The process is in a pid namespace below the daemon's: the thread ids of its
    /// userfaultfd messages are that namespace's numbers, not the daemon's (`bind.rs`,
    /// [`crate::bind::thread_of_fault`]).
    pub foreign_pidns: AtomicBool,
    /// A forked child: its parent's pid when the fork was seen (0 if unknown), where the
    /// child is looked for first.
    pub forked_from: AtomicI32,
    /// Thread ids of its own namespace and the daemon's numbers of those threads, for a
    /// process in a pid namespace below the daemon's (looked up once per thread).
    pub ns_tids: Mutex<Vec<(u32, i32)>>,
    /// Page states.
    pub state: Mutex<MmState>,
    /// The agent's connection, once greeted.
    pub agent: Mutex<Option<AgentConn>>,
    /// The agent region `[start, end)`: never managed; its REMOVE events are the agent's.
    pub region: (u64, u64),
    /// The probe page.
    pub probe: u64,
    /// The scratch area (in the region) that DROPs move victims into: page `i` of a DROP goes
    /// to `scratch + i * 4096`, where the daemon reads it back before it is freed.
    pub scratch: u64,
    /// The thread id of the agent's thread, once it named itself (0 before): its faults are
    /// never throttled, since reclaim may be waiting for its answer. A userfaultfd message's
    /// number, like the thread ids it is compared with (the process's own pid namespace's).
    pub agent_tid: AtomicU32,
    /// Wakes the handler thread to stop.
    pub stop: EventFd,
    /// Wakes the handler thread to retry faults that waited for reclaim.
    pub retry: EventFd,
    /// Whether the handler holds faults that wait for reclaim.
    pub throttled: AtomicBool,
    /// Set once the address space is gone (exit, exec) and its pages released.
    pub retired: AtomicBool,
    /// Exit notification, once the pid is known.
    pub pidfd: Mutex<Option<PidFd>>,
    /// The handler thread.
    pub handler: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Next reclaim batch id.
    pub next_batch: AtomicU32,
    /// When the maps were last scanned (monitor ticks).
    pub last_scan_tick: AtomicU64,
    /// Anonymous RSS the last scan left unexplained by the pages the daemon tracks: memory it
    /// does not manage (the stack, copy-on-write pages of libraries' data), so that only
    /// growth beyond it triggers the next scan.
    pub untracked_rss: AtomicU64,
    /// Writers wait in write-protect faults on pages moved while `Dropping` (see the fault
    /// path): the monitor wakes them once no DROP is in flight.
    pub wp_waiters: AtomicBool,
    /// Managed without an agent (`supervisor/agentless.rs`, `reclaim/injected.rs`): DROPs are `UFFDIO_MOVE`s injected with
    /// ptrace, the region (probe page, argument pages, scratch) is one the daemon mapped.
    pub agentless: AtomicBool,
    /// The agent's threads stepped out (`STEP_OUT`: the program makes a call that needs the
    /// process alone) and have not greeted again yet.
    pub stepped_out: AtomicBool,
    /// A forked child not bound to its pid yet: the token the daemon writes into its probe
    /// page (through its uffd) and looks for in candidate processes (`bind.rs`).
    pub bind_token: Mutex<Option<BindToken>>,
    /// Odd while the handler reads and applies a batch of messages, even otherwise: an
    /// injected DROP waits for the batch that held its `REMOVE` to be applied.
    pub handling: AtomicU64,
    /// Held for writing by the handler from its read of a batch holding an event until the
    /// batch's events are applied; for reading by any other thread around a fill of this
    /// address space (`UFFDIO_COPY`) and the state change that records it, taken before the
    /// state lock. The kernel holds fills back during a fork only until its FORK event is
    /// read: a fill from another thread between that read and the adoption of the child would
    /// make the child inherit as resident a page its page table never got.
    pub event_gate: parking_lot::RwLock<()>,
    /// Threads waiting to take [`Mm::event_gate`] for reading ([`Mm::gate_read`]): a handler
    /// polling its uffd with the gate held stops polling for them, and hands the gate over
    /// fairly, rather than take it back before a woken reader can run.
    pub gate_wanted: AtomicU32,
    /// Agentless: the threads stopped so far and their rseq pages (`u64::MAX`: none), which
    /// batches leave out (`reclaim/`).
    pub rseq_pages: Mutex<Vec<(i32, u64)>>,
    /// `/proc/PID/mem` of the process, opened at its first eviction (for `pid`): reclaim reads
    /// its victims through it (`sys::read_mem`).
    pub mem: Mutex<Option<(i32, std::fs::File)>>,
    /// `/proc/PID/pagemap` of the process (for `pid`), opened at its first eviction: the
    /// frames of a batch's victims, and of what its DROP moved (`reclaim::frames_of`).
    pub pagemap: Mutex<Option<(i32, std::fs::File)>>,
    /// REMOVE, UNMAP, REMAP and FORK events applied so far (but the scratch's own REMOVEs),
    /// counted by the handler under `event_gate`: reclaim checks that none came between the
    /// protection of a batch and the record of its victims' frames, nor before its DROP.
    pub events_applied: AtomicU64,
    /// The runs of the agent's DROP in flight (empty: none). A fault there on a page no
    /// longer `Dropping` (an event changed it since) waits for the DROP's settlement, which may
    /// have to put back a page the agent moved from under the event (`reclaim::settle_drop`).
    pub drop_runs: Mutex<Vec<(u64, u32)>>,
    /// When the last DROP left its moved pages in the scratch (`None`: nothing there). The
    /// next DROP frees it first (a move into a page still there fails), and so does the
    /// monitor once reclaim has been idle for a while (`reclaim::free_idle_scratch`).
    pub scratch_filled: Mutex<Option<std::time::Instant>>,
    /// `/proc/PID/maps` of the process (for `pid`), for `PROCMAP_QUERY` (`fault/serve.rs`,
    /// learning a range the agent registered before the scan saw it).
    pub maps: Mutex<Option<(i32, std::fs::File)>>,
    /// Why the process is held (`supervisor/hold.rs`: `HOLD_DUMP`, `HOLD_TRACE` bits; 0: it is not):
    /// its evicted pages are brought back, its memory is the kernel's, nothing is evicted.
    pub held: AtomicU32,
    /// What a hold has done, under its own lock (holds and releases take it in turn).
    pub hold: Mutex<HoldState>,
    /// A thread of the scanner's is bringing the pages of a traced process back.
    pub holding: AtomicBool,
    /// It maps shared anonymous memory the daemon manages (`shmem.rs`): its faults are looked
    /// up there first.
    pub has_shmem: AtomicBool,
    /// Ranges a program thread is removing with `madvise(MADV_REMOVE)` (announced by the
    /// agent): a REMOVE event of shared memory there drops the stored copies.
    pub shmem_removes: Mutex<Vec<(u64, u64)>>,
}

/// What binds a forked child to its pid: 16 random bytes the daemon puts into the child's
/// probe page with `UFFDIO_COPY` through the child's uffd (only that address space can hold
/// them), then reads back from candidate processes (`bind.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BindToken {
    /// The bytes.
    pub bytes: [u8; 16],
    /// Whether they are in the child's probe page yet.
    pub written: bool,
    /// When the child was forked, or (a child with an agent) first faulted on its probe
    /// page: binding is given up after a while.
    pub since: std::time::Instant,
    /// When the tree was last searched for the child.
    pub searched: Option<std::time::Instant>,
    /// A child with an agent whose probe fault was let go unbound (its process not found in
    /// time): bound at its agent's greeting, if it comes.
    pub released: bool,
}

impl BindToken {
    /// A fresh token (`getrandom`), not written yet.
    pub(crate) fn new() -> std::io::Result<Self> {
        let mut bytes = [0u8; 16];
        crate::sys::random_bytes(&mut bytes)?;
        Ok(BindToken {
            bytes,
            written: false,
            since: std::time::Instant::now(),
            searched: None,
            released: false,
        })
    }
}

/// What a page table needs of the rest of the daemon: the resident count of the whole tree and
/// the references of the store's slots. The daemon's `Shared` is the implementation.
pub(crate) trait Ledger {
    /// Adds `n` resident pages.
    fn resident_add(&self, n: usize);
    /// Removes `n` resident pages.
    fn resident_sub(&self, n: usize);
    /// Drops a reference to a stored page's slot.
    fn put_slot(&self, slot: u32);
    /// Adds a reference to a stored page's slot (a fork shares it).
    fn dup_slot(&self, slot: u32);
    /// Counts a page brought by readahead that left before anything touched it.
    fn readahead_unused(&self);
}

impl<L: Ledger + ?Sized> Ledger for std::sync::Arc<L> {
    fn resident_add(&self, n: usize) {
        (**self).resident_add(n);
    }
    fn resident_sub(&self, n: usize) {
        (**self).resident_sub(n);
    }
    fn put_slot(&self, slot: u32) {
        (**self).put_slot(slot);
    }
    fn dup_slot(&self, slot: u32) {
        (**self).dup_slot(slot);
    }
    fn readahead_unused(&self) {
        (**self).readahead_unused();
    }
}

impl Mm {
    /// A new address space.
    pub(crate) fn new(
        id: u64,
        uffd: Uffd,
        pid: i32,
        region: (u64, u64),
        probe: u64,
        scratch: u64,
        policy: &PolicyConfig,
    ) -> std::io::Result<Self> {
        Ok(Mm {
            id,
            uffd,
            pid: AtomicI32::new(pid),
            foreign_pidns: AtomicBool::new(false),
            forked_from: AtomicI32::new(0),
            ns_tids: Mutex::new(Vec::new()),
            state: Mutex::new(MmState::new(policy)),
            agent: Mutex::new(None),
            region,
            probe,
            scratch,
            agent_tid: AtomicU32::new(0),
            stop: EventFd::new()?,
            retry: EventFd::new()?,
            throttled: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            pidfd: Mutex::new(None),
            handler: Mutex::new(None),
            next_batch: AtomicU32::new(1),
            last_scan_tick: AtomicU64::new(0),
            untracked_rss: AtomicU64::new(0),
            wp_waiters: AtomicBool::new(false),
            agentless: AtomicBool::new(false),
            stepped_out: AtomicBool::new(false),
            bind_token: Mutex::new(None),
            handling: AtomicU64::new(0),
            event_gate: parking_lot::RwLock::new(()),
            gate_wanted: AtomicU32::new(0),
            rseq_pages: Mutex::new(Vec::new()),
            mem: Mutex::new(None),
            pagemap: Mutex::new(None),
            events_applied: AtomicU64::new(0),
            drop_runs: Mutex::new(Vec::new()),
            scratch_filled: Mutex::new(None),
            maps: Mutex::new(None),
            held: AtomicU32::new(0),
            hold: Mutex::new(HoldState::default()),
            holding: AtomicBool::new(false),
            has_shmem: AtomicBool::new(false),
            shmem_removes: Mutex::new(Vec::new()),
        })
    }

    /// Takes [`Mm::event_gate`] for reading, first telling a handler that polls with it held
    /// to let it go ([`Mm::gate_wanted`]).
    pub(crate) fn gate_read(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.gate_wanted.fetch_add(1, Ordering::AcqRel);
        let g = self.event_gate.read();
        self.gate_wanted.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// The pid, if known.
    pub(crate) fn pid(&self) -> Option<i32> {
        match self.pid.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }

    /// Sends SIGKILL to the process (through its pidfd: never to a process that got its
    /// number after it exited; without one, only to a process of the daemon's tree).
    pub(crate) fn kill(&self) {
        if let Some(p) = self.pidfd.lock().as_ref() {
            let _ = p.send_signal(libc::SIGKILL);
            return;
        }
        if let Some(pid) = self.pid() {
            crate::maps::kill_in_tree(pid);
        }
    }

    /// The page the agent thread reads once when it starts, to name itself (the first page
    /// of its scratch area, right after the probe page; the greeting checks the layout).
    pub(crate) fn agent_name_page(&self) -> u64 {
        self.probe + PAGE_SIZE_U64
    }

    /// Whether `addr` lies in the agent's region.
    pub(crate) fn in_agent_region(&self, addr: u64) -> bool {
        addr >= self.region.0 && addr < self.region.1
    }
}

impl MmState {
    /// An empty address space.
    pub(crate) fn new(policy: &PolicyConfig) -> Self {
        MmState {
            pages: PageTable::new(),
            policy: new_policy(policy),
            resident: 0,
            ranges: Vec::new(),
            refused: Vec::new(),
            locked: Vec::new(),
            lock_requests: Vec::new(),
            unshare: std::collections::BTreeSet::new(),
            unshared: std::collections::BTreeSet::new(),
            hold_let_go: Vec::new(),
            pinned: std::collections::BTreeMap::new(),
        }
    }

    /// A DROP refused `addr` again after it was unshared: it is pinned. Left out of the
    /// victims for twice as long as last time (at least [`PINNED_WAIT_MIN`]).
    pub(crate) fn note_pinned(&mut self, addr: u64) {
        let now = std::time::Instant::now();
        let wait = match self.pinned.get(&addr) {
            Some(p) => (p.wait * 2).min(PINNED_WAIT_MAX),
            None => PINNED_WAIT_MIN,
        };
        self.pinned.insert(
            addr,
            PinnedPage {
                until: now + wait,
                wait,
            },
        );
    }

    /// Forgets what is known of the pages of `[start, end)` as shared or pinned (they were
    /// removed, unmapped or moved).
    fn forget_refusals(&mut self, start: u64, end: u64) {
        for set in [&mut self.unshare, &mut self.unshared] {
            let stale: Vec<u64> = set.range(start..end).copied().collect();
            for a in stale {
                set.remove(&a);
            }
        }
        let stale: Vec<u64> = self.pinned.range(start..end).map(|(&a, _)| a).collect();
        for a in stale {
            self.pinned.remove(&a);
        }
    }

    /// Inserts a page as resident (fault fill, fault-around, a page discovered present, an
    /// eviction given up) and hands it to the policy. `referenced`: its accessed bit.
    pub(crate) fn make_resident(
        &mut self,
        shared: &impl Ledger,
        addr: u64,
        arrival: Arrival,
        referenced: bool,
    ) {
        let page = Page::Resident {
            referenced,
            readahead: false,
        };
        self.insert_resident(shared, addr, arrival, page);
    }

    /// Inserts a page restored by readahead (not asked for by the fault): resident, cold, not
    /// referenced, and marked until a use of it is seen ([`MmState::readahead_used`]) or it
    /// leaves ([`MmState::release`], [`MmState::pick_victims`]).
    pub(crate) fn add_readahead(&mut self, shared: &impl Ledger, addr: u64) {
        let page = Page::Resident {
            referenced: false,
            readahead: true,
        };
        self.insert_resident(shared, addr, Arrival::Cold, page);
    }

    fn insert_resident(&mut self, shared: &impl Ledger, addr: u64, arrival: Arrival, page: Page) {
        let shadow = self.pages.shadow(addr);
        match self.pages.insert(addr, page) {
            Some(old) if old.is_resident() => {}
            _ => {
                self.resident += 1;
                shared.resident_add(1);
            }
        }
        // (A page already in the policy is refused with `AlreadyResident`, which is fine: one
        // lookup instead of a `contains` first.)
        let id = page_id(addr);
        let hint = Hint::new(PageType::Anon, arrival);
        let _ = match shadow {
            Some(token) => self.policy.add_refault(id, hint, token),
            None => self.policy.add(id, hint),
        };
    }

    /// A page that was `Resident` (and so in the policy) goes back to being resident after
    /// a state that took it out of the policy (`Evicting`, `Dropping`).
    pub(crate) fn back_to_resident(&mut self, addr: u64) {
        self.pages.insert(
            addr,
            Page::Resident {
                referenced: true,
                readahead: false,
            },
        );
        let id = page_id(addr);
        if !self.policy.contains(id) {
            let _ = self
                .policy
                .add(id, Hint::new(PageType::Anon, Arrival::Fault));
        }
    }

    /// Forgets pages in `[start, end)` (REMOVE, UNMAP): their memory is gone or zero now.
    pub(crate) fn forget_range(&mut self, shared: &impl Ledger, start: u64, end: u64) -> usize {
        self.forget_refusals(start, end);
        let keys: Vec<u64> = self.pages.range(start..end).map(|(k, _)| k).collect();
        for &k in &keys {
            if let Some(p) = self.pages.remove(k) {
                self.release(shared, k, p);
            }
        }
        keys.len()
    }

    /// Accounting for a page state that is being dropped from the table (the caller removed
    /// it from `pages`; `addr` is where it was). A page read ahead and never seen used leaves
    /// unused (removed, unmapped, its process gone).
    pub(crate) fn release(&mut self, shared: &impl Ledger, addr: u64, p: Page) {
        if let Page::Resident { readahead, .. } = p {
            self.policy.remove(page_id(addr));
            if readahead {
                shared.readahead_unused();
            }
        }
        if p.is_resident() {
            self.resident -= 1;
            shared.resident_sub(1);
        }
        if let Some(slot) = p.slot() {
            shared.put_slot(slot);
        }
    }

    /// Adds `[start, end)` to the registered ranges.
    pub(crate) fn add_range(&mut self, start: u64, end: u64) {
        self.ranges.push((start, end));
        self.ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len());
        for &(s, e) in &self.ranges {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        self.ranges = merged;
    }

    /// Removes `[start, end)` from the registered ranges.
    pub(crate) fn remove_range(&mut self, start: u64, end: u64) {
        subtract(&mut self.ranges, start, end);
    }

    /// A mapping at `[start, end)` is gone (UNMAP): what the daemon refused or left there is
    /// forgotten too, so that a new mapping at those addresses is managed as new memory.
    pub(crate) fn unmapped(&mut self, start: u64, end: u64) {
        subtract(&mut self.refused, start, end);
        subtract(&mut self.locked, start, end);
    }

    /// Adds `[start, end)` to the ranges the daemon leaves alone (once).
    pub(crate) fn refuse(&mut self, start: u64, end: u64) {
        if !self.refused.iter().any(|&(s, e)| s <= start && end <= e) {
            self.refused.push((start, end));
        }
    }

    /// Takes `[start, end)` out of the ranges the daemon leaves alone (a hold that let it go
    /// is over: `supervisor/hold.rs`).
    pub(crate) fn unrefuse(&mut self, start: u64, end: u64) {
        subtract(&mut self.refused, start, end);
    }

    /// Whether `addr` is in a registered range the table knows.
    pub(crate) fn in_ranges(&self, addr: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, e)| e <= addr);
        self.ranges.get(i).is_some_and(|&(s, _)| s <= addr)
    }

    /// Parts of `[start, end)` not covered by `ranges` or `refused`.
    pub(crate) fn uncovered(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = vec![(start, end)];
        for &(s, e) in self.ranges.iter().chain(self.refused.iter()) {
            let mut next = Vec::with_capacity(gaps.len() + 1);
            for (gs, ge) in gaps {
                if e <= gs || s >= ge {
                    next.push((gs, ge));
                    continue;
                }
                if gs < s {
                    next.push((gs, s));
                }
                if ge > e {
                    next.push((e, ge));
                }
            }
            gaps = next;
        }
        gaps
    }

    /// Moves page states from `[from, from+len)` to `to` (mremap). Pages caught mid-eviction
    /// become resident or `Inherited` (the reclaim batch finds them gone and gives up);
    /// returns the new addresses of the pages that were `Evicting`, whose write protection the
    /// caller lifts under the state lock. Pages that were `Dropping` keep theirs: the agent may
    /// still move whatever comes to their old address (see the WP fault path).
    pub(crate) fn remap(&mut self, shared: &impl Ledger, from: u64, to: u64, len: u64) -> Vec<u64> {
        let moved: Vec<(u64, Page)> = self.pages.range(from..from + len).collect();
        // (Pages waiting to be unshared, or known pinned, lose that at their new address: a
        // DROP refuses them once more and they wait again.)
        self.forget_refusals(from, from + len);
        let mut unprotect = Vec::new();
        for (k, p) in &moved {
            self.pages.remove(*k);
            if matches!(p, Page::Resident { .. }) {
                self.policy.remove(page_id(*k));
            }
        }
        // Whatever was at the destination is gone (the kernel unmapped it first).
        self.forget_range(shared, to, to + len);
        for (k, p) in moved {
            let nk = k - from + to;
            let np = match p {
                Page::Evicting { .. } => {
                    unprotect.push(nk);
                    Page::Resident {
                        referenced: true,
                        readahead: false,
                    }
                }
                Page::Dropping { slot } | Page::Inherited { slot } => Page::Inherited { slot },
                other => other,
            };
            self.pages.insert(nk, np);
            if matches!(np, Page::Resident { .. }) {
                let _ = self
                    .policy
                    .add(page_id(nk), Hint::new(PageType::Anon, Arrival::Fault));
            }
        }
        self.remove_range(from, from + len);
        self.add_range(to, to + len);
        unprotect
    }

    /// The state a forked child starts with: one copy of everything, stored pages shared
    /// (their slot counts raised, the kernel's `swap_duplicate`).
    pub(crate) fn fork_copy(&self, shared: &impl Ledger, policy: &PolicyConfig) -> MmState {
        let mut child = MmState::new(policy);
        child.ranges = self.ranges.clone();
        child.refused = self.refused.clone();
        // What a hold of the parent let go is not the child's to leave alone: it registers it.
        for &(s, e) in &self.hold_let_go {
            child.unrefuse(s, e);
        }
        for (addr, p) in self.pages.iter() {
            let cp = match p {
                // Present in the parent at fork: the child has a copy-on-write copy.
                Page::Resident { .. } | Page::Evicting { .. } => Page::Resident {
                    referenced: false,
                    readahead: false,
                },
                // The agent may or may not have moved it before the fork: the child serves a
                // fault from the slot, and keeps it resident otherwise.
                Page::Dropping { slot } | Page::Inherited { slot } => Page::Inherited { slot },
                Page::Evicted { slot } => Page::Evicted { slot },
            };
            if let Some(slot) = cp.slot() {
                shared.dup_slot(slot);
            }
            if cp.is_resident() {
                child.resident += 1;
            }
            if matches!(cp, Page::Resident { .. }) {
                let _ = child
                    .policy
                    .add(page_id(addr), Hint::new(PageType::Anon, Arrival::Cold));
            }
            child.pages.insert(addr, cp);
        }
        shared.resident_add(child.resident);
        child
    }

    /// Full consistency check (tests, debug builds).
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub(crate) fn check_integrity(&self) {
        let resident = self.pages.iter().filter(|(_, p)| p.is_resident()).count();
        assert_eq!(
            resident, self.resident,
            "resident counter disagrees with the page table"
        );
        for w in self.ranges.windows(2) {
            assert!(w[0].1 < w[1].0, "ranges overlap or touch: {:x?}", w);
        }
        let mut in_policy = 0;
        for (k, p) in self.pages.iter() {
            assert_eq!(k % PAGE_SIZE_U64, 0, "page {k:#x} is not aligned");
            let held = self.policy.contains(page_id(k));
            assert_eq!(
                held,
                matches!(p, Page::Resident { .. }),
                "page {k:#x} in state {p:?}: the policy holds exactly the Resident pages"
            );
            in_policy += usize::from(held);
        }
        assert_eq!(
            in_policy,
            self.policy.len(),
            "the policy holds pages the table does not"
        );
    }

    /// Chooses up to `max` victims with the policy and marks them `Evicting { batch }`;
    /// returns them sorted, and the ranges the access source cleared bits in (to re-arm
    /// write protection when the access source uses it). A victim still marked as read ahead
    /// is counted in `stats.readahead_unused_pages`: the policy chose it with no use seen.
    pub(crate) fn pick_victims(
        &mut self,
        batch: u32,
        max: usize,
        stats: &Stats,
    ) -> (Vec<u64>, Vec<(u64, u64)>) {
        let MmState { pages, policy, .. } = self;
        let mut src = PageBits {
            pages,
            cleared: Vec::new(),
        };
        let ids = policy.evict(max, &mut src);
        let cleared = src.cleared;
        let mut victims = Vec::with_capacity(ids.len());
        let now = (!self.pinned.is_empty()).then(std::time::Instant::now);
        for id in ids {
            let addr = id << 12;
            match self.pages.get(addr) {
                Some(Page::Resident { .. })
                    if self.locked.iter().any(|&(s, e)| addr >= s && addr < e)
                        || self
                            .lock_requests
                            .iter()
                            .any(|&(s, e, _)| addr >= s && addr < e)
                        || self.unshare.contains(&addr)
                        || now.is_some_and(|now| {
                            self.pinned.get(&addr).is_some_and(|p| p.until > now)
                        }) =>
                {
                    // Locked, waiting to be unshared, or pinned: back to the policy, young,
                    // until the range is left alone, the page is the process's own again, or
                    // its wait is over.
                    let _ = self
                        .policy
                        .add(id, Hint::new(PageType::Anon, Arrival::Fault));
                }
                Some(Page::Resident { readahead, .. }) => {
                    if readahead {
                        Stats::add(&stats.readahead_unused_pages, 1);
                    }
                    self.pages.insert(addr, Page::Evicting { batch });
                    // The policy's shadow entry lives in the page's word until it returns.
                    if let Some(token) = self.policy.take_shadow(id) {
                        self.pages.set_shadow(addr, token);
                    }
                    victims.push(addr);
                }
                other => debug_assert!(false, "policy returned {addr:#x} in state {other:?}"),
            }
        }
        victims.sort_unstable();
        (victims, cleared)
    }

    /// A use of the page at `addr` was seen (see `Stats::readahead_hit_pages`): clears its
    /// readahead mark; true if it had one (the caller counts the hit). The `referenced` bit is
    /// left alone: the policy's access source is not changed by this accounting.
    pub(crate) fn readahead_used(&mut self, addr: u64) -> bool {
        match self.pages.get(addr) {
            Some(Page::Resident {
                referenced,
                readahead: true,
            }) => {
                self.pages.insert(
                    addr,
                    Page::Resident {
                        referenced,
                        readahead: false,
                    },
                );
                true
            }
            _ => false,
        }
    }

    /// Up to `max` pages waiting to be unshared that are still resident and not in
    /// `exclude` (sorted), taken out of the set: what the next DROP unshares.
    pub(crate) fn take_unshare(&mut self, max: usize, exclude: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(a) = self.unshare.pop_first() else {
                break;
            };
            if matches!(self.pages.get(a), Some(Page::Resident { .. }))
                && exclude.binary_search(&a).is_err()
            {
                out.push(a);
            }
        }
        out
    }

    /// Parts of `[start, end)` inside registered ranges.
    pub(crate) fn registered_parts(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.ranges
            .iter()
            .filter(|&&(s, e)| s < end && e > start)
            .map(|&(s, e)| (s.max(start), e.min(end)))
            .collect()
    }
}

/// The access source over the page table: the `referenced` bit of `Resident` pages.
struct PageBits<'a> {
    pages: &'a mut PageTable,
    /// Address ranges whose bits were tested (merged when adjacent).
    cleared: Vec<(u64, u64)>,
}

impl AccessSource for PageBits<'_> {
    fn test_and_clear_young(&mut self, range: Range<PageId>, young: &mut dyn FnMut(PageId)) {
        let (start, end) = (range.start << 12, range.end.saturating_mul(4096));
        // Within one 2 MiB table for the walk's PMD-sized regions: a scan of its words.
        self.pages
            .take_referenced(start..end, |a| young(page_id(a)));
        self.note_cleared(start, end);
    }

    /// The eviction-time check of one page: a direct lookup, not a range walk.
    fn test_and_clear_page(&mut self, page: PageId) -> bool {
        let a = page << 12;
        let hit = match self.pages.get(a) {
            Some(Page::Resident {
                referenced: true,
                readahead,
            }) => {
                let page = Page::Resident {
                    referenced: false,
                    readahead,
                };
                self.pages.insert(a, page);
                true
            }
            _ => false,
        };
        self.note_cleared(a, a + PAGE_SIZE_U64);
        hit
    }
}

impl PageBits<'_> {
    fn note_cleared(&mut self, start: u64, end: u64) {
        match self.cleared.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => self.cleared.push((start, end)),
        }
    }
}

/// Removes `[start, end)` from a list of disjoint ranges, splitting those it cuts.
fn subtract(list: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    let mut out = Vec::with_capacity(list.len() + 1);
    for &(s, e) in list.iter() {
        if e <= start || s >= end {
            out.push((s, e));
            continue;
        }
        if s < start {
            out.push((s, start));
        }
        if e > end {
            out.push((end, e));
        }
    }
    *list = out;
}

/// Sorted page addresses grouped into runs of consecutive pages: `(start, pages)`.
pub(crate) fn runs_of(addrs: &[u64]) -> Vec<(u64, u32)> {
    let mut runs: Vec<(u64, u32)> = Vec::new();
    for &a in addrs {
        match runs.last_mut() {
            Some((s, n)) if *s + *n as u64 * PAGE_SIZE_U64 == a => *n += 1,
            _ => runs.push((a, 1)),
        }
    }
    runs
}

/// What a hold has done (`Mm::hold`).
#[derive(Debug, Default)]
pub(crate) struct HoldState {
    /// Every registered range is let go (none kept for want of memory, none behind a DROP).
    pub done: bool,
    /// When a tracer's agent asked last.
    pub asked: Option<std::time::Instant>,
    /// When the scanner last tried to complete or end the hold.
    pub tried: Option<std::time::Instant>,
    /// Whether the pages kept evicted were said.
    pub said_kept: bool,
    /// Pages brought back by this hold so far.
    pub restored: u64,
}

/// Whether `mm` is held.
pub(crate) fn is_held(mm: &Mm) -> bool {
    mm.held.load(Ordering::Acquire) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_split_and_gaps() {
        let mut s = MmState::new(&crate::config::PolicyConfig::default());
        s.add_range(0x1000, 0x3000);
        s.add_range(0x3000, 0x5000);
        s.add_range(0x8000, 0x9000);
        assert_eq!(s.ranges, vec![(0x1000, 0x5000), (0x8000, 0x9000)]);
        assert_eq!(
            s.uncovered(0x0, 0xa000),
            vec![(0x0, 0x1000), (0x5000, 0x8000), (0x9000, 0xa000)]
        );
        s.remove_range(0x2000, 0x3000);
        assert_eq!(
            s.ranges,
            vec![(0x1000, 0x2000), (0x3000, 0x5000), (0x8000, 0x9000)]
        );
        s.refused.push((0x5000, 0x6000));
        assert_eq!(s.uncovered(0x4000, 0x7000), vec![(0x6000, 0x7000)]);
    }

    #[test]
    fn runs_group_consecutive_pages() {
        assert_eq!(
            runs_of(&[0x1000, 0x2000, 0x3000, 0x5000, 0x7000, 0x8000]),
            vec![(0x1000, 3), (0x5000, 1), (0x7000, 2)]
        );
        assert!(runs_of(&[]).is_empty());
    }
}
