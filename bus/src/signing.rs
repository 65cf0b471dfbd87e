//! The brain's signature on what it asks the executor to run.
//!
//! NATS permissions already keep every identity but a brain off
//! `out.exec.req` and `out.exec.bind`. The signature is the second wall,
//! for when that one is breached (a misconfigured server, a stolen seed):
//! each agent's brain holds an Ed25519 key of its own (made on first
//! start, readable only by the brain) and signs every execution request and
//! host binding over everything that decides what runs — the agent, the
//! work item, the request id, the host, the command or file operation, its
//! standard input, the secrets it names, its timeout, the plan revision and
//! step, the verdict it passed, whether the operator confirmed it, and the
//! time it was made. The executor holds only the public keys: it refuses
//! anything unsigned, signed by another agent's key, altered after signing
//! (a request replayed under a new id included), or older than it accepts,
//! and says which.
//!
//! MCP tool calls and the MCP instances mounted for a work item are signed
//! the same way, for the mcp service to check before it calls anything.
//!
//! Ed25519 signatures are deterministic, so a brain re-processing a
//! message after a crash signs the same bytes the same way.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use ed25519_dalek::{Signer as _, Verifier as _};
use sha2::Digest as _;

use crate::proto::{ExecRequest, HostBinding, McpMount, McpRequest, Signature};
use crate::{Contract, Error, Result};

/// Where an agent's brain keeps its signing key and the public half the
/// executor reads: `<data-dir>/agents/<agent>/brain/signing.key` and
/// `signing.pub`.
pub fn key_files(data_dir: &Path, agent: &str) -> (PathBuf, PathBuf) {
    let dir = data_dir.join("agents").join(agent).join("brain");
    (dir.join("signing.key"), dir.join("signing.pub"))
}

/// A brain's signing key.
#[derive(Clone)]
pub struct SigningKey(ed25519_dalek::SigningKey);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SigningKey").field(&self.public()).finish()
    }
}

impl SigningKey {
    /// The key in `key_file`, made (with `public_file` beside it) when
    /// there is none. Returns whether it was made. The private file is
    /// mode 0600; the public one 0644, for the executor.
    pub fn load_or_create(key_file: &Path, public_file: &Path) -> Result<(Self, bool)> {
        if key_file.exists() {
            let key = Self::load(key_file)?;
            // The public half may have been removed; it is derived again.
            if !public_file.exists() {
                key.public().write(public_file)?;
            }
            return Ok((key, false));
        }
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed)
            .map_err(|e| Error::Config(format!("no randomness for a signing key: {e}")))?;
        let key = Self(ed25519_dalek::SigningKey::from_bytes(&seed));
        let text = format!(
            "{}\n",
            base64::engine::general_purpose::STANDARD.encode(seed)
        );
        crate::auth::write_private(key_file, text.as_bytes())?;
        let _ = std::fs::remove_file(public_file);
        key.public().write(public_file)?;
        Ok((key, true))
    }

    /// Reads a key file (the base64 of the 32-byte seed).
    pub fn load(key_file: &Path) -> Result<Self> {
        let text = crate::secret::Secret::File(key_file.to_path_buf())
            .read_text()
            .map_err(|e| Error::Config(e.to_string()))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| {
                Error::Config(format!(
                    "`{}` is not a signing key (the base64 of 32 bytes)",
                    key_file.display()
                ))
            })?;
        Ok(Self(ed25519_dalek::SigningKey::from_bytes(&bytes)))
    }

    /// A key that lives only in memory: for a rebuild, which publishes
    /// nothing, and tests.
    pub fn ephemeral() -> Self {
        let mut seed = [0u8; 32];
        // Without randomness an all-zero key still signs; nothing it
        // signs is ever published.
        let _ = getrandom::fill(&mut seed);
        Self(ed25519_dalek::SigningKey::from_bytes(&seed))
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key().to_bytes())
    }

    /// Signs `message` in place. Its creation time is part of what is
    /// signed: one without a time gets the current one first (publishing
    /// would otherwise fill it in after signing).
    pub fn sign<M: Signed>(&self, message: &mut M) {
        stamp(message.envelope_mut().as_mut());
        *message.signature_mut() = Some(self.signature(&message.payload()));
    }

    fn signature(&self, payload: &[u8]) -> Signature {
        Signature {
            public_key: self.public().0.to_vec(),
            ed25519: self.0.sign(payload).to_bytes().to_vec(),
        }
    }
}

