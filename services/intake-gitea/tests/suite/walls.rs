//! The service as `nisse up` runs it: on a server with the generated
//! authorization, as its own identity, with only its permissions.

use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_bus::Role;
use nisse_bus::auth::Identity;
use nisse_proto::v1::gitea_request::Call;
use nisse_proto::v1::{GiteaCallStatus, GiteaCommentCall};
use nisse_tests::TestNats;

use super::{
    ACCOUNT, OPERATOR, REPO, SECRET, Secrets, Service, answer, config, events, eventually, forge,
    id_of, request,
};

#[tokio::test]
async fn as_its_own_identity_it_takes_deliveries_polls_and_answers_calls() {
    let nats = TestNats::secured(&["dev"]).await.unwrap();
    let admin = nats.bus(&["dev"]).await.unwrap();
    admin.ensure_topology().await.unwrap();
    let dev = nisse_tests::agent("dev");
    let own = nats
        .bus_as(&Identity::service(Role::IntakeGitea, &dev), &["dev"])
        .await
        .unwrap();
    let brain = nats
        .bus_as(&Identity::service(Role::Brain, &dev), &["dev"])
        .await
        .unwrap();

    let forge = forge().await;
    let secrets = Secrets::new(&forge.token);
    let service = Service::start(
        &own,
        config(forge.gitea.url(), &secrets, Duration::from_secs(1)),
    )
    .await;
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
    // The poll's cursor is its own to write.
    eventually("the poll's cursor", Duration::from_secs(20), || async {
        let key = nisse_intake_gitea::records::cursor_key(&dev, REPO);
        let found: Option<(nisse_intake_gitea::records::Cursor, u64)> = admin
            .kv_read(nisse_bus::topology::GITEA_BUCKET, &key)
            .await
            .unwrap();
        found.map(|_| ())
    })
    .await;
    let stored = events(&admin).await;
    assert!(
        stored
            .iter()
            .any(|(_, e)| e.action == "assigned" && id_of(e).starts_with("gitea:timeline:")),
        "{stored:?}"
    );

    let n = u64::try_from(number).unwrap();
    request(
        &brain,
        "walls-ack",
        0,
        REPO,
        Call::Comment(GiteaCommentCall {
            issue_number: n,
            body: "On it.".into(),
        }),
    )
    .await;
    let done = answer(&admin, "walls-ack").await;
    assert_eq!(done.status, GiteaCallStatus::Done as i32, "{}", done.reason);
    service.stop().await;
}
