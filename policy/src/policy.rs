//! The policy file: the shell rule tables, the ops policy (Nisse O2) and
//! the secret grants (L12), as one versioned TOML file layered over
//! built-in defaults.
//!
//! The built-in defaults (`policy/defaults/*.toml`) are always in force; an
//! operator's file adds to them: rules, wrappers, paths, tools, targets,
//! protected targets, `never` targets and `[[secret]]` grants (the defaults
//! grant no secret). A file cannot replace a built-in rule (ids are
//! unique), so a destructive pattern cannot be switched off by accident.
//! Errors name the file and line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;

use crate::dev::BuildHost;
use crate::ops::{NeverRule, OpsTables, Privilege, ProtectedRule, TargetDef, ToolDef};
use crate::rules::{ProgramDef, RuleDef, ShellRules, ShellSection, ShellTables, WrapperDef};
use crate::secrets::{SecretDef, SecretTables};
use crate::shell::{self, ShellReport};

/// The policy file format this build reads. A file declaring a newer
/// version is refused: it may say things this build would ignore.
pub const POLICY_VERSION: u32 = 1;

/// A built-in file: its name, its TOML and its JSON.
macro_rules! builtin {
    ($name:literal) => {
        (
            concat!($name, ".toml"),
            include_str!(concat!("../defaults/", $name, ".toml")),
            include_str!(concat!(env!("OUT_DIR"), "/", $name, ".json")),
        )
    };
}

/// The built-in defaults, in the order they are layered: the shell's
/// tables, what programs' options do, the read-only rules (each with the
/// options that keep its programs read-only), the rules for everything
/// riskier, and the tools.
///
/// Each file is there twice: as written, and as the JSON the build made
/// of it (build.rs), which loads several times faster; the TOML is read
/// only to say where a problem is.
const DEFAULTS: [(&str, &str, &str); 9] = [
    builtin!("shell"),
    builtin!("programs"),
    builtin!("read-shell"),
    builtin!("read-files"),
    builtin!("read-system"),
    builtin!("read-services"),
    builtin!("read-tools"),
    builtin!("risk"),
    builtin!("tools"),
];

/// What errors in the built-in defaults are said to be in.
const BUILTIN: &str = "built-in defaults";

/// What a policy file says about a problem, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// The file (or `built-in defaults`).
    pub file: String,
    /// 1-based line, when the problem has a place.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{l}:{c}: {}", self.file, self.message),
            (Some(l), None) => write!(f, "{}:{l}: {}", self.file, self.message),
            _ => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// A built-in file as the build wrote it in JSON (build.rs): the tables the
/// built-in defaults use, without the places in the text (which the TOML
/// gives, should a rule be refused).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct BuiltinDef {
    version: u32,
    #[serde(default)]
    shell: ShellSection,
    #[serde(default)]
    paths: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    option_values: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    wrappers: BTreeMap<String, WrapperDef>,
    #[serde(default)]
    programs: BTreeMap<String, ProgramDef>,
    #[serde(default, rename = "rule")]
    rules: Vec<RuleDef>,
    #[serde(default)]
    agent_hosts: Vec<String>,
    #[serde(default)]
    tools: BTreeMap<String, ToolDef>,
}

impl BuiltinDef {
    fn into_file(self) -> FileDef {
        let at = |v| toml::Spanned::new(0..0, v);
        FileDef {
            version: self.version,
            shell: self.shell,
            paths: self.paths,
            option_values: self.option_values,
            wrappers: self.wrappers,
            programs: self.programs,
            rules: self.rules.into_iter().map(at).collect(),
            agent_hosts: self.agent_hosts,
            tools: self
                .tools
                .into_iter()
                .map(|(k, v)| (k, toml::Spanned::new(0..0, v)))
                .collect(),
            targets: Vec::new(),
            protected: Vec::new(),
            never: Vec::new(),
            secrets: Vec::new(),
            mcp: BTreeMap::new(),
        }
    }
}

/// One policy file, as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct FileDef {
    version: u32,
    #[serde(default)]
    shell: ShellSection,
    #[serde(default)]
    paths: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    option_values: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    wrappers: BTreeMap<String, WrapperDef>,
    #[serde(default)]
    programs: BTreeMap<String, ProgramDef>,
    #[serde(default, rename = "rule")]
    rules: Vec<toml::Spanned<RuleDef>>,
    #[serde(default)]
    agent_hosts: Vec<String>,
    #[serde(default)]
    tools: BTreeMap<String, toml::Spanned<ToolDef>>,
    #[serde(default, rename = "target")]
    targets: Vec<toml::Spanned<TargetDef>>,
    #[serde(default)]
    protected: Vec<toml::Spanned<ProtectedRule>>,
    #[serde(default)]
    never: Vec<toml::Spanned<NeverRule>>,
    #[serde(default, rename = "secret")]
    secrets: Vec<toml::Spanned<SecretDef>>,
    #[serde(default)]
    mcp: BTreeMap<String, toml::Spanned<crate::mcp::InstanceDef>>,
}

