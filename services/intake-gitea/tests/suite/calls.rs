//! The agent's API calls, as the brain sends them and Gitea sees them.

use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_intake_gitea::marker;
use nisse_intake_gitea::records::{CallRecord, CallState, write_call};
use nisse_proto::v1::gitea_request::Call;
use nisse_proto::v1::{
    GiteaCallStatus, GiteaCheck, GiteaChecks, GiteaCloseIssue, GiteaCommentCall, GiteaCreateIssue,
    GiteaIssueRead, GiteaMergePull, GiteaProtectionCheck, GiteaPublishCall, GiteaPullRead,
    GiteaReview, GiteaReviewReply,
};
use nisse_tests::gitea::{Protection, TokenUse};

use super::{
    ACCOUNT, OPERATOR, REPO, Secrets, Service, answer, config, forge, nats, request, results,
};

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

#[tokio::test]
async fn a_comment_is_made_once_however_often_its_request_comes() {
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

    request(
        &bus,
        "r-ack",
        0,
        REPO,
        comment(n, "On it: second in the queue."),
    )
    .await;
    let done = answer(&bus, "r-ack").await;
    assert_eq!(done.status, GiteaCallStatus::Done as i32, "{}", done.reason);
    assert!(!done.adopted);
    let c = done.comment.as_ref().unwrap();
    assert_eq!(c.author, ACCOUNT);
    assert_eq!(c.issue_number, n);
    assert!(
        c.body.starts_with("On it: second in the queue."),
        "{}",
        c.body
    );
    assert_eq!(
        done.envelope.as_ref().unwrap().message_id,
        "gitea-result:r-ack"
    );
    assert_eq!(done.envelope.as_ref().unwrap().work_item_id, "item-1");
    assert_eq!(marked(&forge, number, "r-ack"), 1);

    // The brain retries the same request (a new message, the same
    // request id): answered from the record, nothing made again.
    let posts = || {
        forge
            .gitea
            .requests()
            .iter()
            .filter(|r| r.method == "POST")
            .count()
    };
    let before = posts();
    request(
        &bus,
        "r-ack",
        1,
        REPO,
        comment(n, "On it: second in the queue."),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(posts(), before);
    assert_eq!(marked(&forge, number, "r-ack"), 1);
    assert_eq!(
        results(&bus)
            .await
            .iter()
            .filter(|r| r.request_id == "r-ack")
            .count(),
        1,
        "the answer again has the same id, so it is stored once"
    );

    // A crash after the comment was made and before it was answered: the
    // record says started, and Gitea has the comment.
    service.stop().await;
    let agent = nisse_tests::agent("dev");
    let started = CallRecord {
        request_id: "r-crash".into(),
        state: CallState::Started,
        started_ms: 1,
        result: Vec::new(),
    };
    write_call(&bus, &agent, &started, None)
        .await
        .unwrap()
        .unwrap();
    forge
        .api(
            &forge.token,
            reqwest::Method::POST,
            &format!("/repos/{REPO}/issues/{number}/comments"),
            serde_json::json!({ "body": format!("Restating the issue.\n\n{}", marker("r-crash")) }),
        )
        .await;
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    request(&bus, "r-crash", 0, REPO, comment(n, "Restating the issue.")).await;
    let reconciled = answer(&bus, "r-crash").await;
    assert_eq!(
        reconciled.status,
        GiteaCallStatus::Done as i32,
        "{}",
        reconciled.reason
    );
    assert!(
        reconciled.adopted,
        "the comment made before the crash is adopted"
    );
    assert_eq!(marked(&forge, number, "r-crash"), 1, "and not made again");

    // A repository this agent is not configured for: refused, Gitea not
    // called.
    let before = forge.gitea.requests().len();
    request(&bus, "r-other", 0, "mallory/elsewhere", comment(1, "hi")).await;
    let refused = answer(&bus, "r-other").await;
    assert_eq!(refused.status, GiteaCallStatus::Refused as i32);
    assert!(
        refused.reason.contains("mallory/elsewhere"),
        "{}",
        refused.reason
    );
    assert_eq!(forge.gitea.requests().len(), before);

    // Gitea's refusal is a failure with its status and message.
    request(&bus, "r-missing", 0, REPO, comment(999, "hello?")).await;
    let failed = answer(&bus, "r-missing").await;
    assert_eq!(failed.status, GiteaCallStatus::Failed as i32);
    assert_eq!(failed.http_status, 404);
    assert!(!failed.reason.is_empty());
    service.stop().await;
}

#[tokio::test]
async fn publish_adopts_the_open_pull_request_of_its_branch_and_never_opens_two() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    forge
        .push_branch(
            "nisse/count",
            "src/lib.rs",
            "pub fn one() -> u32 {\n    2\n}\n",
        )
        .await;
    // Opened before (say, by a publish that crashed before answering).
    let existing = forge.open_pull("nisse/count", "WIP").await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;

    let publish = |title: &str, head: &str| {
        Call::Publish(GiteaPublishCall {
            head: head.into(),
            base: "main".into(),
            title: title.into(),
            body: "Counts lines.\n\nFixes #1".into(),
            agent_merges: false,
        })
    };
    request(&bus, "p1", 0, REPO, publish("Count lines", "nisse/count")).await;
    let adopted = answer(&bus, "p1").await;
    assert_eq!(
        adopted.status,
        GiteaCallStatus::Done as i32,
        "{}",
        adopted.reason
    );
    assert!(adopted.adopted);
    let pull = adopted.pull.as_ref().unwrap();
    assert_eq!(pull.number, u64::try_from(existing).unwrap());
    assert_eq!(pull.title, "Count lines");
    assert_eq!(
        (pull.head.as_str(), pull.base.as_str()),
        ("nisse/count", "main")
    );
    assert_eq!(forge.repo.pulls().len(), 1);
    assert_eq!(forge.repo.pulls()[0].title, "Count lines");
    assert_eq!(forge.repo.pulls()[0].body, "Counts lines.\n\nFixes #1");

    // A branch with no pull request gets one; publishing it again (a
    // later milestone's update) adopts it.
    forge
        .push_branch("nisse/docs", "README.md", "# project\n\nCounts.\n")
        .await;
    request(&bus, "p2", 0, REPO, publish("Docs", "nisse/docs")).await;
    let opened = answer(&bus, "p2").await;
    assert_eq!(
        opened.status,
        GiteaCallStatus::Done as i32,
        "{}",
        opened.reason
    );
    assert!(!opened.adopted);
    request(&bus, "p3", 0, REPO, publish("Docs, again", "nisse/docs")).await;
    let again = answer(&bus, "p3").await;
    assert!(again.adopted);
    assert_eq!(
        again.pull.as_ref().unwrap().number,
        opened.pull.as_ref().unwrap().number
    );
    assert_eq!(forge.repo.pulls().len(), 2);

    // Reading a pull request says whether it merged.
    let number = opened.pull.as_ref().unwrap().number;
    forge
        .repo
        .merge_pull(i64::try_from(number).unwrap(), OPERATOR)
        .await
        .unwrap();
    request(
        &bus,
        "rp",
        0,
        REPO,
        Call::ReadPull(GiteaPullRead { number }),
    )
    .await;
    let read = answer(&bus, "rp").await;
    assert_eq!(read.status, GiteaCallStatus::Done as i32, "{}", read.reason);
    assert!(read.pull.as_ref().unwrap().merged);
    assert_eq!(read.pull.as_ref().unwrap().state, "closed");
    service.stop().await;
}

