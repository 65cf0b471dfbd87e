//! The raw JetStream ceiling the end-to-end alert benches compare with:
//! plain `async-nats` on its own connection publishes messages of an
//! `AlertReceived`'s size to a stream configured as the agent's while a
//! durable pull consumer configured as its brain's receives them and acks
//! them as the brain does (once a full pull, its consumer acking in order).
//! Included by the benches (`#[path]`), beside `cpu.rs` as `super::cpu`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use async_nats::jetstream::{self, consumer, message::PublishMessage};
use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use nisse_bus::auth::Identity;
use nisse_bus::{AgentName, ConsumerSpec, HEADER_TYPE, SubjectKind};

use super::cpu::cpu_now;

/// The ceiling's stream, subject and durable consumer.
const RAW_STREAM: &str = "RAW";
const RAW_SUBJECT: &str = "raw.in.alert";
const RAW_CONSUMER: &str = "raw-brain";
/// Outstanding publish acks of the ceiling's publisher: the intake's
/// `PUBLISH_CONCURRENCY`.
pub const PUBLISH_WINDOW: usize = 256;
/// Longest one ceiling run may take.
const TIMEOUT: Duration = Duration::from_secs(300);

/// The ceiling's side: its own connection, stream and consumer.
pub struct Raw {
    client: async_nats::Client,
    js: jetstream::Context,
    consumer: consumer::PullConsumer,
    /// The payload of one stored `AlertReceived`.
    pub payload: Bytes,
    type_name: String,
    /// The length of its dedup id.
    pub id_len: usize,
    next: u64,
    /// Whether its consumer, configured as the brain's, acks in order
    /// (`AckAll`).
    acks_all: bool,
}

/// One ceiling run.
pub struct RawRun {
    /// Messages per second, first publish to last ack.
    pub rate: f64,
    /// CPU µs per message of the bench process and of the server.
    pub cpu_client: f64,
    pub cpu_server: f64,
}

impl Raw {
    /// On the server at `url` (as the admin, with `admin_seed`, when it
    /// requires credentials), creates the ceiling's stream and consumer,
    /// configured as `agent`'s stream and its brain's consumer, and takes
    /// one `AlertReceived` stored there as the payload (a warm-up has
    /// stored some).
    pub async fn new(
        url: &str,
        admin_seed: Option<&str>,
        request_timeout: Duration,
        agent: &AgentName,
    ) -> Result<Self> {
        let mut options = async_nats::ConnectOptions::new()
            .name("bench-raw")
            .request_timeout(Some(request_timeout))
            .max_reconnects(None);
        if let Some(seed) = admin_seed {
            options = options
                .nkey(seed.to_string())
                .custom_inbox_prefix(Identity::Admin.inbox_prefix());
        }
        let client = options.connect(url).await?;
        let js = jetstream::ContextBuilder::new()
            .timeout(request_timeout)
            .build(client.clone());

        let mut ops = js.get_stream(agent.stream()).await?;
        let mut stream_cfg = ops.info().await?.config.clone();
        stream_cfg.name = RAW_STREAM.into();
        stream_cfg.subjects = vec!["raw.>".into()];
        stream_cfg.description = Some("the alert benches' raw JetStream ceiling".into());
        let raw_stream = js
            .create_stream(stream_cfg)
            .await
            .map_err(|e| anyhow!("creating stream {RAW_STREAM}: {e}"))?;
        let brain = ops
            .consumer_info(ConsumerSpec::BRAIN.name)
            .await?
            .config
            .clone();
        let acks_all = brain.ack_policy == consumer::AckPolicy::All;
        raw_stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(RAW_CONSUMER.into()),
                description: Some("the ceiling's consumer, configured as the brain's".into()),
                deliver_policy: brain.deliver_policy,
                ack_policy: brain.ack_policy,
                ack_wait: brain.ack_wait,
                max_deliver: brain.max_deliver,
                max_ack_pending: brain.max_ack_pending,
                num_replicas: brain.num_replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow!("creating consumer {RAW_CONSUMER}: {e}"))?;
        let consumer: consumer::PullConsumer = raw_stream
            .get_consumer(RAW_CONSUMER)
            .await
            .map_err(|e| anyhow!(e))?;

