//! The Gitea stand-in itself, against real git, real OpenSSH and a real
//! HTTP client: what a client of Gitea would notice.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use hmac::Mac as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::{GiteaRepo, GiteaStandIn, Protection, PushKey, TokenUse};

/// A request's headers and body, as a receiver got them.
type Received = (Vec<(String, String)>, Vec<u8>);

/// A webhook receiver recording every request's headers and body.
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start(&self) -> String {
        use axum::extract::State;
        use axum::http::HeaderMap;
        let app = axum::Router::new()
            .route(
                "/hook",
                axum::routing::post(
                    |State(r): State<Receiver>, headers: HeaderMap, body: axum::body::Bytes| async move {
                        let headers = headers
                            .iter()
                            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
                            .collect();
                        r.got.lock().unwrap().push((headers, body.to_vec()));
                        "ok"
                    },
                ),
            )
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn requests(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no header {name} in {headers:?}"))
}

/// HMAC-SHA256 of `body` with `secret`, hex, computed here rather than
/// by the stand-in's code.
fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// An API client with `token` (if any).
struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    fn new(gitea: &GiteaStandIn, token: Option<&str>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: gitea.api_url(),
            token: token.map(str::to_string),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("token {token}"));
        }
        if let Some(body) = body {
            request = request
                .header("Content-Type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
        };
        (status, value)
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, None).await
    }
}

/// Runs `git` in `dir` with `key` over the stand-in's SSH, isolated from
/// the machine's git configuration.
async fn git(
    gitea: &GiteaStandIn,
    key: &PushKey,
    dir: &Path,
    args: &[&str],
) -> std::process::Output {
    tokio::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_SSH_COMMAND", gitea.git_ssh_command(&key.private_key))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "nisse")
        .env("GIT_AUTHOR_EMAIL", "nisse@example.org")
        .env("GIT_COMMITTER_NAME", "nisse")
        .env("GIT_COMMITTER_EMAIL", "nisse@example.org")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap()
}

