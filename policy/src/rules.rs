//! The shell rule tables: what the command classifier knows about programs,
//! wrappers and paths, as data.
//!
//! The tables come from a policy file (see [`crate::Policy`]); the built-in
//! defaults are `policy/defaults/*.toml`, compiled into the binary. A rule
//! says "this program, with these subcommands/flags/arguments, has this
//! risk"; a simple command's risk is the maximum over every rule that
//! matches it, and a command no rule matches is *unknown*, which is
//! `config_mutation` — never read-only by default.

use std::collections::{BTreeMap, BTreeSet};

use glob::{MatchOptions, Pattern};
use serde::Deserialize;

use crate::RiskClass;
use crate::options::{Allowlist, OptionStyle};

/// The `[shell]`, `[paths]`, `[option-values]`, `[wrappers]`, `[programs]`
/// and `[[rule]]` parts of a policy file, as written.
#[derive(Debug, Default)]
pub(crate) struct ShellTables {
    pub shell: ShellSection,
    pub paths: BTreeMap<String, Vec<String>>,
    pub option_values: BTreeMap<String, Vec<String>>,
    pub wrappers: BTreeMap<String, WrapperDef>,
    pub programs: BTreeMap<String, ProgramDef>,
    pub rules: Vec<toml::Spanned<RuleDef>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct ShellSection {
    pub max_depth: Option<usize>,
    #[serde(default)]
    pub bin_dirs: Vec<String>,
    /// Directories of service scripts: running `DIR/NAME ARGS` is
    /// `service NAME ARGS`.
    #[serde(default)]
    pub service_dirs: Vec<String>,
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
    /// Interpreter options that take the next word as their value (`-W
    /// ignore`), so that it is not taken for the script.
    #[serde(default)]
    pub interpreter_options_with_value: Vec<String>,
    /// Modules an interpreter runs with `-m` that serve files to the
    /// network (`http.server`).
    #[serde(default)]
    pub interpreter_server_modules: Vec<String>,
    /// Environment variables that change nothing a program loads or runs
    /// (`LC_ALL`, `TZ`, `COLUMNS`): globs.
    #[serde(default)]
    pub harmless_variables: Vec<String>,
    /// Variables whose value is a command line a program runs (`PAGER`,
    /// `GIT_SSH_COMMAND`, `LESSOPEN`): the value is classified as that
    /// command. Globs.
    #[serde(default)]
    pub command_variables: Vec<String>,
    /// Variables whose value is code in a program's own language, run at
    /// its start (`VIMINIT`, `PERL5DB`): destructive. Globs.
    #[serde(default)]
    pub code_variables: Vec<String>,
    /// Variables a program reads options from (`TAR_OPTIONS` for tar,
    /// `LESS` for less): their value is read as that program's options.
    #[serde(default)]
    pub option_variables: BTreeMap<String, String>,
    /// Variables that change what programs load or run even when set as
    /// plain shell variables, since they are usually exported already
    /// (`PATH`, `LD_PRELOAD`, `BASH_ENV`, `PS4`): globs.
    #[serde(default)]
    pub loader_variables: Vec<String>,
}

/// What a program does with some of its options, whatever else the
/// command does, as written in `[programs.<name>]`. Options are listed
/// as written (`-o`, `--output`, `-fprint`); each takes a value, attached
/// (`-ofile`, `--output=file`) or as the next word, and an abbreviated
/// long option (`--out`) counts as the option it abbreviates.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct ProgramDef {
    /// Options whose value is a command it runs (`rg --pre`, `tar
    /// --to-command`, `bat --pager`): classified as that command.
    #[serde(default)]
    pub runs: Vec<String>,
    /// Options whose value is code in the program's own language, which
    /// can run commands and which the classifier does not read (`vim -c`,
    /// `gawk --source` when not read as awk): destructive.
    #[serde(default)]
    pub code: Vec<String>,
    /// Options that load code, a plugin or a configuration that can name
    /// programs to run (`gawk -l`, `openssl -engine`, `curl -K`, `ssh -F`).
    #[serde(default)]
    pub loads: Vec<String>,
    /// Options whose value is a file it writes, replacing it (`sort -o`,
    /// `tree -o`, `less -o`, `find -fprint`).
    #[serde(default)]
    pub writes: Vec<String>,
    /// Options (no value, or one attached) that make it rewrite the files
    /// it is given (`sed -i`, `yq -i`).
    #[serde(default)]
    pub in_place: Vec<String>,
    /// Options whose value is a `KEY=VALUE` setting (`git -c`, `hg
    /// --config`).
    #[serde(default)]
    pub setting_options: Vec<String>,
    /// Settings whose value is a command it runs (`core.pager`,
    /// `alias.*`; a leading `!` is how git marks a shell alias): globs,
    /// matched without regard to case. The value is classified as that
    /// command.
    #[serde(default)]
    pub command_settings: Vec<String>,
    /// Its operands are files it writes, replacing them (`script FILE`).
    #[serde(default)]
    pub operands_written: bool,
    /// The program takes `+` words as options (`less +F`, `dig +short`):
    /// such a word keeps it read-only only if a rule lists it.
    #[serde(default)]
    pub plus_options: bool,
    /// The first word, when it has no dash, is a cluster of options
    /// (`tar tvf`).
    #[serde(default)]
    pub bundled_first: bool,
    /// The language its script is written in, read by the classifier:
    /// `sed` or `awk`. The script is the value of a script option, or
    /// else the first operand.
    pub language: Option<Language>,
}