fn stamp(envelope: Option<&mut crate::proto::Envelope>) {
    if let Some(env) = envelope
        && env.created_at.is_none()
    {
        env.created_at = Some(std::time::SystemTime::now().into());
    }
}

/// A brain's public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; 32]);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl fmt::Display for PublicKey {
    /// `ed25519:<base64>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ed25519:{}",
            base64::engine::general_purpose::STANDARD.encode(self.0)
        )
    }
}

impl PublicKey {
    /// Reads a public key file (`ed25519:<base64>` and a comment).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("reading `{}`: {e}", path.display())))?;
        text.split_whitespace()
            .next()
            .and_then(|w| w.strip_prefix("ed25519:"))
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .map(Self)
            .ok_or_else(|| {
                Error::Config(format!(
                    "`{}` is not a brain's public key (`ed25519:<base64>`)",
                    path.display()
                ))
            })
    }

    fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Config(format!("creating `{}`: {e}", dir.display())))?;
        }
        std::fs::write(path, format!("{self} nisse brain signing key\n"))
            .map_err(|e| Error::Config(format!("writing `{}`: {e}", path.display())))
    }

    fn from_wire(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Self)
    }
}

/// Why a signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// There is none.
    #[error("it is not signed (only the agent's brain makes requests, and it signs each)")]
    Unsigned,
    /// It is signed, but not by the key of the agent whose stream holds it.
    #[error("it is signed by {}, not by the {agent} brain's key", .owner.as_deref().map_or_else(|| "a key no brain here holds".to_string(), |o| format!("the {o} brain's key")))]
    OtherKey {
        /// The agent whose stream holds it.
        agent: String,
        /// Whose key signed it, when it is one of the known ones.
        owner: Option<String>,
        /// The key that signed it, when it is a key at all.
        signer: Option<PublicKey>,
    },
    /// The signature does not match what it says: something was changed
    /// after signing (a field, or the request id it is replayed under).
    #[error("its signature does not match its contents: it was altered after the brain signed it")]
    Altered,
}

impl SignatureError {
    /// The same error, with the owner of the key that signed it named
    /// when `ring` knows it.
    pub fn named_by(self, ring: &Keyring) -> Self {
        match self {
            Self::OtherKey {
                agent,
                owner: None,
                signer: Some(key),
            } => Self::OtherKey {
                agent,
                owner: ring.owner(&key),
                signer: Some(key),
            },
            other => other,
        }
    }
}

/// The first wall of a service that acts for a brain (the executor, the
/// mcp service): a request is signed by the agent's brain, unchanged, and
/// not older than the service accepts, and the records it relies on (a
/// host binding, a mount) are signed by the same brain. Each refusal is
/// the reason to answer with, naming who refused and what was not done.
#[derive(Debug, Clone, Copy)]
pub struct Wall<'a> {
    /// The agent whose stream holds the request.
    pub agent: &'a str,
    /// The brain's public key file, read at each check (a brain that made
    /// its key after the service started is found).
    pub key_file: &'a Path,
    /// Where the brains' public keys are, to name the owner of a key that
    /// signed what it should not have.
    pub data_dir: &'a Path,
    /// The oldest request accepted, by its signed creation time.
    pub max_age: Duration,
    /// Who refuses: "the executor".
    pub who: &'a str,
    /// What was not done: "nothing was run".
    pub nothing_done: &'a str,
}

