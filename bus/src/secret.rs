//! The one way a secret is read: from a file or an environment variable,
//! at each use (so a rotated secret takes effect at once), trimmed of
//! surrounding whitespace (files end in a newline), an empty one refused,
//! and never logged — every type holding one prints masked.
//!
//! Used for the executor's host secrets, the Matrix password and access
//! token, the webhook's credentials, the model endpoints' API keys and the
//! bus's own credentials.

use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a masked secret shows instead of its value.
pub const MASK: &str = "<redacted>";

/// Where a secret comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Secret {
    /// A file holding it (`/run/secrets/…`).
    File(PathBuf),
    /// An environment variable holding it.
    Env(String),
}

/// Why a secret could not be had. Names the secret's source and what is
/// wrong, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("the secret file {path} cannot be read: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the system said.
        reason: String,
    },
    /// The variable is not set.
    #[error("the secret variable {0} is not set")]
    Unset(String),
    /// It holds nothing but whitespace.
    #[error("the secret {0} is empty")]
    Empty(String),
    /// It is not text where text is needed (an HTTP header, a variable).
    #[error("the secret {0} is not UTF-8 text")]
    NotText(String),
}

impl Secret {
    /// Reads the secret now.
    pub fn read(&self) -> Result<SecretValue, SecretError> {
        let raw = match self {
            Self::File(path) => std::fs::read(path).map_err(|e| SecretError::Unreadable {
                path: path.clone(),
                reason: e.to_string(),
            })?,
            Self::Env(var) => std::env::var_os(var)
                .ok_or_else(|| SecretError::Unset(var.clone()))?
                .into_encoded_bytes(),
        };
        let value = raw.trim_ascii();
        if value.is_empty() {
            return Err(SecretError::Empty(self.to_string()));
        }
        Ok(SecretValue {
            bytes: value.to_vec(),
            source: self.to_string(),
        })
    }

    /// Reads the secret now, as text.
    pub fn read_text(&self) -> Result<String, SecretError> {
        let value = self.read()?;
        String::from_utf8(value.bytes).map_err(|_| SecretError::NotText(value.source))
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Env(var) => write!(f, "variable {var}"),
        }
    }
}

/// A secret's value, as read. Its `Debug` shows where it came from, never
/// what it is; the value is had only by asking for it by name.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue {
    bytes: Vec<u8>,
    source: String,
}

impl SecretValue {
    /// The value.
    pub fn expose(&self) -> &[u8] {
        &self.bytes
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretValue({MASK} from {})", self.source)
    }
}

/// A secret written in the configuration itself (a bus password, a
/// webhook token). It prints masked in `Debug`, so no log line of a
/// configuration can show it; the value is had only by asking for it by
/// name. It serializes as it is, so a configuration round-trips; showing
/// one (`nisse config check`) puts [`SecretString::masked`] in its place.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct SecretString(String);

impl SecretString {
    /// The value.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What a shown configuration holds instead of the value.
    pub fn masked() -> Self {
        Self(MASK.to_string())
    }
}

impl From<&str> for SecretString {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl From<String> for SecretString {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_at_each_use_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  s3cret\n").unwrap();
        let secret = Secret::File(path.clone());
        assert_eq!(secret.read().unwrap().expose(), b"s3cret");
        std::fs::write(&path, "rotated\n").unwrap();
        assert_eq!(secret.read_text().unwrap(), "rotated");
    }

    #[test]
    fn missing_empty_and_unset_secrets_are_errors_naming_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty");
        std::fs::write(&path, " \n\t").unwrap();
        let e = Secret::File(path.clone()).read().unwrap_err().to_string();
        assert!(
            e.contains("empty") && e.contains(&path.display().to_string()),
            "{e}"
        );
        let e = Secret::File(dir.path().join("nope")).read().unwrap_err();
        assert!(matches!(e, SecretError::Unreadable { .. }), "{e}");
        let e = Secret::Env("NISSE_TEST_SURELY_UNSET_VAR".into())
            .read()
            .unwrap_err()
            .to_string();
        assert!(e.contains("NISSE_TEST_SURELY_UNSET_VAR"), "{e}");
    }

    #[test]
    fn values_never_print() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "hunter2").unwrap();
        let value = Secret::File(path).read().unwrap();
        assert!(!format!("{value:?}").contains("hunter2"));
        let inline = SecretString::from("hunter2");
        assert_eq!(format!("{inline:?}"), MASK);
        assert_eq!(format!("{:?}", Some(&inline)), format!("Some({MASK})"));
        let back: SecretString = serde_json::from_str("\"hunter2\"").unwrap();
        assert_eq!(back.expose(), "hunter2");
    }
}
