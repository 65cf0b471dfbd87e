//! Which protobuf type travels on which subject, and how a consumer turns
//! bytes back into one.

use std::borrow::Cow;

use nisse_proto::v1::{
    AlertReceived, BrainStarted, ClassifyRequest, ClassifyVerdict, DeadLetter, DeadLetterCause,
    DutyDue, Envelope, ExecProgress, ExecRequest, ExecResult, GiteaEvent, GiteaRequest,
    GiteaResult, HostBinding, MatrixEventReceived, MatrixOutbound, McpMount, McpRequest, McpResult,
    McpTools, ModelExchange, ModelRequest, ModelResponse, OperatorCommand, OperatorReply,
    ProbeRequest, ProbeResult, RolesPinned, Tell, TellPosted, Tick, VaultFound, VaultQuery,
    VaultWrite, VaultWritten, VikunjaEvent, VikunjaRequest, VikunjaResult, WorldModel,
};

use crate::{AgentName, Filter, SubjectKind};

/// A message type of the bus: a protobuf message with the envelope as its
/// field 1, published on exactly one subject kind.
pub trait Contract: prost::Message + prost::Name + Default + Clone + Send + Sync + 'static {
    /// The subject kind this type is published on.
    const KIND: SubjectKind;

    /// The envelope, if set.
    fn envelope(&self) -> Option<&Envelope>;

    /// The envelope slot, for publishing to fill in.
    fn envelope_mut(&mut self) -> &mut Option<Envelope>;

    /// Content rules beyond what protobuf checks. A message that breaks them
    /// is dead-lettered by consumers, never handed to a handler.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    /// The request id of a request the brain sends a service
    /// ([`SubjectKind::answered_by`]) or of a service's answer to one: the
    /// answer carries its request's, which is how the brain matches them
    /// and keeps each request's deadline. `None` for every other type.
    fn request_id(&self) -> Option<&str> {
        None
    }

    /// The last token of the subject for kinds that have one
    /// ([`SubjectKind::per_item`]): a binding's or a mount's work item id,
    /// the id of the command an operator reply answers (its causation),
    /// the request a verdict answers.
    fn subject_token(&self) -> Option<Cow<'_, str>> {
        if Self::KIND == SubjectKind::ClassifyVerdict {
            // By its request id, made one token whatever it holds.
            return self.request_id().map(crate::topology::verdict_token);
        }
        let env = self.envelope()?;
        let token = match Self::KIND {
            SubjectKind::ExecBind => Some(env.work_item_id.as_str()),
            SubjectKind::OperatorReply => Some(env.causation_id.as_str()),
            // The operator who sends a command: their credentials are the
            // only ones that may publish on it.
            SubjectKind::InOperator => env.actor.as_ref().map(|a| a.id.as_str()),
            // The duty's own item id (`duty-<name>`).
            SubjectKind::DutyDue => Some(env.work_item_id.as_str()),
            // The work item the MCP instances are mounted for.
            SubjectKind::McpMount => Some(env.work_item_id.as_str()),
            _ => None,
        };
        token.map(Cow::Borrowed)
    }
}

/// The subject `msg` is published on for `agent`: its kind's, ending in
/// its token for per-item kinds (a binding's work item, a reply's command,
/// a command's sender), which must be one subject token.
pub(crate) fn subject_of<M: Contract>(agent: &AgentName, msg: &M) -> crate::Result<String> {
    match msg.subject_token() {
        Some(token) if crate::topology::is_token(&token) => {
            Ok(format!("{}.{token}", agent.subject(M::KIND)))
        }
        Some(token) => Err(crate::Error::InvalidMessage(format!(
            "{} is published on a subject ending in a token of its own, and `{token}` cannot be one",
            M::NAME
        ))),
        None if M::KIND.per_item() => Err(crate::Error::InvalidMessage(format!(
            "{} is published on a subject ending in a token of its own (its work item, command or sender), and it has none",
            M::NAME
        ))),
        None => Ok(agent.subject(M::KIND)),
    }
}

/// Why a delivered message cannot be turned into what the consumer expects.
/// A rejected message is dead-lettered with this cause and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The dead-letter cause.
    pub cause: DeadLetterCause,
    /// What is wrong, for the operator.
    pub reason: String,
}

impl Rejection {
    fn undecodable(kind: SubjectKind, type_name: &str, e: prost::DecodeError) -> Self {
        Self {
            cause: DeadLetterCause::Undecodable,
            reason: format!(
                "not a valid {type_name} (the type of `{}`): {e}",
                kind.suffix()
            ),
        }
    }

    fn invalid(reason: String) -> Self {
        Self {
            cause: DeadLetterCause::Invalid,
            reason,
        }
    }
}