/// A program language the classifier reads for what it runs and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Language {
    /// sed scripts: `e` runs commands, `w` writes files.
    Sed,
    /// awk programs: `system()`, pipes and redirections.
    Awk,
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
    /// It runs a command only under these subcommands (`ip netns exec`,
    /// `docker exec`); otherwise it is a program for the rules.
    #[serde(default)]
    pub subcommands: Vec<String>,
    /// It carries its standard input to another machine (`ssh host cmd <
    /// file`): a file or another command's output given to it is sent.
    #[serde(default)]
    pub sends_input: bool,
    /// Words standing for each file it found (`find -exec … {}`): paths.
    #[serde(default)]
    pub path_placeholders: Vec<String>,
    /// Words standing for what it read from its input (`parallel … {}`).
    #[serde(default)]
    pub input_placeholders: Vec<String>,
    /// Options whose value is such a word (`xargs -I R`; `-i` means `{}`).
    #[serde(default)]
    pub replace_options: Vec<String>,
    /// It adds words from its input to the command's words (`xargs`).
    #[serde(default)]
    pub appends_input: bool,
    /// Its options all come before the command it runs (`env`): a script
    /// option after that belongs to the command.
    #[serde(default)]
    pub options_first: bool,
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
    pub operands_any: Vec<String>,
    #[serde(default)]
    pub operands_none: Vec<String>,
    #[serde(default)]
    pub sources_any: Vec<String>,
    #[serde(default)]
    pub destination_any: Vec<String>,
    #[serde(default)]
    pub input_given: bool,
    #[serde(default)]
    pub output_given: bool,
    #[serde(default)]
    pub extracts_into: Vec<String>,
    /// The options that keep the programs read-only; required for a
    /// read-only rule (see [`crate::options`]).
    pub options: Option<Vec<String>>,
    #[serde(default)]
    pub option_style: OptionStyle,
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
    pub appends: bool,
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
    /// Every operand after the first (`uniq IN OUT`, `xxd IN OUT`).
    AfterFirst,
}

/// A set of glob patterns, and path sets it includes by name (`@name`,
/// resolved when matching, so a later layer that adds to a set also
/// reaches the rules of an earlier one).
#[derive(Debug, Clone, Default)]
pub(crate) struct Globs {
    patterns: Vec<Glob>,
    sets: Vec<String>,
    case_insensitive: bool,
}

/// One glob pattern, with a direct comparison for the shapes most of
/// them have (`*.pem`, `/etc/*`, `*shadow*`, a plain word): the classifier
/// matches every word of a command against hundreds of them.
#[derive(Debug, Clone)]
struct Glob {
    pattern: Pattern,
    fast: Option<Fast>,
}

#[derive(Debug, Clone)]
enum Fast {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Contains(String),
}

impl Glob {
    fn new(text: &str) -> Result<Self, glob::PatternError> {
        let pattern = Pattern::new(text)?;
        let plain = |t: &str| !t.contains(['*', '?', '[', ']']);
        let fast = match (text.strip_prefix('*'), text.strip_suffix('*')) {
            _ if plain(text) => Some(Fast::Exact(text.to_string())),
            (Some(rest), _) if rest.len() > 1 => match rest.strip_suffix('*') {
                Some(middle) if plain(middle) => Some(Fast::Contains(middle.to_string())),
                _ if plain(rest) => Some(Fast::Suffix(rest.to_string())),
                _ => None,
            },
            (None, Some(head)) if plain(head) => Some(Fast::Prefix(head.to_string())),
            _ => None,
        };
        Ok(Self { pattern, fast })
    }

