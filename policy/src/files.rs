//! The file tools (`file.read`, `file.list`, `file.write`): SSH operations
//! like commands (seed L13), with arguments checked here so the brain, the
//! classifier and the executor read them the same way.
//!
//! A file operation is classified as the command that would do the same
//! (`cat`, `ls`, `cp` from its input to the path), so the path rules that
//! make `cat /etc/shadow` or `cp x /dev/sda` destructive hold for the file
//! tools too; a tool's own privilege can only raise that. A write is a copy,
//! not a redirection: its content is part of what is approved, where `>
//! /etc/hosts` or `| tee` puts whatever a command prints there.

use serde_json::Value;

use crate::ops::{Action, ActionError};

/// What a file tool does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOp {
    /// Reads a file's content.
    Read {
        /// Absolute path.
        path: String,
    },
    /// Lists a directory (or describes a file).
    List {
        /// Absolute path.
        path: String,
    },
    /// Replaces a file's content atomically: a temporary file beside it,
    /// then a rename.
    Write {
        /// Absolute path.
        path: String,
        /// The new content.
        content: String,
        /// The mode as octal digits; `None` keeps the existing mode.
        mode: Option<String>,
    },
}

/// The file tools' names.
pub const FILE_TOOLS: [&str; 3] = ["file.read", "file.list", "file.write"];

impl FileOp {
    /// The operation a file tool's action asks for; `None` for any other
    /// tool. A malformed one names what is wrong.
    pub fn from_action(action: &Action) -> Result<Option<Self>, ActionError> {
        if !FILE_TOOLS.contains(&action.tool.as_str()) {
            return Ok(None);
        }
        let err = |m: String| ActionError(format!("the `{}` action {m}", action.tool));
        let path = action
            .argument_str("path")
            .ok_or_else(|| err("needs a `path` string argument".into()))?;
        check_path(&path).map_err(err)?;
        Ok(Some(match action.tool.as_str() {
            "file.read" => Self::Read { path },
            "file.list" => Self::List { path },
            _ => {
                let content = match action.argument("content") {
                    Some(Value::String(s)) => s,
                    _ => return Err(err("needs a `content` string argument".into())),
                };
                let mode = match action.argument("mode") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(m)) if is_mode(&m) => Some(m),
                    Some(other) => {
                        return Err(err(format!(
                            "has a `mode` of {other}: give octal digits as a string, e.g. \"0640\""
                        )));
                    }
                };
                Self::Write {
                    path,
                    content,
                    mode,
                }
            }
        }))
    }

    /// The action this operation is, on `host`.
    pub fn to_action(&self, host: &str) -> Result<Action, ActionError> {
        let mut args = serde_json::json!({ "path": self.path() });
        if let Self::Write { content, mode, .. } = self {
            args["content"] = Value::String(content.clone());
            if let Some(m) = mode {
                args["mode"] = Value::String(m.clone());
            }
        }
        Action::new(self.tool(), host, &args)
    }

    /// The tool's name.
    pub fn tool(&self) -> &'static str {
        match self {
            Self::Read { .. } => "file.read",
            Self::List { .. } => "file.list",
            Self::Write { .. } => "file.write",
        }
    }

    /// The path it acts on.
    pub fn path(&self) -> &str {
        match self {
            Self::Read { path } | Self::List { path } | Self::Write { path, .. } => path,
        }
    }

    /// The command that does the same, which the policy classifies it as.
    pub fn like_command(&self) -> String {
        let path = quote(self.path());
        match self {
            Self::Read { .. } => format!("cat -- {path}"),
            Self::List { .. } => format!("ls -la -- {path}"),
            Self::Write { .. } => format!("cp -- /dev/stdin {path}"),
        }
    }

    /// The command the executor runs on the host, with the content (for a
    /// write) on its standard input. A write goes to a temporary file in
    /// the same directory, gets the mode (the old file's, or the one
    /// asked for), and is renamed over the target, so a reader never sees
    /// half a file and a failure leaves the old one.
    pub fn remote_command(&self) -> String {
        let path = quote(self.path());
        match self {
            Self::Read { .. } => format!("cat -- {path}"),
            Self::List { .. } => format!("ls -la -- {path}"),
            Self::Write { mode, .. } => {
                let chmod = match mode {
                    Some(m) => format!("chmod {m} \"$t\""),
                    None => format!(
                        "if [ -e {path} ]; then chmod --reference={path} \"$t\"; else chmod 0600 \"$t\"; fi"
                    ),
                };
                format!(
                    "set -e; p={path}; t=$(mktemp \"$(dirname -- \"$p\")/.nisse-write.XXXXXX\"); trap 'rm -f \"$t\"' EXIT; cat > \"$t\"; {chmod}; mv -f -- \"$t\" \"$p\"; trap - EXIT"
                )
            }
        }
    }

    /// What goes to the command's standard input.
    pub fn stdin(&self) -> &[u8] {
        match self {
            Self::Write { content, .. } => content.as_bytes(),
            _ => &[],
        }
    }
}

