//! The prober against real servers the tests start: HTTP (axum), a TCP
//! listener, TLS (tokio-rustls with an rcgen CA and a leaf for
//! `localhost` expiring in 3 days), and, end to end, a secured NATS where
//! the brain's identity asks and the prober's answers.

use std::time::Duration;

use pretty_assertions::assert_eq;

use nisse_bus::auth::Identity;
use nisse_bus::proto::probe_request::Check;
use nisse_bus::proto::{Envelope, HttpProbe, ProbeRequest, ProbeResult, TcpProbe, TlsProbe};
use nisse_bus::{AnyMessage, Bus, ConsumerSpec, Role};
use nisse_scheduler::prober::{self, check};
use nisse_tests::web::{TestTls, TestWeb, closed_port, silent};
use nisse_tests::{InProcess, TestNats, ops};

fn request(id: &str, timeout_ms: u32, check: Option<Check>) -> ProbeRequest {
    ProbeRequest {
        envelope: Some(Envelope {
            agent: "ops".into(),
            work_item_id: "duty-web".into(),
            message_id: format!("probe-req:{id}"),
            ..Default::default()
        }),
        request_id: id.into(),
        duty: "web".into(),
        timeout_ms,
        check,
    }
}

fn http(url: &str) -> HttpProbe {
    HttpProbe {
        url: url.into(),
        ..Default::default()
    }
}

async fn probe_http(probe: HttpProbe) -> ProbeResult {
    check(&request("duty-web:1", 5_000, Some(Check::Http(probe)))).await
}

async fn probe_tcp(host: &str, port: u32) -> ProbeResult {
    let probe = TcpProbe {
        host: host.into(),
        port,
    };
    check(&request("duty-web:1", 5_000, Some(Check::Tcp(probe)))).await
}

async fn probe_tls(probe: TlsProbe) -> ProbeResult {
    check(&request("duty-web:1", 5_000, Some(Check::Tls(probe)))).await
}

/// A TLS probe of `tls`.
fn tls_probe(tls: &TestTls, host: &str, server_name: &str, min_days_left: u32) -> TlsProbe {
    TlsProbe {
        host: host.into(),
        port: tls.addr.port().into(),
        server_name: server_name.into(),
        min_days_left,
        ca_file: tls.ca_file.clone(),
    }
}

#[tokio::test]
async fn http_200_is_healthy_and_the_same_page_answering_500_is_not() {
    let web = TestWeb::start().await.unwrap();
    let url = web.url("/health");

    let ok = probe_http(http(&url)).await;
    assert!(ok.healthy, "{ok:?}");
    assert_eq!(ok.status_code, Some(200));
    assert!(
        ok.summary.starts_with(&format!("HTTP 200 from {url} in ")),
        "{}",
        ok.summary
    );

    web.set_status(500);
    let down = probe_http(HttpProbe {
        expect_status: vec![200],
        ..http(&url)
    })
    .await;
    assert!(!down.healthy);
    assert_eq!(down.status_code, Some(500));
    assert_eq!(down.summary, format!("HTTP 500 from {url}, expected 200"));
    // With no status listed, any 2xx is wanted.
    let down = probe_http(http(&url)).await;
    assert_eq!(down.summary, format!("HTTP 500 from {url}, expected 2xx"));

    // A status the duty expects is healthy, whatever it is.
    let expected = probe_http(HttpProbe {
        expect_status: vec![500, 503],
        ..http(&url)
    })
    .await;
    assert!(expected.healthy, "{expected:?}");
}

#[tokio::test]
async fn a_body_without_the_text_is_unhealthy() {
    let web = TestWeb::start().await.unwrap();
    let url = web.url("/health");
    let wrong = probe_http(HttpProbe {
        body_contains: "status: ready".into(),
        ..http(&url)
    })
    .await;
    assert!(!wrong.healthy);
    assert_eq!(wrong.status_code, Some(200));
    assert_eq!(
        wrong.summary,
        format!("HTTP 200 from {url}, but the body does not contain \"status: ready\"")
    );
    let right = probe_http(HttpProbe {
        body_contains: "status: ok".into(),
        ..http(&url)
    })
    .await;
    assert!(right.healthy, "{right:?}");
}

