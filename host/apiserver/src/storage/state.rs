//! Shared server state: the registry of served resources, the store, and the
//! few bits of bookkeeping requests need.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

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
    pub audit: crate::audit::AuditLog,
}

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

    /// Constant-time check of the bearer token.
    pub fn authorized(&self, headers: &hyper::HeaderMap) -> bool {
        let Some(v) = headers.get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Some(given) = v.strip_prefix("Bearer ").map(str::trim) else { return false };
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
