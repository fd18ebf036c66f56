//! The fuzz targets of `fuzz/` without a fuzzer: every committed corpus
//! input (`fuzz/corpus/<target>/`, which keeps each crash the fuzzer ever
//! found, named `crash-*`) runs through the same target function that
//! libFuzzer drives, then a few thousand deterministic mutations of it.
//! A parser regression fails `cargo test --workspace` even where
//! cargo-fuzz is not installed; the long coverage-guided runs are
//! `cargo fuzz run <target>` (fuzz/README.md).

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod kn_fuzz;

use std::path::PathBuf;

/// Mutations tried per target: a few seconds in all in a debug build.
const MUTATIONS: usize = 3_000;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            (path, bytes)
        })
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no seed input", dir.display());
    inputs
}

/// xorshift64*: the same mutations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Tokens that hostile input is made of.
const TOKENS: &[&[u8]] = &[
    b"%", b"%2e", b"%2E%2e", b"%252e", b"%c0%ae", b"%c0%af", b"%00", b"%5c", b"..", b"/", b"\\", b"\0", b"=", b"=3A", b"=0",
    b":", b"\n", b"\r\n", b"\n\n", b"&", b";", b"+", b"\xff", b"\xc0\xae", b"kn_payload", b"kn_id", b"4294967295", b"0\n",
    b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff",
];

/// Tokens that hostile requests are made of (the `request_handle` target).
const REQUEST_TOKENS: &[&[u8]] = &[
    b"&", b";", b"=", b"%", b"%FF", b"%00", b"%2B", b"\n", b"\n\n", b"?", b"/", b"..", b"kn_expires=", b"do_max_n=",
    b"do_max_age=", b"do_since_checkpoint=", b"kn_to=", b"kn_from=", b"kn_id=", b"kn_response_format=sse", b"do_method=",
    b"kn_batch=", b"99999999999999999999", b"18446744073709551616", b"-1", b"+", b"1e309", b"NaN", b"inf", b"infinity",
    b".", b"0", b"/kn_journal", b"javascript:", b"Last-Event-ID: ", b"Host: ",
];

fn mutate_with(rng: &mut Rng, input: &[u8], tokens: &[&[u8]]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(5) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 => out.truncate(at),
            2 => {
                let token = tokens[rng.below(tokens.len())];
                out.splice(at..at, token.iter().copied());
            }
            3 if !out.is_empty() => {
                let end = (at + 1 + rng.below(8)).min(out.len());
                let start = at.min(end);
                out.drain(start..end);
            }
            _ => out.insert(at.min(out.len()), rng.next() as u8),
        }
    }
    out
}

fn replay(target: &str) {
    replay_with(target, MUTATIONS, TOKENS);
}

fn replay_with(target: &str, mutations: usize, tokens: &[&[u8]]) {
    let inputs = corpus(target);
    for (path, bytes) in &inputs {
        let result = std::panic::catch_unwind(|| kn_fuzz::run(target, bytes));
        assert!(matches!(result, Ok(true)), "{target} fails on corpus input {}", path.display());
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64);
    for n in 0..mutations {
        let (_, seed) = &inputs[n % inputs.len()];
        let input = mutate_with(&mut rng, seed, tokens);
        let result = std::panic::catch_unwind(|| kn_fuzz::run(target, &input));
        assert!(result.is_ok(), "{target} fails on a mutation of its corpus: {:?}", String::from_utf8_lossy(&input));
    }
}

#[test]
fn every_target_has_a_corpus() {
    for target in kn_fuzz::TARGETS {
        assert!(!corpus(target).is_empty());
    }
}

#[test]
fn form_parser_survives_its_corpus() {
    replay("form_parse");
}

#[test]
fn simple_codec_survives_its_corpus() {
    replay("simple_codec");
}

#[test]
fn record_decoder_survives_its_corpus() {
    replay("record_decode");
}

#[test]
fn legacy_event_parser_survives_its_corpus() {
    replay("legacy_event");
}

#[test]
fn topic_canonicalisation_survives_its_corpus() {
    replay("topic_parse");
}

#[test]
fn response_writer_survives_its_corpus() {
    replay_with("response_head", MUTATIONS, HEADER_TOKENS);
}

/// Tokens that hostile header text is made of (the `response_head`
/// target): line ends, NUL, DEL, the field separator and what an injected
/// header or body would start with.
const HEADER_TOKENS: &[&[u8]] = &[
    b"\r", b"\n", b"\r\n", b"\r\n\r\n", b"\0", b"\x7f", b"\t", b"\xff", b":", b": ", b" ", b"\"", b"\\", b"Set-Cookie: a=b",
    b"Content-Type: text/html", b"<script>", b"\xce\xba", b"\xc2\x85", b"\xe2\x80\xa8", b"Status: 200 OK",
];

#[test]
fn request_handler_survives_its_corpus() {
    // Each input opens a store and is handled twice (serve and CGI paths):
    // fewer mutations keep this to seconds.
    replay_with("request_handle", 1_000, REQUEST_TOKENS);
}