#[tokio::test]
async fn read_issue_returns_its_dependencies_and_close_comments_then_closes() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    let base = forge
        .repo
        .open_issue(OPERATOR, "Parser", "First the parser.", &[])
        .await
        .unwrap();
    let top = forge
        .repo
        .open_issue(OPERATOR, "Counter", "Then the counter.", &["bug"])
        .await
        .unwrap();
    forge.repo.add_dependency(top, base).unwrap();
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;

    let top_n = u64::try_from(top).unwrap();
    request(
        &bus,
        "ri",
        0,
        REPO,
        Call::ReadIssue(GiteaIssueRead { number: top_n }),
    )
    .await;
    let read = answer(&bus, "ri").await;
    assert_eq!(read.status, GiteaCallStatus::Done as i32, "{}", read.reason);
    let issue = read.issue.as_ref().unwrap();
    assert_eq!((issue.number, issue.title.as_str()), (top_n, "Counter"));
    assert_eq!(issue.labels, ["bug"]);
    let deps: Vec<(u64, &str)> = read
        .dependencies
        .iter()
        .map(|d| (d.number, d.state.as_str()))
        .collect();
    assert_eq!(deps, [(u64::try_from(base).unwrap(), "open")]);

    let base_n = u64::try_from(base).unwrap();
    request(
        &bus,
        "close",
        0,
        REPO,
        Call::CloseIssue(GiteaCloseIssue {
            number: base_n,
            note: "Done in #3; nothing is left open.".into(),
        }),
    )
    .await;
    let closed = answer(&bus, "close").await;
    assert_eq!(
        closed.status,
        GiteaCallStatus::Done as i32,
        "{}",
        closed.reason
    );
    assert_eq!(closed.issue.as_ref().unwrap().state, "closed");
    assert!(forge.repo.issue(base).unwrap().closed);
    assert_eq!(marked(&forge, base, "close"), 1);
    service.stop().await;
}

