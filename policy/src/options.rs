//! Option allowlists: how a read-only rule says which options keep a
//! program read-only, and how a command's words are read against one.
//!
//! Read-only commands run without approval, so a program in a read-only
//! rule is trusted only with the options that rule lists (codex's exec
//! policy does the same for its safe commands). Everything else — an
//! option not listed, an abbreviation of a listed one, a word computed
//! when the line runs that could be an option — makes the rule not match,
//! and the refusal names the word. Being strict costs an operator an
//! approval now and then; being lenient hands a reader's flag that writes,
//! or runs, to whoever writes the command line.
//!
//! An entry is written as the option and, when it takes a value, a
//! placeholder:
//!
//! | entry | accepts |
//! |---|---|
//! | `-l` | `-l`, and `l` inside a cluster (`-la`) |
//! | `-n <lines>` | `-n 5`, `-n5`, a cluster ending in `n` (`-an 5`) |
//! | `-i[<suffix>]` | `-i`, `-i.bak` (an attached value only) |
//! | `--all` | `--all` only (`--all=x` is refused) |
//! | `--lines <n>` | `--lines 5`, `--lines=5` |
//! | `--color[=<when>]` | `--color`, `--color=never` |
//! | `-name <pattern>` | `-name '*.log'` (one dash, several letters: the word itself) |
//! | `+short` | `+short` (a `+` option, for programs that take them) |
//! | `+time=<n>` | `+time=3` |
//! | `-<number>` | `-5`, `-20` (`head -5`) |
//! | `+<number>` | `+5` |
//! | `<any>` | every word: only for programs that read no option at all and can do nothing with their arguments but print or ignore them (`echo`, `:`) |
//!
//! Short options cluster in the getopt style (`-la` is `-l -a`; a letter
//! that takes a value ends the cluster and takes the rest, or the next
//! word). Programs whose options are one word each (`find -name`, `ip
//! -br`) say `option-style = "single-dash"`: a word is then matched whole,
//! never split into letters. `--` ends the options; `-` alone is an
//! operand (standard input).

use serde::Deserialize;

use crate::shell::Arg;

/// How a program reads its option words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum OptionStyle {
    /// getopt: short options cluster (`-la`), long ones start with `--`.
    #[default]
    Getopt,
    /// Every option is one word (`find -name`, `ip -brief`): a word is
    /// matched whole, never split into letters.
    SingleDash,
}

/// Whether an option takes a value, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takes {
    /// No value.
    Nothing,
    /// A value: attached (`-n5`, `--lines=5`) or the next word.
    Value,
    /// An optional value, attached only (`--color=never`, `-i.bak`).
    Attached,
}

/// A compiled `options` list.
#[derive(Debug, Clone, Default)]
pub(crate) struct Allowlist {
    /// Whole option words (`-n`, `--lines`, `-name`, `+short`), sorted.
    exact: Words,
    /// `+name=` prefixes whose value is attached (`+time=3`).
    plus_valued: Vec<String>,
    /// Short options by letter, for clusters.
    short: Vec<(char, Takes)>,
    /// `-<number>` is accepted.
    dash_number: bool,
    /// `+<number>` is accepted.
    plus_number: bool,
    /// Every word is accepted (`<any>`).
    any: bool,
}

/// Option words and what they take, sorted for lookup: one allocation a
/// word, as there are tens of thousands of them in the built-in tables.
#[derive(Debug, Clone, Default)]
struct Words(Vec<(Box<str>, Takes)>);

impl Words {
    fn get(&self, word: &str) -> Option<Takes> {
        self.0
            .binary_search_by(|(w, _)| (**w).cmp(word))
            .ok()
            .map(|i| self.0[i].1)
    }

    fn finish(&mut self) {
        self.0.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        self.0.dedup_by(|a, b| a.0 == b.0);
    }
}

/// Why a command's words fail an allowlist: the word, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The word as written (`-o`, `--output=x`, `"$x"`).
    pub word: String,
    /// For a letter inside a cluster, the letter as an option (`-o` in
    /// `-lo`).
    pub letter: Option<String>,
    /// The word is computed when the line runs.
    pub computed: bool,
}

