//! What a check trusts, and what it saw: the rustls client configuration
//! the HTTP and TLS checks share (the system's roots plus a request's CA
//! file, the ring provider), a verifier that keeps the leaf certificate it
//! was shown even when it refuses it, what a check reads from that
//! certificate, and the words for a refusal.

use std::error::Error as StdError;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use x509_parser::extensions::GeneralName;

const SECONDS_PER_DAY: i64 = 86_400;

/// The leaf certificate a handshake presented, once the verifier saw it.
#[derive(Debug, Clone, Default)]
pub(super) struct Leaf(Arc<Mutex<Option<CertificateDer<'static>>>>);

impl Leaf {
    /// The certificate, if the handshake got as far as showing one.
    pub(super) fn get(&self) -> Option<CertificateDer<'static>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, cert: CertificateDer<'static>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(cert);
    }
}

/// A client configuration trusting the system's roots and `ca_file`'s
/// (PEM; empty: none), with the ring provider named here rather than the
/// process default, so a check behaves the same in every process (and in
/// a test that never connected a bus); and where its verifier keeps the
/// leaf it was shown. Read at every call, so a changed CA applies to the
/// next check.
pub(super) async fn client_config(ca_file: &str) -> Result<(ClientConfig, Leaf), String> {
    let ca_file = ca_file.to_string();
    // Reading and parsing the roots is file I/O and a few milliseconds of
    // CPU: off the runtime's threads.
    let roots = tokio::task::spawn_blocking(move || roots(&ca_file))
        .await
        .map_err(|e| format!("reading the trusted CAs: {e}"))??;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("no usable trusted CA: {e}"))?;
    let leaf = Leaf::default();
    let verifier = Keeping {
        inner,
        leaf: leaf.clone(),
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("the TLS provider: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok((config, leaf))
}

/// The system's roots and `ca_file`'s.
fn roots(ca_file: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        // Some unreadable file among the system's certificates does not
        // stop the others from being trusted; a check they would have
        // verified says "unknown issuer".
        tracing::debug!("reading the system's trusted CAs: {e}");
    }
    roots.add_parsable_certificates(native.certs);
    if !ca_file.is_empty() {
        let unreadable = |e: pem::Error| match e {
            // Without pem's "I/O error: " in front: the OS's words say it.
            pem::Error::Io(e) => format!("cannot read the CA file {ca_file}: {e}"),
            e => format!("cannot read the CA file {ca_file}: {e}"),
        };
        let certs = CertificateDer::pem_file_iter(ca_file)
            .map_err(unreadable)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(unreadable)?;
        if certs.is_empty() {
            return Err(format!("the CA file {ca_file} holds no PEM certificate"));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("a certificate in the CA file {ca_file} is unusable: {e}"))?;
        }
    }
    Ok(roots)
}

/// rustls's own verifier, keeping the leaf it was shown: a check that
/// refuses a certificate still says how long it had left.
#[derive(Debug)]
struct Keeping {
    inner: Arc<WebPkiServerVerifier>,
    leaf: Leaf,
}

impl ServerCertVerifier for Keeping {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.leaf.set(end_entity.clone().into_owned());
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Why a certificate was refused, in words, from what rustls said.
/// `None` for every error that is not about the certificate.
pub(super) fn refusal(e: &rustls::Error) -> Option<Refusal> {
    let rustls::Error::InvalidCertificate(e) = e else {
        return None;
    };
    Some(match e {
        CertificateError::NotValidForName => Refusal::NotForName(Vec::new()),
        CertificateError::NotValidForNameContext { presented, .. } => {
            Refusal::NotForName(presented.clone())
        }
        CertificateError::UnknownIssuer => Refusal::UnknownIssuer,
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => Refusal::Expired,
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            Refusal::NotValidYet
        }
        other => Refusal::Other(format!("{other:?}")),
    })
}

/// Why a certificate was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Not valid for the name asked for; the names it is for, when known.
    NotForName(Vec<String>),
    /// No trusted CA signed it.
    UnknownIssuer,
    /// Past its notAfter.
    Expired,
    /// Before its notBefore.
    NotValidYet,
    /// Anything else rustls refuses a certificate for.
    Other(String),
}

/// The first error of type `T` in `e`'s chain. It also looks inside
/// `io::Error`s, whose `source()` skips the error they wrap: that is where
/// rustls's and the socket's errors sit under reqwest's and hyper's.
pub(super) fn find<'a, T: StdError + 'static>(e: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<T>() {
            return Some(t);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            && let Some(t) = find::<T>(inner)
        {
            return Some(t);
        }
        next = e.source();
    }
    None
}

/// What a check reads from a leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Certificate {
    /// Whole days until its notAfter, rounded down (negative once past);
    /// `None` when it could not be parsed.
    pub(super) days_left: Option<i64>,
    /// The DNS names and IP addresses it is for.
    pub(super) names: Vec<String>,
}

impl Certificate {
    pub(super) fn read(der: &CertificateDer<'_>) -> Self {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return Self {
                days_left: None,
                names: Vec::new(),
            };
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let left = cert.validity().not_after.timestamp().saturating_sub(now);
        let names = match cert.subject_alternative_name() {
            Ok(Some(san)) => san
                .value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some((*d).to_string()),
                    GeneralName::IPAddress(ip) => ip_text(ip),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Self {
            // Rounded down, so "2 days" never overstates what is left and
            // an hour past expiry reads as -1.
            days_left: Some(left.div_euclid(SECONDS_PER_DAY)),
            names,
        }
    }
}

fn ip_text(bytes: &[u8]) -> Option<String> {
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(ip.to_string())
}

/// " (it is for a, b)": the names a certificate refused for another name
/// is for, read from it, else as rustls reported them; empty when neither
/// knows.
pub(super) fn is_for(cert: Option<&Certificate>, presented: &[String]) -> String {
    let names: Vec<String> = match cert {
        Some(c) if !c.names.is_empty() => c.names.clone(),
        // rustls's words are its types' debug forms (`DnsName("nas")`).
        _ => presented
            .iter()
            .map(|p| {
                p.split_once("(\"")
                    .and_then(|(_, rest)| rest.strip_suffix("\")"))
                    .unwrap_or(p)
                    .to_string()
            })
            .collect(),
    };
    if names.is_empty() {
        String::new()
    } else {
        format!(" (it is for {})", names.join(", "))
    }
}
