//! The compressed-object pool, after zsmalloc.
//!
//! Objects are grouped by size class (32 bytes to a page, every 16 bytes: zsmalloc's
//! `ZS_MIN_ALLOC_SIZE` and `ZS_SIZE_CLASS_DELTA` for 4 KiB pages). A class packs its objects into
//! *spans* (zsmalloc's zspages) of 1 to `max_span_pages` pages, the span size chosen per class to
//! waste the least memory, so objects may straddle page boundaries inside a span. Each class has
//! its own lock, as zsmalloc's `class->lock`.
//!
//! A [`Handle`] names an object independently of where it lives: it indexes the class's handle
//! table (zsmalloc's handle is a pointer to a slot holding the object's location), so compaction
//! can move objects between spans and only rewrite the table. A handle also carries a generation,
//! so a stale or forged handle is reported as [`PoolError::BadHandle`], not read.

use crate::sync::Mutex;
use crate::PAGE_SIZE;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Smallest object slot.
pub(crate) const MIN_ALLOC: usize = 32;
/// Distance between size classes.
pub(crate) const CLASS_DELTA: usize = 16;
/// Largest object the pool stores (zswap rejects anything that does not compress below a page).
pub(crate) const MAX_OBJECT: usize = PAGE_SIZE - 1;

const NR_CLASSES: usize = (PAGE_SIZE - MIN_ALLOC) / CLASS_DELTA + 1;
/// Generation bits kept in a handle-table slot (and compared with a handle's).
const GEN_BITS: u32 = 15;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
const FREE_OWNER: u32 = u32::MAX;

/// The name of a stored object; valid until the object is freed, across compactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub(crate) u64);

impl Handle {
    fn new(class: usize, gen: u32, idx: u32) -> Handle {
        Handle(((class as u64) << 52) | (u64::from(gen & GEN_MASK) << 32) | u64::from(idx))
    }
    fn class(self) -> usize {
        (self.0 >> 52) as usize
    }
    /// The handle's whole 20-bit generation field: a slot keeps [`GEN_BITS`] of it, so a
    /// handle with any higher bit set (forged) never matches a slot.
    fn gen(self) -> u32 {
        ((self.0 >> 32) as u32) & ((1 << 20) - 1)
    }
    fn idx(self) -> u32 {
        self.0 as u32
    }
    /// The raw value (for diagnostics and fuzzing).
    pub fn raw(self) -> u64 {
        self.0
    }
    /// A handle from a raw value; the pool checks it on use.
    pub fn from_raw(raw: u64) -> Handle {
        Handle(raw)
    }
}

/// A pool failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The handle does not name a live object of this pool.
    #[error("bad pool handle {0:#x}: no live object has it")]
    BadHandle(u64),
    /// The object is larger than the pool stores.
    #[error("object of {len} bytes is larger than the {max}-byte maximum")]
    TooLarge {
        /// Requested size.
        len: usize,
        /// Largest allowed.
        max: usize,
    },
    /// The size class holds as many spans as a handle-table slot can name (2^24).
    #[error("size class of {class_size}-byte objects is full (2^24 spans)")]
    ClassFull {
        /// The class's object size.
        class_size: usize,
    },
}

/// A handle-table slot, decoded from its 8-byte [`PackedSlot`].
#[derive(Debug, Clone, Copy)]
enum Slot {
    Free {
        next_free: u32,
        gen: u32,
    },
    Used {
        span: u32,
        obj: u16,
        len: u16,
        gen: u32,
    },
    /// The object was moved to a larger class by compaction: `to` names it there (possibly
    /// moved on again: chains only go up in size, so they are at most as long as the classes).
    Moved {
        to: Handle,
        gen: u32,
    },
}

/// Spans per class a slot can name.
const MAX_SPANS: usize = 1 << 24;
const TAG_SHIFT: u32 = 62;
const TAG_FREE: u64 = 0;
const TAG_USED: u64 = 1;
const TAG_MOVED: u64 = 2;
const SLOT_GEN_SHIFT: u32 = 47;

/// A handle-table slot in 8 bytes: tag (2 bits), generation (15), and for a used slot the span
/// (24 bits), object index (11: at most 16 pages of 32-byte objects) and length (12); for a
/// free slot the next free index. A moved slot's target handle lives in `Class::moved` (only
/// compaction across classes makes them, for the few objects of each class's last spans).
#[derive(Debug, Clone, Copy)]
struct PackedSlot(u64);

const _: () = assert!((16 * PAGE_SIZE / MIN_ALLOC) <= 1 << 11 && MAX_OBJECT < 1 << 12);

impl PackedSlot {
    fn tag(self) -> u64 {
        self.0 >> TAG_SHIFT
    }
    fn gen(self) -> u32 {
        ((self.0 >> SLOT_GEN_SHIFT) as u32) & GEN_MASK
    }
    fn head(tag: u64, gen: u32) -> u64 {
        (tag << TAG_SHIFT) | (u64::from(gen & GEN_MASK) << SLOT_GEN_SHIFT)
    }
}

/// Where a handle's slot leads.
enum Found {
    /// (span, object index, length) in this class.
    At(u32, u16, u16),
    /// Follow to another class.
    Moved(Handle),
}

/// A span: `span_bytes` of object memory followed by a bitmap of its used object slots (one bit
/// per slot; the owner of a slot is found from the handle table when compaction needs it).
#[derive(Debug)]
struct Span {
    mem: Box<[u8]>,
    inuse: u32,
    /// Position in `Class::partial` when the span has both used and free slots... or is empty
    /// and about to be released; `NOT_PARTIAL` when full.
    partial_pos: u32,
}