fn explain(output: &std::process::Output) -> String {
    format!(
        "exit {}; stdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Clones `repo` into `dir/work` over SSH with `key`.
async fn clone(
    gitea: &GiteaStandIn,
    key: &PushKey,
    repo: &GiteaRepo,
    dir: &Path,
) -> std::path::PathBuf {
    let out = git(
        gitea,
        key,
        dir,
        &["clone", "--quiet", &repo.clone_url(), "work"],
    )
    .await;
    assert!(out.status.success(), "clone: {}", explain(&out));
    dir.join("work")
}

/// Commits `files` on a new branch `branch` in the clone `work` and
/// pushes it.
async fn push_branch(
    gitea: &GiteaStandIn,
    key: &PushKey,
    work: &Path,
    branch: &str,
    files: &[(&str, &str)],
) {
    let out = git(gitea, key, work, &["checkout", "--quiet", "-b", branch]).await;
    assert!(out.status.success(), "{}", explain(&out));
    for (name, contents) in files {
        std::fs::write(work.join(name), contents).unwrap();
    }
    let out = git(gitea, key, work, &["add", "--all"]).await;
    assert!(out.status.success(), "{}", explain(&out));
    let out = git(
        gitea,
        key,
        work,
        &["commit", "--quiet", "-m", &format!("work on {branch}")],
    )
    .await;
    assert!(out.status.success(), "{}", explain(&out));
    let out = git(gitea, key, work, &["push", "--quiet", "origin", branch]).await;
    assert!(out.status.success(), "push {branch}: {}", explain(&out));
}

#[tokio::test]
async fn requests_without_the_right_token_get_gitea_s_401() {
    let gitea = GiteaStandIn::start().await.unwrap();
    let token = gitea.add_user("operator").unwrap();
    assert_eq!(token.len(), 40);
    gitea
        .create_repo("ops", "app", "main", &[("README.md", "hi\n")])
        .await
        .unwrap();

    let (status, body) = Api::new(&gitea, None).get("/repos/ops/app").await;
    assert_eq!(status, 401);
    assert_eq!(
        body,
        json!({"message": "token is required", "url": format!("{}/api/swagger", gitea.url())})
    );
    let (status, body) = Api::new(&gitea, Some("0123456789abcdef0123456789abcdef01234567"))
        .get("/repos/ops/app")
        .await;
    assert_eq!(status, 401);
    assert_eq!(body["message"], "invalid username, password or token");
    // A wrong token is refused even where none is needed.
    let (status, _) = Api::new(&gitea, Some("wrong")).get("/version").await;
    assert_eq!(status, 401);

    let (status, body) = Api::new(&gitea, None).get("/version").await;
    assert_eq!(
        (status, body),
        (200, json!({"version": super::GITEA_VERSION}))
    );
    let api = Api::new(&gitea, Some(&token));
    let (status, repo) = api.get("/repos/ops/app").await;
    assert_eq!(status, 200);
    assert_eq!(repo["full_name"], "ops/app");
    assert_eq!(repo["default_branch"], "main");
    assert_eq!(repo["owner"]["login"], "ops");
    let (status, me) = api.get("/user").await;
    assert_eq!((status, me["login"].clone()), (200, json!("operator")));
    let (status, body) = api.get("/repos/ops/nothing").await;
    assert_eq!((status, body["message"].clone()), (404, json!("not found")));
    let (status, _) = api.get("/repos/ops/app/wikis").await;
    assert_eq!(status, 404);

    let seen: Vec<(String, u16, TokenUse)> = gitea
        .requests()
        .into_iter()
        .map(|r| (r.path, r.status, r.token))
        .collect();
    let valid = TokenUse::Valid("operator".into());
    assert_eq!(
        seen,
        vec![
            ("/api/v1/repos/ops/app".into(), 401, TokenUse::Missing),
            ("/api/v1/repos/ops/app".into(), 401, TokenUse::Wrong),
            ("/api/v1/version".into(), 401, TokenUse::Wrong),
            ("/api/v1/version".into(), 200, TokenUse::Missing),
            ("/api/v1/repos/ops/app".into(), 200, valid.clone()),
            ("/api/v1/user".into(), 200, valid.clone()),
            ("/api/v1/repos/ops/nothing".into(), 404, valid.clone()),
            ("/api/v1/repos/ops/app/wikis".into(), 404, valid),
        ]
    );
}

#[tokio::test]
async fn webhooks_carry_gitea_s_headers_and_a_signature_that_verifies() {
    let gitea = GiteaStandIn::start().await.unwrap();
    let operator = gitea.add_user("operator").unwrap();
    gitea.add_user("nisse").unwrap();
    let repo = gitea
        .create_repo("ops", "app", "main", &[("README.md", "hi\n")])
        .await
        .unwrap();
    let receiver = Receiver::default();
    let url = receiver.start().await;
    gitea.add_webhook(&url, "s3cret");

    let number = repo
        .open_issue("operator", "Disk fills up", "The <disk> & more", &["bug"])
        .await
        .unwrap();
    repo.assign(number, "nisse", "operator").await.unwrap();

    let got = receiver.requests();
    assert_eq!(got.len(), 2, "one delivery per event");
    let deliveries = gitea.deliveries();
    for ((headers, body), delivery) in got.iter().zip(&deliveries) {
        let sig = signature("s3cret", body);
        assert_eq!(header(headers, "X-Gitea-Signature"), sig);
        assert_eq!(header(headers, "X-Gogs-Signature"), sig);
        assert_eq!(
            header(headers, "X-Hub-Signature-256"),
            format!("sha256={sig}")
        );
        assert!(header(headers, "X-Hub-Signature").starts_with("sha1="));
        assert_eq!(header(headers, "Content-Type"), "application/json");
        let id = header(headers, "X-Gitea-Delivery");
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
        assert_eq!(header(headers, "X-GitHub-Delivery"), id);
        assert_eq!(delivery.id, id);
        assert_eq!(delivery.status, Some(200));
        assert_eq!(delivery.body.as_bytes(), body.as_slice());
        assert_ne!(signature("other secret", body), sig);
    }
    let (opened, assigned) = (&got[0], &got[1]);
    assert_eq!(header(&opened.0, "X-Gitea-Event"), "issues");
    assert_eq!(header(&opened.0, "X-Gitea-Event-Type"), "issues");
    assert_eq!(header(&assigned.0, "X-Gitea-Event"), "issues");
    assert_eq!(header(&assigned.0, "X-Gitea-Event-Type"), "issue_assign");
    assert_eq!(header(&assigned.0, "X-GitHub-Event"), "issues");
    // Gitea marshals payloads indented, with Go's HTML-safe escapes.
    let text = String::from_utf8(opened.1.clone()).unwrap();
    assert!(text.starts_with("{\n  \""), "{text}");
    assert!(
        text.contains("The \\u003cdisk\\u003e \\u0026 more"),
        "{text}"
    );
    let payload: Value = serde_json::from_slice(&assigned.1).unwrap();
    assert_eq!(payload["action"], "assigned");
    assert_eq!(payload["number"], number);
    assert_eq!(payload["sender"]["login"], "operator");
    assert_eq!(payload["issue"]["assignees"][0]["login"], "nisse");
    assert_eq!(payload["issue"]["labels"][0]["name"], "bug");
    assert_eq!(payload["issue"]["pull_request"], Value::Null);
    assert_eq!(payload["repository"]["full_name"], "ops/app");

    // A replay is the same delivery, byte for byte.
    assert_eq!(gitea.redeliver(&deliveries[1].id).await.unwrap(), 200);
    let replay = &receiver.requests()[2];
    assert_eq!(replay, assigned);
    // A tampered copy goes out exactly as given.
    let mut tampered = assigned.1.clone();
    tampered[10] ^= 1;
    let status = gitea
        .send_raw(&url, &deliveries[1].headers, &tampered)
        .await
        .unwrap();
    assert_eq!(status, 200);
    let forged = &receiver.requests()[3];
    assert_eq!(forged.1, tampered);
    assert_ne!(
        signature("s3cret", &forged.1),
        header(&forged.0, "X-Gitea-Signature")
    );

    // Lost webhooks: recorded, not sent; the change is there to poll.
    gitea.set_webhooks_enabled(false);
    let comment = repo.comment(number, "operator", "Any news?").await.unwrap();
    assert_eq!(receiver.requests().len(), 4);
    let lost = gitea.deliveries().pop().unwrap();
    assert!(lost.lost);
    assert_eq!(lost.status, None);
    assert_eq!(lost.event, "issue_comment");
    assert_eq!(lost.event_type, "issue_comment");
    let api = Api::new(&gitea, Some(&operator));
    let since = super::json::ts(repo.issue(number).unwrap().created_at);
    let (status, comments) = api
        .get(&format!(
            "/repos/ops/app/issues/comments?since={}",
            since.replace('+', "%2B")
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(comments[0]["id"], comment);
    assert_eq!(comments[0]["body"], "Any news?");
    assert_eq!(comments[0]["user"]["login"], "operator");
    assert_eq!(
        comments[0]["issue_url"],
        format!("{}/ops/app/issues/{number}", gitea.url())
    );
    assert_eq!(lost.payload().unwrap()["is_pull"], false);
}

#[tokio::test]
async fn git_over_ssh_pushes_branches_and_protects_the_default_one() {
    let gitea = GiteaStandIn::start().await.unwrap();
    let repo = gitea
        .create_repo(
            "ops",
            "app",
            "main",
            &[("README.md", "hi\n"), ("src/lib.rs", "fn a() {}\n")],
        )
        .await
        .unwrap();
    let key = gitea.create_push_key("agent").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let work = clone(&gitea, &key, &repo, dir.path()).await;
    assert_eq!(
        std::fs::read_to_string(work.join("src/lib.rs")).unwrap(),
        "fn a() {}\n"
    );
    let main = repo.branch_sha("main").await.unwrap().unwrap();

    push_branch(
        &gitea,
        &key,
        &work,
        "nisse/fix",
        &[("README.md", "hello\n")],
    )
    .await;
    let pushed = git(&gitea, &key, &work, &["rev-parse", "HEAD"]).await;
    let pushed = String::from_utf8_lossy(&pushed.stdout).trim().to_string();
    assert_eq!(
        repo.branch_sha("nisse/fix").await.unwrap(),
        Some(pushed.clone())
    );

    let out = git(&gitea, &key, &work, &["push", "origin", "HEAD:main"]).await;
    assert!(!out.status.success(), "{}", explain(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("Not allowed to push to protected branch main"),
        "{}",
        explain(&out)
    );
    assert_eq!(repo.branch_sha("main").await.unwrap(), Some(main.clone()));
    let out = git(
        &gitea,
        &key,
        &work,
        &["push", "origin", "--delete", "nisse/fix"],
    )
    .await;
    assert!(!out.status.success(), "{}", explain(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Not allowed to delete branch nisse/fix"),
        "{}",
        explain(&out)
    );
    assert_eq!(
        repo.branch_sha("nisse/fix").await.unwrap(),
        Some(pushed.clone())
    );
    let out = git(&gitea, &key, &work, &["push", "origin", "--delete", "main"]).await;
    assert!(!out.status.success(), "{}", explain(&out));
    assert_eq!(repo.branch_sha("main").await.unwrap(), Some(main.clone()));

    // The rule is the operator's: with the key's owner on the push
    // allowlist its push to main goes through, and without the rule
    // anyone's does; the default branch is still never deleted.
    let other = gitea.create_push_key("someone").await.unwrap();
    repo.set_protection(Protection {
        push_allowlist: vec!["agent".into()],
        ..Protection::default()
    })
    .unwrap();
    let out = git(&gitea, &other, &work, &["push", "origin", "HEAD:main"]).await;
    assert!(!out.status.success(), "someone is not on the allowlist");
    assert_eq!(repo.branch_sha("main").await.unwrap(), Some(main));
    let out = git(&gitea, &key, &work, &["push", "origin", "HEAD:main"]).await;
    assert!(out.status.success(), "{}", explain(&out));
    assert_eq!(repo.branch_sha("main").await.unwrap(), Some(pushed.clone()));
    repo.set_protection(Protection {
        enabled: false,
        ..Protection::default()
    })
    .unwrap();
    push_branch(
        &gitea,
        &other,
        &work,
        "nisse/more",
        &[("README.md", "more\n")],
    )
    .await;
    let out = git(&gitea, &other, &work, &["push", "origin", "HEAD:main"]).await;
    assert!(out.status.success(), "{}", explain(&out));
    let out = git(
        &gitea,
        &other,
        &work,
        &["push", "origin", "--delete", "main"],
    )
    .await;
    assert!(!out.status.success(), "{}", explain(&out));

    // The push key runs git and nothing else.
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} -p {} {}@127.0.0.1 'echo hi'",
            gitea.git_ssh_command(&key.private_key),
            gitea.sshd().port(),
            gitea.sshd().user()
        ))
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "{}", explain(&out));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("hi"),
        "{}",
        explain(&out)
    );
    // A key nobody authorized gets nowhere.
    let stranger = dir.path().join("stranger");
    super::git::keygen(&stranger, "stranger").await.unwrap();
    let stranger = PushKey {
        private_key: stranger,
        public_key: String::new(),
    };
    let out = git(
        &gitea,
        &stranger,
        dir.path(),
        &["clone", "--quiet", &repo.clone_url(), "other"],
    )
    .await;
    assert!(!out.status.success(), "{}", explain(&out));
}

#[tokio::test]
async fn pull_requests_are_created_listed_and_merged_as_gitea_does() {
    let gitea = GiteaStandIn::start().await.unwrap();
    let operator = gitea.add_user("operator").unwrap();
    let agent = gitea.add_user("nisse").unwrap();
    let repo = gitea
        .create_repo(
            "ops",
            "app",
            "main",
            &[
                ("README.md", "hi\n"),
                ("src/lib.rs", "fn a() {}\n"),
                ("notes.txt", "keep\n"),
            ],
        )
        .await
        .unwrap();
    let receiver = Receiver::default();
    gitea.add_webhook(&receiver.start().await, "s3cret");
    let issue = repo
        .open_issue("operator", "Fix the readme", "", &["bug"])
        .await
        .unwrap();
    let key = gitea.create_push_key("agent").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let work = clone(&gitea, &key, &repo, dir.path()).await;
    push_branch(
        &gitea,
        &key,
        &work,
        "nisse/1-readme",
        &[
            ("README.md", "hello\nworld\n"),
            ("CHANGES.md", "- readme\n"),
        ],
    )
    .await;

    let api = Api::new(&gitea, Some(&agent));
    let create = json!({
        "head": "nisse/1-readme",
        "base": "main",
        "title": "Fix the readme",
        "body": format!("Fixes #{issue}"),
    });
    let (status, pull) = api
        .call("POST", "/repos/ops/app/pulls", Some(create.clone()))
        .await;
    assert_eq!(status, 201, "{pull}");
    let number = pull["number"].as_i64().unwrap();
    assert_eq!(
        number,
        issue + 1,
        "pull requests share the issues' numbering"
    );
    assert_eq!(pull["state"], "open");
    assert_eq!(pull["merged"], false);
    assert_eq!(pull["mergeable"], true);
    assert_eq!(pull["head"]["ref"], "nisse/1-readme");
    assert_eq!(pull["base"]["ref"], "main");
    assert_eq!(
        pull["head"]["sha"],
        json!(repo.branch_sha("nisse/1-readme").await.unwrap().unwrap())
    );
    assert_eq!(pull["user"]["login"], "nisse");
    assert_eq!(pull["changed_files"], 2);
    assert_eq!(
        pull["html_url"],
        format!("{}/ops/app/pulls/{number}", gitea.url())
    );

    let (status, again) = api
        .call("POST", "/repos/ops/app/pulls", Some(create.clone()))
        .await;
    assert_eq!(status, 409, "{again}");
    let message = again["message"].as_str().unwrap();
    assert!(
        message.starts_with("pull request already exists for these targets [id: "),
        "{message}"
    );
    assert!(
        message.ends_with("head_branch: nisse/1-readme, base_branch: main]"),
        "{message}"
    );
    let mut missing = create.clone();
    missing["head"] = json!("nisse/nothing");
    let (status, _) = api
        .call("POST", "/repos/ops/app/pulls", Some(missing))
        .await;
    assert_eq!(status, 404);
    let (status, body) = api
        .call(
            "POST",
            "/repos/ops/app/pulls",
            Some(json!({"head": "nisse/1-readme", "base": "main"})),
        )
        .await;
    assert_eq!(
        (status, body["message"].clone()),
        (422, json!("[Title]: Required"))
    );
    assert_eq!(repo.pulls().len(), 1);

    let (status, files) = api
        .get(&format!("/repos/ops/app/pulls/{number}/files"))
        .await;
    assert_eq!(status, 200);
    let files: Vec<(String, String, i64, i64)> = files
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["filename"].as_str().unwrap().to_string(),
                f["status"].as_str().unwrap().to_string(),
                f["additions"].as_i64().unwrap(),
                f["deletions"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        files,
        vec![
            ("CHANGES.md".into(), "added".into(), 1, 0),
            ("README.md".into(), "changed".into(), 2, 1),
        ]
    );
    let (status, _) = api
        .get(&format!("/repos/ops/app/pulls/{number}/merge"))
        .await;
    assert_eq!(status, 404);
    let (status, open) = api.get("/repos/ops/app/pulls?state=open").await;
    assert_eq!((status, open.as_array().unwrap().len()), (200, 1));
    let (status, as_issue) = api.get(&format!("/repos/ops/app/issues/{number}")).await;
    assert_eq!(status, 200);
    assert_eq!(as_issue["pull_request"]["merged"], false);
    let (_, issues_only) = api.get("/repos/ops/app/issues?type=issues").await;
    assert_eq!(issues_only.as_array().unwrap().len(), 1);

    // The agent may not approve its own pull request; the operator may.
    let (status, body) = api
        .call(
            "POST",
            &format!("/repos/ops/app/pulls/{number}/reviews"),
            Some(json!({"event": "APPROVED"})),
        )
        .await;
    assert_eq!(
        (status, body["message"].clone()),
        (422, json!("approve your own pull is not allowed"))
    );
    repo.approve(number, "operator").await.unwrap();
    let merge = repo.merge_pull(number, "operator").await.unwrap();
    assert_eq!(repo.branch_sha("main").await.unwrap(), Some(merge.clone()));
    let parents = tokio::process::Command::new("git")
        .arg("--git-dir")
        .arg(repo.path())
        .args(["rev-list", "--parents", "-n", "1", &merge])
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&parents.stdout)
            .split_whitespace()
            .count(),
        3
    );
    let operator_api = Api::new(&gitea, Some(&operator));
    let (status, _) = operator_api
        .get(&format!("/repos/ops/app/pulls/{number}/merge"))
        .await;
    assert_eq!(status, 204);
    let (_, merged) = operator_api
        .get(&format!("/repos/ops/app/pulls/{number}"))
        .await;
    assert_eq!(merged["merged"], true);
    assert_eq!(merged["state"], "closed");
    assert_eq!(merged["merge_commit_sha"], json!(merge));
    assert_eq!(merged["merged_by"]["login"], "operator");
    assert!(
        repo.issue(issue).unwrap().closed,
        "Fixes #{issue} closes it"
    );

    gitea.flush_webhooks().await.unwrap();
    let events: Vec<(String, String, String)> = gitea
        .deliveries()
        .iter()
        .map(|d| {
            let payload = d.payload().unwrap();
            (
                d.event_type.clone(),
                payload["action"].as_str().unwrap().to_string(),
                payload["number"].to_string(),
            )
        })
        .collect();
    let n = |x: i64| x.to_string();
    assert_eq!(
        events,
        vec![
            ("issues".into(), "opened".into(), n(issue)),
            ("pull_request".into(), "opened".into(), n(number)),
            (
                "pull_request_review_approved".into(),
                "reviewed".into(),
                n(number)
            ),
            ("pull_request".into(), "closed".into(), n(number)),
            ("issues".into(), "closed".into(), n(issue)),
        ]
    );
    let closed = gitea.deliveries()[3].payload().unwrap();
    assert_eq!(closed["pull_request"]["merged"], true);
    assert_eq!(gitea.deliveries()[2].event, "pull_request_approved");
}

