//! `nisse deploy render`: what a real installation runs, beyond `nisse up`'s
//! one process. A NATS cluster; `nisse bus init` once, as the admin; then
//! every service of every agent as a unit of its own (a container, or a
//! process), holding only its own NATS credentials and only the files its
//! part needs: the brain its signing key, the executor and the mcp service
//! the brain's public key, the webhook its token. The same [`Layout`] is
//! written two ways: as a docker compose deployment (`--compose`), and as
//! plain processes on this machine (`--processes`), which the tests start,
//! so the topology the compose file describes is itself tested here, where
//! no container engine runs.
//!
//! Everything secret is made by the render under `<out>/credentials/`
//! (made once and kept when rendering again): every identity's NKey seed
//! and the `authorization` block the servers load, each agent's brain
//! signing key, the webhook's bearer token, the control plane's TLS
//! certificate and the CA that signed it. Nothing is read from the
//! operator's data directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use nisse_bus::auth::{Credentials, Identity};
use nisse_bus::{AgentName, Role};

use crate::config::Config;
use crate::services::{SERVICES, configured, serves_agents};

/// The container images the compose deployment pulls, pinned by digest:
/// they hold credentials, so they change only when the pins are changed
/// here on purpose (seed X4). The digests are the registries' published
/// ones for these tags as found in public deployments; check one with
/// `docker buildx imagetools inspect <image>` before moving it.
pub const NATS_IMAGE: &str =
    "nats:2.10-alpine@sha256:b83efabe3e7def1e0a4a31ec6e078999bb17c80363f881df35edc70fcb6bb927";
/// The Matrix homeserver (Synapse 1.162.0).
pub const SYNAPSE_IMAGE: &str =
    "matrixdotorg/synapse@sha256:abeb932f2a9293fcbb886d5ddd0f55a34d532708ebb8dc5642934dd91ca26237";
/// The model proxy (LiteLLM, `main-stable`).
pub const LITELLM_IMAGE: &str = "ghcr.io/berriai/litellm:main-stable@sha256:8f3517476b8293ccc1c3b0da7940d8dabbfe64b013454113f5a3cb68265c439b";

/// The port every unit's health listener takes in its container.
const HEALTH_PORT: u16 = 9100;

