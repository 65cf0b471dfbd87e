//! The bearer token the receiver makes for itself when no credentials are
//! configured, so a fresh installation is never open to every local
//! process: 32 bytes from the operating system's generator, hex-encoded,
//! in a file only its owner can read. Made once and kept: Alertmanager's
//! `credentials_file` points at it, so replacing it would lock Alertmanager
//! out until someone noticed.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use rand::TryRng as _;

use crate::Error;

/// Where the token lives under the data directory.
const TOKEN_FILE: &str = "credentials/alertmanager-webhook.token";

/// Random bytes in a token: 256 bits, beyond guessing.
const TOKEN_BYTES: usize = 32;

/// The file the generated token is kept in, under `data_dir`.
pub fn generated_token_file(data_dir: &Path) -> PathBuf {
    data_dir.join(TOKEN_FILE)
}

/// Makes the token file under `data_dir` unless it exists, and returns its
/// path. An existing file is never rewritten, whatever it holds: reading
/// it (and refusing an empty one) is the caller's. A new one is written
/// whole under a temporary name with mode 0600, then linked into place
/// without replacing anything, so neither a crash nor a second process
/// starting at the same moment leaves a half-written or changed token;
/// its directory is made with mode 0700.
pub fn ensure(data_dir: &Path) -> Result<PathBuf, Error> {
    let path = generated_token_file(data_dir);
    let err = |reason: String| Error::Token {
        path: path.clone(),
        reason,
    };
    let dir = path
        .parent()
        .ok_or_else(|| err("the token file has no directory".into()))?;
    // A directory made by another part of Nisse (the bus's credentials
    // live beside the token) keeps the mode it was given.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
    // Whoever may write the directory may swap the token for one of their
    // own, and then post alerts.
    let mode = std::fs::metadata(dir)
        .map_err(|e| err(format!("cannot read {}: {e}", dir.display())))?
        .permissions()
        .mode();
    if mode & 0o022 != 0 {
        return Err(err(format!(
            "its directory {} is writable by others than its owner (mode {:o}), so anyone could replace the token; `chmod go-w` it",
            dir.display(),
            mode & 0o777
        )));
    }
    if path.exists() {
        warn_if_readable_by_others(&path);
        return Ok(path);
    }

    let mut bytes = [0u8; TOKEN_BYTES];
    rand::rngs::SysRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| err(format!("the system's random generator failed: {e}")))?;
    let mut token = String::with_capacity(2 * TOKEN_BYTES + 1);
    for b in bytes {
        token.push_str(&format!("{b:02x}"));
    }
    token.push('\n');

    // tempfile creates with mode 0600 and `persist_noclobber` links the
    // file into place only if nothing is there yet.
    let mut file = tempfile::Builder::new()
        .prefix(".alertmanager-webhook.token.")
        .tempfile_in(dir)
        .map_err(|e| err(format!("cannot create a file in {}: {e}", dir.display())))?;
    file.write_all(token.as_bytes())
        .and_then(|()| file.as_file().sync_all())
        .map_err(|e| err(e.to_string()))?;
    match file.persist_noclobber(&path) {
        Ok(_) => {}
        // Another process made it first: theirs is the token.
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => return Ok(path),
        Err(e) => return Err(err(e.error.to_string())),
    }
    // The new name must survive a crash too, or the next start would make
    // a token Alertmanager does not have.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| err(format!("cannot sync {}: {e}", dir.display())))?;
    tracing::info!(path = %path.display(), "generated the webhook's bearer token");
    Ok(path)
}

/// An operator may have loosened the file's mode; it still works, but they
/// should know.
fn warn_if_readable_by_others(path: &Path) {
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the webhook's token file is readable by others than its owner; `chmod 600` it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_token_is_made_once_private_and_then_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = ensure(dir.path()).unwrap();
        assert_eq!(
            path,
            dir.path().join("credentials/alertmanager-webhook.token")
        );
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let token = std::fs::read_to_string(&path).unwrap();
        let token = token.trim_end();
        assert_eq!(token.len(), 64, "{token}");
        assert!(token.chars().all(|c| c.is_ascii_hexdigit()), "{token}");

        // Kept on the next start, and never rewritten even when it is not
        // what this code would make.
        assert_eq!(ensure(dir.path()).unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim_end(), token);
        std::fs::write(&path, "operator-chosen\n").unwrap();
        ensure(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "operator-chosen\n");

        // Nothing but the token is left in the directory.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["alertmanager-webhook.token"]);
    }

    #[test]
    fn two_installations_get_different_tokens() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let read = |d: &Path| std::fs::read_to_string(ensure(d).unwrap()).unwrap();
        assert_ne!(read(a.path()), read(b.path()));
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = dir.path().join("credentials");
        std::fs::create_dir(&credentials).unwrap();
        std::fs::set_permissions(&credentials, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ensure(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("writable by others") && err.contains("777"),
            "{err}"
        );
        assert!(!generated_token_file(dir.path()).exists());

        // One others may only pass through (as the bus makes it) is fine,
        // and keeps its mode.
        std::fs::set_permissions(&credentials, std::fs::Permissions::from_mode(0o711)).unwrap();
        let path = ensure(dir.path()).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&credentials), 0o711);
    }

    #[test]
    fn an_unusable_data_directory_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the credentials directory would go.
        std::fs::write(dir.path().join("credentials"), "").unwrap();
        let err = ensure(dir.path()).unwrap_err().to_string();
        assert!(err.contains("alertmanager-webhook.token"), "{err}");
    }
}
