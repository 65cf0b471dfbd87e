//! The Vikunja stand-in itself, against a real HTTP client and a real
//! webhook receiver: what a client of Vikunja would notice.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::Mac as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::{Permission, VikunjaStandIn, WEBHOOK_EVENTS};

/// A request's headers and body, as a receiver got them.
type Received = (Vec<(String, String)>, Vec<u8>);

/// A webhook receiver recording every request, answering each with the
/// next status it was given (200 once they run out).
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    answers: Arc<Mutex<VecDeque<u16>>>,
}

impl Receiver {
    async fn start(&self) -> String {
        use axum::extract::State;
        use axum::http::{HeaderMap, StatusCode};
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
                        let status = r.answers.lock().unwrap().pop_front().unwrap_or(200);
                        StatusCode::from_u16(status).unwrap()
                    },
                ),
            )
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn answer(&self, statuses: &[u16]) {
        self.answers.lock().unwrap().extend(statuses);
    }

    fn requests(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// The bodies received, parsed.
    fn payloads(&self) -> Vec<Value> {
        self.requests()
            .iter()
            .map(|(_, body)| serde_json::from_slice(body).unwrap())
            .collect()
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// HMAC-SHA256 of `body` with `secret`, hex, computed here rather than
/// by the stand-in's code.
fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// A URL nothing listens on.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    drop(listener);
    url
}

/// An answer: status, headers, body (JSON, `Null` when empty).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// An API client with `token` (if any).
struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    fn new(v: &VikunjaStandIn, token: Option<&str>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: v.api_url(),
            token: token.map(str::to_string),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        if let Some(body) = body {
            request = request
                .header("Content-Type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Answer {
        self.call("GET", path, None).await
    }
}

/// A stand-in with an operator `ann` owning project 1, shared for
/// writing with the agent `nisse`, and the agent's API client.
async fn setup() -> (VikunjaStandIn, i64, Api) {
    let v = VikunjaStandIn::start().await.unwrap();
    v.add_user("ann").unwrap();
    let token = v.add_user("nisse").unwrap();
    let project = v.add_project("ann", "Ops").unwrap();
    v.share_project(project, "nisse", Permission::Write)
        .await
        .unwrap();
    let api = Api::new(&v, Some(&token));
    (v, project, api)
}

fn keys(v: &Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn every_route_but_info_needs_a_valid_token() {
    let (v, _, api) = setup().await;

    let anonymous = Api::new(&v, None);
    let info = anonymous.get("/info").await;
    assert_eq!(info.status, 200);
    assert_eq!(info.body["version"], "v2.5.0");
    assert_eq!(info.body["max_items_per_page"], 50);
    assert_eq!(info.body["webhooks_enabled"], true);

    let invalid = json!({
        "code": 11,
        "message": "missing, malformed, expired or otherwise invalid token provided",
    });
    let missing = anonymous.get("/user").await;
    assert_eq!((missing.status, &missing.body), (401, &invalid));
    let wrong = Api::new(&v, Some("tk_0000000000000000000000000000000000000000"));
    let wrong = wrong.get("/tasks/1").await;
    assert_eq!((wrong.status, &wrong.body), (401, &invalid));

    let me = api.get("/user").await;
    assert_eq!(me.status, 200);
    assert_eq!(me.body["username"], "nisse");
    assert_eq!(me.body["id"], 2);
    assert_eq!(me.body["name"], "");
    assert!(me.body.get("email").is_none(), "{}", me.body);
    assert_eq!(me.body["settings"]["overdue_tasks_reminders_time"], "09:00");
    assert_eq!(me.body["deletion_scheduled_at"], "0001-01-01T00:00:00Z");

    let unknown = api.get("/tasks/1/attachments").await;
    assert_eq!(
        (unknown.status, &unknown.body),
        (404, &json!({"message": "Not Found"}))
    );
    let method = api.call("PATCH", "/tasks/1", Some(json!({}))).await;
    assert_eq!(method.status, 405);

    let requests = v.requests();
    let last = requests.last().unwrap();
    assert_eq!(last.method, "PATCH");
    assert_eq!(last.path, "/api/v1/tasks/1");
    assert_eq!(last.user.as_deref(), Some("nisse"));
    assert_eq!(last.status, 405);
    assert_eq!(last.body, "{}");
    assert!(
        requests
            .iter()
            .any(|r| r.path == "/api/v1/user" && r.user.is_none() && r.status == 401)
    );
}

#[tokio::test]
async fn a_task_reads_as_vikunja_marshals_it() {
    let (v, project, api) = setup().await;
    let id = v
        .create_task(project, "ann", "Disk full", "<p>/var is at 99%</p>")
        .await
        .unwrap();

    let read = api.get(&format!("/tasks/{id}")).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.header("x-max-permission"), Some("1"));
    let t = &read.body;
    assert_eq!(
        keys(t),
        [
            "assignees",
            "attachments",
            "bucket_id",
            "cover_image_attachment_id",
            "created",
            "created_by",
            "description",
            "done",
            "done_at",
            "due_date",
            "end_date",
            "hex_color",
            "id",
            "identifier",
            "index",
            "is_favorite",
            "labels",
            "percent_done",
            "position",
            "priority",
            "project_id",
            "reactions",
            "related_tasks",
            "reminders",
            "repeat_after",
            "repeat_mode",
            "start_date",
            "title",
            "updated",
        ]
    );
    assert_eq!(t["identifier"], "#1");
    assert_eq!(t["index"], 1);
    assert_eq!(t["project_id"], project);
    assert_eq!(t["description"], "<p>/var is at 99%</p>");
    assert_eq!(t["done_at"], "0001-01-01T00:00:00Z");
    assert_eq!(t["due_date"], "0001-01-01T00:00:00Z");
    assert_eq!(t["assignees"], Value::Null);
    assert_eq!(t["labels"], Value::Null);
    assert_eq!(t["reminders"], Value::Null);
    assert_eq!(t["related_tasks"], json!({}));
    assert_eq!(t["percent_done"], json!(0));
    assert_eq!(
        keys(&t["created_by"]),
        ["created", "id", "name", "updated", "username"]
    );
    assert_eq!(t["created_by"]["username"], "ann");
    let created = t["created"].as_str().unwrap();
    assert!(
        created.ends_with('Z') && created.len() == "2026-08-01T10:00:00Z".len(),
        "{created}"
    );

    v.set_project_identifier(project, "OPS").unwrap();
    v.add_label(id, "urgent", "ann").await.unwrap();
    let read = api.get(&format!("/tasks/{id}?expand=comment_count")).await;
    assert_eq!(read.body["identifier"], "OPS-1");
    assert_eq!(read.body["labels"][0]["title"], "urgent");
    assert_eq!(read.body["comment_count"], 0);

    let missing = api.get("/tasks/99").await;
    assert_eq!(
        (missing.status, &missing.body),
        (
            404,
            &json!({"code": 4002, "message": "This task does not exist"})
        )
    );
    let stranger = Api::new(&v, Some(&v.add_user("eve").unwrap()));
    let hidden = stranger.get(&format!("/tasks/{id}")).await;
    assert_eq!(
        (hidden.status, &hidden.body),
        (
            403,
            &json!({"code": 0, "message": "You don't have the permission to see this"})
        )
    );
    let outsider = v.comment(id, "eve", "<p>hi</p>").await.unwrap_err();
    assert!(
        format!("{outsider:#}").contains("share_project"),
        "{outsider:#}"
    );
    let refused = api.get(&format!("/tasks/{id}?expand=subtasks")).await;
    assert_eq!(refused.status, 400);
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap()
            .contains("expand=subtasks")
    );
    let bad = api.get(&format!("/tasks/{id}?expand=everything")).await;
    assert_eq!(bad.status, 412);
    assert_eq!(bad.body["invalid_fields"], json!(["expand"]));
    let unknown = api.get(&format!("/tasks/{id}?fields=title")).await;
    assert_eq!(unknown.status, 400);
    assert!(
        unknown.body["message"]
            .as_str()
            .unwrap()
            .contains("`fields`")
    );

    let project_read = api.get(&format!("/projects/{project}")).await;
    assert_eq!(project_read.status, 200);
    assert_eq!(project_read.body["owner"]["username"], "ann");
    assert_eq!(project_read.body["max_permission"], 1);
    assert_eq!(project_read.body["identifier"], "OPS");
}

#[tokio::test]
async fn creating_through_the_api_checks_as_vikunja_does() {
    let (v, project, api) = setup().await;
    let path = format!("/projects/{project}/tasks");

    let made = api
        .call(
            "PUT",
            &path,
            Some(json!({"title": "Rotate logs", "description": "<p>weekly</p>", "priority": 3, "hex_color": "#e8e8e8"})),
        )
        .await;
    assert_eq!(made.status, 201);
    assert_eq!(made.body["title"], "Rotate logs");
    assert_eq!(made.body["priority"], 3);
    assert_eq!(made.body["hex_color"], "e8e8e8");
    assert_eq!(made.body["created_by"]["username"], "nisse");
    let id = made.body["id"].as_i64().unwrap();
    assert_eq!(v.task(id).unwrap().created_by, "nisse");

    let untitled = api
        .call("PUT", &path, Some(json!({"description": "x"})))
        .await;
    assert_eq!(
        (untitled.status, &untitled.body),
        (
            400,
            &json!({"code": 4001, "message": "You must provide at least a task title."})
        )
    );
    let nowhere = api
        .call("PUT", "/projects/99/tasks", Some(json!({"title": "x"})))
        .await;
    assert_eq!(
        (nowhere.status, &nowhere.body),
        (
            404,
            &json!({"code": 3001, "message": "This project does not exist."})
        )
    );
    let colour = api
        .call(
            "PUT",
            &path,
            Some(json!({"title": "x", "hex_color": "#123456789"})),
        )
        .await;
    assert_eq!(colour.status, 412);
    assert_eq!(colour.body["code"], 2002);
    assert_eq!(
        colour.body["invalid_fields"],
        json!(["hex_color: #123456789 does not validate as runelength(0|7)"])
    );
    let typed = api
        .call("PUT", &path, Some(json!({"title": "x", "done": "yes"})))
        .await;
    assert_eq!(typed.status, 400);
    assert_eq!(typed.body["code"], 2004);
    let repeating = api
        .call(
            "PUT",
            &path,
            Some(json!({"title": "x", "repeat_after": 3600})),
        )
        .await;
    assert_eq!(repeating.status, 400);
    assert!(
        repeating.body["message"]
            .as_str()
            .unwrap()
            .contains("repeat_after")
    );

    let reader = v.add_user("rita").unwrap();
    v.share_project(project, "rita", Permission::Read)
        .await
        .unwrap();
    let reader = Api::new(&v, Some(&reader));
    let denied = reader.call("PUT", &path, Some(json!({"title": "x"}))).await;
    assert_eq!(
        (denied.status, &denied.body),
        (403, &json!({"code": 0, "message": "Forbidden"}))
    );
    assert_eq!(
        reader
            .get(&format!("/tasks/{id}"))
            .await
            .header("x-max-permission"),
        Some("0")
    );
    assert_eq!(v.tasks(project).len(), 1);
}

#[tokio::test]
async fn an_update_replaces_the_task() {
    let (v, project, api) = setup().await;
    let receiver = Receiver::default();
    let url = receiver.start().await;
    v.add_webhook(
        project,
        &url,
        "s3cret",
        &["task.updated", "task.assignee.created"],
    );
    let id = v
        .create_task(project, "ann", "Disk full", "<p>details</p>")
        .await
        .unwrap();
    v.assign(id, "nisse", "ann").await.unwrap();
    let path = format!("/tasks/{id}");
    let due = "2026-09-01T12:00:00Z";
    let full = api.get(&path).await.body;
    let mut with_due = full.clone();
    with_due["due_date"] = json!(due);
    with_due["priority"] = json!(2);
    assert_eq!(api.call("POST", &path, Some(with_due)).await.status, 200);
    assert_eq!(api.get(&path).await.body["due_date"], due);

    // Sending only `done`: everything omitted is cleared, the title kept.
    let partial = api.call("POST", &path, Some(json!({"done": true}))).await;
    assert_eq!(partial.status, 200);
    let t = &partial.body;
    assert_eq!(t["title"], "Disk full");
    assert_eq!(t["done"], true);
    assert_ne!(t["done_at"], "0001-01-01T00:00:00Z");
    assert_eq!(t["description"], "");
    assert_eq!(t["assignees"], Value::Null);
    assert_eq!(t["due_date"], "0001-01-01T00:00:00Z");
    assert_eq!(t["priority"], 0);
    let task = v.task(id).unwrap();
    assert!(task.done && task.done_at.is_some() && task.assignees.is_empty());

    // The safe pattern: read, change, send the whole task back.
    let mut whole = api.get(&path).await.body;
    whole["done"] = json!(false);
    whole["description"] = json!("<p>back</p>");
    whole["assignees"] = json!([{"id": 1}]);
    let saved = api.call("POST", &path, Some(whole)).await;
    assert_eq!(saved.status, 200);
    assert_eq!(saved.body["done_at"], "0001-01-01T00:00:00Z");
    assert_eq!(saved.body["assignees"][0]["username"], "ann");
    assert_eq!(saved.body["description"], "<p>back</p>");

    let mut twice = saved.body.clone();
    twice["assignees"] = json!([{"id": 2}, {"id": 2}]);
    let duplicate = api.call("POST", &path, Some(twice)).await;
    assert_eq!(duplicate.status, 400);
    assert_eq!(duplicate.body["code"], 4021);
    assert_eq!(
        v.task(id).unwrap().assignees,
        ["ann"],
        "a refused update changes nothing"
    );

    v.flush_webhooks().await.unwrap();
    let events: Vec<(String, String)> = receiver
        .payloads()
        .iter()
        .map(|p| {
            (
                p["event_name"].as_str().unwrap().to_string(),
                p["data"]["doer"]["username"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let e = |name: &str, doer: &str| (name.to_string(), doer.to_string());
    assert_eq!(
        events,
        [
            // ann assigns nisse
            e("task.assignee.created", "ann"),
            e("task.updated", "ann"),
            // nisse's three saves; the last adds ann as an assignee
            e("task.updated", "nisse"),
            e("task.updated", "nisse"),
            e("task.assignee.created", "nisse"),
            e("task.updated", "nisse"),
            e("task.updated", "nisse"),
        ]
    );
    let last = receiver.payloads().pop().unwrap();
    assert_eq!(last["data"]["task"]["description"], "<p>back</p>");
}

#[tokio::test]
async fn the_task_list_filters_sorts_and_pages_as_vikunja_does() {
    let (v, project, api) = setup().await;
    let titles = ["alpha", "Bravo", "charlie", "delta", "echo"];
    for title in titles {
        v.create_task(project, "ann", title, "").await.unwrap();
    }
    v.set_done(2, true, "ann").await.unwrap();
    v.set_done(4, true, "ann").await.unwrap();
    // Spread the times out, as if the changes were made a minute apart.
    let base = OffsetDateTime::parse(
        "2020-01-01T10:00:00Z",
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    {
        let mut state = v.shared.lock();
        for t in &mut state.tasks {
            t.updated = base + time::Duration::minutes(t.id);
        }
        state.tasks[0].due_date = Some(base);
    }
    let list = |query: &str| {
        let path = format!("/projects/{project}/tasks?{query}");
        let api = &api;
        async move { api.get(&path).await }
    };

    let all = list("").await;
    assert_eq!(ids(&all.body), [1, 2, 3, 4, 5]);
    assert_eq!(all.header("x-pagination-total-pages"), Some("1"));
    assert_eq!(all.header("x-pagination-result-count"), Some("5"));
    assert_eq!(
        all.header("access-control-expose-headers"),
        Some("x-pagination-total-pages, x-pagination-result-count")
    );

    assert_eq!(ids(&list("filter=done+%3D+false").await.body), [1, 3, 5]);
    assert_eq!(
        ids(&list("filter=updated+%3E+2020-01-01T10:02:00Z").await.body),
        [3, 4, 5]
    );
    assert_eq!(
        ids(
            &list("filter=updated+%3E%3D+2020-01-01T12:03:00%2B02:00+%26%26+done+%3D+false")
                .await
                .body
        ),
        [3, 5]
    );
    assert_eq!(
        ids(&list("filter=(id+%3D+1+||+id+%3D+2)+%26%26+done+%3D+true")
            .await
            .body),
        [2]
    );
    // Strictly left to right: (done = true || id = 1) && id in 1,4.
    assert_eq!(
        ids(&list("filter=done+%3D+true+||+id+%3D+1+%26%26+id+in+1,4")
            .await
            .body),
        [1, 4]
    );
    assert_eq!(ids(&list("filter=title+like+BRAV").await.body), [2]);
    assert_eq!(ids(&list("filter=id+not+in+1,2,3").await.body), [4, 5]);
    assert_eq!(ids(&list("filter=due_date+%3C+now").await.body), [1]);
    assert_eq!(
        ids(&list("filter=due_date+%3E+now&filter_include_nulls=true")
            .await
            .body),
        [2, 3, 4, 5]
    );
    assert_eq!(ids(&list("filter=done_at+%3E+now-1h").await.body), [2, 4]);

    let sorted = list("sort_by=done&order_by=desc&sort_by=updated&order_by=desc").await;
    assert_eq!(ids(&sorted.body), [4, 2, 5, 3, 1]);
    assert_eq!(ids(&list("sort_by=title").await.body), [2, 1, 3, 4, 5]);

    let page = list(
        "filter=updated+%3E+2020-01-01T10:00:00Z&sort_by=updated&order_by=asc&per_page=2&page=2",
    )
    .await;
    assert_eq!(ids(&page.body), [3, 4]);
    assert_eq!(page.header("x-pagination-total-pages"), Some("3"));
    assert_eq!(page.header("x-pagination-result-count"), Some("2"));
    let past = list("per_page=2&page=4").await;
    assert_eq!(past.body, json!([]));
    assert_eq!(past.header("x-pagination-total-pages"), Some("0"));
    assert_eq!(ids(&list("per_page=2&page=0").await.body).len(), 5);
    assert_eq!(ids(&list("per_page=500").await.body).len(), 5);

    let error = |code: i64| {
        move |a: &Answer| (a.status, a.body["code"].as_i64().unwrap_or(-1)) == (400, code)
    };
    assert!(error(4016)(&list("filter=colour+%3D+red").await));
    assert!(error(4016)(&list("sort_by=colour").await));
    assert!(error(4014)(&list("sort_by=id&order_by=up").await));
    assert!(error(4024)(&list("filter=done+%3D+false+%26%26").await));
    assert!(error(4024)(&list("filter=(done+%3D+false").await));
    assert!(error(4019)(&list("filter=done+%3D+maybe").await));
    // An unencoded `+` in an offset arrives as a space and is no date.
    assert!(error(4019)(
        &list("filter=updated+%3E+2020-01-01T12:00:00+02:00").await
    ));
    let bad_page = list("page=two").await;
    assert_eq!(
        (bad_page.status, &bad_page.body),
        (400, &json!({"message": "Bad page requested."}))
    );
    let search = list("s=alpha").await;
    assert_eq!(search.status, 400);
    assert!(
        search.body["message"].as_str().unwrap().contains("`s`"),
        "{}",
        search.body
    );
    assert_eq!(list("filter=assignees+in+2").await.status, 400);

    let stranger = Api::new(&v, Some(&v.add_user("eve").unwrap()));
    let hidden = stranger.get(&format!("/projects/{project}/tasks")).await;
    assert_eq!(
        (hidden.status, hidden.body["code"].as_i64()),
        (403, Some(7003))
    );
    assert_eq!(api.get("/projects/99/tasks").await.body["code"], 3001);
}

#[tokio::test]
async fn comments_are_made_listed_and_edited_by_their_authors() {
    let (v, project, api) = setup().await;
    let id = v
        .create_task(project, "ann", "Disk full", "")
        .await
        .unwrap();
    let first = v.comment(id, "ann", "<p>please look</p>").await.unwrap();
    let path = format!("/tasks/{id}/comments");

    let made = api
        .call("PUT", &path, Some(json!({"comment": "<p>on it</p>"})))
        .await;
    assert_eq!(made.status, 201);
    assert_eq!(
        keys(&made.body),
        ["author", "comment", "created", "id", "reactions", "updated"]
    );
    assert_eq!(made.body["author"]["username"], "nisse");
    let mine = made.body["id"].as_i64().unwrap();

    let empty = api.call("PUT", &path, Some(json!({"comment": ""}))).await;
    assert_eq!(
        (empty.status, &empty.body),
        (
            412,
            &json!({"code": 2002, "message": "Invalid Data", "invalid_fields": ["comment: non zero value required"]})
        )
    );
    let nowhere = api
        .call("PUT", "/tasks/99/comments", Some(json!({"comment": "x"})))
        .await;
    assert_eq!(nowhere.body["code"], 4002);
    let text = reqwest::Client::new()
        .put(format!("{}{path}", v.api_url()))
        .header(
            "Authorization",
            format!("Bearer {}", api.token.as_deref().unwrap()),
        )
        .header("Content-Type", "text/plain")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(text.status().as_u16(), 415);

    assert_eq!(ids(&api.get(&path).await.body), [first, mine]);
    assert_eq!(
        ids(&api.get(&format!("{path}?order_by=desc")).await.body),
        [mine, first]
    );
    assert_eq!(ids(&api.get(&format!("{path}?s=LOOK")).await.body), [first]);
    let one = api.get(&format!("{path}/{first}")).await;
    assert_eq!(one.body["comment"], "<p>please look</p>");
    assert_eq!(api.get(&format!("{path}/99")).await.body["code"], 4015);

    let theirs = api
        .call(
            "POST",
            &format!("{path}/{first}"),
            Some(json!({"comment": "hijack"})),
        )
        .await;
    assert_eq!(
        (theirs.status, theirs.body["code"].as_i64()),
        (403, Some(0))
    );
    let edited = api
        .call(
            "POST",
            &format!("{path}/{mine}"),
            Some(json!({"comment": "<p>done</p>"})),
        )
        .await;
    assert_eq!(edited.status, 200);
    assert_eq!(edited.body["comment"], "<p>done</p>");
    v.edit_comment(id, first, "ann", "<p>please look now</p>")
        .await
        .unwrap();
    assert!(v.edit_comment(id, first, "nisse", "x").await.is_err());

    let comments = v.comments(id);
    assert_eq!(comments.len(), 2);
    assert_eq!(comments[0].comment, "<p>please look now</p>");
    assert_eq!(comments[1].author, "nisse");
    assert!(v.task(id).unwrap().updated >= comments[1].updated);
}

#[tokio::test]
async fn assigning_checks_the_user_and_fires_two_events() {
    let (v, project, api) = setup().await;
    let receiver = Receiver::default();
    let url = receiver.start().await;
    v.add_webhook(
        project,
        &url,
        "",
        &["task.assignee.created", "task.updated"],
    );
    let id = v
        .create_task(project, "ann", "Disk full", "")
        .await
        .unwrap();
    let path = format!("/tasks/{id}/assignees");

    let added = api.call("PUT", &path, Some(json!({"user_id": 1}))).await;
    assert_eq!(added.status, 201);
    assert_eq!(keys(&added.body), ["created", "user_id"]);
    assert_eq!(added.body["user_id"], 1);
    let again = api.call("PUT", &path, Some(json!({"user_id": 1}))).await;
    assert_eq!(
        (again.status, &again.body),
        (
            400,
            &json!({"code": 4021, "message": "This user is already assigned to that task."})
        )
    );
    v.add_user("eve").unwrap();
    let outsider = api.call("PUT", &path, Some(json!({"user_id": 3}))).await;
    assert_eq!(
        (outsider.status, outsider.body["code"].as_i64()),
        (403, Some(7003))
    );
    let nobody = api.call("PUT", &path, Some(json!({"user_id": 42}))).await;
    assert_eq!(
        (nobody.status, nobody.body["code"].as_i64()),
        (404, Some(1005))
    );
    let listed = api.get(&path).await;
    assert_eq!(listed.body[0]["username"], "ann");

    v.flush_webhooks().await.unwrap();
    let payloads = receiver.payloads();
    let names: Vec<&str> = payloads
        .iter()
        .map(|p| p["event_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["task.assignee.created", "task.updated"]);
    assert_eq!(
        keys(&payloads[0]["data"]),
        ["assignee", "doer", "project", "task"]
    );
    assert_eq!(payloads[0]["data"]["assignee"]["username"], "ann");
    assert_eq!(payloads[0]["data"]["doer"]["username"], "nisse");
    assert_eq!(
        payloads[0]["data"]["task"]["assignees"][0]["username"],
        "ann"
    );
    assert_eq!(v.task(id).unwrap().assignees, ["ann"]);
}

#[tokio::test]
async fn webhooks_are_signed_and_shaped_as_vikunja_sends_them() {
    let (v, project, api) = setup().await;
    let receiver = Receiver::default();
    let url = receiver.start().await;
    let hook = v.add_webhook(
        project,
        &url,
        "s3cret",
        &["task.created", "task.comment.created"],
    );
    let unsigned = Receiver::default();
    let unsigned_url = unsigned.start().await;
    v.add_webhook(project, &unsigned_url, "", &["task.comment.created"]);
    let other = v.add_project("ann", "Elsewhere").unwrap();
    let elsewhere = Receiver::default();
    let elsewhere_url = elsewhere.start().await;
    v.add_webhook(
        other,
        &elsewhere_url,
        "x",
        &["task.created", "task.comment.created"],
    );

    let id = v
        .create_task(project, "ann", "Disk <full>", "")
        .await
        .unwrap();
    // The agent's own comment fires like anyone's, with the agent as doer.
    let made = api
        .call(
            "PUT",
            &format!("/tasks/{id}/comments"),
            Some(json!({"comment": "<p>on it & more</p>"})),
        )
        .await;
    assert_eq!(made.status, 201);
    v.flush_webhooks().await.unwrap();

    let got = receiver.requests();
    assert_eq!(got.len(), 2);
    for (headers, body) in &got {
        assert_eq!(
            header(headers, "x-vikunja-signature"),
            Some(signature("s3cret", body).as_str())
        );
        assert_eq!(header(headers, "user-agent"), Some("Vikunja/v2.5.0"));
        assert_eq!(header(headers, "content-type"), Some("application/json"));
    }
    let (_, body) = &got[1];
    let text = std::str::from_utf8(body).unwrap();
    assert!(
        text.contains(r"\u003cp\u003eon it \u0026 more\u003c/p\u003e"),
        "{text}"
    );
    assert!(!text.contains('\n'));
    let payload: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(keys(&payload), ["data", "event_name", "time"]);
    assert_eq!(payload["event_name"], "task.comment.created");
    let time = payload["time"].as_str().unwrap();
    assert!(OffsetDateTime::parse(time, &time::format_description::well_known::Rfc3339).is_ok());
    let data = &payload["data"];
    assert_eq!(keys(data), ["comment", "doer", "project", "task"]);
    assert_eq!(data["doer"]["username"], "nisse");
    assert_eq!(data["doer"]["id"], 2);
    assert_eq!(data["comment"]["author"]["username"], "nisse");
    assert_eq!(data["comment"]["comment"], "<p>on it & more</p>");
    assert_eq!(data["task"]["id"], id);
    assert_eq!(data["task"]["title"], "Disk <full>");
    assert_eq!(data["project"]["id"], project);
    assert_eq!(data["project"]["owner"]["username"], "ann");
    assert_eq!(receiver.payloads()[0]["data"]["doer"]["username"], "ann");

    let (headers, _) = &unsigned.requests()[0];
    assert_eq!(header(headers, "x-vikunja-signature"), None);
    assert!(elsewhere.requests().is_empty());

    let deliveries = v.deliveries();
    let ours: Vec<_> = deliveries.iter().filter(|d| d.webhook_id == hook).collect();
    assert_eq!(ours.len(), 2);
    assert_eq!(ours[1].event, "task.comment.created");
    assert_eq!(ours[1].url, url);
    assert_eq!(ours[1].status, Some(200));
    assert_eq!(ours[1].attempt, 1);
    assert_eq!(ours[1].body.as_bytes(), got[1].1.as_slice());
    assert_eq!(
        ours[1].signature.as_deref(),
        Some(signature("s3cret", &got[1].1).as_str())
    );
    assert_eq!(
        VikunjaStandIn::sign("s3cret", &got[1].1),
        signature("s3cret", &got[1].1)
    );
}

#[tokio::test]
async fn a_failed_delivery_is_retried_with_the_same_body() {
    let (v, project, _) = setup().await;
    let receiver = Receiver::default();
    let url = receiver.start().await;
    receiver.answer(&[500, 503]);
    v.add_webhook(project, &url, "s3cret", &["task.created"]);

    v.create_task(project, "ann", "Disk full", "")
        .await
        .unwrap();
    // The control returns after the first attempt, the retries follow.
    assert!(receiver.requests().len() < 3);
    v.flush_webhooks().await.unwrap();
    let got = receiver.requests();
    assert_eq!(got.len(), 3);
    assert!(
        got.iter().all(|(_, body)| body == &got[0].1),
        "every attempt sends the same body"
    );
    let sig = signature("s3cret", &got[0].1);
    assert!(
        got.iter()
            .all(|(h, _)| header(h, "x-vikunja-signature") == Some(sig.as_str()))
    );

    // One that never answers is given up after six attempts; deliveries
    // stay in event order, one at a time.
    let dead = dead_url();
    let lost = v.add_webhook(project, &dead, "", &["task.created"]);
    let started = Instant::now();
    v.create_task(project, "ann", "Another", "").await.unwrap();
    v.flush_webhooks().await.unwrap();
    let took = started.elapsed();
    let deliveries = v.deliveries();
    let attempts: Vec<(i64, u32, Option<u16>)> = deliveries
        .iter()
        .map(|d| (d.webhook_id, d.attempt, d.status))
        .collect();
    assert_eq!(
        attempts,
        [
            (1, 1, Some(500)),
            (1, 2, Some(503)),
            (1, 3, Some(200)),
            (1, 1, Some(200)),
            (lost, 1, None),
            (lost, 2, None),
            (lost, 3, None),
            (lost, 4, None),
            (lost, 5, None),
            (lost, 6, None),
        ]
    );
    assert!(
        deliveries[4].error.as_deref().unwrap().contains(&dead),
        "{:?}",
        deliveries[4].error
    );
    assert!(deliveries[3].succeeded() && !deliveries[4].succeeded());
    assert!(
        took >= Duration::from_millis(1550),
        "the backoff is 50+100+200+400+800 ms, took {took:?}"
    );
    assert!(took < Duration::from_secs(5), "retries took {took:?}");
}

#[tokio::test]
async fn disabled_webhooks_deliver_nothing_and_stay_lost() {
    let (v, project, _) = setup().await;
    let receiver = Receiver::default();
    let url = receiver.start().await;
    v.add_webhook(
        project,
        &url,
        "s",
        &["task.created", "task.comment.created"],
    );
    let id = v
        .create_task(project, "ann", "Disk full", "")
        .await
        .unwrap();

    v.set_webhooks_enabled(false);
    v.comment(id, "ann", "<p>lost</p>").await.unwrap();
    v.flush_webhooks().await.unwrap();
    assert_eq!(receiver.requests().len(), 1);
    assert_eq!(v.deliveries().len(), 1);

    v.set_webhooks_enabled(true);
    v.comment(id, "ann", "<p>seen</p>").await.unwrap();
    let payloads = receiver.payloads();
    assert_eq!(payloads.len(), 2);
    assert_eq!(payloads[1]["data"]["comment"]["comment"], "<p>seen</p>");
    assert_eq!(
        v.comments(id).len(),
        2,
        "the lost event's change is there to poll"
    );
}

#[tokio::test]
async fn refused_and_lost_answers() {
    let (v, project, api) = setup().await;
    let receiver = Receiver::default();
    let url = receiver.start().await;
    v.add_webhook(project, &url, "", &["task.comment.created"]);
    let id = v
        .create_task(project, "ann", "Disk full", "")
        .await
        .unwrap();
    let task = format!("/api/v1/tasks/{id}");

    v.refuse_next("GET", &task, 429, Some(7), 2);
    for _ in 0..2 {
        let refused = api.get(&format!("/tasks/{id}")).await;
        assert_eq!(refused.status, 429);
        assert_eq!(refused.header("retry-after"), Some("7"));
        assert!(refused.body["message"].is_string());
    }
    assert_eq!(api.get(&format!("/tasks/{id}")).await.status, 200);

    let comments = format!("{task}/comments");
    v.refuse_next("PUT", &comments, 503, None, 1);
    let refused = api
        .call(
            "PUT",
            &format!("/tasks/{id}/comments"),
            Some(json!({"comment": "one"})),
        )
        .await;
    assert_eq!((refused.status, refused.header("retry-after")), (503, None));
    assert!(v.comments(id).is_empty(), "a refused request is not served");

    v.lose_answers("PUT", &comments, 502, 1);
    let lost = api
        .call(
            "PUT",
            &format!("/tasks/{id}/comments"),
            Some(json!({"comment": "two"})),
        )
        .await;
    assert_eq!(lost.status, 502);
    assert_eq!(
        v.comments(id).len(),
        1,
        "a lost answer's request was served"
    );
    v.flush_webhooks().await.unwrap();
    assert_eq!(receiver.requests().len(), 1, "and its webhook fired");

    let log: Vec<(String, u16)> = v
        .requests()
        .iter()
        .filter(|r| r.path == comments)
        .map(|r| (r.body.clone(), r.status))
        .collect();
    assert_eq!(
        log,
        [
            (r#"{"comment":"one"}"#.to_string(), 503),
            (r#"{"comment":"two"}"#.to_string(), 502),
        ]
    );
}

#[tokio::test]
async fn a_scoped_token_may_use_only_its_routes() {
    let (v, project, _) = setup().await;
    let id = v
        .create_task(project, "ann", "Disk full", "")
        .await
        .unwrap();
    let scoped = v
        .add_token(
            "nisse",
            &[("tasks", &["read_one"]), ("tasks_comments", &["create"])],
        )
        .unwrap();
    assert!(scoped.starts_with("tk_") && scoped.len() == 43, "{scoped}");
    let api = Api::new(&v, Some(&scoped));
    assert_eq!(api.get(&format!("/tasks/{id}")).await.status, 200);
    let comment = api
        .call(
            "PUT",
            &format!("/tasks/{id}/comments"),
            Some(json!({"comment": "hi"})),
        )
        .await;
    assert_eq!(comment.status, 201);
    let update = api
        .call("POST", &format!("/tasks/{id}"), Some(json!({"done": true})))
        .await;
    assert_eq!(
        (update.status, update.body["code"].as_i64()),
        (401, Some(11))
    );
    assert_eq!(api.get("/user").await.status, 401);
    assert!(!v.task(id).unwrap().done);
    assert!(v.add_token("nisse", &[("task", &["read_one"])]).is_err());
}

#[tokio::test]
async fn webhooks_can_be_managed_through_the_api() {
    let (v, project, api) = setup().await;
    let receiver = Receiver::default();
    let url = receiver.start().await;
    let path = format!("/projects/{project}/webhooks");

    let made = api
        .call(
            "PUT",
            &path,
            Some(json!({
                "target_url": url,
                "events": ["task.created"],
                "secret": "s3cret",
                "basic_auth_user": "u",
                "basic_auth_password": "p",
            })),
        )
        .await;
    assert_eq!(made.status, 201);
    assert_eq!(made.body["secret"], "");
    assert_eq!(made.body["project_id"], project);
    assert_eq!(made.body["created_by"]["username"], "nisse");
    let hook = made.body["id"].as_i64().unwrap();

    let bad = api
        .call(
            "PUT",
            &path,
            Some(json!({"target_url": url, "events": ["task.done"]})),
        )
        .await;
    assert_eq!(
        (bad.status, &bad.body),
        (
            412,
            &json!({"code": 2002, "message": "Invalid Data", "invalid_fields": ["events"]})
        )
    );
    let ftp = api
        .call(
            "PUT",
            &path,
            Some(json!({"target_url": "ftp://x", "events": ["task.created"]})),
        )
        .await;
    assert_eq!(ftp.body["invalid_fields"], json!(["target_url"]));
    let empty = api.call("PUT", &path, Some(json!({}))).await;
    assert_eq!(
        empty.body["invalid_fields"],
        json!([
            "target_url: non zero value required",
            "events: non zero value required"
        ])
    );

    let listed = api.get(&path).await;
    assert_eq!(ids(&listed.body), [hook]);
    assert_eq!(listed.body[0]["secret"], "");
    let events = api.get("/webhooks/events").await;
    assert_eq!(events.body, json!(WEBHOOK_EVENTS));
    let mut sorted = WEBHOOK_EVENTS.to_vec();
    sorted.sort_unstable();
    assert_eq!(sorted, WEBHOOK_EVENTS);

    let id = v
        .create_task(project, "ann", "Disk full", "")
        .await
        .unwrap();
    let (headers, body) = &receiver.requests()[0];
    assert_eq!(
        header(headers, "x-vikunja-signature"),
        Some(signature("s3cret", body).as_str())
    );
    assert_eq!(header(headers, "authorization"), Some("Basic dTpw"));
    assert_eq!(made.body["basic_auth_password"], "");

    let deleted = api.call("DELETE", &format!("{path}/{hook}"), None).await;
    assert_eq!(
        (deleted.status, &deleted.body),
        (200, &json!({"message": "Successfully deleted."}))
    );
    assert_eq!(
        api.call("DELETE", &format!("{path}/{hook}"), None)
            .await
            .status,
        403
    );
    v.comment(id, "ann", "x").await.unwrap();
    v.create_task(project, "ann", "Another", "").await.unwrap();
    assert_eq!(receiver.requests().len(), 1);
}

#[tokio::test]
async fn send_raw_sends_exactly_what_it_is_given() {
    let v = VikunjaStandIn::start().await.unwrap();
    let receiver = Receiver::default();
    let url = receiver.start().await;
    let body = br#"{"event_name":"task.created"}"#;
    let sig = VikunjaStandIn::sign("k", body);
    let status = v
        .send_raw(
            &url,
            &[
                ("X-Vikunja-Signature", &sig),
                ("Content-Type", "application/json"),
            ],
            body,
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let (headers, got) = &receiver.requests()[0];
    assert_eq!(got.as_slice(), body);
    assert_eq!(header(headers, "x-vikunja-signature"), Some(sig.as_str()));
    assert_eq!(sig, signature("k", body));
    assert!(v.deliveries().is_empty());
}