/// One service serving one agent (or, the control plane, every agent):
/// a container, or a process.
#[derive(Debug, Clone, Serialize)]
pub struct Unit {
    /// `<service>-<agent>`, e.g. `brain-ops`; `control`.
    pub name: String,
    /// The service (`nisse serve <service>`).
    pub service: &'static str,
    /// Its part on an agent's bus; none for the control plane.
    #[serde(skip)]
    pub role: Option<Role>,
    /// The agent it serves; none when it serves every agent.
    pub agent: Option<String>,
    /// The NATS identity it connects as: its seed is the only one it holds.
    pub identity: String,
    /// Files it holds besides its seed, under its data directory, each
    /// made by the render (read-only).
    pub secrets: Vec<PathBuf>,
    /// Directories under its data directory it keeps state in: a unit
    /// with any keeps its data directory in a volume of its own.
    pub state: Vec<PathBuf>,
    /// Whether it writes the shared vault (`Some(true)`), only reads it
    /// (`Some(false)`), or does not use it.
    pub vault: Option<bool>,
    /// The configuration key of the address it takes requests on, if any
    /// (the webhook receivers, the control plane).
    pub listens: Option<&'static str>,
    /// Configuration set through the environment to files it holds
    /// (variable, path under its data directory): the control plane's
    /// TLS certificate and key.
    pub file_settings: Vec<(&'static str, PathBuf)>,
}

/// What runs: the NATS servers, the init, the units.
#[derive(Debug, Clone, Serialize)]
pub struct Layout {
    /// NATS servers of the cluster.
    pub nats_nodes: usize,
    /// Every unit, in start order.
    pub units: Vec<Unit>,
}

impl Layout {
    /// The layout `cfg` asks for: each service the configuration gives
    /// something to do, once for each agent it serves, on `nats_nodes`
    /// servers.
    pub fn of(cfg: &Config, nats_nodes: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(
            nats_nodes == 1 || nats_nodes >= 3,
            "a cluster of {nats_nodes} servers loses its quorum with one server down: 1, or 3 or more"
        );
        let agents = cfg.agent_names()?;
        let mut units = Vec::new();
        for entry in SERVICES {
            if !configured(cfg, entry.role) {
                continue;
            }
            for agent in serves_agents(cfg, &agents, entry.role) {
                units.push(unit(entry.service.name, entry.role, &agent));
            }
        }
        // The control plane, once for every agent, when an operator may
        // use it.
        if !cfg.auth_plan()?.control.is_empty() {
            units.push(control_unit());
        }
        Ok(Self { nats_nodes, units })
    }
}

/// What `role` holds and keeps for `agent`.
fn unit(service: &'static str, role: Role, agent: &AgentName) -> Unit {
    let agent_dir = PathBuf::from("agents").join(agent.as_str());
    let brain_key = agent_dir.join("brain");
    let (secrets, state, vault, listens) = match role {
        Role::Brain => (
            vec![brain_key.join("signing.key"), brain_key.join("signing.pub")],
            vec![agent_dir.clone()],
            None,
            None,
        ),
        Role::Executor => (
            vec![brain_key.join("signing.pub")],
            vec![agent_dir.join("ssh")],
            None,
            None,
        ),
        Role::Mcp => (vec![brain_key.join("signing.pub")], vec![], None, None),
        Role::IntakeMatrix => (vec![], vec![agent_dir.join("matrix")], None, None),
        Role::VaultWriter => (vec![], vec![], Some(true), None),
        Role::VaultReader => (vec![], vec![], Some(false), None),
        Role::IntakeAlerts => (
            vec![PathBuf::from("credentials/alertmanager-webhook.token")],
            vec![],
            None,
            Some("intake-alerts"),
        ),
        Role::IntakeGitea => (vec![], vec![], None, Some("gitea")),
        Role::IntakeVikunja => (vec![], vec![], None, Some("vikunja")),
        Role::Classifier | Role::ModelGateway | Role::Scheduler | Role::Prober => {
            (vec![], vec![], None, None)
        }
    };
    Unit {
        name: format!("{service}-{agent}"),
        service,
        role: Some(role),
        agent: Some(agent.to_string()),
        identity: Identity::service(role, agent).to_string(),
        secrets,
        state,
        vault,
        listens,
        file_settings: Vec::new(),
    }
}

/// Where the render keeps the control plane's TLS files, under
/// `credentials/`: the CA operators' clients trust, and the certificate
/// it signed with its key.
const CONTROL_TLS: &str = "credentials/control-tls";

/// The control plane: its read models and operators' tokens are its
/// state; it reads the vault (the world model); it serves TLS with the
/// certificate the render made.
fn control_unit() -> Unit {
    let tls = PathBuf::from(CONTROL_TLS);
    Unit {
        name: "control".into(),
        service: "control",
        role: None,
        agent: None,
        identity: Identity::Control.to_string(),
        secrets: vec![tls.join("cert.pem"), tls.join("key.pem")],
        state: vec![
            crate::control::read_models_dir(Path::new("")),
            nisse_control::Tokens::in_data_dir(Path::new(""))
                .dir()
                .to_path_buf(),
        ],
        vault: Some(false),
        listens: Some("control"),
        file_settings: vec![
            ("NISSE_CONTROL__TLS_CERT", tls.join("cert.pem")),
            ("NISSE_CONTROL__TLS_KEY", tls.join("key.pem")),
        ],
    }
}

/// The control plane's CA and its certificate, for `localhost`,
/// `control` (its name on a compose network), loopback and this
/// machine's host name, made under `out/credentials/control-tls/` when
/// it holds no key. Replace `cert.pem` and `key.pem` with a certificate
/// of your own CA for other names.
fn control_tls(out: &Path) -> anyhow::Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let dir = out.join(CONTROL_TLS);
    let (ca_file, cert_file, key_file) = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    // A key there is kept, with whatever certificate is beside it (the
    // render's from before, or the operator's own).
    if key_file.exists() {
        return Ok(());
    }
    let mut names = vec![
        "localhost".to_string(),
        "control".into(),
        "127.0.0.1".into(),
        "::1".into(),
    ];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname")
        && !host.trim().is_empty()
        && !names.contains(&host.trim().to_string())
    {
        names.push(host.trim().to_string());
    }
    let made = (|| -> Result<_, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.distinguished_name
            .push(DnType::CommonName, "Nisse control plane CA");
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(names.clone())?;
        leaf.distinguished_name
            .push(DnType::CommonName, "nisse control");
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok((ca_cert.pem(), cert.pem(), key.serialize_pem()))
    })()
    .context("making the control plane's TLS certificate")?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(&ca_file, made.0)?;
    std::fs::write(&cert_file, made.1)?;
    nisse_bus::auth::write_private(&key_file, made.2.as_bytes())?;
    Ok(())
}

