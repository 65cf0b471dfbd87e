//! The real path: Alertmanager → webhook → intake-alerts → NATS, with
//! Alertmanager's own fingerprints, group keys and retries.

use std::time::Duration;

use nisse_tests::alertmanager::{TestAlertmanager, Webhook, WebhookAuth, firing, resolved};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Intake, config, eventually, nats, stored, stored_count};

/// How long a notification may take to arrive: group wait, a retry or two.
const ARRIVAL: Duration = Duration::from_secs(20);

fn timestamp(rfc3339: &str) -> prost_types::Timestamp {
    let t = OffsetDateTime::parse(rfc3339, &Rfc3339).unwrap();
    prost_types::Timestamp {
        seconds: t.unix_timestamp(),
        nanos: i32::try_from(t.nanosecond()).unwrap(),
    }
}

/// The default set-up, as `nisse up` prints it: the receiver's generated
/// token, which Alertmanager reads through `credentials_file`.
#[tokio::test]
async fn alertmanager_notifications_arrive_with_its_fingerprints_and_group_key() {
    let (_nats, bus) = nats().await;
    let intake = Intake::start(&config(), &bus).await;
    let mut webhook = Webhook::new(&intake.url);
    webhook.auth = WebhookAuth::BearerFile(intake.token_file.clone().unwrap());
    let am = TestAlertmanager::start(webhook).await.unwrap();

    let nas = [("alertname", "DiskFull"), ("instance", "nas:9100")];
    let pi = [("alertname", "DiskFull"), ("instance", "pi:9100")];
    let nas_firing = firing(&nas);
    am.post_alerts(&[nas_firing.clone(), firing(&pi)])
        .await
        .unwrap();

    let messages = eventually("both alerts in the stream", ARRIVAL, || async {
        let m = stored(&bus).await;
        (m.len() >= 2).then_some(m)
    })
    .await;
    assert_eq!(messages.len(), 2, "{}", am.log_tail());

    // Alertmanager's own view of the alerts, with the fingerprints it
    // computed.
    let held = am.alerts().await.unwrap();
    let fingerprint_of = |instance: &str| -> String {
        held.iter()
            .find(|a| a["labels"]["instance"] == instance)
            .unwrap_or_else(|| panic!("Alertmanager does not hold {instance}: {held:?}"))
            ["fingerprint"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (stored, m) in &messages {
        assert_eq!(stored.subject, "nisse.ops.in.alert");
        let alert = m.alert.as_ref().unwrap();
        let instance = &alert.labels["instance"];
        assert_eq!(alert.fingerprint, fingerprint_of(instance));
        assert_eq!(alert.status, "firing");
        assert_eq!(alert.ends_at, None);
        assert_eq!(alert.annotations["summary"], "test alert");
        assert_eq!(alert.generator_url, "http://prometheus.invalid/graph");
        assert_eq!(m.group_key, "{}:{alertname=\"DiskFull\"}");
        assert_eq!(m.group_labels["alertname"], "DiskFull");
        assert_eq!(m.receiver, "nisse");
        assert_eq!(m.payload_version, "4");
        assert_eq!(m.external_url, am.url());
        let env = m.envelope.as_ref().unwrap();
        assert_eq!(env.actor.as_ref().unwrap().id, "alertmanager:nisse");
        assert!(
            env.message_id
                .starts_with(&format!("alert:{}:firing:", alert.fingerprint)),
            "{}",
            env.message_id
        );
    }
    let nas_stored = messages
        .iter()
        .map(|(_, m)| m.alert.as_ref().unwrap())
        .find(|a| a.labels["instance"] == "nas:9100")
        .unwrap();
    let starts_at = nas_firing["startsAt"].as_str().unwrap();
    assert_eq!(nas_stored.starts_at, Some(timestamp(starts_at)));

    // Resolving one: Alertmanager sends the group again, with the resolved
    // alert and the still-firing one (a duplicate, not stored again).
    am.post_alerts(&[resolved(&nas, starts_at)]).await.unwrap();
    let messages = eventually("the resolved alert in the stream", ARRIVAL, || async {
        let m = stored(&bus).await;
        (m.len() >= 3).then_some(m)
    })
    .await;
    let (_, last) = messages.last().unwrap();
    let alert = last.alert.as_ref().unwrap();
    assert_eq!(alert.status, "resolved");
    assert_eq!(alert.fingerprint, fingerprint_of("nas:9100"));
    assert_eq!(alert.starts_at, Some(timestamp(starts_at)));
    assert!(alert.ends_at.is_some());
    assert!(
        last.envelope
            .as_ref()
            .unwrap()
            .message_id
            .starts_with(&format!("alert:{}:resolved:", alert.fingerprint)),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stored_count(&bus).await, 3, "{}", am.log_tail());

    am.stop().await.unwrap();
    intake.stop().await;
}

#[tokio::test]
async fn alertmanager_without_the_token_is_refused_and_nothing_is_stored() {
    let (_nats, bus) = nats().await;
    let intake = Intake::start(&config(), &bus).await;
    let am = TestAlertmanager::start(Webhook::new(&intake.url))
        .await
        .unwrap();
    am.post_alerts(&[firing(&[("alertname", "Forged"), ("instance", "nas")])])
        .await
        .unwrap();
    am.wait_for_log("unexpected status code 401", ARRIVAL)
        .await
        .unwrap();
    assert_eq!(stored_count(&bus).await, 0, "{}", am.log_tail());
    am.stop().await.unwrap();
    intake.stop().await;
}

#[tokio::test]
async fn alertmanager_retries_until_nats_is_back_and_the_alert_is_stored_once() {
    let (mut nats, bus) = nats().await;
    let mut cfg = config();
    // A token written in both configurations, this time.
    cfg.auth.bearer_token = Some("am-token".into());
    // Fail fast while NATS is down, so Alertmanager's retries come quickly.
    cfg.publish_timeout = Duration::from_millis(500);
    let intake = Intake::start(&cfg, &bus).await;
    let mut webhook = Webhook::new(&intake.url);
    webhook.auth = WebhookAuth::Bearer("am-token".into());
    let am = TestAlertmanager::start(webhook).await.unwrap();
    let readyz = format!("{}/readyz", intake.base);

    nats.kill().await.unwrap();
    eventually("/readyz to answer 503", Duration::from_secs(10), || async {
        (reqwest::get(&readyz).await.unwrap().status() == 503).then_some(())
    })
    .await;

    am.post_alerts(&[firing(&[("alertname", "NasDown"), ("instance", "nas")])])
        .await
        .unwrap();
    am.wait_for_log("unexpected status code 503", Duration::from_secs(15))
        .await
        .unwrap();

    nats.restart().await.unwrap();
    let messages = eventually(
        "the alert in the stream",
        Duration::from_secs(40),
        || async {
            let m = stored(&bus).await;
            (!m.is_empty()).then_some(m)
        },
    )
    .await;
    assert_eq!(
        messages[0].1.alert.as_ref().unwrap().labels["alertname"],
        "NasDown"
    );
    // Alertmanager stops retrying once answered 200; give any late copy
    // (a publish of a failed attempt reaching the server after it came
    // back) time to show up: there must be none.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stored_count(&bus).await, 1, "{}", am.log_tail());

    am.stop().await.unwrap();
    intake.stop().await;
}
