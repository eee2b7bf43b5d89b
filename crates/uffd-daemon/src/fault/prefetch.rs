//! A batch of faults whose pages all wait on the disk, read at once. The handler serves its
//! faults one after the other, in the kernel's order; served that way, each read of the swap
//! file waits for the one before, and the disk has one read in flight however many threads
//! fault (the kernel's swap has one per faulting thread). Before serving the faults it has
//! read, the handler hands the disk reads of all of them to the tiers' reader threads
//! ([`crate::tiers::Tiers::read_many`]); serving then finds each page already read.
//!
//! The pages read are this handler thread's alone, and valid for this batch only: each is
//! taken by the first fault on its address that still finds the page evicted to the same slot,
//! and all are forgotten when an event is applied (a removal, a fork, a move may free the slot
//! for other contents) and when the batch is done. Between the read and the use, no other
//! thread changes an evicted page's slot (reclaim takes resident pages; restores are this
//! handler's).

use std::cell::RefCell;

use crate::mm::{Mm, Page, ZERO_SLOT};
use crate::shared::Shared;
use crate::sys::PAGE_SIZE_U64;

/// Reads in one batch at most.
const MAX_BATCH: usize = 64;

thread_local! {
    /// `(address, slot, page)` read for the faults being served.
    static PAGES: RefCell<Vec<(u64, u32, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
}

/// Reads the pages the faults at `addrs` will restore from the disk, all at once, if at least
/// two of them are there, and only as many as the limit has room for (a fault held at the
/// limit would not use its page now).
pub(super) fn read_ahead_of_faults(shared: &Shared, mm: &Mm, addrs: impl Iterator<Item = u64>) {
    let room = shared.limit.pages().saturating_sub(shared.resident());
    let most = room.min(MAX_BATCH);
    if most < 2 {
        return;
    }
    let mut want: Vec<(u64, u32)> = Vec::new();
    {
        let st = mm.state.lock();
        for a in addrs {
            if want.len() >= most {
                break;
            }
            let a = a & !(PAGE_SIZE_U64 - 1);
            if let Some(Page::Evicted { slot }) = st.pages.get(a) {
                if slot != ZERO_SLOT
                    && shared.tiers.on_disk(slot)
                    && !want.iter().any(|&(b, s)| s == slot || b == a)
                {
                    want.push((a, slot));
                }
            }
        }
    }
    if want.len() < 2 {
        return;
    }
    let slots: Vec<u32> = want.iter().map(|&(_, s)| s).collect();
    let pages = shared.tiers.read_many(&slots);
    PAGES.with(|p| {
        let mut p = p.borrow_mut();
        p.clear();
        for (slot, page) in pages {
            if let Some(&(a, _)) = want.iter().find(|&&(_, s)| s == slot) {
                p.push((a, slot, page));
            }
        }
    });
}

/// The page read for a fault at `addr` whose page is evicted to `slot`, taken.
pub(super) fn take(addr: u64, slot: u32) -> Option<Vec<u8>> {
    PAGES.with(|p| {
        let mut p = p.borrow_mut();
        let i = p.iter().position(|&(a, s, _)| a == addr && s == slot)?;
        Some(p.swap_remove(i).2)
    })
}

/// Forgets the pages read (an event was applied, or the batch is done).
pub(super) fn forget() {
    PAGES.with(|p| p.borrow_mut().clear());
}
