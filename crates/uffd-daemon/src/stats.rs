//! Counters of a running daemon, named like the kernel's where one exists.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// The daemon's counters. All are monotonic except `resident_pages` and `processes`.
        #[derive(Debug, Default)]
        pub struct Stats {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        impl Stats {

            /// A snapshot as JSON, with every counter by name.
            pub fn to_json(&self) -> serde_json::Value {
                let mut m = serde_json::Map::new();
                $(m.insert(stringify!($name).to_string(), self.$name.load(Relaxed).into());)*
                serde_json::Value::Object(m)
            }
        }
    };
}

counters! {
    /// Missing-page faults served (zero fills and restores).
    faults,
    /// Faults served with a zero page (pages never written).
    zero_fills,
    /// Faults served from the store (the kernel's pswpin).
    swapins,
    /// Write-protect faults (writes that raced with an eviction and waited for it).
    wp_faults,
    /// Shared anonymous inodes managed (`shmem.rs`), and those released (their last mapping
    /// gone, their fd closed).
    shmem_inodes,
    /// See [`Stats::shmem_inodes`].
    shmem_inodes_released,
    /// Mappings of shared anonymous inodes added (scan, fault, fork).
    shmem_mappers,
    /// Faults on shared anonymous memory (missing and write-protect).
    shmem_faults,
    /// ... of which missing faults served from the store.
    shmem_swapins,
    /// ... of which missing faults served with zeros (never-written pages, or present ones
    /// another mapper's handler filled first: `EEXIST`, then a wake).
    shmem_zero_fills,
    /// ... of which write-protect faults.
    shmem_wp_faults,
    /// Shared anonymous pages evicted (write-protected in every mapper, read through the
    /// inode, stored, punched).
    shmem_evicted_pages,
    /// Shared batches given up (a mapper changed or an event was pending while protecting, a
    /// read failed, no tier took a page).
    shmem_evict_aborts,
    /// Shared pages found present while held evicted (filled behind the daemon's back): never
    /// expected.
    shmem_filled_behind_pages,
    /// Pages of shared anonymous memory dropped by a `MADV_REMOVE`, announced by the agent or
    /// told by the scan (they read as zeros).
    shmem_removed_pages,
    /// REMOVE events on shared anonymous memory holding evicted pages that neither the agent
    /// announced nor the scan of the callers told apart (`fault/remove_scan.rs`): taken as
    /// `MADV_DONTNEED` (stored copies kept; wrong if the call was `MADV_REMOVE`).
    shmem_remove_unannounced,
    /// REMOVE events on shared anonymous memory holding evicted pages that the scan of the
    /// callers' syscall files told apart (a raw `MADV_REMOVE` or `MADV_DONTNEED`, a program
    /// without the agent). Pages dropped are counted in `shmem_removed_pages`.
    shmem_remove_scanned,
    /// Scans of an address space's threads before a read of its uffd (it has evicted shared
    /// pages), the threads they read, the time they took (ns, wall clock: what the read
    /// waited) and the handler's CPU time in them (ns): the cost of telling unannounced
    /// REMOVEs apart.
    shmem_remove_scans,
    /// See [`Stats::shmem_remove_scans`].
    shmem_remove_scan_threads,
    /// See [`Stats::shmem_remove_scans`].
    shmem_remove_scan_ns,
    /// See [`Stats::shmem_remove_scans`].
    shmem_remove_scan_cpu_ns,
    /// Threads (or `process_madvise` iovecs) a scan could not read (gone, no permission).
    shmem_remove_scan_unreadable,
    /// Pages evicted (stored and dropped from the client; the kernel's pswpout).
    evicted_pages,
    /// Evicted pages that were all zeros and took no space in the store.
    zero_pages_evicted,
    /// Bytes written to the store.
    bytes_written,
    /// Bytes read back from the store.
    bytes_read,
    /// Evictions given up for a page (shared after fork, pinned, written, unmapped, I/O error).
    evict_aborts,
    /// Store units (pages or folios) no tier took: no space, zswap refused with no backend,
    /// or a backend write failed. Their pages stayed resident.
    backend_errors,
    /// Managed pages resident now (all processes).
    resident_pages,
    /// The most managed pages resident at once.
    resident_pages_max,
    /// The largest anonymous RSS of the whole process tree the monitor saw, in bytes
    /// (the kernel's view, including memory not yet registered).
    rss_anon_max_bytes,
    /// UFFD_EVENT_REMOVE events of program memory (MADV_DONTNEED / MADV_FREE).
    remove_events,
    /// UFFD_EVENT_UNMAP events.
    unmap_events,
    /// UFFD_EVENT_REMAP events.
    remap_events,
    /// Faults read in the same batch as, and before, a REMOVE, UNMAP or REMAP of their page:
    /// woken to fault again rather than filled after the event.
    faults_woken_for_event,
    /// UFFD_EVENT_FORK events.
    fork_events,
    /// Memory of the tree the daemon does not manage, all kinds, at its peak (bytes; the
    /// scanner's census every 100 ms: `unmanaged.rs`). Outside the limit.
    unmanaged_bytes,
    /// ... of processes whose program is statically linked (no agent can load).
    unmanaged_static_bytes,
    /// ... of processes running a set-user-ID or set-group-ID program.
    unmanaged_setuid_bytes,
    /// ... of other processes without an agent.
    unmanaged_no_agent_bytes,
    /// ... shared memory of managed processes that the daemon does not page (`RssShmem` of
    /// the mappings that are not managed shared anonymous memory): the sum of the two below.
    unmanaged_shared_bytes,
    /// ... shared memory reachable through a file descriptor (memfd, POSIX and System V shm,
    /// tmpfs files, shared anonymous memory not registered): a read or write through the
    /// descriptor would see a hole where a page was evicted.
    unmanaged_shared_fd_bytes,
    /// ... shared anonymous memory of an inode a process mapping it may pin for I/O
    /// (io_uring, O_DIRECT, RDMA): a punch would lose a device's write through the pin.
    unmanaged_shared_pinned_bytes,
    /// ... locked memory of managed processes (`VmLck`: mlock, mlockall), which the daemon
    /// leaves alone: never registered, or unregistered once resident.
    unmanaged_locked_bytes,
    /// ... anonymous memory of processes held while traced (`hold.rs`).
    unmanaged_traced_bytes,
    /// ... anonymous memory of processes held for their core dump (`hold.rs`).
    unmanaged_dumping_bytes,
    /// Pages a fork child did not inherit: its parent's `MADV_WIPEONFORK` (zeros in the child)
    /// and `MADV_DONTFORK` (no mapping in the child) memory.
    fork_pages_wiped,
    /// Forked children bound to their processes (by the token in their probe page).
    fork_children_bound,
    /// Forked children with an agent whose process was not found while their probe fault
    /// was held (they went on unbound: faults served, nothing evicted, said).
    fork_children_unbound,
    /// Of those, children bound later, at their agent's greeting.
    fork_children_bound_at_greeting,
    /// Processes that connected (start, exec, fork).
    processes,
    /// Processes managed now.
    processes_live,
    /// Connections dropped because no greeting (or no second greeting, after the device was
    /// lent) came within the greeting timeout; each was told so with an ERROR.
    greeting_timeouts,
    /// Ranges registered with UFFDIO_REGISTER.
    ranges_registered,
    /// Reads of a process's /proc/PID/maps to find memory to register (the scanner's).
    maps_scans,
    /// Ranges the program registered before the daemon's scan saw them (the agent's `mmap`
    /// wrapper), learned from their first fault (`PROCMAP_QUERY`).
    ranges_learned,
    /// DROP requests sent to agents.
    drop_requests,
    /// DROP requests an agent did not answer within 10 s (its pages stayed protected until
    /// it did: it may still have been moving them).
    drop_timeouts,
    /// Agents whose connection failed while the process lived on: the process's pages are
    /// still served, but no longer evicted.
    agents_lost,
    /// Agent threads that named themselves to the daemon (one per managed process).
    agent_threads,
    /// Faults of an agent thread on memory the daemon manages: 0 unless the agent touches
    /// program memory, which could stall a drop (agent.c, the header comment).
    agent_faults,
    /// Faults whose faulting thread last ran on the CPU that served the fault.
    faults_local_cpu,
    /// Times a fault handler moved itself off the CPU its client was woken on
    /// (`[fault] spread`).
    handler_moves,
    /// Faults for which the faulting thread's CPU was known.
    faults_cpu_known,
    /// Voluntary context switches of the fault handler threads (each is a wakeup).
    handler_wakeups,
    /// Batches of uffd messages a handler found while polling without sleeping after a fault
    /// (`[fault] spin_us`): each is a wakeup saved.
    spin_hits,
    /// Time the handlers spent polling without sleeping, in nanoseconds (CPU time they burnt).
    spin_ns,
    /// CPU time the idle keepers polled (`[fault] idle_poll_us`), in nanoseconds, summed over
    /// the CPUs: otherwise idle time spent so that no CPU halts during a fault storm.
    idle_poll_ns,
    /// Wall time the machine-wide CPU latency request of 0 was held for fault storms
    /// (`[fault] idle_poll = "kernel"`), in nanoseconds: idle CPUs polled in the kernel then.
    idle_poll_held_ns,
    /// Fault handlers started `SCHED_FIFO` (`[fault] realtime`).
    realtime_handlers,
    /// Fault storms that woke the idle keepers or the request's holder.
    idle_poll_wakeups,
    /// Sum of fault service times in nanoseconds (from reading the message to the wake).
    fault_service_ns,
    /// Wall time fault handlers waited to read their uffd because reclaim held the event gate
    /// (a DROP in flight, or a batch's read of its victims' frames), in nanoseconds: no fault
    /// of that address space is read meanwhile.
    handler_gate_wait_ns,
    /// Times a fault waited for reclaim because the limit was reached.
    throttled_faults,
    /// Reclaim time choosing victims (the policy, under the address space's state lock:
    /// faults of that address space wait meanwhile), in nanoseconds.
    reclaim_pick_ns,
    /// The longest single choice of victims, in nanoseconds.
    reclaim_pick_max_ns,
    /// Reclaim time write-protecting victims, in nanoseconds.
    reclaim_wp_ns,
    /// Write-protections of victims the kernel answered `EAGAIN` (an event of the address
    /// space not yet read by its handler, such as the REMOVE of an agent's scratch), retried.
    reclaim_wp_again,
    /// Reclaim time reading victims (`/proc/PID/mem`), in nanoseconds.
    reclaim_read_ns,
    /// Victims found not mapped when read (the program removed or unmapped them since they
    /// were chosen, or the kernel discarded them after `MADV_FREE`): forgotten, not stored.
    reclaim_unmapped_pages,
    /// Pages a DROP could not move because they were shared after a fork, made the process's
    /// own again by the agent (`MADV_POPULATE_WRITE`) so that a later DROP could.
    unshared_pages,
    /// Pages a DROP could not move again after they were unshared: pinned for I/O (io_uring
    /// fixed buffers, RDMA, vfio, an O_DIRECT read in flight). Each is left out of the victims
    /// for a while (1 s, doubling up to 64 s at each refusal).
    pinned_refusals,
    /// Pages that held something else when a DROP moved them than when reclaim read them:
    /// written through a pin in between (an I/O in flight, or a buffer unpinned since). Stored
    /// anew with what they held, their first copy discarded.
    evict_changed_pages,
    /// Faults on pages a DROP in flight had moved out, held until the DROP settled.
    dropping_faults_held,
    /// Pages a DROP moved that an event had put at a victim's address (another page than the
    /// one picked), put back where they were taken from (`reclaim::put_back_moved`).
    drop_moved_put_back,
    /// Such pages taken from an address that is not a resident page of this address space
    /// now: left to whoever serves that address's next fault (the frame check also counts
    /// pages changed for other reasons here, such as copy-on-write).
    drop_moved_not_ours,
    /// Such pages that could not go back (said in the log).
    drop_moved_lost,
    /// Reclaim time storing victims, in nanoseconds.
    reclaim_store_ns,
    /// Reclaim time waiting for the agent to drop victims, in nanoseconds.
    reclaim_drop_ns,
    /// Messages refused from agents (malformed or unexpected), descriptors that were not what
    /// they claimed to be.
    protocol_errors,
    /// Bytes of memory the daemon handed over to programs that registered it with a
    /// userfaultfd of their own (every evicted page brought back first); not managed since.
    own_uffd_bytes,
    /// Evicted pages brought back before such a hand-over (also before a `tsync_left` one).
    own_uffd_pages_restored,
    /// Processes that put every thread, the agent's too, under a seccomp filter
    /// (`SECCOMP_FILTER_FLAG_TSYNC`): the daemon brought their pages back and stopped managing
    /// them.
    tsync_left_processes,
    /// Bytes the daemon managed in those processes when they left.
    tsync_left_bytes,
    /// Times the agent's threads of a process ended for a call the kernel allows only to a
    /// process of one thread (`unshare(CLONE_NEWUSER)`, `setns` into a user, mount or time
    /// namespace), the process's uffd and registrations kept by the daemon meanwhile.
    agent_step_outs,
    /// Times they started again after such a call and greeted the daemon: managed again.
    agent_restarts,
    /// Processes whose agent could not start again after such a call: the daemon brought their
    /// pages back and stopped managing them (as `tsync_left`; counted by the census since).
    agent_restart_left_processes,
    /// Processes held for their core dump (`hold.rs`): a core-dumping signal at its default
    /// Processes held because they opened their own memory file (`/proc/self/mem`).
    held_for_self_mem,
    /// Holds for a process's own memory file that ended (no descriptor names one any more).
    self_mem_releases,
    /// action, with a core to be written; their evicted pages brought back first.
    held_for_dump,
    /// Processes held while traced (a debugger, strace): their evicted pages brought back,
    /// their memory the kernel's, nothing evicted, until no thread is traced.
    held_for_trace,
    /// Trace holds that ended (the tracer detached): the memory is paged again.
    trace_releases,
    /// Evicted pages brought back for holds.
    hold_pages_restored,
    /// Evicted pages a hold left evicted, more than the machine had available: a core file
    /// holds zeros there, a debugger cannot read them.
    hold_pages_kept_evicted,
    /// Times eviction stalled because no tier took any page of a batch (the swap space full, a
    /// failing device): the limit does not hold until it ends.
    store_stalls,
    /// Pages no tier took because the swap space was full (raise `--swap-size`).
    store_refused_full_pages,
    /// Pages no tier took because the zswap pool was at its limit and there is no backing
    /// device (`--backend none`).
    store_refused_pool_pages,
    /// Pages no tier took because they do not compress below a page and there is no backing
    /// device.
    store_refused_incompressible_pages,
    /// Pages no tier took because writing them to the backing device failed.
    store_refused_io_pages,
    /// Failed accepts of agents' connections (retried after a pause), and greetings refused
    /// because the daemon was out of descriptors.
    accept_errors,
    /// Write-protect faults on resident pages armed by the access source (seen as accesses).
    wp_access_faults,
    /// Ranges the access source write-protected after the aging cleared their bits.
    wp_arm_ranges,
    /// Pages restored ahead of a fault (readahead of neighbours on sequential faults).
    readahead_pages,
    /// Of `readahead_pages`: pages the daemon then saw the program use (the kernel's swap
    /// readahead hits). A read of a present page makes no fault, so a use is seen as: a later
    /// fault of the same stream past the page (a sequential reader went through it), a
    /// write-protect fault on it (`access = "faults+wp"`), or a fault message for it.
    readahead_hit_pages,
    /// Of `readahead_pages`: pages that left with no use seen since they were read ahead:
    /// chosen as victims, removed or unmapped by the program, or still unused when their
    /// process ended. An upper bound on the pages read ahead for nothing (a read of such a
    /// page outside a sequential stream is not seen); `readahead_pages` minus hits and unused
    /// are still resident and unjudged.
    readahead_unused_pages,
    /// Faults that restored a whole aligned 64 KiB folio at once.
    swpin_folios,
    /// Never-written pages filled with zeros ahead of a sequential zero-fill fault.
    fault_around_pages,
    /// Restores served from the compressed pool.
    fault_zswap,
    /// Restores served from the backing device.
    fault_backend,
    /// Sum of service times of restores from zswap, nanoseconds (with `fault_zswap`).
    fault_zswap_ns,
    /// Sum of service times of restores from the backing device, nanoseconds.
    fault_backend_ns,
    /// The daemon's own largest anonymous RSS, bytes.
    daemon_rss_anon_max_bytes,
    /// The daemon's largest anonymous RSS beyond the zswap pool: metadata and buffers, bytes.
    daemon_overhead_max_bytes,
    /// The largest total of the metadata structures' heap bytes (page tables, policies, the
    /// slot device, zswap's index and handle table), counted by the structures themselves.
    daemon_metadata_max_bytes,
    /// Pages the daemon managed at that moment (resident and stored).
    daemon_metadata_managed_pages,
    /// Of `daemon_metadata_max_bytes`: the page tables.
    daemon_metadata_pagetable_bytes,
    /// Of `daemon_metadata_max_bytes`: the replacement policies (nodes, index, shadows).
    daemon_metadata_policy_bytes,
    /// Of `daemon_metadata_max_bytes`: the slot device.
    daemon_metadata_slots_bytes,
    /// Of `daemon_metadata_max_bytes`: zswap's index, LRU and pool bookkeeping.
    daemon_metadata_zswap_bytes,
    /// Processes managed without an agent (`agentless.rs`): statically linked and set-ID
    /// programs, images exec'd without the agent, their fork children. The daemon made their
    /// userfaultfd and carries out their DROPs with ptrace-injected system calls.
    agentless_processes,
    /// Processes the daemon tried to manage without an agent and could not (a seccomp filter,
    /// another tracer, the kernel's refusal): unmanaged, counted by the census, said once.
    agentless_refused,
    /// Fork children of agentless processes bound to their pid through their probe page.
    agentless_children_bound,
    /// ptrace stops made to run system calls in agentless processes (one per DROP batch,
    /// one to make a process's uffd).
    inject_stops,
    /// System calls run in those stops.
    inject_syscalls,
    /// Injections that failed (the process exited or exec'd mid-stop, a thread that did not
    /// stop in time or waited in a userfault from the kernel, the uffd that could not be lent,
    /// a DROP with pages refused for other reasons than `EBUSY`).
    inject_errors,
    /// Wall time of the stops, from the seize to the detach, in nanoseconds.
    inject_stop_ns,
    /// DROP batches carried out by injection (of `drop_requests`).
    inject_drops,
}