impl Refusal {
    /// Says why `program` is not read-only with this word.
    pub fn reason(&self, program: &str) -> String {
        if self.computed {
            return format!(
                "`{}` is computed when the line runs and could be an option of `{program}` that writes or runs something: only options the policy lists keep `{program}` read-only (put `--` before operands computed at run time)",
                self.word
            );
        }
        match &self.letter {
            Some(letter) => format!(
                "`{letter}` (in `{}`) is not an option that keeps `{program}` read-only",
                self.word
            ),
            None => format!(
                "`{}` is not an option that keeps `{program}` read-only",
                self.word
            ),
        }
    }
}

impl Allowlist {
    /// Compiles `entries` (see the module doc); the error names the entry.
    pub fn compile(entries: &[String]) -> Result<Self, String> {
        let mut list = Self::default();
        for entry in entries {
            let entry = entry.trim();
            let bad = |why: &str| Err(format!("option `{entry}`: {why}"));
            if entry == "-<number>" {
                list.dash_number = true;
                continue;
            }
            if entry == "+<number>" {
                list.plus_number = true;
                continue;
            }
            if entry == "<any>" {
                list.any = true;
                continue;
            }
            let (name, takes) = if let Some((name, placeholder)) = entry.split_once(' ') {
                if !is_placeholder(placeholder) {
                    return bad("a value is written as one placeholder, e.g. `-n <lines>`");
                }
                (name, Takes::Value)
            } else if let Some((name, inner)) =
                entry.strip_suffix(']').and_then(|e| e.split_once('['))
            {
                let long = name.starts_with("--");
                let placeholder = if long {
                    inner.strip_prefix('=')
                } else {
                    Some(inner)
                };
                if !placeholder.is_some_and(is_placeholder) {
                    return bad(
                        "an optional value is attached with `=` to a long option (`--color[=<when>]`) and directly to a short one (`-i[<suffix>]`)",
                    );
                }
                (name, Takes::Attached)
            } else if let Some((name, placeholder)) =
                entry.strip_prefix('+').and_then(|e| e.split_once('='))
            {
                if !is_placeholder(placeholder) {
                    return bad("a `+` option's value is written `+time=<n>`");
                }
                list.plus_valued.push(format!("+{name}="));
                continue;
            } else {
                (entry, Takes::Nothing)
            };
            let body = name.trim_start_matches(['-', '+']);
            let dashes = name.len() - body.len();
            if body.is_empty()
                || !(name.starts_with('-') || name.starts_with('+'))
                || dashes > 2
                || (name.starts_with('+') && dashes > 1)
                || body.contains(|c: char| c.is_whitespace() || c == '=')
            {
                return bad(
                    "an option starts with `-`, `--` or `+` (e.g. `-l`, `--all`, `+short`)",
                );
            }
            if dashes == 1 && name.starts_with('-') && body.chars().count() == 1 {
                let letter = body.chars().next().unwrap_or('-');
                list.short.push((letter, takes));
            }
            list.exact.0.push((name.into(), takes));
        }
        list.exact.finish();
        Ok(list)
    }

    /// Whether it takes every word (`<any>`).
    #[cfg(test)]
    pub fn takes_anything(&self) -> bool {
        self.any
    }

    /// Whether it names the option `word` (`--lines`), as written.
    pub fn names(&self, word: &str) -> bool {
        self.exact.get(word).is_some()
    }

