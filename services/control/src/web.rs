//! The web control room and its JSON API, on the gRPC listener: the page
//! (`web/`, plain HTML, CSS and JavaScript compiled into the binary), the
//! same views and commands as the gRPC API answered as JSON, and live
//! events as server-sent events.
//!
//! The browser holds the operator's token in an `HttpOnly`,
//! `SameSite=Strict` cookie set by `POST /api/login` (after the token is
//! verified); a call may also send it as a bearer token. A command must
//! also carry the header `x-nisse-control: 1`, which no cross-site form
//! or link can add, so a page elsewhere cannot make the browser approve
//! anything.

use std::convert::Infallible;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{self, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{Stream, StreamExt as _};
use serde::Deserialize;

use crate::Refused;
use crate::api::{self, event};
use crate::server::{Backend, Caller, ControlService};
use nisse_bus::proto::{self, operator_command::Command};

/// The cookie the browser keeps the token in.
const COOKIE: &str = "nisse_control";

/// The header a command must carry.
const COMMAND_HEADER: &str = "x-nisse-control";

/// The page's routes; over TLS (`secure`), the login cookie is `Secure`
/// too, so a browser never sends it in the clear.
pub fn router<B: Backend>(service: ControlService<B>, secure: bool) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { page("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/app.js",
            get(|| async { page("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/app.css",
            get(|| async { page("text/css; charset=utf-8", APP_CSS) }),
        )
        .route(
            "/api/login",
            post(move |state, body| login::<B>(state, body, secure)),
        )
        .route("/api/logout", post(logout))
        .route("/api/whoami", get(whoami::<B>))
        .route("/api/overview", get(overview::<B>))
        .route("/api/items", get(items::<B>))
        .route("/api/item", get(item::<B>))
        .route("/api/streams", get(streams::<B>))
        .route("/api/duties", get(duties::<B>))
        .route("/api/world", get(world::<B>))
        .route("/api/autonomy", get(autonomy::<B>))
        .route("/api/command", post(command::<B>))
        .route("/api/events", get(events::<B>))
        .with_state(service)
}

const INDEX: &str = include_str!("../web/index.html");
const APP_JS: &str = include_str!("../web/app.js");
const APP_CSS: &str = include_str!("../web/app.css");

fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            // Nothing from elsewhere: no script, style, frame or connection.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// An error as JSON `{ "error": … }` with its status.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

fn status_response(s: &tonic::Status) -> Response {
    let code = match s.code() {
        tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        tonic::Code::FailedPrecondition => StatusCode::CONFLICT,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(code, s.message())
}

/// The token a browser call carries: its bearer header, else its cookie.
fn token_header(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return Some(v.to_string());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| format!("Bearer {v}"))
}

fn caller<B: Backend>(service: &ControlService<B>, headers: &HeaderMap) -> Result<Caller, Refused> {
    service.authenticate(token_header(headers).as_deref())
}

fn unauthorized(refused: Refused) -> Response {
    error(StatusCode::UNAUTHORIZED, refused.to_string())
}

/// A view as the page reads it: its JSON, with its text beside it.
fn view_json(result: Result<api::View, crate::Failure>) -> Response {
    match result {
        Ok(view) => {
            let json: serde_json::Value = serde_json::from_str(&view.json).unwrap_or_default();
            Json(serde_json::json!({ "view": json, "text": view.text })).into_response()
        }
        Err(f) => status_response(&f.into()),
    }
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

async fn login<B: Backend>(
    State(service): State<ControlService<B>>,
    Json(login): Json<Login>,
    secure: bool,
) -> Response {
    let token = login.token.trim();
    match service.authenticate(Some(&format!("Bearer {token}"))) {
        Ok(caller) => {
            let secure = if secure { "; Secure" } else { "" };
            let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/{secure}");
            let mut r = Json(serde_json::json!({
                "operator": caller.operator.to_string(),
                "agents": caller.agents,
            }))
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(refused) => error(StatusCode::UNAUTHORIZED, refused.to_string()),
    }
}

async fn logout() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("nisse_control=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    r
}

async fn whoami<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
) -> Response {
    match caller(&service, &headers) {
        Ok(c) => Json(serde_json::json!({
            "operator": c.operator.to_string(),
            "agents": c.agents,
        }))
        .into_response(),
        Err(r) => unauthorized(r),
    }
}

async fn overview<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
) -> Response {
    match caller(&service, &headers) {
        Ok(c) => view_json(service.backend().overview(&c.agents).await),
        Err(r) => unauthorized(r),
    }
}

#[derive(Deserialize)]
struct AgentQuery {
    #[serde(default)]
    agent: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    item: String,
    #[serde(default)]
    revision: u32,
}

/// The views of one agent.
#[derive(Clone, Copy)]
enum AgentView {
    Items,
    Item,
    Duties,
}

/// A view of one of the caller's agents: the token checked, the agent
/// theirs, then the view asked of the backend.
async fn agent_view<B: Backend>(
    service: &ControlService<B>,
    headers: &HeaderMap,
    q: &AgentQuery,
    which: AgentView,
) -> Response {
    let c = match caller(service, headers) {
        Ok(c) => c,
        Err(r) => return unauthorized(r),
    };
    let agent = match c.agent(&q.agent) {
        Ok(agent) => agent,
        Err(s) => return status_response(&s),
    };
    let backend = service.backend();
    view_json(match which {
        AgentView::Items => backend.items(agent, &q.state).await,
        AgentView::Item => backend.item(agent, &q.item, q.revision, "").await,
        AgentView::Duties => backend.duties(agent).await,
    })
}

async fn items<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
    Query(q): Query<AgentQuery>,
) -> Response {
    agent_view(&service, &headers, &q, AgentView::Items).await
}

async fn item<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
    Query(q): Query<AgentQuery>,
) -> Response {
    agent_view(&service, &headers, &q, AgentView::Item).await
}

async fn streams<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
) -> Response {
    match caller(&service, &headers) {
        Ok(c) => view_json(service.backend().streams(&c.agents).await),
        Err(r) => unauthorized(r),
    }
}

async fn duties<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
    Query(q): Query<AgentQuery>,
) -> Response {
    agent_view(&service, &headers, &q, AgentView::Duties).await
}

