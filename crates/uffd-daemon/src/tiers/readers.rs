//! Reads of the backing device in parallel: a handler that reads a batch of faults whose pages
//! are all on the device hands their reads to these threads at once, so that the device has
//! them all in flight (the kernel's swap has one read in flight per faulting thread). A disk
//! here does 12.4k random 4 KiB reads a second one at a time, 33k four at a time, 56k sixteen
//! at a time (`O_DIRECT`, this machine's virtio disk).

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::Backend;
use crate::sys::{PAGE_SIZE, PAGE_SIZE_U64};

/// Reads in flight at most (the pool's threads).
pub(super) const READERS: usize = 8;

/// The outcome of one read: the slot and its page.
type Read = (u32, io::Result<Vec<u8>>);

struct Batch {
    /// The reads done, and how many are still to come.
    state: Mutex<(Vec<Read>, usize)>,
    done: Condvar,
}

/// Reads to do, each with the batch it belongs to.
type Job = (u32, Arc<Batch>);

struct Queue {
    /// The reads to do, and whether the pool is stopping.
    jobs: Mutex<(VecDeque<Job>, bool)>,
    work: Condvar,
}

/// The pool.
pub(super) struct Readers {
    queue: Arc<Queue>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl Readers {
    /// Starts `n` threads reading `backend`.
    pub(super) fn new(backend: Arc<dyn Backend>, n: usize) -> io::Result<Self> {
        let queue = Arc::new(Queue {
            jobs: Mutex::new((VecDeque::new(), false)),
            work: Condvar::new(),
        });
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let q = Arc::clone(&queue);
            let b = Arc::clone(&backend);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("uffd-read-{i}"))
                    .spawn(move || read_loop(&q, &*b))?,
            );
        }
        Ok(Readers { queue, threads })
    }

    /// Reads the page of each slot from the device, all at once; the outcome of each, in no
    /// particular order.
    pub(super) fn read(&self, slots: &[u32]) -> Vec<Read> {
        let batch = Arc::new(Batch {
            state: Mutex::new((Vec::with_capacity(slots.len()), slots.len())),
            done: Condvar::new(),
        });
        {
            let mut q = self.queue.jobs.lock();
            q.0.extend(slots.iter().map(|&s| (s, Arc::clone(&batch))));
        }
        self.queue.work.notify_all();
        let mut st = batch.state.lock();
        while st.1 > 0 {
            batch.done.wait(&mut st);
        }
        std::mem::take(&mut st.0)
    }
}

fn read_loop(q: &Queue, backend: &dyn Backend) {
    loop {
        let (slot, batch) = {
            let mut jobs = q.jobs.lock();
            loop {
                if jobs.1 {
                    return;
                }
                if let Some(j) = jobs.0.pop_front() {
                    break j;
                }
                q.work.wait(&mut jobs);
            }
        };
        let mut page = vec![0u8; PAGE_SIZE];
        let r = backend
            .read(u64::from(slot) * PAGE_SIZE_U64, &mut page)
            .map(|()| page);
        let mut st = batch.state.lock();
        st.0.push((slot, r));
        st.1 -= 1;
        if st.1 == 0 {
            batch.done.notify_one();
        }
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.queue.jobs.lock().1 = true;
        self.queue.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