/// Makes (or keeps) everything secret the layout needs under
/// `out/credentials/`, and returns the servers' `authorization` block.
fn credentials(cfg: &Config, layout: &Layout, out: &Path) -> anyhow::Result<String> {
    // `Credentials::in_data_dir(out)` keeps the seeds in
    // `out/credentials/nats/`, where the units' files are taken from.
    let creds = Credentials::in_data_dir(out);
    let authorization = nisse_bus::auth::server_authorization(&cfg.auth_plan()?, &creds)?;
    for brain in layout.units.iter().filter(|u| u.role == Some(Role::Brain)) {
        let agent = brain.agent.as_deref().unwrap_or_default();
        // Where `files_of` takes them from: under `credentials/` too.
        let (key, public) = nisse_bus::signing::key_files(&out.join("credentials"), agent);
        nisse_bus::signing::SigningKey::load_or_create(&key, &public)
            .with_context(|| format!("the {agent} brain's signing key"))?;
    }
    if layout
        .units
        .iter()
        .any(|u| u.role == Some(Role::IntakeAlerts))
    {
        nisse_intake_alerts::ensure_token(out)?;
    }
    if layout.units.iter().any(|u| u.service == "control") {
        control_tls(out)?;
    }
    Ok(authorization)
}

/// Where the render keeps a unit's files: its seed, then its secrets, as
/// paths under `out` (what the render made) and under the unit's data
/// directory (where the unit looks).
fn files_of(unit: &Unit) -> Vec<(PathBuf, PathBuf)> {
    let seed = PathBuf::from("credentials/nats").join(format!("{}.nk", unit.identity));
    let mut files = vec![(seed.clone(), seed)];
    for secret in &unit.secrets {
        // Everything the render makes is under `credentials/`; a brain's
        // key is where the brain looks for it, under `agents/`.
        let from = if secret.starts_with("credentials") {
            secret.clone()
        } else {
            PathBuf::from("credentials").join(secret)
        };
        files.push((from, secret.clone()));
    }
    files
}

/// One process of the plain-process layout: what to run, where, with what.
#[derive(Debug, Clone, Serialize)]
pub struct Process {
    /// Its name (a unit's, `nats-<n>`, or `init`).
    pub name: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Environment it adds.
    pub env: BTreeMap<String, String>,
    /// Its `/readyz`, when it has one.
    pub ready_url: Option<String>,
}

/// The plain-process layout: NATS servers first (started together), then
/// `init` (run to its end), then the units.
#[derive(Debug, Clone, Serialize)]
pub struct Processes {
    /// The NATS servers.
    pub nats: Vec<Process>,
    /// `nisse bus init`, as the admin.
    pub init: Process,
    /// Every unit.
    pub units: Vec<Process>,
    /// The client URLs of the servers, joined with commas.
    pub nats_url: String,
}

