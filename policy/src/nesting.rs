//! The nesting pre-scan: how deeply a command line nests, found in one
//! linear pass over its text before any parser sees it.
//!
//! brush-parser recurses at least once per nesting level, in its tokenizer
//! (`$(…)`, `${…}`), its grammar (subshells, groups, `if`/loops/`case`,
//! `[[ … && … ]]`) and its word parser (quotes inside substitutions): in a
//! debug build a brace group costs it some 18 KiB of stack, so a hundred
//! nested groups overflow a 2 MiB thread and abort the process, whatever
//! the classifier would have said. Parentheses directly inside each other
//! also cost it time: it backtracks between arithmetic and subshell at each,
//! doubling its work per level (26 take a second). So the classifier
//! measures first, and text nested deeper than it reads is classified
//! destructive without being parsed.
//!
//! The measure must never be below what the parsers meet, or deep input
//! could slip through. So the scan follows brush's tokenizer where it
//! decides what is quoted (single and ANSI-C quotes, double quotes with
//! substitutions inside, backslashes, backticks, comments, here-documents),
//! and counts every construct that nests:
//! - an opener counts wherever it may be one (`if` as an argument counts
//!   too: counting too much only refuses sooner);
//! - a closer only closes the innermost open construct of its own kind,
//!   and a closing keyword (`fi`, `done`, `esac`, `}`) only right after
//!   `;`, `&` or a newline, where the grammar can read nothing else;
//! - where brush's tokenizer and its word parser could read the same text
//!   differently (a `#` at a word's start inside `$(…)`, an extended glob,
//!   a here-document inside a substitution or after `((`), the scan stops
//!   following quotes and counts every opener in the rest of the text,
//!   closing none.
//!
//! Here-document bodies are scanned the way the word parser reads them
//! (only `$…` and backticks nest); a body with a quoted tag is literal.
//! Substitutions and strings run by `sh -c` are measured again when the
//! classifier parses them, on top of the depth they sit at.

/// The deepest nesting the classifier reads, counted across every
/// enclosing command line (`sh -c '…'`, `$(…)`): enough for any command a
/// person writes, and shallow enough that brush-parser and the classifier
/// together stay well inside a 2 MiB stack (a tokio worker's) in a debug
/// build.
pub(crate) const MAX_NESTING: usize = 24;

/// The most parentheses directly inside each other (`( ( ( …`) the
/// classifier parses: brush-parser's work doubles with each (16 take about
/// a millisecond, 26 a second).
pub(crate) const MAX_PAREN_RUN: usize = 16;

/// How deeply a command line nests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nesting {
    /// The most constructs open at once.
    pub depth: usize,
    /// The most parentheses opened one directly inside the other.
    pub paren_run: usize,
}

/// Measures `text`.
pub(crate) fn measure(text: &str) -> Nesting {
    let mut scan = Scan {
        text: text.as_bytes(),
        i: 0,
        stack: Vec::new(),
        lexical: Vec::new(),
        tests: Vec::new(),
        depth: 0,
        word: None,
        after_separator: true,
        expect_operand: false,
        paren_run: 0,
        max_paren_run: 0,
        double_paren_seen: false,
        pending: Vec::new(),
        hard: false,
    };
    scan.run(text.len());
    while let Some(test) = scan.tests.pop() {
        scan.depth = scan.depth.max(test.bound());
    }
    Nesting {
        depth: scan.depth,
        paren_run: scan.max_paren_run,
    }
}

/// One open construct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// `$(…)` (and `$((…))`, with a `Paren` inside): code.
    Sub { word_mode: bool },
    /// `${…}`.
    Param { word_mode: bool },
    /// `$[…]`.
    Bracket { word_mode: bool },
    /// `"…"`.
    Double { word_mode: bool },
    /// A here-document body that expands.
    Body,
    /// `(…)` in code: a subshell, a process substitution, arithmetic,
    /// function parentheses, a case pattern's, or a group in a test.
    Paren { test: bool },
    /// `{ …; }`.
    Brace,
    /// `if … fi`.
    If,
    /// `for`/`while`/`until`/`select` … `done`.
    Loop,
    /// `case … esac`.
    Case,
    /// `[[ … ]]`.
    Test,
    /// `&&`, `||` or `!` inside a test: one more level of its tree.
    TestOp,
}

impl Frame {
    /// Whether the frame decides how the text inside it is read (the rest
    /// are structure inside code).
    fn is_lexical(self) -> bool {
        matches!(
            self,
            Self::Sub { .. }
                | Self::Param { .. }
                | Self::Bracket { .. }
                | Self::Double { .. }
                | Self::Body
        )
    }
}

/// How the text at the current position is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// Code: the top level of the line, or inside `$(…)`, `${…}`, `$[…]`.
    Code {
        /// Not inside any substitution: keywords, comments and
        /// here-documents are the tokenizer's.
        top: bool,
        /// Read by the word parser only (inside a here-document body): no
        /// comments, no here-documents.
        word_mode: bool,
        /// What ends this code: `)` for `$(…)`, `}` for `${…}`, `]` for
        /// `$[…]`, nothing at the top.
        closer: Option<u8>,
    },
    Double {
        word_mode: bool,
    },
    Body,
}

