//! `banlieue:provider/session`: a backend session (vCenter cookie, Proxmox
//! ticket) the host keeps for one Provider between calls, so drivers — which keep
//! no state — do not log in on every call.
//!
//! [`SessionGrant`] is the one choke point: its scope (the Provider, by
//! namespace, name and UID) is fixed when the host builds the grant, and the
//! guest's calls name no scope, so a driver can reach only its own Provider's
//! session. Tokens are bounded in size and lifetime, and
//! [`SessionStore::bind_credentials`] drops a session when the Provider's
//! credentials change. Tokens never appear in logs or errors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::provider::bindings::banlieue::provider::session::Host;
use super::WitError;
use crate::state::HostState;

/// The largest token a driver may store.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// The longest a token is kept, whatever the driver asks for.
pub const MAX_TTL: Duration = Duration::from_secs(2 * 3600);
/// Scopes kept at once; past this, expired entries are purged and new scopes refused.
pub const MAX_SCOPES: usize = 100_000;

#[derive(Default)]
struct Entry {
    token: Option<(String, Instant)>,
    /// Fingerprint of the credentials the session was made with.
    credentials: Option<[u8; 32]>,
}

/// Every Provider's session, held by the host process.
#[derive(Default)]
pub struct SessionStore {
    entries: Mutex<HashMap<String, Entry>>,
    /// Per scope, the sessions stored (logins) and the calls that found one (reuses), for
    /// the metrics; kept when a scope's session is dropped, so they only grow.
    uses: Mutex<HashMap<String, SessionUses>>,
}

/// How one scope's session was used since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionUses {
    pub logins: u64,
    pub reuses: u64,
}

impl std::fmt::Debug for SessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionStore").field("scopes", &self.lock().len()).finish()
    }
}

impl SessionStore {
    pub fn new() -> Arc<SessionStore> {
        Arc::new(SessionStore::default())
    }

    /// The session capability of one scope (a Provider: `namespace/name/uid`).
    pub fn grant(self: &Arc<Self>, scope: impl Into<String>) -> SessionGrant {
        SessionGrant { store: self.clone(), scope: scope.into() }
    }

    /// Record the fingerprint of `scope`'s credentials. A fingerprint other than the
    /// one seen before drops the scope's session (the next call logs in with the new
    /// credentials); returns whether it did.
    pub fn bind_credentials(&self, scope: &str, fingerprint: [u8; 32]) -> bool {
        let mut entries = self.lock();
        let entry = entries.entry(scope.to_string()).or_default();
        let changed = entry.credentials.is_some_and(|f| f != fingerprint);
        if changed {
            entry.token = None;
        }
        entry.credentials = Some(fingerprint);
        changed && entry.token.is_none()
    }

    /// Forget everything about `scope` (its Provider is gone).
    pub fn forget(&self, scope: &str) {
        self.lock().remove(scope);
    }

