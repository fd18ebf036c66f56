//! The hashes of an htpasswd file (`serve --htpasswd`), as Apache 2.4's
//! `htpasswd` writes them and Apache on Linux checks them
//! (`apr_password_validate`): bcrypt (`-B`), SHA-256/512-crypt (`-2`,
//! `-5`), Apache's MD5 `$apr1$` (`-m`, the default) and the unsalted
//! `{SHA}` (`-s`). Plain text (`-p`) is refused: Apache hands an unknown
//! hash to `crypt(3)` on Linux, so it never accepts one either. DES crypt
//! (`-d`) is refused too: it reads only a password's first 8 characters,
//! Apache's own documentation discourages it, and no maintained Rust crate
//! checks it (docs/ACCESS.md).

use base64::Engine as _;
use md5::{Digest as _, Md5};

/// What kind of hash `hash` is; `Err` says why serve cannot check it.
pub(crate) fn kind(hash: &str) -> Result<Kind, &'static str> {
    if hash.starts_with(APR1) {
        return parse_apr1(hash).map(|_| Kind::Apr1).ok_or("a malformed Apache MD5 ('$apr1$') hash");
    }
    if let Some(digest) = hash.strip_prefix(SHA) {
        let decoded = base64::engine::general_purpose::STANDARD.decode(digest).ok();
        return match decoded {
            Some(bytes) if bytes.len() == 20 => Ok(Kind::Sha1),
            _ => Err("a malformed '{SHA}' hash"),
        };
    }
    if ["$2y$", "$2a$", "$2b$"].iter().any(|p| hash.starts_with(p)) {
        return Ok(Kind::Bcrypt);
    }
    if ["$5$", "$6$"].iter().any(|p| hash.starts_with(p)) {
        return Ok(Kind::ShaCrypt);
    }
    if hash.len() == 13 && hash.bytes().all(|b| ITOA64.contains(&b)) {
        return Err(DES_CRYPT);
    }
    Err("no hash serve (or Apache on Linux) can check: plain text ('htpasswd -p') or an unknown scheme")
}

/// The kinds of hash [`kind`] accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// bcrypt (`$2y$`, `$2a$`, `$2b$`): the `bcrypt` crate's.
    Bcrypt,
    /// SHA-256-crypt (`$5$`) or SHA-512-crypt (`$6$`): RustCrypto's
    /// `sha-crypt`.
    ShaCrypt,
    /// Apache's MD5 (`$apr1$salt$digest`).
    Apr1,
    /// `{SHA}` and the base64 of the password's SHA-1.
    Sha1,
}

/// True when `password` is the one `hash` was made from. A hash [`kind`]
/// refuses matches no password.
pub(crate) fn verify(password: &str, hash: &str) -> bool {
    match kind(hash) {
        Ok(Kind::Bcrypt) => bcrypt::verify(password, hash).unwrap_or(false),
        Ok(Kind::ShaCrypt) => {
            use sha_crypt::PasswordVerifier as _;
            sha_crypt::ShaCrypt::default().verify_password(password.as_bytes(), hash).is_ok()
        }
        Ok(Kind::Apr1) => parse_apr1(hash).is_some_and(|(salt, _)| same(apr1(password, salt).as_bytes(), hash.as_bytes())),
        Ok(Kind::Sha1) => {
            let digest = sha1::Sha1::digest(password.as_bytes());
            let made = format!("{SHA}{}", base64::engine::general_purpose::STANDARD.encode(digest));
            same(made.as_bytes(), hash.as_bytes())
        }
        Err(_) => false,
    }
}

const APR1: &str = "$apr1$";
/// Why a DES crypt line is refused (`htpasswd -d`): the user is told to set
/// the password again with `htpasswd -B` (auth.rs).
pub(crate) const DES_CRYPT: &str = "a DES crypt hash ('htpasswd -d'), which reads only the first 8 characters of a password and serve does not check";
const SHA: &str = "{SHA}";