/// A here-document whose body starts after the current line.
struct HereDoc {
    tag: Vec<u8>,
    remove_tabs: bool,
    expands: bool,
}

/// What a `[[ … ]]` test holds, to bound its depth when it closes.
struct TestStats {
    /// Where its frame is on the stack.
    frame: usize,
    /// `&&`, `||` and `!` in it.
    ops: usize,
    /// The most frames open above its frame at once.
    inner: usize,
}

impl TestStats {
    /// A bound on the test's depth: brush builds `a && b && c` as a tree
    /// as deep as it has operators, with the first operand (and whatever
    /// nests in its words) at the bottom, so the scan cannot see the depth
    /// of an operand when it reads it.
    fn bound(&self) -> usize {
        self.frame + 1 + self.ops + self.inner
    }
}

/// The word being read in code.
#[derive(Clone, Copy)]
struct Word {
    start: usize,
    /// No quote, escape or expansion in it (only such a word can be a
    /// keyword).
    plain: bool,
    /// The token before it was `;`, `&`, a newline or the start.
    after_separator: bool,
}

struct Scan<'t> {
    text: &'t [u8],
    i: usize,
    stack: Vec<Frame>,
    /// The open lexical frames, innermost last, each with the word it
    /// interrupted (`a$(b c)d` is one word around the substitution's own).
    lexical: Vec<(Frame, Option<Word>)>,
    /// The open `[[ … ]]` tests.
    tests: Vec<TestStats>,
    depth: usize,
    word: Option<Word>,
    after_separator: bool,
    /// In a test, the last token wants an operand after it (`==`, `-f`,
    /// `&&`, `(`): a `]]` there is that operand, not the end.
    expect_operand: bool,
    paren_run: usize,
    max_paren_run: usize,
    /// `((` was seen: brush reads `<<` as a shift until `))`, and the scan
    /// does not follow that.
    double_paren_seen: bool,
    pending: Vec<HereDoc>,
    /// The scan could not follow the quoting; it counts openers only.
    hard: bool,
}

