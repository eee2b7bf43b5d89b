//! `mglru`: see README.md. Filled in by its own issue.
#![deny(unsafe_op_in_unsafe_fn)]
