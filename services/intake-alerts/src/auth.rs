//! Checking the credentials Alertmanager sends in `Authorization`.

use std::path::Path;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use nisse_bus::secret::{Secret, SecretError};

use crate::Error;
use crate::config::AuthConfig;

/// The credentials a request must carry.
#[derive(Clone)]
pub(crate) enum Credentials {
    /// Anyone may post (only with `allow-unauthenticated`, on loopback).
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(Expected),
    /// `Authorization: Basic base64(user:password)`.
    Basic(Expected),
}

/// What presented credentials must match: the SHA-256 of the token (or of
/// `user:password`), from the configuration, or from a secret file read at
/// each request so a rotated secret takes effect at once.
#[derive(Clone)]
pub(crate) enum Expected {
    /// Given in the configuration.
    Digest([u8; 32]),
    /// In a file; `prefix` (`user:` for basic auth) goes before its value.
    File { secret: Secret, prefix: String },
}

impl Expected {
    fn digest(&self) -> Result<[u8; 32], SecretError> {
        match self {
            Self::Digest(d) => Ok(*d),
            Self::File { secret, prefix } => {
                let value = secret.read()?;
                let mut text = prefix.as_bytes().to_vec();
                text.extend_from_slice(value.expose());
                Ok(digest(&text))
            }
        }
    }
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No `Authorization` header, or one of another scheme.
    Missing,
    /// Credentials of the right scheme that do not match.
    Wrong,
    /// The expected secret cannot be read now: nobody is let in, and the
    /// caller is told to retry.
    Unavailable(String),
}

impl Credentials {
    /// Resolves the configured credentials. With none configured and
    /// posts not explicitly open, the token generated under `data_dir` is
    /// the bearer token file (made now on the first start). Secret files
    /// are read once here, so a missing or empty one stops the service at
    /// start with an error naming it, and again at every request.
    /// Prometheus' own `credentials_file` and `password_file` ignore
    /// surrounding whitespace (a trailing newline, mostly), and so does the
    /// secret reader, otherwise the same file would not work on both sides.
    pub(crate) fn load(cfg: &AuthConfig, data_dir: &Path) -> Result<Self, Error> {
        if let Some(token) = &cfg.bearer_token {
            return Ok(Self::Bearer(Expected::Digest(digest(
                token.expose().as_bytes(),
            ))));
        }
        let token_file = match &cfg.bearer_token_file {
            Some(path) => Some(path.clone()),
            None if !cfg.is_configured() && !cfg.allow_unauthenticated => {
                Some(crate::token::ensure(data_dir)?)
            }
            None => None,
        };
        if let Some(path) = token_file {
            let expected = Expected::File {
                secret: Secret::File(path),
                prefix: String::new(),
            };
            expected.digest()?;
            return Ok(Self::Bearer(expected));
        }
        if let Some(basic) = &cfg.basic {
            let expected = match (&basic.password, &basic.password_file) {
                (Some(p), _) => Expected::Digest(digest(
                    format!("{}:{}", basic.username, p.expose()).as_bytes(),
                )),
                (None, Some(path)) => Expected::File {
                    secret: Secret::File(path.clone()),
                    prefix: format!("{}:", basic.username),
                },
                (None, None) => {
                    return Err(Error::Invalid(
                        "intake-alerts.auth.basic.password: set `password` or `password-file`"
                            .into(),
                    ));
                }
            };
            expected.digest()?;
            return Ok(Self::Basic(expected));
        }
        Ok(Self::None)
    }

    /// The file the bearer token is read from, when it is read from one
    /// (the generated token, or `bearer-token-file`): what Alertmanager's
    /// `credentials_file` should name.
    pub(crate) fn token_file(&self) -> Option<&Path> {
        match self {
            Self::Bearer(Expected::File {
                secret: Secret::File(path),
                ..
            }) => Some(path),
            _ => None,
        }
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
            Self::Bearer(e) => ("bearer", e),
            Self::Basic(e) => ("basic", e),
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
        let expected = expected
            .digest()
            .map_err(|e| Denied::Unavailable(e.to_string()))?;
        if bool::from(digest(&presented).ct_eq(&expected)) {
            Ok(())
        } else {
            Err(Denied::Wrong)
        }
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
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

    /// A data directory that must not be used: loading configured
    /// credentials never writes a token.
    const NO_DATA_DIR: &str = "/nonexistent/nisse-data";

    fn load(cfg: &AuthConfig) -> Result<Credentials, Error> {
        Credentials::load(cfg, Path::new(NO_DATA_DIR))
    }

    fn bearer(token: &str) -> Credentials {
        load(&AuthConfig {
            bearer_token: Some(token.into()),
            ..AuthConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn no_credentials_means_the_generated_token_is_required() {
        let dir = tempfile::tempdir().unwrap();
        let c = Credentials::load(&AuthConfig::default(), dir.path()).unwrap();
        let path = crate::token::generated_token_file(dir.path());
        assert_eq!(c.token_file(), Some(path.as_path()));
        let token = std::fs::read_to_string(&path).unwrap();
        assert_eq!(c.check(&headers(None)), Err(Denied::Missing));
        assert_eq!(c.check(&headers(Some("Bearer guess"))), Err(Denied::Wrong));
        assert_eq!(
            c.check(&headers(Some(&format!("Bearer {}", token.trim())))),
            Ok(())
        );
        assert_eq!(c.challenge(), Some("Bearer realm=\"nisse\""));

        // The file is read at each request, as a configured one is.
        std::fs::write(&path, "rotated\n").unwrap();
        assert_eq!(c.check(&headers(Some("Bearer rotated"))), Ok(()));
        // And the next start keeps it.
        let again = Credentials::load(&AuthConfig::default(), dir.path()).unwrap();
        assert_eq!(again.check(&headers(Some("Bearer rotated"))), Ok(()));
    }

    #[test]
    fn allow_unauthenticated_lets_everyone_in_and_makes_no_token() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = AuthConfig {
            allow_unauthenticated: true,
            ..AuthConfig::default()
        };
        let c = Credentials::load(&cfg, dir.path()).unwrap();
        assert_eq!(c.check(&headers(None)), Ok(()));
        assert_eq!(c.challenge(), None);
        assert_eq!(c.token_file(), None);
        assert!(!crate::token::generated_token_file(dir.path()).exists());
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
        let c = load(&AuthConfig {
            basic: Some(BasicAuth {
                username: "am".into(),
                password: Some("pw".into()),
                password_file: None,
            }),
            ..AuthConfig::default()
        })
        .unwrap();
        assert_eq!(c.token_file(), None);
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
        let c = load(&AuthConfig {
            bearer_token_file: Some(token.clone()),
            ..AuthConfig::default()
        })
        .unwrap();
        assert_eq!(c.check(&headers(Some("Bearer s3cret"))), Ok(()));
        assert_eq!(c.token_file(), Some(token.as_path()));

        let pw = dir.path().join("pw");
        std::fs::write(&pw, "  pw \n").unwrap();
        let c = load(&AuthConfig {
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
        let err = load(&AuthConfig {
            bearer_token_file: Some(empty.clone()),
            ..AuthConfig::default()
        })
        .unwrap_err();
        assert!(
            err.to_string().contains(&empty.display().to_string()),
            "{err}"
        );

        let missing = dir.path().join("missing");
        let err = load(&AuthConfig {
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