const NOT_PARTIAL: u32 = u32::MAX;

impl Span {
    fn bitmap(&self, span_bytes: usize) -> &[u8] {
        &self.mem[span_bytes..]
    }
    fn is_used(&self, span_bytes: usize, obj: u16) -> bool {
        self.bitmap(span_bytes)
            .get(obj as usize / 8)
            .is_some_and(|b| b & (1 << (obj % 8)) != 0)
    }
    fn set_used(&mut self, span_bytes: usize, obj: u16, used: bool) {
        let b = &mut self.mem[span_bytes + obj as usize / 8];
        if used {
            *b |= 1 << (obj % 8);
        } else {
            *b &= !(1 << (obj % 8));
        }
    }
    /// First free object slot below `objs`.
    fn first_free(&self, span_bytes: usize, objs: usize) -> Option<u16> {
        let (i, b) = self
            .bitmap(span_bytes)
            .iter()
            .enumerate()
            .find(|(_, &b)| b != 0xff)?;
        let obj = i * 8 + b.trailing_ones() as usize;
        (obj < objs).then_some(obj as u16)
    }
    /// First used object slot.
    fn first_used(&self, span_bytes: usize) -> Option<u16> {
        let (i, b) = self
            .bitmap(span_bytes)
            .iter()
            .enumerate()
            .find(|(_, &b)| b != 0)?;
        Some((i * 8 + b.trailing_zeros() as usize) as u16)
    }
}

#[derive(Debug)]
struct Class {
    size: usize,
    objs_per_span: usize,
    span_bytes: usize,
    spans: Vec<Option<Span>>,
    free_span_ids: Vec<u32>,
    /// Spans with at least one free object slot.
    partial: Vec<u32>,
    table: Vec<PackedSlot>,
    /// Targets of the slots compaction moved to a larger class, by slot index.
    moved: HashMap<u32, Handle>,
    table_free: u32,
    objects: u64,
    object_bytes: u64,
}

impl Class {
    fn new(size: usize, max_span_pages: usize) -> Class {
        // zsmalloc's get_pages_per_zspage picks the span size with the smallest wasted
        // fraction. Every class also keeps up to one partly filled span, so big spans cost
        // memory in small pools: take the smallest span that wastes at most 1/32 of itself, and
        // the least wasteful one only if none does. (Fractions compared without floats:
        // waste_a / bytes_a < waste_b / bytes_b as waste_a * bytes_b < waste_b * bytes_a.)
        let mut best = (1usize, PAGE_SIZE % size);
        for pages in 1..=max_span_pages {
            let bytes = pages * PAGE_SIZE;
            let waste = bytes % size;
            if waste * 32 <= bytes {
                best = (pages, waste);
                break;
            }
            if waste * (best.0 * PAGE_SIZE) < best.1 * bytes {
                best = (pages, waste);
            }
        }
        let span_bytes = best.0 * PAGE_SIZE;
        Class {
            size,
            objs_per_span: span_bytes / size,
            span_bytes,
            spans: Vec::new(),
            free_span_ids: Vec::new(),
            partial: Vec::new(),
            table: Vec::new(),
            moved: HashMap::new(),
            table_free: FREE_OWNER,
            objects: 0,
            object_bytes: 0,
        }
    }

