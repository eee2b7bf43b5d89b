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
    /// Store write failures (the page stayed resident).
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
    /// UFFD_EVENT_FORK events.
    fork_events,
    /// Processes that connected (start, exec, fork).
    processes,
    /// Processes managed now.
    processes_live,
    /// Ranges registered with UFFDIO_REGISTER.
    ranges_registered,
    /// DROP requests sent to agents.
    drop_requests,
    /// DROP requests an agent did not answer in time (its pages kept their stored copies).
    drop_timeouts,
    /// Faults whose faulting thread last ran on the CPU that served the fault.
    faults_local_cpu,
    /// Faults for which the faulting thread's CPU was known.
    faults_cpu_known,
    /// Voluntary context switches of the fault handler threads (each is a wakeup).
    handler_wakeups,
    /// Sum of fault service times in nanoseconds (from reading the message to the wake).
    fault_service_ns,
    /// Times a fault waited for reclaim because the limit was reached.
    throttled_faults,
    /// Reclaim time write-protecting victims, in nanoseconds.
    reclaim_wp_ns,
    /// Reclaim time reading victims (`process_vm_readv`), in nanoseconds.
    reclaim_read_ns,
    /// Reclaim time storing victims, in nanoseconds.
    reclaim_store_ns,
    /// Reclaim time waiting for the agent to drop victims, in nanoseconds.
    reclaim_drop_ns,
    /// Messages refused from agents (malformed or unexpected).
    protocol_errors,
}

impl Stats {
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