    /// Reads `words` (a command's words after its name) against this list:
    /// the operands, or why it fails. `plus_options`: the program takes
    /// `+` words as options (`less +F`), so such a word must be listed.
    pub fn read<'a>(
        &self,
        words: &'a [Arg],
        style: OptionStyle,
        plus_options: bool,
    ) -> Result<Vec<&'a Arg>, Refusal> {
        if self.any {
            return Ok(words.iter().collect());
        }
        let mut operands = Vec::new();
        let mut options_done = false;
        let mut i = 0;
        while i < words.len() {
            let arg = &words[i];
            i += 1;
            // An unquoted expansion can split into several words when the
            // line runs, an option among them, wherever it stands: as an
            // operand, after `--` or as an option's value.
            if arg.splits() {
                return Err(Refusal {
                    word: arg.raw.clone(),
                    letter: None,
                    computed: true,
                });
            }
            if options_done {
                operands.push(arg);
                continue;
            }
            let Some(word) = arg.literal.as_deref().filter(|_| !arg.globbed()) else {
                if arg.may_be_option(plus_options) {
                    return Err(Refusal {
                        word: arg.raw.clone(),
                        letter: None,
                        computed: true,
                    });
                }
                operands.push(arg);
                continue;
            };
            let refuse = |letter: Option<String>| Refusal {
                word: arg.raw.clone(),
                letter,
                computed: false,
            };
            if word == "--" {
                options_done = true;
                continue;
            }
            let is_plus = word.starts_with('+') && word.len() > 1 && plus_options;
            let option_word = word.starts_with('-') && word.len() > 1;
            if !option_word && !is_plus {
                operands.push(arg);
                continue;
            }
            if is_plus {
                let digits = word[1..].chars().all(|c| c.is_ascii_digit());
                let accepted = self.exact.get(word) == Some(Takes::Nothing)
                    || (digits && self.plus_number)
                    || self
                        .plus_valued
                        .iter()
                        .any(|p| word.starts_with(p.as_str()));
                if !accepted {
                    return Err(refuse(None));
                }
                continue;
            }
            if word[1..].chars().all(|c| c.is_ascii_digit()) && self.dash_number {
                continue;
            }
            if let Some(long) = word.strip_prefix("--") {
                let (name, attached) = match long.split_once('=') {
                    Some((n, v)) => (n, Some(v)),
                    None => (long, None),
                };
                let name = format!("--{name}");
                match (self.exact.get(&name), attached) {
                    (Some(Takes::Nothing), None) | (Some(Takes::Attached), _) => {}
                    (Some(Takes::Value), Some(_)) => {}
                    (Some(Takes::Value), None) => i = take_value(words, i)?,
                    (Some(Takes::Nothing), Some(_)) | (None, _) => return Err(refuse(None)),
                }
                continue;
            }
            // One dash: the whole word first (`-name`, `-n`), then, in the
            // getopt style, a cluster of letters.
            if let Some(takes) = self.exact.get(word) {
                if takes == Takes::Value {
                    i = take_value(words, i)?;
                }
                continue;
            }
            if style == OptionStyle::SingleDash {
                return Err(refuse(None));
            }
            let body: Vec<char> = word[1..].chars().collect();
            let mut j = 0;
            while j < body.len() {
                let letter = body[j];
                let Some(takes) = self
                    .short
                    .iter()
                    .find(|(l, _)| *l == letter)
                    .map(|(_, t)| t)
                else {
                    let cluster = body.len() > 1;
                    return Err(refuse(cluster.then(|| format!("-{letter}"))));
                };
                match takes {
                    Takes::Nothing => j += 1,
                    Takes::Attached => break,
                    Takes::Value => {
                        if j + 1 == body.len() {
                            i = take_value(words, i)?;
                        }
                        break;
                    }
                }
            }
        }
        Ok(operands)
    }
}

/// An option of a program's table (`[programs.<name>]`) found among a
/// command's words.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// The option as the table lists it.
    pub option: String,
    /// The word it was found in, as written.
    pub written: String,
    /// Its value: attached (`-ofile`, `--output=file`), else the next
    /// word when the option takes one.
    pub value: Option<Arg>,
}

