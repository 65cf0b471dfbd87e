//! Webhook deliveries as Gitea makes them (`services/webhook/deliver.go`):
//! a POST of the JSON payload with Gitea's headers and signatures, one at
//! a time in the order the events happened, each attempt recorded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use hmac::Mac as _;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::State;

/// How long a receiver gets to answer: Gitea's default
/// `[webhook] DELIVER_TIMEOUT`.
const DELIVER_TIMEOUT: Duration = Duration::from_secs(5);

/// A webhook: where events go and the secret they are signed with.
pub(crate) struct Hook {
    pub(crate) url: String,
    pub(crate) secret: String,
}

/// One attempt to deliver an event to one webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The delivery's id (`X-Gitea-Delivery`, a UUID), the same for every
    /// attempt of it.
    pub id: String,
    /// Where it went.
    pub url: String,
    /// `X-Gitea-Event`, e.g. `issues`, `issue_comment`, `pull_request`.
    pub event: String,
    /// `X-Gitea-Event-Type`, e.g. `issue_assign`, `pull_request_comment`.
    pub event_type: String,
    /// Every header sent, in order, as sent.
    pub headers: Vec<(String, String)>,
    /// The body, exactly as sent.
    pub body: String,
    /// Not sent because webhooks were disabled when the event happened.
    pub lost: bool,
    /// The status the receiver answered, once it answered.
    pub status: Option<u16>,
    /// Why it got no answer, if it did not (connection refused, timeout).
    pub error: Option<String>,
}

impl Delivery {
    /// The value of header `name` (case-insensitive), if it was sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON.
    pub fn payload(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.body).context("a delivery's body is not JSON")
    }
}

enum Job {
    /// Send the delivery at this index of `State::deliveries`.
    Send {
        index: usize,
        done: Option<oneshot::Sender<()>>,
    },
    /// Answer once everything queued before has been attempted.
    Flush(oneshot::Sender<()>),
}

/// The delivery queue and its HTTP client.
pub(crate) struct Queue {
    jobs: mpsc::UnboundedSender<Job>,
    client: reqwest::Client,
    state: Arc<Mutex<State>>,
}

impl Queue {
    /// Starts the worker that delivers, in order, what is queued.
    pub(crate) fn start(state: Arc<Mutex<State>>) -> anyhow::Result<(Self, JoinHandle<()>)> {
        let client = reqwest::Client::builder()
            .timeout(DELIVER_TIMEOUT)
            // Gitea delivers with Go's HTTP client, which names itself so.
            .user_agent("Go-http-client/1.1")
            .build()
            .context("building the webhook client")?;
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        let worker_client = client.clone();
        let worker_state = state.clone();
        let worker = tokio::spawn(async move {
            let state = worker_state;
            while let Some(job) = queue.recv().await {
                match job {
                    Job::Flush(done) => {
                        let _ = done.send(());
                    }
                    Job::Send { index, done } => {
                        let delivery = lock(&state).deliveries.get(index).cloned();
                        if let Some(delivery) = delivery.filter(|d| !d.lost) {
                            let outcome = post(
                                &worker_client,
                                &delivery.url,
                                &delivery.headers,
                                delivery.body.as_bytes(),
                            )
                            .await;
                            if let Some(record) = lock(&state).deliveries.get_mut(index) {
                                match outcome {
                                    Ok(status) => record.status = Some(status),
                                    Err(e) => record.error = Some(format!("{e:#}")),
                                }
                            }
                        }
                        if let Some(done) = done {
                            let _ = done.send(());
                        }
                    }
                }
            }
        });
        Ok((
            Self {
                jobs,
                client,
                state,
            },
            worker,
        ))
    }

    /// Records one delivery of `payload` as event type `event_type` per
    /// webhook and queues them; the receivers answer once each was
    /// attempted. Called with the state locked, so deliveries keep the
    /// order of the changes.
    pub(crate) fn event(
        &self,
        state: &mut State,
        event_type: &str,
        payload: &Value,
    ) -> Vec<oneshot::Receiver<()>> {
        let body = gitea_json(payload);
        let event = event_of(event_type);
        let mut waits = Vec::new();
        for h in 0..state.hooks.len() {
            let (url, secret) = (state.hooks[h].url.clone(), state.hooks[h].secret.clone());
            let id = uuid::Uuid::new_v4().to_string();
            let headers = headers(&id, event, event_type, &secret, body.as_bytes());
            state.deliveries.push(Delivery {
                id,
                url,
                event: event.to_string(),
                event_type: event_type.to_string(),
                headers,
                body: body.clone(),
                lost: !state.hooks_enabled,
                status: None,
                error: None,
            });
            let (done, wait) = oneshot::channel();
            let index = state.deliveries.len() - 1;
            // The worker lives as long as the stand-in; once it is gone
            // nobody waits.
            let _ = self.jobs.send(Job::Send {
                index,
                done: Some(done),
            });
            waits.push(wait);
        }
        waits
    }

