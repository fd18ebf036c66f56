//! The clock and fresh randomness, shared by the store (event ids) and the
//! log (route generations).

use std::cell::RefCell;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

/// How many bytes a thread's generator gives before it is seeded again.
const RESEED_BYTES: usize = 64 << 10;

/// Counts `fork`s of this process (from a `pthread_atfork` handler), so
/// that a child never goes on with its parent's generator: the two would
/// then make the same ids. Our own programs never fork without `exec`,
/// but programs embedding the crate may.
static FORKS: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// How many draws a thread takes straight from the kernel before it
/// seeds a generator of its own (see [`random_bytes`]).
const DIRECT_DRAWS: u8 = 8;

/// `N` (at most 16) random bytes. A thread's first [`DIRECT_DRAWS`] come
/// straight from the kernel (one `getrandom` system call each): a CGI
/// process draws one or two ids in its life, and seeding a generator
/// costs it more than that (rand's ChaCha asks the CPU for its features
/// with `CPUID`, which traps to the hypervisor on a VM, and the getrandom
/// crate, in a static binary, opens and polls `/dev/random` and reads
/// `/dev/urandom`). After that, from this thread's ChaCha12 generator
/// (rand's `StdRng`), seeded from the operating system (getrandom) on
/// first use, every [`RESEED_BYTES`] and after a `fork`: one system call
/// per thread rather than one per event id. Without an entropy source, the
/// clock, the process id and a counter mixed by xxh3: still unique within
/// this process.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    struct Generator {
        rng: StdRng,
        given: usize,
        forks: u64,
    }
    thread_local! {
        static GENERATOR: RefCell<Option<Generator>> = const { RefCell::new(None) };
        static DIRECT: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
    }
    let mut bytes = [0u8; N];
    let direct = DIRECT.try_with(|d| {
        let n = d.get();
        n < DIRECT_DRAWS && {
            d.set(n + 1);
            kernel_random(&mut bytes)
        }
    });
    if direct == Ok(true) {
        return bytes;
    }
    static AT_FORK: Once = Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only adds to an atomic, which
        // is async-signal-safe as a child's fork handler must be.
        unsafe {
            libc::pthread_atfork(None, None, Some(forked));
        }
    });
    let drawn = GENERATOR.try_with(|cell| {
        let mut generator = cell.try_borrow_mut().ok()?;
        let forks = FORKS.load(Ordering::Relaxed);
        let stale = generator.as_ref().is_none_or(|g| g.given >= RESEED_BYTES || g.forks != forks);
        if stale {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).ok()?;
            *generator = Some(Generator { rng: StdRng::from_seed(seed), given: 0, forks });
        }
        let generator = generator.as_mut()?;
        generator.rng.fill_bytes(&mut bytes);
        generator.given += N;
        Some(())
    });
    if !matches!(drawn, Ok(Some(()))) {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let seed = format!("{}-{}-{n}", now(), std::process::id());
        bytes.copy_from_slice(&xxhash_rust::xxh3::xxh3_128(seed.as_bytes()).to_le_bytes()[..N]);
    }
    bytes
}

/// Fills `bytes` from the kernel's generator with one `getrandom` system
/// call (the C library's wrapper: no file opened, never blocking once the
/// kernel's pool is initialised); false when it cannot (then the thread's
/// generator is used).
fn kernel_random(bytes: &mut [u8]) -> bool {
    // SAFETY: the kernel writes at most `bytes.len()` bytes into `bytes`.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_NONBLOCK) };
    n == bytes.len() as isize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_before_and_after_the_generator_takes_over() {
        // The first DIRECT_DRAWS from the kernel, the rest from StdRng.
        let ids: std::collections::HashSet<String> = (0..4 * DIRECT_DRAWS as usize).map(|_| fresh_id()).collect();
        assert_eq!(ids.len(), 4 * DIRECT_DRAWS as usize);
        assert!(ids.iter().all(|id| id.len() == 16));
    }
}
