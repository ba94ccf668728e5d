//! The hostile-input suite: every finding of the hardening review (issue #9) has a
//! regression test here or, where the finding is inside one crate, next to the code it
//! fixes (the closing note and `spec/limits.md` say where).
//!
//! Tests that run the `aplc` binary go through [`harness`], which caps its address space
//! and wall-clock time: a regression shows up as a failed assertion, never as a hung CI
//! run or an exhausted machine.

mod harness;

mod duplicates;
mod frontend;
mod network;
mod runaway;
mod templates;
