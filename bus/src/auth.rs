//! Who may say what on the bus: a NATS identity per service and agent, per
//! operator, and one for administration, each with the permissions its
//! part of Nisse needs and nothing more.
//!
//! The permissions are derived from the topology's tables — who publishes
//! each kind of message ([`SubjectKind::publishers`]), whose durable
//! consumer is whose ([`ConsumerSpec::role`]), who reads and writes which
//! keys of which bucket ([`BucketSpec::access`]) — never written a second
//! time. So intake-alerts can publish only `in.alert` of its agent, the
//! executor only its results, a brain only its own agent's requests and
//! outputs (the dev brain cannot write into the ops stream), and only an
//! operator's own credentials can publish a command in their name
//! (`in.operator.<operator>`). Stream and consumer administration (create,
//! update, delete, purge) is the admin identity's alone: `nisse up` uses it
//! to ensure the topology.
//!
//! Identities authenticate with NKeys: an Ed25519 key pair whose seed file
//! (mode 0600) only that part of Nisse reads, and whose public key the
//! server's `authorization` block lists ([`server_authorization`]). Each
//! identity receives replies on an inbox prefix of its own
//! (`_INBOX.<identity>.>`), so one cannot read the answers another gets
//! (the messages it pulls, the acks it waits for).
//!
//! `nisse mcp serve`, Nisse's MCP surface, has an identity of its own
//! ([`Identity::McpSurface`]): it reads what an operator reads and sends
//! commands on a subject of its own (`in.operator.mcp`, a name no operator
//! may have), but writes no bucket, so the kill switches are never its to
//! change; and the brain applies nothing from that subject but a plan
//! proposal, so nothing it sends is ever an approval.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::topology::{
    BUCKETS, BucketKeys, ConsumerSpec, Publisher, Role, StreamReads, SubjectKind,
};
use crate::{AgentName, Error, Result};

/// One identity on the bus.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Identity {
    /// `nisse up`'s own: creates and updates streams, consumers and
    /// buckets. Never used by a service.
    Admin,
    /// A service (or the brain) serving one agent.
    Service {
        /// Which part of Nisse.
        role: Role,
        /// The agent it serves.
        agent: AgentName,
    },
    /// A person on an agent's operator allowlist, using the CLI.
    Operator(OperatorName),
    /// `nisse mcp serve`: it may read every agent's stream and buckets and
    /// publish commands on `in.operator.`[`MCP_SURFACE`], of which the
    /// brain applies only plan proposals; it writes no bucket.
    McpSurface,
    /// The control service (gRPC API and web control room): it reads
    /// every agent's stream and buckets, and publishes commands on
    /// `in.operator.<name>` for each operator an allowlist names as
    /// `control:<name>`, in that operator's name once their token is
    /// verified; it writes the switch board as an operator does.
    Control,
}

/// The name `nisse mcp serve` speaks under: the last token of its command
/// subject (`nisse.<agent>.in.operator.mcp`), the actor id the brain reads
/// from it, and its identity's name. No operator may be called that
/// ([`OperatorName`] refuses it), so the subject is its alone.
pub const MCP_SURFACE: &str = "mcp";

impl Identity {
    /// The identity of `role` serving `agent`.
    pub fn service(role: Role, agent: &AgentName) -> Self {
        Self::Service {
            role,
            agent: agent.clone(),
        }
    }

    /// Its name: the credential file's stem and its inbox token
    /// (`admin`, `executor-ops`, `operator-alice`, `mcp`, `control`). Role
    /// names are fixed and none is another's prefix followed by `-`, so
    /// names never collide; `admin`, `mcp` and `control` have no `-`,
    /// which every other name has.
    pub fn name(&self) -> String {
        match self {
            Self::Admin => "admin".into(),
            Self::Service { role, agent } => format!("{}-{agent}", role.name()),
            Self::Operator(op) => format!("operator-{op}"),
            Self::McpSurface => MCP_SURFACE.into(),
            Self::Control => "control".into(),
        }
    }