    fn partial_remove(&mut self, span_id: u32) {
        let Some(span) = self
            .spans
            .get_mut(span_id as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        let pos = std::mem::replace(&mut span.partial_pos, NOT_PARTIAL);
        if pos == NOT_PARTIAL {
            return;
        }
        self.partial.swap_remove(pos as usize);
        if let Some(&moved) = self.partial.get(pos as usize) {
            if let Some(Some(s)) = self.spans.get_mut(moved as usize) {
                s.partial_pos = pos;
            }
        }
    }

    fn partial_add(&mut self, span_id: u32) {
        let pos = self.partial.len() as u32;
        if let Some(Some(span)) = self.spans.get_mut(span_id as usize) {
            if span.partial_pos == NOT_PARTIAL {
                span.partial_pos = pos;
                self.partial.push(span_id);
            }
        }
    }

    /// Bytes of a span's used-slot bitmap.
    fn bitmap_bytes(&self) -> usize {
        self.objs_per_span.div_ceil(8)
    }

    /// Allocates an object slot; returns (span id, object index, new span bytes), or None when
    /// the class already has [`MAX_SPANS`] spans.
    fn alloc_obj(&mut self) -> Option<(u32, u16, usize)> {
        let mut grown = 0;
        let span_id = match self.partial.last() {
            Some(&id) => id,
            None => {
                if self.free_span_ids.is_empty() && self.spans.len() >= MAX_SPANS {
                    return None;
                }
                let span = Span {
                    mem: vec![0u8; self.span_bytes + self.bitmap_bytes()].into_boxed_slice(),
                    inuse: 0,
                    partial_pos: NOT_PARTIAL,
                };
                grown = self.span_bytes;
                let id = match self.free_span_ids.pop() {
                    Some(id) => {
                        self.spans[id as usize] = Some(span);
                        id
                    }
                    None => {
                        if self.spans.len() == self.spans.capacity() {
                            // Grow by an eighth: less slack than doubling, still amortised O(1).
                            self.spans.reserve_exact((self.spans.len() / 8).max(16));
                        }
                        self.spans.push(Some(span));
                        (self.spans.len() - 1) as u32
                    }
                };
                self.partial_add(id);
                id
            }
        };
        let (span_bytes, objs) = (self.span_bytes, self.objs_per_span);
        let (obj, full) = {
            let Some(Some(span)) = self.spans.get_mut(span_id as usize) else {
                unreachable!("partial list names a live span");
            };
            let Some(obj) = span.first_free(span_bytes, objs) else {
                unreachable!("a span on the partial list has a free slot");
            };
            span.set_used(span_bytes, obj, true);
            span.inuse += 1;
            (obj, span.inuse as usize == objs)
        };
        if full {
            self.partial_remove(span_id);
        }
        Some((span_id, obj, grown))
    }

    /// Frees an object slot; returns span bytes released.
    fn free_obj(&mut self, span_id: u32, obj: u16) -> usize {
        let (now_empty, was_full) = {
            let Some(Some(span)) = self.spans.get_mut(span_id as usize) else {
                return 0;
            };
            let was_full = span.inuse as usize == self.objs_per_span;
            span.set_used(self.span_bytes, obj, false);
            span.inuse -= 1;
            (span.inuse == 0, was_full)
        };
        if was_full {
            self.partial_add(span_id);
        }
        if now_empty {
            // zsmalloc frees an empty zspage at once.
            self.partial_remove(span_id);
            self.spans[span_id as usize] = None;
            self.free_span_ids.push(span_id);
            return self.span_bytes;
        }
        0
    }

    fn obj_range(&self, obj: u16) -> std::ops::Range<usize> {
        let start = obj as usize * self.size;
        start..start + self.size
    }

    /// Slot `idx` of the handle table, decoded.
    fn slot(&self, idx: u32) -> Option<Slot> {
        let p = *self.table.get(idx as usize)?;
        let gen = p.gen();
        Some(match p.tag() {
            TAG_USED => Slot::Used {
                span: ((p.0 >> 23) & (MAX_SPANS as u64 - 1)) as u32,
                obj: ((p.0 >> 12) & 0x7ff) as u16,
                len: (p.0 & 0xfff) as u16,
                gen,
            },
            TAG_MOVED => Slot::Moved {
                to: self.moved.get(&idx).copied().unwrap_or(Handle(u64::MAX)),
                gen,
            },
            _ => Slot::Free {
                next_free: p.0 as u32,
                gen,
            },
        })
    }

    /// Writes slot `idx` of the handle table.
    fn set_slot(&mut self, idx: u32, slot: Slot) {
        let packed = match slot {
            Slot::Free { next_free, gen } => PackedSlot::head(TAG_FREE, gen) | u64::from(next_free),
            Slot::Used {
                span,
                obj,
                len,
                gen,
            } => {
                debug_assert!((span as usize) < MAX_SPANS && obj < 1 << 11 && len < 1 << 12);
                PackedSlot::head(TAG_USED, gen)
                    | (u64::from(span) << 23)
                    | (u64::from(obj) << 12)
                    | u64::from(len)
            }
            Slot::Moved { to, gen } => {
                self.moved.insert(idx, to);
                PackedSlot::head(TAG_MOVED, gen)
            }
        };
        if !matches!(slot, Slot::Moved { .. }) && self.table[idx as usize].tag() == TAG_MOVED {
            self.moved.remove(&idx);
        }
        self.table[idx as usize] = PackedSlot(packed);
    }

    fn lookup(&self, h: Handle) -> Result<Found, PoolError> {
        match self.slot(h.idx()) {
            Some(Slot::Used {
                span,
                obj,
                len,
                gen,
            }) if gen == h.gen() => Ok(Found::At(span, obj, len)),
            Some(Slot::Moved { to, gen }) if gen == h.gen() => Ok(Found::Moved(to)),
            _ => Err(PoolError::BadHandle(h.0)),
        }
    }

    /// Takes a handle-table slot; returns (index, generation).
    fn take_table_slot(&mut self) -> (u32, u32) {
        if self.table_free != FREE_OWNER {
            let idx = self.table_free;
            let Some(Slot::Free { next_free, gen }) = self.slot(idx) else {
                unreachable!("the handle free list only links free slots");
            };
            self.table_free = next_free;
            (idx, gen.wrapping_add(1) & GEN_MASK)
        } else {
            if self.table.len() == self.table.capacity() {
                // Grow by an eighth: less slack than doubling, still amortised O(1).
                self.table.reserve_exact((self.table.len() / 8).max(64));
            }
            self.table.push(PackedSlot(
                PackedSlot::head(TAG_FREE, 0) | u64::from(FREE_OWNER),
            ));
            ((self.table.len() - 1) as u32, 0)
        }
    }

    /// Puts handle-table slot `idx` (of generation `gen`) on the free list.
    fn put_table_slot(&mut self, idx: u32, gen: u32) {
        let free_head = self.table_free;
        self.set_slot(
            idx,
            Slot::Free {
                next_free: free_head,
                gen,
            },
        );
        self.table_free = idx;
    }

    /// Heap bytes of the class's bookkeeping (handle table, span list and each live span's
    /// slot arrays), from capacities; not the spans' memory.
    fn metadata_bytes(&self) -> usize {
        use std::mem::size_of;
        let live = self.spans.len() - self.free_span_ids.len();
        // A hash map's bucket: key, value and a control byte, at up to 7/8 load.
        let moved = self.moved.capacity() * 8 / 7 * (size_of::<(u32, Handle)>() + 1);
        self.table.capacity() * size_of::<PackedSlot>()
            + moved
            + self.spans.capacity() * size_of::<Option<Span>>()
            + self.free_span_ids.capacity() * size_of::<u32>()
            + self.partial.capacity() * size_of::<u32>()
            + live * self.bitmap_bytes()
    }

    /// The handle-table index owning each object slot (`span * objs_per_span + obj`), or
    /// `FREE_OWNER`: built from the table when compaction needs it, instead of kept per span.
    fn owner_map(&self) -> Vec<u32> {
        let mut owners = vec![FREE_OWNER; self.spans.len() * self.objs_per_span];
        for idx in 0..self.table.len() as u32 {
            if let Some(Slot::Used { span, obj, .. }) = self.slot(idx) {
                if let Some(o) = owners.get_mut(span as usize * self.objs_per_span + obj as usize) {
                    *o = idx;
                }
            }
        }
        owners
    }

    /// Free object slots in this class's partly filled spans.
    fn free_slots(&self) -> usize {
        self.partial
            .iter()
            .filter_map(|&id| self.spans.get(id as usize).and_then(Option::as_ref))
            .map(|s| self.objs_per_span - s.inuse as usize)
            .sum()
    }
}

/// The pool: size classes, each behind its own lock.
#[derive(Debug)]
pub struct Pool {
    /// Distinct classes, smallest first.
    classes: Box<[Mutex<Class>]>,
    /// For each 16-byte size step, the class that serves it. Like zsmalloc, neighbouring sizes
    /// whose spans would have the same page count and object count share the larger class:
    /// fewer classes means fewer partly filled spans.
    class_of_size: Box<[u16]>,
    total_bytes: AtomicU64,
    compacted_pages: AtomicU64,
}

fn class_index(len: usize) -> usize {
    if len <= MIN_ALLOC {
        0
    } else {
        (len - MIN_ALLOC).div_ceil(CLASS_DELTA)
    }
}

impl Pool {
    /// A pool whose spans have at most `max_span_pages` pages (zsmalloc's chain size, 1..=16).
    pub fn new(max_span_pages: usize) -> Pool {
        let max_span_pages = max_span_pages.clamp(1, 16);
        let all: Vec<Class> = (0..NR_CLASSES)
            .map(|i| Class::new(MIN_ALLOC + i * CLASS_DELTA, max_span_pages))
            .collect();
        // Walk from the largest size down, merging a size into the class above it when both
        // would lay out spans alike (zsmalloc's `can_merge`).
        let mut kept: Vec<Class> = Vec::new();
        let mut class_of_size = vec![0u16; NR_CLASSES];
        for (i, c) in all.into_iter().enumerate().rev() {
            let merge = kept.last().is_some_and(|up| {
                up.span_bytes == c.span_bytes && up.objs_per_span == c.objs_per_span
            });
            if !merge {
                kept.push(c);
            }
            class_of_size[i] = (kept.len() - 1) as u16;
        }
        kept.reverse();
        let n = kept.len();
        for slot in class_of_size.iter_mut() {
            *slot = (n - 1) as u16 - *slot;
        }
        Pool {
            classes: kept.into_iter().map(Mutex::new).collect(),
            class_of_size: class_of_size.into_boxed_slice(),
            total_bytes: AtomicU64::new(0),
            compacted_pages: AtomicU64::new(0),
        }
    }

