//! Vikunja's webhook signature: `X-Vikunja-Signature` is the lowercase hex
//! HMAC-SHA256 of the raw body keyed with the webhook's secret, with no
//! prefix and no timestamp (`Webhook.sendWebhookPayload`,
//! `pkg/models/webhooks.go`, the same from v0.22 on). Checked in constant
//! time, before anything reads the body.

// The check is the Gitea and Vikunja intakes' one (both send the bare hex
// HMAC-SHA256 of the body), kept in the shared kit.
pub use nisse_intake_kit::signature::sign;
pub(crate) use nisse_intake_kit::signature::{Refused, verify};

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
