//! kn-journal's benchmarks (`benches/journal.rs`, BENCHMARKS.md beside
//! kn-journal) and property tests (`tests/properties.rs`): a crate of
//! their own so that criterion and proptest, dev-dependencies, are not
//! built for kn-journal's examples (`cargo run -p kn-journal --example
//! post_and_tail` builds kn-journal and its dependencies only).
