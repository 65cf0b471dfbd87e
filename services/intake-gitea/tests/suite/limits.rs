//! Gitea (or a proxy in front of it) turning calls away: 429 and 503 with
//! `Retry-After`, waited for within `call-timeout` and never past it, and
//! a write whose answer was lost found rather than made again.

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use nisse_intake_gitea::marker;
use nisse_proto::v1::gitea_request::Call;
use nisse_proto::v1::{GiteaCallStatus, GiteaCommentCall, GiteaIssueRead};
use nisse_tests::gitea::RetryAfter;

use super::{OPERATOR, REPO, Secrets, Service, answer, config, forge, nats, request};

fn comment(issue_number: u64, body: &str) -> Call {
    Call::Comment(GiteaCommentCall {
        issue_number,
        body: body.into(),
    })
}

/// The comments on `number` that carry `request_id`'s marker.
fn marked(forge: &super::Forge, number: i64, request_id: &str) -> usize {
    forge
        .repo
        .comments(number)
        .iter()
        .filter(|c| c.body.contains(&marker(request_id)))
        .count()
}

/// The methods and statuses of the requests to `path`, in order.
fn seen(forge: &super::Forge, path: &str) -> Vec<(String, u16)> {
    forge
        .gitea
        .requests()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| (r.method, r.status))
        .collect()
}

#[tokio::test]
async fn a_comment_turned_away_with_429_is_made_once_after_the_wait_gitea_asks_for() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    let number = forge
        .repo
        .open_issue(OPERATOR, "Count lines", "Add a line counter.", &[])
        .await
        .unwrap();
    let n = u64::try_from(number).unwrap();
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    let comments = format!("/api/v1/repos/{REPO}/issues/{number}/comments");
    forge
        .gitea
        .refuse_next("POST", &comments, 2, 429, RetryAfter::Seconds(1))
        .unwrap();

    let asked = Instant::now();
    request(&bus, "r-busy", 0, REPO, comment(n, "On it.")).await;
    let done = answer(&bus, "r-busy").await;
    let took = asked.elapsed();
    assert_eq!(done.status, GiteaCallStatus::Done as i32, "{}", done.reason);
    assert!(!done.adopted);
    assert!(
        took >= Duration::from_secs(2),
        "two waits of the second Gitea asked for, not the backoff's half: {took:?}"
    );
    assert_eq!(marked(&forge, number, "r-busy"), 1);
    // A 429 is a refusal: made again at once, with no search for a
    // comment the refused attempts cannot have made.
    assert_eq!(
        seen(&forge, &comments),
        [
            ("POST".to_string(), 429),
            ("POST".to_string(), 429),
            ("POST".to_string(), 201)
        ]
    );
    service.stop().await;
}

#[tokio::test]
async fn a_503_with_an_http_date_is_waited_for_on_giteas_clock() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    let number = forge
        .repo
        .open_issue(OPERATOR, "Count lines", "Add a line counter.", &[])
        .await
        .unwrap();
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    let issue = format!("/api/v1/repos/{REPO}/issues/{number}");
    forge
        .gitea
        .refuse_next(
            "GET",
            &issue,
            1,
            503,
            RetryAfter::DateIn(Duration::from_secs(2)),
        )
        .unwrap();

    let asked = Instant::now();
    request(
        &bus,
        "r-read",
        0,
        REPO,
        Call::ReadIssue(GiteaIssueRead {
            number: u64::try_from(number).unwrap(),
        }),
    )
    .await;
    let read = answer(&bus, "r-read").await;
    let took = asked.elapsed();
    assert_eq!(read.status, GiteaCallStatus::Done as i32, "{}", read.reason);
    assert_eq!(read.issue.as_ref().unwrap().title, "Count lines");
    // Two seconds by Gitea's Date, which is whole seconds: at least one
    // here, and more than the backoff's first half second.
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert_eq!(
        seen(&forge, &issue),
        [("GET".to_string(), 503), ("GET".to_string(), 200)]
    );
    service.stop().await;
}

#[tokio::test]
async fn a_wait_past_the_timeout_is_not_waited_and_the_failure_names_it() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    let number = forge
        .repo
        .open_issue(OPERATOR, "Count lines", "Add a line counter.", &[])
        .await
        .unwrap();
    let n = u64::try_from(number).unwrap();
    let secrets = Secrets::new(&forge.token);
    // call-timeout is 5s.
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    let comments = format!("/api/v1/repos/{REPO}/issues/{number}/comments");

    // Two minutes asked for: not waited at all.
    forge
        .gitea
        .refuse_next("POST", &comments, 1, 429, RetryAfter::Seconds(120))
        .unwrap();
    let asked = Instant::now();
    request(&bus, "r-later", 0, REPO, comment(n, "On it.")).await;
    let failed = answer(&bus, "r-later").await;
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(failed.status, GiteaCallStatus::Failed as i32);
    assert_eq!(failed.http_status, 429);
    for needle in [
        "429",
        "2m (Retry-After)",
        "5s (gitea.call-timeout",
        "1 attempt",
    ] {
        assert!(
            failed.reason.contains(needle),
            "`{needle}` not in: {}",
            failed.reason
        );
    }
    assert_eq!(marked(&forge, number, "r-later"), 0, "nothing was made");

    // Gitea keeps asking for two seconds: two waits fit in the five, the
    // third would end past them.
    forge
        .gitea
        .refuse_next("POST", &comments, 100, 503, RetryAfter::Seconds(2))
        .unwrap();
    let asked = Instant::now();
    request(&bus, "r-down", 0, REPO, comment(n, "On it.")).await;
    let failed = answer(&bus, "r-down").await;
    let took = asked.elapsed();
    assert_eq!(failed.status, GiteaCallStatus::Failed as i32);
    assert_eq!(failed.http_status, 503);
    // Never past the call's five seconds (the answer then has to reach
    // the stream, and this test to read it).
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_millis(5_500),
        "{took:?}"
    );
    for needle in [
        "503",
        "2s (Retry-After)",
        "ends past the call's 5s",
        "3 attempts",
    ] {
        assert!(
            failed.reason.contains(needle),
            "`{needle}` not in: {}",
            failed.reason
        );
    }
    let posts = seen(&forge, &comments)
        .into_iter()
        .filter(|(m, _)| m == "POST")
        .count();
    assert_eq!(posts, 1 + 3);
    service.stop().await;
}

#[tokio::test]
async fn a_comment_whose_answer_was_lost_is_found_and_not_made_again() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    let number = forge
        .repo
        .open_issue(OPERATOR, "Count lines", "Add a line counter.", &[])
        .await
        .unwrap();
    let n = u64::try_from(number).unwrap();
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    let comments = format!("/api/v1/repos/{REPO}/issues/{number}/comments");
    // A proxy that gave up waiting: Gitea made the comment, the service
    // hears 504.
    forge.gitea.lose_answers("POST", &comments, 1, 504).unwrap();

    request(&bus, "r-lost", 0, REPO, comment(n, "On it.")).await;
    let done = answer(&bus, "r-lost").await;
    assert_eq!(done.status, GiteaCallStatus::Done as i32, "{}", done.reason);
    assert!(done.adopted, "the comment the lost answer made is adopted");
    assert_eq!(marked(&forge, number, "r-lost"), 1, "and not made again");
    assert_eq!(
        seen(&forge, &comments),
        [("POST".to_string(), 504), ("GET".to_string(), 200)]
    );
    service.stop().await;
}