fn check_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("needs an absolute `path`, not `{path}`"));
    }
    if path.contains(['\0', '\n', '\r']) {
        return Err("has a `path` with a NUL or line break".into());
    }
    if path.split('/').any(|c| c == "..") {
        return Err(format!("has a `path` with `..`: `{path}`"));
    }
    Ok(())
}

fn is_mode(m: &str) -> bool {
    (3..=4).contains(&m.len()) && m.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

/// `s` as one single-quoted shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn op(tool: &str, args: Value) -> Result<Option<FileOp>, ActionError> {
        FileOp::from_action(&Action::new(tool, "nas01", &args).unwrap())
    }

    #[test]
    fn file_actions_are_read_and_checked() {
        assert_eq!(
            op("file.read", json!({"path": "/etc/hosts"})).unwrap(),
            Some(FileOp::Read {
                path: "/etc/hosts".into()
            })
        );
        assert_eq!(op("shell", json!({"command": "ls"})).unwrap(), None);
        for (args, says) in [
            (json!({}), "needs a `path`"),
            (json!({"path": "etc/hosts"}), "absolute"),
            (json!({"path": "/srv/../etc/shadow"}), "`..`"),
            (json!({"path": "/x"}), "needs a `content`"),
            (
                json!({"path": "/x", "content": "a", "mode": 644}),
                "octal digits",
            ),
            (
                json!({"path": "/x", "content": "a", "mode": "0999"}),
                "octal digits",
            ),
        ] {
            let e = op("file.write", args).unwrap_err();
            assert!(e.0.contains(says), "{e}");
        }
    }

    #[test]
    fn paths_are_quoted_so_they_stay_one_word() {
        let w = op(
            "file.write",
            json!({"path": "/srv/it's; rm -rf /", "content": "x", "mode": "0640"}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            w.like_command(),
            r"cp -- /dev/stdin '/srv/it'\''s; rm -rf /'"
        );
        assert!(w.remote_command().contains(r"p='/srv/it'\''s; rm -rf /'"));
        assert!(w.remote_command().contains("chmod 0640"));
        assert_eq!(w.stdin(), b"x");
    }

    #[test]
    fn a_file_tool_is_as_risky_as_the_command_that_does_the_same() {
        use crate::{Policy, RiskClass};
        let policy = Policy::builtin().unwrap();
        let risk = |tool: &str, args: Value| {
            policy
                .assess(&Action::new(tool, "nas01", &args).unwrap(), None)
                .risk
        };
        assert_eq!(
            risk("file.read", json!({"path": "/etc/hosts"})),
            RiskClass::ReadOnly
        );
        assert_eq!(
            risk("file.list", json!({"path": "/srv"})),
            RiskClass::ReadOnly
        );
        // Reading a credential is never "only reading".
        assert_eq!(
            risk("file.read", json!({"path": "/etc/shadow"})),
            RiskClass::Destructive
        );
        // Nor is reading an environment or what SSH keeps, on this path
        // as in a shell.
        for path in [
            "/proc/1/environ",
            "/proc/self/environ",
            "/root/.ssh/known_hosts",
            "/home/alice/.ssh/authorized_keys",
            "/home/alice/.ssh/nas_key",
            "/etc/ssh/ssh_host_ed25519_key",
        ] {
            let action = Action::new("file.read", "nas01", &json!({ "path": path })).unwrap();
            let a = policy.assess(&action, None);
            assert_eq!(a.risk, RiskClass::Destructive, "{path}");
            assert!(a.reads_credentials(), "{path}");
            assert_eq!(a.rule, "credentials.read", "{path}");
        }
        // A public key is not a secret; listing shows names, not content.
        for (tool, path) in [
            ("file.read", "/home/alice/.ssh/id_ed25519.pub"),
            ("file.list", "/root/.ssh/id_rsa"),
            ("file.list", "/proc/1/environ"),
        ] {
            let action = Action::new(tool, "nas01", &json!({ "path": path })).unwrap();
            let a = policy.assess(&action, None);
            assert_eq!(a.risk, RiskClass::ReadOnly, "{tool} {path}");
            assert!(!a.reads_credentials(), "{tool} {path}");
        }
        // A write is at least the tool's own risk, and a block device more.
        assert_eq!(
            risk("file.write", json!({"path": "/tmp/x", "content": ""})),
            RiskClass::ConfigMutation
        );
        assert_eq!(
            risk("file.write", json!({"path": "/dev/sda", "content": ""})),
            RiskClass::Destructive
        );
        // Replacing a system file with content that is part of the plan is
        // a config mutation, like `cp`, unless the host cannot do without
        // it; writing a key is not reading one.
        for (path, risk) in [
            ("/etc/caddy/Caddyfile", RiskClass::ConfigMutation),
            ("/root/.ssh/authorized_keys", RiskClass::Destructive),
        ] {
            let action = Action::new(
                "file.write",
                "nas01",
                &json!({ "path": path, "content": "x" }),
            )
            .unwrap();
            let a = policy.assess(&action, None);
            assert_eq!(a.risk, risk, "{path}");
            assert!(!a.reads_credentials(), "{path}");
        }
        // A malformed one is not read-only.
        assert_eq!(
            risk("file.read", json!({"path": "x"})),
            RiskClass::ConfigMutation
        );
    }
}