/// Renders the layout as processes on this machine under `out`: each
/// server's configuration, each unit's own data directory holding only
/// its seed and its files, `layout.json` saying how to run them. Ports are
/// free loopback ports at the time of rendering.
pub fn render_processes(
    cfg: &Config,
    layout: &Layout,
    out: &Path,
    nisse: &Path,
    nats_server: &Path,
) -> anyhow::Result<Processes> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let authorization = credentials(cfg, layout, out)?;
    let ports = free_ports(layout.nats_nodes * 2 + layout.units.len())?;
    let (client, rest) = ports.split_at(layout.nats_nodes);
    let (route, health) = rest.split_at(layout.nats_nodes);
    let nats_url = client
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut nats = Vec::new();
    for n in 0..layout.nats_nodes {
        let dir = out.join("nats").join(format!("node-{n}"));
        std::fs::create_dir_all(&dir)?;
        let conf = dir.join("nats-server.conf");
        let routes: Vec<String> = route
            .iter()
            .map(|p| format!("\"nats-route://127.0.0.1:{p}\""))
            .collect();
        std::fs::write(
            &conf,
            nats_config(
                &format!("nisse-{n}"),
                "127.0.0.1",
                client[n],
                (layout.nats_nodes > 1).then(|| (route[n], routes.join(", "))),
                &dir.join("jetstream"),
                &authorization,
            ),
        )?;
        nats.push(Process {
            name: format!("nats-{n}"),
            command: vec![
                nats_server.display().to_string(),
                "-c".into(),
                conf.display().to_string(),
            ],
            env: BTreeMap::new(),
            ready_url: None,
        });
    }
    let config_file = out.join("nisse.toml");
    std::fs::write(&config_file, cfg.to_annotated_toml()?)?;
    let vault = out.join("volumes").join("vault");
    std::fs::create_dir_all(&vault)?;
    let env = |extra: &[(&str, String)]| {
        let mut env = BTreeMap::from([
            ("NISSE_BUS__URL".to_string(), nats_url.clone()),
            ("NISSE_VAULT__DIR".to_string(), vault.display().to_string()),
        ]);
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        env
    };
    let base = |data: &Path| {
        vec![
            nisse.display().to_string(),
            "--config".into(),
            config_file.display().to_string(),
            "--data-dir".into(),
            data.display().to_string(),
        ]
    };
    // The init holds the admin's seed alone.
    let init_data = out.join("units").join("init");
    place(out, &init_data, &[admin_seed()])?;
    let mut init_command = base(&init_data);
    init_command.extend(["bus".into(), "init".into()]);
    let init = Process {
        name: "init".into(),
        command: init_command,
        env: env(&[("NISSE_BUS__STREAMS__REPLICAS", replicas(cfg, layout))]),
        ready_url: None,
    };
    let mut units = Vec::new();
    for (unit, health) in layout.units.iter().zip(health) {
        let data = out.join("units").join(&unit.name);
        place(out, &data, &files_of(unit))?;
        let mut command = base(&data);
        command.extend(serve_args(unit, &format!("127.0.0.1:{health}")));
        let files: Vec<(&str, String)> = unit
            .file_settings
            .iter()
            .map(|(var, file)| (*var, data.join(file).display().to_string()))
            .collect();
        units.push(Process {
            name: unit.name.clone(),
            command,
            env: env(&files),
            ready_url: Some(format!("http://127.0.0.1:{health}/readyz")),
        });
    }
    let processes = Processes {
        nats,
        init,
        units,
        nats_url,
    };
    std::fs::write(
        out.join("layout.json"),
        serde_json::to_string_pretty(&processes)?,
    )?;
    Ok(processes)
}

fn admin_seed() -> (PathBuf, PathBuf) {
    let seed = PathBuf::from("credentials/nats").join(format!("{}.nk", Identity::Admin));
    (seed.clone(), seed)
}