/// The salt and digest of `$apr1$salt$digest` (a salt of 1-8 characters,
/// a digest of 22), if `hash` is one.
fn parse_apr1(hash: &str) -> Option<(&str, &str)> {
    let (salt, digest) = hash.strip_prefix(APR1)?.split_once('$')?;
    let crypt64 = |s: &str| s.bytes().all(|b| ITOA64.contains(&b));
    (!salt.is_empty() && salt.len() <= 8 && crypt64(salt) && digest.len() == 22 && crypt64(digest)).then_some((salt, digest))
}

/// Apache's MD5 of `password` with `salt`: `$apr1$salt$digest`, the
/// FreeBSD MD5-crypt with Apache's magic (APR's `apr_md5_encode`).
fn apr1(password: &str, salt: &str) -> String {
    let pw = password.as_bytes();
    let mut alternate = Md5::new();
    alternate.update(pw);
    alternate.update(salt);
    alternate.update(pw);
    let alternate = alternate.finalize();

    let mut ctx = Md5::new();
    ctx.update(pw);
    ctx.update(APR1);
    ctx.update(salt);
    for chunk in pw.chunks(16) {
        ctx.update(&alternate[..chunk.len()]);
    }
    // One byte per bit of the length: a zero byte for a 1, the password's
    // first byte for a 0 (APR's quirk, kept by every implementation).
    let mut i = pw.len();
    while i != 0 {
        ctx.update(if i & 1 == 1 { &[0u8][..] } else { &pw[..1] });
        i >>= 1;
    }
    let mut digest = ctx.finalize();

    // 1,000 rounds to make guessing slow.
    for round in 0..1000 {
        let mut ctx = Md5::new();
        if round & 1 == 1 {
            ctx.update(pw);
        } else {
            ctx.update(digest);
        }
        if round % 3 != 0 {
            ctx.update(salt);
        }
        if round % 7 != 0 {
            ctx.update(pw);
        }
        if round & 1 == 1 {
            ctx.update(digest);
        } else {
            ctx.update(pw);
        }
        digest = ctx.finalize();
    }

    let d = digest;
    let mut out = format!("{APR1}{salt}$");
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        crypt64(&mut out, u32::from(d[a]) << 16 | u32::from(d[b]) << 8 | u32::from(d[c]), 4);
    }
    crypt64(&mut out, u32::from(d[11]), 2);
    out
}

/// crypt(3)'s base64 alphabet.
const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Appends the `n` low 6-bit groups of `v`, least significant first.
fn crypt64(out: &mut String, mut v: u32, n: usize) {
    for _ in 0..n {
        out.push(char::from(ITOA64[(v & 0x3f) as usize]));
        v >>= 6;
    }
}