#[tokio::test]
async fn a_review_reply_lands_on_the_commented_line() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    forge
        .push_branch(
            "nisse/count",
            "src/lib.rs",
            "pub fn one() -> u32 {\n    2\n}\n",
        )
        .await;
    let pull = forge.open_pull("nisse/count", "Count lines").await;
    let asked = forge
        .repo
        .inline_comment(pull, OPERATOR, "src/lib.rs", 2, "Why 2?")
        .await
        .unwrap();
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;

    // The brain names only the comment: its file and line come from Gitea.
    request(
        &bus,
        "reply",
        0,
        REPO,
        Call::ReviewReply(GiteaReviewReply {
            pull_number: u64::try_from(pull).unwrap(),
            comment_id: asked,
            path: String::new(),
            line: 0,
            body: "Because one is two now; fixed in the next commit.".into(),
            old_line: 0,
        }),
    )
    .await;
    let done = answer(&bus, "reply").await;
    assert_eq!(done.status, GiteaCallStatus::Done as i32, "{}", done.reason);
    let c = done.comment.as_ref().unwrap();
    assert_eq!(
        (c.path.as_str(), c.line, c.author.as_str()),
        ("src/lib.rs", 2, ACCOUNT)
    );
    let on_gitea: Vec<_> = forge
        .repo
        .review_comments(pull)
        .into_iter()
        .filter(|c| c.user == ACCOUNT)
        .collect();
    assert_eq!(on_gitea.len(), 1);
    assert_eq!(
        (on_gitea[0].path.as_str(), on_gitea[0].line),
        ("src/lib.rs", 2)
    );
    assert!(on_gitea[0].body.contains(&marker("reply")));
    service.stop().await;
}

#[tokio::test]
async fn a_rotated_token_takes_effect_at_the_next_call() {
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
    let bus = &bus;
    let read = |id: &'static str| async move {
        request(
            bus,
            id,
            0,
            REPO,
            Call::ReadIssue(GiteaIssueRead { number: n }),
        )
        .await;
        answer(bus, id).await
    };

    assert_eq!(read("t1").await.status, GiteaCallStatus::Done as i32);
    // Revoked and replaced by a token Gitea does not know: the next call
    // sends it.
    secrets.rotate_token("0000000000000000000000000000000000000000");
    let refused = read("t2").await;
    assert_eq!(refused.status, GiteaCallStatus::Failed as i32);
    assert_eq!(refused.http_status, 401);
    assert!(
        refused
            .reason
            .contains("invalid username, password or token"),
        "{}",
        refused.reason
    );
    assert!(!refused.reason.contains(&forge.token));
    secrets.rotate_token(&forge.token);
    assert_eq!(read("t3").await.status, GiteaCallStatus::Done as i32);

    let tokens: Vec<TokenUse> = forge
        .gitea
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(&format!("/issues/{number}")))
        .map(|r| r.token)
        .collect();
    assert_eq!(
        tokens,
        [
            TokenUse::Valid(ACCOUNT.into()),
            TokenUse::Wrong,
            TokenUse::Valid(ACCOUNT.into())
        ]
    );
    // The token never travels on the bus.
    let stream = nisse_tests::Recording::record(bus, &nisse_tests::agent("dev"), 1, None)
        .await
        .unwrap();
    for m in &stream.messages {
        let text = String::from_utf8_lossy(&m.payload);
        assert!(
            !text.contains(&forge.token),
            "the token is on {}",
            m.subject
        );
    }
    service.stop().await;
}

