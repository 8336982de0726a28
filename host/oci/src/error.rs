//! One error type for the crate; each variant is something a caller can act on
//! (and map onto a `Verified`/`Ready` condition reason).

/// Why fetching, pushing or verifying a component failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The reference string is not `oci://REGISTRY/REPO(:TAG)(@sha256:HEX)`.
    #[error("invalid OCI reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    /// No signature exists for the digest, and the policy requires one.
    #[error("{digest} in {repository} is not signed")]
    Unsigned { repository: String, digest: String },

    /// Signatures exist, but none verifies with any of the trusted public keys.
    #[error(
        "no signature on {digest} verifies with the given public keys ({checked} signature(s) checked)"
    )]
    SignatureMismatch { digest: String, checked: usize },

    /// Content does not hash to the digest that names it (tampered blob or manifest),
    /// or a signed payload names another digest or repository.
    #[error("digest mismatch: {0}")]
    DigestMismatch(String),

    /// The repository, tag, manifest or blob does not exist.
    #[error("not found: {0}")]
    NotFound(String),

    /// The registry refused the credentials (or their absence).
    #[error("unauthorized: {0}")]
    Unauthorized(String),

    /// Any other registry or transport failure.
    #[error("registry error: {0}")]
    Registry(String),

    /// A manifest or layer is larger than this crate accepts.
    #[error("{what} is {size} bytes, over the {limit} byte limit")]
    TooLarge { what: String, size: u64, limit: u64 },

    /// The manifest is not a Wasm component artifact (media types, layer count),
    /// or the bytes to push are not a Wasm component.
    #[error("not a Wasm component artifact: {0}")]
    InvalidArtifact(String),

    /// A key could not be generated, parsed or decrypted (e.g. wrong password).
    #[error("key error: {0}")]
    Key(String),

    /// A docker-config Secret could not be read.
    #[error("invalid registry credentials: {0}")]
    Credentials(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<oci_client::errors::OciDistributionError> for Error {
    fn from(err: oci_client::errors::OciDistributionError) -> Self {
        use oci_client::errors::{OciDistributionError as E, OciErrorCode as C};
        match err {
            E::DigestError(e) => Error::DigestMismatch(e.to_string()),
            E::UnauthorizedError { url } => Error::Unauthorized(url),
            E::ImageManifestNotFoundError(what) => Error::NotFound(what),
            E::RegistryError { envelope, url } => {
                let codes = || envelope.errors.iter().map(|e| &e.code);
                let message = format!("{url}: {envelope:?}");
                if codes().any(|c| matches!(c, C::Unauthorized | C::Denied)) {
                    Error::Unauthorized(message)
                } else if codes().any(|c| {
                    matches!(
                        c,
                        C::BlobUnknown
                            | C::ManifestUnknown
                            | C::NameUnknown
                            | C::NotFound
                            | C::ManifestBlobUnknown
                    )
                }) {
                    Error::NotFound(url)
                } else {
                    Error::Registry(message)
                }
            }
            E::ServerError { code: 404, url, .. } => Error::NotFound(url),
            E::ServerError {
                code: 401 | 403,
                url,
                ..
            } => Error::Unauthorized(url),
            other => Error::Registry(other.to_string()),
        }
    }
}
