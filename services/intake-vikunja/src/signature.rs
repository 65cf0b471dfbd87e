//! Vikunja's webhook signature: `X-Vikunja-Signature` is the lowercase hex
//! HMAC-SHA256 of the raw body keyed with the webhook's secret, with no
//! prefix and no timestamp (`Webhook.sendWebhookPayload`,
//! `pkg/models/webhooks.go`, the same from v0.22 on). Checked in constant
//! time, before anything reads the body.

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// Why a signature is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
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
pub(crate) fn verify(secret: &[u8], body: &[u8], signature: &str) -> Result<(), Refused> {
    let expected = hex32(signature.trim()).ok_or(Refused::Malformed)?;
    // HMAC takes a key of any length: new_from_slice cannot fail here.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| Refused::Wrong)?;
    mac.update(body);
    mac.verify_slice(&expected).map_err(|_| Refused::Wrong)
}

/// The signature Vikunja would send for `body` with `secret` (for tests
/// and the operator's own checks).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_known_hmac_sha256() {
        // RFC 4231, test case 2.
        let sig = sign(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            verify(b"Jefe", b"what do ya want for nothing?", &sig),
            Ok(())
        );
    }

    #[test]
    fn refuses_tampered_bodies_other_secrets_and_junk() {
        let sig = sign(b"s3cret", b"{\"a\":1}");
        assert_eq!(verify(b"s3cret", b"{\"a\":2}", &sig), Err(Refused::Wrong));
        assert_eq!(verify(b"other", b"{\"a\":1}", &sig), Err(Refused::Wrong));
        // Vikunja sends the bare hex: a `sha256=` prefix is not its.
        assert_eq!(
            verify(b"s3cret", b"{\"a\":1}", &format!("sha256={sig}")),
            Err(Refused::Malformed)
        );
        assert_eq!(
            verify(b"s3cret", b"{\"a\":1}", &sig[..62]),
            Err(Refused::Malformed)
        );
        let mut bad = sig.clone();
        bad.replace_range(0..1, "g");
        assert_eq!(
            verify(b"s3cret", b"{\"a\":1}", &bad),
            Err(Refused::Malformed)
        );
    }
}
