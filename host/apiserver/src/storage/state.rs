//! Shared server state: the registry of served resources, the store, and the
//! few bits of bookkeeping requests need.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use rand::Rng;

use crate::http::authz::User;
use crate::schema::registry::{Registry, ResourceType};
use crate::config::Config;
use crate::storage::object::Object;
use crate::storage::store::Store;

/// How long a `continue` token stays valid (the real server's compaction interval).
const CONTINUE_TTL: Duration = Duration::from_secs(300);
const MAX_CONTINUES: usize = 1024;

/// The rest of a paginated list, kept so later pages come from the same snapshot.
pub struct Continuation {
    pub created: Instant,
    pub rv: u64,
    pub items: Vec<Object>,
}

pub struct State {
    pub registry: RwLock<Registry>,
    pub store: Store,
    pub config: Config,
    token: String,
    self_addr: Mutex<Option<SocketAddr>>,
    continues: Mutex<HashMap<String, Continuation>>,
    /// Tokens issued by TokenRequest (`serviceaccounts/NAME/token`): who each one is, until when.
    issued: Mutex<HashMap<String, Issued>>,
    pub audit: crate::audit::AuditLog,
}

/// A token TokenRequest issued for a ServiceAccount.
struct Issued {
    user: User,
    expires: SystemTime,
}

/// Tokens issued at most at once; the expired ones are dropped first.
const MAX_ISSUED: usize = 4096;

impl State {
    pub fn new(config: &Config, token: String) -> anyhow::Result<Arc<State>> {
        let store = match &config.data_dir {
            Some(dir) => Store::open(dir, config.watch_history)?.with_history_age(config.watch_window),
            None => Store::in_memory(config.watch_history).with_history_age(config.watch_window),
        };
        let mut registry = Registry::with_builtins();
        // Serve the resources of stored CRDs before any request arrives.
        let crd_key = registry.get("apiextensions.k8s.io", "v1", "customresourcedefinitions").map(|t| t.storage_key());
        if let Some(key) = crd_key {
            let (crds, rv) = store.list(&key, None);
            for crd in crds {
                match crate::schema::registry::types_from_crd(&crd.value()) {
                    // Served from now on, as a restarted kube-apiserver's watch caches are.
                    Ok(types) => registry.serve_crd(crd.name(), types, rv),
                    Err(errs) => tracing::warn!("stored CRD is not servable: {errs:?}"),
                }
            }
        }
        let state = Arc::new(State {
            registry: RwLock::new(registry),
            store,
            config: config.clone(),
            token,
            self_addr: Mutex::new(None),
            continues: Mutex::new(HashMap::new()),
            issued: Mutex::new(HashMap::new()),
            audit: Default::default(),
        });
        Ok(state)
    }

    pub fn set_self_address(&self, addr: SocketAddr) {
        *self.self_addr.lock().unwrap() = Some(addr);
    }

    pub fn self_address(&self) -> String {
        self.self_addr.lock().unwrap().map(|a| a.to_string()).unwrap_or_default()
    }

    /// Who the request's bearer token is: the server's own token is an administrator, who may
    /// act as another user (`Impersonate-User`); a token TokenRequest issued is its
    /// ServiceAccount (no impersonation). `None`: no token, or one this server does not know.
    pub fn authenticate(&self, headers: &hyper::HeaderMap) -> Option<User> {
        let v = headers.get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok())?;
        let given = v.strip_prefix("Bearer ").map(str::trim)?;
        if self.is_admin_token(given) {
            return Some(User::of(headers));
        }
        self.review_token(given)
    }

    /// Who `token` is, as a TokenReview answers: the admin, or an unexpired issued token's
    /// ServiceAccount.
    pub fn review_token(&self, token: &str) -> Option<User> {
        if self.is_admin_token(token) {
            return Some(User::admin());
        }
        let issued = self.issued.lock().unwrap();
        issued.get(token).filter(|i| i.expires > SystemTime::now()).map(|i| i.user.clone())
    }

    /// Issue a token for `user` (a ServiceAccount) valid for `ttl`; it and when it expires.
    /// `None` when too many unexpired tokens are out.
    pub fn issue_token(&self, user: User, ttl: Duration) -> Option<(String, SystemTime)> {
        let mut issued = self.issued.lock().unwrap();
        let now = SystemTime::now();
        issued.retain(|_, i| i.expires > now);
        if issued.len() >= MAX_ISSUED {
            return None;
        }
        let token: String = rand::rng().sample_iter(&rand::distr::Alphanumeric).take(48).map(char::from).collect();
        let expires = now + ttl;
        issued.insert(token.clone(), Issued { user, expires });
        Some((token, expires))
    }

    /// Constant-time comparison with the server's own token.
    fn is_admin_token(&self, given: &str) -> bool {
        let (a, b) = (given.as_bytes(), self.token.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.registry.read().unwrap().get(group, version, plural)
    }

    pub fn builtin(&self, group: &str, plural: &str) -> Arc<ResourceType> {
        let version = "v1";
        self.resource(group, version, plural).expect("built-in resources are always registered")
    }

    /// Keep the rest of a list; returns the token for the next page.
    pub fn save_continuation(&self, c: Continuation) -> Result<String, ()> {
        let mut map = self.continues.lock().unwrap();
        map.retain(|_, v| v.created.elapsed() < CONTINUE_TTL);
        if map.len() >= MAX_CONTINUES {
            return Err(());
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        map.insert(token.clone(), c);
        Ok(token)
    }

    /// Take a saved list remainder; `None` when the token is unknown or expired.
    pub fn take_continuation(&self, token: &str) -> Option<Continuation> {
        let mut map = self.continues.lock().unwrap();
        let c = map.remove(token)?;
        (c.created.elapsed() < CONTINUE_TTL).then_some(c)
    }
}
