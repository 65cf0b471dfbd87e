//! The small languages that shell one-liners carry as arguments: sed
//! scripts and awk programs. Both can run commands (sed `e`, awk
//! `system()` and pipes) and write files (sed `w`, awk `print >`), so a
//! sed or awk command is read-only only if its script does neither; what
//! it runs is classified as the command it is when the script spells it
//! out, and is code the classifier cannot read when it does not.
//!
//! The readers here are deliberately conservative. Where sed could read a
//! script two ways (its delimiter inside a bracket expression), both
//! readings are taken and their effects added up; a script no reading
//! understands is unreadable. awk's `/` is a regular expression where an
//! operand may start and a division elsewhere, as awk's own grammar has
//! it.

/// Something a script does besides reading its input and printing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Runs a command: its text when the script spells it out, `None` when
    /// it is computed (sed's `e` without a command, awk's `system(x)`).
    Runs(Option<String>),
    /// Writes a file: its name when spelled out.
    Writes(Option<String>),
    /// Reads the environment, where the secrets handed to commands are
    /// (awk's `ENVIRON`).
    Environment,
    /// Opens a network connection (gawk's `/inet/…` special files).
    Network,
    /// Loads code from elsewhere (gawk's `@load`, `@include`).
    Loads(String),
}

/// What a script does, or why it cannot be read.
pub(crate) type Reading = Result<Vec<Effect>, String>;

/// Reads a sed script (GNU sed's syntax, which includes POSIX's).
pub(crate) fn sed(script: &str) -> Reading {
    let mut effects = Vec::new();
    let mut failure = None;
    let mut read = false;
    // A reading that fails is one under which sed itself stops at the
    // script, so it runs nothing; the effects are those of the others.
    for brackets in [false, true] {
        match Sed::new(script, brackets).read() {
            Ok(found) => {
                read = true;
                for effect in found {
                    if !effects.contains(&effect) {
                        effects.push(effect);
                    }
                }
            }
            Err(e) => failure = Some(e),
        }
    }
    match (read, failure) {
        (false, Some(e)) => Err(e),
        _ => Ok(effects),
    }
}

struct Sed<'a> {
    text: &'a [u8],
    at: usize,
    /// A bracket expression (`[/]`) keeps the delimiter inside it.
    brackets: bool,
    effects: Vec<Effect>,
}