    /// Stores `data` and returns its handle.
    pub fn alloc(&self, data: &[u8]) -> Result<Handle, PoolError> {
        if data.len() > MAX_OBJECT {
            return Err(PoolError::TooLarge {
                len: data.len(),
                max: MAX_OBJECT,
            });
        }
        let ci = usize::from(self.class_of_size[class_index(data.len())]);
        let mut class = self.classes[ci].lock();
        let Some((span_id, obj, grown)) = class.alloc_obj() else {
            return Err(PoolError::ClassFull {
                class_size: class.size,
            });
        };
        let range = class.obj_range(obj);
        let (idx, gen) = class.take_table_slot();
        class.set_slot(
            idx,
            Slot::Used {
                span: span_id,
                obj,
                len: data.len() as u16,
                gen,
            },
        );
        {
            let Some(Some(span)) = class.spans.get_mut(span_id as usize) else {
                unreachable!("alloc_obj returned a live span");
            };
            span.mem[range.start..range.start + data.len()].copy_from_slice(data);
        }
        class.objects += 1;
        class.object_bytes += data.len() as u64;
        drop(class);
        if grown > 0 {
            self.total_bytes.fetch_add(grown as u64, Ordering::Relaxed);
        }
        Ok(Handle::new(ci, gen, idx))
    }

    /// Copies the object named by `h` into `out` (cleared first).
    pub fn read(&self, h: Handle, out: &mut Vec<u8>) -> Result<(), PoolError> {
        out.clear();
        self.read_append(h, out)
    }

    /// Appends the object named by `h` to `out` (the chunks of a multi-page object are read
    /// one after the other into one buffer).
    pub(crate) fn read_append(&self, h: Handle, out: &mut Vec<u8>) -> Result<(), PoolError> {
        self.with_object(h, |class, span_id, obj, len| {
            let Some(Some(span)) = class.spans.get(span_id as usize) else {
                return Err(PoolError::BadHandle(h.0));
            };
            let start = class.obj_range(obj).start;
            out.extend_from_slice(&span.mem[start..start + len as usize]);
            Ok(())
        })
    }