#[tokio::test]
async fn issues_comments_timeline_dependencies_and_review_threads_through_the_api() {
    let gitea = GiteaStandIn::start().await.unwrap();
    let operator = gitea.add_user("operator").unwrap();
    let agent = gitea.add_user("nisse").unwrap();
    let repo = gitea
        .create_repo(
            "ops",
            "app",
            "main",
            &[("src/lib.rs", "fn a() {}\nfn b() {}\n")],
        )
        .await
        .unwrap();
    let receiver = Receiver::default();
    gitea.add_webhook(&receiver.start().await, "");
    let first = repo.open_issue("operator", "First", "", &[]).await.unwrap();
    let second = repo
        .open_issue("operator", "Second", "", &["discuss"])
        .await
        .unwrap();
    repo.add_dependency(second, first).unwrap();
    repo.assign(second, "nisse", "operator").await.unwrap();
    repo.comment(second, "operator", "Please look")
        .await
        .unwrap();

    let api = Api::new(&gitea, Some(&agent));
    let (status, list) = api
        .get("/repos/ops/app/issues?state=open&type=issues")
        .await;
    assert_eq!(status, 200);
    let numbers: Vec<i64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["number"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, vec![second, first], "newest first");
    let (_, labelled) = api.get("/repos/ops/app/issues?labels=discuss").await;
    assert_eq!(labelled.as_array().unwrap().len(), 1);
    let (_, page) = api.get("/repos/ops/app/issues?limit=1&page=1").await;
    assert_eq!(page.as_array().unwrap().len(), 1);
    let (status, body) = api.get("/repos/ops/app/issues?since=yesterday").await;
    assert_eq!(status, 422, "{body}");

    let (_, blockers) = api
        .get(&format!("/repos/ops/app/issues/{second}/dependencies"))
        .await;
    assert_eq!(blockers[0]["number"], first);
    assert_eq!(blockers[0]["state"], "open");
    let (status, body) = api
        .call(
            "PATCH",
            &format!("/repos/ops/app/issues/{second}"),
            Some(json!({"state": "closed"})),
        )
        .await;
    assert_eq!(status, 412, "{body}");
    assert_eq!(
        body["message"],
        "cannot close this issue or pull request because it still has open dependencies"
    );
    let (status, edited) = api
        .call(
            "PATCH",
            &format!("/repos/ops/app/issues/{first}"),
            Some(json!({"state": "closed", "title": "First!"})),
        )
        .await;
    assert_eq!(status, 201, "{edited}");
    assert_eq!(
        (edited["state"].clone(), edited["title"].clone()),
        (json!("closed"), json!("First!"))
    );
    assert!(edited["closed_at"].is_string());

    let (status, comment) = api
        .call(
            "POST",
            &format!("/repos/ops/app/issues/{second}/comments"),
            Some(json!({"body": "On it"})),
        )
        .await;
    assert_eq!(status, 201, "{comment}");
    assert_eq!(comment["user"]["login"], "nisse");
    let (status, body) = api
        .call(
            "POST",
            &format!("/repos/ops/app/issues/{second}/comments"),
            Some(json!({"body": ""})),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let (_, comments) = api
        .get(&format!("/repos/ops/app/issues/{second}/comments"))
        .await;
    let bodies: Vec<&str> = comments
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, vec!["Please look", "On it"]);
    let (_, timeline) = api
        .get(&format!("/repos/ops/app/issues/{second}/timeline"))
        .await;
    let kinds: Vec<&str> = timeline
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        vec!["add_dependency", "assignees", "comment", "comment"]
    );
    let assigned = &timeline[1];
    assert_eq!(assigned["user"]["login"], "operator");
    assert_eq!(assigned["assignee"]["login"], "nisse");
    assert_eq!(assigned["removed_assignee"], false);

    // An inline comment, and a reply in the same conversation.
    let key = gitea.create_push_key("agent").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let work = clone(&gitea, &key, &repo, dir.path()).await;
    push_branch(
        &gitea,
        &key,
        &work,
        "nisse/2",
        &[("src/lib.rs", "fn a() {}\nfn b() { todo() }\n")],
    )
    .await;
    let (status, pull) = api
        .call(
            "POST",
            "/repos/ops/app/pulls",
            Some(json!({"head": "nisse/2", "base": "main", "title": "Second"})),
        )
        .await;
    assert_eq!(status, 201, "{pull}");
    let number = pull["number"].as_i64().unwrap();
    let asked = repo
        .inline_comment(number, "operator", "src/lib.rs", 2, "Why todo?")
        .await
        .unwrap();
    let asking = gitea.deliveries().pop().unwrap();
    assert_eq!(asking.event_type, "pull_request_review_comment");
    assert_eq!(asking.event, "pull_request_comment");
    // Without a secret Gitea leaves the signatures empty.
    assert_eq!(asking.header("X-Gitea-Signature"), Some(""));
    assert_eq!(asking.header("X-Hub-Signature-256"), Some("sha256="));
    let payload = asking.payload().unwrap();
    assert_eq!(payload["action"], "reviewed");
    assert_eq!(payload["review"]["type"], "pull_request_review_comment");
    assert_eq!(payload["sender"]["login"], "operator");

    let operator_api = Api::new(&gitea, Some(&operator));
    let (_, reviews) = operator_api
        .get(&format!("/repos/ops/app/pulls/{number}/reviews"))
        .await;
    assert_eq!(reviews[0]["state"], "COMMENT");
    assert_eq!(reviews[0]["comments_count"], 1);
    let review = reviews[0]["id"].as_i64().unwrap();
    let (_, inline) = api
        .get(&format!(
            "/repos/ops/app/pulls/{number}/reviews/{review}/comments"
        ))
        .await;
    assert_eq!(inline[0]["id"], asked);
    assert_eq!(inline[0]["path"], "src/lib.rs");
    assert_eq!(inline[0]["position"], 2);
    assert_eq!(inline[0]["body"], "Why todo?");
    assert!(
        inline[0]["diff_hunk"]
            .as_str()
            .unwrap()
            .contains("+fn b() { todo() }"),
        "{inline}"
    );
    let reply = json!({
        "event": "COMMENT",
        "body": "",
        "comments": [{"path": "src/lib.rs", "new_position": 2, "old_position": 0, "body": "Placeholder, fixed next"}],
    });
    let (status, replied) = api
        .call(
            "POST",
            &format!("/repos/ops/app/pulls/{number}/reviews"),
            Some(reply),
        )
        .await;
    assert_eq!(status, 200, "{replied}");
    assert_eq!(replied["user"]["login"], "nisse");
    let thread: Vec<(String, i64, String)> = repo
        .review_comments(number)
        .into_iter()
        .map(|c| (c.user, c.line, c.body))
        .collect();
    assert_eq!(
        thread,
        vec![
            ("operator".into(), 2, "Why todo?".into()),
            ("nisse".into(), 2, "Placeholder, fixed next".into()),
        ]
    );
    let (status, body) = api
        .call(
            "POST",
            &format!("/repos/ops/app/pulls/{number}/reviews"),
            Some(json!({"event": "COMMENT"})),
        )
        .await;
    assert_eq!(status, 422, "{body}");
}