/// Copies each `(from under out, to under data)` file into `data`, mode
/// 0600 in directories only its owner may enter.
fn place(out: &Path, data: &Path, files: &[(PathBuf, PathBuf)]) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    for (from, to) in files {
        let (from, to) = (out.join(from), data.join(to));
        if let Some(dir) = to.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// A server's configuration: its name, client port, JetStream store, the
/// cluster it routes to (its route port and every node's route URL), and
/// the identities' authorization.
fn nats_config(
    name: &str,
    host: &str,
    port: u16,
    cluster: Option<(u16, String)>,
    store: &Path,
    authorization: &str,
) -> String {
    let mut text = format!(
        "# Written by `nisse deploy render`.\nserver_name: {name:?}\nlisten: \"{host}:{port}\"\njetstream {{\n  store_dir: {:?}\n}}\n",
        store.display().to_string()
    );
    if let Some((route_port, routes)) = cluster {
        text.push_str(&format!(
            "cluster {{\n  name: \"nisse\"\n  listen: \"{host}:{route_port}\"\n  routes: [{routes}]\n}}\n"
        ));
    }
    text.push_str(authorization);
    text
}

/// The replicas the init makes the topology with: the configuration's
/// when it fixes them, else one per server of the cluster the layout
/// deploys, up to three. Said rather than read from the servers: the
/// init may run before every server has told the others' addresses.
fn replicas(cfg: &Config, layout: &Layout) -> String {
    cfg.bus.streams.replicas.on(layout.nats_nodes).to_string()
}

/// `n` distinct free loopback ports, each bound at once and let go
/// together.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()?)
}

/// Renders the layout as a docker compose deployment under `out`:
/// `compose.yaml`, each server's configuration under `nats/`, and the
/// credentials under `credentials/`, each mounted only into the
/// container it belongs to (as a compose secret at the path the service
/// looks for it). The image is built from this repository's `Dockerfile`
/// (`compose/Dockerfile`).
pub fn render_compose(cfg: &Config, layout: &Layout, out: &Path) -> anyhow::Result<String> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let authorization = credentials(cfg, layout, out)?;
    let nodes = layout.nats_nodes;
    let routes: Vec<String> = (0..nodes)
        .map(|n| format!("\"nats-route://nats-{n}:6222\""))
        .collect();
    for n in 0..nodes {
        let dir = out.join("nats");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join(format!("nats-{n}.conf")),
            nats_config(
                &format!("nisse-{n}"),
                "0.0.0.0",
                4222,
                (nodes > 1).then(|| (6222, routes.join(", "))),
                Path::new("/data/jetstream"),
                &authorization,
            ),
        )?;
    }
    std::fs::write(out.join("nisse.toml"), cfg.to_annotated_toml()?)?;
    let text = compose_yaml(cfg, layout);
    std::fs::write(out.join("compose.yaml"), &text)?;
    Ok(text)
}

