//! Where a component's bytes come from: a local file (development), a
//! built-in component, or a signed OCI artifact. Fetching and verification are
//! the OCI crate's; this module only decides which applies and hands the runtime
//! exactly the bytes whose digest was verified.

use std::path::PathBuf;

use banlieue_oci::{Auth, Policy, Reference};

/// A component source as ProviderClass / PlacementPolicy spell it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `file:///path/to/component.wasm`
    File(PathBuf),
    /// `oci://REGISTRY/REPO:TAG` or `@sha256:…`
    Oci(Reference),
    /// `builtin:NAME`: shipped with banlieue, looked up in the builtin directory.
    Builtin(String),
}

/// Why a source could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("invalid component source {0:?}: expected oci://…, file:///… or builtin:NAME")]
    Invalid(String),
    #[error("reading {path}: {error}")]
    File { path: String, error: std::io::Error },
    #[error("unknown built-in component {0:?}")]
    UnknownBuiltin(String),
    #[error("{0} is not signed and unsigned components are not allowed (set verification.allowUnsigned for development)")]
    UnsignedNotAllowed(String),
    #[error(transparent)]
    Oci(#[from] banlieue_oci::Error),
}

impl std::str::FromStr for Source {
    type Err = SourceError;
    fn from_str(s: &str) -> Result<Source, SourceError> {
        if let Some(p) = s.strip_prefix("file://") {
            if !p.starts_with('/') {
                return Err(SourceError::Invalid(s.into()));
            }
            return Ok(Source::File(PathBuf::from(p)));
        }
        if let Some(name) = s.strip_prefix("builtin:") {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
                return Err(SourceError::Invalid(s.into()));
            }
            return Ok(Source::Builtin(name.into()));
        }
        if s.starts_with("oci://") {
            return s.parse().map(Source::Oci).map_err(|_| SourceError::Invalid(s.into()));
        }
        Err(SourceError::Invalid(s.into()))
    }
}

/// How a source must be verified.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// PEM public keys; a signature by any one is accepted.
    pub public_keys: Vec<String>,
    /// Run unsigned components (files, or OCI artifacts without a signature).
    pub allow_unsigned: bool,
}

/// Fetched bytes and the digest they were verified (or, when unsigned, computed) as.
pub struct Fetched {
    pub digest: String,
    pub bytes: Vec<u8>,
    pub verified: bool,
}

/// Fetch a component's bytes, verifying its signature before anything runs.
/// Files and built-ins carry no signature, so they need `allow_unsigned` —
/// except built-ins, which ship inside the trusted host.
pub async fn fetch(source: &Source, trust: &Trust, auth: &Auth, builtin_dir: &std::path::Path) -> Result<Fetched, SourceError> {
    use sha2::{Digest, Sha256};
    let local = |path: &std::path::Path| -> Result<Vec<u8>, SourceError> {
        std::fs::read(path).map_err(|error| SourceError::File { path: path.display().to_string(), error })
    };
    match source {
        Source::Builtin(name) => {
            let path = builtin_dir.join(format!("{name}.wasm"));
            let bytes = local(&path).map_err(|_| SourceError::UnknownBuiltin(name.clone()))?;
            Ok(Fetched { digest: format!("sha256:{}", hex::encode(Sha256::digest(&bytes))), bytes, verified: true })
        }
        Source::File(path) => {
            if !trust.allow_unsigned {
                return Err(SourceError::UnsignedNotAllowed(format!("file://{}", path.display())));
            }
            let bytes = local(path)?;
            Ok(Fetched { digest: format!("sha256:{}", hex::encode(Sha256::digest(&bytes))), bytes, verified: false })
        }
        Source::Oci(r) => {
            let policy = if trust.public_keys.is_empty() {
                if !trust.allow_unsigned {
                    return Err(SourceError::UnsignedNotAllowed(r.to_string()));
                }
                Policy::AllowUnsigned
            } else {
                Policy::Verify { public_keys: trust.public_keys.clone() }
            };
            let v = banlieue_oci::pull_verified(r, &policy, auth).await?;
            let verified = matches!(policy, Policy::Verify { .. });
            Ok(Fetched { digest: v.digest, bytes: v.bytes, verified })
        }
    }
}
