//! RFC 8291 message encryption for Web Push, in RFC 8188's `aes128gcm`
//! content coding, as one record.
//!
//! The ECDH, HKDF and AES-GCM are RustCrypto's; this module only assembles
//! the info strings and the header the two RFCs define.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes128Gcm, Nonce};
use hkdf::Hkdf;
use p256::ecdh::diffie_hellman;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use p256::{PublicKey, SecretKey};
use rand_core::{OsRng, RngCore};
use sha2::Sha256;

use crate::error::{Error, ErrorKind, Result};
use crate::subscription::Subscription;

/// The bytes RFC 8188 adds to a payload in one record: the header (salt 16,
/// record size 4, key id length 1, the sender's public key 65), the padding
/// delimiter (1) and the AEAD tag (16).
pub const OVERHEAD: usize = 16 + 4 + 1 + 65 + 1 + 16;

/// Encrypts `plaintext` for `subscription` (RFC 8291 section 3.4) with a
/// fresh sender key pair and salt, as one `aes128gcm` record: the body of
/// a push message, `plaintext.len() + OVERHEAD` bytes long.
pub fn encrypt(subscription: &Subscription, plaintext: &[u8]) -> Result<Vec<u8>> {
    let sender = SecretKey::random(&mut OsRng);
    let mut salt = [0u8; 16];
    OsRng.fill_bytes(&mut salt);
    encrypt_with(subscription, plaintext, &sender, &salt)
}

/// [`encrypt`] with a given sender key and salt (RFC 8291 Appendix A fixes
/// both): never reuse either for another message.
pub fn encrypt_with(subscription: &Subscription, plaintext: &[u8], sender: &SecretKey, salt: &[u8; 16]) -> Result<Vec<u8>> {
    let ua_public = subscription.p256dh_bytes();
    let ua_key = PublicKey::from_sec1_bytes(&ua_public)
        .map_err(|_| Error::new(ErrorKind::BadInput, "the subscription's p256dh is not a P-256 point"))?;
    let as_public = sender.public_key().to_encoded_point(false);
    let as_public = as_public.as_bytes();
    let shared = diffie_hellman(sender.to_nonzero_scalar(), ua_key.as_affine());

    // RFC 8291 3.3: combine the ECDH secret with the auth secret.
    let mut key_info = Vec::with_capacity(14 + 65 + 65);
    key_info.extend_from_slice(b"WebPush: info\0");
    key_info.extend_from_slice(&ua_public);
    key_info.extend_from_slice(as_public);
    let mut ikm = [0u8; 32];
    Hkdf::<Sha256>::new(Some(subscription.auth_bytes()), shared.raw_secret_bytes())
        .expand(&key_info, &mut ikm)
        .map_err(|_| crypto("IKM"))?;

    // RFC 8188 2.2 and 2.3: the content encryption key and the nonce.
    let prk = Hkdf::<Sha256>::new(Some(salt), &ikm);
    let mut cek = [0u8; 16];
    prk.expand(b"Content-Encoding: aes128gcm\0", &mut cek).map_err(|_| crypto("CEK"))?;
    let mut nonce = [0u8; 12];
    prk.expand(b"Content-Encoding: nonce\0", &mut nonce).map_err(|_| crypto("nonce"))?;

    // One record, the last: the plaintext, then the delimiter 0x02.
    let mut record = Vec::with_capacity(plaintext.len() + 1);
    record.extend_from_slice(plaintext);
    record.push(2);
    let cipher = Aes128Gcm::new_from_slice(&cek).map_err(|_| crypto("AES key"))?;
    let sealed = cipher.encrypt(&Nonce::from(nonce), record.as_slice()).map_err(|_| crypto("AES-GCM"))?;

    // Any record size at least the record's length will do; 4096 is what
    // browsers send and RFC 8291's example uses.
    let record_size = u32::try_from(sealed.len()).map_err(|_| crypto("record size"))?.max(4096);
    let mut body = Vec::with_capacity(OVERHEAD + plaintext.len());
    body.extend_from_slice(salt);
    body.extend_from_slice(&record_size.to_be_bytes());
    body.push(65);
    body.extend_from_slice(as_public);
    body.extend_from_slice(&sealed);
    Ok(body)
}

fn crypto(what: &str) -> Error {
    Error::new(ErrorKind::Crypto, format!("web push encryption failed deriving the {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;

    fn b64(s: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(s).unwrap()
    }

    /// RFC 8291 Appendix A, byte for byte.
    #[test]
    fn rfc8291_appendix_a_test_vector() {
        let sub = Subscription::parse(
            r#"{"endpoint":"https://push.example.net/push/JzLQ3raZJfFBR0aqvOMsLrt54w4rJUsV",
               "keys":{"p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
                       "auth":"BTBZMqHH6r4Tts7J_aSIgg"}}"#,
        )
        .unwrap();
        let sender = SecretKey::from_slice(&b64("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw")).unwrap();
        let salt: [u8; 16] = b64("DGv6ra1nlYgDCS1FRnbzlw").try_into().unwrap();
        let body = encrypt_with(&sub, b"When I grow up, I want to be a watermelon", &sender, &salt).unwrap();
        assert_eq!(
            URL_SAFE_NO_PAD.encode(&body),
            "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
        );
        assert_eq!(body.len(), 41 + OVERHEAD);
    }

    #[test]
    fn two_messages_never_share_a_key_or_salt() {
        let sub = Subscription::parse(
            r#"{"endpoint":"https://e/x","keys":{"p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4","auth":"BTBZMqHH6r4Tts7J_aSIgg"}}"#,
        )
        .unwrap();
        let a = encrypt(&sub, b"same").unwrap();
        let b = encrypt(&sub, b"same").unwrap();
        assert_ne!(a[..16], b[..16]);
        assert_ne!(a[21..86], b[21..86]);
    }
}