    /// The inbox prefix its connection uses, the only one it may
    /// subscribe to.
    pub fn inbox_prefix(&self) -> String {
        format!("_INBOX.{}", self.name())
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// An operator's name on the bus: the token of their command subject
/// (`in.operator.<name>`) and of their identity. For the CLI it is the
/// local user name of `cli:<user>` in an agent's operator allowlist.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OperatorName(String);

impl OperatorName {
    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for OperatorName {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s == MCP_SURFACE {
            return Err(Error::Config(format!(
                "`{s}` cannot be an operator's name on the bus: it is the name of Nisse's MCP surface (`nisse mcp serve`), whose commands are only ever plan proposals"
            )));
        }
        let ok = !s.is_empty()
            && s.len() <= 64
            && !s.starts_with('-')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(Error::Config(format!(
                "`{s}` cannot be an operator's name on the bus: use ASCII letters, digits, `-` and `_` (at most 64, not starting with `-`)"
            )))
        }
    }
}

impl fmt::Display for OperatorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an identity may publish and subscribe to: NATS subjects, with
/// `*` and `>` wildcards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects it may publish to (messages, JetStream API requests,
    /// acks, key-value writes).
    pub publish: BTreeSet<String>,
    /// Subjects it may subscribe to.
    pub subscribe: BTreeSet<String>,
}

/// Everything the bus's permissions are derived from besides the
/// topology: the agents and who operates which.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthPlan {
    /// The agents whose streams exist.
    pub agents: Vec<AgentName>,
    /// Each operator and the agents whose allowlist names them.
    pub operators: BTreeMap<OperatorName, BTreeSet<AgentName>>,
    /// Each operator of the control plane (`control:<name>` on an
    /// allowlist) and the agents whose allowlist names them so.
    pub control: BTreeMap<OperatorName, BTreeSet<AgentName>>,
}

impl AuthPlan {
    /// Every identity the plan gives credentials to: the admin, each role
    /// for each agent, each operator, the MCP surface and the control
    /// service.
    pub fn identities(&self) -> Vec<Identity> {
        let mut out = vec![Identity::Admin];
        for agent in &self.agents {
            for role in Role::ALL {
                out.push(Identity::service(role, agent));
            }
        }
        out.extend(self.operators.keys().cloned().map(Identity::Operator));
        out.push(Identity::McpSurface);
        out.push(Identity::Control);
        out
    }

    /// What `identity` may do. `None` for the admin, which may do
    /// anything.
    pub fn permissions(&self, identity: &Identity) -> Option<Permissions> {
        let mut p = Permissions::default();
        p.subscribe.insert(format!("{}.>", identity.inbox_prefix()));
        match identity {
            Identity::Admin => return None,
            Identity::Service { role, agent } => service_permissions(&mut p, *role, agent),
            Identity::Operator(name) => {
                let agents = self.operators.get(name).cloned().unwrap_or_default();
                let commands = agents.iter().map(|a| (name.as_str(), a));
                operator_permissions(&mut p, commands, &agents, true);
            }
            Identity::McpSurface => {
                let agents: BTreeSet<AgentName> = self.agents.iter().cloned().collect();
                let commands = agents.iter().map(|a| (MCP_SURFACE, a));
                operator_permissions(&mut p, commands, &agents, false);
            }
            Identity::Control => {
                // Commands in the name of each operator an allowlist names
                // as `control:<name>`, to that agent only: the service
                // sends what a token's operator decides, and no one
                // else's. It reads every agent, for its read models.
                let agents: BTreeSet<AgentName> = self.agents.iter().cloned().collect();
                let commands = self
                    .control
                    .iter()
                    .flat_map(|(name, agents)| agents.iter().map(move |a| (name.as_str(), a)));
                operator_permissions(&mut p, commands, &agents, true);
            }
        }
        Some(p)
    }
}

/// The JetStream API prefix.
const API: &str = "$JS.API";

fn service_permissions(p: &mut Permissions, role: Role, agent: &AgentName) {
    let party = Publisher::Role(role);
    for kind in SubjectKind::ALL {
        if kind.published_by(party) {
            p.publish.insert(kind_subject(agent, kind));
        }
    }
    let stream = agent.stream();
    // Every service checks at its start that the stream is there
    // (`Bus::require_topology`): what it holds is not readable this way.
    p.publish.insert(format!("{API}.STREAM.INFO.{stream}"));
    for spec in ConsumerSpec::ALL.iter().filter(|c| c.role == role) {
        p.publish
            .insert(format!("{API}.CONSUMER.INFO.{stream}.{}", spec.name));
        p.publish
            .insert(format!("{API}.CONSUMER.MSG.NEXT.{stream}.{}", spec.name));
        p.publish
            .insert(format!("$JS.ACK.{stream}.{}.>", spec.name));
    }
    match role.stream_reads() {
        StreamReads::None => {}
        StreamReads::LastOnSubject => last_on_subject(p, &stream),
        StreamReads::Range => range_reads(p, &stream),
    }
    for bucket in BUCKETS {
        for access in bucket.access.iter().filter(|a| a.party == party) {
            let keys = match access.keys {
                BucketKeys::OwnAgent => format!("{agent}.>"),
                BucketKeys::All => ">".to_string(),
            };
            bucket_access(p, bucket.name, &keys, access.write);
        }
    }
}

