//! The shell rule tables: what the command classifier knows about programs,
//! wrappers and paths, as data.
//!
//! The tables come from a policy file (see [`crate::Policy`]); the built-in
//! defaults are `policy/defaults.toml`, compiled into the binary. A rule
//! says "this program, with these subcommands/flags/arguments, has this
//! risk"; a simple command's risk is the maximum over every rule that
//! matches it, and a command no rule matches is *unknown*, which is
//! `config_mutation` — never read-only by default.

use std::collections::{BTreeMap, BTreeSet};

use glob::{MatchOptions, Pattern};
use serde::Deserialize;

use crate::RiskClass;

/// The `[shell]`, `[paths]`, `[option-values]`, `[wrappers]` and `[[rule]]`
/// parts of a policy file, as written.
#[derive(Debug, Default)]
pub(crate) struct ShellTables {
    pub shell: ShellSection,
    pub paths: BTreeMap<String, Vec<String>>,
    pub option_values: BTreeMap<String, Vec<String>>,
    pub wrappers: BTreeMap<String, WrapperDef>,
    pub rules: Vec<toml::Spanned<RuleDef>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct ShellSection {
    pub max_depth: Option<usize>,
    #[serde(default)]
    pub bin_dirs: Vec<String>,
    #[serde(default)]
    pub shells: Vec<String>,
    #[serde(default)]
    pub shell_options_with_value: Vec<String>,
    #[serde(default)]
    pub interpreters: Vec<String>,
    #[serde(default)]
    pub interpreter_code_options: Vec<String>,
    #[serde(default)]
    pub interpreter_info_options: Vec<String>,
}

/// A program that runs another program (`sudo`, `env`, `xargs`, `ssh`...),
/// as written in `[wrappers.<name>]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct WrapperDef {
    /// Options that take the next word as their value.
    #[serde(default)]
    pub options_with_value: Vec<String>,
    /// Options after which the remaining words form a shell command line
    /// (`sudo -s`, `doas -s`).
    #[serde(default)]
    pub shell_options: Vec<String>,
    /// Options whose value is a shell command line (`env -S`, `su -c`).
    #[serde(default)]
    pub script_options: Vec<String>,
    /// Options that only look something up (`command -v`): read-only.
    #[serde(default)]
    pub lookup_options: Vec<String>,
    /// Positional words to skip before the command (`timeout DURATION`,
    /// `ssh HOST`, `chroot DIR`).
    #[serde(default)]
    pub skip_operands: usize,
    /// Skip leading `NAME=VALUE` words (`env`).
    #[serde(default)]
    pub assignments: bool,
    /// The remaining words are joined with spaces and run by a shell
    /// (`ssh host cmd`, `watch cmd`, `eval`).
    #[serde(default)]
    pub join: bool,
    /// The command run when none is given (`xargs` runs `echo`).
    pub default_command: Option<String>,
    /// Options that start an inner command ending at `;` or `+` (`find
    /// -exec`); the wrapper's own other words are classified by the rules.
    #[serde(default)]
    pub segments: Vec<String>,
    /// The command reads the program it runs from its input (`at`).
    #[serde(default)]
    pub stdin_program: bool,
    /// What running anything through it is at least (`ssh`: reaching
    /// another host), with its own rule id and reason.
    pub floor: Option<FloorDef>,
    /// Options whose value is a `NAME=VALUE` setting (`ssh -o`).
    #[serde(default)]
    pub setting_options: Vec<String>,
    /// Settings whose value is a shell command the wrapper runs locally
    /// (`ProxyCommand`), matched without regard to case.
    #[serde(default)]
    pub program_settings: Vec<String>,
    /// It hands its environment to the command it runs without printing or
    /// keeping it, so a secret granted to that command reaches it through
    /// this wrapper too.
    #[serde(default)]
    pub passes_secrets: bool,
}

/// A wrapper's `floor`, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct FloorDef {
    pub rule: String,
    pub risk: RiskClass,
    pub reason: String,
}

