//! Every command runs under `bash --noprofile --norc`, never under the
//! host user's login shell.
//!
//! The policy classifier parses a command line as bash. An SSH exec
//! request, though, is interpreted by the remote user's login shell, which
//! on TrueNAS SCALE or macOS is zsh: there `ls /var/log/*(e:'curl x|sh':)`
//! runs `curl x|sh` from a glob qualifier, while to bash it is a syntax
//! error. So the login shell is only ever handed [`BOOTSTRAP`], one fixed
//! line that means the same to sh, dash, bash, zsh, ksh, fish, csh and
//! tcsh: `exec bash … -c '<fixed script>'`. The script holds no single
//! quote, backslash, newline or `!`, the only characters any of those
//! shells treats specially inside single quotes.
//!
//! The command itself never passes through any shell quoting of ours: it
//! goes on the channel's standard input, ended by a NUL byte (which no
//! bash string can hold, so it cannot end a command early), ahead of the
//! request's own standard input. The bootstrap's bash prints [`MARKER`]
//! on standard output, reads the command up to the NUL with `read -r -d ""`
//! (byte by byte on a pipe, so not one byte past it) and `eval`s it: bash
//! parses exactly the bytes that were classified, as `bash -c` would, and
//! the command's standard input is what follows the NUL (the secrets
//! handed over stdin, the request's stdin, then end of file), never its
//! own text. Evaluating it in the bootstrap's bash rather than `exec`ing
//! a second one saves a process start on every command (a bash start,
//! around a millisecond against an executor median of about five); the
//! only trace is the variable that holds the text, named so that no
//! command uses it. Like any non-interactive bash it reads `BASH_ENV` if
//! the host's login environment sets one: the host's own configuration,
//! trusted as its programs are.
//!
//! The marker is how a missing bash is told from a command that failed:
//! a login shell that cannot start bash exits without it, having read
//! none of standard input, so nothing of the command ran. [`Watch`] takes
//! the marker out of the output (what the login shell printed before it,
//! from its own start-up files, passes on as before) and keeps what the
//! login shell said on standard error meanwhile, for the refusal's reason.

/// The only text the login shell is given, the same for every command.
pub const BOOTSTRAP: &str = "exec bash --noprofile --norc -c 'printf %s NISSE_BASH_5e0f7d1c; IFS= read -r -d \"\" nisse_command_5e0f7d1c || { echo nisse: the command did not arrive whole, so it was not run >&2; exit 125; }; eval \"$nisse_command_5e0f7d1c\"'";

/// What the bootstrap's bash prints before it reads the command: proof
/// that bash, not the login shell, has the command. It is in
/// [`BOOTSTRAP`] verbatim (a test holds that).
pub const MARKER: &[u8] = b"NISSE_BASH_5e0f7d1c";

/// Most of what the login shell said on standard error that a refusal
/// quotes; the whole of it is in the result's stderr.
const ANSWER_MAX: usize = 1024;

/// Why a command cannot be handed to bash at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsendable {
    /// A NUL byte would end the command early: bash strings cannot hold
    /// one, so such a command was never one bash could run as classified.
    #[error(
        "the command holds a NUL byte (at byte {0}), which no bash command can hold; nothing was run"
    )]
    Nul(usize),
}

/// Whether `command` can be handed to bash whole.
pub fn check(command: &str) -> Result<(), Unsendable> {
    match command.bytes().position(|b| b == 0) {
        Some(at) => Err(Unsendable::Nul(at)),
        None => Ok(()),
    }
}