impl Wall<'_> {
    /// Checks `request` (called `noun`: "the request", "the call") and
    /// returns the brain's key, to check its records with.
    pub fn request<M: Signed>(
        &self,
        noun: &str,
        request: &M,
    ) -> std::result::Result<PublicKey, String> {
        let key = PublicKey::load(self.key_file).map_err(|e| {
            format!(
                "{noun}'s signature cannot be checked: {e} (the {} brain writes its public key when it first starts); {}",
                self.agent, self.nothing_done
            )
        })?;
        self.signed_by(&key, noun, request)?;
        if let Some(age) = age(request.envelope())
            && age > self.max_age
        {
            return Err(format!(
                "refused by {}: {noun} was signed {} ago, longer than it accepts ({}); {}",
                self.who,
                humantime::format_duration(Duration::from_secs(age.as_secs())),
                humantime::format_duration(self.max_age),
                self.nothing_done
            ));
        }
        Ok(key)
    }

    /// Checks that `record` (called `noun`: "the host binding of work item
    /// 7") is signed by `key`, the brain's, and unchanged.
    pub fn signed_by<M: Signed>(
        &self,
        key: &PublicKey,
        noun: &str,
        record: &M,
    ) -> std::result::Result<(), String> {
        verify(self.agent, key, record).map_err(|e| {
            let e = e.named_by(&Keyring::from_data_dir(self.data_dir));
            format!(
                "refused by {}: {noun}: {e}; {}",
                self.who, self.nothing_done
            )
        })
    }
}

/// How long ago a message was made, by its creation time; `None` when it
/// carries none (its signature then covers that too).
fn age(envelope: Option<&crate::proto::Envelope>) -> Option<Duration> {
    let made = envelope?.created_at.as_ref()?;
    let made = std::time::UNIX_EPOCH
        + Duration::new(
            u64::try_from(made.seconds).ok()?,
            u32::try_from(made.nanos).ok()?,
        );
    std::time::SystemTime::now().duration_since(made).ok()
}

/// A message a brain signs: its signature covers what decides its effect
/// (the canonical payload, under a tag of its own, so one kind's bytes
/// never pass for another's), and the agent, work item and time.
pub trait Signed: Contract {
    /// What its signature covers.
    fn payload(&self) -> Vec<u8>;
    /// Its signature, if any.
    fn signature(&self) -> Option<&Signature>;
    /// Where its signature goes.
    fn signature_mut(&mut self) -> &mut Option<Signature>;
}

macro_rules! signed {
    ($($t:ty => $payload:ident),* $(,)?) => {$(
        impl Signed for $t {
            fn payload(&self) -> Vec<u8> {
                $payload(self)
            }
            fn signature(&self) -> Option<&Signature> {
                self.signature.as_ref()
            }
            fn signature_mut(&mut self) -> &mut Option<Signature> {
                &mut self.signature
            }
        }
    )*};
}

signed! {
    ExecRequest => exec_payload,
    HostBinding => binding_payload,
    McpRequest => mcp_payload,
    McpMount => mount_payload,
}

/// Checks that `message` is signed by `expected` (the key of `agent`'s
/// brain) and unchanged since.
pub fn verify<M: Signed>(
    agent: &str,
    expected: &PublicKey,
    message: &M,
) -> std::result::Result<(), SignatureError> {
    check(agent, expected, message.signature(), &message.payload())
}

fn check(
    agent: &str,
    expected: &PublicKey,
    signature: Option<&Signature>,
    payload: &[u8],
) -> std::result::Result<(), SignatureError> {
    let Some(sig) = signature.filter(|s| !s.ed25519.is_empty()) else {
        return Err(SignatureError::Unsigned);
    };
    let signer = PublicKey::from_wire(&sig.public_key);
    if signer != Some(*expected) {
        return Err(SignatureError::OtherKey {
            agent: agent.to_string(),
            owner: None,
            signer,
        });
    }
    let key = ed25519_dalek::VerifyingKey::from_bytes(&expected.0)
        .map_err(|_| SignatureError::Altered)?;
    let sig =
        ed25519_dalek::Signature::from_slice(&sig.ed25519).map_err(|_| SignatureError::Altered)?;
    key.verify(payload, &sig)
        .map_err(|_| SignatureError::Altered)
}