/// One `[[rule]]` as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct RuleDef {
    pub id: String,
    #[serde(default)]
    pub commands: Vec<String>,
    #[serde(default)]
    pub subcommands: Vec<String>,
    #[serde(default)]
    pub flags_any: Vec<String>,
    #[serde(default)]
    pub flags_none: Vec<String>,
    #[serde(default)]
    pub args_any: Vec<String>,
    #[serde(default)]
    pub args_none: Vec<String>,
    #[serde(default)]
    pub operands_all: Vec<String>,
    #[serde(default)]
    pub sources_any: Vec<String>,
    #[serde(default)]
    pub no_operands: bool,
    #[serde(default)]
    pub no_args: bool,
    #[serde(default)]
    pub known_args: bool,
    #[serde(default)]
    pub case_insensitive: bool,
    pub writes: Option<Writes>,
    #[serde(default)]
    pub truncates: bool,
    #[serde(default)]
    pub write_options: Vec<String>,
    #[serde(default)]
    pub takes_host_down: bool,
    #[serde(default)]
    pub reads_credentials: bool,
    pub risk: RiskClass,
    pub reason: String,
}

/// Which operands of a command are files it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Writes {
    /// Every operand (`tee a b`).
    Operands,
    /// The last operand (`cp a b DEST`).
    LastOperand,
}

/// A set of glob patterns, and path sets it includes by name (`@name`,
/// resolved when matching, so a later layer that adds to a set also
/// reaches the rules of an earlier one).
#[derive(Debug, Clone, Default)]
pub(crate) struct Globs {
    patterns: Vec<Pattern>,
    sets: Vec<String>,
    case_insensitive: bool,
}

impl Globs {
    fn options(&self) -> MatchOptions {
        MatchOptions {
            case_sensitive: !self.case_insensitive,
            require_literal_separator: false,
            require_literal_leading_dot: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty() && self.sets.is_empty()
    }

    /// Whether `text` matches a pattern of this set or of a set it names.
    pub fn matches(&self, text: &str, paths: &BTreeMap<String, Globs>) -> bool {
        let options = self.options();
        self.patterns.iter().any(|p| p.matches_with(text, options))
            || self.sets.iter().any(|name| {
                paths
                    .get(name)
                    .is_some_and(|set| set.patterns.iter().any(|p| p.matches_with(text, options)))
            })
    }
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub id: String,
    pub commands: BTreeSet<String>,
    pub subcommands: Vec<Vec<String>>,
    pub flags_any: Vec<String>,
    pub flags_none: Vec<String>,
    pub args_any: Globs,
    pub args_none: Globs,
    pub operands_all: Globs,
    /// Globs some source operand must match (every operand but the last,
    /// the destination, or every operand when a write option names it).
    pub sources_any: Globs,
    pub no_operands: bool,
    pub no_args: bool,
    pub known_args: bool,
    pub writes: Option<Writes>,
    /// The files it writes are emptied first, as by `>`.
    pub truncates: bool,
    pub write_options: Vec<String>,
    pub takes_host_down: bool,
    /// It reads out a secret: it is never handed one.
    pub reads_credentials: bool,
    pub risk: RiskClass,
    pub reason: String,
}

/// A compiled wrapper.
pub(crate) type Wrapper = WrapperDef;

/// The compiled shell tables.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShellRules {
    pub max_depth: usize,
    pub bin_dirs: Vec<String>,
    pub shells: BTreeSet<String>,
    pub shell_options_with_value: BTreeSet<String>,
    pub interpreters: BTreeSet<String>,
    pub interpreter_code_options: Vec<String>,
    pub interpreter_info_options: Vec<String>,
    pub paths: BTreeMap<String, Globs>,
    pub option_values: BTreeMap<String, BTreeSet<String>>,
    pub wrappers: BTreeMap<String, Wrapper>,
    pub rules: Vec<Rule>,
}