/// What a consumer can decode deliveries into: one contract type (for a
/// service's consumer, which takes one subject kind) or [`AnyMessage`] (for
/// a brain, which takes all its inputs, and for reading a stream back).
pub trait Decode: Sized + Send + 'static {
    /// Decodes the payload of a message of `kind`, and validates it.
    fn decode(kind: SubjectKind, payload: &[u8]) -> Result<Self, Rejection>;

    /// The decoded message's envelope.
    fn envelope(&self) -> &Envelope;

    /// Whether a consumer filtered on `filter` delivers only what this
    /// type decodes.
    fn accepts(filter: Filter) -> bool;
}

/// The checks every message gets, whatever its type.
fn check_envelope(envelope: Option<&Envelope>) -> Result<&Envelope, Rejection> {
    let env =
        envelope.ok_or_else(|| Rejection::invalid("the envelope (field 1) is missing".into()))?;
    if env.agent.is_empty() {
        return Err(Rejection::invalid("envelope.agent is empty".into()));
    }
    if env.message_id.is_empty() {
        return Err(Rejection::invalid("envelope.message_id is empty".into()));
    }
    Ok(env)
}

impl<M: Contract> Decode for M {
    fn decode(kind: SubjectKind, payload: &[u8]) -> Result<Self, Rejection> {
        if kind != M::KIND {
            return Err(Rejection {
                cause: DeadLetterCause::UnknownSubject,
                reason: format!(
                    "a consumer of `{}` got a message on `{}`",
                    M::KIND.suffix(),
                    kind.suffix()
                ),
            });
        }
        let msg =
            M::decode(payload).map_err(|e| Rejection::undecodable(kind, &M::full_name(), e))?;
        check_envelope(Contract::envelope(&msg))?;
        msg.validate().map_err(Rejection::invalid)?;
        Ok(msg)
    }

    fn envelope(&self) -> &Envelope {
        // `decode` refused messages without one.
        static NONE: Envelope = Envelope {
            agent: String::new(),
            work_item_id: String::new(),
            actor: None,
            causation_id: String::new(),
            trace: None,
            created_at: None,
            message_id: String::new(),
        };
        Contract::envelope(self).unwrap_or(&NONE)
    }

    fn accepts(filter: Filter) -> bool {
        filter == Filter::Kind(M::KIND)
    }
}

macro_rules! contracts {
    ($($kind:ident => $ty:ident $([$request:ident])?),+ $(,)?) => {
        $(
            impl Contract for $ty {
                const KIND: SubjectKind = SubjectKind::$kind;

                fn envelope(&self) -> Option<&Envelope> {
                    self.envelope.as_ref()
                }

                fn envelope_mut(&mut self) -> &mut Option<Envelope> {
                    &mut self.envelope
                }

                $(
                    fn request_id(&self) -> Option<&str> {
                        Some(&self.$request)
                    }
                )?
            }
        )+

        /// Any message of an agent's stream, decoded by its subject kind.
        #[derive(Debug, Clone, PartialEq)]
        #[allow(missing_docs)]
        #[allow(
            clippy::large_enum_variant,
            reason = "one message is in hand at a time; boxing would allocate per delivery"
        )]
        pub enum AnyMessage {
            $($kind($ty),)+
        }

        impl AnyMessage {
            /// The subject kind of the message.
            pub fn kind(&self) -> SubjectKind {
                match self {
                    $(Self::$kind(_) => SubjectKind::$kind,)+
                }
            }

            /// The subject kind whose type has this protobuf full name.
            pub fn kind_of_type(type_name: &str) -> Option<SubjectKind> {
                SubjectKind::ALL
                    .into_iter()
                    .find(|k| Self::type_name(*k) == type_name)
            }

            /// Sends it with [`crate::Bus::send`], whatever its type.
            pub async fn send(self, bus: &crate::Bus) -> crate::Result<crate::PendingPublish> {
                match self {
                    $(Self::$kind(m) => bus.send(m).await,)+
                }
            }

            /// Its envelope, to change before it is encoded again (a
            /// request sent again under a new message id).
            pub fn envelope_mut(&mut self) -> &mut Option<Envelope> {
                match self {
                    $(Self::$kind(m) => Contract::envelope_mut(m),)+
                }
            }

            /// Its protobuf encoding.
            pub fn encode_to_vec(&self) -> Vec<u8> {
                match self {
                    $(Self::$kind(m) => prost::Message::encode_to_vec(m),)+
                }
            }

            /// The request id it carries, for requests and their answers
            /// ([`Contract::request_id`]).
            pub fn request_id(&self) -> Option<&str> {
                match self {
                    $(Self::$kind(m) => Contract::request_id(m),)+
                }
            }

            /// The subject it is published on: its envelope's agent's
            /// subject of its kind (with its token, for per-item kinds).
            pub fn subject(&self) -> crate::Result<String> {
                let agent: crate::AgentName = Decode::envelope(self).agent.parse()?;
                match self {
                    $(Self::$kind(m) => subject_of(&agent, m),)+
                }
            }

            /// The protobuf full name of the type that travels on `kind`,
            /// e.g. `nisse.v1.AlertReceived`.
            pub fn type_name(kind: SubjectKind) -> String {
                match kind {
                    $(SubjectKind::$kind => <$ty as prost::Name>::full_name(),)+
                }
            }
        }

        impl Decode for AnyMessage {
            fn decode(kind: SubjectKind, payload: &[u8]) -> Result<Self, Rejection> {
                match kind {
                    $(SubjectKind::$kind => <$ty as Decode>::decode(kind, payload).map(Self::$kind),)+
                }
            }

            fn envelope(&self) -> &Envelope {
                match self {
                    $(Self::$kind(m) => Decode::envelope(m),)+
                }
            }

            fn accepts(_filter: Filter) -> bool {
                true
            }
        }
    };
}

