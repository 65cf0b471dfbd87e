use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::secret::SecretString;

/// How to reach NATS and how the bus's streams and consumers are shaped.
/// In `nisse.toml` this is the `[bus]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct BusConfig {
    /// NATS server URL(s), comma-separated (`nats://host:4222`,
    /// `tls://host:4222`). Unset: `nisse up` starts its own server.
    pub url: Option<String>,
    /// A NATS `.creds` file (JWT and nkey seed) for decentralised auth.
    pub creds_file: Option<PathBuf>,
    /// A file holding an nkey seed (`SU...`), for nkey auth.
    pub nkey_seed_file: Option<PathBuf>,
    /// User name for user/password auth; needs `password`.
    pub user: Option<String>,
    /// Password for user/password auth.
    pub password: Option<SecretString>,
    /// Token for token auth.
    pub token: Option<SecretString>,
    /// TLS settings; plain TCP when not required and the URL is `nats://`.
    pub tls: TlsConfig,
    /// How long to wait for a connection before failing.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub connect_timeout: Duration,
    /// How long to wait for a JetStream API answer or a publish ack.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub request_timeout: Duration,
    /// Limits of every agent stream.
    pub streams: StreamLimits,
    /// Defaults of every durable consumer.
    pub consumers: ConsumerTuning,
    /// How long a lease (one active brain per agent) lasts without renewal:
    /// a standby takes over this long after the holder died.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub lease_ttl: Duration,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            url: None,
            creds_file: None,
            nkey_seed_file: None,
            user: None,
            password: None,
            token: None,
            tls: TlsConfig::default(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            streams: StreamLimits::default(),
            consumers: ConsumerTuning::default(),
            lease_ttl: Duration::from_secs(15),
        }
    }
}

/// TLS to NATS. Certificates are PEM files.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Refuse to connect without TLS.
    pub required: bool,
    /// CA certificate(s) to verify the server with, in addition to the
    /// system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS; needs `key-file`.
    pub cert_file: Option<PathBuf>,
    /// Client private key for mutual TLS; needs `cert-file`.
    pub key_file: Option<PathBuf>,
}

/// Limits of an agent stream. The stream is the agent's whole replayable
/// history, so these say how much history is kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct StreamLimits {
    /// Messages older than this are removed.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub max_age: Duration,
    /// Most bytes a stream may hold. When full, publishes are refused (and
    /// intake answers 5xx so senders retry) rather than silently dropping
    /// history no consumer has processed yet.
    #[schemars(with = "String")]
    pub max_bytes: ByteSize,
    /// Replicas of each stream, consumer and bucket: `"auto"` (the
    /// default) takes them from the server they are made on, one per
    /// server of its cluster up to 3 (1 on a single server); a number
    /// (1 to 5) fixes them, more than 1 needing a cluster of that many.
    #[schemars(with = "String")]
    pub replicas: Replicas,
    /// Window within which a publish with an already-seen message id is
    /// dropped as a duplicate. It must cover a crash and restart, since a
    /// restarted brain republishes its outputs with the same ids.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub duplicate_window: Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_bytes: ByteSize::gib(8),
            replicas: Replicas::Auto,
            duplicate_window: Duration::from_secs(10 * 60),
        }
    }
}

/// How many replicas streams, consumers and buckets have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replicas {
    /// As many as the cluster the topology is made on has servers, up to
    /// three (JetStream's usual quorum); one on a single server.
    #[default]
    Auto,
    /// This many.
    Count(usize),
}

impl Replicas {
    /// The replica count on a cluster of `servers` servers.
    pub fn on(self, servers: usize) -> usize {
        match self {
            Self::Auto => servers.clamp(1, 3),
            Self::Count(n) => n,
        }
    }
}

