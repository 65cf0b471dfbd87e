use std::sync::Arc;

use async_nats::jetstream;

use crate::auth::{Credentials, Identity};
use crate::secret::Secret;
use crate::{AgentName, BusConfig, Error, Result};

/// A connection to NATS with JetStream, for a set of agents. Cheap to clone:
/// clones share one connection.
#[derive(Clone)]
pub struct Bus {
    inner: Arc<Inner>,
}

struct Inner {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    agents: Vec<AgentName>,
    config: BusConfig,
    url: String,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("url", &self.inner.url)
            .field("agents", &self.inner.agents)
            .finish_non_exhaustive()
    }
}

impl Bus {
    /// Connects to the server at `config.url` (required here: an embedded
    /// server is started by the caller, which then passes its URL) for the
    /// given agents. `client_name` shows up in the server's connection list,
    /// so each service names itself.
    pub async fn connect(
        config: &BusConfig,
        agents: Vec<AgentName>,
        client_name: &str,
    ) -> Result<Self> {
        Self::connect_inner(config, agents, client_name, None).await
    }

    /// Connects as `identity`: with its seed from `credentials` and its own
    /// inbox prefix, unless the configuration names credentials of its own
    /// (a server the operator runs with another scheme), which are used
    /// as they are. Without either, it connects without credentials, which
    /// a server that requires them refuses with an error naming the file
    /// that is missing.
    pub async fn connect_as(
        config: &BusConfig,
        agents: Vec<AgentName>,
        identity: &Identity,
        credentials: &Credentials,
    ) -> Result<Self> {
        let name = format!("nisse-{identity}");
        if config.has_credentials() {
            return Self::connect_inner(config, agents, &name, None).await;
        }
        let seed = crate::auth::load_seed(credentials, identity)?;
        let missing = seed.is_none();
        let seed = seed.map(|s| (s, identity.inbox_prefix()));
        match Self::connect_inner(config, agents, &name, seed).await {
            Err(Error::Connect { url, reason }) if missing => Err(Error::Connect {
                url,
                reason: format!(
                    "{reason} (connecting as {identity} without credentials: there is no {}; `nisse up` makes it, or `nisse nats-config` for a server you run)",
                    credentials.seed_file(identity).display()
                ),
            }),
            other => other,
        }
    }

    async fn connect_inner(
        config: &BusConfig,
        agents: Vec<AgentName>,
        client_name: &str,
        identity_seed: Option<(String, String)>,
    ) -> Result<Self> {
        let url = config
            .url
            .clone()
            .ok_or_else(|| Error::Config("bus.url is not set".into()))?;
        install_tls_provider();
        let mut opts = async_nats::ConnectOptions::new()
            .name(client_name)
            .connection_timeout(config.connect_timeout)
            .request_timeout(Some(config.request_timeout))
            .require_tls(config.tls.required)
            // Reconnect forever: a NATS restart delays work, never ends it.
            .max_reconnects(None);
        if let Some(path) = &config.creds_file {
            opts = opts
                .credentials_file(path)
                .await
                .map_err(|e| Error::Config(format!("bus.creds-file `{}`: {e}", path.display())))?;
        }
        if let Some(path) = &config.nkey_seed_file {
            let seed = Secret::File(path.clone())
                .read_text()
                .map_err(|e| Error::Config(format!("bus.nkey-seed-file: {e}")))?;
            opts = opts.nkey(seed);
        }
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            opts = opts.user_and_password(user.clone(), password.expose().to_string());
        }
        if let Some(token) = &config.token {
            opts = opts.token(token.expose().to_string());
        }
        if let Some((seed, inbox)) = identity_seed {
            opts = opts.nkey(seed).custom_inbox_prefix(inbox);
        }
        if let Some(ca) = &config.tls.ca_file {
            opts = opts.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&config.tls.cert_file, &config.tls.key_file) {
            opts = opts.add_client_certificate(cert.clone(), key.clone());
        }
        let addrs = url
            .split(',')
            .map(|u| u.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Config(format!("bus.url `{url}`: {e}")))?;
        let client = opts.connect(addrs).await.map_err(|e| Error::Connect {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .build(client.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                jetstream,
                agents,
                config: config.clone(),
                url,
            }),
        })
    }

    /// The agents this bus serves, in configuration order.
    pub fn agents(&self) -> &[AgentName] {
        &self.inner.agents
    }

    /// The configuration it was connected with.
    pub fn config(&self) -> &BusConfig {
        &self.inner.config
    }

    /// The server URL(s) it was connected to.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The JetStream context, for the few things this crate does not wrap
    /// (key-value leases, stream inspection in tools).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.inner.jetstream
    }

    /// The core NATS client.
    pub fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }

    /// Waits until every publish and ack sent so far has reached the server,
    /// so nothing is left in the client's buffers at shutdown.
    pub async fn flush(&self) -> Result<()> {
        self.inner.client.flush().await.map_err(|e| Error::Connect {
            url: self.inner.url.clone(),
            reason: e.to_string(),
        })
    }
}

/// Makes ring rustls's process-wide crypto provider, once. Two providers
/// are compiled in (ring for NATS, aws-lc-rs for the Matrix SDK's HTTP
/// client), and with both rustls will not pick one by itself: the first
/// TLS connection would panic. Every service connects the bus before
/// anything else, so this is early enough.
pub fn install_tls_provider() {
    // An error means one is installed already, which is all that matters.
    let _ = async_nats::rustls::crypto::ring::default_provider().install_default();
}