/// `compose.yaml` for `layout`: a pure function of it, so the file in
/// this repository can be checked against what the render makes.
pub fn compose_yaml(cfg: &Config, layout: &Layout) -> String {
    let mut y = Yaml::default();
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let nodes = layout.nats_nodes;
    let nats_url = (0..nodes)
        .map(|n| format!("nats://nats-{n}:4222"))
        .collect::<Vec<_>>()
        .join(",");
    y.line(
        0,
        "# Written by `nisse deploy render --compose`: a NATS cluster, `nisse bus init`",
    );
    y.line(
        0,
        "# once, then every service of every agent in a container of its own, each",
    );
    y.line(
        0,
        "# holding only its own NATS credentials (compose secrets) and files.",
    );
    y.line(0, "name: nisse");
    y.line(0, "services:");
    for n in 0..nodes {
        y.line(1, &format!("nats-{n}:"));
        y.line(2, &format!("image: {}", q(NATS_IMAGE)));
        y.line(
            2,
            "command: [\"-c\", \"/etc/nats/nats.conf\", \"-m\", \"8222\"]",
        );
        y.line(2, "volumes:");
        y.line(
            3,
            &format!(
                "- {}",
                q(&format!("./nats/nats-{n}.conf:/etc/nats/nats.conf:ro"))
            ),
        );
        y.line(3, &format!("- {}", q(&format!("nats-{n}:/data/jetstream"))));
        y.line(2, "healthcheck:");
        y.line(3, "test: [\"CMD\", \"wget\", \"-q\", \"-O-\", \"http://127.0.0.1:8222/healthz?js-enabled-only=true\"]");
        y.line(3, "interval: \"10s\"");
        y.line(3, "timeout: \"3s\"");
        y.line(3, "retries: 5");
        y.line(2, "restart: \"unless-stopped\"");
    }
    // The init: the topology, once, as the admin.
    y.line(1, "init:");
    nisse_image(&mut y);
    y.line(2, "command: [\"bus\", \"init\"]");
    y.line(2, "environment:");
    y.line(3, &format!("NISSE_BUS__URL: {}", q(&nats_url)));
    y.line(
        3,
        &format!(
            "NISSE_BUS__STREAMS__REPLICAS: {}",
            q(&replicas(cfg, layout))
        ),
    );
    y.line(2, "volumes: [\"./nisse.toml:/etc/nisse/nisse.toml:ro\"]");
    y.line(2, "secrets:");
    secret_mount(
        &mut y,
        "nats-admin",
        &format!("/data/credentials/nats/{}.nk", Identity::Admin),
    );
    y.line(2, "depends_on:");
    for n in 0..nodes {
        y.line(
            3,
            &format!("nats-{n}: {{ condition: \"service_healthy\" }}"),
        );
    }
    y.line(2, "restart: \"on-failure\"");
    let mut volumes: Vec<String> = (0..nodes).map(|n| format!("nats-{n}")).collect();
    let mut secrets: BTreeMap<String, String> = BTreeMap::from([(
        "nats-admin".to_string(),
        format!("./credentials/nats/{}.nk", Identity::Admin),
    )]);
    for unit in &layout.units {
        y.line(1, &format!("{}:", unit.name));
        nisse_image(&mut y);
        let command_text: Vec<String> = serve_args(unit, &format!("0.0.0.0:{HEALTH_PORT}"))
            .iter()
            .map(|c| q(c))
            .collect();
        y.line(2, &format!("command: [{}]", command_text.join(", ")));
        let mut env = vec![format!("NISSE_BUS__URL: {}", q(&nats_url))];
        if unit.vault.is_some() {
            env.push(format!("NISSE_VAULT__DIR: {}", q("/vault")));
        }
        if let Some(listens) = unit.listens {
            env.push(format!(
                "NISSE_{}__LISTEN: {}",
                listens.to_ascii_uppercase().replace('-', "_"),
                q(&format!("0.0.0.0:{}", listen_port(cfg, listens)))
            ));
        }
        for (var, file) in &unit.file_settings {
            env.push(format!(
                "{var}: {}",
                q(&format!("/data/{}", file.display()))
            ));
        }
        y.line(2, "environment:");
        for e in env {
            y.line(3, &e);
        }
        y.line(2, "volumes:");
        y.line(3, "- \"./nisse.toml:/etc/nisse/nisse.toml:ro\"");
        // The unit's whole data directory is its volume: the image makes
        // /data for its user, so a new volume is the user's (one mounted
        // deeper would be root's). Its secrets are mounted over it.
        if !unit.state.is_empty() {
            let volume = format!("{}-data", unit.name);
            y.line(3, &format!("- {}", q(&format!("{volume}:/data"))));
            volumes.push(volume);
        }
        match unit.vault {
            Some(true) => y.line(3, "- \"vault:/vault\""),
            Some(false) => y.line(3, "- \"vault:/vault:ro\""),
            None => {}
        }
        y.line(2, "secrets:");
        for (from, to) in files_of(unit) {
            let name = secret_name(&unit.name, &from);
            secret_mount(&mut y, &name, &format!("/data/{}", to.display()));
            secrets.insert(name, format!("./{}", from.display()));
        }
        if let Some(listens) = unit.listens {
            let port = listen_port(cfg, listens);
            y.line(2, &format!("ports: [\"{port}:{port}\"]"));
        }
        y.line(2, "healthcheck:");
        y.line(
            3,
            &format!(
                "test: [\"CMD\", \"nisse\", \"health\", \"http://127.0.0.1:{HEALTH_PORT}/readyz\"]"
            ),
        );
        y.line(3, "interval: \"10s\"");
        y.line(3, "timeout: \"5s\"");
        y.line(3, "retries: 3");
        y.line(3, "start_period: \"30s\"");
        y.line(2, "depends_on:");
        y.line(3, "init: { condition: \"service_completed_successfully\" }");
        y.line(2, "restart: \"unless-stopped\"");
    }
    // The homeserver and the model proxy, when the configuration uses
    // them: their own configuration is theirs to write (mounted from
    // ./synapse and ./litellm).
    if cfg.matrix.enabled() {
        y.line(1, "synapse:");
        y.line(2, &format!("image: {}", q(SYNAPSE_IMAGE)));
        y.line(2, "volumes: [\"./synapse:/data\"]");
        y.line(2, "restart: \"unless-stopped\"");
    }
    if cfg.models.enabled() {
        y.line(1, "litellm:");
        y.line(2, &format!("image: {}", q(LITELLM_IMAGE)));
        y.line(2, "command: [\"--config\", \"/etc/litellm/config.yaml\"]");
        y.line(
            2,
            "volumes: [\"./litellm/config.yaml:/etc/litellm/config.yaml:ro\"]",
        );
        y.line(2, "restart: \"unless-stopped\"");
    }
    if layout.units.iter().any(|u| u.vault.is_some()) {
        volumes.push("vault".into());
    }
    y.line(0, "volumes:");
    for v in volumes {
        y.line(1, &format!("{v}: {{}}"));
    }
    y.line(0, "secrets:");
    for (name, file) in secrets {
        y.line(1, &format!("{name}: {{ file: {} }}", q(&file)));
    }
    y.0
}