impl Stats {
    /// Adds one to `c`; true if it was 0 (the first time: say it).
    pub fn add_first(c: &AtomicU64) -> bool {
        c.fetch_add(1, Relaxed) == 0
    }
    /// Adds to a counter.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// Records the resident count after a change.
    pub fn set_resident(&self, pages: u64) {
        self.resident_pages.store(pages, Relaxed);
        self.resident_pages_max.fetch_max(pages, Relaxed);
    }
}

/// Exact durations of a kind of operation (the first 65536), for a median with its extremes.
#[derive(Debug, Default)]
pub struct Samples {
    ns: parking_lot::Mutex<Vec<u64>>,
}

impl Samples {
    const MAX: usize = 1 << 16;

    /// Records one duration.
    pub fn record(&self, ns: u64) {
        let mut v = self.ns.lock();
        if v.len() < Self::MAX {
            v.push(ns);
        }
    }

    /// `(count, median, min, max)` in microseconds, if anything was recorded.
    pub fn summary_us(&self) -> Option<(usize, f64, f64, f64)> {
        let mut v = self.ns.lock().clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let us = |ns: u64| ns as f64 / 1000.0;
        Some((v.len(), us(v[v.len() / 2]), us(v[0]), us(v[v.len() - 1])))
    }

    /// Adds `PREFIX_count`, `PREFIX_p50_us`, `PREFIX_min_us`, `PREFIX_max_us` to `out`.
    pub fn report(&self, prefix: &str, out: &mut serde_json::Value) {
        if let Some((n, p50, min, max)) = self.summary_us() {
            out[format!("{prefix}_count")] = (n as u64).into();
            out[format!("{prefix}_p50_us")] = p50.into();
            out[format!("{prefix}_min_us")] = min.into();
            out[format!("{prefix}_max_us")] = max.into();
        }
    }
}

