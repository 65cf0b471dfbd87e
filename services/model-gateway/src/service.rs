//! The gateway as a service: each agent's `model-gateway` consumer,
//! `model.req` → `model.resp`.

use nisse_bus::proto::ModelRequest;
use nisse_bus::service::Context;
use nisse_bus::{AgentName, ConsumerSpec, Delivery, Handler, Intake, Unhandled};
use nisse_models::ModelsConfig;

use crate::Gateway;

/// Who asks through `model.req`: the agents' brains.
const CALLER: &str = "brain";

/// Serves every agent of `ctx` until shutdown on its `model-gateway`
/// consumer (several processes may share it), answering up to
/// `max-in-flight` requests of each agent at once. Every request taken is
/// kept alive on the server while it waits for a slot or its model, so a
/// slow model does not get it redelivered. Requests still running at
/// shutdown finish (or are abandoned un-acked by the process's grace
/// period, and redelivered).
pub async fn run(ctx: Context<ModelsConfig>) -> anyhow::Result<()> {
    let gateway = Gateway::new(ModelsConfig::clone(&ctx.config), ctx.bus.clone())?;
    let handlers = ctx.every_agent(gateway);
    let intake = Intake {
        consumer: ConsumerSpec::MODEL_GATEWAY,
        in_flight: ctx.config.max_in_flight,
    };
    nisse_bus::serve(&ctx, intake, handlers).await?;
    Ok(())
}

/// Answers one request: calls the model, publishes the response. The ack
/// (by the skeleton) comes only after the response is stored, so a crash
/// in between redelivers the request.
impl Handler<ModelRequest> for Gateway {
    async fn handle(
        &self,
        agent: &AgentName,
        delivery: &Delivery<ModelRequest>,
    ) -> Result<(), Unhandled> {
        let request = delivery.message();
        if request.request_id.is_empty() {
            // Its answer would have no id either.
            return Err(Unhandled::dead_letter(
                "a model request without a request id",
            ));
        }
        let response = self
            .try_complete(agent, request, CALLER)
            .await
            .map_err(Unhandled::retry)?;
        self.bus()
            .publish(response)
            .await
            .map_err(|e| Unhandled::retry(format!("publishing the response: {e}")))?;
        Ok(())
    }
}