#[tokio::test]
async fn an_answer_slower_than_the_bound_is_unhealthy() {
    let web = TestWeb::start().await.unwrap();
    let url = web.url("/slow");
    let slow = probe_http(HttpProbe {
        max_latency_ms: 100,
        ..http(&url)
    })
    .await;
    assert!(!slow.healthy);
    assert_eq!(slow.status_code, Some(200));
    assert!(slow.latency_ms >= 300, "{slow:?}");
    assert_eq!(
        slow.summary,
        format!(
            "HTTP 200 from {url} in {} ms, over the 100 ms bound",
            slow.latency_ms
        )
    );
    let bounded = probe_http(HttpProbe {
        max_latency_ms: 2_000,
        ..http(&url)
    })
    .await;
    assert!(bounded.healthy, "{bounded:?}");
}

#[tokio::test]
async fn a_redirect_is_the_answer_unless_the_probe_follows_it() {
    let web = TestWeb::start().await.unwrap();
    let url = web.url("/moved");

    let not_followed = probe_http(http(&url)).await;
    assert!(!not_followed.healthy);
    assert_eq!(not_followed.status_code, Some(307));
    assert_eq!(
        not_followed.summary,
        format!("HTTP 307 from {url} (redirect to /health, not followed), expected 2xx")
    );
    let expected = probe_http(HttpProbe {
        expect_status: vec![301, 302, 307],
        ..http(&url)
    })
    .await;
    assert!(expected.healthy, "{expected:?}");

    let followed = probe_http(HttpProbe {
        follow_redirects: true,
        body_contains: "status: ok".into(),
        ..http(&url)
    })
    .await;
    assert!(followed.healthy, "{followed:?}");
    assert_eq!(followed.status_code, Some(200));
    assert!(
        followed.summary.starts_with(&format!(
            "HTTP 200 from {} (redirected from {url}) in ",
            web.url("/health")
        )),
        "{}",
        followed.summary
    );
}

#[tokio::test]
async fn http_to_a_closed_port_says_the_connection_was_refused() {
    let port = closed_port().await.unwrap();
    let url = format!("http://127.0.0.1:{port}/health");
    let refused = probe_http(http(&url)).await;
    assert!(!refused.healthy);
    assert_eq!(refused.status_code, None);
    assert_eq!(
        refused.summary,
        format!("HTTP request to {url} failed: connection to 127.0.0.1:{port} refused")
    );
}

#[tokio::test]
async fn https_verifies_with_the_ca_file_and_refuses_an_unknown_issuer() {
    let tls = TestTls::start(3).await.unwrap();
    let url = format!("https://localhost:{}/", tls.addr.port());
    let ok = probe_http(HttpProbe {
        ca_file: tls.ca_file.clone(),
        body_contains: "status ok".into(),
        ..http(&url)
    })
    .await;
    assert!(ok.healthy, "{ok:?}");
    assert_eq!(ok.status_code, Some(200));

    // The certificate is for `localhost`, not for the address.
    let by_address = format!("https://127.0.0.1:{}/", tls.addr.port());
    let wrong = probe_http(HttpProbe {
        ca_file: tls.ca_file.clone(),
        ..http(&by_address)
    })
    .await;
    assert!(!wrong.healthy);
    assert_eq!(
        wrong.summary,
        format!(
            "HTTP request to {by_address} failed: the certificate of 127.0.0.1:{} is not valid for 127.0.0.1 (it is for localhost)",
            tls.addr.port()
        )
    );

    // The system's roots alone do not know the test's CA.
    let unknown = probe_http(http(&url)).await;
    assert!(!unknown.healthy);
    assert_eq!(
        unknown.summary,
        format!(
            "HTTP request to {url} failed: the certificate of localhost:{} has an unknown issuer (no trusted CA signed it)",
            tls.addr.port()
        )
    );
}

#[tokio::test]
async fn tcp_to_a_listening_port_is_healthy_and_to_a_closed_one_is_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let open = probe_tcp("127.0.0.1", port.into()).await;
    assert!(open.healthy, "{open:?}");
    assert!(
        open.summary
            .starts_with(&format!("connection to 127.0.0.1:{port} accepted in ")),
        "{}",
        open.summary
    );
    drop(listener);

    let closed = closed_port().await.unwrap();
    let refused = probe_tcp("127.0.0.1", closed.into()).await;
    assert!(!refused.healthy);
    assert_eq!(
        refused.summary,
        format!("connection to 127.0.0.1:{closed} refused")
    );
    assert_eq!(refused.status_code, None);
    assert_eq!(refused.days_left, None);
}