/// What goes on the channel's standard input: the command, a NUL, then
/// the command's own standard input.
pub fn input(command: &str, stdin: &[u8]) -> Result<Vec<u8>, Unsendable> {
    check(command)?;
    let mut bytes = Vec::with_capacity(command.len() + 1 + stdin.len());
    bytes.extend_from_slice(command.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(stdin);
    Ok(bytes)
}

/// Watches a command's output for [`MARKER`]: standard output passes on
/// without it, and what came on standard error before it is kept as the
/// login shell's answer.
#[derive(Debug, Default)]
pub struct Watch {
    /// Standard output held back while it could be the start of the
    /// marker (at most its length less one byte, after a first look).
    held: Vec<u8>,
    seen: bool,
    answer: Vec<u8>,
}

impl Watch {
    /// A watch that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether bash started: the marker came.
    pub fn seen(&self) -> bool {
        self.seen
    }

    /// A chunk of standard output; returns what passes on.
    pub fn stdout(&mut self, data: &[u8]) -> Vec<u8> {
        if self.seen {
            return data.to_vec();
        }
        self.held.extend_from_slice(data);
        if let Some(at) = find(&self.held, MARKER) {
            self.seen = true;
            let mut out = self.held[..at].to_vec();
            out.extend_from_slice(&self.held[at + MARKER.len()..]);
            self.held = Vec::new();
            return out;
        }
        // Only a tail that could still grow into the marker is held.
        let keep = partial_suffix(&self.held, MARKER);
        self.held.drain(..self.held.len() - keep).collect()
    }

    /// A chunk of standard error (it passes on whole; before the marker
    /// it is the login shell's, and its start is kept).
    pub fn stderr(&mut self, data: &[u8]) {
        if !self.seen && self.answer.len() < ANSWER_MAX {
            let room = ANSWER_MAX - self.answer.len();
            self.answer.extend_from_slice(&data[..data.len().min(room)]);
        }
    }

    /// The output ended: what was held back (when the marker never
    /// came, the login shell's own output).
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }

    /// What the login shell said on standard error before bash started
    /// (or did not), trimmed.
    pub fn answer(&self) -> String {
        String::from_utf8_lossy(&self.answer).trim().to_string()
    }
}

