//! The granted secret keys.

use crate::bindings::host::banlieue::host::secrets as host;
use crate::{Error, Result};

/// Read a granted key; `not-found` and `denied` come back as errors.
pub fn get(key: &str) -> Result<String> {
    host::get(key).map_err(|e| e.context(format_args!("secret {key:?}")))
}

/// Read a granted key that may be unset.
pub fn get_optional(key: &str) -> Result<Option<String>> {
    match host::get(key) {
        Ok(v) => Ok(Some(v)),
        Err(Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e.context(format_args!("secret {key:?}"))),
    }
}

/// Username and password stored under `<prefix>username` / `<prefix>password`
/// (Provider credentials Secrets use `username` and `password`).
pub fn basic_credentials(prefix: &str) -> Result<(String, String)> {
    Ok((get(&format!("{prefix}username"))?, get(&format!("{prefix}password"))?))
}
