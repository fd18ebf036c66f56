//! The root tests' harness: real binaries under real web servers. It lives
//! in `crates/test-support` (package `kn-test-support`), shared with the
//! other test crates; this module re-exports it so that `mod support;` and
//! `support::Apache`, `support::get`, … read as before.

#![allow(unused_imports)]

pub use kn_test_support::*;
