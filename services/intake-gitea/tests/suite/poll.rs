//! The poll as the fallback: with Gitea's webhooks lost, what they
//! carried still reaches the stream, from the cursor, once.

use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_proto::v1::{GiteaEvent, GiteaSource};
use nisse_tests::gitea::ReviewState;

use super::{
    ACCOUNT, OPERATOR, REPO, Secrets, Service, config, events, eventually, forge, id_of,
    nats_short_window, stored_count,
};

const POLL: Duration = Duration::from_secs(1);

/// A pull request event as a test compares it: its id, event and action,
/// and for a state change the state and `merged` it shows.
type Seen = (String, String, String, Option<(String, bool)>);

/// Whether the poll has written its cursor of the repository.
async fn cursor(bus: &nisse_bus::Bus) -> Option<nisse_intake_gitea::records::Cursor> {
    let key = nisse_intake_gitea::records::cursor_key(&nisse_tests::agent("dev"), REPO);
    bus.kv_read(nisse_bus::topology::GITEA_BUCKET, &key)
        .await
        .unwrap()
        .map(|(c, _)| c)
}

#[tokio::test]
async fn with_webhooks_lost_the_poll_finds_an_assignment_and_a_comment_once() {
    // A window of a second: anything published again after it is stored
    // again, so the count below shows what was published, not what the
    // duplicate window dropped.
    let (_nats, bus) = nats_short_window().await;
    let forge = forge().await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, POLL)).await;
    forge.gitea.add_webhook(&service.url, super::SECRET);
    forge.gitea.set_webhooks_enabled(false);

    // An issue assigned before the first poll is found by it too.
    let early = forge
        .repo
        .open_issue(OPERATOR, "Early", "Assigned before anyone listened.", &[])
        .await
        .unwrap();
    forge.repo.assign(early, ACCOUNT, OPERATOR).await.unwrap();
    eventually(
        "the first poll's cursor",
        Duration::from_secs(20),
        || async { cursor(&bus).await },
    )
    .await;

    let number = forge
        .repo
        .open_issue(OPERATOR, "Count lines", "Add a line counter.", &["bug"])
        .await
        .unwrap();
    forge.repo.assign(number, ACCOUNT, OPERATOR).await.unwrap();
    let comment = forge
        .repo
        .comment(number, OPERATOR, "Start with the parser.")
        .await
        .unwrap();
    assert!(
        forge.gitea.deliveries().iter().all(|d| d.lost),
        "every webhook was lost"
    );

    let found = eventually(
        "the poll to find the comment",
        Duration::from_secs(30),
        || async {
            let stored = events(&bus).await;
            stored
                .iter()
                .any(|(_, e)| id_of(e) == format!("gitea:comment:{comment}"))
                .then_some(stored)
        },
    )
    .await;
    let found: Vec<_> = found.into_iter().map(|(_, e)| e).collect();
    assert!(found.iter().all(|e| e.source == GiteaSource::Poll as i32));
    let assigned: Vec<_> = found.iter().filter(|e| e.action == "assigned").collect();
    let numbers: Vec<u64> = assigned
        .iter()
        .map(|e| e.issue.as_ref().unwrap().number)
        .collect();
    let expected: Vec<u64> = [early, number]
        .iter()
        .map(|n| u64::try_from(*n).unwrap())
        .collect();
    assert_eq!(numbers, expected, "each assignment once: {assigned:?}");
    for e in &assigned {
        assert_eq!(e.event, "issues");
        assert_eq!(e.sender, OPERATOR);
        assert_eq!(e.assignee, ACCOUNT);
        assert!(id_of(e).starts_with("gitea:timeline:"), "{}", id_of(e));
        assert_eq!(e.issue.as_ref().unwrap().assignees, [ACCOUNT]);
    }
    let comments: Vec<_> = found
        .iter()
        .filter(|e| e.event == "issue_comment")
        .collect();
    assert_eq!(comments.len(), 1, "{comments:?}");
    let c = comments[0];
    assert_eq!(c.action, "created");
    assert_eq!(c.sender, OPERATOR);
    let body = c.comment.as_ref().unwrap();
    assert_eq!(body.body, "Start with the parser.");
    assert_eq!(body.issue_number, u64::try_from(number).unwrap());
    assert_eq!(c.issue.as_ref().unwrap().title, "Count lines");
    let snapshots = found
        .iter()
        .filter(|e| e.action == "updated")
        .filter(|e| e.issue.as_ref().unwrap().number == u64::try_from(number).unwrap())
        .count();
    assert!(snapshots >= 1);

    // Quiet polls publish nothing, and neither does a restart: the cursor
    // is in the bucket.
    let before = stored_count(&bus).await;
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(stored_count(&bus).await, before, "quiet polls published");
    let at = cursor(&bus).await.unwrap();
    service.stop().await;
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, POLL)).await;
    tokio::time::sleep(POLL * 4).await;
    assert_eq!(
        stored_count(&bus).await,
        before,
        "the restarted poll published again: {:?}",
        events(&bus)
            .await
            .iter()
            .map(|(_, e)| id_of(e).to_string())
            .collect::<Vec<_>>()
    );
    assert_eq!(cursor(&bus).await.unwrap().issues.since, at.issues.since);

    // And what happens after the restart is found from the cursor.
    let later = forge
        .repo
        .comment(number, OPERATOR, "And the tests.")
        .await
        .unwrap();
    eventually("the later comment", Duration::from_secs(30), || async {
        events(&bus)
            .await
            .iter()
            .any(|(_, e)| id_of(e) == format!("gitea:comment:{later}"))
            .then_some(())
    })
    .await;
    service.stop().await;
}