impl<'a> Sed<'a> {
    fn new(script: &'a str, brackets: bool) -> Self {
        Self {
            text: script.as_bytes(),
            at: 0,
            brackets,
            effects: Vec::new(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.at += 1;
        Some(c)
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    /// The rest of the line (for `w`, `r`, `e`, `a`…), without the newline.
    fn rest_of_line(&mut self) -> String {
        let start = self.at;
        while let Some(c) = self.peek() {
            if c == b'\n' {
                break;
            }
            // `a\` text goes on over escaped newlines.
            if c == b'\\' && self.text.get(self.at + 1) == Some(&b'\n') {
                self.at += 2;
                continue;
            }
            self.at += 1;
        }
        String::from_utf8_lossy(&self.text[start..self.at]).into_owned()
    }

    /// A label or version word: up to `;`, a newline or a blank.
    fn word(&mut self) {
        self.skip_blanks();
        while let Some(c) = self.peek() {
            if matches!(c, b';' | b'\n' | b'}') {
                break;
            }
            self.at += 1;
        }
    }

    /// A regular expression or replacement ended by `delim`.
    fn delimited(&mut self, delim: u8) -> Result<(), String> {
        let mut in_bracket = false;
        loop {
            let Some(c) = self.next() else {
                return Err(format!(
                    "a `{}`-delimited part is not closed",
                    char::from(delim)
                ));
            };
            if c == b'\\' {
                self.next();
                continue;
            }
            if in_bracket {
                if c == b']' {
                    in_bracket = false;
                }
                continue;
            }
            if c == delim {
                return Ok(());
            }
            if self.brackets && c == b'[' {
                in_bracket = true;
                // `[]…]` and `[^]…]` keep a leading `]`.
                if self.peek() == Some(b'^') {
                    self.at += 1;
                }
                if self.peek() == Some(b']') {
                    self.at += 1;
                }
            }
        }
    }

    fn address(&mut self) -> Result<(), String> {
        match self.peek() {
            Some(b'0'..=b'9') => {
                while matches!(self.peek(), Some(b'0'..=b'9' | b'~')) {
                    self.at += 1;
                }
            }
            Some(b'$') => self.at += 1,
            Some(b'/') => {
                self.at += 1;
                self.delimited(b'/')?;
                while matches!(self.peek(), Some(b'I' | b'M')) {
                    self.at += 1;
                }
            }
            Some(b'\\') => {
                self.at += 1;
                let delim = self.next().ok_or("an address ends after `\\`")?;
                self.delimited(delim)?;
                while matches!(self.peek(), Some(b'I' | b'M')) {
                    self.at += 1;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn read(mut self) -> Reading {
        loop {
            while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b';' | b'}')) {
                self.at += 1;
            }
            let Some(_) = self.peek() else {
                return Ok(self.effects);
            };
            if self.peek() == Some(b'#') {
                self.rest_of_line();
                continue;
            }
            self.address()?;
            self.skip_blanks();
            if self.peek() == Some(b',') {
                self.at += 1;
                self.skip_blanks();
                if matches!(self.peek(), Some(b'+' | b'~')) {
                    self.at += 1;
                }
                self.address()?;
                self.skip_blanks();
            }
            while self.peek() == Some(b'!') {
                self.at += 1;
                self.skip_blanks();
            }
            let Some(command) = self.next() else {
                return Err("an address without a command".into());
            };
            match command {
                b'{' => {}
                b'=' | b'd' | b'D' | b'g' | b'G' | b'h' | b'H' | b'n' | b'N' | b'p' | b'P'
                | b'x' | b'z' | b'F' => {}
                b'q' | b'Q' | b'l' | b'L' | b':' | b'b' | b't' | b'T' | b'v' => self.word(),
                b'a' | b'i' | b'c' => {
                    self.rest_of_line();
                }
                b'r' | b'R' => {
                    self.rest_of_line();
                }
                b'w' | b'W' => {
                    let file = self.rest_of_line();
                    self.effects.push(Effect::Writes(named(&file)));
                }
                b'e' => {
                    let command = self.rest_of_line();
                    let command = command.trim();
                    // `e` alone runs the pattern space: text that comes
                    // from the input, not from the script.
                    self.effects.push(Effect::Runs(
                        (!command.is_empty()).then(|| command.to_string()),
                    ));
                }
                b's' => {
                    let delim = self.next().ok_or("`s` without a delimiter")?;
                    if matches!(delim, b'\n' | b'\\') {
                        return Err("`s` with a newline or backslash as delimiter".into());
                    }
                    self.delimited(delim)?;
                    self.delimited(delim)?;
                    loop {
                        match self.peek() {
                            Some(b'g' | b'p' | b'i' | b'I' | b'm' | b'M' | b'0'..=b'9') => {
                                self.at += 1;
                            }
                            // The replacement is run as a command.
                            Some(b'e') => {
                                self.at += 1;
                                self.effects.push(Effect::Runs(None));
                            }
                            Some(b'w') => {
                                self.at += 1;
                                let file = self.rest_of_line();
                                self.effects.push(Effect::Writes(named(&file)));
                                break;
                            }
                            _ => break,
                        }
                    }
                }
                b'y' => {
                    let delim = self.next().ok_or("`y` without a delimiter")?;
                    self.delimited(delim)?;
                    self.delimited(delim)?;
                }
                other => {
                    return Err(format!(
                        "`{}` is not a sed command the classifier reads",
                        char::from(other).escape_default()
                    ));
                }
            }
        }
    }
}

/// A file name as sed and awk take it: `None` when empty.
fn named(file: &str) -> Option<String> {
    let file = file.trim();
    (!file.is_empty()).then(|| file.to_string())
}

/// Reads an awk program (POSIX awk with gawk's extensions).
pub(crate) fn awk(program: &str) -> Reading {
    let mut effects = Vec::new();
    for effect in awk_effects(&tokens(program)?) {
        if !effects.contains(&effect) {
            effects.push(effect);
        }
    }
    Ok(effects)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Str(String),
    Number,
    Regex,
    /// An operator or punctuation, as written (`|`, `|&`, `>`, `>>`, `(`).
    Op(String),
    /// A statement ends: `;` or a newline.
    End,
}

/// Splits an awk program into tokens: a `/` where an operand may start
/// begins a regular expression, elsewhere it divides.
fn tokens(program: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = program.chars().collect();
    let mut out: Vec<Token> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\r' => i += 1,
            '\\' if chars.get(i + 1) == Some(&'\n') => i += 2,
            '\n' | ';' => {
                out.push(Token::End);
                i += 1;
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '"' => {
                let mut text = String::new();
                i += 1;
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err("a string is not closed".into());
                    };
                    i += 1;
                    match c {
                        '"' => break,
                        '\\' => {
                            let Some(&e) = chars.get(i) else {
                                return Err("a string ends in `\\`".into());
                            };
                            i += 1;
                            text.push(match e {
                                'n' => '\n',
                                't' => '\t',
                                other => other,
                            });
                        }
                        '\n' => return Err("a string runs over a line".into()),
                        other => text.push(other),
                    }
                }
                out.push(Token::Str(text));
            }
            '/' if operand_may_start(out.last()) => {
                i += 1;
                let mut in_bracket = false;
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err("a regular expression is not closed".into());
                    };
                    i += 1;
                    match c {
                        '\\' => i += 1,
                        '[' if !in_bracket => in_bracket = true,
                        ']' if in_bracket => in_bracket = false,
                        '/' if !in_bracket => break,
                        '\n' => return Err("a regular expression runs over a line".into()),
                        _ => {}
                    }
                }
                out.push(Token::Regex);
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                out.push(Token::Word(chars[start..i].iter().collect()));
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
                out.push(Token::Number);
            }
            _ => {
                let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
                let op = if [
                    "|&", "||", ">>", "&&", "==", "!=", "<=", ">=", "++", "--", "+=", "-=", "*=",
                    "/=", "%=", "^=", "**",
                ]
                .contains(&two.as_str())
                {
                    two
                } else {
                    c.to_string()
                };
                i += op.chars().count();
                out.push(Token::Op(op));
            }
        }
    }
    Ok(out)
}

