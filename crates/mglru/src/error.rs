//! Errors of the crate.

use crate::PageId;

/// What went wrong.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is out of its range.
    #[error("invalid configuration: {field} = {value}, allowed: {allowed}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// What is allowed.
        allowed: &'static str,
    },
    /// `add` of a page the policy already holds.
    #[error("page {0:#x} is already resident")]
    AlreadyResident(PageId),
    /// `add` of a page id the multi-generational LRU cannot hold: its nodes keep 52 bits of
    /// the id ([`crate::MAX_PAGE_ID`]).
    #[error("page id {page:#x} is too large: the largest page id is {max:#x} (2^52 - 1)")]
    PageIdTooLarge {
        /// The page id given.
        page: PageId,
        /// The largest allowed, [`crate::MAX_PAGE_ID`].
        max: PageId,
    },
}

/// A bad line of a trace file or a bad replay argument.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayError {
    /// A line that is not a page id.
    #[error("trace line {line}: {content:?} is not a page id (a decimal or 0x-prefixed u64)")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// The offending text (truncated to 64 bytes).
        content: String,
    },
    /// An unknown policy name.
    #[error("unknown policy {0:?}: use mglru, active-inactive, lru or clock")]
    UnknownPolicy(String),
    /// The policy refused a page of the trace (for MGLRU, an id above
    /// [`crate::MAX_PAGE_ID`]); the replay stops there instead of replaying another trace.
    #[error("trace request {request}: {policy} cannot hold the page: {source}")]
    Rejected {
        /// 0-based index of the request in the trace.
        request: usize,
        /// The policy's name.
        policy: String,
        /// Why.
        source: Error,
    },
    /// A capacity of zero pages.
    #[error("capacity must be at least 1 page")]
    ZeroCapacity,
}
