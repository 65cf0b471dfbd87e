//! Webhook deliveries as Vikunja makes them (`Webhook.sendWebhookPayload`,
//! `WebhookDeliveryListener`, the watermill retry in `pkg/events`): a
//! POST of the payload with `Content-Type`, `User-Agent` and, with a
//! secret, `X-Vikunja-Signature`; one delivery at a time in the order the
//! events happened (Vikunja's single `webhook.delivery` subscriber acks
//! one message before it gets the next, retries included); a failed one
//! retried with the very same body.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::{State, VikunjaStandIn, lock};

/// How long a receiver gets to answer (Vikunja's `webhooks.timeoutseconds`
/// is 30).
const DELIVER_TIMEOUT: Duration = Duration::from_secs(5);

/// The waits between attempts: Vikunja's `MaxRetries: 5` (6 attempts in
/// all), its 100 ms doubling backoff made shorter and without jitter.
const BACKOFF_MS: [u64; 5] = [50, 100, 200, 400, 800];

/// One attempt to deliver an event to one webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The webhook it was for.
    pub webhook_id: i64,
    /// The event's name, e.g. `task.comment.created`.
    pub event: String,
    /// Where it went (the webhook's `target_url` at the time).
    pub url: String,
    /// Every header the stand-in set, in order.
    pub headers: Vec<(String, String)>,
    /// The body, exactly as sent; every attempt of an event sends the
    /// same.
    pub body: String,
    /// `X-Vikunja-Signature`, if the webhook has a secret.
    pub signature: Option<String>,
    /// The status the receiver answered; `None` if it did not answer
    /// (refused connection, timeout).
    pub status: Option<u16>,
    /// Why it got no answer, if it did not.
    pub error: Option<String>,
    /// Which attempt this was: 1, then 2… for its retries.
    pub attempt: u32,
}

impl Delivery {
    /// The value of header `name` (case-insensitive), if it was set.
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

    /// Whether Vikunja counts it delivered: an answer below 400.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s < 400)
    }
}

/// An event's delivery to one webhook, waiting in the queue.
pub(crate) struct Outgoing {
    pub(crate) webhook_id: i64,
    pub(crate) event: String,
    pub(crate) body: String,
}

enum Job {
    /// Deliver, retrying; tell `first` once the first attempt was made.
    Send {
        outgoing: Outgoing,
        first: Option<oneshot::Sender<()>>,
    },
    /// Answer once everything queued before is done.
    Flush(oneshot::Sender<()>),
}

/// The delivery queue and its HTTP client.
pub(crate) struct Queue {
    jobs: mpsc::UnboundedSender<Job>,
    client: reqwest::Client,
}

impl Queue {
    /// Starts the worker that delivers, in order, what is queued.
    pub(crate) fn start(state: Arc<Mutex<State>>) -> anyhow::Result<(Self, JoinHandle<()>)> {
        let client = reqwest::Client::builder()
            .timeout(DELIVER_TIMEOUT)
            .build()
            .context("building the webhook client")?;
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        let worker_client = client.clone();
        let worker = tokio::spawn(async move {
            while let Some(job) = queue.recv().await {
                match job {
                    Job::Flush(done) => {
                        let _ = done.send(());
                    }
                    Job::Send {
                        outgoing,
                        mut first,
                    } => {
                        deliver(&worker_client, &state, &outgoing, &mut first).await;
                        if let Some(first) = first {
                            let _ = first.send(());
                        }
                    }
                }
            }
        });
        Ok((Self { jobs, client }, worker))
    }

    /// Queues `outgoing`; the receiver answers once its first attempt was
    /// made (or it was dropped, its webhook gone).
    pub(crate) fn send(&self, outgoing: Outgoing) -> oneshot::Receiver<()> {
        let (first, wait) = oneshot::channel();
        // The worker lives as long as the stand-in; once it is gone nobody
        // waits.
        let _ = self.jobs.send(Job::Send {
            outgoing,
            first: Some(first),
        });
        wait
    }

    /// Waits until everything queued so far is done, retries included.
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
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<u16> {
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| ((*n).to_string(), (*v).to_string()))
            .collect();
        post(&self.client, url, &headers, body).await
    }
}

/// Attempts `outgoing` until it succeeds or the attempts run out, each
/// with the webhook as it is then (Vikunja reloads it per attempt; a
/// deleted one is skipped), each recorded.
async fn deliver(
    client: &reqwest::Client,
    state: &Mutex<State>,
    outgoing: &Outgoing,
    first: &mut Option<oneshot::Sender<()>>,
) {
    for attempt in 1..=(BACKOFF_MS.len() as u32 + 1) {
        let hook = {
            let state = lock(state);
            state
                .hooks
                .iter()
                .find(|h| h.id == outgoing.webhook_id)
                .map(|h| (h.target_url.clone(), h.secret.clone(), h.basic_auth.clone()))
        };
        let Some((url, secret, basic_auth)) = hook else {
            return;
        };
        let signature =
            (!secret.is_empty()).then(|| VikunjaStandIn::sign(&secret, outgoing.body.as_bytes()));
        let mut headers = Vec::new();
        if let Some(sig) = &signature {
            headers.push(("X-Vikunja-Signature".to_string(), sig.clone()));
        }
        if let Some((user, password)) = &basic_auth {
            let encoded = base64(format!("{user}:{password}").as_bytes());
            headers.push(("Authorization".to_string(), format!("Basic {encoded}")));
        }
        headers.push((
            "User-Agent".to_string(),
            format!("Vikunja/{}", super::VIKUNJA_VERSION),
        ));
        headers.push(("Content-Type".to_string(), "application/json".to_string()));
        let outcome = post(client, &url, &headers, outgoing.body.as_bytes()).await;
        let (status, error) = match outcome {
            Ok(status) => (Some(status), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        lock(state).deliveries.push(Delivery {
            webhook_id: outgoing.webhook_id,
            event: outgoing.event.clone(),
            url,
            headers,
            body: outgoing.body.clone(),
            signature,
            status,
            error,
            attempt,
        });
        if let Some(first) = first.take() {
            let _ = first.send(());
        }
        if status.is_some_and(|s| s < 400) {
            return;
        }
        if let Some(wait) = BACKOFF_MS.get(attempt as usize - 1) {
            tokio::time::sleep(Duration::from_millis(*wait)).await;
        }
    }
}

/// Standard base64 with padding, as Go's `base64.StdEncoding` writes
/// the basic-auth credentials.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
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

#[cfg(test)]
mod unit {
    #[test]
    fn base64_is_standard_with_padding() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"a"), "YQ==");
        assert_eq!(super::base64(b"ab"), "YWI=");
        assert_eq!(super::base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(super::base64(&[0xff, 0xfe, 0xfd, 0x00]), "//79AA==");
    }
}