/// The branch protection as the agent's own token sees it: what an
/// operator set up holds; each way of relaxing it is named; a publish
/// checks it first and opens nothing while it does not hold.
#[tokio::test]
async fn protection_is_checked_with_the_agents_token_and_a_publish_waits_for_it() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    forge
        .push_branch(
            "nisse/count",
            "src/lib.rs",
            "pub fn one() -> u32 {\n    2\n}\n",
        )
        .await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    let check = |agent_merges| {
        Call::CheckProtection(GiteaProtectionCheck {
            branch: "main".into(),
            agent_merges,
        })
    };

    request(&bus, "c1", 0, REPO, check(false)).await;
    let held = answer(&bus, "c1").await;
    assert_eq!(held.status, GiteaCallStatus::Done as i32, "{}", held.reason);
    let p = held.protection.clone().unwrap();
    assert!(
        p.protected && !p.agent_can_push && p.required_approvals == 1,
        "{p:?}"
    );
    assert!(p.problems.is_empty());

    // The operator lets the agent's account push to main, and drops the
    // approval: both are named.
    forge
        .repo
        .set_protection(Protection {
            push_allowlist: vec![ACCOUNT.into()],
            required_approvals: 0,
            ..Protection::default()
        })
        .unwrap();
    request(&bus, "c2", 0, REPO, check(false)).await;
    let relaxed = answer(&bus, "c2").await;
    assert_eq!(relaxed.status, GiteaCallStatus::Refused as i32);
    let problems = relaxed.protection.clone().unwrap().problems;
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains(&format!("`{ACCOUNT}` may push to `main`")));
    assert!(problems[1].contains("needs no approval"));
    assert!(
        relaxed.reason.contains("does not hold"),
        "{}",
        relaxed.reason
    );

    // A publish meanwhile is refused the same way, and opens nothing.
    let publish = Call::Publish(GiteaPublishCall {
        head: "nisse/count".into(),
        base: "main".into(),
        title: "Count lines".into(),
        body: "Counts.".into(),
        agent_merges: false,
    });
    request(&bus, "p1", 0, REPO, publish.clone()).await;
    let refused = answer(&bus, "p1").await;
    assert_eq!(refused.status, GiteaCallStatus::Refused as i32);
    assert_eq!(refused.protection.unwrap().problems.len(), 2);
    assert!(forge.repo.pulls().is_empty());

    // No rule at all: not protected, and so pushable.
    forge
        .repo
        .set_protection(Protection {
            enabled: false,
            ..Protection::default()
        })
        .unwrap();
    request(&bus, "c3", 0, REPO, check(false)).await;
    let none = answer(&bus, "c3").await.protection.unwrap();
    assert!(!none.protected && none.agent_can_push, "{none:?}");
    assert!(
        none.problems[0].contains("not a protected branch"),
        "{none:?}"
    );

    // The trust dial that lets the agent merge needs Gitea to let it.
    forge
        .repo
        .set_protection(Protection {
            merge_allowlist: Some(vec![OPERATOR.into()]),
            ..Protection::default()
        })
        .unwrap();
    request(&bus, "c4", 0, REPO, check(false)).await;
    assert_eq!(
        answer(&bus, "c4").await.status,
        GiteaCallStatus::Done as i32
    );
    request(&bus, "c5", 0, REPO, check(true)).await;
    let dial = answer(&bus, "c5").await.protection.unwrap().problems;
    assert!(
        dial.len() == 1 && dial[0].contains("trust dial"),
        "{dial:#?}"
    );

    // Restored: the publish goes through under a new request id.
    forge.repo.set_protection(Protection::default()).unwrap();
    request(&bus, "p2", 0, REPO, publish).await;
    let opened = answer(&bus, "p2").await;
    assert_eq!(
        opened.status,
        GiteaCallStatus::Done as i32,
        "{}",
        opened.reason
    );
    assert_eq!(forge.repo.pulls().len(), 1);
    service.stop().await;
}