/// What an operator, the MCP surface or the control service may do:
/// publish commands on each subject of `commands` (an operator name on an
/// agent) and hear the brain's answers, read the streams of `reads` and
/// every bucket, and write the buckets operators write (the switches)
/// only if `bucket_writes`.
fn operator_permissions<'a>(
    p: &mut Permissions,
    commands: impl IntoIterator<Item = (&'a str, &'a AgentName)>,
    reads: &BTreeSet<AgentName>,
    bucket_writes: bool,
) {
    p.publish.insert(format!("{API}.INFO"));
    p.publish.insert(format!("{API}.STREAM.NAMES"));
    p.publish.insert(format!("{API}.STREAM.LIST"));
    for (name, agent) in commands {
        // Commands in that name, and the brain's answers to them.
        p.publish
            .insert(format!("{}.{name}", agent.subject(SubjectKind::InOperator)));
        p.subscribe
            .insert(format!("{}.>", agent.subject(SubjectKind::OperatorReply)));
    }
    for agent in reads {
        // Reading the agent's whole history: `nisse streams`, `replay`,
        // `eval export`, a rebuild, the control service's read model.
        let stream = agent.stream();
        range_reads(p, &stream);
        p.publish.insert(format!("{API}.CONSUMER.INFO.{stream}.*"));
        p.publish.insert(format!("{API}.CONSUMER.NAMES.{stream}"));
        p.publish.insert(format!("{API}.CONSUMER.LIST.{stream}"));
    }
    for bucket in BUCKETS {
        let writes = bucket_writes
            && bucket
                .access
                .iter()
                .any(|a| a.party == Publisher::Operator && a.write);
        bucket_access(p, bucket.name, ">", writes);
        // Listing a bucket's keys is an ordered push consumer on its
        // stream, with flow control answered by the client.
        p.publish
            .insert(format!("{API}.CONSUMER.CREATE.KV_{}", bucket.name));
        p.publish.insert(format!("$JS.FC.KV_{}.>", bucket.name));
    }
}

/// The subject of `kind` for `agent`, with a wildcard for the token
/// per-item kinds end in.
fn kind_subject(agent: &AgentName, kind: SubjectKind) -> String {
    if kind.per_item() {
        format!("{}.*", agent.subject(kind))
    } else {
        agent.subject(kind)
    }
}

fn last_on_subject(p: &mut Permissions, stream: &str) {
    p.publish.insert(format!("{API}.STREAM.INFO.{stream}"));
    p.publish.insert(format!("{API}.STREAM.MSG.GET.{stream}"));
}

/// Reading ranges: an ordered consumer is an unnamed ephemeral one
/// (`CONSUMER.CREATE.<stream>` with no further token, which cannot name
/// or change a durable consumer), pulled from by its server-given name.
fn range_reads(p: &mut Permissions, stream: &str) {
    last_on_subject(p, stream);
    p.publish.insert(format!("{API}.CONSUMER.CREATE.{stream}"));
    p.publish
        .insert(format!("{API}.CONSUMER.MSG.NEXT.{stream}.*"));
}

fn bucket_access(p: &mut Permissions, bucket: &str, keys: &str, write: bool) {
    p.publish.insert(format!("{API}.STREAM.INFO.KV_{bucket}"));
    p.publish
        .insert(format!("{API}.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{keys}"));
    if write {
        p.publish.insert(format!("$KV.{bucket}.{keys}"));
    }
}

/// Where the identities' seed files live, one `<identity>.nk` each, mode
/// 0600: the services' and the admin's in `<data-dir>/credentials/nats/`
/// (mode 0700), each operator's in `<data-dir>/credentials/operators/`,
/// which `nisse up` run as root opens for traversal (0711) and hands each
/// file to the local user of the operator's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    root: PathBuf,
}

