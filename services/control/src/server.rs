//! The gRPC service: every call authenticated by an operator's control
//! token before anything is read, then answered by the [`Backend`] for
//! the agents that operator operates.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use futures::StreamExt as _;
use nisse_bus::auth::OperatorName;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::{Request, Response, Status};

use crate::api::{self, control_server::Control};
use crate::{Hub, Refused, Tokens};

/// Why a backend call failed, as the caller is told.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// What was asked for is not there (an item, an agent, a revision).
    #[error("{0}")]
    NotFound(String),
    /// The request is wrong: it says what is.
    #[error("{0}")]
    Invalid(String),
    /// The brain (or the service) did not apply it, and why: not on the
    /// allowlist, a revision not up, a missing confirmation.
    #[error("{0}")]
    Refused(String),
    /// The bus or a brain did not answer.
    #[error("{0}")]
    Unavailable(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl From<Failure> for Status {
    fn from(f: Failure) -> Self {
        match f {
            Failure::NotFound(m) => Status::not_found(m),
            Failure::Invalid(m) => Status::invalid_argument(m),
            Failure::Refused(m) => Status::failed_precondition(m),
            Failure::Unavailable(m) => Status::unavailable(m),
            Failure::Internal(m) => Status::internal(m),
        }
    }
}

/// What the service answers with: the installation's views and commands
/// (the `nisse` binary's, over its configuration and the read models).
/// Every call is made for an operator already authenticated, for agents
/// they operate.
#[tonic::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The agents whose allowlist names `operator` as `control:<name>`;
    /// none when no allowlist does (the token is then refused).
    fn agents_of(&self, operator: &OperatorName) -> Vec<String>;
    /// Each of `agents` at a glance.
    async fn overview(&self, agents: &[String]) -> Result<api::View, Failure>;
    /// An agent's items, optionally only those in `state`.
    async fn items(&self, agent: &str, state: &str) -> Result<api::View, Failure>;
    /// One item whole, with `revision` of its plan (0: the current one);
    /// or only its `log`, or only its `plan`s (`part`).
    async fn item(
        &self,
        agent: &str,
        item: &str,
        revision: u32,
        part: &str,
    ) -> Result<api::View, Failure>;
    /// Sends `request`'s command as `operator` and returns what the
    /// brain said it did.
    async fn command(
        &self,
        operator: &OperatorName,
        request: api::CommandRequest,
    ) -> Result<Vec<String>, Failure>;
    /// The streams of `agents`, their consumers, dead letters, circuits
    /// and model spend.
    async fn streams(&self, agents: &[String]) -> Result<api::View, Failure>;
    /// An agent's duties.
    async fn duties(&self, agent: &str) -> Result<api::View, Failure>;
    /// The world model: every entity (`entity` empty), one, or what a
    /// stop of it takes down (`blast`).
    async fn world(&self, entity: &str, blast: bool) -> Result<api::View, Failure>;
    /// The vault checked: `world` (its world model and links) or `vault`
    /// (its links).
    async fn check(&self, what: &str) -> Result<api::CheckResponse, Failure>;
    /// `agent`'s stream from `from` through `to` (`None`: the last
    /// stored now), decoded, as it is read.
    async fn replay(
        &self,
        agent: &str,
        from: u64,
        to: Option<u64>,
    ) -> Result<Records<api::ReplayRecord>, Failure>;
    /// What of `agents` is in the middle of a step, one line each.
    async fn idle(&self, agents: &[String]) -> Result<Vec<String>, Failure>;
    /// `agent`'s MCP server instances and their tools.
    async fn mcp_list(&self, agent: &str) -> Result<api::View, Failure>;
    /// `command` as the policy classifies it, assessed on `target` when
    /// it is not empty.
    async fn classify(&self, command: &str, target: &str) -> Result<api::View, Failure>;
    /// `agent`'s captured model calls, oldest first, as they are read.
    async fn model_calls(&self, agent: &str) -> Result<Records<api::ModelCall>, Failure>;
    /// The kill switches, shown or changed by `operator`.
    async fn autonomy(&self, operator: &OperatorName, change: &str) -> Result<api::View, Failure>;
}

