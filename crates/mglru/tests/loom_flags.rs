//! Loom models of the per-page word: concurrent promotions, protections and descriptor
//! accesses never lose each other's effect, and the generation moves they report add up to
//! the page's real move (so batched per-generation counts stay exact); a list-generation
//! change racing them loses nothing either, and the page id and type never change.
#![cfg(mglru_loom)]

use loom::sync::Arc;
use loom::thread;
use mglru::__loom::PageFlags;
use mglru::{PageType, MAX_PAGE_ID};

/// Two threads count descriptor accesses at once: none is lost.
#[test]
fn concurrent_inc_refs_are_all_counted() {
    loom::model(|| {
        let f = Arc::new(PageFlags::new(MAX_PAGE_ID, PageType::File, 1));
        let t = {
            let f = f.clone();
            thread::spawn(move || {
                f.inc_refs();
                f.inc_refs();
            })
        };
        f.inc_refs();
        f.inc_refs();
        t.join().unwrap();
        // Four accesses: referenced, workingset, then two counted: refs 3, tier 2.
        assert_eq!(f.refs(), 3);
        assert_eq!(f.tier(), 2);
        assert_eq!(f.gen(), Some(1));
    });
}

/// Starts the aging walk promoting the page to generation 3 and a reader counting an access.
#[allow(clippy::type_complexity)]
fn walk_and_read(
    f: &Arc<PageFlags>,
) -> (
    thread::JoinHandle<Option<(usize, bool)>>,
    thread::JoinHandle<()>,
) {
    let walker = {
        let f = f.clone();
        thread::spawn(move || f.update_gen(3, false))
    };
    let reader = {
        let f = f.clone();
        thread::spawn(move || f.inc_refs())
    };
    (walker, reader)
}

/// The aging walk promotes a page (gen 0 -> 3) while eviction protects it (0 -> 1) and a
/// reader counts an access: the page ends in generation 3 whatever the order, and the moves
/// both report sum to exactly one page moved from 0 to 3.
#[test]
fn promotion_and_protection_race() {
    loom::model(|| {
        let f = Arc::new(PageFlags::new(MAX_PAGE_ID - 1, PageType::Anon, 0));
        let (walker, reader) = walk_and_read(&f);
        let (old, new) = f.inc_gen(0, 1);
        let promoted = walker.join().unwrap();
        reader.join().unwrap();

        let mut delta = [0i64; 4];
        let (p_old, moved) = promoted.expect("the page is never isolated here");
        assert!(moved);
        delta[p_old] -= 1;
        delta[3] += 1;
        let old = old.expect("the page is never isolated here");
        if old != new {
            delta[old] -= 1;
            delta[new] += 1;
        }
        assert_eq!(f.gen(), Some(3));
        assert_eq!(delta, [-1, 0, 0, 1]);
        assert!(f.refs() <= 1);
    });
}

/// The LRU's owner moves the node to another list (`set_list_gen`, under `&mut` in the LRU,
/// but on the shared word) while two readers count accesses and the walk promotes the page:
/// every access and the promotion are kept, the list generation is the owner's, and the page
/// id and type are untouched.
#[test]
fn list_gen_change_races_inc_refs() {
    loom::model(|| {
        let f = Arc::new(PageFlags::new(MAX_PAGE_ID, PageType::File, 0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let f = f.clone();
                thread::spawn(move || f.inc_refs())
            })
            .collect();
        f.set_list_gen(2);
        f.set_list_gen(3);
        for r in readers {
            r.join().unwrap();
        }
        // Two accesses: referenced, then workingset (counted as one reference).
        assert_eq!(f.refs(), 1);
        assert_eq!(f.gen(), Some(0));
        assert_eq!(f.list_gen(), 3);
        assert_eq!(f.page(), MAX_PAGE_ID);
        assert_eq!(f.page_type(), PageType::File);
    });
}

/// A promotion by the walk (flag bits) against a list move by the owner (list bits): both
/// stay, whatever the order.
#[test]
fn list_gen_change_races_promotion() {
    loom::model(|| {
        let f = Arc::new(PageFlags::new(12_345, PageType::Anon, 0));
        let (walker, reader) = walk_and_read(&f);
        f.set_list_gen(1);
        assert_eq!(walker.join().unwrap(), Some((0, true)));
        reader.join().unwrap();
        assert_eq!(f.gen(), Some(3));
        assert_eq!(f.list_gen(), 1);
        assert!(f.refs() <= 1);
        assert_eq!((f.page(), f.page_type()), (12_345, PageType::Anon));
    });
}