/// The path sets every policy must define (the classifier relies on them).
pub(crate) const REQUIRED_PATH_SETS: [&str; 6] = [
    "discard",
    "scratch",
    "block-devices",
    "protected",
    "system-files",
    "credentials",
];

/// A problem in a policy file's tables, with the byte span it is about.
pub(crate) struct TableError {
    pub span: Option<std::ops::Range<usize>>,
    pub message: String,
}

impl ShellRules {
    /// Merges `tables` (a later layer: an operator's file over the built-in
    /// defaults) into these rules. Lists are extended, wrappers and option
    /// tables are added or replaced by name, and rules are added; a rule id
    /// already in use is an error, so a file can never silently replace a
    /// built-in rule (and with it, say, a destructive pattern).
    pub fn merge(&mut self, tables: ShellTables) -> Result<(), TableError> {
        let s = tables.shell;
        if let Some(depth) = s.max_depth {
            // Each program level is a level of nesting too: deeper than
            // this, the nesting limit would refuse the line first.
            if !(1..=16).contains(&depth) {
                return Err(TableError {
                    span: None,
                    message: format!("shell.max-depth: must be between 1 and 16, not {depth}"),
                });
            }
            self.max_depth = depth;
        }
        self.bin_dirs.extend(s.bin_dirs);
        self.shells.extend(s.shells);
        self.shell_options_with_value
            .extend(s.shell_options_with_value);
        self.interpreters.extend(s.interpreters);
        self.interpreter_code_options
            .extend(s.interpreter_code_options);
        self.interpreter_info_options
            .extend(s.interpreter_info_options);
        for (name, patterns) in tables.paths {
            let globs = compile_globs(&patterns, false).map_err(|e| TableError {
                span: None,
                message: format!("paths.{name}: {e}"),
            })?;
            if !globs.sets.is_empty() {
                return Err(TableError {
                    span: None,
                    message: format!("paths.{name}: a path set cannot include another (`@...`)"),
                });
            }
            let entry = self.paths.entry(name).or_default();
            entry.patterns.extend(globs.patterns);
        }
        for (command, options) in tables.option_values {
            self.option_values
                .entry(command)
                .or_default()
                .extend(options);
        }
        for (name, wrapper) in tables.wrappers {
            if let Some(floor) = &wrapper.floor {
                let err = |message: String| TableError {
                    span: None,
                    message: format!("wrappers.{name}.floor: {message}"),
                };
                if floor.rule.trim().is_empty() || floor.rule.contains(char::is_whitespace) {
                    return Err(err(format!(
                        "rule `{}` must be one word (e.g. `ssh.lateral`)",
                        floor.rule
                    )));
                }
                if floor.reason.trim().is_empty() {
                    return Err(err("`reason` is empty".into()));
                }
            }
            if !wrapper.program_settings.is_empty() && wrapper.setting_options.is_empty() {
                return Err(TableError {
                    span: None,
                    message: format!(
                        "wrappers.{name}: `program-settings` needs `setting-options` (the options that carry them)"
                    ),
                });
            }
            self.wrappers.insert(name, wrapper);
        }
        for spanned in tables.rules {
            let span = spanned.span();
            let def = spanned.into_inner();
            let rule = self.compile_rule(def).map_err(|message| TableError {
                span: Some(span.clone()),
                message,
            })?;
            self.rules.push(rule);
        }
        Ok(())
    }