#[tokio::test]
async fn refused_and_lost_requests_and_edited_comments_as_a_client_meets_them() {
    let gitea = GiteaStandIn::start().await.unwrap();
    let token = gitea.add_user("operator").unwrap();
    let repo = gitea
        .create_repo("ops", "app", "main", &[("README.md", "hi\n")])
        .await
        .unwrap();
    let receiver = Receiver::default();
    gitea.add_webhook(&receiver.start().await, "");
    let number = repo.open_issue("operator", "First", "", &[]).await.unwrap();
    let api = Api::new(&gitea, Some(&token));
    let path = format!("/api/v1/repos/ops/app/issues/{number}/comments");

    // Refused twice with Retry-After, unserved; then served.
    gitea
        .refuse_next("POST", &path, 1, 429, super::RetryAfter::Seconds(3))
        .unwrap();
    gitea
        .refuse_next(
            "post",
            &path,
            1,
            503,
            super::RetryAfter::DateIn(std::time::Duration::from_secs(60)),
        )
        .unwrap();
    assert!(
        gitea
            .refuse_next("POST", &path, 1, 200, super::RetryAfter::None)
            .is_err()
    );
    let post = |body: &str| {
        reqwest::Client::new()
            .post(format!(
                "{}/repos/ops/app/issues/{number}/comments",
                gitea.api_url()
            ))
            .header("Authorization", format!("token {token}"))
            .json(&json!({ "body": body }))
            .send()
    };
    let first = post("one").await.unwrap();
    assert_eq!(first.status(), 429);
    assert_eq!(first.headers()["retry-after"], "3");
    let second = post("one").await.unwrap();
    assert_eq!(second.status(), 503);
    let date = second.headers()["retry-after"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(date.ends_with(" GMT") && date.len() == 29, "{date}");
    let body: Value = second.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Service Unavailable")
    );
    assert!(
        repo.comments(number).is_empty(),
        "refused requests do nothing"
    );
    assert_eq!(post("one").await.unwrap().status(), 201);

    // Served, its answer lost.
    gitea.lose_answers("POST", &path, 1, 504).unwrap();
    assert_eq!(post("two").await.unwrap().status(), 504);
    let bodies: Vec<String> = repo.comments(number).into_iter().map(|c| c.body).collect();
    assert_eq!(bodies, ["one", "two"], "a lost answer's request was done");
    let statuses: Vec<u16> = gitea
        .requests()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [429, 503, 201, 504]);

    // An edit moves the comment's updated_at, not the issue's, and sends
    // Gitea's edited webhook with the old body.
    let id = repo.comments(number)[0].id;
    let issue_updated = repo.issue(number).unwrap().updated_at;
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let (status, edited) = api
        .call(
            "PATCH",
            &format!("/repos/ops/app/issues/comments/{id}"),
            Some(json!({ "body": "one, edited" })),
        )
        .await;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(edited["body"], "one, edited");
    assert_ne!(edited["updated_at"], edited["created_at"]);
    assert_eq!(repo.issue(number).unwrap().updated_at, issue_updated);
    gitea.flush_webhooks().await.unwrap();
    let (headers, body) = receiver.requests().last().cloned().unwrap();
    assert_eq!(header(&headers, "X-Gitea-Event-Type"), "issue_comment");
    let payload: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(payload["action"], "edited");
    assert_eq!(payload["changes"]["body"]["from"], "one");
    assert_eq!(payload["comment"]["body"], "one, edited");
    assert_eq!(payload["comment"]["updated_at"], edited["updated_at"]);
    let (status, _) = api
        .call(
            "PATCH",
            "/repos/ops/app/issues/comments/999",
            Some(json!({ "body": "x" })),
        )
        .await;
    assert_eq!(status, 404);
}