/// The policy in force: built-in defaults plus the operator's file, and
/// the dev projects' build hosts ([`Policy::with_build_hosts`]).
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) shell: Arc<ShellRules>,
    pub(crate) ops: OpsTables,
    pub(crate) secrets: SecretTables,
    /// By host name (see [`crate::dev`]).
    pub(crate) build_hosts: BTreeMap<String, BuildHost>,
    sources: Vec<String>,
}

impl Policy {
    /// The built-in defaults alone. They are compiled once per process;
    /// each call shares their tables (an operator's file layered over them
    /// copies the shell's tables first).
    pub fn builtin() -> Result<Self, PolicyError> {
        static BUILTIN: std::sync::LazyLock<Result<Policy, PolicyError>> =
            std::sync::LazyLock::new(Policy::compile_builtin);
        BUILTIN.clone()
    }

    fn compile_builtin() -> Result<Self, PolicyError> {
        let mut policy = Self {
            shell: Arc::new(ShellRules::default()),
            ops: OpsTables::default(),
            secrets: SecretTables::default(),
            build_hosts: BTreeMap::new(),
            sources: Vec::new(),
        };
        for (file, text, json) in DEFAULTS {
            let source = format!("{BUILTIN} ({file})");
            let file = serde_json::from_str::<BuiltinDef>(json)
                .ok()
                .map(BuiltinDef::into_file);
            match file {
                Some(file) => policy.merge_file(&source, text, file)?,
                // Not what the build made of it: read the TOML, which says
                // where the problem is.
                None => policy.layer(&source, text)?,
            }
        }
        policy.sources = vec![BUILTIN.to_string()];
        policy.check(BUILTIN)?;
        Ok(policy)
    }

    /// The built-in defaults with the operator's file `text` (read by the
    /// caller from `source`, which names it in errors) over them.
    pub fn with_file(source: &str, text: &str) -> Result<Self, PolicyError> {
        let mut policy = Self::builtin()?;
        policy.layer(source, text)?;
        policy.check(source)?;
        Ok(policy)
    }