/// Finds the options of `listed` among `words` (a command's words after
/// its name), up to `--`. Spellings are read as getopt would, and then
/// some: a long option's abbreviation (`--out` for `--output`) and a short
/// one anywhere in a cluster of letters (`-nro`) count, since reading a
/// harmless word as a dangerous option only ever classifies higher.
/// `exact` says which long options the program is known to have (from its
/// allowlists): such a word is that option, never an abbreviation of
/// another (`--list` is not `--listed-incremental`).
pub(crate) fn find(
    words: &[Arg],
    listed: &[String],
    takes_value: bool,
    exact: &dyn Fn(&str) -> bool,
) -> Vec<Found> {
    let mut found = Vec::new();
    let next = |i: usize| {
        if takes_value {
            words.get(i + 1).cloned()
        } else {
            None
        }
    };
    for (i, arg) in words.iter().enumerate() {
        let Some(word) = arg.literal.as_deref() else {
            continue;
        };
        if word == "--" {
            break;
        }
        for option in listed {
            let value = if option.starts_with('+') {
                // `+` is every `+` word; `+!` those starting so.
                word.strip_prefix(option.as_str())
                    .filter(|rest| !rest.is_empty() || option.len() > 1)
                    .map(|_| Some(Arg::literal(&word[1..])))
            } else if option.starts_with("--") {
                let (name, attached) = match word.split_once('=') {
                    Some((n, v)) => (n, Some(v)),
                    None => (word, None),
                };
                let abbreviates = name.len() > 2
                    && name.starts_with("--")
                    && option.starts_with(name)
                    && !exact(name);
                (name == option || abbreviates)
                    .then(|| attached.map(Arg::literal).or_else(|| next(i)))
            } else if option.chars().count() > 2 {
                // One dash, several letters (`-fprint`): the word itself.
                if word == option {
                    Some(next(i))
                } else {
                    word.strip_prefix(option.as_str())
                        .and_then(|rest| rest.strip_prefix('='))
                        .map(|v| Some(Arg::literal(v)))
                }
            } else {
                let letter = option.chars().nth(1).unwrap_or('-');
                match word.strip_prefix('-') {
                    Some(body) if !body.starts_with('-') && !body.is_empty() => {
                        let at = body
                            .char_indices()
                            .take_while(|(_, c)| c.is_ascii_alphanumeric() || *c == letter)
                            .find(|(_, c)| *c == letter);
                        at.map(|(k, c)| {
                            let rest = &body[k + c.len_utf8()..];
                            if rest.is_empty() {
                                next(i)
                            } else if takes_value {
                                Some(Arg::literal(rest))
                            } else {
                                None
                            }
                        })
                    }
                    _ => None,
                }
            };
            if let Some(value) = value {
                found.push(Found {
                    option: option.clone(),
                    written: arg.raw.clone(),
                    value,
                });
            }
        }
    }
    found
}

/// Takes the option value at `at` (when there is one) and returns where
/// the next word is; a value that can split into several words when the
/// line runs is refused, as one of them could be an option.
fn take_value(words: &[Arg], at: usize) -> Result<usize, Refusal> {
    match words.get(at) {
        Some(value) if value.splits() => Err(Refusal {
            word: value.raw.clone(),
            letter: None,
            computed: true,
        }),
        Some(_) => Ok(at + 1),
        None => Ok(at),
    }
}

