//! The clock and fresh randomness, shared by the store (event ids) and the
//! log (route generations).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the epoch, now.
pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A fresh event id that cannot collide: 96 random bits, URL-safe base64
/// (16 characters). Clients often use 8 random digits; time+pid+counter
/// ids collide across machines and restarts, these do not.
pub fn fresh_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes: [u8; 12] = random_bytes();
    let mut out = String::with_capacity(16);
    for chunk in bytes.chunks(3) {
        let n = (chunk[0] as u32) << 16 | (chunk[1] as u32) << 8 | chunk[2] as u32;
        for shift in [18, 12, 6, 0] {
            out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
        }
    }
    out
}

/// `N` (at most 16) random bytes. Without an entropy source, the clock, the
/// process id and a counter mixed by xxh3: still unique within this
/// process.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    if getrandom::fill(&mut bytes).is_err() {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seed = format!("{}-{}-{n}", now(), std::process::id());
        bytes.copy_from_slice(&xxhash_rust::xxh3::xxh3_128(seed.as_bytes()).to_le_bytes()[..N]);
    }
    bytes
}
