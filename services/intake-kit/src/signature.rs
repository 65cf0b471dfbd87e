//! The webhooks' signature: Gitea (`X-Gitea-Signature`) and Vikunja
//! (`X-Vikunja-Signature`) both send the hex HMAC-SHA256 of the raw body
//! keyed with the webhook's secret, so the check is one, in constant
//! time, before anything reads the body. Which header carries it stays
//! the service's.

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// Why a signature is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not 64 hex digits.
    Malformed,
    /// Not the body's HMAC with the secret.
    Wrong,
}

/// Decodes 64 hex digits (either case) into 32 bytes.
fn hex32(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

/// Checks `signature` (the header's value) against `body` keyed with
/// `secret`; the comparison takes the same time wherever they differ.
pub fn verify(secret: &[u8], body: &[u8], signature: &str) -> Result<(), Refused> {
    let expected = hex32(signature.trim()).ok_or(Refused::Malformed)?;
    // HMAC takes a key of any length: new_from_slice cannot fail here.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| Refused::Wrong)?;
    mac.update(body);
    mac.verify_slice(&expected).map_err(|_| Refused::Wrong)
}

/// The signature the service would send for `body` with `secret`
/// (lowercase hex; for tests and the operator's own checks).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return String::new();
    };
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