async fn world<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
) -> Response {
    match caller(&service, &headers) {
        Ok(_) => view_json(service.backend().world("", false).await),
        Err(r) => unauthorized(r),
    }
}

async fn autonomy<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
) -> Response {
    match caller(&service, &headers) {
        Ok(c) => view_json(service.backend().autonomy(&c.operator, "").await),
        Err(r) => unauthorized(r),
    }
}

/// A command from the page.
#[derive(Deserialize)]
struct PageCommand {
    agent: String,
    #[serde(default)]
    item: String,
    /// approve, deny, stop, abandon, retry, park, do-next.
    action: String,
    #[serde(default)]
    revision: u32,
    /// A denial's reason, an abandonment's note.
    #[serde(default)]
    text: String,
    /// The destructive steps named back.
    #[serde(default)]
    confirm: String,
}

async fn command<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
    Json(cmd): Json<PageCommand>,
) -> Response {
    let c = match caller(&service, &headers) {
        Ok(c) => c,
        Err(r) => return unauthorized(r),
    };
    if headers.get(COMMAND_HEADER).and_then(|v| v.to_str().ok()) != Some("1") {
        return error(
            StatusCode::FORBIDDEN,
            format!("a command must carry the header `{COMMAND_HEADER}: 1`"),
        );
    }
    if let Err(s) = c.agent(&cmd.agent) {
        return status_response(&s);
    }
    let command = match cmd.action.as_str() {
        "approve" => Command::Approve(proto::Approve {
            revision: cmd.revision,
            confirm: cmd.confirm.clone(),
        }),
        "deny" => Command::Deny(proto::Deny {
            revision: cmd.revision,
            reason: cmd.text.clone(),
        }),
        "stop" => Command::Stop(proto::Stop {}),
        "abandon" => Command::Abandon(proto::Abandon {
            note: cmd.text.clone(),
        }),
        "retry" => Command::Retry(proto::Retry {}),
        "park" => Command::Park(proto::Park {}),
        "do-next" => Command::DoNext(proto::DoNext {}),
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "`{other}` is no command: approve, deny, stop, abandon, retry, park or do-next"
                ),
            );
        }
    };
    let request = api::CommandRequest {
        agent: cmd.agent,
        item: cmd.item,
        command: Some(proto::OperatorCommand {
            command: Some(command),
            ..Default::default()
        }),
        confirm: cmd.confirm,
    };
    match service.backend().command(&c.operator, request).await {
        Ok(lines) => Json(serde_json::json!({ "lines": lines })).into_response(),
        Err(f) => status_response(&f.into()),
    }
}

async fn events<B: Backend>(
    State(service): State<ControlService<B>>,
    headers: HeaderMap,
    Query(q): Query<AgentQuery>,
) -> Response {
    let c = match caller(&service, &headers) {
        Ok(c) => c,
        Err(r) => return unauthorized(r),
    };
    if !q.agent.is_empty()
        && let Err(s) = c.agent(&q.agent)
    {
        return status_response(&s);
    }
    let stream = service.events(c, &q.agent, token_header(&headers)).map(
        |e| -> Result<sse::Event, Infallible> {
            Ok(match e {
                Ok(e) => sse::Event::default()
                    .event("event")
                    .data(event_json(&e).to_string()),
                Err(s) => sse::Event::default().event("end").data(s.message()),
            })
        },
    );
    sse_response(stream)
}

fn sse_response(
    stream: impl Stream<Item = Result<sse::Event, Infallible>> + Send + 'static,
) -> Response {
    Sse::new(stream)
        .keep_alive(sse::KeepAlive::default())
        .into_response()
}

/// An event as the page reads it.
pub fn event_json(e: &api::Event) -> serde_json::Value {
    let mut out = serde_json::json!({ "agent": e.agent, "sequence": e.sequence });
    match &e.event {
        Some(event::Event::Message(m)) => {
            out["message"] = serde_json::json!({
                "subject": m.subject,
                "type": m.r#type,
                "work_item": m.work_item,
            });
        }
        Some(event::Event::Item(i)) => {
            out["item"] = serde_json::json!({
                "id": i.id,
                "number": i.number,
                "title": i.title,
                "state": i.state,
                "plan_revision": i.plan_revision,
                "plan_status": i.plan_status,
                "updated_at": i.updated_at,
            });
        }
        None => {}
    }
    out
}