/// Commits `files` on the branch checked out in the clone `work` and
/// pushes it: a new head for its pull request.
async fn push_more(gitea: &GiteaStandIn, key: &PushKey, work: &Path, files: &[(&str, &str)]) {
    for (name, contents) in files {
        std::fs::write(work.join(name), contents).unwrap();
    }
    for args in [
        &["add", "--all"][..],
        &["commit", "--quiet", "-m", "more work"],
        &["push", "--quiet", "origin", "HEAD"],
    ] {
        let out = git(gitea, key, work, args).await;
        assert!(out.status.success(), "{args:?}: {}", explain(&out));
    }
}

/// The merge API as the caller of `api` sees it: the status and Gitea's
/// message (`None` for an answer without a body).
async fn merge(api: &Api, number: i64, body: Value) -> (u16, Option<String>) {
    let (status, answer) = api
        .call(
            "POST",
            &format!("/repos/ops/app/pulls/{number}/merge"),
            Some(body),
        )
        .await;
    let message = answer["message"].as_str().map(str::to_string);
    (status, message)
}

#[tokio::test]
async fn merging_through_the_api_needs_a_current_approval_and_green_checks() {
    let gitea = GiteaStandIn::start().await.unwrap();
    let operator = gitea.add_user("operator").unwrap();
    let agent = gitea.add_user("nisse").unwrap();
    let repo = gitea
        .create_repo("ops", "app", "main", &[("README.md", "hi\n")])
        .await
        .unwrap();
    repo.set_protection(Protection {
        status_check_contexts: vec!["ci/build".into()],
        ..Protection::default()
    })
    .unwrap();
    let receiver = Receiver::default();
    gitea.add_webhook(&receiver.start().await, "");
    let key = gitea.create_push_key("agent").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let work = clone(&gitea, &key, &repo, dir.path()).await;
    push_branch(&gitea, &key, &work, "nisse/2", &[("README.md", "hello\n")]).await;
    let api = Api::new(&gitea, Some(&agent));
    let (status, pull) = api
        .call(
            "POST",
            "/repos/ops/app/pulls",
            Some(json!({"head": "nisse/2", "base": "main", "title": "Greet"})),
        )
        .await;
    assert_eq!(status, 201, "{pull}");
    let number = pull["number"].as_i64().unwrap();
    let first = repo.branch_sha("nisse/2").await.unwrap().unwrap();
    let main = repo.branch_sha("main").await.unwrap().unwrap();
    let plain = || json!({"Do": "merge"});

    // Nothing yet: the required check is missing, and after it the
    // approval. Gitea checks them in that order.
    assert_eq!(
        merge(&api, number, plain()).await,
        (
            405,
            Some("Not all required status checks successful".into())
        )
    );
    repo.set_status(&first, "ci/build", "success", "built")
        .await
        .unwrap();
    assert_eq!(
        merge(&api, number, plain()).await,
        (405, Some("Does not have enough approvals".into()))
    );

    // The operator approves; then the agent pushes again, and the
    // approval is of a head that is no more: stale, and not enough.
    repo.approve(number, "operator").await.unwrap();
    push_more(&gitea, &key, &work, &[("README.md", "hello, world\n")]).await;
    let second = repo.branch_sha("nisse/2").await.unwrap().unwrap();
    assert_ne!(first, second);
    repo.set_status(&second, "ci/build", "success", "built")
        .await
        .unwrap();
    let (_, reviews) = api
        .get(&format!("/repos/ops/app/pulls/{number}/reviews"))
        .await;
    assert_eq!(reviews[0]["state"], "APPROVED");
    assert_eq!(reviews[0]["commit_id"], json!(first));
    assert_eq!(reviews[0]["stale"], true);
    assert_eq!(reviews[0]["dismissed"], false);
    assert_eq!(
        merge(&api, number, plain()).await,
        (405, Some("Does not have enough approvals".into()))
    );

    // A current approval, but the check fails on the new head.
    repo.approve(number, "operator").await.unwrap();
    let (_, reviews) = Api::new(&gitea, Some(&operator))
        .get(&format!("/repos/ops/app/pulls/{number}/reviews"))
        .await;
    let seen: Vec<(bool, bool)> = reviews
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["stale"].as_bool().unwrap(),
                r["official"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [(true, false), (false, true)],
        "the operator's latest verdict is the official one"
    );
    repo.set_status(&second, "ci/build", "failure", "tests failed")
        .await
        .unwrap();
    assert_eq!(
        merge(&api, number, plain()).await,
        (
            405,
            Some("Not all required status checks successful".into())
        )
    );
    repo.set_status(&second, "ci/build", "success", "fixed flake")
        .await
        .unwrap();

    // What Gitea refuses however green it is.
    let at = |head: &str| json!({"Do": "merge", "head_commit_id": head});
    assert_eq!(
        merge(&api, number, at(&first)).await,
        (409, Some("head out of date".into()))
    );
    let (status, message) = merge(&api, number, json!({"Do": "squash"})).await;
    assert_eq!(status, 422);
    assert!(message.unwrap().contains("Do=squash"));
    assert_eq!(
        merge(&api, number, json!({"MergeTitleField": "x"})).await,
        (422, Some("[Do]: Required".into()))
    );
    let (status, message) = merge(
        &api,
        number,
        json!({"Do": "merge", "merge_title_field": "x"}),
    )
    .await;
    assert_eq!(status, 422);
    assert!(message.unwrap().contains("`merge_title_field`"));
    let (status, _) = merge(
        &api,
        number,
        json!({"Do": "merge", "delete_branch_after_merge": true}),
    )
    .await;
    assert_eq!(status, 422);
    repo.set_protection(Protection {
        status_check_contexts: vec!["ci/build".into()],
        merge_allowlist: Some(vec!["operator".into()]),
        ..Protection::default()
    })
    .unwrap();
    assert_eq!(
        merge(&api, number, plain()).await,
        (405, Some("User not allowed to merge PR".into()))
    );
    repo.set_protection(Protection {
        status_check_contexts: vec!["ci/build".into()],
        merge_allowlist: Some(vec!["operator".into(), "nisse".into()]),
        ..Protection::default()
    })
    .unwrap();
    assert_eq!(repo.branch_sha("main").await.unwrap(), Some(main.clone()));
    assert!(repo.pulls()[0].merged.is_none(), "nothing refused merged");

    // Approved at the head, checks green: the agent's merge goes through,
    // answered with the status alone.
    let (status, message) = merge(
        &api,
        number,
        json!({
            "Do": "merge",
            "MergeTitleField": "Greet (#2)",
            "MergeMessageField": "Approved by operator.",
            "head_commit_id": second,
        }),
    )
    .await;
    assert_eq!((status, message), (200, None));
    let merged = repo.pulls()[0].merged.clone().expect("merged");
    assert_eq!(merged.by, "nisse");
    assert_eq!(
        repo.branch_sha("main").await.unwrap(),
        Some(merged.commit.clone())
    );
    let show = tokio::process::Command::new("git")
        .arg("--git-dir")
        .arg(repo.path())
        .args(["log", "-1", "--format=%P%n%B", &merged.commit])
        .output()
        .await
        .unwrap();
    let show = String::from_utf8_lossy(&show.stdout).to_string();
    assert_eq!(
        show.trim_end(),
        format!("{main} {second}\nGreet (#2)\n\nApproved by operator.")
    );
    gitea.flush_webhooks().await.unwrap();
    let closed = gitea.deliveries().pop().unwrap();
    assert_eq!(closed.event_type, "pull_request");
    let payload = closed.payload().unwrap();
    assert_eq!(payload["action"], "closed");
    assert_eq!(payload["sender"]["login"], "nisse");
    assert_eq!(payload["pull_request"]["merged"], true);

    // Merged already: Gitea's 405 says nothing more.
    assert_eq!(
        merge(&api, number, plain()).await,
        (405, Some(String::new()))
    );
}