impl Credentials {
    /// The credentials under a data directory.
    pub fn in_data_dir(data_dir: &Path) -> Self {
        Self {
            root: data_dir.join("credentials"),
        }
    }

    /// The directory of the services' and the admin's seeds.
    pub fn dir(&self) -> PathBuf {
        self.root.join("nats")
    }

    /// The directory of the operators' seeds.
    pub fn operators_dir(&self) -> PathBuf {
        self.root.join("operators")
    }

    /// The seed file of `identity`.
    pub fn seed_file(&self, identity: &Identity) -> PathBuf {
        let dir = match identity {
            Identity::Operator(_) => self.operators_dir(),
            _ => self.dir(),
        };
        dir.join(format!("{}.nk", identity.name()))
    }

    /// The public key of `identity`, made (with its seed file) when it
    /// has none yet. An existing seed is never replaced.
    pub fn ensure(&self, identity: &Identity) -> Result<String> {
        let path = self.seed_file(identity);
        if path.exists() {
            return Ok(read_seed(&path)?.public_key());
        }
        let pair = nkeys::KeyPair::new_user();
        let seed = pair
            .seed()
            .map_err(|e| Error::Config(format!("making the nkey of {identity}: {e}")))?;
        write_private(&path, format!("{seed}\n").as_bytes())?;
        tracing::info!(%identity, file = %path.display(), "made NATS credentials");
        Ok(pair.public_key())
    }
}

/// Reads an nkey seed file.
fn read_seed(path: &Path) -> Result<nkeys::KeyPair> {
    let text = crate::secret::Secret::File(path.to_path_buf())
        .read_text()
        .map_err(|e| Error::Config(format!("{e}")))?;
    nkeys::KeyPair::from_seed(&text)
        .map_err(|e| Error::Config(format!("`{}` is not an nkey seed: {e}", path.display())))
}

/// Writes `bytes` to `path` readable by its owner only, atomically (a
/// temporary file beside it, synced, then linked into place), making its
/// directory (mode 0700) if needed. Refuses to replace an existing file.
///
/// Two processes may write the same file at once (`nisse up` starting
/// while `nisse control token` runs): each writes its own temporary file,
/// and the link, which fails when the name exists, lets exactly one of
/// them in; the other is told the file exists and reads what won.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    // The process and a counter name the temporary file: writers in other
    // processes and on other threads never share one.
    static NEXT_TMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let fail =
        |what: &str, e: &dyn fmt::Display| Error::Config(format!("{what} {}: {e}", path.display()));
    let dir = path
        .parent()
        .ok_or_else(|| fail("no directory for", &"it has no parent"))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| fail("creating the directory of", &e))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        std::process::id(),
        NEXT_TMP.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| fail("creating", &e))
        .and_then(|mut file| {
            file.write_all(bytes)
                .and_then(|()| file.sync_all())
                .map_err(|e| fail("writing", &e))
        })
        .and_then(|()| {
            std::fs::hard_link(&tmp, path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    fail("refusing to replace", &"it exists")
                } else {
                    fail("linking into", &e)
                }
            })
        });
    let _ = std::fs::remove_file(&tmp);
    written?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Loads the seed of `identity` for connecting, if it has one.
pub(crate) fn load_seed(creds: &Credentials, identity: &Identity) -> Result<Option<String>> {
    let path = creds.seed_file(identity);
    if !path.exists() {
        return Ok(None);
    }
    let pair = read_seed(&path)?;
    pair.seed()
        .map(Some)
        .map_err(|e| Error::Config(format!("`{}`: {e}", path.display())))
}

/// The `authorization { users = [...] }` block for a NATS server's
/// configuration: every identity of `plan` with its public key (made on
/// first use) and its permissions. `nisse up` includes it in the embedded
/// server's configuration; `nisse nats-config` prints it for a server the
/// operator runs.
pub fn server_authorization(plan: &AuthPlan, creds: &Credentials) -> Result<String> {
    let mut out = String::from(
        "# Generated by nisse from its subject table; regenerated at every `nisse up`.\n\
         # One NATS user per service and agent, per operator, and the admin.\n\
         authorization {\n  users = [\n",
    );
    for identity in plan.identities() {
        let key = creds.ensure(&identity)?;
        out.push_str(&format!(
            "    # {identity}\n    {{\n      nkey: \"{key}\"\n"
        ));
        if let Some(p) = plan.permissions(&identity) {
            out.push_str("      permissions: {\n");
            out.push_str(&format!(
                "        publish: {{ allow: {} }}\n",
                list(&p.publish)
            ));
            out.push_str(&format!(
                "        subscribe: {{ allow: {} }}\n",
                list(&p.subscribe)
            ));
            out.push_str("      }\n");
        }
        out.push_str("    }\n");
    }
    out.push_str("  ]\n}\n");
    Ok(out)
}