#[tokio::test]
async fn the_poll_finds_inline_comments_on_the_agents_pull_requests() {
    let (_nats, bus) = nats_short_window().await;
    let forge = forge().await;
    forge.gitea.set_webhooks_enabled(false);
    forge
        .push_branch(
            "nisse/count",
            "src/lib.rs",
            "pub fn one() -> u32 {\n    2\n}\n",
        )
        .await;
    let pull = forge.open_pull("nisse/count", "Count lines").await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, POLL)).await;
    eventually(
        "the first poll's cursor",
        Duration::from_secs(20),
        || async { cursor(&bus).await },
    )
    .await;

    let comment = forge
        .repo
        .inline_comment(pull, OPERATOR, "src/lib.rs", 2, "Why 2?")
        .await
        .unwrap();
    let e = eventually("the inline comment", Duration::from_secs(30), || async {
        events(&bus)
            .await
            .into_iter()
            .map(|(_, e)| e)
            .find(|e| id_of(e) == format!("gitea:comment:{comment}"))
    })
    .await;
    assert_eq!(e.source, GiteaSource::Poll as i32);
    assert_eq!(
        (e.event.as_str(), e.action.as_str()),
        ("pull_request_review_comment", "created")
    );
    let c = e.comment.as_ref().unwrap();
    assert_eq!(
        (c.path.as_str(), c.line, c.author.as_str()),
        ("src/lib.rs", 2, OPERATOR)
    );
    assert_eq!(c.issue_number, u64::try_from(pull).unwrap());
    assert!(c.review_id > 0);
    assert_eq!(e.pull.as_ref().unwrap().head, "nisse/count");
    assert!(e.issue.as_ref().unwrap().is_pull);

    let before = stored_count(&bus).await;
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(stored_count(&bus).await, before, "quiet polls published");
    service.stop().await;
}

