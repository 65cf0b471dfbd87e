//! What the read-only commands show, as text and as JSON at once: the
//! CLI prints one of them (`--json` or not), `nisse mcp serve` answers a
//! tool call with both, so the two surfaces say the same from one code
//! path.

/// What a read-only command shows.
#[derive(Debug, Clone)]
pub(crate) struct Shown {
    /// The text a person reads, every line ending in a newline.
    pub text: String,
    /// The same as JSON.
    pub json: serde_json::Value,
    /// What the reader should know about how complete it is (a world
    /// model with problems): the CLI says it on stderr, the MCP surface
    /// before the text.
    pub warnings: Vec<String>,
}

impl Shown {
    /// `text` and `json`, with no warnings.
    pub fn new(text: String, json: serde_json::Value) -> Self {
        Self {
            text,
            json,
            warnings: Vec::new(),
        }
    }

    /// Prints it, as JSON when `json`; the warnings go to stderr.
    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        for w in &self.warnings {
            eprintln!("warning: {w}");
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&self.json)?);
        } else {
            print!("{}", self.text);
        }
        Ok(())
    }
}

/// Appends a line to a `String`, as `println!` would print it.
macro_rules! outln {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        // Writing to a String cannot fail.
        let _ = writeln!($out, $($arg)*);
    }};
}
pub(crate) use outln;