fn is_blank(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

fn is_operator_char(c: u8) -> bool {
    matches!(c, b';' | b'&' | b'|' | b'<' | b'>' | b'(' | b')' | b'\n')
}

impl Scan<'_> {
    fn at(&self, i: usize) -> Option<u8> {
        self.text.get(i).copied()
    }

    fn push(&mut self, frame: Frame) {
        if frame.is_lexical() {
            self.lexical.push((frame, self.word.take()));
        }
        self.stack.push(frame);
        self.depth = self.depth.max(self.stack.len());
        if let Some(test) = self.tests.last_mut() {
            test.inner = test.inner.max(self.stack.len() - test.frame - 1);
            if frame == Frame::TestOp {
                test.ops += 1;
            }
        }
        if frame == Frame::Test {
            self.tests.push(TestStats {
                frame: self.stack.len() - 1,
                ops: 0,
                inner: 0,
            });
        }
    }

    /// Closes the innermost construct.
    fn pop(&mut self) {
        let Some(frame) = self.stack.pop() else {
            return;
        };
        if frame.is_lexical() {
            self.word = self.lexical.pop().and_then(|(_, word)| word);
        }
        if self
            .tests
            .last()
            .is_some_and(|t| t.frame == self.stack.len())
            && let Some(test) = self.tests.pop()
        {
            self.depth = self.depth.max(test.bound());
        }
    }

    /// Closes constructs down to `len` open ones.
    fn truncate(&mut self, len: usize) {
        while self.stack.len() > len {
            self.pop();
        }
    }

    /// The byte before `i` in the same word, line continuations skipped.
    fn byte_before(&self, mut i: usize) -> Option<u8> {
        while i >= 2 && self.text[i - 1] == b'\n' && self.text[i - 2] == b'\\' {
            i -= 2;
        }
        i.checked_sub(1).map(|j| self.text[j])
    }

    fn top(&self) -> Option<Frame> {
        self.stack.last().copied()
    }

    fn ctx(&self) -> Ctx {
        match self.lexical.last().map(|(frame, _)| frame) {
            None => Ctx::Code {
                top: true,
                word_mode: false,
                closer: None,
            },
            Some(Frame::Sub { word_mode }) => Ctx::Code {
                top: false,
                word_mode: *word_mode,
                closer: Some(b')'),
            },
            Some(Frame::Param { word_mode }) => Ctx::Code {
                top: false,
                word_mode: *word_mode,
                closer: Some(b'}'),
            },
            Some(Frame::Bracket { word_mode }) => Ctx::Code {
                top: false,
                word_mode: *word_mode,
                closer: Some(b']'),
            },
            Some(Frame::Double { word_mode }) => Ctx::Double {
                word_mode: *word_mode,
            },
            Some(_) => Ctx::Body,
        }
    }

    /// Whether the innermost construct is a `[[ … ]]` test's.
    fn in_test(&self) -> bool {
        matches!(
            self.top(),
            Some(Frame::Test | Frame::TestOp | Frame::Paren { test: true })
        )
    }

    /// Scans up to byte `end`.
    fn run(&mut self, end: usize) {
        while self.i < end {
            if self.hard {
                self.crude(end);
                return;
            }
            match self.ctx() {
                Ctx::Code {
                    top,
                    word_mode,
                    closer,
                } => self.code(top, word_mode, closer),
                Ctx::Double { word_mode } => self.double(word_mode),
                Ctx::Body => self.body(),
            }
        }
        self.end_word();
    }

    /// Gives up following quotes: from here every opener counts and
    /// nothing closes.
    fn give_up(&mut self) {
        self.hard = true;
    }

    /// Counts openers from the current position to `end`, closing none:
    /// whatever quoting the parsers see, every construct they open is one
    /// of these.
    fn crude(&mut self, end: usize) {
        let base = self.stack.len();
        let mut opened = 0usize;
        let mut run = 0usize;
        let mut i = self.i;
        while i < end {
            let c = self.text[i];
            let mut step = 1;
            match c {
                b'(' => {
                    opened += 1;
                    run += 1;
                    self.max_paren_run = self.max_paren_run.max(run);
                }
                b'{' | b'[' | b'!' | b'"' | b'`' => opened += 1,
                b'&' | b'|' if self.at(i + 1) == Some(c) => {
                    opened += 1;
                    step = 2;
                }
                c if c.is_ascii_alphanumeric() || c == b'_' => {
                    let start = i;
                    while i + step < end
                        && (self.text[i + step].is_ascii_alphanumeric()
                            || self.text[i + step] == b'_')
                    {
                        step += 1;
                    }
                    if matches!(
                        &self.text[start..start + step],
                        b"if" | b"case" | b"while" | b"until" | b"for" | b"select"
                    ) {
                        opened += 1;
                    }
                }
                _ => {}
            }
            if c != b'(' && !is_blank(c) && c != b'\n' {
                run = 0;
            }
            i += step;
        }
        self.i = end;
        self.depth = self.depth.max(base + opened);
    }

    /// Starts or continues a word at the current byte.
    fn word_char(&mut self, plain: bool) {
        match &mut self.word {
            Some(w) => w.plain &= plain,
            None => {
                self.word = Some(Word {
                    start: self.i,
                    plain,
                    after_separator: self.after_separator,
                });
            }
        }
        self.paren_run = 0;
    }

    /// Ends the word being read, if any: keywords open and close
    /// constructs.
    fn end_word(&mut self) {
        let Some(word) = self.word.take() else {
            return;
        };
        self.after_separator = false;
        let top_level = matches!(self.ctx(), Ctx::Code { top: true, .. });
        let in_test = self.in_test();
        if !word.plain {
            if in_test {
                self.expect_operand = false;
            }
            return;
        }
        if !top_level && !in_test {
            return;
        }
        // bash removes line continuations before it reads words. (Only
        // plain words get here: they hold no nested construct, so each
        // byte is copied once.)
        let raw = &self.text[word.start..self.i];
        let mut text = Vec::with_capacity(raw.len());
        let mut k = 0;
        while k < raw.len() {
            if raw[k] == b'\\' && raw.get(k + 1) == Some(&b'\n') {
                k += 2;
            } else {
                text.push(raw[k]);
                k += 1;
            }
        }
        let expect_operand = self.expect_operand;
        if in_test {
            self.expect_operand = matches!(text.as_slice(), b"==" | b"=" | b"!=" | b"=~" | b"!")
                || text.starts_with(b"-");
        }
        if !top_level {
            return;
        }
        let close = |scan: &mut Self, frame: Frame| {
            if word.after_separator && scan.top() == Some(frame) {
                scan.pop();
            }
        };
        match text.as_slice() {
            b"if" => self.push(Frame::If),
            b"case" => self.push(Frame::Case),
            b"while" | b"until" | b"for" | b"select" => self.push(Frame::Loop),
            b"{" => self.push(Frame::Brace),
            b"[[" => {
                self.push(Frame::Test);
                self.expect_operand = true;
            }
            b"fi" => close(self, Frame::If),
            b"done" => close(self, Frame::Loop),
            b"esac" => close(self, Frame::Case),
            b"}" => close(self, Frame::Brace),
            b"]]" if in_test && !expect_operand => {
                let mut at = self.stack.len();
                while at > 0 && self.stack[at - 1] == Frame::TestOp {
                    at -= 1;
                }
                if at > 0 && self.stack[at - 1] == Frame::Test {
                    self.truncate(at - 1);
                }
            }
            b"!" if in_test => self.push(Frame::TestOp),
            _ => {}
        }
    }

    /// Skips a single-quoted (or, with `escapes`, ANSI-C quoted) string
    /// starting at the quote; an unterminated one is a literal quote.
    fn skip_quoted(&mut self, escapes: bool) {
        let mut j = self.i + 1;
        while let Some(c) = self.at(j) {
            if escapes && c == b'\\' {
                j += 2;
                continue;
            }
            if c == b'\'' {
                self.i = j + 1;
                return;
            }
            j += 1;
        }
        self.i += 1;
    }

    /// Skips a backquoted command (measured when the classifier parses it);
    /// an unterminated one is a literal backquote.
    fn skip_backquoted(&mut self) {
        self.depth = self.depth.max(self.stack.len() + 1);
        let mut j = self.i + 1;
        while let Some(c) = self.at(j) {
            if c == b'\\' {
                j += 2;
                continue;
            }
            if c == b'`' {
                self.i = j + 1;
                return;
            }
            j += 1;
        }
        self.i += 1;
    }

    /// `$` and what follows it, in code, a double-quoted string or a
    /// here-document body.
    fn dollar(&mut self, word_mode: bool, in_double: bool) {
        match (self.at(self.i + 1), self.at(self.i + 2)) {
            (Some(b'\\'), Some(b'\n')) => {
                // `$`, a line continuation, `(`: the tokenizer reads `$` and
                // `(` apart, the word parser (given the word without the
                // continuation) a substitution.
                self.give_up();
            }
            (Some(b'('), Some(b'(')) => {
                self.push(Frame::Sub { word_mode });
                self.push(Frame::Paren { test: false });
                self.i += 3;
            }
            (Some(b'('), _) => {
                self.push(Frame::Sub { word_mode });
                self.i += 2;
            }
            (Some(b'{'), _) => {
                self.push(Frame::Param { word_mode });
                self.i += 2;
            }
            (Some(b'['), _) => {
                self.push(Frame::Bracket { word_mode });
                self.i += 2;
            }
            (Some(b'\''), _) if !in_double => {
                self.i += 1;
                self.skip_quoted(true);
            }
            (Some(b'"'), _) if !in_double => {
                self.push(Frame::Double { word_mode });
                self.i += 2;
            }
            _ => self.i += 1,
        }
    }

    fn open_paren(&mut self) {
        self.push(Frame::Paren {
            test: self.in_test(),
        });
        self.paren_run += 1;
        self.max_paren_run = self.max_paren_run.max(self.paren_run);
        if self.in_test() {
            self.expect_operand = true;
        }
    }

    fn close_paren(&mut self, closer: Option<u8>) {
        let mut at = self.stack.len();
        while at > 0 && self.stack[at - 1] == Frame::TestOp {
            at -= 1;
        }
        match self.stack[..at].last() {
            Some(Frame::Paren { test }) if at == self.stack.len() || *test => {
                self.truncate(at - 1);
                self.expect_operand = false;
            }
            Some(Frame::Sub { .. }) if at == self.stack.len() && closer == Some(b')') => {
                self.pop();
            }
            _ => {}
        }
    }

    fn code(&mut self, top: bool, word_mode: bool, closer: Option<u8>) {
        let c = self.text[self.i];
        let in_word = self.word.is_some();
        match c {
            b'\\' if self.at(self.i + 1) == Some(b'\n') => {
                // A line continuation: bash removes it, it is not even a
                // word's start.
                self.i += 2;
            }
            b'\\' => {
                self.word_char(false);
                self.i += 2;
            }
            b'\'' if in_word && self.byte_before(self.i) == Some(b'$') => {
                // `\$'…'`: brush's tokenizer reads ANSI-C quoting, its word
                // parser an escaped `$` and single quotes.
                self.give_up();
            }
            b'\'' => {
                self.word_char(false);
                self.skip_quoted(false);
            }
            b'"' => {
                self.word_char(false);
                self.push(Frame::Double { word_mode });
                self.i += 1;
            }
            b'`' => {
                self.word_char(false);
                self.skip_backquoted();
            }
            b'$' => {
                self.word_char(false);
                self.dollar(word_mode, false);
            }
            b'}' if closer == Some(b'}') && matches!(self.top(), Some(Frame::Param { .. })) => {
                self.pop();
                self.i += 1;
            }
            b']' if closer == Some(b']') && matches!(self.top(), Some(Frame::Bracket { .. })) => {
                self.pop();
                self.i += 1;
            }
            b'#' if !in_word => {
                if word_mode || closer == Some(b'}') {
                    self.word_char(true);
                    self.i += 1;
                } else if top {
                    while self.at(self.i).is_some_and(|c| c != b'\n') {
                        self.i += 1;
                    }
                } else {
                    // brush's tokenizer may take this for a comment where
                    // its word parser reads on.
                    self.give_up();
                }
            }
            b'(' if in_word
                && matches!(
                    self.byte_before(self.i),
                    Some(b'@' | b'!' | b'?' | b'+' | b'*')
                ) =>
            {
                if word_mode {
                    self.word_char(false);
                    self.open_paren();
                    self.i += 1;
                } else {
                    // An extended glob: the tokenizer reads it raw, the
                    // word parser with quotes.
                    self.give_up();
                }
            }
            b'(' | b')' if closer == Some(b'}') => {
                // Literal inside `${…}` for the tokenizer and the word
                // parser alike.
                self.word_char(true);
                self.i += 1;
            }
            c if word_mode && matches!(c, b'<' | b'>' | b';' | b'&' | b'|') => {
                self.word_char(true);
                self.i += 1;
            }
            c if is_blank(c) => {
                self.end_word();
                self.i += 1;
            }
            c if is_operator_char(c) => {
                self.end_word();
                self.operator(top, closer);
            }
            _ => {
                self.word_char(true);
                self.i += 1;
            }
        }
    }

    /// An operator in code, at the current byte.
    fn operator(&mut self, top: bool, closer: Option<u8>) {
        let c = self.text[self.i];
        let next = self.at(self.i + 1);
        let in_test = self.in_test();
        let mut separator = false;
        let mut len = 1;
        let mut run_continues = false;
        match c {
            b'(' => {
                if top && next == Some(b'(') {
                    self.double_paren_seen = true;
                }
                self.open_paren();
                run_continues = true;
            }
            b')' => self.close_paren(closer),
            b'\n' => {
                separator = true;
                run_continues = true;
                if !self.pending.is_empty() {
                    if top {
                        self.i += 1;
                        self.here_bodies();
                        self.after_separator = true;
                        return;
                    }
                    self.give_up();
                }
            }
            b';' => {
                separator = true;
                len = match (next, self.at(self.i + 2)) {
                    (Some(b';'), Some(b'&')) => 3,
                    (Some(b';' | b'&'), _) => 2,
                    _ => 1,
                };
            }
            b'&' | b'|' if next == Some(c) => {
                len = 2;
                if in_test {
                    self.push(Frame::TestOp);
                    self.expect_operand = true;
                }
            }
            b'&' if next == Some(b'>') => {
                len = if self.at(self.i + 2) == Some(b'>') {
                    3
                } else {
                    2
                };
            }
            b'&' => separator = true,
            b'|' => {
                if next == Some(b'&') {
                    len = 2;
                }
            }
            b'<' => match (next, self.at(self.i + 2)) {
                (Some(b'<'), Some(b'<')) => len = 3,
                (Some(b'<'), _) => {
                    if top && !self.double_paren_seen {
                        self.here_tag();
                        return;
                    }
                    self.give_up();
                    return;
                }
                (Some(b'&' | b'>'), _) => len = 2,
                _ => {
                    if in_test {
                        self.expect_operand = true;
                    }
                }
            },
            _ => {
                // `>`, `>>`, `>|`, `>&`
                len = if matches!(next, Some(b'>' | b'|' | b'&')) {
                    2
                } else {
                    1
                };
                if in_test && len == 1 {
                    self.expect_operand = true;
                }
            }
        }
        if !run_continues {
            self.paren_run = 0;
        }
        self.after_separator = separator;
        self.i += len;
    }

    /// `<<` or `<<-` and the tag after it.
    fn here_tag(&mut self) {
        self.i += 2;
        let remove_tabs = self.at(self.i) == Some(b'-');
        if remove_tabs {
            self.i += 1;
        }
        while self.at(self.i).is_some_and(is_blank) {
            self.i += 1;
        }
        let start = self.i;
        while let Some(c) = self.at(self.i) {
            match c {
                b'\\' if self.at(self.i + 1) == Some(b'\n') => {
                    self.give_up();
                    return;
                }
                b'\\' => self.i += 2,
                b'\'' | b'"' => {
                    let Some(len) = self.text[self.i + 1..].iter().position(|&q| q == c) else {
                        self.give_up();
                        return;
                    };
                    self.i += len + 2;
                }
                b'$' | b'`' => {
                    self.give_up();
                    return;
                }
                c if is_blank(c) || is_operator_char(c) => break,
                _ => self.i += 1,
            }
        }
        let raw = &self.text[start..self.i.min(self.text.len())];
        if raw.is_empty() || raw.contains(&b'\n') {
            // No tag, or one across lines (brush then ends the body at a
            // line and the empty one after it): not followed.
            self.give_up();
            return;
        }
        // The end tag as brush finds it: every quote character and
        // backslash removed (its `unquote_str`).
        let mut tag = Vec::with_capacity(raw.len());
        let mut escaped = false;
        for &c in raw {
            match c {
                _ if escaped => {
                    tag.push(c);
                    escaped = false;
                }
                b'\\' => escaped = true,
                b'\'' | b'"' => {}
                _ => tag.push(c),
            }
        }
        let quoted = raw.iter().any(|c| matches!(c, b'\\' | b'\'' | b'"'));
        self.pending.push(HereDoc {
            tag,
            remove_tabs,
            expands: !quoted,
        });
        self.after_separator = false;
        self.paren_run = 0;
    }

    /// The bodies of the pending here-documents, starting at the current
    /// byte (after the line that named them).
    fn here_bodies(&mut self) {
        for doc in std::mem::take(&mut self.pending) {
            let start = self.i;
            let mut line = start;
            let (body_end, next) = loop {
                let line_end = self.text[line..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(self.text.len(), |p| line + p);
                let mut content = &self.text[line..line_end];
                if doc.remove_tabs {
                    while let [b'\t', rest @ ..] = content {
                        content = rest;
                    }
                }
                if content == doc.tag.as_slice() {
                    break (line, (line_end + 1).min(self.text.len()));
                }
                if line_end >= self.text.len() {
                    break (self.text.len(), self.text.len());
                }
                line = line_end + 1;
            };
            if doc.expands {
                let base = self.stack.len();
                self.push(Frame::Body);
                self.i = start;
                self.run(body_end);
                self.truncate(base);
            }
            self.i = next;
        }
    }

    fn double(&mut self, word_mode: bool) {
        match self.text[self.i] {
            b'\\' => self.i += 2,
            b'"' => {
                self.pop();
                self.i += 1;
            }
            b'$' => self.dollar(word_mode, true),
            b'`' => self.skip_backquoted(),
            _ => self.i += 1,
        }
    }

    fn body(&mut self) {
        match self.text[self.i] {
            b'\\' => self.i += 2,
            b'$' => self.dollar(true, true),
            b'`' => self.skip_backquoted(),
            _ => self.i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        measure(text).depth
    }

    #[test]
    fn constructs_count_where_they_nest() {
        assert_eq!(depth("ls -la /srv"), 0);
        assert_eq!(depth("echo $(date) $(hostname) $(uptime)"), 1);
        assert_eq!(depth("echo $(echo $(echo $(date)))"), 3);
        assert_eq!(depth(r#"echo "$(echo "$(date)")""#), 4);
        assert_eq!(depth("( { if true; then echo; fi; } )"), 3);
        assert_eq!(
            depth("for h in a b; do ssh $h uptime; done; if x; then y; fi"),
            1
        );
        assert_eq!(depth("case $x in a) echo;; (b) echo;; esac"), 2);
        // A test is bounded as if its first operand sat under all of its
        // operators: the parser's tree puts it there.
        assert_eq!(depth("[[ a && b && c ]] && [[ d ]]"), 5);
        assert_eq!(depth("[[ ( a || b ) && ! c ]]"), 6);
        assert_eq!(depth("echo ${a:-${b:-$(date)}}"), 3);
        assert_eq!(depth("echo $((1 + (2 * 3)))"), 3);
    }

    #[test]
    fn quoted_closers_close_nothing() {
        // The attack the scan must not fall for: a closer in quotes at
        // every level.
        let text = "echo ".to_string() + &"$( echo ')' \")\" \\) ".repeat(30) + &")".repeat(30);
        assert_eq!(
            depth(&text),
            31,
            "30 substitutions, and a string in the innermost"
        );
        let text = "if a; then echo fi; ".repeat(20) + &"fi; ".repeat(20);
        assert_eq!(depth(&text), 20, "`echo fi` closes nothing");
        let text = "{ echo }; ".repeat(20);
        assert_eq!(depth(&text), 20, "`echo }}` closes nothing");
        let text = "[[ a == ]] && ".repeat(10) + "b ]]";
        assert!(depth(&text) >= 11, "a `]]` after `==` is an operand");
    }

    #[test]
    fn comments_and_here_documents_are_skipped_like_bash_does() {
        assert_eq!(depth("# don't ( ( (\necho $(date)"), 1);
        assert_eq!(depth("cat <<'EOF'\n$( $( it's ( ( (\nEOF\necho ok"), 0);
        assert_eq!(
            depth("cat <<EOF\n$(date) it's \"\nEOF\nif a; then b; fi"),
            2
        );
        assert_eq!(depth("cat <<-EOF\n\t$(a $(b))\n\tEOF\n"), 3);
        // An unterminated body runs to the end.
        assert_eq!(depth("cat <<EOF\n)))"), 1);
    }

    #[test]
    fn unclear_quoting_counts_every_opener() {
        // `#` inside `$(…)` after a blank: the tokenizer and the word
        // parser disagree, so nothing closes after it.
        let text = "echo $(a #x\n) ".to_string() + &"$(b) ".repeat(30);
        assert!(depth(&text) >= 30, "{}", depth(&text));
        let text = "ls @(a|b) ".to_string() + &"( c ) ".repeat(30);
        assert!(depth(&text) >= 30);
    }

    #[test]
    fn directly_nested_parentheses_are_counted_as_a_run() {
        assert_eq!(measure("( ( ( a; ) ) )").paren_run, 3);
        assert_eq!(measure("((((a;))))").paren_run, 4);
        assert_eq!(measure("( a; ( b; ( c; ) ) )").paren_run, 1);
    }

    #[test]
    fn the_scan_is_linear_on_huge_input() {
        let deep = "$(".repeat(100_000) + &")".repeat(100_000);
        assert_eq!(depth(&deep), 100_000);
        let flat = "echo $(date); ".repeat(50_000);
        assert_eq!(depth(&flat), 1);
    }

    /// The nesting brush-parser builds for `text` (compound commands,
    /// tests, quotes, substitutions, parameter words, here-documents) and
    /// that the classifier walks; `None` when the text does not parse.
    fn parsed_depth(text: &str) -> Option<usize> {
        depth_of(text, true)
    }

    /// With `structural` false, only what the tokenizer and the word
    /// parser nest on inside `$(…)` (subshells, quotes, substitutions):
    /// the program inside is measured again when it is parsed.
    fn depth_of(text: &str, structural: bool) -> Option<usize> {
        use brush_parser::ast;
        let options = brush_parser::ParserOptions::default();
        let mut parser =
            brush_parser::Parser::new(std::io::BufReader::new(text.as_bytes()), &options);
        let program =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parser.parse_program()))
                .ok()?
                .ok()?;

        fn word(raw: &str) -> usize {
            // Words are read the same way at every level.
            let options = brush_parser::ParserOptions::default();
            std::panic::catch_unwind(|| brush_parser::word::parse(raw, &options))
                .ok()
                .and_then(Result::ok)
                .map_or(0, |p| pieces(&p, false))
        }
        /// `in_body`: in a here-document, where the word parser (unlike
        /// the program parser this helper follows substitutions with)
        /// knows no comments or here-documents; such substitutions count
        /// one level.
        fn pieces(list: &[brush_parser::word::WordPieceWithSource], in_body: bool) -> usize {
            use brush_parser::word::WordPiece as P;
            list.iter()
                .map(|p| match &p.piece {
                    P::DoubleQuotedSequence(inner) | P::GettextDoubleQuotedSequence(inner) => {
                        1 + pieces(inner, in_body)
                    }
                    P::CommandSubstitution(s)
                        if in_body && (s.contains('#') || s.contains("<<")) =>
                    {
                        1
                    }
                    P::CommandSubstitution(s) => 1 + depth_of(s, false).unwrap_or(0),
                    P::BackquotedCommandSubstitution(_) | P::ArithmeticExpression(_) => 1,
                    P::ParameterExpansion(expr) => {
                        let words = crate::shell::parameter_words(expr);
                        if words.is_empty() {
                            0
                        } else {
                            1 + words.into_iter().map(word).max().unwrap_or(0)
                        }
                    }
                    _ => 0,
                })
                .max()
                .unwrap_or(0)
        }
        fn list(l: &ast::CompoundList, st: bool) -> usize {
            l.0.iter()
                .flat_map(|ast::CompoundListItem(ao, _)| {
                    std::iter::once(&ao.first).chain(ao.additional.iter().map(|a| {
                        let (ast::AndOr::And(p) | ast::AndOr::Or(p)) = a;
                        p
                    }))
                })
                .flat_map(|p| p.seq.iter())
                .map(|c| command(c, st))
                .max()
                .unwrap_or(0)
        }
        fn redirect(r: &ast::IoRedirect, st: bool) -> usize {
            match r {
                ast::IoRedirect::File(_, _, ast::IoFileRedirectTarget::Filename(w))
                | ast::IoRedirect::HereString(_, w)
                | ast::IoRedirect::OutputAndError(w, _) => word(&w.value),
                ast::IoRedirect::File(
                    _,
                    _,
                    ast::IoFileRedirectTarget::ProcessSubstitution(_, s),
                ) => 1 + list(&s.list, st),
                ast::IoRedirect::HereDocument(_, doc) if doc.requires_expansion => {
                    let options = brush_parser::ParserOptions::default();
                    std::panic::catch_unwind(|| {
                        brush_parser::word::parse_heredoc(&doc.doc.value, &options)
                    })
                    .ok()
                    .and_then(Result::ok)
                    .map_or(0, |p| pieces(&p, true))
                }
                _ => 0,
            }
        }
        fn test(e: &ast::ExtendedTestExpr, st: bool) -> usize {
            use ast::ExtendedTestExpr as E;
            match e {
                E::And(a, b) | E::Or(a, b) => usize::from(st) + test(a, st).max(test(b, st)),
                E::Not(a) | E::Parenthesized(a) => usize::from(st) + test(a, st),
                E::UnaryTest(_, w) => word(&w.value),
                E::BinaryTest(_, a, b) => word(&a.value).max(word(&b.value)),
            }
        }
        fn command(c: &ast::Command, st: bool) -> usize {
            use ast::CommandPrefixOrSuffixItem as I;
            use ast::CompoundCommand as C;
            match c {
                ast::Command::Simple(s) => s
                    .prefix
                    .iter()
                    .flat_map(|p| p.0.iter())
                    .chain(s.suffix.iter().flat_map(|p| p.0.iter()))
                    .map(|item| match item {
                        I::Word(w) | I::AssignmentWord(_, w) => word(&w.value),
                        I::IoRedirect(r) => redirect(r, st),
                        I::ProcessSubstitution(_, s) => 1 + list(&s.list, st),
                    })
                    .chain(s.word_or_name.iter().map(|w| word(&w.value)))
                    .max()
                    .unwrap_or(0),
                ast::Command::Compound(c, r) => {
                    let inner = match c {
                        C::Subshell(g) => {
                            // Parentheses nest in every parser.
                            return (1 + list(&g.list, st)).max(
                                r.iter()
                                    .flat_map(|l| l.0.iter())
                                    .map(|r| redirect(r, st))
                                    .max()
                                    .unwrap_or(0),
                            );
                        }
                        C::BraceGroup(g) => list(&g.list, st),
                        C::IfClause(i) => {
                            let mut d = list(&i.condition, st).max(list(&i.then, st));
                            for e in i.elses.iter().flatten() {
                                d = d
                                    .max(e.condition.as_ref().map_or(0, |l| list(l, st)))
                                    .max(list(&e.body, st));
                            }
                            d
                        }
                        C::WhileClause(w) | C::UntilClause(w) => {
                            list(&w.0, st).max(list(&w.1.list, st))
                        }
                        C::ForClause(f) => f
                            .values
                            .iter()
                            .flatten()
                            .map(|w| word(&w.value))
                            .max()
                            .unwrap_or(0)
                            .max(list(&f.body.list, st)),
                        C::CaseClause(c) => c
                            .cases
                            .iter()
                            .map(|i| i.cmd.as_ref().map_or(0, |l| list(l, st)))
                            .max()
                            .unwrap_or(0)
                            .max(word(&c.value.value)),
                        C::ArithmeticForClause(f) => list(&f.body.list, st),
                        C::Arithmetic(_) => 0,
                        C::Coprocess(c) => command(&c.body, st),
                    };
                    let r = r
                        .iter()
                        .flat_map(|l| l.0.iter())
                        .map(|r| redirect(r, st))
                        .max()
                        .unwrap_or(0);
                    (usize::from(st) + inner).max(r)
                }
                ast::Command::Function(f) => {
                    let ast::FunctionBody(body, _) = &f.body;
                    command(&ast::Command::Compound(body.clone(), None), st)
                }
                ast::Command::ExtendedTest(t, _) => usize::from(st) + test(&t.expr, st),
            }
        }
        Some(
            program
                .complete_commands
                .iter()
                .map(|l| list(l, structural))
                .max()
                .unwrap_or(0),
        )
    }

    #[test]
    fn the_parsed_depth_helper_sees_what_it_should() {
        assert_eq!(parsed_depth("echo $(echo $(date))"), Some(2));
        assert_eq!(parsed_depth("( { a; } )"), Some(2));
        assert_eq!(parsed_depth("[[ a && b ]]"), Some(2));
        assert_eq!(parsed_depth("if (a"), None);
    }

    use proptest::prelude::*;

    fn word_strategy() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "a",
            "-f",
            "'x)y'",
            "\"q) fi\"",
            "\\)",
            "\\}",
            "fi",
            "done",
            "esac",
            "}",
            "]]",
            "$'\\')'",
            "${x:-')'}",
            "$#",
            "a#b",
            "\"$(b)\"",
            "x$(c)y",
            "`d`",
            "$((1+(2)))",
            "'it''s'",
            "\\\n",
            "i\\\nf",
            "{",
            "@(x)",
        ])
        .prop_map(str::to_string)
    }

    fn test_strategy() -> impl Strategy<Value = String> {
        let leaf = prop::sample::select(vec!["a", "-f x", "a == b", "\"]]\"", "$(e)", "x != ')'"])
            .prop_map(str::to_string);
        leaf.prop_recursive(4, 24, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} && {b}")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} || {b}")),
                inner.clone().prop_map(|a| format!("! {a}")),
                inner.prop_map(|a| format!("( {a} )")),
            ]
        })
    }

    fn program_strategy() -> impl Strategy<Value = String> {
        let leaf =
            prop::collection::vec(word_strategy(), 1..4).prop_map(|w| format!("a {}", w.join(" ")));
        leaf.prop_recursive(6, 48, 3, |inner| {
            prop_oneof![
                inner.clone().prop_map(|c| format!("( {c} )")),
                inner.clone().prop_map(|c| format!("{{ {c}; }}")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("if {a}; then {b}; fi")),
                (inner.clone(), inner.clone())
                    .prop_map(|(a, b)| format!("while {a}\ndo {b}; done")),
                inner
                    .clone()
                    .prop_map(|c| format!("case x in a) {c};; (b) {c};; esac")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} && {b}")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}; {b}")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} | {b}")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}\n{b}")),
                inner.clone().prop_map(|c| format!("echo $({c})")),
                inner.clone().prop_map(|c| format!("echo \"$({c})\"")),
                inner.clone().prop_map(|c| format!("echo ${{x:-$({c})}}")),
                inner.clone().prop_map(|c| format!("f() {{ {c}; }}")),
                inner
                    .clone()
                    .prop_map(|c| format!("cat <<EOF\n$({c})\nEOF\n")),
                inner
                    .clone()
                    .prop_map(|c| format!("cat <<-'E'\n\t{c}\n\tE\n")),
                inner.clone().prop_map(|c| format!("# it's ) }} fi\n{c}")),
                inner.clone().prop_map(|c| format!("{c} # don't ( (\n")),
                inner.clone().prop_map(|c| format!("diff <({c}) <(b)")),
                inner
                    .clone()
                    .prop_map(|c| format!("echo $(( 1 + $({c}) ))")),
                test_strategy().prop_map(|t| format!("[[ {t} ]]")),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

        /// The measure is never below the nesting brush-parser builds, for
        /// programs full of quoted and commented closers, and for the same
        /// programs with bytes that change how quotes pair inserted.
        #[test]
        fn the_measure_is_never_below_what_the_parser_builds(
            program in program_strategy(),
            inserts in prop::collection::vec(
                (any::<prop::sample::Index>(), prop::sample::select(vec![
                    "'", "\"", "\\", "#", " #", "$'", "`", "\n", "<<E\n", "E\n", ")", "}", "fi\n",
                    "((", "$(", "${", " && ", "\\\n", "[[ ", " ]]", "@(", " { ", "; } ", "esac",
                ])),
                0..3,
            ),
        ) {
            let mut text = program.into_bytes();
            for (at, fragment) in inserts {
                let at = at.index(text.len() + 1);
                text.splice(at..at, fragment.bytes());
            }
            let Ok(text) = String::from_utf8(text) else { return Ok(()) };
            if let Some(parsed) = parsed_depth(&text) {
                let measured = measure(&text).depth;
                prop_assert!(measured >= parsed, "{text:?}: measured {measured}, parsed {parsed}");
            }
        }
    }
}