#[tokio::test]
async fn an_edited_comment_reaches_the_stream_once_per_edit_whichever_way_it_came() {
    // The usual duplicate window: the webhook's edit and the poll's are
    // the same message, stored once.
    let (_nats, bus) = super::nats().await;
    let forge = forge().await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, POLL)).await;
    forge.gitea.add_webhook(&service.url, super::SECRET);
    eventually(
        "the first poll's cursor",
        Duration::from_secs(20),
        || async { cursor(&bus).await },
    )
    .await;

    let number = forge
        .repo
        .open_issue(OPERATOR, "Count lines", "Add a line counter.", &[])
        .await
        .unwrap();
    let comment = forge
        .repo
        .comment(number, OPERATOR, "Start with the parser.")
        .await
        .unwrap();
    // Gitea keeps whole seconds: each edit in a second of its own.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    forge
        .repo
        .edit_comment(comment, OPERATOR, "Start with the lexer.")
        .await
        .unwrap();
    let first_edit = forge.repo.comments(number)[0].updated_at;
    let edit_id = |at: time::OffsetDateTime| {
        format!(
            "gitea:comment:{comment}:{}",
            at.format(&time::format_description::well_known::Rfc3339)
                .unwrap()
        )
    };
    // The poll reads past the webhook's edit: it publishes it too, as the
    // same message.
    eventually(
        "the poll to read past the edit",
        Duration::from_secs(20),
        || async {
            cursor(&bus)
                .await
                .and_then(|c| c.comments.since)
                .filter(|s| *s >= first_edit)
        },
    )
    .await;
    tokio::time::sleep(POLL * 2).await;

    // A second edit whose webhook is lost: the poll finds it.
    forge.gitea.set_webhooks_enabled(false);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    forge
        .repo
        .edit_comment(comment, OPERATOR, "Start with the lexer, then the parser.")
        .await
        .unwrap();
    let second_edit = forge.repo.comments(number)[0].updated_at;
    assert!(second_edit > first_edit);
    let second = edit_id(second_edit);
    eventually("the lost edit", Duration::from_secs(30), || async {
        events(&bus)
            .await
            .iter()
            .any(|(_, e)| id_of(e) == second)
            .then_some(())
    })
    .await;
    tokio::time::sleep(POLL * 3).await;

    let stored: Vec<_> = events(&bus)
        .await
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| e.event == "issue_comment")
        .collect();
    let seen: Vec<(String, String, GiteaSource, String, String)> = stored
        .iter()
        .map(|e| {
            (
                id_of(e).to_string(),
                e.action.clone(),
                GiteaSource::try_from(e.source).unwrap(),
                e.sender.clone(),
                e.comment.as_ref().unwrap().body.clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                format!("gitea:comment:{comment}"),
                "created".to_string(),
                GiteaSource::Webhook,
                OPERATOR.to_string(),
                "Start with the parser.".to_string()
            ),
            (
                edit_id(first_edit),
                "edited".to_string(),
                GiteaSource::Webhook,
                OPERATOR.to_string(),
                "Start with the lexer.".to_string()
            ),
            // Gitea does not say who edited a comment, and anyone with
            // write access may: the poll names no sender.
            (
                second,
                "edited".to_string(),
                GiteaSource::Poll,
                String::new(),
                "Start with the lexer, then the parser.".to_string()
            ),
        ],
        "each version once, the first under the comment's own id"
    );
    assert_eq!(stored[2].comment.as_ref().unwrap().author, OPERATOR);
    assert_eq!(
        stored[2].issue.as_ref().unwrap().number,
        u64::try_from(number).unwrap()
    );
    service.stop().await;
}

