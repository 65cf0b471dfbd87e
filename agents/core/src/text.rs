//! Text cut to size on character boundaries: what the log keeps of a
//! command's output, what a message or a title shows of a long value.

/// `text` cut to at most `bytes` (on a character boundary), and how many
/// bytes were cut.
pub fn head(text: &str, bytes: usize) -> (&str, usize) {
    if text.len() <= bytes {
        return (text, 0);
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], text.len() - end)
}

/// `text` cut to at most `bytes`, with `…` where it was cut.
pub fn shortened(text: &str, bytes: usize) -> String {
    match head(text, bytes) {
        (all, 0) => all.to_string(),
        (start, _) => format!("{start}…"),
    }
}

/// The last `max` bytes of `s`, cut at a character boundary, with `…`
/// before them when anything was cut.
pub fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

#[cfg(test)]
mod tests {
    use super::{head, shortened, tail};

    #[test]
    fn cuts_fall_on_character_boundaries() {
        assert_eq!(head("héllo", 2), ("h", 5));
        assert_eq!(head("abc", 5), ("abc", 0));
        assert_eq!(shortened("héllo", 2), "h…");
        assert_eq!(tail("héllo", 4), "…llo");
        assert_eq!(tail("abc", 3), "abc");
    }
}