#[tokio::test]
async fn a_certificate_with_fewer_days_left_than_wanted_is_unhealthy_and_says_so() {
    let tls = TestTls::start(3).await.unwrap();
    // No server name: the host's.
    let short = probe_tls(tls_probe(&tls, "localhost", "", 14)).await;
    assert!(!short.healthy);
    let days = short.days_left.unwrap();
    assert_eq!(days, 3, "{short:?}");
    assert_eq!(
        short.summary,
        format!("certificate for localhost expires in {days} days (at least 14 wanted)")
    );

    let enough = probe_tls(tls_probe(&tls, "localhost", "", 1)).await;
    assert!(enough.healthy, "{enough:?}");
    assert_eq!(enough.days_left, Some(days));
    assert_eq!(
        enough.summary,
        format!("certificate for localhost verified, expires in {days} days")
    );
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused_naming_both_and_its_days_still_read() {
    let tls = TestTls::start(3).await.unwrap();
    let wrong = probe_tls(tls_probe(&tls, "127.0.0.1", "nas01.lan", 1)).await;
    assert!(!wrong.healthy);
    let days = wrong.days_left.unwrap();
    assert_eq!(days, 3, "{wrong:?}");
    assert_eq!(
        wrong.summary,
        format!(
            "certificate from 127.0.0.1:{} is not valid for nas01.lan (it is for localhost); it expires in {days} days",
            tls.addr.port()
        )
    );
}

#[tokio::test]
async fn a_certificate_no_trusted_ca_signed_is_refused() {
    let tls = TestTls::start(3).await.unwrap();
    let unknown = probe_tls(TlsProbe {
        ca_file: String::new(),
        ..tls_probe(&tls, "127.0.0.1", "localhost", 1)
    })
    .await;
    assert!(!unknown.healthy);
    let days = unknown.days_left.unwrap();
    assert_eq!(
        unknown.summary,
        format!(
            "certificate for localhost from 127.0.0.1:{} has an unknown issuer (no trusted CA signed it); it expires in {days} days",
            tls.addr.port()
        )
    );
}

#[tokio::test]
async fn a_check_that_outlasts_its_timeout_is_unhealthy_saying_so() {
    let addr = silent().await.unwrap();
    let url = format!("http://{addr}/health");
    let started = std::time::Instant::now();
    let http = check(&request("duty-web:1", 300, Some(Check::Http(http(&url))))).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!http.healthy);
    assert_eq!(
        http.summary,
        format!("HTTP request to {url} timed out after 300 ms")
    );
    assert_eq!(http.latency_ms, 300);

    let tls = check(&request(
        "duty-web:1",
        300,
        Some(Check::Tls(TlsProbe {
            host: "127.0.0.1".into(),
            port: addr.port().into(),
            ..Default::default()
        })),
    ))
    .await;
    assert!(!tls.healthy);
    assert_eq!(
        tls.summary,
        format!("TLS handshake with {addr} timed out after 300 ms")
    );
}

#[tokio::test]
async fn a_request_that_cannot_be_checked_is_answered_naming_what_is_wrong() {
    let answers = [
        (
            request("r1", 1_000, None),
            "the request names no check (http, tcp or tls)",
        ),
        (
            request("r2", 1_000, Some(Check::Http(http("localhost/health")))),
            "invalid HTTP check: URL \"localhost/health\" is not valid: relative URL without a base",
        ),
        (
            request("r3", 1_000, Some(Check::Http(http("ftp://nas01/")))),
            "invalid HTTP check: URL \"ftp://nas01/\" is not http or https",
        ),
        (
            request(
                "r4",
                1_000,
                Some(Check::Tcp(TcpProbe {
                    host: "nas01".into(),
                    port: 0,
                })),
            ),
            "invalid TCP check: port 0 (must be 1 to 65535)",
        ),
        (
            request(
                "r5",
                1_000,
                Some(Check::Tls(TlsProbe {
                    host: "nas01".into(),
                    port: 70_000,
                    ..Default::default()
                })),
            ),
            "invalid TLS check: port 70000 (must be 1 to 65535)",
        ),
        (
            request(
                "r6",
                1_000,
                Some(Check::Tls(TlsProbe {
                    host: "nas01".into(),
                    port: 443,
                    ca_file: "/nonexistent/ca.pem".into(),
                    ..Default::default()
                })),
            ),
            "cannot read the CA file /nonexistent/ca.pem: No such file or directory (os error 2)",
        ),
        (
            request(
                "r7",
                0,
                Some(Check::Tcp(TcpProbe {
                    host: "nas01".into(),
                    port: 22,
                })),
            ),
            "the request gives no timeout (timeout_ms is 0)",
        ),
    ];
    for (request, summary) in answers {
        let result = check(&request).await;
        assert_eq!(
            (result.healthy, result.summary.as_str()),
            (false, summary),
            "{}",
            request.request_id
        );
        // The brain matches the answer by its request id and duty.
        assert_eq!(result.request_id, request.request_id);
        assert_eq!(result.duty, "web");
        let envelope = result.envelope.unwrap();
        assert_eq!(envelope.message_id, format!("probe:{}", request.request_id));
        assert_eq!(
            envelope.causation_id,
            format!("probe-req:{}", request.request_id)
        );
        assert_eq!(envelope.agent, "ops");
        assert_eq!(envelope.work_item_id, "duty-web");
    }
}

