//! The hidden marker the agent's writes (a Gitea comment or issue, a
//! Vikunja comment or task) carry, shared because both intakes find what
//! they made before by the same HTML comment in the same form.

/// The hidden marker a comment (an issue, a task) made for `request_id`
/// carries, by which it is found again. A request id that could end the
/// HTML comment early is written as its hash.
pub fn marker(request_id: &str) -> String {
    let plain = !request_id.is_empty()
        && !request_id.contains("--")
        && request_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '.' | '_' | '-' | '/'));
    if plain {
        format!("<!-- nisse:{request_id} -->")
    } else {
        format!("<!-- nisse:h:{} -->", nisse_bus::key_hash(request_id))
    }
}
