//! Registry credentials, read from a Kubernetes docker-config Secret.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use crate::error::{Error, Result};

/// How to authenticate to a registry.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Auth {
    /// No credentials (public pulls; the test registry).
    #[default]
    Anonymous,
    /// HTTP basic credentials, exchanged for a bearer token when the registry asks.
    Basic { username: String, password: String },
}

// Never print secrets.
impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Anonymous => f.write_str("Anonymous"),
            Auth::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
        }
    }
}

impl From<&Auth> for oci_client::secrets::RegistryAuth {
    fn from(auth: &Auth) -> Self {
        match auth {
            Auth::Anonymous => Self::Anonymous,
            Auth::Basic { username, password } => Self::Basic(username.clone(), password.clone()),
        }
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    auths: Option<BTreeMap<String, DockerAuth>>,
    #[serde(flatten)]
    legacy: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// Credentials for `registry` (`host[:port]`) from the contents of a Secret's
/// `.dockerconfigjson` (`{"auths": {HOST: {...}}}`) or legacy `.dockercfg` (`{HOST: {...}}`).
///
/// An entry may hold `auth` (base64 `user:pass`) or `username` + `password`. Keys may be
/// written as `host`, `https://host` or `https://host/v1/`. No entry means anonymous access.
pub fn auth_from_docker_config(json: &[u8], registry: &str) -> Result<Auth> {
    let config: DockerConfig = serde_json::from_slice(json)
        .map_err(|e| Error::Credentials(format!("not a docker config JSON: {e}")))?;
    let entries: BTreeMap<String, DockerAuth> = match config.auths {
        Some(auths) => auths,
        None => config
            .legacy
            .into_iter()
            .filter_map(|(k, v)| Some((k, serde_json::from_value::<DockerAuth>(v).ok()?)))
            .collect(),
    };
    let wanted = normalize_host(registry);
    let Some((key, entry)) = entries
        .iter()
        .find(|(key, _)| normalize_host(key) == wanted)
    else {
        return Ok(Auth::Anonymous);
    };

    if let Some(encoded) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = STANDARD
            .decode(encoded.trim())
            .map_err(|e| Error::Credentials(format!("auths.{key}.auth is not base64: {e}")))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| Error::Credentials(format!("auths.{key}.auth is not UTF-8")))?;
        let (username, password) = decoded.split_once(':').ok_or_else(|| {
            Error::Credentials(format!("auths.{key}.auth is not base64(user:password)"))
        })?;
        return Ok(Auth::Basic {
            username: username.to_string(),
            password: password.to_string(),
        });
    }
    match (&entry.username, &entry.password) {
        (Some(username), Some(password)) => Ok(Auth::Basic {
            username: username.clone(),
            password: password.clone(),
        }),
        _ => Err(Error::Credentials(format!(
            "auths.{key} has neither auth nor username and password"
        ))),
    }
}

/// `https://Host:5000/v1/` → `host:5000`; Docker Hub's aliases collapse to `docker.io`.
fn normalize_host(key: &str) -> String {
    let key = key.trim();
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key
        .split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_auth_field_and_username_password() {
        let b64 = STANDARD.encode("robot:s3cr:et");
        let json = format!(
            r#"{{"auths":{{"https://reg.example.com:5000/v1/":{{"auth":"{b64}"}},"other.io":{{"username":"u","password":"p"}}}}}}"#
        );
        assert_eq!(
            auth_from_docker_config(json.as_bytes(), "reg.example.com:5000").unwrap(),
            Auth::Basic {
                username: "robot".into(),
                password: "s3cr:et".into()
            }
        );
        assert_eq!(
            auth_from_docker_config(json.as_bytes(), "other.io").unwrap(),
            Auth::Basic {
                username: "u".into(),
                password: "p".into()
            }
        );
        assert_eq!(
            auth_from_docker_config(json.as_bytes(), "ghcr.io").unwrap(),
            Auth::Anonymous
        );
        // Port is part of the identity.
        assert_eq!(
            auth_from_docker_config(json.as_bytes(), "reg.example.com").unwrap(),
            Auth::Anonymous
        );
    }

    #[test]
    fn docker_hub_aliases_and_legacy_dockercfg() {
        let json = br#"{"https://index.docker.io/v1/":{"username":"u","password":"p"}}"#;
        assert_eq!(
            auth_from_docker_config(json, "docker.io").unwrap(),
            Auth::Basic {
                username: "u".into(),
                password: "p".into()
            }
        );
    }

    #[test]
    fn refuses_broken_secrets() {
        assert!(matches!(
            auth_from_docker_config(b"nope", "x"),
            Err(Error::Credentials(_))
        ));
        assert!(matches!(
            auth_from_docker_config(br#"{"auths":{"x":{"auth":"%%%"}}}"#, "x"),
            Err(Error::Credentials(_))
        ));
        assert!(matches!(
            auth_from_docker_config(br#"{"auths":{"x":{}}}"#, "x"),
            Err(Error::Credentials(_))
        ));
        assert_eq!(
            format!(
                "{:?}",
                Auth::Basic {
                    username: "u".into(),
                    password: "hunter2".into()
                }
            ),
            "Basic(u, <redacted>)"
        );
    }
}