/// A latency histogram: 500 ns buckets up to 64 µs, then one bucket per power of two up to
/// about 68 s. Lock-free (one relaxed add per sample).
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; Histogram::LINEAR + Histogram::LOG],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Histogram {
    const LINEAR: usize = 128;
    const STEP_NS: u64 = 500;
    const LOG: usize = 21;

    fn bucket(ns: u64) -> usize {
        let lin = ns / Self::STEP_NS;
        if lin < Self::LINEAR as u64 {
            return lin as usize;
        }
        // 64 µs = 2^16 ns: bucket LINEAR + k covers [2^(16+k), 2^(17+k)).
        let k = (63 - ns.leading_zeros() as usize).saturating_sub(16);
        Self::LINEAR + k.min(Self::LOG - 1)
    }

    /// The upper edge of a bucket, nanoseconds.
    fn upper(b: usize) -> u64 {
        if b < Self::LINEAR {
            (b as u64 + 1) * Self::STEP_NS
        } else {
            1u64 << (17 + (b - Self::LINEAR))
        }
    }

    /// Records one sample.
    pub fn record(&self, ns: u64) {
        self.buckets[Self::bucket(ns)].fetch_add(1, Relaxed);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    /// The `q` quantile (0..=1) in microseconds: the upper edge of the bucket holding it
    /// (500 ns resolution below 64 µs). `None` without samples.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::upper(b) as f64 / 1000.0);
            }
        }
        None
    }
}