impl Serialize for Replicas {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Auto => s.serialize_str("auto"),
            Self::Count(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Replicas {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Replicas;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"auto\" or a number of replicas")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Replicas, E> {
                usize::try_from(n)
                    .map(Replicas::Count)
                    .map_err(|_| E::custom("too many replicas"))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Replicas, E> {
                usize::try_from(n)
                    .map(Replicas::Count)
                    .map_err(|_| E::custom(format!("{n} replicas: must be 1 to 5 or \"auto\"")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Replicas, E> {
                match v.trim() {
                    "auto" => Ok(Replicas::Auto),
                    other => other.parse::<usize>().map(Replicas::Count).map_err(|_| {
                        E::custom(format!("`{other}` is not \"auto\" or a number of replicas"))
                    }),
                }
            }
        }
        d.deserialize_any(Visit)
    }
}

/// Defaults of every durable consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct ConsumerTuning {
    /// How long the server waits for an ack before redelivering. Long
    /// handlers keep a message with progress acks, sent every third of this.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub ack_wait: Duration,
    /// Deliveries before a message is dead-lettered instead of retried.
    pub max_deliver: u32,
    /// Delay before the first retry of a failed message; it doubles per
    /// delivery up to `retry-backoff-max`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_backoff: Duration,
    /// Longest delay between retries.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String")]
    pub retry_backoff_max: Duration,
    /// Messages a consumer instance may hold un-acked at once; with several
    /// instances this is also how finely work is split between them. A
    /// brain's consumer gets at least 2,048 whatever this says: it acks a
    /// batch once its commit is durable, while it applies the next.
    pub max_ack_pending: u32,
}

impl Default for ConsumerTuning {
    fn default() -> Self {
        Self {
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            retry_backoff: Duration::from_secs(1),
            retry_backoff_max: Duration::from_secs(300),
            max_ack_pending: 256,
        }
    }
}

impl ConsumerTuning {
    /// The backoff between retries of a failed message.
    pub fn backoff(&self) -> crate::Backoff {
        crate::Backoff::new(self.retry_backoff, self.retry_backoff_max)
    }
}

impl BusConfig {
    /// Whether the configuration names credentials of its own (a creds
    /// file, an nkey seed, a user and password, a token), which then take
    /// the place of the generated per-identity ones.
    pub fn has_credentials(&self) -> bool {
        self.creds_file.is_some()
            || self.nkey_seed_file.is_some()
            || self.user.is_some()
            || self.token.is_some()
    }

    /// Checks what serde cannot: combinations and ranges. Each problem is a
    /// pair of the key (under `prefix`, e.g. `bus`) and what is wrong with it.
    pub fn validate(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |key: &str, problem: String| out.push((format!("{prefix}.{key}"), problem));
        if let Some(url) = &self.url {
            for part in url.split(',') {
                let part = part.trim();
                if let Err(e) = part.parse::<async_nats::ServerAddr>() {
                    bad("url", format!("`{part}` is not a NATS server URL: {e}"));
                }
            }
        }
        if self.user.is_some() != self.password.is_some() {
            bad("user", "`user` and `password` must be set together".into());
        }
        let methods = [
            self.creds_file.is_some(),
            self.nkey_seed_file.is_some(),
            self.user.is_some(),
            self.token.is_some(),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            bad(
                "creds-file",
                "set only one of `creds-file`, `nkey-seed-file`, `user`/`password`, `token`".into(),
            );
        }
        for (key, path) in [
            ("creds-file", &self.creds_file),
            ("nkey-seed-file", &self.nkey_seed_file),
            ("tls.ca-file", &self.tls.ca_file),
            ("tls.cert-file", &self.tls.cert_file),
            ("tls.key-file", &self.tls.key_file),
        ] {
            if let Some(p) = path
                && !p.is_file()
            {
                bad(key, format!("file `{}` does not exist", p.display()));
            }
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            bad(
                "tls.cert-file",
                "`tls.cert-file` and `tls.key-file` must be set together".into(),
            );
        }
        for (key, d) in [
            ("connect-timeout", self.connect_timeout),
            ("request-timeout", self.request_timeout),
            ("streams.max-age", self.streams.max_age),
            ("streams.duplicate-window", self.streams.duplicate_window),
            ("consumers.ack-wait", self.consumers.ack_wait),
        ] {
            if d.is_zero() {
                bad(key, "must be longer than zero".into());
            }
        }
        if self.lease_ttl < Duration::from_secs(1) {
            bad("lease-ttl", "must be at least 1s".into());
        }
        if self.streams.duplicate_window > self.streams.max_age {
            bad(
                "streams.duplicate-window",
                "must not be longer than `streams.max-age`".into(),
            );
        }
        if self.streams.max_bytes.as_u64() < 1024 * 1024 {
            bad("streams.max-bytes", "must be at least 1 MiB".into());
        }
        if let Replicas::Count(n) = self.streams.replicas
            && !(1..=5).contains(&n)
        {
            bad(
                "streams.replicas",
                "must be between 1 and 5, or \"auto\"".into(),
            );
        }
        if self.consumers.max_deliver < 1 {
            bad("consumers.max-deliver", "must be at least 1".into());
        }
        if self.consumers.max_ack_pending < 1 {
            bad("consumers.max-ack-pending", "must be at least 1".into());
        }
        if self.consumers.retry_backoff > self.consumers.retry_backoff_max {
            bad(
                "consumers.retry-backoff",
                "must not be longer than `consumers.retry-backoff-max`".into(),
            );
        }
        out
    }
}