#[tokio::test]
async fn a_commit_s_combined_status_is_the_worst_of_each_context_s_latest() {
    let gitea = GiteaStandIn::start().await.unwrap();
    let ci = gitea.add_user("ci").unwrap();
    let repo = gitea
        .create_repo("ops", "app", "main", &[("README.md", "hi\n")])
        .await
        .unwrap();
    let sha = repo.branch_sha("main").await.unwrap().unwrap();
    let api = Api::new(&gitea, Some(&ci));
    let combined = |reference: String| {
        let api = &api;
        async move {
            let (status, body) = api
                .get(&format!("/repos/ops/app/commits/{reference}/status"))
                .await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };

    // Nothing reported: Gitea's empty combined status, no state at all.
    assert_eq!(
        combined("main".into()).await,
        json!({
            "state": "", "sha": "", "total_count": 0, "statuses": null,
            "repository": null, "commit_url": "", "url": "",
        })
    );

    let report = |state: &str, context: &str| {
        let api = &api;
        let body = json!({
            "state": state,
            "context": context,
            "description": format!("{context} is {state}"),
            "target_url": "https://ci.example.org/run/1",
        });
        let sha = sha.clone();
        async move {
            api.call(
                "POST",
                &format!("/repos/ops/app/statuses/{sha}"),
                Some(body),
            )
            .await
        }
    };
    let (status, made) = report("pending", "ci/build").await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["id"], 1);
    assert_eq!(made["status"], "pending");
    assert_eq!(made["context"], "ci/build");
    assert_eq!(made["description"], "ci/build is pending");
    assert_eq!(made["target_url"], "https://ci.example.org/run/1");
    assert_eq!(made["creator"]["login"], "ci");
    assert_eq!(
        made["url"],
        format!("{}/repos/ops/app/statuses/{sha}", gitea.api_url())
    );
    let (status, _) = report("success", "ci/lint").await;
    assert_eq!(status, 201);
    let now = combined(sha.clone()).await;
    assert_eq!(
        (now["state"].clone(), now["sha"].clone()),
        (json!("pending"), json!(sha))
    );

    // The latest of a context replaces its earlier one.
    let (status, _) = report("success", "ci/build").await;
    assert_eq!(status, 201);
    let green = combined("main".into()).await;
    assert_eq!(green["state"], "success");
    assert_eq!(green["total_count"], 2);
    assert_eq!(green["repository"]["full_name"], "ops/app");
    let latest: Vec<(i64, &str, &str)> = green["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_i64().unwrap(),
                s["context"].as_str().unwrap(),
                s["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        latest,
        [(2, "ci/lint", "success"), (3, "ci/build", "success")]
    );

    // Any error or failure makes the whole a failure, whatever else passed;
    // an abbreviated commit id names the same commit.
    repo.set_status(&sha, "ci/lint", "error", "lint crashed")
        .await
        .unwrap();
    let red = combined(sha[..10].to_string()).await;
    assert_eq!(
        (red["state"].clone(), red["sha"].clone()),
        (json!("failure"), json!(sha))
    );
    assert_eq!(red["statuses"][1]["status"], "error");
    repo.set_status(&sha, "ci/lint", "warning", "lint has remarks")
        .await
        .unwrap();
    assert_eq!(combined("main".into()).await["state"], "success");

    // A page of contexts, the count of all in the header.
    let response = reqwest::Client::new()
        .get(format!(
            "{}/repos/ops/app/commits/main/status?limit=1",
            gitea.api_url()
        ))
        .header("Authorization", format!("token {ci}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-total-count"], "2");
    let page: Value = response.json().await.unwrap();
    assert_eq!(page["total_count"], 1);
    assert_eq!(page["statuses"][0]["context"], "ci/lint", "newest first");

    // What Gitea does not have is refused.
    let (status, body) = report("green", "ci/build").await;
    assert_eq!(status, 422, "{body}");
    assert!(repo.set_status(&sha, "ci/build", "done", "").await.is_err());
    let (status, _) = api
        .call(
            "POST",
            &format!("/repos/ops/app/statuses/{}", "0".repeat(40)),
            Some(json!({"state": "success", "context": "ci/build"})),
        )
        .await;
    assert_eq!(status, 500, "no such commit, as Gitea answers it");
    assert!(
        repo.set_protection(Protection {
            status_check_contexts: vec!["ci/*".into()],
            ..Protection::default()
        })
        .is_err(),
        "glob patterns are not implemented"
    );
}

#[tokio::test]
async fn an_issue_created_through_the_api_is_assigned_labelled_and_announced_as_gitea_does() {
    let gitea = GiteaStandIn::start().await.unwrap();
    gitea.add_user("operator").unwrap();
    let agent = gitea.add_user("nisse").unwrap();
    let repo = gitea
        .create_repo("ops", "app", "main", &[("README.md", "hi\n")])
        .await
        .unwrap();
    let receiver = Receiver::default();
    gitea.add_webhook(&receiver.start().await, "");
    // A label to give by id, as a client reads it from an issue.
    let seed = repo
        .open_issue("operator", "Seed", "", &["tracking"])
        .await
        .unwrap();
    let api = Api::new(&gitea, Some(&agent));
    let (_, seeded) = api.get(&format!("/repos/ops/app/issues/{seed}")).await;
    let label = seeded["labels"][0]["id"].as_i64().unwrap();
    let before = gitea.deliveries().len();

    let (status, made) = api
        .call(
            "POST",
            "/repos/ops/app/issues",
            Some(json!({
                "title": "Project: a line counter",
                "body": "Tracks the project.",
                "assignees": ["Nisse"],
                "labels": [label, 999],
            })),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let number = made["number"].as_i64().unwrap();
    assert_eq!(number, seed + 1);
    assert_eq!(made["title"], "Project: a line counter");
    assert_eq!(made["body"], "Tracks the project.");
    assert_eq!(made["user"]["login"], "nisse");
    assert_eq!(made["state"], "open");
    assert_eq!(
        made["assignees"][0]["login"], "nisse",
        "matched without case"
    );
    assert_eq!(made["assignee"]["login"], "nisse");
    let labels: Vec<&str> = made["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["tracking"],
        "an id the repository lacks is dropped"
    );
    assert_eq!(
        made["html_url"],
        format!("{}/ops/app/issues/{number}", gitea.url())
    );
    let (_, read) = api.get(&format!("/repos/ops/app/issues/{number}")).await;
    assert_eq!(read, made);
    let on_gitea = repo.issue(number).unwrap();
    assert_eq!(on_gitea.assignees, ["nisse"]);
    assert_eq!(on_gitea.user, "nisse");

    // Gitea's webhooks, in its order: the assignment is made inside the
    // issue's creation, so it is announced before the issue.
    gitea.flush_webhooks().await.unwrap();
    let sent: Vec<(String, String, Value)> = gitea.deliveries()[before..]
        .iter()
        .map(|d| {
            assert_eq!(d.status, Some(200), "{}: {:?}", d.event_type, d.error);
            (d.event.clone(), d.event_type.clone(), d.payload().unwrap())
        })
        .collect();
    let kinds: Vec<(&str, &str, &str)> = sent
        .iter()
        .map(|(e, t, p)| (e.as_str(), t.as_str(), p["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("issues", "issue_assign", "assigned"),
            ("issues", "issues", "opened"),
            ("issues", "issue_label", "label_updated"),
        ]
    );
    for (_, _, payload) in &sent {
        assert_eq!(payload["number"], number);
        assert_eq!(payload["sender"]["login"], "nisse");
        assert_eq!(payload["issue"]["assignees"][0]["login"], "nisse");
        assert_eq!(payload["repository"]["full_name"], "ops/app");
    }
    assert_eq!(receiver.requests().len(), gitea.deliveries().len());
    let (_, timeline) = api
        .get(&format!("/repos/ops/app/issues/{number}/timeline"))
        .await;
    let entries: Vec<(&str, &str)> = timeline
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["type"].as_str().unwrap(),
                t["user"]["login"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(entries, [("label", "nisse"), ("assignees", "nisse")]);
    let (_, mine) = api
        .get("/repos/ops/app/issues?state=all&type=issues&created_by=nisse")
        .await;
    assert_eq!(mine.as_array().unwrap().len(), 1);

    // Without a title, or with a login nobody has: Gitea's 422, nothing
    // made and nothing announced.
    let count = repo.issues().len();
    let sent = gitea.deliveries().len();
    for (body, message) in [
        (json!({"body": "no title"}), "[Title]: Required"),
        (json!({"title": "  "}), "[Title]: Required"),
        (
            json!({"title": "Lost", "assignees": ["nisse", "ghost"]}),
            "Assignee does not exist: [name: user does not exist [uid: 0, name: ghost]]",
        ),
    ] {
        let (status, answer) = api.call("POST", "/repos/ops/app/issues", Some(body)).await;
        assert_eq!(status, 422, "{answer}");
        assert_eq!(answer["message"], message);
        assert!(answer["url"].as_str().unwrap().ends_with("/api/swagger"));
    }
    let (status, answer) = api
        .call(
            "POST",
            "/repos/ops/app/issues",
            Some(json!({"title": "Soon", "milestone": 3})),
        )
        .await;
    assert_eq!(status, 422, "not implemented: {answer}");
    let (status, _) = api
        .call(
            "POST",
            "/repos/ops/none/issues",
            Some(json!({"title": "x"})),
        )
        .await;
    assert_eq!(status, 404);
    gitea.flush_webhooks().await.unwrap();
    assert_eq!(repo.issues().len(), count);
    assert_eq!(gitea.deliveries().len(), sent);

    // Made closed: opened, then closed.
    let (status, closed) = api
        .call(
            "POST",
            "/repos/ops/app/issues",
            Some(json!({"title": "Done already", "closed": true})),
        )
        .await;
    assert_eq!(status, 201, "{closed}");
    assert_eq!(closed["state"], "closed");
    assert!(closed["assignees"].is_null());
    gitea.flush_webhooks().await.unwrap();
    let actions: Vec<String> = gitea.deliveries()[sent..]
        .iter()
        .map(|d| d.payload().unwrap()["action"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(actions, ["opened", "closed"]);
}