    /// Checks what only the merged whole can tell.
    pub fn check_complete(&self) -> Result<(), TableError> {
        for set in REQUIRED_PATH_SETS {
            if !self.paths.contains_key(set) {
                return Err(TableError {
                    span: None,
                    message: format!("paths.{set}: missing (the classifier needs it)"),
                });
            }
        }
        for rule in &self.rules {
            for globs in [
                &rule.args_any,
                &rule.args_none,
                &rule.operands_all,
                &rule.sources_any,
            ] {
                if let Some(missing) = globs.sets.iter().find(|s| !self.paths.contains_key(*s)) {
                    return Err(TableError {
                        span: None,
                        message: format!(
                            "rule `{}`: `@{missing}` names no path set (known: {})",
                            rule.id,
                            names(self.paths.keys())
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn compile_rule(&self, def: RuleDef) -> Result<Rule, String> {
        let id = def.id.trim().to_string();
        if id.is_empty() || id.contains(char::is_whitespace) {
            return Err(format!(
                "rule id `{}`: must be one word (e.g. `systemctl.read`)",
                def.id
            ));
        }
        if self.rules.iter().any(|r| r.id == id) {
            return Err(format!(
                "rule `{id}`: that id is already defined (ids are unique; a file adds rules, it cannot replace one)"
            ));
        }
        if def.reason.trim().is_empty() {
            return Err(format!("rule `{id}`: `reason` is empty"));
        }
        if def.commands.is_empty()
            && def.subcommands.is_empty()
            && def.flags_any.is_empty()
            && def.args_any.is_empty()
            && def.sources_any.is_empty()
        {
            return Err(format!(
                "rule `{id}`: matches every command; give `commands`, `flags-any`, `args-any` or `sources-any`"
            ));
        }
        if !def.subcommands.is_empty() && def.commands.is_empty() {
            return Err(format!("rule `{id}`: `subcommands` needs `commands`"));
        }
        if def.truncates && def.writes.is_none() && def.write_options.is_empty() {
            return Err(format!(
                "rule `{id}`: `truncates` needs `writes` or `write-options` (the files it empties)"
            ));
        }
        for flag in def.flags_any.iter().chain(&def.flags_none) {
            if !flag.starts_with('-') || flag.len() < 2 {
                return Err(format!(
                    "rule `{id}`: flag `{flag}` must start with `-` (e.g. `-r`, `--recursive`)"
                ));
            }
        }
        let ci = def.case_insensitive;
        let globs = |field: &str, list: &[String]| {
            compile_globs(list, ci).map_err(|e| format!("rule `{id}`: {field}: {e}"))
        };
        Ok(Rule {
            commands: def.commands.into_iter().collect(),
            subcommands: def
                .subcommands
                .iter()
                .map(|s| s.split_whitespace().map(str::to_string).collect())
                .collect(),
            flags_any: def.flags_any,
            flags_none: def.flags_none,
            args_any: globs("args-any", &def.args_any)?,
            args_none: globs("args-none", &def.args_none)?,
            operands_all: globs("operands-all", &def.operands_all)?,
            sources_any: globs("sources-any", &def.sources_any)?,
            no_operands: def.no_operands,
            no_args: def.no_args,
            known_args: def.known_args,
            writes: def.writes,
            truncates: def.truncates,
            write_options: def.write_options,
            takes_host_down: def.takes_host_down,
            reads_credentials: def.reads_credentials,
            risk: def.risk,
            reason: def.reason,
            id,
        })
    }

    /// The path set `name`; empty when missing (the policy check makes sure
    /// the required ones exist).
    pub fn path_set(&self, name: &str) -> &Globs {
        static EMPTY: Globs = Globs {
            patterns: Vec::new(),
            sets: Vec::new(),
            case_insensitive: false,
        };
        self.paths.get(name).unwrap_or(&EMPTY)
    }
}

/// Compiles glob patterns; `@name` includes the path set `name`.
pub(crate) fn compile_globs(list: &[String], case_insensitive: bool) -> Result<Globs, String> {
    let mut patterns = Vec::new();
    let mut sets = Vec::new();
    for text in list {
        if let Some(set) = text.strip_prefix('@') {
            sets.push(set.to_string());
        } else {
            patterns.push(Pattern::new(text).map_err(|e| format!("`{text}`: {}", e.msg))?);
        }
    }
    Ok(Globs {
        patterns,
        sets,
        case_insensitive,
    })
}

fn names<'a>(it: impl Iterator<Item = &'a String>) -> String {
    it.map(String::as_str).collect::<Vec<_>>().join(", ")
}