        let alert_subject = agent.subject(SubjectKind::InAlert);
        let mut sample = None;
        for seq in 1..=ops.info().await?.state.last_sequence {
            let msg = ops.get_raw_message(seq).await?;
            if msg.subject.as_str() == alert_subject {
                sample = Some(msg);
                break;
            }
        }
        let sample = sample.context("no AlertReceived in the agent's stream after the warm-up")?;
        let header = |name: &str| {
            sample
                .headers
                .get(name)
                .map(|v| v.as_str().to_string())
                .with_context(|| format!("the stored AlertReceived has no {name} header"))
        };
        let type_name = header(HEADER_TYPE)?;
        let id_len = header("Nats-Msg-Id")?.len();
        Ok(Self {
            client,
            js,
            consumer,
            payload: sample.payload,
            type_name,
            id_len,
            next: 0,
            acks_all,
        })
    }

    /// `n` messages published with up to `PUBLISH_WINDOW` acks
    /// outstanding while the consumer receives and acks them; the CPU
    /// of this process and of the server `server_pid`.
    pub async fn ceiling(&mut self, n: usize, server_pid: Option<u32>) -> Result<RawRun> {
        // Ids of the same length as the intake's dedup ids.
        let width = self.id_len.saturating_sub(4);
        let ids: Vec<String> = (self.next..self.next + n as u64)
            .map(|i| format!("raw-{i:0width$}"))
            .collect();
        self.next += n as u64;
        let mut messages = self
            .consumer
            .stream()
            // As the brain pulls, with the default tuning.
            .max_messages_per_batch(ConsumerSpec::BRAIN.pull_batch(&Default::default()))
            .messages()
            .await?;
        // A consumer that acks in order, as the brain's does, is acked as
        // the brain acks: once a full pull (and at the end), so the
        // ceiling never pays for acks the brain no longer sends.
        let ack_every = if self.acks_all {
            ConsumerSpec::BRAIN.pull_batch(&Default::default())
        } else {
            1
        };
        let subject = async_nats::Subject::from(RAW_SUBJECT);
        let cpu_before = cpu_now(server_pid);
        let start = Instant::now();
        let consuming = tokio::spawn(async move {
            for i in 1..=n {
                let msg = messages
                    .next()
                    .await
                    .context("the raw consumer ended early")??;
                if i % ack_every == 0 || i == n {
                    msg.ack().await.map_err(|e| anyhow!(e))?;
                }
            }
            anyhow::Ok(Instant::now())
        });
        let publishing = async {
            let mut inflight: FuturesUnordered<
                <jetstream::context::PublishAckFuture as IntoFuture>::IntoFuture,
            > = FuturesUnordered::new();
            for id in &ids {
                if inflight.len() >= PUBLISH_WINDOW
                    && let Some(ack) = inflight.next().await
                {
                    ensure!(!ack?.duplicate, "a raw publish was a duplicate");
                }
                let publish = PublishMessage::build()
                    .payload(self.payload.clone())
                    .message_id(id)
                    .header(HEADER_TYPE, self.type_name.as_str());
                let ack = self.js.send_publish(subject.clone(), publish).await?;
                inflight.push(ack.into_future());
            }
            while let Some(ack) = inflight.next().await {
                ensure!(!ack?.duplicate, "a raw publish was a duplicate");
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(TIMEOUT, publishing)
            .await
            .map_err(|_| anyhow!("publishing {n} raw messages took longer than {TIMEOUT:?}"))??;
        let end = tokio::time::timeout(TIMEOUT, consuming)
            .await
            .map_err(|_| anyhow!("consuming {n} raw messages took longer than {TIMEOUT:?}"))?
            .context("the raw consumer panicked")??;
        let cpu = cpu_now(server_pid).since(cpu_before);
        self.client.flush().await?;
        self.check(n).await?;
        Ok(RawRun {
            rate: n as f64 / end.duration_since(start).as_secs_f64(),
            cpu_client: cpu.client_ns as f64 / 1e3 / n as f64,
            cpu_server: cpu.server_ns as f64 / 1e3 / n as f64,
        })
    }

    /// Fails if the ceiling's consumer left anything unacked or
    /// redelivered.
    async fn check(&self, n: usize) -> Result<()> {
        let stream = self.js.get_stream(RAW_STREAM).await?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let info = stream.consumer_info(RAW_CONSUMER).await?;
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                ensure!(
                    info.num_redelivered == 0 && info.delivered.stream_sequence == self.next,
                    "raw consumer: {} redelivered, {} delivered of {} published ({n} this time)",
                    info.num_redelivered,
                    info.delivered.stream_sequence,
                    self.next
                );
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "raw consumer: {} pending and {} unacked after the round",
                    info.num_pending,
                    info.num_ack_pending
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