/// Whether an operand (so a regular expression) may start after `last`.
fn operand_may_start(last: Option<&Token>) -> bool {
    match last {
        None | Some(Token::End) => true,
        Some(Token::Word(w)) => matches!(
            w.as_str(),
            "print" | "printf" | "return" | "in" | "case" | "do" | "else"
        ),
        Some(Token::Op(op)) => !matches!(op.as_str(), ")" | "]" | "++" | "--"),
        Some(Token::Str(_) | Token::Number | Token::Regex) => false,
    }
}

fn awk_effects(tokens: &[Token]) -> Vec<Effect> {
    let mut effects = Vec::new();
    // Inside a print or printf statement, and how deep in parentheses
    // since it began: there an unparenthesised `>` is a redirection.
    let mut print_depth: Option<i32> = None;
    let mut depth = 0i32;
    let string_at = |i: usize| match tokens.get(i) {
        Some(Token::Str(s)) => Some(s.clone()),
        _ => None,
    };
    for (i, token) in tokens.iter().enumerate() {
        match token {
            Token::Word(w) => match w.as_str() {
                "print" | "printf" => print_depth = Some(depth),
                "system" => {
                    // `system("cmd")`, the command spelled out, or computed.
                    let literal = matches!(tokens.get(i + 1), Some(Token::Op(o)) if o == "(")
                        && matches!(tokens.get(i + 3), Some(Token::Op(o)) if o == ")");
                    effects.push(Effect::Runs(literal.then(|| string_at(i + 2)).flatten()));
                }
                "ENVIRON" => effects.push(Effect::Environment),
                _ => {}
            },
            Token::Str(s) => {
                if s.starts_with("/inet/") || s.starts_with("/inet4/") || s.starts_with("/inet6/") {
                    effects.push(Effect::Network);
                }
            }
            Token::Op(op) => match op.as_str() {
                "(" => depth += 1,
                ")" => depth -= 1,
                "{" | "}" => print_depth = None,
                "|" | "|&" => {
                    // `"cmd" | getline`: the command before the pipe; `print
                    // … | "cmd"`: after it.
                    let before = i.checked_sub(1).and_then(string_at);
                    let after = string_at(i + 1);
                    let getline =
                        matches!(tokens.get(i + 1), Some(Token::Word(w)) if w == "getline");
                    let command = if getline { before } else { after };
                    effects.push(Effect::Runs(command));
                }
                ">" | ">>" if print_depth == Some(depth) => {
                    effects.push(Effect::Writes(string_at(i + 1)));
                }
                // gawk: `@load "ext"`, `@include "file"`, and `@f()`, an
                // indirect call (which may name `system`).
                "@" => match tokens.get(i + 1) {
                    Some(Token::Word(w)) if w == "load" || w == "include" => {
                        effects.push(Effect::Loads(format!(
                            "@{w} {}",
                            string_at(i + 2).unwrap_or_default()
                        )));
                    }
                    Some(Token::Word(w)) if w == "namespace" => {}
                    _ => effects.push(Effect::Runs(None)),
                },
                _ => {}
            },
            Token::End => print_depth = None,
            Token::Number | Token::Regex => {}
        }
    }
    effects
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_sed_scripts_do_nothing_else() {
        for script in [
            "s/foo/bar/g",
            "1,10d",
            "/^#/d;/^$/d",
            "s|/usr/local|/opt|g",
            "$!N;s/\\n/ /",
            "y/abc/xyz/",
            "/start/,/end/{s/a/b/;p}",
            "s/[/]/x/",
            "10q",
            "1~2d",
            "a\\\nappended",
            "s/x/y/2g",
            "\\,foo,d",
            "r /etc/hosts",
        ] {
            assert_eq!(sed(script), Ok(vec![]), "{script}");
        }
    }

    #[test]
    fn sed_that_runs_or_writes_says_so() {
        assert_eq!(
            sed("1e rm -rf /srv"),
            Ok(vec![Effect::Runs(Some("rm -rf /srv".into()))])
        );
        assert_eq!(sed("e"), Ok(vec![Effect::Runs(None)]));
        assert_eq!(sed("s/.*/id/e"), Ok(vec![Effect::Runs(None)]));
        assert_eq!(
            sed("s/x/y/w /etc/cron.d/job"),
            Ok(vec![Effect::Writes(Some("/etc/cron.d/job".into()))])
        );
        assert_eq!(
            sed("/x/w /tmp/out"),
            Ok(vec![Effect::Writes(Some("/tmp/out".into()))])
        );
        // Read either way, the delimiter in brackets cannot hide a flag.
        let effects = sed("s/[/]/x/w /etc/passwd").unwrap();
        assert!(
            effects.contains(&Effect::Writes(Some("/etc/passwd".into()))),
            "{effects:?}"
        );
        assert!(sed("s/a/b").is_err());
        assert!(sed("k").is_err());
    }

    #[test]
    fn plain_awk_programs_do_nothing_else() {
        for program in [
            "{print $1}",
            "$3 >= 1000 {print $1}",
            r#"/error|warn/ { print FILENAME": "$0 }"#,
            "$3 > 100 { n++ } END { print n }",
            "{ if ($2 > max) max = $2 } END { print max }",
            "/error/ {c++} END {print c+0}",
            "{ print $1, ($2 > 3) }",
            "{ s += $1 / 2 } END { printf \"%.2f\\n\", s }",
            "NR==1 || /x/",
            "{ print > \"/dev/stderr\" }",
        ] {
            let effects = awk(program).unwrap();
            let harmful: Vec<_> = effects
                .iter()
                .filter(|e| !matches!(e, Effect::Writes(Some(p)) if p == "/dev/stderr"))
                .collect();
            assert!(harmful.is_empty(), "{program}: {effects:?}");
        }
    }

    #[test]
    fn awk_that_runs_writes_or_connects_says_so() {
        assert_eq!(
            awk("BEGIN { system(\"rm -rf /srv\") }"),
            Ok(vec![Effect::Runs(Some("rm -rf /srv".into()))])
        );
        assert_eq!(awk("{ system($0) }"), Ok(vec![Effect::Runs(None)]));
        assert_eq!(
            awk("BEGIN { \"id\" | getline x; print x }"),
            Ok(vec![Effect::Runs(Some("id".into()))])
        );
        assert_eq!(
            awk("{ print | \"sh\" }"),
            Ok(vec![Effect::Runs(Some("sh".into()))])
        );
        assert_eq!(
            awk("{ print $0 > \"/etc/passwd\" }"),
            Ok(vec![Effect::Writes(Some("/etc/passwd".into()))])
        );
        assert!(
            awk("BEGIN { s = \"/inet/tcp/0/203.0.113.9/4444\"; print \"x\" |& s }")
                .unwrap()
                .contains(&Effect::Network)
        );
        assert_eq!(
            awk("BEGIN { for (k in ENVIRON) print k }"),
            Ok(vec![Effect::Environment])
        );
        assert!(
            awk("@load \"filefuncs\"; BEGIN { }")
                .unwrap()
                .iter()
                .any(|e| matches!(e, Effect::Loads(_)))
        );
        assert_eq!(
            awk("BEGIN { f = \"system\"; @f(\"id\") }"),
            Ok(vec![Effect::Runs(None)])
        );
        assert!(awk("BEGIN { print \"x }").is_err());
    }
}