/// Whether the counter named `name` in the JSON snapshot is a level (resident pages, pool
/// bytes, a peak, a latency quantile, a ratio) rather than a running count.
fn is_gauge(name: &str) -> bool {
    const LEVELS: [&str; 13] = [
        "resident_pages",
        "processes_live",
        "limit_pages",
        "swap_slots",
        "swap_slots_in_use",
        "zswap_pool_bytes",
        "zswap_compressed_bytes",
        "zswap_metadata_bytes",
        "zswap_stored_pages",
        "zswap_same_filled_pages",
        "backend_seal_metadata_bytes",
        "elapsed_s",
        "exit_status",
    ];
    LEVELS.contains(&name)
        || name.contains("_max")
        || name.contains("ratio")
        || name.starts_with("unmanaged_")
        || name.starts_with("daemon_metadata_")
        || name.ends_with("_us")
        || name.ends_with("_pct")
        || (name.starts_with("tier_") && (name.ends_with("_pages") || name.ends_with("_bytes")))
        || name == "chain_index_bytes"
        || name == "chain_far_places_in_use"
}

/// The JSON snapshot of daemon `daemon_pid` in the Prometheus text format (version 0.0.4):
/// each number as `uffd_daemon_NAME{daemon_pid="PID"}`, running counts as counters (with
/// `_total`), levels as gauges; text and yes/no settings as labels of `uffd_daemon_info`.
pub fn prometheus_text(daemon_pid: &str, v: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut info = Vec::new();
    let Some(m) = v.as_object() else {
        return out;
    };
    let pid = daemon_pid.replace(['\\', '"', '\n'], "_");
    for (k, val) in m {
        let name: String = k
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        match val {
            serde_json::Value::Number(n) => {
                let (metric, kind) = if is_gauge(k) {
                    (format!("uffd_daemon_{name}"), "gauge")
                } else {
                    (format!("uffd_daemon_{name}_total"), "counter")
                };
                let _ = writeln!(out, "# TYPE {metric} {kind}");
                let _ = writeln!(out, "{metric}{{daemon_pid=\"{pid}\"}} {n}");
            }
            serde_json::Value::Bool(b) => info.push((name, b.to_string())),
            serde_json::Value::String(t) => info.push((
                name,
                t.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n"),
            )),
            _ => {}
        }
    }
    if !info.is_empty() {
        let labels: Vec<String> = info.iter().map(|(k, t)| format!("{k}=\"{t}\"")).collect();
        let _ = writeln!(out, "# TYPE uffd_daemon_info gauge");
        let _ = writeln!(
            out,
            "uffd_daemon_info{{daemon_pid=\"{pid}\",{}}} 1",
            labels.join(",")
        );
    }
    out
}

