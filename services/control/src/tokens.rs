//! Operators' control tokens: one bearer token per operator named
//! `control:<name>` on an agent's allowlist, in
//! `<data-dir>/credentials/control/<name>.token` (mode 0600 in a directory
//! of mode 0700, handed to the local user of that name when `nisse up`
//! runs as root), made on first use and never shown anywhere else.
//!
//! The file is the truth: the service reads it at every call, so a token
//! revoked (`nisse control revoke <name>`, which writes a new one in its
//! place) is refused from the next call on, by every replica of the
//! service that reads the same file, with no restart and no cache to
//! expire.
//!
//! A token reads `nisse-control.<name>.<secret>`: its name says whose file
//! to compare it with (no scan of every operator's), and a leaked token
//! is recognisable as what it is by a secret scanner.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use nisse_bus::auth::OperatorName;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// What every token starts with.
const PREFIX: &str = "nisse-control.";

/// The tokens under a data directory's credentials.
#[derive(Debug, Clone)]
pub struct Tokens {
    dir: PathBuf,
}

impl Tokens {
    /// The tokens of the installation whose data directory is `data_dir`.
    pub fn in_data_dir(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("credentials").join("control"),
        }
    }

    /// The directory holding them.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `operator`'s token file.
    pub fn file(&self, operator: &OperatorName) -> PathBuf {
        self.dir.join(format!("{operator}.token"))
    }

    /// `operator`'s token, made when they have none yet. Returns it and
    /// whether it was made now.
    pub fn ensure(&self, operator: &OperatorName) -> nisse_bus::Result<(String, bool)> {
        let path = self.file(operator);
        if let Some(token) = self.read(operator)? {
            return Ok((token, false));
        }
        let token = new_token(operator)?;
        let written = nisse_bus::auth::write_private(&path, format!("{token}\n").as_bytes());
        // Another process may have made it at the same moment (the
        // service starting while `nisse control token` runs): the file is
        // the truth, so what it holds now is the token, whoever wrote it.
        match (self.read(operator)?, written) {
            (Some(held), Ok(())) if held == token => {
                tracing::info!(%operator, file = %path.display(), "made the operator's control token");
                Ok((held, true))
            }
            (Some(held), _) => Ok((held, false)),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Err(nisse_bus::Error::Config(format!(
                "{} vanished as it was written",
                path.display()
            ))),
        }
    }

    /// Revokes `operator`'s token: a new one takes its place, and the old
    /// one is refused from the next call on. Returns the new one.
    pub fn revoke(&self, operator: &OperatorName) -> nisse_bus::Result<String> {
        let path = self.file(operator);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(nisse_bus::Error::Config(format!(
                    "removing {}: {e}",
                    path.display()
                )));
            }
        }
        let (token, _) = self.ensure(operator)?;
        tracing::info!(%operator, "revoked the operator's control token and made a new one");
        Ok(token)
    }

    /// `operator`'s token as its file holds it, if it has one.
    fn read(&self, operator: &OperatorName) -> nisse_bus::Result<Option<String>> {
        let path = self.file(operator);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(nisse_bus::Error::Config(format!(
                "reading {}: {e}",
                path.display()
            ))),
        }
    }

    /// The operator `presented` is the token of, or why it is refused
    /// (said to the caller, so it names no secret).
    pub fn verify(&self, presented: &str) -> Result<OperatorName, Refused> {
        let name = presented
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('.'))
            .map(|(name, _)| name)
            .ok_or(Refused::Malformed)?;
        let operator: OperatorName = name.parse().map_err(|_| Refused::Malformed)?;
        let held = self
            .read(&operator)
            .map_err(|e| {
                tracing::warn!(%operator, "could not read the control token file: {e}");
                Refused::Unknown
            })?
            .ok_or(Refused::Unknown)?;
        // Digests of both, compared in constant time: neither the length
        // nor a prefix of the held token leaks through timing.
        let same: bool = Sha256::digest(presented.as_bytes())
            .ct_eq(&Sha256::digest(held.as_bytes()))
            .into();
        if same {
            Ok(operator)
        } else {
            Err(Refused::Unknown)
        }
    }
}

/// Why a token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No token was given.
    #[error(
        "no control token: send `authorization: Bearer <token>` (`nisse control token <operator>` prints yours)"
    )]
    Missing,
    /// Not the shape of a control token.
    #[error("that is not a control token (they read `nisse-control.<operator>.<secret>`)")]
    Malformed,
    /// Not a token the installation holds now: never one, or revoked.
    #[error("the control token is not valid: unknown, or revoked")]
    Unknown,
    /// A valid token of an operator no agent's allowlist names as
    /// `control:<name>` any more.
    #[error("the token's operator is on no agent's allowlist as `control:<name>`")]
    NotAnOperator,
}

/// A new token for `operator`: 32 random bytes, base64url.
fn new_token(operator: &OperatorName) -> nisse_bus::Result<String> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret)
        .map_err(|e| nisse_bus::Error::Config(format!("no randomness for a token: {e}")))?;
    Ok(format!(
        "{PREFIX}{operator}.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> OperatorName {
        "alice".parse().unwrap()
    }

    #[test]
    fn a_token_is_its_operators_until_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::in_data_dir(dir.path());
        let (token, made) = tokens.ensure(&alice()).unwrap();
        assert!(made);
        assert_eq!(tokens.ensure(&alice()).unwrap(), (token.clone(), false));
        assert_eq!(tokens.verify(&token), Ok(alice()));
        let new = tokens.revoke(&alice()).unwrap();
        assert_ne!(new, token);
        assert_eq!(tokens.verify(&token), Err(Refused::Unknown));
        assert_eq!(tokens.verify(&new), Ok(alice()));
    }

    #[test]
    fn anything_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::in_data_dir(dir.path());
        let (token, _) = tokens.ensure(&alice()).unwrap();
        let bob = token.replacen("alice", "bob", 1);
        for (presented, why) in [
            ("", Refused::Malformed),
            ("Bearer x", Refused::Malformed),
            ("nisse-control.alice", Refused::Malformed),
            ("nisse-control.../etc/passwd.x", Refused::Malformed),
            (bob.as_str(), Refused::Unknown),
            (&token[..token.len() - 1], Refused::Unknown),
            (&format!("{token}x"), Refused::Unknown),
        ] {
            assert_eq!(tokens.verify(presented), Err(why), "{presented:?}");
        }
    }

    #[test]
    fn makers_at_the_same_moment_agree_on_one_token() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::in_data_dir(dir.path());
        let made: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| tokens.ensure(&alice()).map(|(t, _)| t)))
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().unwrap().ok())
                .collect()
        });
        let held = tokens.ensure(&alice()).unwrap().0;
        assert!(!made.is_empty());
        assert!(made.iter().all(|t| *t == held), "{made:?} / {held}");
        assert_eq!(tokens.verify(&held), Ok(alice()));
    }

    #[test]
    fn the_file_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::in_data_dir(dir.path());
        tokens.ensure(&alice()).unwrap();
        let mode = std::fs::metadata(tokens.file(&alice()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