fn list(subjects: &BTreeSet<String>) -> String {
    let quoted: Vec<String> = subjects.iter().map(|s| format!("\"{s}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_racing_for_one_private_file_leave_one_winner_and_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("creds").join("alice.token");
        let results: Vec<(usize, Result<()>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|i| {
                    let path = &path;
                    s.spawn(move || (i, write_private(path, format!("token {i}\n").as_bytes())))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<usize> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        for (_, r) in &results {
            if let Err(e) = r {
                assert!(e.to_string().contains("refusing to replace"), "{e}");
            }
        }
        let held = std::fs::read_to_string(&path).unwrap();
        assert_eq!(held, format!("token {}\n", winners[0]));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["alice.token"]);
    }

    fn ops() -> AgentName {
        "ops".parse().unwrap()
    }

    fn plan() -> AuthPlan {
        let alice: OperatorName = "alice".parse().unwrap();
        AuthPlan {
            agents: vec![ops(), "dev".parse().unwrap()],
            operators: [(alice.clone(), [ops()].into_iter().collect())]
                .into_iter()
                .collect(),
            control: [(alice, [ops()].into_iter().collect())]
                .into_iter()
                .collect(),
        }
    }

    fn perms(identity: Identity) -> Permissions {
        plan().permissions(&identity).unwrap()
    }

    #[test]
    fn each_service_publishes_only_its_own_kinds() {
        let alerts = perms(Identity::service(Role::IntakeAlerts, &ops()));
        // Its alerts, and the stream's info (what `require_topology` reads
        // at its start: no message of the stream).
        assert_eq!(
            alerts.publish,
            [
                "nisse.ops.in.alert".to_string(),
                "$JS.API.STREAM.INFO.AGENT_OPS".to_string()
            ]
            .into_iter()
            .collect()
        );
        assert_eq!(
            alerts.subscribe,
            ["_INBOX.intake-alerts-ops.>".to_string()]
                .into_iter()
                .collect()
        );
        let exec = perms(Identity::service(Role::Executor, &ops()));
        assert!(exec.publish.contains("nisse.ops.in.exec.result"));
        assert!(!exec.publish.iter().any(|s| s.contains("out.exec")));
        assert!(!exec.publish.iter().any(|s| s.contains("in.operator")));
        // Its records, not the switches.
        assert!(exec.publish.contains("$KV.nisse_exec.ops.>"));
        assert!(
            !exec
                .publish
                .iter()
                .any(|s| s.starts_with("$KV.nisse_switches"))
        );
        let classifier = perms(Identity::service(Role::Classifier, &ops()));
        assert!(
            classifier
                .publish
                .contains("nisse.ops.in.classify.verdict.*")
        );
        assert!(
            !classifier
                .publish
                .iter()
                .any(|s| s.starts_with("$KV.nisse_switches"))
        );
    }

    #[test]
    fn the_mcp_service_takes_its_calls_reads_mounts_and_switches_and_keeps_its_records() {
        let mcp = perms(Identity::service(Role::Mcp, &ops()));
        // It answers and announces, and writes nothing the brain writes.
        for subject in ["nisse.ops.in.mcp.result", "nisse.ops.in.mcp.tools"] {
            assert!(mcp.publish.contains(subject), "{subject}");
        }
        assert!(!mcp.publish.iter().any(|s| s.contains("out.mcp")));
        assert!(!mcp.publish.iter().any(|s| s.contains("in.exec")));
        // Its own consumer, nobody else's.
        assert!(
            mcp.publish
                .contains("$JS.API.CONSUMER.MSG.NEXT.AGENT_OPS.mcp")
        );
        assert!(mcp.publish.contains("$JS.ACK.AGENT_OPS.mcp.>"));
        assert!(
            !mcp.publish
                .iter()
                .any(|s| s.contains("CONSUMER.MSG.NEXT.AGENT_OPS.executor"))
        );
        // The last mount on an item's subject; no ranges.
        assert!(mcp.publish.contains("$JS.API.STREAM.MSG.GET.AGENT_OPS"));
        assert!(!mcp.publish.contains("$JS.API.CONSUMER.CREATE.AGENT_OPS"));
        // The switches read, never written; its records written.
        assert!(
            mcp.publish
                .contains("$JS.API.DIRECT.GET.KV_nisse_switches.$KV.nisse_switches.>")
        );
        assert!(
            !mcp.publish
                .iter()
                .any(|s| s.starts_with("$KV.nisse_switches"))
        );
        assert!(mcp.publish.contains("$KV.nisse_mcp.ops.>"));
        assert!(
            mcp.publish
                .contains("$JS.API.DIRECT.GET.KV_nisse_mcp.$KV.nisse_mcp.ops.>")
        );
        assert!(!mcp.publish.iter().any(|s| s.starts_with("$KV.nisse_exec")));
    }

    #[test]
    fn only_the_classifier_writes_verdicts_and_the_services_acting_on_requests_read_them() {
        // A verdict, on any request's subject, is the classifier's alone
        // to publish: not the brain's, not the executor's, not an
        // operator's.
        for id in plan().identities() {
            let Some(p) = plan().permissions(&id) else {
                continue;
            };
            let writes: Vec<&String> = p
                .publish
                .iter()
                .filter(|s| s.contains("classify.verdict"))
                .collect();
            match &id {
                Identity::Service {
                    role: Role::Classifier,
                    agent,
                } => assert_eq!(
                    writes,
                    [&format!("nisse.{agent}.in.classify.verdict.*")],
                    "{id}"
                ),
                _ => assert!(writes.is_empty(), "{id}: {writes:?}"),
            }
        }
        // The executor and the mcp service read the verdict a request
        // names, the last message on its subject, in their own agent's
        // stream only. (JetStream's message get names the subject in the
        // request's body, so the permission is per stream, not per
        // subject: they could read any message of it, as for bindings.)
        for role in [Role::Executor, Role::Mcp] {
            let p = perms(Identity::service(role, &ops()));
            assert!(
                p.publish.contains("$JS.API.STREAM.MSG.GET.AGENT_OPS"),
                "{role}"
            );
            assert!(
                !p.publish.iter().any(|s| s.contains("AGENT_DEV")),
                "{role}: {:?}",
                p.publish
            );
        }
    }

    #[test]
    fn a_brain_writes_only_into_its_own_agents_stream() {
        let dev = perms(Identity::service(Role::Brain, &"dev".parse().unwrap()));
        assert!(dev.publish.contains("nisse.dev.out.exec.req"));
        assert!(dev.publish.contains("nisse.dev.out.exec.bind.*"));
        assert!(
            !dev.publish.iter().any(|s| s.contains("ops")),
            "{:?}",
            dev.publish
        );
        // It reads its own stream, never administers it.
        for s in &dev.publish {
            for admin in ["DELETE", "PURGE", "UPDATE", "DURABLE"] {
                assert!(!s.contains(admin), "{s}");
            }
        }
        assert!(dev.publish.contains("$JS.API.CONSUMER.CREATE.AGENT_DEV"));
        assert!(dev.publish.contains("$KV.nisse_leases.dev.>"));
    }

    #[test]
    fn operators_command_in_their_own_name_and_flip_the_switches() {
        let alice = perms(Identity::Operator("alice".parse().unwrap()));
        assert!(alice.publish.contains("nisse.ops.in.operator.alice"));
        assert!(!alice.publish.iter().any(|s| s.contains("nisse.dev.")));
        assert!(alice.publish.contains("$KV.nisse_switches.>"));
        assert!(!alice.publish.contains("$KV.nisse_exec.>"));
        assert!(alice.subscribe.contains("nisse.ops.out.operator.>"));
        // No identity but the admin (and none of the services) may
        // publish a command.
        for id in plan().identities() {
            let Some(p) = plan().permissions(&id) else {
                continue;
            };
            let commands: Vec<_> = p
                .publish
                .iter()
                .filter(|s| s.contains(".in.operator"))
                .collect();
            match &id {
                Identity::Operator(op) => {
                    assert!(commands.iter().all(|s| s.ends_with(&format!(".{op}"))));
                }
                Identity::McpSurface => {
                    assert!(commands.iter().all(|s| s.ends_with(".in.operator.mcp")));
                }
                // The control service: in the names of its operators only.
                Identity::Control => {
                    assert_eq!(commands, ["nisse.ops.in.operator.alice"]);
                }
                _ => assert!(commands.is_empty(), "{id}: {commands:?}"),
            }
        }
    }

    #[test]
    fn the_control_service_reads_every_agent_and_commands_for_its_operators_only() {
        let control = perms(Identity::Control);
        // alice is `control:alice` on ops only: no command in her name on
        // dev, and none in anyone else's.
        assert!(control.publish.contains("nisse.ops.in.operator.alice"));
        assert!(!control.publish.iter().any(|s| s.contains("nisse.dev.in.")));
        assert!(control.subscribe.contains("nisse.ops.out.operator.>"));
        // Both agents' histories, for its read models.
        for stream in ["AGENT_OPS", "AGENT_DEV"] {
            assert!(
                control
                    .publish
                    .contains(&format!("$JS.API.CONSUMER.CREATE.{stream}"))
            );
        }
        // The switches, as an operator; nothing else of any bucket.
        assert!(control.publish.contains("$KV.nisse_switches.>"));
        assert!(!control.publish.contains("$KV.nisse_exec.>"));
        assert!(!control.publish.iter().any(|s| s.contains("out.exec")));
    }

    #[test]
    fn the_mcp_surface_commands_under_its_own_name_and_writes_no_bucket() {
        let mcp = perms(Identity::McpSurface);
        assert_eq!(Identity::McpSurface.name(), "mcp");
        assert!(plan().identities().contains(&Identity::McpSurface));
        // Every agent's, in its own name only.
        assert!(mcp.publish.contains("nisse.ops.in.operator.mcp"));
        assert!(mcp.publish.contains("nisse.dev.in.operator.mcp"));
        assert!(mcp.subscribe.contains("nisse.ops.out.operator.>"));
        assert!(mcp.subscribe.contains("_INBOX.mcp.>"));
        // It reads streams and buckets like an operator.
        assert!(mcp.publish.contains("$JS.API.CONSUMER.CREATE.AGENT_OPS"));
        assert!(
            mcp.publish
                .contains("$JS.API.DIRECT.GET.KV_nisse_switches.$KV.nisse_switches.>")
        );
        // Nothing it may publish writes a bucket: not the switches, not
        // anyone's records.
        let writes: Vec<_> = mcp
            .publish
            .iter()
            .filter(|s| s.starts_with("$KV."))
            .collect();
        assert!(writes.is_empty(), "{writes:?}");
        // No operator can take its name, so its subject is its own.
        let e = "mcp".parse::<OperatorName>().unwrap_err().to_string();
        assert!(e.contains("nisse mcp serve"), "{e}");
    }

    #[test]
    fn every_kind_a_role_publishes_is_in_its_permissions() {
        for agent in plan().agents {
            for kind in SubjectKind::ALL {
                for publisher in kind.publishers() {
                    let Publisher::Role(role) = publisher else {
                        continue;
                    };
                    let p = perms(Identity::service(*role, &agent));
                    assert!(
                        p.publish.contains(&kind_subject(&agent, kind)),
                        "{role} {kind:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn identity_names_and_operator_names() {
        assert_eq!(Identity::Admin.name(), "admin");
        assert_eq!(
            Identity::service(Role::IntakeMatrix, &ops()).name(),
            "intake-matrix-ops"
        );
        for bad in ["", "a.b", "a b", "-x", "a*", &"x".repeat(65)] {
            assert!(bad.parse::<OperatorName>().is_err(), "{bad}");
        }
        assert!("first_last-2".parse::<OperatorName>().is_ok());
    }

    #[test]
    fn credentials_are_made_once_and_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let creds = Credentials::in_data_dir(dir.path());
        let id = Identity::service(Role::Executor, &ops());
        let first = creds.ensure(&id).unwrap();
        assert_eq!(creds.ensure(&id).unwrap(), first, "never replaced");
        let mode = std::fs::metadata(creds.seed_file(&id))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let dmode = std::fs::metadata(creds.dir()).unwrap().permissions().mode();
        assert_eq!(dmode & 0o777, 0o700);
        let text = server_authorization(&plan(), &creds).unwrap();
        assert!(text.contains(&first));
        assert!(text.contains("\"nisse.ops.in.exec.result\""));
    }
}
