//! `oci://REGISTRY/REPOSITORY[:TAG][@sha256:HEX]` — where a component lives.
//!
//! The registry is always explicit (no Docker Hub defaulting) and a tag or a digest is
//! required (no implicit `latest`): a control plane should never guess what to run.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

const SCHEME: &str = "oci://";

/// A parsed component reference. When both a tag and a digest are given the digest wins;
/// the tag is kept only for display.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl Reference {
    /// `host[:port]` of the registry.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// Repository path inside the registry (`team/provider-vsphere`).
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// Tag, if one was given.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// `sha256:<64 hex>`, if one was given.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// `REGISTRY/REPOSITORY`: the identity a cosign signature binds to.
    pub fn repository_name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The same repository pinned to `digest` (tag dropped): what was verified.
    pub fn with_digest(&self, digest: &str) -> Result<Reference> {
        validate_digest(digest).map_err(|reason| self.invalid(reason))?;
        Ok(Reference {
            tag: None,
            digest: Some(digest.to_string()),
            ..self.clone()
        })
    }

    /// The same repository at another tag.
    pub fn with_tag(&self, tag: &str) -> Result<Reference> {
        validate_tag(tag).map_err(|reason| self.invalid(reason))?;
        Ok(Reference {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        })
    }

    pub(crate) fn to_oci(&self) -> oci_client::Reference {
        match (&self.digest, &self.tag) {
            (Some(d), _) => oci_client::Reference::with_digest(
                self.registry.clone(),
                self.repository.clone(),
                d.clone(),
            ),
            (None, Some(t)) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                t.clone(),
            ),
            (None, None) => unreachable!("a Reference always has a tag or a digest"),
        }
    }

    fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidReference {
            reference: self.to_string(),
            reason: reason.into(),
        }
    }
}

impl FromStr for Reference {
    type Err = Error;

    fn from_str(input: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidReference {
            reference: input.to_string(),
            reason: reason.to_string(),
        };

        let rest = input
            .strip_prefix(SCHEME)
            .ok_or_else(|| invalid("must start with oci://"))?;
        let (rest, digest) = match rest.split_once('@') {
            Some((rest, digest)) => {
                validate_digest(digest).map_err(|r| invalid(&r))?;
                (rest, Some(digest.to_string()))
            }
            None => (rest, None),
        };
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| invalid("expected REGISTRY/REPOSITORY"))?;
        validate_registry(registry).map_err(|r| invalid(&r))?;

        // A ':' after the last '/' starts the tag (the registry's port is before the first '/').
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => {
                validate_tag(tag).map_err(|r| invalid(&r))?;
                (repo, Some(tag.to_string()))
            }
            _ => (path, None),
        };
        validate_repository(repository).map_err(|r| invalid(&r))?;
        if tag.is_none() && digest.is_none() {
            return Err(invalid(
                "a tag (:TAG) or a digest (@sha256:HEX) is required",
            ));
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// `sha256:` followed by 64 lowercase hex digits; other algorithms are refused.
pub(crate) fn validate_digest(digest: &str) -> Result<(), String> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("digest {digest:?} must be sha256:<64 hex>"))?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!(
            "digest {digest:?} must be sha256: followed by 64 lowercase hex digits"
        ));
    }
    Ok(())
}

fn validate_registry(registry: &str) -> Result<(), String> {
    let (host, port) = match registry.rsplit_once(':') {
        // IPv6 literals are bracketed: [::1]:5000
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (registry, None),
    };
    if host.is_empty() {
        return Err("registry host is empty".into());
    }
    let bracketed_v6 = host.starts_with('[') && host.ends_with(']');
    if !bracketed_v6
        && !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        return Err(format!("registry host {host:?} has invalid characters"));
    }
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return Err(format!("registry port {port:?} is not a number"));
    }
    Ok(())
}

/// OCI distribution spec: path components `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*` separated by `/`.
fn validate_repository(repository: &str) -> Result<(), String> {
    if repository.is_empty() {
        return Err("repository is empty".into());
    }
    if repository.len() > 255 {
        return Err("repository is longer than 255 characters".into());
    }
    for component in repository.split('/') {
        let bytes = component.as_bytes();
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let ok = !bytes.is_empty()
            && alnum(bytes[0])
            && alnum(bytes[bytes.len() - 1])
            && bytes
                .iter()
                .all(|&b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
            && !component.contains("..")
            && !component.contains("___")
            && !component.contains("._")
            && !component.contains("_.");
        if !ok {
            return Err(format!(
                "repository component {component:?} must be lowercase letters and digits, separated by '.', '_', '__' or '-'"
            ));
        }
    }
    Ok(())
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`
fn validate_tag(tag: &str) -> Result<(), String> {
    let bytes = tag.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    if bytes.is_empty()
        || bytes.len() > 128
        || !word(bytes[0])
        || !bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-')
    {
        return Err(format!(
            "tag {tag:?} must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_tag_digest_and_both() {
        let r: Reference = "oci://127.0.0.1:5000/team/provider-vsphere:v1.2"
            .parse()
            .unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag(), r.digest()),
            (
                "127.0.0.1:5000",
                "team/provider-vsphere",
                Some("v1.2"),
                None
            )
        );
        assert_eq!(r.repository_name(), "127.0.0.1:5000/team/provider-vsphere");

        let r: Reference = format!("oci://ghcr.io/acme/placement@{D}").parse().unwrap();
        assert_eq!((r.tag(), r.digest()), (None, Some(D)));

        let r: Reference = format!("oci://registry.example.com/a/b/c:latest@{D}")
            .parse()
            .unwrap();
        assert_eq!(
            (r.repository(), r.tag(), r.digest()),
            ("a/b/c", Some("latest"), Some(D))
        );
        assert_eq!(
            r.to_string(),
            format!("oci://registry.example.com/a/b/c:latest@{D}")
        );
        assert_eq!(
            r.to_oci().whole(),
            format!("registry.example.com/a/b/c@{D}")
        );

        let r: Reference = "oci://localhost/x:1".parse().unwrap();
        assert_eq!(r.registry(), "localhost");
        let r: Reference = "oci://[::1]:5000/x:1".parse().unwrap();
        assert_eq!(r.registry(), "[::1]:5000");
    }

    #[test]
    fn refuses_with_a_reason() {
        let cases = [
            ("127.0.0.1:5000/x:1", "oci://"),
            ("oci://127.0.0.1:5000", "REGISTRY/REPOSITORY"),
            ("oci://127.0.0.1:5000/x", "tag"),
            ("oci://127.0.0.1:5000/Upper:1", "lowercase"),
            ("oci://127.0.0.1:5000/a//b:1", "repository component"),
            ("oci://127.0.0.1:5000/x:bad/tag", "repository component"),
            ("oci://127.0.0.1:5000/x:-1", "tag"),
            ("oci://127.0.0.1:99999/x:1", "port"),
            ("oci://127.0.0.1:5000/x@sha256:abc", "64"),
            ("oci://127.0.0.1:5000/x@sha512:abc", "sha256"),
            (
                &format!(
                    "oci://127.0.0.1:5000/x@{}",
                    D.to_uppercase().replace("SHA256", "sha256")
                ),
                "lowercase hex",
            ),
            ("oci://bad_host/x:1", "invalid characters"),
        ];
        for (input, why) in cases {
            match input.parse::<Reference>() {
                Err(Error::InvalidReference { reason, .. }) => {
                    assert!(reason.contains(why), "{input}: {reason}")
                }
                other => panic!("{input}: expected InvalidReference, got {other:?}"),
            }
        }
    }
}