/// What a backend streams back: records as they are read, ending at the
/// first failure.
pub type Records<T> = Pin<Box<dyn Stream<Item = Result<T, Failure>> + Send + 'static>>;

/// The service: a backend behind the token check, and the hub its
/// watchers read.
#[derive(Debug)]
pub struct ControlService<B> {
    backend: Arc<B>,
    tokens: Tokens,
    hub: Hub,
}

impl<B> Clone for ControlService<B> {
    fn clone(&self) -> Self {
        Self {
            backend: self.backend.clone(),
            tokens: self.tokens.clone(),
            hub: self.hub.clone(),
        }
    }
}

/// How often a watch checks that its token still holds: a revoked
/// token's watch ends within this.
const RECHECK: Duration = Duration::from_secs(1);

/// An operator, authenticated, and the agents they operate.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Who.
    pub operator: OperatorName,
    /// Their agents.
    pub agents: Vec<String>,
}

impl Caller {
    /// `agent` if the caller operates it.
    pub fn agent<'a>(&self, agent: &'a str) -> Result<&'a str, Status> {
        if self.agents.iter().any(|a| a == agent) {
            Ok(agent)
        } else {
            Err(Status::permission_denied(format!(
                "{} does not operate agent `{agent}` through the control plane (no `control:{}` on its allowlist)",
                self.operator, self.operator
            )))
        }
    }
}

impl<B: Backend> ControlService<B> {
    /// A service answering from `backend`, checking tokens against
    /// `tokens`, its watchers reading `hub`.
    pub fn new(backend: Arc<B>, tokens: Tokens, hub: Hub) -> Self {
        Self {
            backend,
            tokens,
            hub,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The hub.
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// The caller a bearer token (the header's value, `Bearer <token>`)
    /// belongs to, or why it is refused.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Refused> {
        let token = authorization
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(Refused::Missing)?;
        let operator = self.tokens.verify(token)?;
        let agents = self.backend.agents_of(&operator);
        if agents.is_empty() {
            return Err(Refused::NotAnOperator);
        }
        Ok(Caller { operator, agents })
    }

    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap_or_default());
        self.authenticate(header).map_err(|refused| {
            tracing::info!("refused a control call: {refused}");
            Status::unauthenticated(refused.to_string())
        })
    }

    /// The live events for `caller` (of `agent`, or of all theirs when
    /// empty), ending when they fall a whole ring behind (with how many
    /// they missed) or their token stops holding.
    pub fn events(
        &self,
        caller: Caller,
        agent: &str,
        token_header: Option<String>,
    ) -> impl Stream<Item = Result<api::Event, Status>> + Send + 'static {
        let only = (!agent.is_empty()).then(|| agent.to_string());
        let service = self.clone();
        let mut checked = Instant::now();
        BroadcastStream::new(self.hub.watch())
            .map(move |event| match event {
                Ok(event) => {
                    if checked.elapsed() >= RECHECK {
                        checked = Instant::now();
                        if let Err(refused) = service.authenticate(token_header.as_deref()) {
                            return Some(Err(Status::unauthenticated(refused.to_string())));
                        }
                    }
                    let mine = caller.agents.contains(&event.agent)
                        && only.as_ref().is_none_or(|a| *a == event.agent);
                    mine.then_some(Ok(event))
                }
                Err(BroadcastStreamRecvError::Lagged(missed)) => Some(Err(Status::data_loss(
                    format!("this watch fell behind and missed {missed} events; watch again and read the current state"),
                ))),
            })
            .filter_map(std::future::ready)
            // After the first error, nothing more: the caller watches again.
            .scan(false, |ended, item| {
                if *ended {
                    return std::future::ready(None);
                }
                *ended = item.is_err();
                std::future::ready(Some(item))
            })
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// A server stream of `T`.
type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A backend's records as the caller gets them: a failure as its status.
fn statuses<T: Send + 'static>(records: Records<T>) -> Streamed<T> {
    Box::pin(records.map(|r| r.map_err(Status::from)))
}

#[tonic::async_trait]
impl<B: Backend> Control for ControlService<B> {
    async fn who_am_i(&self, request: Request<api::WhoAmIRequest>) -> Reply<api::WhoAmIResponse> {
        let caller = self.caller(&request)?;
        Ok(Response::new(api::WhoAmIResponse {
            operator: caller.operator.to_string(),
            agents: caller.agents,
        }))
    }

