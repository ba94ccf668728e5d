//! Hostile input: frontend. See issue #9 and `spec/limits.md`.

#[allow(unused_imports)]
use crate::harness::{Caps, aplc, aplc_in, fixture, scratch, write};