    /// Runs `f` on the object named by `h` (span, object index, length) under its class lock,
    /// following the moves of compaction. A handle that names nothing live is `BadHandle`.
    fn with_object<T>(
        &self,
        h: Handle,
        mut f: impl FnMut(&mut Class, u32, u16, u16) -> Result<T, PoolError>,
    ) -> Result<T, PoolError> {
        let mut at = h;
        for _ in 0..=self.classes.len() {
            let mut class = self
                .classes
                .get(at.class())
                .ok_or(PoolError::BadHandle(h.0))?
                .lock();
            match class.lookup(at).map_err(|_| PoolError::BadHandle(h.0))? {
                Found::At(span, obj, len) => return f(&mut class, span, obj, len),
                Found::Moved(to) if to.class() > at.class() => at = to,
                Found::Moved(_) => break,
            }
        }
        Err(PoolError::BadHandle(h.0))
    }

    /// Length of the object named by `h`.
    pub fn object_len(&self, h: Handle) -> Result<usize, PoolError> {
        self.with_object(h, |_, _, _, len| Ok(len as usize))
    }

    /// Frees the object named by `h` (and the forwarding slots compaction left on its way).
    pub fn free(&self, h: Handle) -> Result<(), PoolError> {
        let mut at = h;
        for _ in 0..=self.classes.len() {
            let mut class = self
                .classes
                .get(at.class())
                .ok_or(PoolError::BadHandle(h.0))?
                .lock();
            match class.lookup(at).map_err(|_| PoolError::BadHandle(h.0))? {
                Found::At(span_id, obj, len) => {
                    return self.free_at(&mut class, at, span_id, obj, len);
                }
                Found::Moved(to) if to.class() > at.class() => {
                    class.put_table_slot(at.idx(), at.gen());
                    at = to;
                }
                Found::Moved(_) => break,
            }
        }
        Err(PoolError::BadHandle(h.0))
    }