    /// The built-in policy, loaded once per process: for reading what a
    /// command line does (which program it runs, what it installs) where
    /// no gate's judgement is asked. `None` only if the built-in file were
    /// broken, which its tests rule out.
    pub fn builtin_shared() -> Option<&'static Policy> {
        static SHARED: std::sync::LazyLock<Option<Policy>> =
            std::sync::LazyLock::new(|| Policy::builtin().ok());
        SHARED.as_ref()
    }

    /// Where this policy came from, in layering order.
    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    /// Classifies a shell command line.
    pub fn classify_command(&self, command: &str) -> ShellReport {
        shell::classify(&self.shell, command)
    }

    /// The hosts the agent itself runs on.
    pub fn agent_hosts(&self) -> &BTreeSet<String> {
        &self.ops.agent_hosts
    }

    fn layer(&mut self, source: &str, text: &str) -> Result<(), PolicyError> {
        let at = |span: Option<std::ops::Range<usize>>, message: String| {
            let (line, column) = span.map_or((None, None), |s| {
                let (l, c) = line_col(text, s.start);
                (Some(l), Some(c))
            });
            PolicyError {
                file: source.to_string(),
                line,
                column,
                message,
            }
        };
        let file: FileDef =
            toml::from_str(text).map_err(|e| at(e.span(), e.message().to_string()))?;
        self.merge_file(source, text, file)
    }

    /// Adds what a file says (read from `text`, which its errors point
    /// into) to this policy.
    fn merge_file(&mut self, source: &str, text: &str, file: FileDef) -> Result<(), PolicyError> {
        let at = |span: Option<std::ops::Range<usize>>, message: String| {
            let (line, column) = span.map_or((None, None), |s| {
                let (l, c) = line_col(text, s.start);
                (Some(l), Some(c))
            });
            PolicyError {
                file: source.to_string(),
                line,
                column,
                message,
            }
        };
        if file.version == 0 || file.version > POLICY_VERSION {
            return Err(at(
                None,
                format!(
                    "version = {}: this build reads policy version {POLICY_VERSION} (a newer file may say things this build would ignore)",
                    file.version
                ),
            ));
        }
        Arc::make_mut(&mut self.shell)
            .merge(ShellTables {
                shell: file.shell,
                paths: file.paths,
                option_values: file.option_values,
                wrappers: file.wrappers,
                programs: file.programs,
                rules: file.rules,
            })
            .map_err(|e| at(e.span, e.message))?;
        self.ops
            .merge(
                file.agent_hosts,
                file.tools,
                file.targets,
                file.protected,
                file.never,
            )
            .map_err(|e| at(e.span, e.message))?;
        self.ops
            .merge_mcp(file.mcp)
            .map_err(|e| at(e.span, e.message))?;
        self.secrets
            .merge(file.secrets)
            .map_err(|e| at(e.span, e.message))?;
        self.sources.push(source.to_string());
        Ok(())
    }

    fn check(&self, source: &str) -> Result<(), PolicyError> {
        let problem = |message: String| PolicyError {
            file: source.to_string(),
            line: None,
            column: None,
            message,
        };
        self.shell
            .check_complete()
            .map_err(|e| problem(e.message))?;
        if !self
            .ops
            .tools
            .values()
            .any(|t| t.privilege == Privilege::Shell)
        {
            return Err(problem(
                "tools: no tool has `privilege = \"shell\"` (the command tool)".into(),
            ));
        }
        Ok(())
    }
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_defaults_load() {
        let policy = Policy::builtin().unwrap();
        assert_eq!(policy.sources(), ["built-in defaults"]);
    }

    #[test]
    fn errors_name_the_line() {
        let text = "version = 1\n\n[[rule]]\nid = \"x\"\ncommands = [\"frob\"]\nrisk = \"harmless\"\nreason = \"r\"\n";
        let e = Policy::with_file("site.toml", text).unwrap_err();
        assert_eq!(e.file, "site.toml");
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.to_string().contains("harmless"), "{e}");

        let text = "version = 1\n[[rule]]\nid = \"rm.delete\"\ncommands = [\"rm\"]\nrisk = \"read_only\"\nreason = \"r\"\n";
        let e = Policy::with_file("site.toml", text).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("already defined"), "{e}");

        let e = Policy::with_file("site.toml", "version = 2\n").unwrap_err();
        assert!(e.message.contains("version"), "{e}");

        let e = Policy::with_file("site.toml", "version = 1\nfrobnicate = true\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("frobnicate"), "{e}");

        let text = "version = 1\n\n[[protected]]\ntargets = [\"nas[\"]\nreason = \"backups\"\n";
        let e = Policy::with_file("site.toml", text).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
    }

    #[test]
    fn shell_table_mistakes_are_named() {
        for (text, says) in [
            ("[shell]\nmax-depth = 20\n", "between 1 and 16"),
            (
                "[wrappers.x]\nfloor = { rule = \"two words\", risk = \"config_mutation\", reason = \"r\" }\n",
                "wrappers.x.floor",
            ),
            (
                "[wrappers.x]\nfloor = { rule = \"x.floor\", risk = \"config_mutation\", reason = \" \" }\n",
                "`reason` is empty",
            ),
            (
                "[wrappers.x]\nprogram-settings = [\"ProxyCommand\"]\n",
                "needs `setting-options`",
            ),
            (
                "[wrappers.x]\nwithout-command = \"read_only\"\n",
                "without-command",
            ),
            (
                "[[rule]]\nid = \"x.t\"\ncommands = [\"x\"]\ntruncates = true\noptions = []\nrisk = \"read_only\"\nreason = \"r\"\n",
                "`truncates` needs",
            ),
            (
                "[[rule]]\nid = \"x.o\"\ncommands = [\"x\"]\nrisk = \"read_only\"\nreason = \"r\"\n",
                "a read-only rule lists the options",
            ),
            (
                "[[rule]]\nid = \"x.p\"\ncommands = [\"x\"]\noptions = [\"-n lines\"]\nrisk = \"read_only\"\nreason = \"r\"\n",
                "option `-n lines`",
            ),
            ("[programs.x]\nruns = [\"pre\"]\n", "programs.x: `pre`"),
            (
                "[[rule]]\nid = \"x.s\"\ncommands = [\"x\"]\nsources-any = [\"@nowhere\"]\noptions = []\nrisk = \"read_only\"\nreason = \"r\"\n",
                "`@nowhere` names no path set",
            ),
        ] {
            let e = Policy::with_file("site.toml", &format!("version = 1\n{text}")).unwrap_err();
            assert!(e.to_string().contains(says), "{text}: {e}");
            assert_eq!(e.file, "site.toml");
        }
    }

    #[test]
    fn a_site_rule_can_mark_a_credential_read() {
        let text = "version = 1\n[[rule]]\nid = \"site.vault\"\ncommands = [\"vault\"]\nsubcommands = [\"kv get\"]\nreads-credentials = true\nrisk = \"destructive\"\nreason = \"prints a secret\"\n";
        let policy = Policy::with_file("site.toml", text).unwrap();
        assert!(
            policy
                .classify_command("vault kv get secret/x")
                .reads_credentials()
        );
        assert!(!policy.classify_command("vault status").reads_credentials());
    }

    #[test]
    fn a_file_adds_rules_that_the_classifier_uses() {
        let text = "version = 1\n[[rule]]\nid = \"site.frob\"\ncommands = [\"frob\"]\nsubcommands = [\"show\"]\noptions = [\"-v\"]\nrisk = \"read_only\"\nreason = \"frob show only reads\"\n";
        let policy = Policy::with_file("site.toml", text).unwrap();
        assert_eq!(
            policy.classify_command("frob show").risk,
            crate::RiskClass::ReadOnly
        );
        assert_eq!(
            policy.classify_command("frob delete").risk,
            crate::RiskClass::ConfigMutation
        );
        let builtin = Policy::builtin().unwrap();
        assert_eq!(
            builtin.classify_command("frob show").risk,
            crate::RiskClass::ConfigMutation
        );
    }
}