/// Commits `content` to `path` on `branch`, which exists, and pushes it
/// straight into the bare repository: a new head for its pull request.
async fn push_again(forge: &super::Forge, branch: &str, path: &str, content: &str) {
    let work = tempfile::tempdir().unwrap();
    let repo = forge.repo.path();
    let file = work.path().join(path);
    let steps: Vec<Vec<&str>> = vec![
        vec!["clone", "-q", "-b", branch, repo.to_str().unwrap(), "."],
        vec!["add", path],
        vec!["commit", "-q", "-m", "another change"],
        vec!["push", "-q", "origin", branch],
    ];
    for (i, args) in steps.iter().enumerate() {
        if i == 1 {
            std::fs::write(&file, content).unwrap();
        }
        let out = tokio::process::Command::new("git")
            .args([
                "-c",
                "user.name=Nisse",
                "-c",
                "user.email=nisse@example.invalid",
            ])
            .args(args)
            .current_dir(work.path())
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn read_pull(number: i64) -> Call {
    Call::ReadPull(GiteaPullRead {
        number: u64::try_from(number).unwrap(),
    })
}

/// Reading a pull request tells the brain what the trust dial needs: who
/// approved it at which head, whether Gitea counts that approval stale,
/// and how the head's status checks stand.
#[tokio::test]
async fn read_pull_reports_approvals_their_staleness_and_the_checks_of_the_head() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    forge
        .push_branch(
            "nisse/count",
            "src/lib.rs",
            "pub fn one() -> u32 {\n    2\n}\n",
        )
        .await;
    let pull = forge.open_pull("nisse/count", "Count lines").await;
    let first = forge.repo.branch_sha("nisse/count").await.unwrap().unwrap();
    forge.repo.approve(pull, OPERATOR).await.unwrap();
    forge
        .repo
        .set_status(&first, "ci/test", "success", "12 passed")
        .await
        .unwrap();
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;

    request(&bus, "rp1", 0, REPO, read_pull(pull)).await;
    let read = answer(&bus, "rp1").await;
    assert_eq!(read.status, GiteaCallStatus::Done as i32, "{}", read.reason);
    assert_eq!(read.pull.as_ref().unwrap().head_sha, first);
    let approval = GiteaReview {
        id: read.reviews[0].id,
        reviewer: OPERATOR.into(),
        state: "APPROVED".into(),
        commit_id: first.clone(),
        stale: false,
        dismissed: false,
    };
    assert_eq!(read.reviews, std::slice::from_ref(&approval));
    assert_eq!(
        read.checks,
        Some(GiteaChecks {
            state: "success".into(),
            statuses: vec![GiteaCheck {
                context: "ci/test".into(),
                state: "success".into(),
                description: "12 passed".into(),
            }],
        })
    );

    // The agent pushes again: the approval is of the old head now, and the
    // new head has no checks yet.
    push_again(
        &forge,
        "nisse/count",
        "src/lib.rs",
        "pub fn one() -> u32 {\n    3\n}\n",
    )
    .await;
    let second = forge.repo.branch_sha("nisse/count").await.unwrap().unwrap();
    request(&bus, "rp2", 0, REPO, read_pull(pull)).await;
    let read = answer(&bus, "rp2").await;
    assert_eq!(read.status, GiteaCallStatus::Done as i32, "{}", read.reason);
    assert_eq!(read.pull.as_ref().unwrap().head_sha, second);
    assert_eq!(
        read.reviews,
        [GiteaReview {
            stale: true,
            ..approval
        }]
    );
    assert_eq!(
        read.checks,
        Some(GiteaChecks::default()),
        "nothing reported on the new head"
    );
    forge
        .repo
        .set_status(&second, "ci/test", "pending", "running")
        .await
        .unwrap();
    request(&bus, "rp3", 0, REPO, read_pull(pull)).await;
    let read = answer(&bus, "rp3").await;
    assert_eq!(read.checks.unwrap().state, "pending");
    service.stop().await;
}

/// The trust dial's merge: Gitea makes it only once its protection is
/// satisfied at the head the brain read; a refusal is a failure with
/// Gitea's words, and a request id is merged once however often it comes.
#[tokio::test]
async fn merge_pull_is_made_when_gitea_s_protection_allows_it_and_only_once() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    forge
        .repo
        .set_protection(Protection {
            status_check_contexts: vec!["ci/test".into()],
            ..Protection::default()
        })
        .unwrap();
    forge
        .push_branch(
            "nisse/count",
            "src/lib.rs",
            "pub fn one() -> u32 {\n    2\n}\n",
        )
        .await;
    let pull = forge.open_pull("nisse/count", "Count lines").await;
    let n = u64::try_from(pull).unwrap();
    let head = forge.repo.branch_sha("nisse/count").await.unwrap().unwrap();
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    let merge = |head_sha: &str| {
        Call::MergePull(GiteaMergePull {
            number: n,
            head_sha: head_sha.into(),
            title: "Count lines (#2)".into(),
            message: "Approved by alice; ci/test green.".into(),
        })
    };
    let merge_path = format!("/api/v1/repos/{REPO}/pulls/{pull}/merge");
    let merges = || {
        forge
            .gitea
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == merge_path)
            .count()
    };

    // Without a head the brain checked, nothing is asked of Gitea.
    request(&bus, "m0", 0, REPO, merge("")).await;
    let refused = answer(&bus, "m0").await;
    assert_eq!(refused.status, GiteaCallStatus::Refused as i32);
    assert!(refused.reason.contains("head_sha"), "{}", refused.reason);
    assert_eq!(merges(), 0);

    // The check is green but nobody approved: Gitea refuses, and says why.
    forge
        .repo
        .set_status(&head, "ci/test", "success", "12 passed")
        .await
        .unwrap();
    request(&bus, "m1", 0, REPO, merge(&head)).await;
    let failed = answer(&bus, "m1").await;
    assert_eq!(failed.status, GiteaCallStatus::Failed as i32);
    assert_eq!(failed.http_status, 405);
    assert!(
        failed.reason.ends_with("Does not have enough approvals"),
        "{}",
        failed.reason
    );
    assert!(forge.repo.pulls()[0].merged.is_none());

    // The operator approves at that head: the merge is made.
    forge.repo.approve(pull, OPERATOR).await.unwrap();
    request(&bus, "m2", 0, REPO, merge(&head)).await;
    let done = answer(&bus, "m2").await;
    assert_eq!(done.status, GiteaCallStatus::Done as i32, "{}", done.reason);
    assert!(!done.adopted);
    let merged = done.pull.as_ref().unwrap();
    assert!(merged.merged && merged.state == "closed", "{merged:?}");
    assert_eq!(merged.head_sha, head);
    let on_gitea = forge.repo.pulls()[0].merged.clone().unwrap();
    assert_eq!(on_gitea.by, ACCOUNT);
    assert_eq!(
        forge.repo.branch_sha("main").await.unwrap(),
        Some(on_gitea.commit.clone())
    );
    assert_eq!(merges(), 2);

    // The same request again: answered from the record, no second merge.
    request(&bus, "m2", 1, REPO, merge(&head)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(merges(), 2);
    assert_eq!(
        results(&bus)
            .await
            .iter()
            .filter(|r| r.request_id == "m2")
            .count(),
        1
    );

    // A merge started and not answered (a crash): the pull request is
    // found merged and adopted, not merged again.
    let started = CallRecord {
        request_id: "m3".into(),
        state: CallState::Started,
        started_ms: 1,
        result: Vec::new(),
    };
    write_call(&bus, &nisse_tests::agent("dev"), &started, None)
        .await
        .unwrap()
        .unwrap();
    request(&bus, "m3", 0, REPO, merge(&head)).await;
    let adopted = answer(&bus, "m3").await;
    assert_eq!(
        adopted.status,
        GiteaCallStatus::Done as i32,
        "{}",
        adopted.reason
    );
    assert!(adopted.adopted);
    assert!(adopted.pull.unwrap().merged);
    assert_eq!(merges(), 2);
    service.stop().await;
}

