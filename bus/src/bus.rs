use std::sync::Arc;

use async_nats::jetstream;

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
            let seed = std::fs::read_to_string(path).map_err(|e| {
                Error::Config(format!("bus.nkey-seed-file `{}`: {e}", path.display()))
            })?;
            opts = opts.nkey(seed.trim().to_string());
        }
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            opts = opts.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &config.token {
            opts = opts.token(token.clone());
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

    /// The key-value bucket `name`. Opened for each use, not cached: a
    /// cached handle to a bucket that was deleted makes reads wait for the
    /// request timeout, where opening fails at once, and the switch board
    /// is read to fail closed quickly.
    pub(crate) async fn bucket(&self, name: &str) -> Result<jetstream::kv::Store> {
        self.jetstream()
            .get_key_value(name)
            .await
            .map_err(|e| Error::JetStream {
                action: format!("open the key-value bucket {name}"),
                reason: e.to_string(),
            })
    }

    /// The JSON value under `key` in `bucket` and its revision, if there is
    /// one (a deleted key is none). `what` names it in errors.
    pub(crate) async fn read_versioned<T: serde::de::DeserializeOwned>(
        &self,
        bucket: &str,
        key: &str,
        what: &str,
    ) -> Result<Option<(T, u64)>> {
        use jetstream::kv::Operation;
        let store = self.bucket(bucket).await?;
        let err = |e: &dyn std::fmt::Display| Error::JetStream {
            action: format!("read {what}"),
            reason: e.to_string(),
        };
        match store.entry(key).await.map_err(|e| err(&e))? {
            Some(entry) if entry.operation == Operation::Put => {
                let value = serde_json::from_slice(&entry.value).map_err(|e| err(&e))?;
                Ok(Some((value, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Writes `value` as JSON under `key` in `bucket` by compare-and-set:
    /// created when `revision` is `None` (only if there is none), else
    /// replacing exactly that revision. `Ok(None)` means someone else wrote
    /// first: read again and redo the change. `what` names it in errors.
    pub(crate) async fn write_versioned<T: serde::Serialize>(
        &self,
        bucket: &str,
        key: &str,
        value: &T,
        revision: Option<u64>,
        what: &str,
    ) -> Result<Option<u64>> {
        use jetstream::kv::{CreateErrorKind, UpdateErrorKind};
        let store = self.bucket(bucket).await?;
        let err = |e: &dyn std::fmt::Display| Error::JetStream {
            action: format!("write {what}"),
            reason: e.to_string(),
        };
        let bytes = serde_json::to_vec(value).map_err(|e| err(&e))?;
        match revision {
            None => match store.create(key, bytes.into()).await {
                Ok(r) => Ok(Some(r)),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(err(&e)),
            },
            Some(rev) => match store.update(key, bytes.into(), rev).await {
                Ok(r) => Ok(Some(r)),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
                Err(e) => Err(err(&e)),
            },
        }
    }

    /// Every JSON value in `bucket` whose key starts with `<agent>.`, in
    /// key order; values that do not decode are skipped. `what` names them
    /// in errors.
    pub(crate) async fn list_json<T: serde::de::DeserializeOwned>(
        &self,
        bucket: &str,
        agent: &crate::AgentName,
        what: &str,
    ) -> Result<Vec<T>> {
        use futures::StreamExt as _;
        let store = self.bucket(bucket).await?;
        let err = |e: &dyn std::fmt::Display| Error::JetStream {
            action: format!("list {what}"),
            reason: e.to_string(),
        };
        let mut keys = store.keys().await.map_err(|e| err(&e))?;
        let prefix = format!("{agent}.");
        let mut found = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| err(&e))?;
            if key.starts_with(&prefix) {
                found.push(key);
            }
        }
        found.sort();
        let mut out = Vec::new();
        for key in found {
            if let Some(value) = store.get(&key).await.map_err(|e| err(&e))?
                && let Ok(v) = serde_json::from_slice::<T>(&value)
            {
                out.push(v);
            }
        }
        Ok(out)
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
