//! Beyond one machine: the services on a 3-node NATS cluster, each in its
//! own process, the topology made by `nisse bus init` with a replica on
//! every server, and a burst of alerts that outlives one server killed
//! and started again.

use std::time::{Duration, Instant};

use nisse_tests::TestNats;

use super::alerts::{Install, TOKEN, burst_body, each_alert_once, stop, wait_quiet};
use super::{nisse, run, text};

/// On a 3-node cluster `nisse bus init` gives every stream and bucket
/// three replicas; 2,000 alerts posted in bursts of ten while the server
/// leading the agent's stream is killed and started again are each
/// applied once, no item twice, and the stream keeps its three replicas.
/// Posts the intake could not store meanwhile are sent again, as
/// Alertmanager does; the brain's process rides the failover out (it
/// starts its reactor again if the bus stopped it).
#[tokio::test]
async fn on_a_three_node_cluster_every_alert_is_applied_once_though_a_server_dies_mid_burst() {
    let mut nats = TestNats::secured_cluster(&["ops"], 3).await.unwrap();
    let install = Install::new(&nats);
    let out = run(nisse(install.path()).args(["bus", "init", "--json"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["servers"].as_u64(), report["replicas"].as_u64()),
        (Some(3), Some(3)),
        "{report:#}"
    );

    let bus = nats.bus(&["ops"]).await.unwrap();
    for stream in ["AGENT_OPS", "KV_nisse_leases", "KV_nisse_exec"] {
        let mut s = bus.jetstream().get_stream(stream).await.unwrap();
        let info = s.info().await.unwrap();
        assert_eq!(info.config.num_replicas, 3, "{stream}");
    }

    let mut intake = install.serve(&["intake-alerts"]);
    install.wait_intake(&mut intake).await;
    let mut brain = install.serve(&["brain"]);

    const ALERTS: usize = 2_000;
    const PER_POST: usize = 10;
    let client = reqwest::Client::new();
    let mut refused = 0;
    let mut killed = None;
    for post in 0..ALERTS / PER_POST {
        if post == 60 {
            // The stream's leader: the server every publish goes through.
            let mut stream = bus.jetstream().get_stream("AGENT_OPS").await.unwrap();
            let info = stream.info().await.unwrap();
            let leader = info.cluster.as_ref().and_then(|c| c.leader.clone());
            let node: usize = leader
                .as_deref()
                .and_then(|l| l.strip_prefix("nisse-"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no leader named: {:?}", info.cluster));
            nats.kill_node(node).await.unwrap();
            killed = Some(node);
        }
        if post == 120 {
            nats.restart_node(killed.unwrap()).await.unwrap();
        }
        // As Alertmanager does: a post that is not stored is sent again.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = client
                .post(install.webhook())
                .bearer_auth(TOKEN)
                .json(&burst_body(post * PER_POST, PER_POST))
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => break,
                other => {
                    refused += 1;
                    assert!(
                        Instant::now() < deadline,
                        "post {post} never stored: {other:?}\n{}",
                        install.log(&["intake-alerts"])
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    eprintln!("{refused} posts were answered with an error and sent again");
    let s = wait_quiet(&install, &nats).await;
    // The brain rode out the failover: the one process applied it all.
    assert!(
        brain.try_wait().unwrap().is_none(),
        "{}",
        install.log(&["brain"])
    );
    for line in install
        .log(&["brain"])
        .lines()
        .filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\""))
    {
        eprintln!("brain: {line}");
    }
    each_alert_once(&nats, &s, ALERTS).await;
    let mut stream = bus.jetstream().get_stream("AGENT_OPS").await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.config.num_replicas, 3);
    let cluster = info.cluster.clone().expect("a clustered stream");
    assert_eq!(cluster.replicas.len(), 2, "{cluster:?}");
    stop(&mut brain).await;
    stop(&mut intake).await;
}