/// A new project's tracking issue, assigned to the agent's own account.
fn tracking_issue(title: &str, body: &str) -> Call {
    Call::CreateIssue(GiteaCreateIssue {
        title: title.into(),
        body: body.into(),
        assignees: vec![ACCOUNT.into()],
    })
}

/// The numbers of the issues the agent's account opened that carry
/// `request_id`'s marker.
fn marked_issues(forge: &super::Forge, request_id: &str) -> Vec<i64> {
    forge
        .repo
        .issues()
        .into_iter()
        .filter(|i| i.user == ACCOUNT && i.body.contains(&marker(request_id)))
        .map(|i| i.number)
        .collect()
}

/// The method and status of every request on `path`, in order.
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
async fn an_issue_is_opened_once_assigned_to_the_account_however_often_its_request_comes() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    let issues = format!("/api/v1/repos/{REPO}/issues");
    let call = tracking_issue(
        "Project: a line counter",
        "Counts the lines of a file.\n\nMilestones follow.",
    );

    request(&bus, "i-track", 0, REPO, call.clone()).await;
    let done = answer(&bus, "i-track").await;
    assert_eq!(done.status, GiteaCallStatus::Done as i32, "{}", done.reason);
    assert!(!done.adopted);
    let issue = done.issue.clone().unwrap();
    assert_eq!(
        (issue.number, issue.title.as_str(), issue.state.as_str()),
        (1, "Project: a line counter", "open")
    );
    assert_eq!(
        issue.body,
        format!(
            "Counts the lines of a file.\n\nMilestones follow.\n\n{}",
            marker("i-track")
        )
    );
    assert_eq!(issue.author, ACCOUNT);
    assert_eq!(issue.assignees, [ACCOUNT]);
    assert!(issue.labels.is_empty() && !issue.is_pull);
    assert!(
        issue.html_url.ends_with(&format!("/{REPO}/issues/1")),
        "{}",
        issue.html_url
    );
    assert!(issue.updated_at.is_some());
    assert_eq!(
        done.envelope.as_ref().unwrap().message_id,
        "gitea-result:i-track"
    );
    assert_eq!(marked_issues(&forge, "i-track"), [1]);
    let on_gitea = forge.repo.issue(1).unwrap();
    assert_eq!(on_gitea.assignees, [ACCOUNT]);
    assert_eq!(seen(&forge, &issues), [("POST".to_string(), 201)]);

    // The brain sends the same request again: answered from the record,
    // Gitea not asked again, no second issue.
    request(&bus, "i-track", 1, REPO, call).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(seen(&forge, &issues), [("POST".to_string(), 201)]);
    assert_eq!(forge.repo.issues().len(), 1);
    assert_eq!(
        results(&bus)
            .await
            .iter()
            .filter(|r| r.request_id == "i-track")
            .count(),
        1,
        "the answer again has the same id, so it is stored once"
    );

    // What makes no issue is refused before Gitea is called.
    let before = forge.gitea.requests().len();
    for (id, repository, call, needle) in [
        (
            "i-blank",
            REPO,
            tracking_issue("  ", "Body only."),
            "title is empty",
        ),
        (
            "i-lines",
            REPO,
            tracking_issue("Project:\na line counter", ""),
            "more than one line",
        ),
        (
            "i-other",
            "mallory/elsewhere",
            tracking_issue("Project", ""),
            "mallory/elsewhere",
        ),
    ] {
        request(&bus, id, 0, repository, call).await;
        let refused = answer(&bus, id).await;
        assert_eq!(refused.status, GiteaCallStatus::Refused as i32, "{id}");
        assert!(refused.reason.contains(needle), "{id}: {}", refused.reason);
        assert!(refused.issue.is_none());
    }
    assert_eq!(forge.gitea.requests().len(), before);
    assert_eq!(forge.repo.issues().len(), 1);
    service.stop().await;
}