/// Equal bytes, compared in a time that does not depend on where they
/// differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made by Apache's own `htpasswd -nb -m` and `-s` (apache2-utils 2.4);
    // crates/cgi/tests/access.rs runs the real tool through serve.
    const APR1_ANNA: &str = "$apr1$8w0q7ZwU$szvwUt2ZCFKbLqv/z98ir/";

    #[test]
    fn apache_md5_hashes_check_out() {
        assert_eq!(kind(APR1_ANNA), Ok(Kind::Apr1));
        assert!(verify("anna-secret", APR1_ANNA));
        assert!(!verify("anna-secreT", APR1_ANNA));
        assert!(!verify("", APR1_ANNA));
        // Longer than one 16-byte block, empty, and not ASCII.
        assert!(verify("a-password-of-twenty-one", "$apr1$ERkpxnzL$qdr5XvieliKhUpAKSzRwU1"));
        assert!(verify("", "$apr1$p/JiuTQe$vMz2ivDn7cjWxbGB0PdR0/"));
        assert!(!verify("x", "$apr1$p/JiuTQe$vMz2ivDn7cjWxbGB0PdR0/"));
        assert!(verify("é-ünïcode", "$apr1$BlQT8c0f$wNh9.rC6Y2CDXBlKaOw.0."));
    }

    #[test]
    fn sha1_hashes_check_out() {
        assert_eq!(kind("{SHA}zVNrw9Eg7psSPCUDh9eh8Nv24zA="), Ok(Kind::Sha1));
        assert!(verify("anna-secret", "{SHA}zVNrw9Eg7psSPCUDh9eh8Nv24zA="));
        assert!(!verify("anna-secre", "{SHA}zVNrw9Eg7psSPCUDh9eh8Nv24zA="));
        assert!(verify("", "{SHA}2jmj7l5rSw0yVb/vlWAYkK/YBwk="));
    }

    #[test]
    fn malformed_and_plain_text_hashes_are_refused_not_panicking() {
        for hash in [
            "anna-secret",
            "",
            "$apr1$",
            "$apr1$$szvwUt2ZCFKbLqv/z98ir/",
            "$apr1$toolongsalt$szvwUt2ZCFKbLqv/z98ir/",
            "$apr1$8w0q7ZwU$short",
            "$apr1$8w0q7ZwU$szvwUt2ZCFKbLqv/z98ir/x",
            "$apr1$8w0q7ZwU",
            "$apr1$é$szvwUt2ZCFKbLqv/z98ir/",
            "{SHA}",
            "{SHA}not base64!",
            "{SHA}YWJj",
            "$1$abc$def",
        ] {
            assert!(kind(hash).is_err(), "{hash}");
            assert!(!verify("anna-secret", hash), "{hash}");
            assert!(!verify("", hash), "{hash}");
        }
        // Taken for crypt hashes by their look: they match nothing, and
        // nothing panics.
        for hash in ["$2y$05$short", "$2y$", "$5$", "$6$rounds=x$", "$6$$", "$6$rounds=999999999999$a$b"] {
            assert!(matches!(kind(hash), Ok(Kind::Bcrypt | Kind::ShaCrypt)), "{hash}");
            assert!(!verify("anna-secret", hash), "{hash}");
            assert!(!verify("", hash), "{hash}");
        }
    }

    // Made by Apache's own `htpasswd -nbB`, `-nb5` and `-nb2` (apache2-utils
    // 2.4) for anna-secret; crates/cgi/tests/access.rs runs the real tool.
    #[test]
    fn bcrypt_and_sha_crypt_hashes_check_out() {
        for hash in [
            "$2y$05$aQda.HjUtKUvf0qjJW6Tk.oR6W3yP9hDEq4HLbns31q/N40dWeky.",
            "$6$5v8hCvP38xh2mAgH$gLWqDbYpqGx9MIQB77Ys4441.fxofIpbDm7n5/hRdOyX3LrK3P2EZ7S5ltenIB1ZBUgRc/Ra9kPxrHi8.DAFq.",
            "$5$6QHicL8IAVIPt9Mo$kpHSkZD5BAdbx6ZWsW7VqQRKJTdnNWJVkGWv48GQJ92",
        ] {
            assert!(kind(hash).is_ok(), "{hash}");
            assert!(verify("anna-secret", hash), "{hash}");
            assert!(!verify("anna-secreT", hash), "{hash}");
            assert!(!verify("", hash), "{hash}");
        }
        // bcrypt's $2a$ and $2b$ spellings of the same hash.
        assert!(verify("anna-secret", "$2b$05$aQda.HjUtKUvf0qjJW6Tk.oR6W3yP9hDEq4HLbns31q/N40dWeky."));
    }

    #[test]
    fn des_crypt_hashes_are_refused_naming_the_8_character_limit() {
        // `htpasswd -nbd anna anna-secret`.
        let why = kind("Z0RkSXXurQsTI").unwrap_err();
        assert!(why.contains("DES crypt") && why.contains("8 characters"), "{why}");
        assert!(!verify("anna-secret", "Z0RkSXXurQsTI"));
    }
}