/// `<name>`: a value placeholder.
fn is_placeholder(text: &str) -> bool {
    text.len() > 2
        && text.starts_with('<')
        && text.ends_with('>')
        && !text[1..text.len() - 1].contains(['<', '>', ' '])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<Arg> {
        line.split_whitespace().map(Arg::literal).collect()
    }

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::compile(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn operands(list: &Allowlist, line: &str) -> Result<Vec<String>, Refusal> {
        let w = words(line);
        list.read(&w, OptionStyle::Getopt, false)
            .map(|ops| ops.iter().map(|a| a.raw.clone()).collect())
    }

    #[test]
    fn listed_options_pass_in_every_spelling_getopt_accepts() {
        let l = list(&[
            "-l",
            "-a",
            "-n <lines>",
            "--lines <n>",
            "--color[=<when>]",
            "-i[<suffix>]",
            "-<number>",
        ]);
        for (line, want) in [
            ("-la /var/log", vec!["/var/log"]),
            ("-n 5 f", vec!["f"]),
            ("-n5 f", vec!["f"]),
            ("-an 5 f", vec!["f"]),
            ("--lines 5 f", vec!["f"]),
            ("--lines=5 f", vec!["f"]),
            ("--color f", vec!["f"]),
            ("--color=never f", vec!["f"]),
            ("-i.bak f", vec!["f"]),
            ("-20 f", vec!["f"]),
            ("-- -o f", vec!["-o", "f"]),
            ("- f", vec!["-", "f"]),
            ("f -l g", vec!["f", "g"]),
        ] {
            assert_eq!(operands(&l, line).unwrap(), want, "{line}");
        }
    }

    #[test]
    fn anything_else_is_refused_naming_the_word() {
        let l = list(&["-l", "-a", "--lines <n>", "--all"]);
        for (line, word, letter) in [
            ("-o f", "-o", None),
            ("-lo f", "-lo", Some("-o")),
            ("--output=f", "--output=f", None),
            ("--out f", "--out", None),
            ("--all=x", "--all=x", None),
            ("f --pre rm", "--pre", None),
        ] {
            let refusal = operands(&l, line).unwrap_err();
            assert_eq!(refusal.word, word, "{line}");
            assert_eq!(refusal.letter.as_deref(), letter, "{line}");
            assert!(refusal.reason("tree").contains("keeps `tree` read-only"));
        }
    }

    #[test]
    fn single_dash_words_are_never_split() {
        let l = list(&["-name <pattern>", "-print", "-s"]);
        let w = words("/var -name x -print");
        assert_eq!(l.read(&w, OptionStyle::SingleDash, false).unwrap().len(), 1);
        let w = words("/var -ss");
        assert!(l.read(&w, OptionStyle::SingleDash, false).is_err());
        // In the getopt style the same word is a cluster.
        assert!(l.read(&w, OptionStyle::Getopt, false).is_ok());
    }

    #[test]
    fn plus_words_are_options_only_for_programs_that_take_them() {
        let l = list(&["+short", "+time=<n>", "+<number>"]);
        let w = words("+short +time=3 +5 +F");
        assert_eq!(l.read(&w, OptionStyle::Getopt, false).unwrap().len(), 4);
        let err = l.read(&w, OptionStyle::Getopt, true).unwrap_err();
        assert_eq!(err.word, "+F");
    }

    #[test]
    fn table_options_are_found_in_every_spelling() {
        let listed = [
            "-o".to_string(),
            "--output".to_string(),
            "-fprint".to_string(),
        ];
        for (line, value) in [
            ("-o /etc/x", "/etc/x"),
            ("-o/etc/x", "/etc/x"),
            ("-nro /etc/x", "/etc/x"),
            ("--output /etc/x", "/etc/x"),
            ("--output=/etc/x", "/etc/x"),
            ("--out=/etc/x", "/etc/x"),
            ("--outp /etc/x", "/etc/x"),
            ("-fprint /etc/x", "/etc/x"),
        ] {
            let w = words(line);
            let found = find(&w, &listed, true, &|_| false);
            assert_eq!(found.len(), 1, "{line}: {found:?}");
            assert_eq!(found[0].value.as_ref().unwrap().raw, value, "{line}");
        }
        for line in ["-- -o x", "--outer x", "-n x", "x"] {
            assert!(
                find(&words(line), &listed, true, &|_| false).is_empty(),
                "{line}"
            );
        }
        let in_place = ["-i".to_string(), "--in-place".to_string()];
        for line in [
            "-i s/a/b/ f",
            "-i.bak s/a/b/ f",
            "-ni s/a/b/ f",
            "--in-place=.b x",
        ] {
            assert_eq!(
                find(&words(line), &in_place, false, &|_| false).len(),
                1,
                "{line}"
            );
        }
    }

    #[test]
    fn malformed_entries_are_named() {
        for entry in [
            "o",
            "-n lines",
            "--color[<when>]",
            "-i[=<s>]",
            "---x",
            "+t=x",
        ] {
            let e = Allowlist::compile(&[entry.to_string()]).unwrap_err();
            assert!(e.contains(entry), "{entry}: {e}");
        }
    }
}
