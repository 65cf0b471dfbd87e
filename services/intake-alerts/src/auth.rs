//! Checking the credentials Alertmanager sends in `Authorization`.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::Error;
use crate::config::AuthConfig;

/// The credentials a request must carry, with secret files already read.
#[derive(Clone)]
pub(crate) enum Credentials {
    /// Anyone may post (only allowed on loopback).
    None,
    /// `Authorization: Bearer <token>`; the SHA-256 of the token.
    Bearer([u8; 32]),
    /// `Authorization: Basic base64(user:password)`; the SHA-256 of
    /// `user:password`.
    Basic([u8; 32]),
}

// Never print the digests: they are as good as the secret for guessing
// offline.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "Credentials::None",
            Self::Bearer(_) => "Credentials::Bearer(..)",
            Self::Basic(_) => "Credentials::Basic(..)",
        })
    }
}

/// Why a request was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No `Authorization` header, or one of another scheme.
    Missing,
    /// Credentials of the right scheme that do not match.
    Wrong,
}

impl Credentials {
    /// Resolves the configured credentials, reading secret files. Prometheus'
    /// own `credentials_file` and `password_file` ignore surrounding
    /// whitespace (a trailing newline, mostly), so this does too, otherwise
    /// the same file would not work on both sides.
    pub(crate) fn load(cfg: &AuthConfig) -> Result<Self, Error> {
        if let Some(token) = &cfg.bearer_token {
            return Ok(Self::Bearer(digest(token.as_bytes())));
        }
        if let Some(path) = &cfg.bearer_token_file {
            let token = read_secret(path)?;
            return Ok(Self::Bearer(digest(token.as_bytes())));
        }
        if let Some(basic) = &cfg.basic {
            let password = match (&basic.password, &basic.password_file) {
                (Some(p), _) => p.clone(),
                (None, Some(path)) => read_secret(path)?,
                (None, None) => {
                    return Err(Error::Invalid(
                        "intake-alerts.auth.basic.password: set `password` or `password-file`"
                            .into(),
                    ));
                }
            };
            return Ok(Self::Basic(digest(
                format!("{}:{password}", basic.username).as_bytes(),
            )));
        }
        Ok(Self::None)
    }

    /// The `WWW-Authenticate` challenge for a refused request.
    pub(crate) fn challenge(&self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Bearer(_) => Some("Bearer realm=\"nisse\""),
            Self::Basic(_) => Some("Basic realm=\"nisse\", charset=\"UTF-8\""),
        }
    }

    /// Checks a request's headers. Both sides are hashed before the
    /// constant-time comparison so that neither the content nor the length
    /// of the secret shows in the response time.
    pub(crate) fn check(&self, headers: &HeaderMap) -> Result<(), Denied> {
        let (scheme, expected) = match self {
            Self::None => return Ok(()),
            Self::Bearer(d) => ("bearer", d),
            Self::Basic(d) => ("basic", d),
        };
        let value = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(Denied::Missing)?;
        let (given_scheme, rest) = value.trim().split_once(' ').ok_or(Denied::Missing)?;
        // The scheme is case-insensitive (RFC 9110 §11.1).
        if !given_scheme.eq_ignore_ascii_case(scheme) {
            return Err(Denied::Missing);
        }
        let rest = rest.trim();
        let presented = match self {
            Self::Basic(_) => base64::engine::general_purpose::STANDARD
                .decode(rest)
                .map_err(|_| Denied::Wrong)?,
            _ => rest.as_bytes().to_vec(),
        };
        if bool::from(digest(&presented).ct_eq(expected)) {
            Ok(())
        } else {
            Err(Denied::Wrong)
        }
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn read_secret(path: &std::path::Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::SecretFile {
        path: path.to_path_buf(),
        source,
    })?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(Error::EmptySecretFile {
            path: path.to_path_buf(),
        });
    }
    Ok(secret.to_string())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;
    use crate::config::BasicAuth;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    fn basic_header(user: &str, pass: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
    }

    fn bearer(token: &str) -> Credentials {
        Credentials::load(&AuthConfig {
            bearer_token: Some(token.into()),
            ..AuthConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn no_credentials_lets_everyone_in() {
        let c = Credentials::load(&AuthConfig::default()).unwrap();
        assert_eq!(c.check(&headers(None)), Ok(()));
        assert_eq!(c.challenge(), None);
    }

    #[test]
    fn bearer_token_is_checked() {
        let c = bearer("s3cret");
        assert_eq!(c.check(&headers(Some("Bearer s3cret"))), Ok(()));
        assert_eq!(c.check(&headers(Some("bearer  s3cret "))), Ok(()));
        assert_eq!(c.check(&headers(Some("Bearer s3cre"))), Err(Denied::Wrong));
        assert_eq!(
            c.check(&headers(Some("Bearer s3cret2"))),
            Err(Denied::Wrong)
        );
        assert_eq!(c.check(&headers(None)), Err(Denied::Missing));
        assert_eq!(
            c.check(&headers(Some(&basic_header("s3cret", "")))),
            Err(Denied::Missing)
        );
        assert_eq!(c.check(&headers(Some("Bearer"))), Err(Denied::Missing));
        assert_eq!(c.challenge(), Some("Bearer realm=\"nisse\""));
    }

    #[test]
    fn basic_auth_is_checked() {
        let c = Credentials::load(&AuthConfig {
            basic: Some(BasicAuth {
                username: "am".into(),
                password: Some("pw".into()),
                password_file: None,
            }),
            ..AuthConfig::default()
        })
        .unwrap();
        assert_eq!(c.check(&headers(Some(&basic_header("am", "pw")))), Ok(()));
        assert_eq!(
            c.check(&headers(Some(&basic_header("am", "px")))),
            Err(Denied::Wrong)
        );
        assert_eq!(
            c.check(&headers(Some(&basic_header("ax", "pw")))),
            Err(Denied::Wrong)
        );
        assert_eq!(
            c.check(&headers(Some("Basic not-base64!"))),
            Err(Denied::Wrong)
        );
        assert_eq!(c.check(&headers(Some("Bearer pw"))), Err(Denied::Missing));
        assert!(c.challenge().unwrap().starts_with("Basic realm=\"nisse\""));
    }

    #[test]
    fn secret_files_are_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let c = Credentials::load(&AuthConfig {
            bearer_token_file: Some(token),
            ..AuthConfig::default()
        })
        .unwrap();
        assert_eq!(c.check(&headers(Some("Bearer s3cret"))), Ok(()));

        let pw = dir.path().join("pw");
        std::fs::write(&pw, "  pw \n").unwrap();
        let c = Credentials::load(&AuthConfig {
            basic: Some(BasicAuth {
                username: "am".into(),
                password: None,
                password_file: Some(pw),
            }),
            ..AuthConfig::default()
        })
        .unwrap();
        assert_eq!(c.check(&headers(Some(&basic_header("am", "pw")))), Ok(()));
    }

    #[test]
    fn empty_or_missing_secret_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let err = Credentials::load(&AuthConfig {
            bearer_token_file: Some(empty.clone()),
            ..AuthConfig::default()
        })
        .unwrap_err();
        assert!(
            err.to_string().contains(&empty.display().to_string()),
            "{err}"
        );

        let missing = dir.path().join("missing");
        let err = Credentials::load(&AuthConfig {
            bearer_token_file: Some(missing.clone()),
            ..AuthConfig::default()
        })
        .unwrap_err();
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
    }
}
