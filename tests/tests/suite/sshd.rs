//! The OpenSSH server harness itself: commands run, connections are
//! counted, a rotated host key fails pinned clients, and the server stops
//! and restarts on its port.

use std::process::{Output, Stdio};

use pretty_assertions::assert_eq;

use nisse_tests::sshd::TestSshd;

/// Runs `ssh` to completion without stdin.
async fn run(mut ssh: tokio::process::Command) -> Output {
    ssh.stdin(Stdio::null()).output().await.unwrap()
}

fn explain(output: &Output, sshd: &TestSshd) -> String {
    format!(
        "ssh exited {}; stderr:\n{}\nsshd log tail:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        sshd.log_tail()
    )
}

/// `ssh` running `echo hi` against `sshd`, checking the host key against
/// `known_hosts` under the name `127.0.0.1` (no alias).
fn ssh_with_known_hosts(sshd: &TestSshd, known_hosts: &std::path::Path) -> tokio::process::Command {
    let mut ssh = tokio::process::Command::new("ssh");
    ssh.args(["-F", "none", "-p"])
        .arg(sshd.port().to_string())
        .arg("-i")
        .arg(sshd.client_key())
        .args(["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o"])
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args(["-o", "StrictHostKeyChecking=yes"])
        .arg(format!("{}@{}", sshd.user(), sshd.addr()))
        .arg("echo hi");
    ssh
}

#[tokio::test]
async fn sshd_runs_commands_and_counts_connections() {
    let sshd = TestSshd::start().await.unwrap();
    assert_ne!(sshd.port(), 22);
    assert_eq!(sshd.addr().to_string(), "127.0.0.1");
    assert!(sshd.client_key().is_file());
    assert!(sshd.host_public_key().starts_with("ssh-ed25519 AAAA"));
    assert_eq!(sshd.host_public_key().split(' ').count(), 2);
    assert_eq!(sshd.connections(), 0, "{}", sshd.log());

    let output = run(sshd.ssh_command("echo hi")).await;
    assert!(output.status.success(), "{}", explain(&output, &sshd));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hi\n");
    assert_eq!(sshd.connections(), 1, "{}", sshd.log());

    let output = run(sshd.ssh_command("echo $USER; exit 3")).await;
    assert_eq!(output.status.code(), Some(3), "{}", explain(&output, &sshd));
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), sshd.user());
    assert_eq!(sshd.connections(), 2, "{}", sshd.log());
}

#[tokio::test]
async fn sshd_rotated_host_key_fails_pinned_clients() {
    let mut sshd = TestSshd::start().await.unwrap();
    let port = sshd.port();
    let old_key = sshd.host_public_key().to_string();
    let known_hosts = sshd.dir().join("pinned/known_hosts");
    sshd.write_known_hosts(&known_hosts, "127.0.0.1").unwrap();
    assert_eq!(
        std::fs::read_to_string(&known_hosts).unwrap(),
        format!("[127.0.0.1]:{port} {old_key}\n")
    );
    let output = run(ssh_with_known_hosts(&sshd, &known_hosts)).await;
    assert!(output.status.success(), "{}", explain(&output, &sshd));

    sshd.rotate_host_key().await.unwrap();
    assert_eq!(sshd.port(), port);
    assert_ne!(sshd.host_public_key(), old_key);
    assert!(sshd.host_public_key().starts_with("ssh-ed25519 AAAA"));

    for ssh in [
        sshd.ssh_command("echo hi"),
        ssh_with_known_hosts(&sshd, &known_hosts),
    ] {
        let output = run(ssh).await;
        assert_eq!(
            output.status.code(),
            Some(255),
            "{}",
            explain(&output, &sshd)
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("Host key verification failed"),
            "{}",
            explain(&output, &sshd)
        );
        assert!(output.stdout.is_empty());
    }

    // Pinning the new key lets clients in again.
    std::fs::remove_file(&known_hosts).unwrap();
    sshd.write_known_hosts(&known_hosts, "127.0.0.1").unwrap();
    let output = run(ssh_with_known_hosts(&sshd, &known_hosts)).await;
    assert!(output.status.success(), "{}", explain(&output, &sshd));
}

#[tokio::test]
async fn sshd_stops_and_restarts_on_its_port() {
    let mut sshd = TestSshd::start().await.unwrap();
    let port = sshd.port();
    let key = sshd.host_public_key().to_string();
    let output = run(sshd.ssh_command("echo hi")).await;
    assert!(output.status.success(), "{}", explain(&output, &sshd));

    sshd.stop().await.unwrap();
    assert_eq!(sshd.pid(), None);
    tokio::net::TcpStream::connect(sshd.socket_addr())
        .await
        .unwrap_err();
    let output = run(sshd.ssh_command("echo hi")).await;
    assert_eq!(
        output.status.code(),
        Some(255),
        "{}",
        explain(&output, &sshd)
    );
    // Stopping twice is harmless.
    sshd.stop().await.unwrap();

    sshd.restart().await.unwrap();
    assert_eq!(sshd.port(), port);
    assert_eq!(sshd.host_public_key(), key);
    let output = run(sshd.ssh_command("echo hi")).await;
    assert!(output.status.success(), "{}", explain(&output, &sshd));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hi\n");
    assert_eq!(sshd.connections(), 2, "{}", sshd.log());

    // Restarting a running server works too.
    sshd.restart().await.unwrap();
    let output = run(sshd.ssh_command("echo hi")).await;
    assert!(output.status.success(), "{}", explain(&output, &sshd));
    assert_eq!(sshd.connections(), 3, "{}", sshd.log());
}
