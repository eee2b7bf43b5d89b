//! What reclaim passes to a shrinker and what a shrinker answers.

use core::fmt;

/// The kernel's `DEF_PRIORITY`: the gentlest reclaim priority. Priority 0 is
/// the most aggressive; each step down doubles the work asked of a shrinker.
pub const DEF_PRIORITY: u32 = 12;

/// The kernel's `SHRINK_BATCH`: objects per `scan_objects` call when a shrinker
/// does not set its own batch.
pub const SHRINK_BATCH: u64 = 128;

/// The kernel's `DEFAULT_SEEKS`: the relative cost of recreating an object.
pub const DEFAULT_SEEKS: u32 = 2;

/// A group (the kernel's memory cgroup) identifier. Groups are created with
/// [`ShrinkerRegistry::create_group`](crate::ShrinkerRegistry::create_group);
/// the root is "no group" (`None` in a [`ShrinkRequest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId(pub(crate) u32);

impl GroupId {
    /// The raw index (ids are reused after a group goes offline).
    pub fn index(self) -> u32 {
        self.0
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "group#{}", self.0)
    }
}

/// A shrinker identifier (the kernel's `shrinker->id`), the bit index in every
/// group's bitmap. Ids are reused after unregistration, lowest free first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShrinkerId(pub(crate) u32);

impl ShrinkerId {
    /// The raw index.
    pub fn index(self) -> u32 {
        self.0
    }
}

impl fmt::Display for ShrinkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shrinker#{}", self.0)
    }
}

/// What `count_objects` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// This many objects could be freed (0: none right now, but keep asking).
    Objects(u64),
    /// No objects at all (the kernel's `SHRINK_EMPTY`): for a group-aware
    /// shrinker, its bit in the group's bitmap is cleared until
    /// [`set_shrinker_bit`](crate::ShrinkerRegistry::set_shrinker_bit) is called again.
    Empty,
}

/// What `scan_objects` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// This many objects were freed.
    Freed(u64),
    /// Cannot make progress now (the kernel's `SHRINK_STOP`): the rest of the
    /// work is deferred to a later shrink.
    Stop,
}

/// The request a shrinker callback receives (the kernel's `struct shrink_control`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShrinkControl {
    /// How many objects `scan_objects` should scan (set before each call).
    pub nr_to_scan: u64,
    /// How many objects `scan_objects` did scan; preset to `nr_to_scan`, the
    /// callback may lower or raise it. A callback that sets 0 ends the batch loop.
    pub nr_scanned: u64,
    /// The group being shrunk (`None`: root/global reclaim). Always `None` for
    /// shrinkers that are not group-aware.
    pub group: Option<GroupId>,
    /// The shard (the kernel's NUMA node) being shrunk; always 0 for shrinkers
    /// that are not shard-aware.
    pub shard: usize,
    /// The reclaim priority, `0..=DEF_PRIORITY` (0 is the most aggressive).
    pub priority: u32,
}

impl ShrinkControl {
    /// A control for calling a shrinker by hand (tests, debugging).
    pub fn new(group: Option<GroupId>, shard: usize, priority: u32) -> Self {
        Self {
            nr_to_scan: 0,
            nr_scanned: 0,
            group,
            shard,
            priority,
        }
    }
}

/// A reclaim callback (the kernel's `count_objects` / `scan_objects` pair).
///
/// Both methods may run concurrently from several shrinking threads, and never
/// run again once the [`ShrinkerHandle`](crate::ShrinkerHandle) has been
/// unregistered. They must not unregister their own handle (that would wait
/// for themselves).
pub trait Shrinker: Send + Sync + 'static {
    /// How many objects could be freed in `sc.group` / `sc.shard`.
    fn count_objects(&self, sc: &ShrinkControl) -> Count;
    /// Try to free up to `sc.nr_to_scan` objects; set `sc.nr_scanned` if a
    /// different number was scanned.
    fn scan_objects(&self, sc: &mut ShrinkControl) -> Scan;
}

/// How a shrinker is registered: its name, cost and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShrinkerConfig {
    pub(crate) name: String,
    pub(crate) seeks: u32,
    pub(crate) batch: u64,
    pub(crate) memcg_aware: bool,
    pub(crate) shard_aware: bool,
}

impl ShrinkerConfig {
    /// A shrinker named `name` (for statistics), with `DEFAULT_SEEKS`, the
    /// default batch, neither group- nor shard-aware.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            seeks: DEFAULT_SEEKS,
            batch: 0,
            memcg_aware: false,
            shard_aware: false,
        }
    }

    /// The relative cost of recreating an object; 0 means "free to recreate,
    /// trim aggressively" (half the objects at every call).
    pub fn seeks(mut self, seeks: u32) -> Self {
        self.seeks = seeks;
        self
    }

    /// Objects per `scan_objects` call; 0 means [`SHRINK_BATCH`].
    pub fn batch(mut self, batch: u64) -> Self {
        self.batch = batch;
        self
    }

    /// Group-aware (the kernel's `SHRINKER_MEMCG_AWARE`): called for group
    /// reclaim when its bit is set in the group's bitmap.
    pub fn memcg_aware(mut self, yes: bool) -> Self {
        self.memcg_aware = yes;
        self
    }

    /// Shard-aware (the kernel's `SHRINKER_NUMA_AWARE`): told which shard is
    /// being reclaimed, with work deferred per shard.
    pub fn shard_aware(mut self, yes: bool) -> Self {
        self.shard_aware = yes;
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn effective_batch(&self) -> u64 {
        if self.batch == 0 {
            SHRINK_BATCH
        } else {
            self.batch
        }
    }
}

/// One shrink walk: which group and shard, at which priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShrinkRequest {
    /// `0..=DEF_PRIORITY`, 0 the most aggressive.
    pub priority: u32,
    /// `None`: the root walk over every shrinker; `Some(g)`: the group walk over
    /// the group-aware shrinkers whose bit is set in `g`'s bitmap.
    pub group: Option<GroupId>,
    /// The shard to shrink (`0..nr_shards`).
    pub shard: usize,
}

impl ShrinkRequest {
    /// A root walk of shard 0 at `priority`.
    pub fn new(priority: u32) -> Self {
        Self {
            priority,
            group: None,
            shard: 0,
        }
    }

    /// The same request for group `group`.
    pub fn group(mut self, group: GroupId) -> Self {
        self.group = Some(group);
        self
    }

    /// The same request for shard `shard`.
    pub fn shard(mut self, shard: usize) -> Self {
        self.shard = shard;
        self
    }
}
