//! The agent's SSH identity: made on first use when the operator has not
//! configured one, so a fresh installation has a key to authorize on its
//! hosts (`nisse ssh-key` prints it) instead of failing at the first
//! command.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;

use russh::keys::ssh_key::LineEnding;
use russh::keys::{Algorithm, PrivateKey};

/// Why the identity could not be read or made.
#[derive(Debug, thiserror::Error)]
#[error("the agent's SSH key {path}: {reason}")]
pub struct IdentityError {
    /// The key file.
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

/// The public key (`ssh-ed25519 AAAA… nisse-<agent>`) of the private key
/// at `path`, making an ed25519 key there first when `create` and there
/// is none. Returns the line and whether the key was made now. A new key
/// is written with mode 0600 in a directory of mode 0700, its public half
/// beside it as `<path>.pub`.
pub fn ensure_key(path: &Path, agent: &str, create: bool) -> Result<(String, bool), IdentityError> {
    let err = |reason: String| IdentityError {
        path: path.display().to_string(),
        reason,
    };
    if path.exists() || !create {
        let key = russh::keys::load_secret_key(path, None).map_err(|e| err(e.to_string()))?;
        let public = key
            .public_key()
            .to_openssh()
            .map_err(|e| err(e.to_string()))?;
        return Ok((public, false));
    }
    let mut key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)
        .map_err(|e| err(format!("cannot generate a key: {e}")))?;
    key.set_comment(format!("nisse-{agent}"));
    let private = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| err(e.to_string()))?;
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| err(e.to_string()))?;
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
    }
    // Created exclusively with its final mode: never readable by others,
    // and never over a key another process made meanwhile.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| err(e.to_string()))?;
    file.write_all(private.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| err(e.to_string()))?;
    let pub_path = path.with_extension("pub");
    std::fs::write(&pub_path, format!("{public}\n"))
        .map_err(|e| err(format!("cannot write {}: {e}", pub_path.display())))?;
    Ok((public, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_then_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agents/ops/ssh/id_ed25519");
        let (public, made) = ensure_key(&path, "ops", true).unwrap();
        assert!(made);
        assert!(
            public.starts_with("ssh-ed25519 ") && public.ends_with(" nisse-ops"),
            "{public}"
        );
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (again, made) = ensure_key(&path, "ops", true).unwrap();
        assert!(!made);
        assert_eq!(again, public);
        assert_eq!(
            std::fs::read_to_string(path.with_extension("pub"))
                .unwrap()
                .trim(),
            public
        );
        // Not made where the operator named a key that is not there.
        let missing = dir.path().join("configured");
        let e = ensure_key(&missing, "ops", false).unwrap_err();
        assert!(e.to_string().contains("configured"), "{e}");
    }
}