    fn matches(&self, text: &str, options: MatchOptions) -> bool {
        let fold = !options.case_sensitive;
        let eq = |a: &str, b: &str| {
            if fold {
                a.eq_ignore_ascii_case(b)
            } else {
                a == b
            }
        };
        match &self.fast {
            Some(Fast::Exact(p)) => eq(text, p),
            Some(Fast::Prefix(p)) => text.get(..p.len()).is_some_and(|t| eq(t, p)),
            Some(Fast::Suffix(p)) => text
                .len()
                .checked_sub(p.len())
                .and_then(|at| text.get(at..))
                .is_some_and(|t| eq(t, p)),
            Some(Fast::Contains(p)) if !fold => text.contains(p.as_str()),
            _ => self.pattern.matches_with(text, options),
        }
    }
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
        self.patterns.iter().any(|p| p.matches(text, options))
            || self.sets.iter().any(|name| {
                paths
                    .get(name)
                    .is_some_and(|set| set.patterns.iter().any(|p| p.matches(text, options)))
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
    /// Globs some operand must match.
    pub operands_any: Globs,
    /// Globs no operand may match (and none may be computed).
    pub operands_none: Globs,
    /// Globs the last operand (the destination) must match.
    pub destination_any: Globs,
    /// It matches only when the command's standard input is given (a
    /// file, a pipe, a here-document), not inherited.
    pub input_given: bool,
    /// It matches only when some word holds another command's output
    /// (`curl "…?d=$(cat file)"`).
    pub output_given: bool,
    /// Options naming the directory it extracts an archive into; without
    /// one, it extracts where it runs.
    pub extracts_into: Vec<String>,
    /// The options that keep it read-only: every option must be one.
    pub options: Option<Allowlist>,
    pub option_style: OptionStyle,
    /// Globs some source operand must match (every operand but the last,
    /// the destination, or every operand when a write option names it).
    pub sources_any: Globs,
    pub no_operands: bool,
    pub no_args: bool,
    pub known_args: bool,
    pub writes: Option<Writes>,
    /// The files it writes are emptied first, as by `>`.
    pub truncates: bool,
    /// It adds to the files it writes (`tee -a`); otherwise it replaces
    /// them with another file or an edited copy (`cp`, `mv`, `ln -f`).
    pub appends: bool,
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
    pub service_dirs: Vec<String>,
    pub shells: BTreeSet<String>,
    pub shell_options_with_value: BTreeSet<String>,
    pub interpreters: BTreeSet<String>,
    pub interpreter_code_options: Vec<String>,
    pub interpreter_info_options: Vec<String>,
    pub interpreter_server_modules: Vec<String>,
    pub interpreter_options_with_value: Vec<String>,
    pub paths: BTreeMap<String, Globs>,
    pub option_values: BTreeMap<String, BTreeSet<String>>,
    pub wrappers: BTreeMap<String, Wrapper>,
    pub programs: BTreeMap<String, ProgramDef>,
    pub rules: Vec<Rule>,
    /// Per program, the positions in `rules` of the rules naming it; a
    /// command is matched against these and `rules_for_any` only.
    pub rules_by_command: BTreeMap<String, Vec<usize>>,
    /// The positions of the rules naming no program.
    pub rules_for_any: Vec<usize>,
    /// Every rule id, to refuse a second rule of the same id.
    pub rule_ids: BTreeSet<String>,
    pub harmless_variables: Globs,
    pub command_variables: Globs,
    pub code_variables: Globs,
    pub option_variables: BTreeMap<String, String>,
    pub loader_variables: Globs,
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
        self.service_dirs.extend(s.service_dirs);
        self.shells.extend(s.shells);
        self.shell_options_with_value
            .extend(s.shell_options_with_value);
        self.interpreters.extend(s.interpreters);
        self.interpreter_code_options
            .extend(s.interpreter_code_options);
        self.interpreter_info_options
            .extend(s.interpreter_info_options);
        self.interpreter_server_modules
            .extend(s.interpreter_server_modules);
        self.interpreter_options_with_value
            .extend(s.interpreter_options_with_value);
        self.option_variables.extend(s.option_variables);
        for (list, into, key) in [
            (
                &s.command_variables,
                &mut self.command_variables,
                "command-variables",
            ),
            (
                &s.code_variables,
                &mut self.code_variables,
                "code-variables",
            ),
            (
                &s.harmless_variables,
                &mut self.harmless_variables,
                "harmless-variables",
            ),
            (
                &s.loader_variables,
                &mut self.loader_variables,
                "loader-variables",
            ),
        ] {
            let globs = compile_globs(list, false).map_err(|e| TableError {
                span: None,
                message: format!("shell.{key}: {e}"),
            })?;
            into.patterns.extend(globs.patterns);
        }
        for (name, program) in tables.programs {
            for option in program
                .runs
                .iter()
                .chain(&program.code)
                .chain(&program.loads)
                .chain(&program.writes)
                .chain(&program.in_place)
            {
                let bare = option.strip_prefix('^').unwrap_or(option);
                let plain = bare.starts_with('+') || (bare.len() >= 2 && bare.starts_with('-'));
                if !plain || option.contains(char::is_whitespace) || bare.starts_with("---") {
                    return Err(TableError {
                        span: None,
                        message: format!(
                            "programs.{name}: `{option}` is not an option as written on a command line (`-o`, `--output`, `-fprint`, or `+` for every `+` word)"
                        ),
                    });
                }
            }
            // Two files naming one program add up: a table in one file
            // never silently takes away what another says it does.
            let entry = self.programs.entry(name).or_default();
            entry.runs.extend(program.runs);
            entry.code.extend(program.code);
            entry.loads.extend(program.loads);
            entry.writes.extend(program.writes);
            entry.in_place.extend(program.in_place);
            entry.setting_options.extend(program.setting_options);
            entry.command_settings.extend(program.command_settings);
            entry.operands_written |= program.operands_written;
            entry.plus_options |= program.plus_options;
            entry.bundled_first |= program.bundled_first;
            if program.language.is_some() {
                entry.language = program.language;
            }
        }
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
            self.rule_ids.insert(rule.id.clone());
            let at = self.rules.len();
            if rule.commands.is_empty() {
                self.rules_for_any.push(at);
            }
            for command in &rule.commands {
                self.rules_by_command
                    .entry(command.clone())
                    .or_default()
                    .push(at);
            }
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
                &rule.operands_any,
                &rule.operands_none,
                &rule.destination_any,
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
        if self.rule_ids.contains(&id) {
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
        if def.risk == RiskClass::ReadOnly && def.options.is_none() {
            return Err(format!(
                "rule `{id}`: a read-only rule lists the options that keep its programs read-only (`options = [\"-l\", \"-n <lines>\"]`, or `[]` for none): any other option, or one computed when the line runs, makes it not match"
            ));
        }
        let options = match &def.options {
            Some(list) => Some(Allowlist::compile(list).map_err(|e| format!("rule `{id}`: {e}"))?),
            None => None,
        };
        if def.truncates && def.appends {
            return Err(format!(
                "rule `{id}`: `truncates` and `appends` say opposite things about the files it writes"
            ));
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
            operands_any: globs("operands-any", &def.operands_any)?,
            destination_any: globs("destination-any", &def.destination_any)?,
            input_given: def.input_given,
            output_given: def.output_given,
            extracts_into: def.extracts_into,
            operands_none: globs("operands-none", &def.operands_none)?,
            options,
            option_style: def.option_style,
            sources_any: globs("sources-any", &def.sources_any)?,
            no_operands: def.no_operands,
            no_args: def.no_args,
            known_args: def.known_args,
            writes: def.writes,
            truncates: def.truncates,
            appends: def.appends,
            write_options: def.write_options,
            takes_host_down: def.takes_host_down,
            reads_credentials: def.reads_credentials,
            risk: def.risk,
            reason: def.reason,
            id,
        })
    }

    /// The rules that can match a command running `program`, in the order
    /// they were written (the first of the riskiest decides).
    pub fn rules_for(&self, program: &str) -> impl Iterator<Item = &Rule> {
        let named = self
            .rules_by_command
            .get(program)
            .map_or(&[][..], Vec::as_slice);
        let mut named = named.iter().copied().peekable();
        let mut any = self.rules_for_any.iter().copied().peekable();
        std::iter::from_fn(move || {
            let next = match (named.peek(), any.peek()) {
                (Some(a), Some(b)) if a < b => named.next(),
                (Some(_), None) => named.next(),
                (_, Some(_)) => any.next(),
                (None, None) => None,
            };
            next.map(|i| &self.rules[i])
        })
    }

    /// Whether `word` is a long option some allowlist of `program` names
    /// (then it is that option, not an abbreviation of another).
    pub fn is_long_option_of(&self, program: &str, word: &str) -> bool {
        self.rules_for(program)
            .filter_map(|r| r.options.as_ref())
            .any(|list| list.names(word))
    }

    /// Whether some rule names `program`.
    pub fn names_program(&self, program: &str) -> bool {
        self.rules_by_command.contains_key(program)
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
            patterns.push(Glob::new(text).map_err(|e| format!("`{text}`: {}", e.msg))?);
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