/// `nisse serve` for `unit`, its health answered on `health`.
fn serve_args(unit: &Unit, health: &str) -> Vec<String> {
    let mut args = vec!["serve".to_string(), unit.service.to_string()];
    if let Some(agent) = &unit.agent {
        args.extend(["--agent".into(), agent.clone()]);
    }
    args.extend(["--health-listen".into(), health.to_string()]);
    args
}

/// The image every Nisse unit runs, built from this repository
/// (`docker build -f compose/Dockerfile -t nisse:local .`), as the user
/// without privileges its Dockerfile makes.
fn nisse_image(y: &mut Yaml) {
    y.line(2, "image: \"nisse:local\"");
}

fn secret_mount(y: &mut Yaml, name: &str, target: &str) {
    y.line(
        3,
        &format!("- {{ source: \"{name}\", target: \"{target}\", mode: 0400 }}"),
    );
}

/// A compose secret's name for a unit's file: `<unit>-nats` for its
/// seed, else `<unit>-<file name>`.
fn secret_name(unit: &str, file: &Path) -> String {
    if file.starts_with("credentials/nats") {
        return format!("{unit}-nats");
    }
    let stem = file
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().replace('.', "-"));
    format!("{unit}-{stem}")
}

/// The port the configuration gives a receiver's `listen`.
fn listen_port(cfg: &Config, section: &str) -> u16 {
    match section {
        "intake-alerts" => cfg.intake_alerts.listen.port(),
        "gitea" => cfg.gitea.listen.port(),
        "vikunja" => cfg.vikunja.listen.port(),
        "control" => cfg.control.listen.port(),
        _ => 0,
    }
}

/// YAML text written line by line, two spaces an indent: every value it
/// writes is a number, a flow collection of quoted strings, or a string
/// quoted as JSON quotes it (valid YAML double-quoted scalars).
#[derive(Default)]
struct Yaml(String);

impl Yaml {
    fn line(&mut self, indent: usize, text: &str) {
        for _ in 0..indent {
            self.0.push_str("  ");
        }
        self.0.push_str(text);
        self.0.push('\n');
    }
}