#[cfg(test)]
mod prometheus_tests {
    use super::*;

    /// Every line is a comment or `name{labels} value` with a valid metric name; counts are
    /// counters, levels gauges; text settings become labels.
    #[test]
    fn prometheus_text_is_well_formed() {
        let mut v = Stats::default().to_json();
        v["faults"] = 12.into();
        v["resident_pages"] = 3.into();
        v["zswap_compression_ratio"] = 2.5.into();
        v["fault_zswap_p50_us"] = 9.0.into();
        v["idle_poll"] = "kernel".into();
        v["backend_encrypted"] = true.into();
        let t = prometheus_text("42", &v);
        for line in t.lines() {
            if line.starts_with('#') {
                assert!(line.starts_with("# TYPE uffd_daemon_"), "{line}");
                continue;
            }
            let (name, rest) = line.split_once('{').expect(line);
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            let (_, value) = rest.rsplit_once("} ").expect(line);
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
        assert!(t.contains("# TYPE uffd_daemon_faults_total counter"));
        assert!(t.contains("uffd_daemon_faults_total{daemon_pid=\"42\"} 12"));
        assert!(t.contains("# TYPE uffd_daemon_resident_pages gauge"));
        assert!(t.contains("# TYPE uffd_daemon_resident_pages_max gauge"));
        assert!(t.contains("# TYPE uffd_daemon_zswap_compression_ratio gauge"));
        assert!(t.contains("# TYPE uffd_daemon_fault_zswap_p50_us gauge"));
        assert!(t.contains(
            "uffd_daemon_info{daemon_pid=\"42\",backend_encrypted=\"true\",idle_poll=\"kernel\"} 1"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles() {
        let h = Histogram::default();
        assert_eq!(h.quantile_us(0.5), None);
        for ns in [1_000u64, 2_000, 3_000, 4_000, 100_000] {
            h.record(ns);
        }
        assert_eq!(h.count(), 5);
        assert_eq!(h.quantile_us(0.5), Some(3.5));
        assert_eq!(h.quantile_us(0.2), Some(1.5));
        assert_eq!(h.quantile_us(1.0), Some(131.072));
        h.record(u64::MAX);
        assert_eq!(h.count(), 6, "huge samples land in the last bucket");
    }
}