    fn free_at(
        &self,
        class: &mut Class,
        h: Handle,
        span_id: u32,
        obj: u16,
        len: u16,
    ) -> Result<(), PoolError> {
        class.put_table_slot(h.idx(), h.gen());
        class.objects -= 1;
        class.object_bytes -= u64::from(len);
        let released = class.free_obj(span_id, obj);
        if released > 0 {
            self.total_bytes
                .fetch_sub(released as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Bytes of span memory the pool holds (the kernel's `pool_total_size`).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes.load(Ordering::Relaxed)
    }

    /// Sum of the stored objects' lengths.
    pub fn object_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.lock().object_bytes).sum()
    }

    /// Heap bytes of the pool's bookkeeping: handle tables, span lists, per-span slot arrays
    /// (computed from capacities; the spans' memory is [`Pool::total_bytes`]).
    pub fn metadata_bytes(&self) -> usize {
        self.usage().1 as usize
    }

    /// ([`Pool::object_bytes`], [`Pool::metadata_bytes`]) in one pass over the classes.
    pub(crate) fn usage(&self) -> (u64, u64) {
        self.classes.iter().fold((0, 0), |(o, m), c| {
            let c = c.lock();
            (o + c.object_bytes, m + c.metadata_bytes() as u64)
        })
    }

    /// Number of stored objects.
    pub fn objects(&self) -> u64 {
        self.classes.iter().map(|c| c.lock().objects).sum()
    }

    /// Number of distinct size classes (after merging).
    pub fn nr_classes(&self) -> usize {
        self.classes.len()
    }

    /// Pages released by compaction so far (zsmalloc's `pages_compacted`).
    pub fn compacted_pages(&self) -> u64 {
        self.compacted_pages.load(Ordering::Relaxed)
    }

    /// Moves objects out of the emptiest spans into the fullest ones, class by class, and frees
    /// the spans that empties (zsmalloc's `zs_compact`). Then, unlike zsmalloc, what a class
    /// still holds in partly filled spans (about one span per class, which weighs most in a
    /// small pool) moves up into free slots of larger classes, when that empties a span for
    /// less padding than half the span; the old handle forwards to the new place. Handles stay
    /// valid. Returns the bytes released.
    pub fn compact(&self) -> u64 {
        self.compact_with(true)
    }

    /// zsmalloc's compaction alone: objects move only within their class.
    pub fn compact_in_classes(&self) -> u64 {
        self.compact_with(false)
    }

    fn compact_with(&self, across_classes: bool) -> u64 {
        let mut released = 0u64;
        for lock in self.classes.iter() {
            let mut class = lock.lock();
            released += compact_class(&mut class) as u64;
        }
        if across_classes {
            for ci in 0..self.classes.len().saturating_sub(1) {
                released += self.migrate_up(ci) as u64;
            }
        }
        if released > 0 {
            self.total_bytes.fetch_sub(released, Ordering::Relaxed);
            self.compacted_pages
                .fetch_add(released / PAGE_SIZE as u64, Ordering::Relaxed);
        }
        released
    }

    /// Empties partly filled spans of class `ci`, emptiest first, into free slots of the
    /// partly filled spans of larger classes (smallest first; never a new span), as long as one
    /// span's objects fit and cost less than half a span of padding. Returns the bytes released.
    /// Lock order: class `ci`, then larger classes one at a time (every other path holds one
    /// class lock at most).
    fn migrate_up(&self, ci: usize) -> usize {
        let mut src = self.classes[ci].lock();
        let mut released = 0;
        // Built once: only this function changes `src` while it holds its lock, and it only
        // moves objects out.
        let mut owners: Option<Vec<u32>> = None;
        while let Some(&span_id) = src.partial.iter().min_by_key(|&&id| {
            src.spans
                .get(id as usize)
                .and_then(Option::as_ref)
                .map_or(u32::MAX, |s| s.inuse)
        }) {
            let inuse = src
                .spans
                .get(span_id as usize)
                .and_then(Option::as_ref)
                .map_or(0, |s| s.inuse as usize);
            // Plan: how many objects go to which larger class.
            let budget = src.span_bytes / 2;
            let (mut need, mut pad, mut plan) = (inuse, 0usize, Vec::new());
            for cj in ci + 1..self.classes.len() {
                if need == 0 || pad > budget {
                    break;
                }
                let dst = self.classes[cj].lock();
                let take = dst.free_slots().min(need);
                if take > 0 {
                    pad += take * (dst.size - src.size);
                    plan.push((cj, take));
                    need -= take;
                }
            }
            if need > 0 || pad > budget {
                break;
            }
            if owners.is_none() {
                owners = Some(src.owner_map());
            }
            let owners = owners.as_deref().unwrap_or_default();
            for (cj, take) in plan {
                let mut dst = self.classes[cj].lock();
                for _ in 0..take {
                    match move_up(&mut src, owners, span_id, &mut dst, cj) {
                        Some(bytes) => released += bytes,
                        None => break,
                    }
                }
            }
            if src.spans.get(span_id as usize).is_some_and(Option::is_some) {
                // Slots taken meanwhile by allocations: stop here, nothing is lost.
                break;
            }
        }
        released
    }

    /// XORs `mask` into byte `offset` (modulo the object length) of the object named by `h`:
    /// corrupts stored data on purpose, for the fuzz target and the corruption tests.
    #[doc(hidden)]
    pub fn corrupt(&self, h: Handle, offset: usize, mask: u8) -> Result<(), PoolError> {
        self.with_object(h, |class, span_id, obj, len| {
            let start = class.obj_range(obj).start;
            if len == 0 {
                return Ok(());
            }
            let Some(Some(span)) = class.spans.get_mut(span_id as usize) else {
                return Err(PoolError::BadHandle(h.0));
            };
            span.mem[start + offset % len as usize] ^= mask;
            Ok(())
        })
    }

    /// Full consistency walk (redb's `check_integrity`): every used slot is owned by exactly one
    /// handle, counts and partial lists agree, accounted bytes match the spans held.
    #[doc(hidden)]
    pub fn check_integrity(&self) -> Result<(), String> {
        let mut total = 0u64;
        let mut moved = Vec::new();
        for (ci, lock) in self.classes.iter().enumerate() {
            let class = lock.lock();
            let mut objects = 0u64;
            let mut bytes = 0u64;
            let mut owners = vec![FREE_OWNER; class.spans.len() * class.objs_per_span];
            let mut nr_moved = 0;
            for idx in 0..class.table.len() as u32 {
                match class.slot(idx) {
                    Some(Slot::Moved { to, .. }) => {
                        if to.class() <= ci {
                            return Err(format!(
                                "class {ci}: handle {idx} forwards down to {to:?}"
                            ));
                        }
                        nr_moved += 1;
                        moved.push(to);
                    }
                    Some(Slot::Used { span, obj, len, .. }) => {
                        let s = class.spans.get(span as usize).and_then(Option::as_ref);
                        let s =
                            s.ok_or(format!("class {ci}: handle {idx} names dead span {span}"))?;
                        let at = span as usize * class.objs_per_span + obj as usize;
                        if obj as usize >= class.objs_per_span
                            || !s.is_used(class.span_bytes, obj)
                            || owners[at] != FREE_OWNER
                        {
                            return Err(format!(
                                "class {ci}: handle {idx} names slot {span}/{obj}, free or \
                                 named twice"
                            ));
                        }
                        owners[at] = idx;
                        if len as usize > class.size {
                            return Err(format!(
                                "class {ci}: object of {len} in class {}",
                                class.size
                            ));
                        }
                        objects += 1;
                        bytes += u64::from(len);
                    }
                    _ => {}
                }
            }
            if nr_moved != class.moved.len() {
                return Err(format!(
                    "class {ci}: {nr_moved} forwarding slots, {} targets",
                    class.moved.len()
                ));
            }
            if objects != class.objects || bytes != class.object_bytes {
                return Err(format!(
                    "class {ci}: counters disagree with the handle table"
                ));
            }
            let mut used = 0u64;
            for (id, s) in class.spans.iter().enumerate() {
                let Some(s) = s else { continue };
                total += class.span_bytes as u64;
                let bits: u32 = s
                    .bitmap(class.span_bytes)
                    .iter()
                    .map(|b| b.count_ones())
                    .sum();
                let owned = owners[id * class.objs_per_span..(id + 1) * class.objs_per_span]
                    .iter()
                    .filter(|&&o| o != FREE_OWNER)
                    .count();
                if owned as u32 != s.inuse || bits != s.inuse || s.inuse == 0 {
                    return Err(format!(
                        "class {ci}: span {id} inuse {} owned {owned} bitmap {bits}",
                        s.inuse
                    ));
                }
                let partial = s.inuse as usize != class.objs_per_span;
                let p = s.partial_pos;
                let listed =
                    p != NOT_PARTIAL && class.partial.get(p as usize) == Some(&(id as u32));
                if partial != listed || (!partial && p != NOT_PARTIAL) {
                    return Err(format!("class {ci}: span {id} partial list wrong"));
                }
                used += u64::from(s.inuse);
            }
            if used != class.objects {
                return Err(format!(
                    "class {ci}: spans hold {used} objects, counted {}",
                    class.objects
                ));
            }
        }
        if total != self.total_bytes() {
            return Err(format!(
                "spans hold {total} bytes, accounted {}",
                self.total_bytes()
            ));
        }
        for to in moved {
            self.object_len(to)
                .map_err(|e| format!("a forwarding slot leads nowhere: {e}"))?;
        }
        Ok(())
    }
}

/// Moves one object of span `span_id` of `src` into a free slot of a partly filled span of
/// `dst` (class index `cj`), leaving a forwarding slot under the old handle. `owners` is
/// `src`'s [`Class::owner_map`]. Returns the span bytes released in `src` (0 or a span), or None
/// when there is nothing to move or no room.
fn move_up(
    src: &mut Class,
    owners: &[u32],
    span_id: u32,
    dst: &mut Class,
    cj: usize,
) -> Option<usize> {
    if dst.partial.is_empty() {
        return None;
    }
    let span = src.spans.get(span_id as usize).and_then(Option::as_ref)?;
    let obj = span.first_used(src.span_bytes)?;
    let owner = owners[span_id as usize * src.objs_per_span + obj as usize];
    let Some(Slot::Used { len, gen, .. }) = src.slot(owner) else {
        unreachable!("a used object slot has a used handle");
    };
    let from = src.obj_range(obj).start;
    let (dspan, dobj, grown) = dst.alloc_obj()?;
    debug_assert_eq!(grown, 0, "a partly filled span was available");
    let (didx, dgen) = dst.take_table_slot();
    let to = dst.obj_range(dobj).start;
    let (Some(Some(s)), Some(Some(d))) = (
        src.spans.get(span_id as usize),
        dst.spans.get_mut(dspan as usize),
    ) else {
        unreachable!("both spans are live");
    };
    d.mem[to..to + len as usize].copy_from_slice(&s.mem[from..from + len as usize]);
    dst.set_slot(
        didx,
        Slot::Used {
            span: dspan,
            obj: dobj,
            len,
            gen: dgen,
        },
    );
    dst.objects += 1;
    dst.object_bytes += u64::from(len);
    src.set_slot(
        owner,
        Slot::Moved {
            to: Handle::new(cj, dgen, didx),
            gen,
        },
    );
    src.objects -= 1;
    src.object_bytes -= u64::from(len);
    Some(src.free_obj(span_id, obj))
}

fn compact_class(class: &mut Class) -> usize {
    let mut released = 0;
    let mut owners: Option<Vec<u32>> = None;
    loop {
        if class.partial.len() < 2 {
            return released;
        }
        // Source: the emptiest partial span; destination: the fullest other one.
        let mut src = class.partial[0];
        let mut dst = class.partial[0];
        let inuse = |c: &Class, id: u32| c.spans[id as usize].as_ref().map_or(0, |s| s.inuse);
        for &id in &class.partial {
            if inuse(class, id) < inuse(class, src) {
                src = id;
            }
            if inuse(class, id) > inuse(class, dst) {
                dst = id;
            }
        }
        if src == dst {
            // All partial spans equally full: pick any other as destination.
            dst = match class.partial.iter().find(|&&id| id != src) {
                Some(&id) => id,
                None => return released,
            };
        }
        // Would moving all of src into the other partial spans free it? Only compact when the
        // free slots elsewhere can take everything in src, otherwise stop (nothing to gain).
        let src_inuse = inuse(class, src) as usize;
        let free_elsewhere: usize = class
            .partial
            .iter()
            .filter(|&&id| id != src)
            .map(|&id| class.objs_per_span - inuse(class, id) as usize)
            .sum();
        if free_elsewhere < src_inuse {
            return released;
        }
        let owners = owners.get_or_insert_with(|| class.owner_map());
        let (span_bytes, objs) = (class.span_bytes, class.objs_per_span);
        // Move objects from src to dst until src is empty or dst is full.
        loop {
            let dst_full = class.spans[dst as usize]
                .as_ref()
                .is_none_or(|s| s.inuse as usize == objs);
            let src_obj = class.spans[src as usize]
                .as_ref()
                .and_then(|s| s.first_used(span_bytes));
            let Some(src_obj) = src_obj else { break };
            if dst_full {
                break;
            }
            let owner = owners[src as usize * objs + src_obj as usize];
            let Some(Slot::Used { len, gen, .. }) = class.slot(owner) else {
                unreachable!("a used object slot has a used handle");
            };
            // Take a slot in dst.
            let Some(dst_obj) = class.spans[dst as usize]
                .as_ref()
                .and_then(|s| s.first_free(span_bytes, objs))
            else {
                break;
            };
            let from = class.obj_range(src_obj);
            let to = class.obj_range(dst_obj);
            let mut tmp = [0u8; PAGE_SIZE];
            if let Some(s) = class.spans[src as usize].as_ref() {
                tmp[..len as usize].copy_from_slice(&s.mem[from.start..from.start + len as usize]);
            }
            if let Some(d) = class.spans[dst as usize].as_mut() {
                d.mem[to.start..to.start + len as usize].copy_from_slice(&tmp[..len as usize]);
                d.set_used(span_bytes, dst_obj, true);
                d.inuse += 1;
            }
            owners[dst as usize * objs + dst_obj as usize] = owner;
            owners[src as usize * objs + src_obj as usize] = FREE_OWNER;
            let dst_now_full = class.spans[dst as usize]
                .as_ref()
                .is_some_and(|s| s.inuse as usize == objs);
            if dst_now_full {
                class.partial_remove(dst);
            }
            class.set_slot(
                owner,
                Slot::Used {
                    span: dst,
                    obj: dst_obj,
                    len,
                    gen,
                },
            );
            released += class.free_obj(src, src_obj);
        }
        if class.spans[src as usize].is_some()
            && class.spans[dst as usize]
                .as_ref()
                .is_some_and(|s| (s.inuse as usize) < objs)
        {
            // dst not full yet src not empty cannot happen; guard against looping forever.
            return released;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_survive_compaction_and_memory_shrinks() {
        let pool = Pool::new(4);
        let mut handles = Vec::new();
        for i in 0..2000u32 {
            let len = 100 + (i as usize % 7) * 3;
            let data: Vec<u8> = (0..len).map(|j| (i as usize * 31 + j) as u8).collect();
            handles.push((pool.alloc(&data).expect("alloc"), data));
        }
        pool.check_integrity().expect("consistent");
        // Free three of every four: spans left sparse.
        let mut kept = Vec::new();
        for (i, (h, d)) in handles.into_iter().enumerate() {
            if i % 4 == 0 {
                kept.push((h, d));
            } else {
                pool.free(h).expect("free");
                assert_eq!(
                    pool.free(h),
                    Err(PoolError::BadHandle(h.0)),
                    "double free detected"
                );
            }
        }
        let before = pool.total_bytes();
        let released = pool.compact();
        pool.check_integrity().expect("consistent after compaction");
        assert!(released > 0 && pool.total_bytes() < before);
        assert!(pool.total_bytes() as f64 <= pool.object_bytes() as f64 * 1.5);
        let mut out = Vec::new();
        for (h, d) in &kept {
            pool.read(*h, &mut out).expect("read after compaction");
            assert_eq!(&out, d);
        }
        for (h, _) in kept {
            pool.free(h).expect("free");
        }
        assert_eq!(pool.total_bytes(), 0);
        pool.check_integrity().expect("empty pool consistent");
    }

    #[test]
    fn compaction_moves_class_tails_up_and_handles_follow() {
        let pool = Pool::new(8);
        // A few objects in each of many classes: every class holds one partly filled span.
        let mut live = Vec::new();
        let mut n = 0usize;
        for round in 0..3 {
            for len in (200..1200).step_by(16) {
                for k in 0..3 {
                    n += 1;
                    let data: Vec<u8> = (0..len).map(|j| (j * 7 + n + k) as u8).collect();
                    live.push((pool.alloc(&data).expect("alloc"), data));
                }
            }
            let before = pool.total_bytes();
            let released = pool.compact();
            pool.check_integrity().expect("consistent after compaction");
            assert_eq!(pool.total_bytes(), before - released);
            if round == 0 {
                assert!(released > 0, "class tails moved up");
            }
            let mut out = Vec::new();
            for (h, d) in &live {
                pool.read(*h, &mut out).expect("read through forwarding");
                assert_eq!(&out, d);
                assert_eq!(pool.object_len(*h), Ok(d.len()));
            }
            // Free every other object (some forwarded, some not), then go again: chains form.
            let mut i = 0;
            live.retain(|(h, _)| {
                i += 1;
                i % 2 == 0 || {
                    pool.free(*h).expect("free");
                    assert_eq!(pool.free(*h), Err(PoolError::BadHandle(h.0)));
                    false
                }
            });
            pool.check_integrity().expect("consistent after frees");
        }
        pool.compact();
        pool.check_integrity()
            .expect("consistent after the last compaction");
        assert!(pool.total_bytes() as f64 <= pool.object_bytes() as f64 * 1.25);
        for (h, _) in live {
            pool.free(h).expect("free");
        }
        assert_eq!(
            (pool.total_bytes(), pool.objects(), pool.object_bytes()),
            (0, 0, 0)
        );
        pool.check_integrity().expect("empty pool consistent");
    }

    #[test]
    fn bad_handles_are_errors() {
        let pool = Pool::new(4);
        let h = pool.alloc(&[1, 2, 3]).expect("alloc");
        let mut out = Vec::new();
        assert!(pool.read(Handle(u64::MAX), &mut out).is_err());
        assert!(
            pool.read(Handle(h.0 ^ (1 << 32)), &mut out).is_err(),
            "wrong generation"
        );
        assert!(
            pool.read(Handle(h.0 + 1), &mut out).is_err(),
            "never allocated"
        );
        assert!(pool.alloc(&[0u8; PAGE_SIZE]).is_err());
        pool.read(h, &mut out).expect("good handle");
        assert_eq!(out, [1, 2, 3]);
    }

    #[test]
    fn merged_classes_serve_every_size() {
        let pool = Pool::new(8);
        assert!(
            pool.nr_classes() < NR_CLASSES,
            "{} classes",
            pool.nr_classes()
        );
        let mut handles = Vec::new();
        for len in 1..=MAX_OBJECT {
            let data = vec![(len % 251) as u8; len];
            handles.push((pool.alloc(&data).expect("alloc"), data));
        }
        pool.check_integrity().expect("consistent");
        let mut out = Vec::new();
        for (h, d) in handles {
            pool.read(h, &mut out).expect("read");
            assert_eq!(out, d);
        }
    }

    #[test]
    fn span_size_minimises_waste() {
        let c = Class::new(2064, 16);
        assert!(
            c.span_bytes % 2064 < c.span_bytes / 20,
            "waste {} of {}",
            c.span_bytes % 2064,
            c.span_bytes
        );
        let c = Class::new(4096, 16);
        assert_eq!(c.span_bytes, PAGE_SIZE);
    }
}
