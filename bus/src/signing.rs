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

use base64::Engine as _;
use ed25519_dalek::{Signer as _, Verifier as _};
use sha2::Digest as _;

use crate::proto::{ExecRequest, HostBinding, McpMount, McpRequest, Signature};
use crate::{Error, Result};

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

    /// Signs `request` in place. Its creation time is part of what is
    /// signed: one without a time gets the current one first (publishing
    /// would otherwise fill it in after signing).
    pub fn sign_exec(&self, request: &mut ExecRequest) {
        stamp(request.envelope.as_mut());
        request.signature = Some(self.signature(&exec_payload(request)));
    }

    /// Signs `binding` in place, stamping its creation time likewise.
    pub fn sign_binding(&self, binding: &mut HostBinding) {
        stamp(binding.envelope.as_mut());
        binding.signature = Some(self.signature(&binding_payload(binding)));
    }

    /// Signs an MCP tool call in place, stamping its creation time
    /// likewise.
    pub fn sign_mcp(&self, request: &mut McpRequest) {
        stamp(request.envelope.as_mut());
        request.signature = Some(self.signature(&mcp_payload(request)));
    }

    /// Signs the MCP instances mounted for a work item in place, stamping
    /// its creation time likewise.
    pub fn sign_mount(&self, mount: &mut McpMount) {
        stamp(mount.envelope.as_mut());
        mount.signature = Some(self.signature(&mount_payload(mount)));
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

/// Checks that `request` is signed by `expected` (the key of `agent`'s
/// brain) and unchanged since.
pub fn verify_exec(
    agent: &str,
    expected: &PublicKey,
    request: &ExecRequest,
) -> std::result::Result<(), SignatureError> {
    verify(
        agent,
        expected,
        request.signature.as_ref(),
        &exec_payload(request),
    )
}

/// Checks that `binding` is signed by `expected` (the key of `agent`'s
/// brain) and unchanged since.
pub fn verify_binding(
    agent: &str,
    expected: &PublicKey,
    binding: &HostBinding,
) -> std::result::Result<(), SignatureError> {
    verify(
        agent,
        expected,
        binding.signature.as_ref(),
        &binding_payload(binding),
    )
}

/// Checks that the MCP tool call `request` is signed by `expected` (the
/// key of `agent`'s brain) and unchanged since.
pub fn verify_mcp(
    agent: &str,
    expected: &PublicKey,
    request: &McpRequest,
) -> std::result::Result<(), SignatureError> {
    verify(
        agent,
        expected,
        request.signature.as_ref(),
        &mcp_payload(request),
    )
}

/// Checks that the MCP mount `mount` is signed by `expected` (the key of
/// `agent`'s brain) and unchanged since.
pub fn verify_mount(
    agent: &str,
    expected: &PublicKey,
    mount: &McpMount,
) -> std::result::Result<(), SignatureError> {
    verify(
        agent,
        expected,
        mount.signature.as_ref(),
        &mount_payload(mount),
    )
}

fn verify(
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
        let ops = SigningKey::ephemeral();
        let dev = SigningKey::ephemeral();
        let ring = Keyring::of([("ops".into(), ops.public()), ("dev".into(), dev.public())]);
        let mut r = request();
        assert_eq!(
            verify_exec("ops", &ops.public(), &r),
            Err(SignatureError::Unsigned)
        );
        ops.sign_exec(&mut r);
        assert_eq!(verify_exec("ops", &ops.public(), &r), Ok(()));
        // Deterministic: the same request signs the same.
        let mut again = request();
        ops.sign_exec(&mut again);
        assert_eq!(again, r);

        type Change = Box<dyn Fn(&mut ExecRequest)>;
        let changes: Vec<Change> = vec![
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
        ];
        for change in changes {
            let mut altered = r.clone();
            change(&mut altered);
            assert_eq!(
                verify_exec("ops", &ops.public(), &altered),
                Err(SignatureError::Altered)
            );
        }
        // The dedup id is not what decides what runs.
        let mut redelivered = r.clone();
        redelivered.envelope.as_mut().unwrap().message_id = "exec:other".into();
        assert_eq!(verify_exec("ops", &ops.public(), &redelivered), Ok(()));

        let mut by_dev = request();
        dev.sign_exec(&mut by_dev);
        let e = verify_exec("ops", &ops.public(), &by_dev)
            .unwrap_err()
            .named_by(&ring);
        assert_eq!(
            e.to_string(),
            "it is signed by the dev brain's key, not by the ops brain's key"
        );
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
        k1.sign_binding(&mut b);
        assert_eq!(verify_binding("ops", &k1.public(), &b), Ok(()));
        b.hosts.push("router".into());
        assert_eq!(
            verify_binding("ops", &k1.public(), &b),
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
        let ops = SigningKey::ephemeral();
        let dev = SigningKey::ephemeral();
        let ring = Keyring::of([("ops".into(), ops.public()), ("dev".into(), dev.public())]);
        let mut r = mcp_request();
        assert_eq!(
            verify_mcp("ops", &ops.public(), &r),
            Err(SignatureError::Unsigned)
        );
        ops.sign_mcp(&mut r);
        assert_eq!(verify_mcp("ops", &ops.public(), &r), Ok(()));
        let mut again = mcp_request();
        ops.sign_mcp(&mut again);
        assert_eq!(again, r);

        type Change = Box<dyn Fn(&mut McpRequest)>;
        let changes: Vec<Change> = vec![
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
        ];
        for change in changes {
            let mut altered = r.clone();
            change(&mut altered);
            assert_eq!(
                verify_mcp("ops", &ops.public(), &altered),
                Err(SignatureError::Altered)
            );
        }
        let mut redelivered = r.clone();
        redelivered.envelope.as_mut().unwrap().message_id = "mcp:other".into();
        assert_eq!(verify_mcp("ops", &ops.public(), &redelivered), Ok(()));

        let mut by_dev = mcp_request();
        dev.sign_mcp(&mut by_dev);
        let e = verify_mcp("ops", &ops.public(), &by_dev)
            .unwrap_err()
            .named_by(&ring);
        assert_eq!(
            e.to_string(),
            "it is signed by the dev brain's key, not by the ops brain's key"
        );
    }

    #[test]
    fn a_signed_mount_verifies_and_any_change_breaks_it() {
        let ops = SigningKey::ephemeral();
        let mount = || McpMount {
            envelope: Some(Envelope {
                agent: "ops".into(),
                work_item_id: "wi-1".into(),
                message_id: "mount:wi-1:1".into(),
                ..Default::default()
            }),
            work_item_id: "wi-1".into(),
            instances: vec!["hv-site-a-ro".into()],
            reason: "read-only by default".into(),
            plan_revision: 0,
            ..Default::default()
        };
        let mut m = mount();
        assert_eq!(
            verify_mount("ops", &ops.public(), &m),
            Err(SignatureError::Unsigned)
        );
        ops.sign_mount(&mut m);
        assert!(m.envelope.as_ref().unwrap().created_at.is_some());
        assert_eq!(verify_mount("ops", &ops.public(), &m), Ok(()));

        type Change = Box<dyn Fn(&mut McpMount)>;
        let changes: Vec<Change> = vec![
            Box::new(|m| m.work_item_id = "wi-2".into()),
            Box::new(|m| m.instances.push("hv-site-a-elevated".into())),
            Box::new(|m| m.instances[0] = "hv-site-b-ro".into()),
            Box::new(|m| m.plan_revision = 1),
            Box::new(|m| m.envelope.as_mut().unwrap().work_item_id = "wi-2".into()),
            Box::new(|m| m.envelope.as_mut().unwrap().created_at = None),
        ];
        for change in changes {
            let mut altered = m.clone();
            change(&mut altered);
            assert_eq!(
                verify_mount("ops", &ops.public(), &altered),
                Err(SignatureError::Altered)
            );
        }
        // The reason explains; it decides nothing.
        let mut explained = m.clone();
        explained.reason = "another wording".into();
        assert_eq!(verify_mount("ops", &ops.public(), &explained), Ok(()));
        // A binding's signature never passes for a mount's.
        let mut b = HostBinding {
            envelope: m.envelope.clone(),
            work_item_id: "wi-1".into(),
            hosts: vec!["hv-site-a-ro".into()],
            ..Default::default()
        };
        ops.sign_binding(&mut b);
        let mut forged = m.clone();
        forged.signature = b.signature;
        assert_eq!(
            verify_mount("ops", &ops.public(), &forged),
            Err(SignatureError::Altered)
        );
    }
}
