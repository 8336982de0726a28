//! The backend session the host keeps for this Provider between calls.
//!
//! A driver instance keeps no state between calls, yet must not log in to its
//! backend on every call (vCenter limits sessions). [`with_session`] is the one
//! way to do it: use the stored session, log in only when there is none, and log
//! in again once when the backend rejects it.

use crate::bindings::provider::banlieue::provider::session as host;
use crate::{Error, Result};

/// The stored session, if any.
pub fn get() -> Option<String> {
    host::get()
}

/// Store a session for at most `ttl_seconds` (the host caps size and lifetime).
pub fn set(token: &str, ttl_seconds: u32) -> Result<()> {
    host::set(token, ttl_seconds)
}

/// Forget the stored session.
pub fn clear() {
    host::clear()
}

/// Why a call made with a session failed.
pub enum SessionError {
    /// The backend no longer accepts the session: log in again.
    Rejected(String),
    /// Any other failure, returned as it is.
    Failed(Error),
}

impl From<Error> for SessionError {
    fn from(e: Error) -> Self {
        SessionError::Failed(e)
    }
}

/// Run `call` with a session: the stored one, or a new one from `login`
/// (which returns the token and its lifetime in seconds). A session the backend
/// rejects is cleared and replaced once; a second rejection is `denied`.
pub fn with_session<T>(
    mut login: impl FnMut() -> Result<(String, u32)>,
    mut call: impl FnMut(&str) -> std::result::Result<T, SessionError>,
) -> Result<T> {
    let (token, fresh) = match get() {
        Some(t) => (t, false),
        None => (login_and_store(&mut login)?, true),
    };
    match call(&token) {
        Ok(v) => Ok(v),
        Err(SessionError::Failed(e)) => Err(e),
        Err(SessionError::Rejected(why)) if fresh => {
            clear();
            Err(Error::Denied(format!("the backend rejected a session it just issued: {why}")))
        }
        Err(SessionError::Rejected(why)) => {
            crate::debug!("stored session rejected ({why}); logging in again");
            clear();
            let token = login_and_store(&mut login)?;
            match call(&token) {
                Ok(v) => Ok(v),
                Err(SessionError::Failed(e)) => Err(e),
                Err(SessionError::Rejected(why)) => {
                    clear();
                    Err(Error::Denied(format!("the backend rejected a session it just issued: {why}")))
                }
            }
        }
    }
}

fn login_and_store(login: &mut impl FnMut() -> Result<(String, u32)>) -> Result<String> {
    let (token, ttl) = login()?;
    if let Err(e) = set(&token, ttl) {
        // Still usable for this call; the next one logs in again.
        crate::warn!("could not store the backend session: {}", e.message());
    }
    Ok(token)
}