#[tokio::test]
async fn an_issue_made_by_a_call_whose_answer_was_lost_or_that_crashed_is_adopted() {
    let (_nats, bus) = nats().await;
    let forge = forge().await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    let issues = format!("/api/v1/repos/{REPO}/issues");
    // A proxy that gave up waiting: Gitea made the issue, the service
    // hears 504.
    forge.gitea.lose_answers("POST", &issues, 1, 504).unwrap();

    request(
        &bus,
        "i-lost",
        0,
        REPO,
        tracking_issue("Project: a line counter", "Counts lines."),
    )
    .await;
    let done = answer(&bus, "i-lost").await;
    assert_eq!(done.status, GiteaCallStatus::Done as i32, "{}", done.reason);
    assert!(done.adopted, "the issue the lost answer made is adopted");
    let issue = done.issue.unwrap();
    assert_eq!(issue.number, 1);
    assert_eq!(issue.assignees, [ACCOUNT]);
    assert_eq!(marked_issues(&forge, "i-lost"), [1], "and not made again");
    assert_eq!(
        seen(&forge, &issues),
        [("POST".to_string(), 504), ("GET".to_string(), 200)]
    );

    // A crash after Gitea made the issue and before it was answered: the
    // record says started; the issue was closed meanwhile, and an operator
    // quoted its marker in an issue of their own.
    service.stop().await;
    let started = CallRecord {
        request_id: "i-crash".into(),
        state: CallState::Started,
        started_ms: 1,
        result: Vec::new(),
    };
    write_call(&bus, &nisse_tests::agent("dev"), &started, None)
        .await
        .unwrap()
        .unwrap();
    let made = forge
        .api(
            &forge.token,
            reqwest::Method::POST,
            &format!("/repos/{REPO}/issues"),
            serde_json::json!({
                "title": "Project: docs",
                "body": format!("Writes the docs.\n\n{}", marker("i-crash")),
                "assignees": [ACCOUNT],
            }),
        )
        .await;
    let crashed = made["number"].as_i64().unwrap();
    forge.repo.close_issue(crashed, OPERATOR).await.unwrap();
    forge
        .repo
        .open_issue(
            OPERATOR,
            "Copy",
            &format!("Quoting {}", marker("i-crash")),
            &[],
        )
        .await
        .unwrap();
    let posts = || {
        seen(&forge, &issues)
            .into_iter()
            .filter(|(m, _)| m == "POST")
            .count()
    };
    let before = posts();
    let service = Service::start(&bus, config(forge.gitea.url(), &secrets, Duration::ZERO)).await;
    request(
        &bus,
        "i-crash",
        0,
        REPO,
        tracking_issue("Project: docs", "Writes the docs."),
    )
    .await;
    let reconciled = answer(&bus, "i-crash").await;
    assert_eq!(
        reconciled.status,
        GiteaCallStatus::Done as i32,
        "{}",
        reconciled.reason
    );
    assert!(
        reconciled.adopted,
        "the issue made before the crash is adopted"
    );
    let issue = reconciled.issue.unwrap();
    assert_eq!(
        (issue.number, issue.state.as_str(), issue.author.as_str()),
        (u64::try_from(crashed).unwrap(), "closed", ACCOUNT),
        "the account's own, closed or not; not the operator's copy"
    );
    assert_eq!(marked_issues(&forge, "i-crash"), [crashed]);
    assert_eq!(posts(), before, "nothing made again");
    service.stop().await;
}