/// Where `needle` first starts in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest end of `data` that is a beginning of
/// `needle` (and shorter than it).
fn partial_suffix(data: &[u8], needle: &[u8]) -> usize {
    (1..needle.len().min(data.len() + 1))
        .rev()
        .find(|&n| data.ends_with(&needle[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn the_bootstrap_is_one_line_every_shell_reads_alike() {
        let script = BOOTSTRAP
            .strip_prefix("exec bash --noprofile --norc -c '")
            .and_then(|s| s.strip_suffix('\''))
            .expect("exec bash … -c '<script>'");
        for c in ['\'', '\\', '\n', '\r', '!', '\0'] {
            assert!(!script.contains(c), "{c:?} in the script: {script}");
        }
        assert!(BOOTSTRAP.is_ascii());
        let marker = std::str::from_utf8(MARKER).unwrap();
        assert!(script.contains(&format!("printf %s {marker};")), "{script}");
    }

    #[test]
    fn the_command_goes_first_ended_by_a_nul_and_never_holds_one() {
        assert_eq!(input("cat", b"in").unwrap(), b"cat\0in");
        assert_eq!(input("true", b"").unwrap(), b"true\0");
        assert_eq!(input("echo a\0; rm -rf /", b""), Err(Unsendable::Nul(6)));
    }

    /// The marker is found wherever the chunks cut it, output around it
    /// passes on unchanged, and nothing is held once it came.
    #[test]
    fn the_marker_is_taken_out_wherever_the_output_is_cut() {
        let noise = b"motd from zshenv\nNISSE_BASH".as_slice();
        let after = b"hello\nNISSE_BASH_5e0f7d1c again\n".as_slice();
        let whole = [noise, MARKER, after].concat();
        for cut_a in 0..whole.len() {
            for cut_b in cut_a..whole.len() {
                let mut w = Watch::new();
                let mut out = w.stdout(&whole[..cut_a]);
                out.extend(w.stdout(&whole[cut_a..cut_b]));
                out.extend(w.stdout(&whole[cut_b..]));
                out.extend(w.finish());
                assert!(w.seen(), "{cut_a} {cut_b}");
                assert_eq!(out, [noise, after].concat(), "{cut_a} {cut_b}");
            }
        }
    }

    #[test]
    fn without_the_marker_everything_passes_and_the_answer_is_kept() {
        let mut w = Watch::new();
        w.stderr(b"sh: 1: exec: bash: not found\n");
        let mut out = w.stdout(b"partial NISSE_BASH_5e0");
        assert_eq!(out, b"partial ");
        out.extend(w.finish());
        assert!(!w.seen());
        assert_eq!(out, b"partial NISSE_BASH_5e0");
        assert_eq!(w.answer(), "sh: 1: exec: bash: not found");
        // Once bash started, its stderr is the command's, not an answer.
        let mut w = Watch::new();
        w.stdout(MARKER);
        w.stderr(b"the command's own");
        assert_eq!(w.answer(), "");
        let mut w = Watch::new();
        w.stderr(&[b'x'; 5000]);
        assert_eq!(w.answer().len(), ANSWER_MAX);
    }

    /// Runs [`BOOTSTRAP`] as sshd would under `shell` (`shell -c`), with
    /// `command` and `stdin` on standard input: (status, stdout, stderr).
    fn under(
        shell: &str,
        path: Option<&str>,
        command: &str,
        stdin: &[u8],
    ) -> (i32, Vec<u8>, String) {
        let mut cmd = Command::new(shell);
        cmd.arg("-c")
            .arg(BOOTSTRAP)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(p) = path {
            cmd.env("PATH", p);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("running {shell}: {e}"));
        let bytes = input(command, stdin).unwrap();
        let mut pipe = child.stdin.take().unwrap();
        // A login shell without bash reads nothing: the pipe may break.
        let _ = pipe.write_all(&bytes);
        drop(pipe);
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The login shells a host may have that this machine has: zsh is
    /// the one that matters (Debian package `zsh`, which `scripts/test`
    /// installs); its absence fails the test.
    fn login_shells() -> Vec<&'static str> {
        assert!(
            std::path::Path::new("/usr/bin/zsh").exists()
                || std::path::Path::new("/bin/zsh").exists(),
            "this test needs zsh as a login shell: install the Debian package `zsh`"
        );
        vec!["sh", "dash", "bash", "zsh"]
    }

    #[test]
    fn under_every_login_shell_bash_gets_the_command_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("probe1"), "").unwrap();
        let marker = dir.path().join("marker");
        // A zsh glob qualifier: code to zsh, a syntax error to bash.
        let qualifier = format!(
            "ls {}/probe*(e:'touch {}':)",
            dir.path().display(),
            marker.display()
        );
        // Quotes, backslashes, `!`, `$`, a tab, a carriage return,
        // non-ASCII: bash sees exactly these lines, which a quoted
        // here-document gives back as they are.
        let odd_lines = "x='it'\\''s \\ \"q\" !x $HOME' `id` $(id)\t\r ünï\n\\\n'\n\"";
        let odd = format!("cat <<'EOF'\n{odd_lines}\nEOF\nx=1; echo ${{x}}");
        for shell in login_shells() {
            let (code, out, err) = under(shell, None, &qualifier, b"");
            assert_eq!(out, MARKER, "{shell}: {err}");
            assert_eq!(code, 2, "{shell}: {err}");
            assert!(err.contains("syntax error"), "{shell}: {err}");
            assert!(!marker.exists(), "{shell} evaluated the glob qualifier");

            let (code, out, err) = under(
                shell,
                None,
                "[[ a == a ]] && echo ${BASH_VERSION:+bash}; exit 3",
                b"",
            );
            assert_eq!(
                (code, out),
                (3, [MARKER, b"bash\n"].concat()),
                "{shell}: {err}"
            );

            let (code, out, err) = under(shell, None, &odd, b"");
            assert_eq!(code, 0, "{shell}: {err}");
            let expected = format!("{odd_lines}\n1\n");
            assert_eq!(
                out,
                [MARKER, expected.as_bytes()].concat(),
                "{shell}: {err}"
            );

            // The command reads what follows the NUL, never its own text;
            // with nothing there, end of file at once.
            let (_, out, err) = under(shell, None, "cat; echo end", b"in\x00put");
            assert_eq!(out, [MARKER, b"in\x00putend\n"].concat(), "{shell}: {err}");
            let (_, out, _) = under(shell, None, "wc -c", b"");
            assert_eq!(String::from_utf8_lossy(&out[MARKER.len()..]).trim(), "0");

            // 64 KiB of command.
            let long = format!("x={}; echo ${{#x}}", "y".repeat(64 * 1024));
            let (code, out, err) = under(shell, None, &long, b"");
            assert_eq!(
                (code, out),
                (0, [MARKER, b"65536\n"].concat()),
                "{shell}: {err}"
            );
        }
    }

    #[test]
    fn a_login_shell_without_bash_prints_no_marker_and_runs_nothing() {
        login_shells();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        for shell in ["/bin/sh", "/usr/bin/zsh"] {
            let (code, out, err) = under(
                shell,
                Some("/nonexistent"),
                &format!("/usr/bin/touch {}", marker.display()),
                b"",
            );
            assert_eq!(out, b"", "{shell}");
            assert_eq!(code, 127, "{shell}: {err}");
            assert!(err.contains("bash"), "{shell}: {err}");
            assert!(!marker.exists(), "{shell}");
        }
    }
}
