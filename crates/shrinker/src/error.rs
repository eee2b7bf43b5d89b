//! Errors.

use crate::control::{GroupId, ShrinkerId};

/// What can go wrong when using a [`ShrinkerRegistry`](crate::ShrinkerRegistry).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShrinkerError {
    /// A registry needs at least one shard.
    #[error("a registry needs at least one shard (got 0)")]
    NoShards,
    /// The shard is not below the registry's shard count.
    #[error("shard {shard} out of range: the registry has {nr_shards} shards (0..{nr_shards})")]
    ShardOutOfRange {
        /// The shard asked for.
        shard: usize,
        /// The registry's shard count.
        nr_shards: usize,
    },
    /// The priority is above `DEF_PRIORITY`.
    #[error("priority {priority} out of range: allowed 0..={max}")]
    PriorityOutOfRange {
        /// The priority asked for.
        priority: u32,
        /// `DEF_PRIORITY`.
        max: u32,
    },
    /// No online group has this id.
    #[error("{0} is not an online group")]
    UnknownGroup(GroupId),
    /// A group with online children cannot go offline.
    #[error("{group} still has online child {child}: offline the children first")]
    GroupHasChildren {
        /// The group asked to go offline.
        group: GroupId,
        /// One of its online children.
        child: GroupId,
    },
    /// No registered shrinker has this id.
    #[error("{0} is not registered")]
    UnknownShrinker(ShrinkerId),
    /// Group bitmaps only track group-aware shrinkers.
    #[error("{0} is not group-aware (register it with ShrinkerConfig::memcg_aware(true))")]
    NotMemcgAware(ShrinkerId),
    /// Ids are exhausted.
    #[error("too many {what}: at most {max}")]
    TooMany {
        /// "shrinkers" or "groups".
        what: &'static str,
        /// The limit.
        max: usize,
    },
}