/// The brains' public keys found in a data directory: to say whose key
/// signed a request that is not its agent's.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: Vec<(String, PublicKey)>,
}

impl Keyring {
    /// Every brain's public key under `data_dir/agents/*/brain/`; a key
    /// file that cannot be read is left out.
    pub fn from_data_dir(data_dir: &Path) -> Self {
        let mut keys = Vec::new();
        if let Ok(entries) = std::fs::read_dir(data_dir.join("agents")) {
            for entry in entries.flatten() {
                let agent = entry.file_name().to_string_lossy().into_owned();
                let (_, public) = key_files(data_dir, &agent);
                if let Ok(key) = PublicKey::load(&public) {
                    keys.push((agent, key));
                }
            }
        }
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        Self { keys }
    }

    /// A keyring of the given keys.
    pub fn of(keys: impl IntoIterator<Item = (String, PublicKey)>) -> Self {
        Self {
            keys: keys.into_iter().collect(),
        }
    }

    /// The key of `agent`'s brain.
    pub fn get(&self, agent: &str) -> Option<PublicKey> {
        self.keys.iter().find(|(a, _)| a == agent).map(|(_, k)| *k)
    }

    fn owner(&self, key: &PublicKey) -> Option<String> {
        self.keys
            .iter()
            .find(|(_, k)| k == key)
            .map(|(a, _)| a.clone())
    }
}

/// Fields in a fixed order, each length-prefixed, under a tag saying what
/// they are: no two different requests encode the same, and a request's
/// bytes can never pass for a binding's.
struct Canonical(Vec<u8>);

impl Canonical {
    fn new(tag: &str) -> Self {
        let mut c = Self(Vec::with_capacity(256));
        c.bytes(tag.as_bytes());
        c
    }

    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(&(b.len() as u64).to_be_bytes());
        self.0.extend_from_slice(b);
        self
    }

    fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    fn u64(&mut self, n: u64) -> &mut Self {
        self.bytes(&n.to_be_bytes())
    }

    fn digest(&mut self, b: &[u8]) -> &mut Self {
        self.bytes(&sha2::Sha256::digest(b))
    }

    fn envelope(&mut self, env: Option<&crate::proto::Envelope>) -> &mut Self {
        let env = env.cloned().unwrap_or_default();
        let (secs, nanos) = env.created_at.map_or((0, 0), |t| (t.seconds, t.nanos));
        self.str(&env.agent)
            .str(&env.work_item_id)
            .u64(secs as u64)
            .u64(u64::from(nanos as u32))
    }
}

/// What a request's signature covers.
fn exec_payload(r: &ExecRequest) -> Vec<u8> {
    let mut c = Canonical::new("nisse.v1.ExecRequest/1");
    c.envelope(r.envelope.as_ref())
        .str(&r.request_id)
        .str(&r.host)
        .str(&r.command)
        .digest(&r.stdin)
        .u64(r.secret_names.len() as u64);
    for name in &r.secret_names {
        c.str(name);
    }
    c.u64(r.timeout_ms);
    let p = r.permission.clone().unwrap_or_default();
    c.str(&p.verdict_request_id)
        .u64(u64::from(p.plan_revision))
        .u64(u64::from(p.step))
        .u64(u64::from(p.operator_confirmed));
    match &r.file {
        None => {
            c.u64(0);
        }
        Some(f) => {
            c.u64(1)
                .u64(f.op as u64)
                .str(&f.path)
                .digest(&f.content)
                .str(&f.mode);
        }
    }
    c.0
}

/// What a binding's signature covers.
fn binding_payload(b: &HostBinding) -> Vec<u8> {
    let mut c = Canonical::new("nisse.v1.HostBinding/1");
    c.envelope(b.envelope.as_ref())
        .str(&b.work_item_id)
        .u64(b.hosts.len() as u64);
    for h in &b.hosts {
        c.str(h);
    }
    c.0
}