contracts! {
    InAlert => AlertReceived,
    InMatrix => MatrixEventReceived,
    InOperator => OperatorCommand,
    OutMatrix => MatrixOutbound,
    Tell => Tell,
    TellPosted => TellPosted,
    OperatorReply => OperatorReply,
    ClassifyReq => ClassifyRequest [request_id],
    ClassifyVerdict => ClassifyVerdict [request_id],
    ModelReq => ModelRequest [request_id],
    ModelResp => ModelResponse [request_id],
    ModelCapture => ModelExchange,
    LoopPin => RolesPinned,
    ExecReq => ExecRequest [request_id],
    ExecResult => ExecResult [request_id],
    ExecProgress => ExecProgress,
    ExecBind => HostBinding,
    VaultWrite => VaultWrite [request_id],
    VaultWritten => VaultWritten [request_id],
    VaultQuery => VaultQuery [request_id],
    VaultFound => VaultFound [request_id],
    World => WorldModel,
    InGitea => GiteaEvent,
    GiteaReq => GiteaRequest [request_id],
    GiteaResult => GiteaResult [request_id],
    InVikunja => VikunjaEvent,
    VikunjaReq => VikunjaRequest [request_id],
    VikunjaResult => VikunjaResult [request_id],
    McpReq => McpRequest [request_id],
    McpResult => McpResult [request_id],
    McpMount => McpMount,
    McpTools => McpTools,
    Tick => Tick,
    DutyDue => DutyDue,
    ProbeReq => ProbeRequest [request_id],
    ProbeResult => ProbeResult [request_id],
    BrainStarted => BrainStarted,
    DeadLetter => DeadLetter,
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    fn env() -> Envelope {
        Envelope {
            agent: "ops".into(),
            message_id: "m-1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn every_kind_has_a_distinct_type() {
        let mut names: Vec<String> = SubjectKind::ALL
            .iter()
            .map(|k| AnyMessage::type_name(*k))
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), SubjectKind::ALL.len());
    }

    #[test]
    fn a_message_without_envelope_is_invalid() {
        let bytes = AlertReceived::default().encode_to_vec();
        let err = <AlertReceived as Decode>::decode(SubjectKind::InAlert, &bytes).unwrap_err();
        assert_eq!(err.cause, DeadLetterCause::Invalid);
        assert!(err.reason.contains("envelope"), "{}", err.reason);
    }

    #[test]
    fn garbage_is_undecodable_and_names_the_type() {
        let err =
            <AnyMessage as Decode>::decode(SubjectKind::ExecReq, &[0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(err.cause, DeadLetterCause::Undecodable);
        assert!(
            err.reason.contains("nisse.v1.ExecRequest"),
            "{}",
            err.reason
        );
    }

    #[test]
    fn a_mount_is_published_on_its_work_items_subject() {
        let mount = McpMount {
            envelope: Some(Envelope {
                work_item_id: "wi-1".into(),
                ..env()
            }),
            work_item_id: "wi-1".into(),
            ..Default::default()
        };
        let agent: AgentName = "ops".parse().unwrap();
        assert_eq!(
            subject_of(&agent, &mount).unwrap(),
            "nisse.ops.out.mcp.mount.wi-1"
        );
    }

    #[test]
    fn a_verdict_is_published_on_its_requests_subject() {
        let agent: AgentName = "ops".parse().unwrap();
        let verdict = |id: &str| ClassifyVerdict {
            envelope: Some(env()),
            request_id: id.into(),
            ..Default::default()
        };
        assert_eq!(
            subject_of(&agent, &verdict("wi-1:c1:classify")).unwrap(),
            "nisse.ops.in.classify.verdict.wi-1:c1:classify"
        );
        // An id that is no subject token still has a subject of its own.
        assert_eq!(
            subject_of(&agent, &verdict("wi-1.c1")).unwrap(),
            format!(
                "nisse.ops.in.classify.verdict.{}",
                crate::key_hash("wi-1.c1")
            )
        );
    }

    #[test]
    fn any_message_decodes_by_kind() {
        let msg = ExecResult {
            envelope: Some(env()),
            request_id: "r".into(),
            ..Default::default()
        };
        let any =
            <AnyMessage as Decode>::decode(SubjectKind::ExecResult, &msg.encode_to_vec()).unwrap();
        assert_eq!(any, AnyMessage::ExecResult(msg));
        assert_eq!(Decode::envelope(&any).message_id, "m-1");
    }
}
