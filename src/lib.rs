//! End-to-end tests of knpubsub live in `tests/`.