async fn results(admin: &Bus) -> Vec<ProbeResult> {
    let mut reader = admin.read_range(&ops(), 1, None).await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = reader.next().await {
        if let AnyMessage::ProbeResult(r) = m.unwrap().decode().unwrap() {
            out.push(r);
        }
    }
    out
}

#[tokio::test]
async fn the_brains_requests_are_answered_on_the_stream_by_the_prober_identity() {
    let nats = TestNats::secured(&["ops"]).await.unwrap();
    let data = nats.data_dir().unwrap();
    let admin = nats.bus(&["ops"]).await.unwrap();
    admin.ensure_topology().await.unwrap();
    let brain = nats
        .bus_as(&Identity::service(Role::Brain, &ops()), &["ops"])
        .await
        .unwrap();
    let prober_bus = nats
        .bus_as(&Identity::service(Role::Prober, &ops()), &["ops"])
        .await
        .unwrap();
    let service = InProcess::service(&prober_bus, prober::Config::default(), &data, prober::run)
        .await
        .unwrap();

    let web = TestWeb::start().await.unwrap();
    web.set_status(503);
    let url = web.url("/health");
    let down = request("duty-web:1", 5_000, Some(Check::Http(http(&url))));
    let empty = request("duty-web:2", 5_000, None);
    brain.publish(down.clone()).await.unwrap();
    brain.publish(empty.clone()).await.unwrap();
    // The same request again under another message id, as a brain that
    // asks again after a restart does: checked again, answered once.
    let mut again = down.clone();
    again.envelope.as_mut().unwrap().message_id = "probe-req:duty-web:1:again".into();
    brain.publish(again).await.unwrap();

    // Every request settled: nothing pending on the prober's consumer, so
    // a second answer to the repeated request would be on the stream.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut stream = admin.jetstream().get_stream(ops().stream()).await.unwrap();
        let _ = stream.info().await.unwrap();
        let info = stream
            .consumer_info(ConsumerSpec::PROBER.name)
            .await
            .unwrap();
        if info.num_pending == 0
            && info.num_ack_pending == 0
            && info.ack_floor.consumer_sequence >= 3
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "requests still pending: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut found = results(&admin).await;
    found.sort_by(|a, b| a.request_id.cmp(&b.request_id));
    assert_eq!(found.len(), 2, "{found:?}");

    let answer = &found[0];
    assert_eq!(answer.request_id, "duty-web:1");
    assert_eq!(answer.duty, "web");
    assert!(!answer.healthy);
    assert_eq!(answer.status_code, Some(503));
    assert_eq!(answer.summary, format!("HTTP 503 from {url}, expected 2xx"));
    let envelope = answer.envelope.as_ref().unwrap();
    assert_eq!(envelope.message_id, "probe:duty-web:1");
    // Either copy of the request may be answered first (they are checked
    // at once); the dedup id keeps one answer.
    assert!(
        envelope.causation_id.starts_with("probe-req:duty-web:1"),
        "{envelope:?}"
    );
    assert_eq!(envelope.actor.as_ref().unwrap().id, "prober");
    assert_eq!(envelope.work_item_id, "duty-web");

    // A request with nothing to check is answered too: the brain's
    // deadline must not be what tells it.
    assert_eq!(found[1].request_id, "duty-web:2");
    assert!(!found[1].healthy);
    assert_eq!(
        found[1].summary,
        "the request names no check (http, tcp or tls)"
    );

    service.stop(Duration::from_secs(5)).await.unwrap();
}
