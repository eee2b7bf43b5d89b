//! Baseline (a): one device-wide lock and a linear scan (before v4.11).

use parking_lot::{Mutex, MutexGuard};

use crate::SlotAllocator;

#[derive(Debug)]
struct State {
    map: Vec<u8>,
    /// Where the next scan starts (the old `cluster_next`).
    cursor: usize,
    /// Acquisitions of the lock, counted under it (as [`SwapDevice`](swap_alloc::SwapDevice)
    /// counts its own locks), so that counting costs no extra atomic operation.
    locks: u64,
}

/// One lock for the whole device; allocation scans the slot map from where the last one
/// stopped, for a free aligned run, wrapping around once.
#[derive(Debug)]
pub struct GlobalLockDevice {
    state: Mutex<State>,
}

impl GlobalLockDevice {
    /// A device of `nslots` slots.
    pub fn new(nslots: usize) -> Self {
        Self {
            state: Mutex::new(State {
                map: vec![0; nslots],
                cursor: 0,
                locks: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        let mut st = self.state.lock();
        st.locks += 1;
        st
    }
}

impl SlotAllocator for GlobalLockDevice {
    fn design(&self) -> &'static str {
        "global_lock"
    }

    fn alloc_slots(&self, order: u32) -> Option<u64> {
        let nr = 1usize << order;
        let mut st = self.lock();
        let n = st.map.len();
        if nr > n {
            return None;
        }
        let start = st.cursor & !(nr - 1);
        let positions = (start..n).step_by(nr).chain((0..start).step_by(nr));
        for off in positions {
            if off + nr <= n && st.map[off..off + nr].iter().all(|&v| v == 0) {
                st.map[off..off + nr].fill(1);
                st.cursor = if off + nr >= n { 0 } else { off + nr };
                return Some(off as u64);
            }
        }
        None
    }

    fn free_slots(&self, offset: u64, order: u32) {
        let nr = 1usize << order;
        let mut st = self.lock();
        let off = offset as usize;
        if let Some(run) = st.map.get_mut(off..off + nr) {
            debug_assert!(run.iter().all(|&v| v == 1));
            run.fill(0);
        }
    }

    fn device_lock_acquisitions(&self) -> u64 {
        // Not counted itself.
        self.state.lock().locks
    }
}