    /// Queues another attempt of `delivery`, waits for it and returns the
    /// attempt's record.
    pub(crate) async fn resend(&self, delivery: Delivery) -> anyhow::Result<Delivery> {
        let (done, wait) = oneshot::channel();
        let index = {
            let mut state = lock(&self.state);
            state.deliveries.push(Delivery {
                lost: false,
                status: None,
                error: None,
                ..delivery
            });
            let index = state.deliveries.len() - 1;
            self.jobs
                .send(Job::Send {
                    index,
                    done: Some(done),
                })
                .ok()
                .context("the webhook worker has stopped")?;
            index
        };
        wait.await
            .context("the webhook worker stopped mid-delivery")?;
        lock(&self.state)
            .deliveries
            .get(index)
            .cloned()
            .context("a delivery record vanished")
    }

    /// Waits until everything queued so far was attempted.
    pub(crate) async fn flush(&self) -> anyhow::Result<()> {
        let (done, wait) = oneshot::channel();
        self.jobs
            .send(Job::Flush(done))
            .ok()
            .context("the webhook worker has stopped")?;
        wait.await.context("the webhook worker stopped")
    }

    /// POSTs `body` with `headers` to `url` outside the queue.
    pub(crate) async fn send_raw(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> anyhow::Result<u16> {
        post(&self.client, url, headers, body).await
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> anyhow::Result<u16> {
    let mut request = client.post(url).body(body.to_vec());
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    Ok(response.status().as_u16())
}

/// `X-Gitea-Event` for an event type (`HookEventType.Event()` in
/// `modules/webhook/type.go`).
pub(crate) fn event_of(event_type: &str) -> &'static str {
    match event_type {
        "issues" | "issue_assign" | "issue_label" | "issue_milestone" => "issues",
        "pull_request"
        | "pull_request_assign"
        | "pull_request_label"
        | "pull_request_milestone"
        | "pull_request_sync"
        | "pull_request_review_request" => "pull_request",
        "issue_comment" | "pull_request_comment" => "issue_comment",
        "pull_request_review_approved" => "pull_request_approved",
        "pull_request_review_rejected" => "pull_request_rejected",
        "pull_request_review_comment" => "pull_request_comment",
        _ => "",
    }
}

/// The headers Gitea sends with a delivery, in its order. Without a
/// secret the signatures are empty, as Gitea leaves them.
fn headers(
    id: &str,
    event: &str,
    event_type: &str,
    secret: &str,
    body: &[u8],
) -> Vec<(String, String)> {
    let (sha1, sha256) = if secret.is_empty() {
        (String::new(), String::new())
    } else {
        (hmac_sha1(secret, body), hmac_sha256(secret, body))
    };
    [
        ("Content-Type", "application/json".to_string()),
        ("X-Gitea-Delivery", id.to_string()),
        ("X-Gitea-Event", event.to_string()),
        ("X-Gitea-Event-Type", event_type.to_string()),
        ("X-Gitea-Signature", sha256.clone()),
        ("X-Gogs-Delivery", id.to_string()),
        ("X-Gogs-Event", event.to_string()),
        ("X-Gogs-Event-Type", event_type.to_string()),
        ("X-Gogs-Signature", sha256.clone()),
        ("X-Hub-Signature", format!("sha1={sha1}")),
        ("X-Hub-Signature-256", format!("sha256={sha256}")),
        ("X-GitHub-Delivery", id.to_string()),
        ("X-GitHub-Event", event.to_string()),
        ("X-GitHub-Event-Type", event_type.to_string()),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect()
}

fn hmac_sha256(secret: &str, body: &[u8]) -> String {
    // HMAC takes keys of any length; new_from_slice cannot fail for it.
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()) else {
        unreachable!("HMAC accepts keys of every length")
    };
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

fn hmac_sha1(secret: &str, body: &[u8]) -> String {
    use hmac_sha1::{KeyInit as _, Mac as _};
    let Ok(mut mac) = hmac_sha1::Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes()) else {
        unreachable!("HMAC accepts keys of every length")
    };
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// `payload` as Gitea marshals a webhook payload: indented by two spaces
/// (`json.MarshalIndent(p, "", "  ")`), with Go's HTML-safe escapes of
/// `<`, `>`, `&` and the line and paragraph separators. Those characters
/// can only occur inside JSON strings, so replacing them keeps the JSON
/// equal.
pub(crate) fn gitea_json(payload: &Value) -> String {
    let text = serde_json::to_string_pretty(payload)
        .unwrap_or_else(|e| unreachable!("a serde_json Value always serializes: {e}"));
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}