#[tokio::test]
async fn with_webhooks_lost_the_poll_finds_reviews_closes_reopens_and_the_merge_with_the_webhooks_ids()
 {
    // The usual duplicate window: the lost webhooks, sent again at the
    // end, carry the same ids and store nothing new.
    let (_nats, bus) = super::nats().await;
    let forge = forge().await;
    forge
        .push_branch(
            "nisse/count",
            "src/lib.rs",
            "pub fn one() -> u32 {\n    2\n}\n",
        )
        .await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, POLL)).await;
    forge.gitea.add_webhook(&service.url, super::SECRET);
    forge.gitea.set_webhooks_enabled(false);
    eventually(
        "the first poll's cursor",
        Duration::from_secs(20),
        || async { cursor(&bus).await },
    )
    .await;

    let pull = forge.open_pull("nisse/count", "Count lines").await;
    let inline = forge
        .repo
        .inline_comment(pull, OPERATOR, "src/lib.rs", 2, "Why 2?")
        .await
        .unwrap();
    let rejected = forge
        .repo
        .review(pull, OPERATOR, ReviewState::RequestChanges, "Not yet.")
        .await
        .unwrap();
    forge.repo.close_issue(pull, OPERATOR).await.unwrap();
    forge.repo.reopen(pull, OPERATOR).await.unwrap();
    let approved = forge.repo.approve(pull, OPERATOR).await.unwrap();
    forge.repo.merge_pull(pull, OPERATOR).await.unwrap();
    assert!(forge.gitea.deliveries().iter().all(|d| d.lost));

    // What Gitea's timeline says each change is.
    let timeline = forge
        .api(
            &forge.token,
            reqwest::Method::GET,
            &format!("/repos/{REPO}/issues/{pull}/timeline"),
            serde_json::json!({}),
        )
        .await;
    let entry = |kind: &str| {
        timeline
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == kind)
            .map(|e| format!("gitea:timeline:{}", e["id"]))
            .unwrap_or_else(|| panic!("no {kind} entry: {timeline}"))
    };
    let (closed, reopened, merged) = (entry("close"), entry("reopen"), entry("merge_pull"));
    let commented = forge.repo.reviews(pull)[0].id;

    let is_pulls = |e: &GiteaEvent| e.issue.as_ref().is_some_and(|i| i.is_pull);
    eventually(
        "the poll to find the merge",
        Duration::from_secs(30),
        || async {
            events(&bus)
                .await
                .iter()
                .any(|(_, e)| id_of(e) == merged)
                .then_some(())
        },
    )
    .await;
    let found: Vec<GiteaEvent> = events(&bus)
        .await
        .into_iter()
        .map(|(_, e)| e)
        .filter(is_pulls)
        .collect();
    // A state change shows the state it left, not today's (a review's
    // snapshot is the pull request when the poll read it).
    let seen: Vec<Seen> = found
        .iter()
        .map(|e| {
            let p = e.pull.as_ref().unwrap();
            (
                id_of(e).to_string(),
                e.event.clone(),
                e.action.clone(),
                (e.event == "pull_request").then(|| (p.state.clone(), p.merged)),
            )
        })
        .collect();
    let s = |v: &str| v.to_string();
    let state = |v: &str, merged| Some((v.to_string(), merged));
    assert_eq!(
        seen,
        [
            (
                format!("gitea:review:{commented}"),
                s("pull_request_review_comment"),
                s("reviewed"),
                None
            ),
            (
                format!("gitea:comment:{inline}"),
                s("pull_request_review_comment"),
                s("created"),
                None
            ),
            (
                format!("gitea:review:{rejected}"),
                s("pull_request_review_rejected"),
                s("reviewed"),
                None
            ),
            (
                closed,
                s("pull_request"),
                s("closed"),
                state("closed", false)
            ),
            (
                reopened,
                s("pull_request"),
                s("reopened"),
                state("open", false)
            ),
            (
                format!("gitea:review:{approved}"),
                s("pull_request_review_approved"),
                s("reviewed"),
                None
            ),
            (
                merged.clone(),
                s("pull_request"),
                s("closed"),
                state("closed", true)
            ),
        ],
        "each once, in the order they happened"
    );
    for e in &found {
        assert_eq!(e.source, GiteaSource::Poll as i32);
        assert_eq!(e.sender, OPERATOR, "{}", id_of(e));
        assert_eq!(e.pull.as_ref().unwrap().head, "nisse/count");
    }
    let verdict = found
        .iter()
        .find(|e| e.event == "pull_request_review_rejected")
        .unwrap();
    let text = verdict.comment.as_ref().unwrap();
    assert_eq!(
        (text.body.as_str(), text.author.as_str(), text.review_id),
        ("Not yet.", OPERATOR, rejected)
    );
    let c = found[1].comment.as_ref().unwrap();
    assert_eq!(
        (c.path.as_str(), c.line, c.body.as_str(), c.review_id),
        ("src/lib.rs", 2, "Why 2?", commented)
    );

    // Quiet polls publish nothing more.
    let before = stored_count(&bus).await;
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(stored_count(&bus).await, before, "quiet polls published");

    // The lost webhooks of the same changes, sent now, are the same
    // messages: 200, and nothing new is stored.
    let lost: Vec<_> = forge
        .gitea
        .deliveries()
        .into_iter()
        .filter(|d| {
            d.event_type.starts_with("pull_request_review_")
                || (d.event_type == "pull_request"
                    && matches!(
                        d.payload().unwrap()["action"].as_str(),
                        Some("closed" | "reopened")
                    ))
        })
        .collect();
    assert_eq!(
        lost.len(),
        3 + 3,
        "three reviews, a close, a reopen, a merge"
    );
    for d in &lost {
        assert_eq!(
            forge.gitea.redeliver(&d.id).await.unwrap(),
            200,
            "{}",
            d.event_type
        );
    }
    assert_eq!(
        stored_count(&bus).await,
        before,
        "a webhook's id differs from the poll's: {:?}",
        events(&bus)
            .await
            .iter()
            .filter(|(_, e)| e.source == GiteaSource::Webhook as i32)
            .map(|(_, e)| id_of(e).to_string())
            .collect::<Vec<_>>()
    );
    service.stop().await;
}