/// What an MCP tool call's signature covers: everything that decides
/// what is called (the instance, the tool, its arguments as the canonical
/// JSON that was classified and approved, the timeout, what permitted it)
/// and the agent, work item and time. Not the dedup id or the trace.
fn mcp_payload(r: &McpRequest) -> Vec<u8> {
    let mut c = Canonical::new("nisse.v1.McpRequest/1");
    c.envelope(r.envelope.as_ref())
        .str(&r.request_id)
        .str(&r.instance)
        .str(&r.tool)
        .str(&r.arguments_json)
        .u64(r.timeout_ms);
    let p = r.permission.clone().unwrap_or_default();
    c.str(&p.verdict_request_id)
        .u64(u64::from(p.plan_revision))
        .u64(u64::from(p.step))
        .u64(u64::from(p.operator_confirmed));
    c.0
}

/// What a mount's signature covers: the agent, work item and time, the
/// instances in their order and the plan revision they are mounted under
/// (the reason is for people: it decides nothing).
fn mount_payload(m: &McpMount) -> Vec<u8> {
    let mut c = Canonical::new("nisse.v1.McpMount/1");
    c.envelope(m.envelope.as_ref())
        .str(&m.work_item_id)
        .u64(m.instances.len() as u64);
    for i in &m.instances {
        c.str(i);
    }
    c.u64(u64::from(m.plan_revision));
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Envelope, ExecPermission};

    type Change<M> = Box<dyn Fn(&mut M)>;

    /// `make()` is unsigned at first; signed by the ops brain it verifies,
    /// signs the same again (Ed25519 is deterministic, so a re-processed
    /// message signs alike), and fails as altered after any of `changes`.
    /// Returns the ops key and the signed message.
    fn signed_and_sealed<M: Signed + std::fmt::Debug + PartialEq>(
        make: impl Fn() -> M,
        changes: Vec<Change<M>>,
    ) -> (SigningKey, M) {
        let ops = SigningKey::ephemeral();
        let mut m = make();
        assert_eq!(
            verify("ops", &ops.public(), &m),
            Err(SignatureError::Unsigned)
        );
        ops.sign(&mut m);
        assert!(m.envelope().unwrap().created_at.is_some());
        assert_eq!(verify("ops", &ops.public(), &m), Ok(()));
        let mut again = make();
        ops.sign(&mut again);
        assert_eq!(again, m);
        for (n, change) in changes.iter().enumerate() {
            let mut altered = m.clone();
            change(&mut altered);
            assert_eq!(
                verify("ops", &ops.public(), &altered),
                Err(SignatureError::Altered),
                "change {n}"
            );
        }
        (ops, m)
    }

    /// Signed by the dev brain's key, `make()` is refused for ops naming
    /// whose key it is.
    fn another_brains_key_is_named<M: Signed>(make: impl Fn() -> M) {
        let ops = SigningKey::ephemeral();
        let dev = SigningKey::ephemeral();
        let ring = Keyring::of([("ops".into(), ops.public()), ("dev".into(), dev.public())]);
        let mut by_dev = make();
        dev.sign(&mut by_dev);
        let e = verify("ops", &ops.public(), &by_dev)
            .unwrap_err()
            .named_by(&ring);
        assert_eq!(
            e.to_string(),
            "it is signed by the dev brain's key, not by the ops brain's key"
        );
    }

    fn request() -> ExecRequest {
        ExecRequest {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: "wi-1".into(),
                message_id: "exec:r1".into(),
                created_at: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5,
                }),
                ..Default::default()
            }),
            request_id: "r1".into(),
            host: "nas".into(),
            command: "zpool status".into(),
            secret_names: vec!["zfs-api".into()],
            timeout_ms: 1000,
            permission: Some(ExecPermission {
                verdict_request_id: "v1".into(),
                plan_revision: 2,
                step: 1,
                operator_confirmed: false,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_signed_request_verifies_and_any_change_breaks_it() {
        let (ops, r) = signed_and_sealed(
            request,
            vec![
                Box::new(|r| r.request_id = "r2".into()),
                Box::new(|r| r.host = "nas2".into()),
                Box::new(|r| r.command.push_str("; rm -rf /")),
                Box::new(|r| r.stdin = b"x".to_vec()),
                Box::new(|r| r.secret_names.push("other".into())),
                Box::new(|r| r.timeout_ms += 1),
                Box::new(|r| r.permission.as_mut().unwrap().operator_confirmed = true),
                Box::new(|r| r.permission.as_mut().unwrap().verdict_request_id = "v9".into()),
                Box::new(|r| r.permission.as_mut().unwrap().step = 2),
                Box::new(|r| r.envelope.as_mut().unwrap().work_item_id = "wi-2".into()),
                Box::new(|r| r.envelope.as_mut().unwrap().created_at = None),
            ],
        );
        // The dedup id is not what decides what runs.
        let mut redelivered = r.clone();
        redelivered.envelope.as_mut().unwrap().message_id = "exec:other".into();
        assert_eq!(verify("ops", &ops.public(), &redelivered), Ok(()));
        another_brains_key_is_named(request);
    }

    #[test]
    fn keys_are_made_once_and_the_public_half_is_found() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (key, public) = key_files(dir.path(), "ops");
        let (k1, made) = SigningKey::load_or_create(&key, &public).unwrap();
        assert!(made);
        let (k2, made) = SigningKey::load_or_create(&key, &public).unwrap();
        assert!(!made);
        assert_eq!(k1.public(), k2.public());
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let ring = Keyring::from_data_dir(dir.path());
        assert_eq!(ring.get("ops"), Some(k1.public()));
        let mut b = HostBinding {
            work_item_id: "wi-1".into(),
            hosts: vec!["nas".into()],
            ..Default::default()
        };
        k1.sign(&mut b);
        assert_eq!(verify("ops", &k1.public(), &b), Ok(()));
        b.hosts.push("router".into());
        assert_eq!(
            verify("ops", &k1.public(), &b),
            Err(SignatureError::Altered)
        );
    }

    fn mcp_request() -> McpRequest {
        McpRequest {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: "wi-1".into(),
                message_id: "mcp:r1".into(),
                created_at: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5,
                }),
                ..Default::default()
            }),
            request_id: "r1".into(),
            instance: "hv-site-a-elevated".into(),
            tool: "stop_vm".into(),
            arguments_json: r#"{"vm":101}"#.into(),
            timeout_ms: 1000,
            permission: Some(ExecPermission {
                verdict_request_id: "v1".into(),
                plan_revision: 2,
                step: 1,
                operator_confirmed: false,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_signed_mcp_call_verifies_and_any_change_breaks_it() {
        let (ops, r) = signed_and_sealed(
            mcp_request,
            vec![
                Box::new(|r| r.request_id = "r2".into()),
                Box::new(|r| r.instance = "hv-site-b-elevated".into()),
                Box::new(|r| r.tool = "delete_vm".into()),
                Box::new(|r| r.arguments_json = r#"{"vm":102}"#.into()),
                Box::new(|r| r.timeout_ms += 1),
                Box::new(|r| r.permission.as_mut().unwrap().operator_confirmed = true),
                Box::new(|r| r.permission.as_mut().unwrap().verdict_request_id = "v9".into()),
                Box::new(|r| r.permission.as_mut().unwrap().plan_revision = 3),
                Box::new(|r| r.permission.as_mut().unwrap().step = 2),
                Box::new(|r| r.envelope.as_mut().unwrap().work_item_id = "wi-2".into()),
                Box::new(|r| r.envelope.as_mut().unwrap().agent = "dev".into()),
                Box::new(|r| r.envelope.as_mut().unwrap().created_at = None),
            ],
        );
        let mut redelivered = r.clone();
        redelivered.envelope.as_mut().unwrap().message_id = "mcp:other".into();
        assert_eq!(verify("ops", &ops.public(), &redelivered), Ok(()));
        another_brains_key_is_named(mcp_request);
    }

    #[test]
    fn a_signed_mount_verifies_and_any_change_breaks_it() {
        let mount = || McpMount {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: "wi-1".into(),
                message_id: "mount:wi-1:1".into(),
                created_at: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5,
                }),
                ..Default::default()
            }),
            work_item_id: "wi-1".into(),
            instances: vec!["hv-site-a-ro".into()],
            reason: "read-only by default".into(),
            plan_revision: 0,
            ..Default::default()
        };
        let (ops, m) = signed_and_sealed(
            mount,
            vec![
                Box::new(|m| m.work_item_id = "wi-2".into()),
                Box::new(|m| m.instances.push("hv-site-a-elevated".into())),
                Box::new(|m| m.instances[0] = "hv-site-b-ro".into()),
                Box::new(|m| m.plan_revision = 1),
                Box::new(|m| m.envelope.as_mut().unwrap().work_item_id = "wi-2".into()),
                Box::new(|m| m.envelope.as_mut().unwrap().created_at = None),
            ],
        );
        another_brains_key_is_named(mount);
        // The reason explains; it decides nothing.
        let mut explained = m.clone();
        explained.reason = "another wording".into();
        assert_eq!(verify("ops", &ops.public(), &explained), Ok(()));
        // A binding's signature never passes for a mount's.
        let mut b = HostBinding {
            envelope: m.envelope.clone(),
            work_item_id: "wi-1".into(),
            hosts: vec!["hv-site-a-ro".into()],
            ..Default::default()
        };
        ops.sign(&mut b);
        let mut forged = m.clone();
        forged.signature = b.signature;
        assert_eq!(
            verify("ops", &ops.public(), &forged),
            Err(SignatureError::Altered)
        );
    }

    #[test]
    fn the_wall_refuses_naming_who_refused_what_is_wrong_and_what_was_not_done() {
        let dir = tempfile::tempdir().unwrap();
        let (key_file, public) = key_files(dir.path(), "ops");
        let wall = Wall {
            agent: "ops",
            key_file: &public,
            data_dir: dir.path(),
            max_age: Duration::from_secs(3600),
            who: "the executor",
            nothing_done: "nothing was run",
        };
        let fresh = || {
            let mut r = request();
            r.envelope.as_mut().unwrap().created_at = None;
            r
        };
        // No key yet: the brain has not started.
        let e = wall.request("the request", &fresh()).unwrap_err();
        assert!(
            e.starts_with("the request's signature cannot be checked")
                && e.contains("the ops brain writes its public key")
                && e.ends_with("nothing was run"),
            "{e}"
        );
        let (ops, _) = SigningKey::load_or_create(&key_file, &public).unwrap();
        let mut r = fresh();
        ops.sign(&mut r);
        assert_eq!(wall.request("the request", &r), Ok(ops.public()));
        // Signed long ago: refused, however intact.
        let mut old = request();
        ops.sign(&mut old);
        let e = wall.request("the request", &old).unwrap_err();
        assert!(
            e.starts_with("refused by the executor: the request was signed")
                && e.contains("longer than it accepts (1h)"),
            "{e}"
        );
        // A record the request relies on, signed by a key no brain holds.
        let mut b = HostBinding {
            work_item_id: "wi-1".into(),
            hosts: vec!["nas".into()],
            ..Default::default()
        };
        SigningKey::ephemeral().sign(&mut b);
        let e = wall
            .signed_by(&ops.public(), "the host binding of work item wi-1", &b)
            .unwrap_err();
        assert_eq!(
            e,
            "refused by the executor: the host binding of work item wi-1: it is signed by a key no brain here holds, not by the ops brain's key; nothing was run"
        );
    }
}
