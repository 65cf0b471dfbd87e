//! The webhook receiver as Gitea's deliveries reach it: signatures,
//! replays, what is ignored or refused, and acknowledging only what
//! JetStream stored.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::json;

use nisse_proto::v1::{ActorKind, GiteaSource};
use nisse_tests::gitea::ReviewState;

use super::{
    ACCOUNT, OPERATOR, REPO, SECRET, Secrets, Service, assert_problem, comment_payload, config,
    deliver, events, eventually, forge, hook_headers, id_of, issue_payload, nats, post,
    stored_count,
};

/// The service with no Gitea behind it (these deliveries need no API) and
/// no poll.
async fn receiver(bus: &nisse_bus::Bus, secrets: &Secrets) -> Service {
    Service::start(bus, config("http://127.0.0.1:9", secrets, Duration::ZERO)).await
}

#[tokio::test]
async fn a_signed_delivery_is_stored_once_and_a_replay_is_refused() {
    let (_nats, bus) = nats().await;
    let secrets = Secrets::new("unused");
    let service = receiver(&bus, &secrets).await;

    let health = reqwest::get(format!("{}/healthz", service.base))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = reqwest::get(format!("{}/readyz", service.base))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    let delivery = "6f1c2a3e-0000-4000-8000-000000000001";
    let body = issue_payload("opened", 7, REPO, OPERATOR);
    let (status, answer) = deliver(&service.url, "issues", "issues", delivery, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["stored"], 1);
    assert_eq!(answer["duplicates"], 0);

    let stored = events(&bus).await;
    assert_eq!(stored.len(), 1);
    let (m, e) = &stored[0];
    assert_eq!(m.subject, "nisse.dev.in.gitea");
    assert_eq!(
        m.header("Nats-Msg-Id"),
        Some(format!("gitea:{delivery}").as_str())
    );
    assert_eq!(id_of(e), format!("gitea:{delivery}"));
    let actor = e.envelope.as_ref().unwrap().actor.as_ref().unwrap();
    assert_eq!(actor.kind, ActorKind::External as i32);
    assert_eq!(actor.id, "gitea:alice");
    assert_eq!(e.source, GiteaSource::Webhook as i32);
    assert_eq!(e.delivery_id, delivery);
    assert_eq!((e.event.as_str(), e.action.as_str()), ("issues", "opened"));
    assert_eq!(e.repository, REPO);
    assert_eq!(e.sender, OPERATOR);
    let issue = e.issue.as_ref().unwrap();
    assert_eq!(issue.number, 7);
    assert_eq!(issue.title, "The parser drops the last line");
    assert_eq!(issue.labels, ["bug"]);
    assert!(issue.assignees.is_empty());
    assert_eq!(issue.state, "open");
    assert!(!issue.is_pull);
    assert_eq!(issue.updated_at.unwrap().seconds, 1_714_550_400);

    // The same delivery again (a replay): refused, nothing stored.
    let again = deliver(&service.url, "issues", "issues", delivery, &body).await;
    assert_problem(&again, 409, "received already");
    assert_eq!(stored_count(&bus).await, 1);

    // A comment's message is the comment's, whichever way it came.
    let body = comment_payload(41, 7, OPERATOR, "Also on Windows.");
    let (status, answer) = deliver(
        &service.url,
        "issue_comment",
        "issue_comment",
        "6f1c2a3e-0000-4000-8000-000000000002",
        &body,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let stored = events(&bus).await;
    let (_, c) = &stored[1];
    assert_eq!(id_of(c), "gitea:comment:41");
    assert_eq!(c.event, "issue_comment");
    let comment = c.comment.as_ref().unwrap();
    assert_eq!(
        (comment.id, comment.issue_number, comment.author.as_str()),
        (41, 7, OPERATOR)
    );
    assert_eq!(comment.body, "Also on Windows.");
    service.stop().await;
}

#[tokio::test]
async fn tampered_bodies_other_secrets_and_missing_signatures_are_refused() {
    let (_nats, bus) = nats().await;
    let secrets = Secrets::new("unused");
    let service = receiver(&bus, &secrets).await;
    let delivery = "6f1c2a3e-0000-4000-8000-000000000010";
    let body = serde_json::to_vec(&issue_payload("opened", 1, REPO, OPERATOR)).unwrap();

    // Signed, then changed on the way.
    let headers = hook_headers("issues", "issues", delivery, &body, Some(SECRET));
    let mut tampered = body.clone();
    let at = tampered.iter().position(|b| *b == b'1').unwrap();
    tampered[at] = b'2';
    let refused = post(&service.url, &headers, &tampered).await;
    assert_problem(&refused, 401, "not the HMAC-SHA256 of this body");
    assert_eq!(
        refused.1["type"],
        "https://nisse.invalid/problems/gitea/bad-signature"
    );

    // Signed with another secret.
    let forged = hook_headers("issues", "issues", delivery, &body, Some("guessed"));
    assert_problem(
        &post(&service.url, &forged, &body).await,
        401,
        "webhook's secret",
    );

    // Not signed at all, or with something that is not a signature.
    let unsigned = hook_headers("issues", "issues", delivery, &body, None);
    assert_problem(
        &post(&service.url, &unsigned, &body).await,
        401,
        "no X-Gitea-Signature",
    );
    let mut junk = unsigned.clone();
    junk.push(("X-Gitea-Signature".into(), "sha256=abc".into()));
    assert_problem(
        &post(&service.url, &junk, &body).await,
        401,
        "64 hex digits",
    );
    assert_eq!(stored_count(&bus).await, 0, "nothing refused is stored");

    // The secret is read at each request: a rotated one applies at once,
    // and the old one no longer signs.
    std::fs::write(&secrets.secret, "rotated\n").unwrap();
    assert_problem(
        &post(&service.url, &headers, &body).await,
        401,
        "webhook's secret",
    );
    std::fs::write(&secrets.secret, format!("{SECRET}\n")).unwrap();

    // None of the refused ones took the delivery id: the genuine one is
    // taken.
    let (status, answer) = post(&service.url, &headers, &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(stored_count(&bus).await, 1);
    service.stop().await;
}

#[tokio::test]
async fn unknown_events_are_ignored_bad_payloads_name_the_field_and_other_repositories_are_refused()
{
    let (_nats, bus) = nats().await;
    let secrets = Secrets::new("unused");
    let service = receiver(&bus, &secrets).await;

    // A push (and Gitea's "Test delivery", which is one): not taken.
    let push = json!({"ref": "refs/heads/main", "before": "a", "after": "b", "commits": [],
        "repository": {"full_name": REPO}, "sender": {"login": OPERATOR}});
    let (status, answer) = deliver(&service.url, "push", "push", "d-push", &push).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["ignored"], true);
    assert_eq!(answer["event"], "push");

    // A payload that is not what Gitea sends: the field is named.
    let mut bad = issue_payload("opened", 1, REPO, OPERATOR);
    bad["issue"]["number"] = json!("one");
    let refused = deliver(&service.url, "issues", "issues", "d-bad", &bad).await;
    assert_problem(&refused, 400, "issue.number");
    let mut missing = issue_payload("opened", 1, REPO, OPERATOR);
    missing.as_object_mut().unwrap().remove("sender");
    assert_problem(
        &deliver(&service.url, "issues", "issues", "d-missing", &missing).await,
        400,
        "sender",
    );

    // A repository this agent does not serve.
    let other = issue_payload("opened", 1, "mallory/elsewhere", "mallory");
    let refused = deliver(&service.url, "issues", "issues", "d-other", &other).await;
    assert_problem(
        &refused,
        403,
        "`mallory/elsewhere` is not among the repositories",
    );

    // No delivery id; a form-encoded webhook.
    let body = serde_json::to_vec(&issue_payload("opened", 1, REPO, OPERATOR)).unwrap();
    let mut headers = hook_headers("issues", "issues", "x", &body, Some(SECRET));
    headers.retain(|(k, _)| k != "X-Gitea-Delivery");
    assert_problem(
        &post(&service.url, &headers, &body).await,
        400,
        "X-Gitea-Delivery",
    );
    let mut form = hook_headers("issues", "issues", "d-form", &body, Some(SECRET));
    form[0].1 = "application/x-www-form-urlencoded".into();
    assert_problem(
        &post(&service.url, &form, &body).await,
        415,
        "application/json",
    );

    assert_eq!(stored_count(&bus).await, 0, "nothing of these is stored");

    // Refusals record nothing: the bad delivery, sent again as it should
    // have been, is taken.
    let good = issue_payload("opened", 1, REPO, OPERATOR);
    let (status, answer) = deliver(&service.url, "issues", "issues", "d-bad", &good).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(stored_count(&bus).await, 1);
    service.stop().await;
}

#[tokio::test]
async fn a_delivery_is_acknowledged_only_once_jetstream_stored_it() {
    let (mut nats, bus) = nats().await;
    let secrets = Secrets::new("unused");
    let service = receiver(&bus, &secrets).await;
    let delivery = "6f1c2a3e-0000-4000-8000-000000000020";
    let body = issue_payload("opened", 3, REPO, OPERATOR);

    nats.kill().await.unwrap();
    let refused = deliver(&service.url, "issues", "issues", delivery, &body).await;
    assert_problem(&refused, 503, "nothing was stored");
    let not_ready = reqwest::get(format!("{}/readyz", service.base))
        .await
        .unwrap();
    assert_eq!(not_ready.status(), 503);

    nats.restart().await.unwrap();
    eventually(
        "the receiver to reconnect",
        Duration::from_secs(30),
        || async {
            let r = reqwest::get(format!("{}/readyz", service.base))
                .await
                .ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    // Gitea's redelivery of the same delivery is taken now, once.
    let (status, answer) = deliver(&service.url, "issues", "issues", delivery, &body).await;
    assert_eq!(status, 200, "{answer}");
    let stored = events(&bus).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].1.delivery_id, delivery);
    service.stop().await;
}

#[tokio::test]
async fn a_delivery_whose_events_were_not_stored_is_not_recorded_as_taken() {
    let (_nats, bus) = nats().await;
    let secrets = Secrets::new("unused");
    let service = receiver(&bus, &secrets).await;
    let delivery = "6f1c2a3e-0000-4000-8000-000000000030";
    let body = issue_payload("opened", 4, REPO, OPERATOR);

    // The stream is gone (the bucket of records is not): the events
    // cannot be stored, and the delivery must not be recorded either.
    bus.jetstream().delete_stream("AGENT_DEV").await.unwrap();
    let refused = deliver(&service.url, "issues", "issues", delivery, &body).await;
    assert_problem(&refused, 503, "redelivering it is safe");

    bus.ensure_topology().await.unwrap();
    let (status, answer) = deliver(&service.url, "issues", "issues", delivery, &body).await;
    assert_eq!(status, 200, "the redelivery is taken: {answer}");
    assert_eq!(events(&bus).await.len(), 1);
    service.stop().await;
}

#[tokio::test]
async fn an_assignment_names_its_assignee_and_a_review_brings_its_inline_comments() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    forge.gitea.add_webhook(&service.url, SECRET);

    let number = forge
        .repo
        .open_issue(OPERATOR, "Count lines", "Add a line counter.", &["bug"])
        .await
        .unwrap();
    forge.repo.assign(number, ACCOUNT, OPERATOR).await.unwrap();
    forge.gitea.flush_webhooks().await.unwrap();
    for d in forge.gitea.deliveries() {
        assert_eq!(
            d.status,
            Some(200),
            "{} {}: {:?}",
            d.event_type,
            d.id,
            d.error
        );
    }
    let stored = events(&bus).await;
    let assigned = stored
        .iter()
        .map(|(_, e)| e)
        .find(|e| e.action == "assigned")
        .expect("the assignment");
    assert_eq!(assigned.event, "issues");
    assert_eq!(assigned.sender, OPERATOR);
    assert_eq!(assigned.assignee, ACCOUNT);
    assert!(
        id_of(assigned).starts_with("gitea:timeline:"),
        "{}",
        id_of(assigned)
    );
    assert_eq!(assigned.issue.as_ref().unwrap().assignees, [ACCOUNT]);

    // The agent's pull request, commented inline by the operator.
    forge
        .push_branch(
            "nisse/count",
            "src/lib.rs",
            "pub fn one() -> u32 {\n    2\n}\n",
        )
        .await;
    let pull = forge.open_pull("nisse/count", "Count lines").await;
    let comment = forge
        .repo
        .inline_comment(pull, OPERATOR, "src/lib.rs", 2, "Why 2?")
        .await
        .unwrap();
    let review = forge
        .repo
        .review(pull, OPERATOR, ReviewState::RequestChanges, "Not yet.")
        .await
        .unwrap();
    forge.gitea.flush_webhooks().await.unwrap();
    for d in forge.gitea.deliveries() {
        assert_eq!(
            d.status,
            Some(200),
            "{} {}: {:?}",
            d.event_type,
            d.id,
            d.error
        );
    }
    let stored = events(&bus).await;
    let inline: Vec<_> = stored
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e.event == "pull_request_review_comment" && e.action == "created")
        .collect();
    assert_eq!(inline.len(), 1, "{inline:?}");
    let e = inline[0];
    assert_eq!(id_of(e), format!("gitea:comment:{comment}"));
    let c = e.comment.as_ref().unwrap();
    assert_eq!(c.path, "src/lib.rs");
    assert_eq!(c.line, 2);
    assert_eq!(c.body, "Why 2?");
    assert_eq!(c.author, OPERATOR);
    assert_eq!(c.issue_number, u64::try_from(pull).unwrap());
    assert!(c.review_id > 0);
    assert_eq!(e.pull.as_ref().unwrap().head, "nisse/count");
    let rejected = stored
        .iter()
        .map(|(_, e)| e)
        .find(|e| e.event == "pull_request_review_rejected")
        .expect("the review");
    assert_eq!(rejected.action, "reviewed");
    // The review's own id, which the poll gives it too (Gitea's payload
    // names none: it is read from the API).
    assert_eq!(id_of(rejected), format!("gitea:review:{review}"));
    let text = rejected.comment.as_ref().unwrap();
    assert_eq!((text.body.as_str(), text.review_id), ("Not yet.", review));
    service.stop().await;
}
