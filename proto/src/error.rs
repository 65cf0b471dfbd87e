/// Errors of the contract crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A descriptor set could not be decoded or resolved. The embedded one is
    /// produced by the build, so this means a corrupt snapshot file.
    #[error("invalid protobuf descriptor set: {0}")]
    Descriptor(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