    async fn overview(&self, request: Request<api::OverviewRequest>) -> Reply<api::View> {
        let caller = self.caller(&request)?;
        Ok(Response::new(self.backend.overview(&caller.agents).await?))
    }

    async fn list_items(&self, request: Request<api::ListItemsRequest>) -> Reply<api::View> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let agent = caller.agent(&r.agent)?;
        Ok(Response::new(self.backend.items(agent, &r.state).await?))
    }

    async fn get_item(&self, request: Request<api::GetItemRequest>) -> Reply<api::View> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let agent = caller.agent(&r.agent)?;
        Ok(Response::new(
            self.backend
                .item(agent, &r.item, r.revision, &r.part)
                .await?,
        ))
    }

    async fn command(&self, request: Request<api::CommandRequest>) -> Reply<api::CommandResponse> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        caller.agent(&r.agent)?;
        let lines = self.backend.command(&caller.operator, r).await?;
        Ok(Response::new(api::CommandResponse { lines }))
    }

    async fn streams(&self, request: Request<api::StreamsRequest>) -> Reply<api::View> {
        let caller = self.caller(&request)?;
        Ok(Response::new(self.backend.streams(&caller.agents).await?))
    }

    async fn duties(&self, request: Request<api::DutiesRequest>) -> Reply<api::View> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let agent = caller.agent(&r.agent)?;
        Ok(Response::new(self.backend.duties(agent).await?))
    }

    async fn world(&self, request: Request<api::WorldRequest>) -> Reply<api::View> {
        self.caller(&request)?;
        let r = request.into_inner();
        if r.blast && r.entity.is_empty() {
            return Err(Status::invalid_argument(
                "a blast radius is of an entity: name it",
            ));
        }
        Ok(Response::new(self.backend.world(&r.entity, r.blast).await?))
    }

    async fn check(&self, request: Request<api::CheckRequest>) -> Reply<api::CheckResponse> {
        self.caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(self.backend.check(&r.what).await?))
    }

    type ReplayStream = Streamed<api::ReplayRecord>;

    async fn replay(&self, request: Request<api::ReplayRequest>) -> Reply<Self::ReplayStream> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let agent = caller.agent(&r.agent)?;
        let records = self.backend.replay(agent, r.from_seq, r.to_seq).await?;
        Ok(Response::new(statuses(records)))
    }

    async fn idle(&self, request: Request<api::IdleRequest>) -> Reply<api::IdleResponse> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let agents = if r.agent.is_empty() {
            caller.agents.clone()
        } else {
            vec![caller.agent(&r.agent)?.to_string()]
        };
        Ok(Response::new(api::IdleResponse {
            busy: self.backend.idle(&agents).await?,
        }))
    }

    async fn mcp_list(&self, request: Request<api::McpListRequest>) -> Reply<api::View> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let agent = caller.agent(&r.agent)?;
        Ok(Response::new(self.backend.mcp_list(agent).await?))
    }

    async fn classify_command(
        &self,
        request: Request<api::ClassifyCommandRequest>,
    ) -> Reply<api::View> {
        self.caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.backend.classify(&r.command, &r.target).await?,
        ))
    }

    type ExportModelCallsStream = Streamed<api::ModelCall>;

    async fn export_model_calls(
        &self,
        request: Request<api::ExportModelCallsRequest>,
    ) -> Reply<Self::ExportModelCallsStream> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let agent = caller.agent(&r.agent)?;
        let calls = self.backend.model_calls(agent).await?;
        Ok(Response::new(statuses(calls)))
    }

    async fn autonomy(&self, request: Request<api::AutonomyRequest>) -> Reply<api::View> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        Ok(Response::new(
            self.backend.autonomy(&caller.operator, &r.change).await?,
        ))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<api::Event, Status>> + Send + 'static>>;

    async fn watch(&self, request: Request<api::WatchRequest>) -> Reply<Self::WatchStream> {
        let caller = self.caller(&request)?;
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let r = request.into_inner();
        if !r.agent.is_empty() {
            caller.agent(&r.agent)?;
        }
        Ok(Response::new(Box::pin(
            self.events(caller, &r.agent, header),
        )))
    }
}
