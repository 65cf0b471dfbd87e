//! Commands run under bash, never under the host user's login shell: the
//! classifier read them as bash. The hosts here are the test's sshd with
//! the login user given another shell (zsh, as on TrueNAS SCALE or macOS)
//! or no bash at all, in the server's own mount namespace.

use std::time::Duration;

use nisse_bus::proto::{ExecFailure, ExecStatus};
use nisse_tests::ops;
use nisse_tests::sshd::{SshdOptions, TestSshd};

use super::{Rig, file_request, status, stdout};

fn stderr(r: &nisse_bus::proto::ExecResult) -> String {
    String::from_utf8_lossy(&r.stderr).into_owned()
}

#[tokio::test]
async fn on_a_zsh_host_the_command_is_read_by_bash_alone() {
    let rig = Rig::on(
        SshdOptions::new().login_shell("/usr/bin/zsh", "zsh"),
        |_| {},
    )
    .await;
    rig.bind(&["tool"]).await;
    let dir = rig.sshd.dir().join("probes");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nisse-zsh-probe1"), "").unwrap();
    let marker = dir.join("marker");
    // One word to the classifier, a syntax error to bash, and to zsh a
    // glob whose qualifier runs `touch` for each file it matches.
    let qualifier = format!(
        "ls {}/nisse-zsh-probe*(e:'touch {}':)",
        dir.display(),
        marker.display()
    );
    let r = rig.run("qualifier", "tool", &qualifier).await;
    assert_eq!(status(&r).0, ExecStatus::Completed, "{}", r.reason);
    assert!(!marker.exists(), "zsh evaluated the glob qualifier");
    assert_eq!(r.exit_code, 2, "{}", stderr(&r));
    assert!(
        stderr(&r).contains("bash") && stderr(&r).contains("syntax error"),
        "{}",
        stderr(&r)
    );
    assert_eq!(stdout(&r), "");

    // An ordinary command: its output and exit code as ever.
    let r = rig
        .run("plain", "tool", "echo hello; echo oops >&2; exit 3")
        .await;
    assert_eq!(
        status(&r),
        (ExecStatus::Completed, ExecFailure::Unspecified),
        "{}",
        r.reason
    );
    assert_eq!((r.exit_code, stdout(&r).as_str()), (3, "hello\n"));
    assert_eq!(stderr(&r), "oops\n");
    // Bash's own syntax and variables.
    let r = rig
        .run(
            "bashisms",
            "tool",
            "[[ a == a ]] && x=abc && echo ${x/b/B} ${BASH_VERSION:+bash} $0",
        )
        .await;
    assert_eq!(stdout(&r), "aBc bash bash\n", "{}", stderr(&r));

    // The command reads its standard input, never its own text; binary
    // and larger than a channel packet.
    let input: Vec<u8> = (0..512 * 1024).map(|i| (i % 251) as u8).collect();
    let mut req = Rig::request("stdin", "tool", "sha256sum; echo done");
    req.stdin = input.clone();
    rig.send(req).await;
    let r = rig.result("stdin").await;
    let copy = rig.path("input");
    std::fs::write(&copy, &input).unwrap();
    let local = std::process::Command::new("sha256sum")
        .arg(&copy)
        .output()
        .unwrap();
    let hash = String::from_utf8_lossy(&local.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(stdout(&r), format!("{hash}  -\ndone\n"), "{}", stderr(&r));

    // A secret in the environment still reaches the command.
    let mut asked = Rig::request("secret", "tool", r#"echo "x${NISSE_TEST_SECRET}x""#);
    asked.secret_names = vec!["token".into()];
    rig.send(asked).await;
    assert_eq!(stdout(&rig.result("secret").await), "x[REDACTED]x\n");

    // 64 KiB of command, whole.
    let long = format!("x='{}'; echo ${{#x}}", "y".repeat(64 * 1024));
    let r = rig.run("long", "tool", &long).await;
    assert_eq!(stdout(&r), "65536\n", "{} {}", r.reason, stderr(&r));

    // The file tools run through the same bootstrap.
    let target = dir.join("motd");
    rig.send(file_request(
        "write",
        nisse_policy::FileOp::Write {
            path: target.display().to_string(),
            content: "it's $(new)\n".into(),
            mode: None,
        },
    ))
    .await;
    let r = rig.result("write").await;
    assert_eq!(r.exit_code, 0, "{} {}", r.reason, stderr(&r));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "it's $(new)\n");

    // One connection carried it all.
    assert_eq!(rig.sshd.connections(), 1, "{}", rig.sshd.log());

    // The control: handed to the login shell as it is (as before this
    // executor), the same line runs the qualifier's code.
    let out = rig.sshd.ssh_command(&qualifier).output().await.unwrap();
    assert!(
        marker.exists(),
        "the host's login shell is not zsh, so this test proves nothing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_host_without_bash_is_refused_with_its_reason_until_bash_is_back() {
    let mut rig = Rig::on(
        SshdOptions::new()
            .login_shell("/bin/sh", "dash")
            .without_bash(),
        |c| c.breaker_failures = 2,
    )
    .await;
    rig.bind(&["tool"]).await;
    let marker = rig.sshd.dir().join("ran");
    let touch = format!("touch {}", marker.display());
    // Lasting, not transient: refused each time the same way, and the
    // breaker (which counts unreachable hosts) never opens for it.
    for id in ["first", "second", "third"] {
        let r = rig.run(id, "tool", &touch).await;
        assert_eq!(
            status(&r),
            (ExecStatus::Failed, ExecFailure::NoBash),
            "{id}: {}",
            r.reason
        );
        for needed in [
            "tool did not start bash",
            "nothing was run",
            // The login shell's own answer.
            "bash: Permission denied",
            "Install bash on tool",
        ] {
            assert!(r.reason.contains(needed), "{id}: {needed}: {}", r.reason);
        }
        assert!(!marker.exists(), "{id}: the command ran");
    }
    // What `nisse streams` shows for the host.
    let circuits = nisse_executor::circuits(&rig.bus, &ops()).await.unwrap();
    assert_eq!(circuits.len(), 1, "{circuits:?}");
    assert_eq!(circuits[0].host, "tool");
    assert_eq!(circuits[0].state, nisse_executor::NO_BASH);
    assert!(
        circuits[0].last_error.contains("did not start bash"),
        "{:?}",
        circuits[0]
    );

    // Bash installed (here: `tool` is now a host with bash), and the
    // executor restarted meanwhile: the first command that runs finds
    // the record and clears it.
    rig.stop_executor().await;
    let fixed = TestSshd::start().await.unwrap();
    let agent_key = std::fs::read_to_string(rig.sshd.client_key().with_extension("pub")).unwrap();
    fixed.authorize_key(agent_key.trim()).unwrap();
    fixed
        .write_known_hosts(&rig.path("known_hosts"), "127.0.0.1")
        .unwrap();
    rig.config
        .agents
        .get_mut("ops")
        .unwrap()
        .hosts
        .get_mut("tool")
        .unwrap()
        .port = fixed.port();
    rig.start_executor().await;
    let marker = fixed.dir().join("ran");
    let r = rig
        .run("fixed", "tool", &format!("touch {}", marker.display()))
        .await;
    assert_eq!(
        status(&r),
        (ExecStatus::Completed, ExecFailure::Unspecified),
        "{}",
        r.reason
    );
    assert!(marker.exists());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let circuits = nisse_executor::circuits(&rig.bus, &ops()).await.unwrap();
        if circuits[0].state == "closed" {
            assert_eq!(circuits[0].last_error, "");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the host's record still says {:?}",
            circuits[0]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_command_bash_cannot_hold_is_refused_before_any_connection() {
    let rig = Rig::new(|_| {}).await;
    rig.bind(&["tool"]).await;
    let marker = rig.sshd.dir().join("ran");
    let r = rig
        .run(
            "nul",
            "tool",
            &format!("echo harmless\0; touch {}", marker.display()),
        )
        .await;
    assert_eq!(
        status(&r),
        (ExecStatus::Refused, ExecFailure::BadRequest),
        "{}",
        r.reason
    );
    assert!(r.reason.contains("NUL byte"), "{}", r.reason);
    assert_eq!(rig.sshd.connections(), 0, "{}", rig.sshd.log());
    assert!(!marker.exists());
}
