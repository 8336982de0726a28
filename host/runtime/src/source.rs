//! Where a component's bytes come from: a local file (development), a
//! built-in component, or a signed OCI artifact. Fetching and verification are
//! the OCI crate's; this module only decides which applies and hands the runtime
//! exactly the bytes whose digest was verified.

use std::path::{Path, PathBuf};

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
    #[error("{0}: file:// component sources are switched off (an administrator allows them from one directory with --component-dir)")]
    FileSourcesDisabled(String),
    #[error("{path} is not inside the component directory {dir} (--component-dir)")]
    OutsideComponentDir { path: String, dir: String },
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

/// The host directories local components are read from. Each is opened as a `cap-std`
/// directory for the read, so a name (or a `file://` path, `..`, or a symlink) cannot
/// reach a file outside it.
#[derive(Clone, Debug, Default)]
pub struct LocalDirs {
    /// Where `builtin:NAME` components are (`NAME.wasm`).
    pub builtin: PathBuf,
    /// The one directory `file://` sources may name files in; `None` refuses them all.
    pub files: Option<PathBuf>,
}

impl LocalDirs {
    fn read(dir: &Path, name: &Path) -> std::io::Result<Vec<u8>> {
        cap_std::fs::Dir::open_ambient_dir(dir, cap_std::ambient_authority())?.read(name)
    }
}

/// Fetch a component's bytes, verifying its signature before anything runs.
/// Files and built-ins carry no signature, so they need `allow_unsigned` —
/// except built-ins, which ship inside the trusted host.
pub async fn fetch(source: &Source, trust: &Trust, auth: &Auth, dirs: &LocalDirs) -> Result<Fetched, SourceError> {
    use sha2::{Digest, Sha256};
    let digest = |bytes: &[u8]| format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
    match source {
        Source::Builtin(name) => {
            // The name is `[a-z0-9-]+` (see `from_str`), read inside the builtin directory.
            let bytes = LocalDirs::read(&dirs.builtin, Path::new(&format!("{name}.wasm"))).map_err(|_| SourceError::UnknownBuiltin(name.clone()))?;
            Ok(Fetched { digest: digest(&bytes), bytes, verified: true })
        }
        Source::File(path) => {
            let shown = format!("file://{}", path.display());
            let dir = dirs.files.as_deref().ok_or_else(|| SourceError::FileSourcesDisabled(shown.clone()))?;
            let inside = path.strip_prefix(dir).map_err(|_| SourceError::OutsideComponentDir { path: shown.clone(), dir: dir.display().to_string() })?;
            if !trust.allow_unsigned {
                return Err(SourceError::UnsignedNotAllowed(shown));
            }
            let bytes = LocalDirs::read(dir, inside).map_err(|error| SourceError::File { path: shown, error })?;
            Ok(Fetched { digest: digest(&bytes), bytes, verified: false })
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