    /// Every scope's logins and reuses so far.
    pub fn uses(&self) -> Vec<(String, SessionUses)> {
        self.uses_lock().iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    fn count(&self, scope: &str, f: impl FnOnce(&mut SessionUses)) {
        let mut uses = self.uses_lock();
        // Bounded as the sessions are: past that, new scopes go uncounted.
        if uses.len() < MAX_SCOPES || uses.contains_key(scope) {
            f(uses.entry(scope.to_string()).or_default());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn uses_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionUses>> {
        self.uses.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The session one Provider's driver may read and write.
#[derive(Clone)]
pub struct SessionGrant {
    store: Arc<SessionStore>,
    scope: String,
}

impl std::fmt::Debug for SessionGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionGrant").field("scope", &self.scope).finish()
    }
}

impl SessionGrant {
    /// The stored token of this scope, unless it has expired.
    pub fn get(&self) -> Option<String> {
        let token = {
            let mut entries = self.store.lock();
            let entry = entries.get_mut(&self.scope)?;
            match &entry.token {
                Some((token, expires)) if Instant::now() < *expires => Some(token.clone()),
                Some(_) => {
                    entry.token = None;
                    None
                }
                None => None,
            }
        };
        if token.is_some() {
            self.store.count(&self.scope, |u| u.reuses += 1);
        }
        token
    }

    /// Store a token for this scope for at most `ttl` (capped at [`MAX_TTL`]).
    pub fn set(&self, token: String, ttl: Duration) -> Result<(), WitError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(WitError::InvalidSpec(format!("session token of {} bytes exceeds the host's limit of {MAX_TOKEN_BYTES}", token.len())));
        }
        let mut entries = self.store.lock();
        if !entries.contains_key(&self.scope) && entries.len() >= MAX_SCOPES {
            let now = Instant::now();
            entries.retain(|_, e| e.credentials.is_some() || e.token.as_ref().is_some_and(|(_, exp)| *exp > now));
            if entries.len() >= MAX_SCOPES {
                return Err(WitError::Unavailable("the host's session store is full".into()));
            }
        }
        entries.entry(self.scope.clone()).or_default().token = Some((token, Instant::now() + ttl.min(MAX_TTL)));
        drop(entries);
        self.store.count(&self.scope, |u| u.logins += 1);
        Ok(())
    }

    /// Drop this scope's token.
    pub fn clear(&self) {
        if let Some(e) = self.store.lock().get_mut(&self.scope) {
            e.token = None;
        }
    }
}

impl Host for HostState {
    async fn get(&mut self) -> Option<String> {
        self.grants.session.as_ref().and_then(|g| g.get())
    }

    async fn set(&mut self, token: String, ttl_seconds: u32) -> Result<(), WitError> {
        match &self.grants.session {
            Some(g) => {
                self.login();
                g.set(token, Duration::from_secs(ttl_seconds.into()))
            }
            None => Err(self.refusal(WitError::Denied("the session capability is not granted to this component".into()))),
        }
    }

    async fn clear(&mut self) {
        if let Some(g) = &self.grants.session {
            g.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_sees_only_its_own_session() {
        let store = SessionStore::new();
        let a = store.grant("infra/vc-a/1");
        let b = store.grant("infra/vc-b/2");
        a.set("cookie-a".into(), Duration::from_secs(60)).unwrap();
        assert_eq!(a.get().as_deref(), Some("cookie-a"));
        assert_eq!(b.get(), None, "another Provider's driver must not read this session");
        b.clear();
        assert_eq!(a.get().as_deref(), Some("cookie-a"), "another Provider's driver must not clear this session");
        // A Provider recreated under the same name has another UID, so another scope.
        assert_eq!(store.grant("infra/vc-a/3").get(), None);
    }

    #[test]
    fn sessions_expire_and_are_bounded() {
        let store = SessionStore::new();
        let g = store.grant("ns/p/u");
        g.set("t".into(), Duration::ZERO).unwrap();
        assert_eq!(g.get(), None, "an expired session is not handed out");
        assert!(matches!(g.set("x".repeat(MAX_TOKEN_BYTES + 1), Duration::from_secs(60)), Err(WitError::InvalidSpec(_))));
        g.set("t".into(), Duration::from_secs(u64::MAX / 4)).unwrap();
        let expires = store.lock()["ns/p/u"].token.as_ref().unwrap().1;
        assert!(expires <= Instant::now() + MAX_TTL, "lifetime is capped");
    }

    #[test]
    fn new_credentials_drop_the_session() {
        let store = SessionStore::new();
        let g = store.grant("ns/p/u");
        assert!(!store.bind_credentials("ns/p/u", [1; 32]));
        g.set("old".into(), Duration::from_secs(60)).unwrap();
        assert!(!store.bind_credentials("ns/p/u", [1; 32]), "same credentials keep the session");
        assert_eq!(g.get().as_deref(), Some("old"));
        assert!(store.bind_credentials("ns/p/u", [2; 32]));
        assert_eq!(g.get(), None, "a session made with old credentials is dropped");
        store.forget("ns/p/u");
        assert_eq!(g.get(), None);
    }
}
