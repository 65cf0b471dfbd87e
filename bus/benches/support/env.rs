//! A bench's settings from the environment, one definition for the
//! end-to-end benches that include this file.

use anyhow::{Context as _, Result};

/// `name` parsed, or `default` when it is not set; a value that does not
/// parse is an error naming the variable and the value.
pub fn env_or<T>(name: &str, default: T) -> Result<T>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}=`{v}`")),
        Err(_) => Ok(default),
    }
}
