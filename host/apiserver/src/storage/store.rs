//! Object storage: one global resourceVersion, optimistic concurrency, a bounded
//! watch history, and optional persistence to an embedded redb file.
//!
//! All writes go through [`Store::commit`], the one place where resourceVersions
//! are assigned and watch events emitted. Objects are kept as their JSON text
//! ([`Object`]); the store, its watch history and the persistence queue share each
//! object's one buffer. Persistence is write-behind: a dedicated thread batches
//! committed changes into redb transactions, so a clean shutdown (which drains the
//! queue) loses nothing and a crash loses at most the changes not yet written —
//! typically the last few milliseconds.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use redb::{ReadableDatabase, ReadableTable};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::schema::registry::StorageKey;
use crate::storage::object::{Draft, Object};

/// What a watch event reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// A committed change.
#[derive(Debug)]
pub struct Event {
    pub key: StorageKey,
    pub etype: EventType,
    pub object: Object,
    /// The object before the change (selector transitions in watches).
    pub old: Option<Object>,
    pub rv: u64,
}

/// Precondition of a commit.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// The object must not exist (create).
    Absent,
    /// The object must exist at this resourceVersion.
    Version(u64),
}

/// Why a commit was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum CommitError {
    AlreadyExists,
    NotFound,
    Conflict,
}

type ObjKey = (String, String); // (namespace, name)

struct Inner {
    rv: u64,
    objects: HashMap<StorageKey, BTreeMap<ObjKey, Object>>,
    uids: HashMap<String, (StorageKey, String, String)>,
    /// Recent events with when they happened, for watches that resume.
    history: VecDeque<(Instant, Arc<Event>)>,
    history_cap: usize,
    /// Events older than this are compacted, as kube-apiserver's etcd compacts revisions.
    history_age: Duration,
    /// Events at or below this resourceVersion are no longer in the history.
    compacted: u64,
}

/// The object store.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
    persist: Option<Persist>,
}

use crate::config::DEFAULT_HISTORY_AGE;

impl Inner {
    /// Drop events beyond the cap or older than the age; a watch from before them gets `410 Gone`.
    fn compact(&mut self) {
        while let Some((at, e)) = self.history.front() {
            if self.history.len() <= self.history_cap && at.elapsed() <= self.history_age {
                break;
            }
            self.compacted = e.rv;
            self.history.pop_front();
        }
    }
}

impl Store {
    /// Keep events resumable for at most `age` (default [`DEFAULT_HISTORY_AGE`]).
    pub fn with_history_age(self, age: Duration) -> Self {
        self.inner.lock().unwrap().history_age = age;
        self
    }

    /// An in-memory store keeping `history_cap` events for watches that resume.
    pub fn in_memory(history_cap: usize) -> Self {
        let (tx, _) = broadcast::channel(16 * 1024);
        Store {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: HashMap::new(),
                uids: HashMap::new(),
                history: VecDeque::new(),
                history_cap: history_cap.max(1),
                history_age: DEFAULT_HISTORY_AGE,
                compacted: 1,
            }),
            tx,
            persist: None,
        }
    }

    /// A store persisted in `dir/objects.redb`, loaded with the objects stored there.
    pub fn open(dir: &Path, history_cap: usize) -> anyhow::Result<Self> {
        let mut store = Store::in_memory(history_cap);
        let (persist, rv, objects) = Persist::open(&dir.join("objects.redb"))?;
        {
            let mut inner = store.inner.lock().unwrap();
            inner.rv = rv.max(1);
            inner.compacted = inner.rv;
            for (key, obj) in objects {
                let (ns, name) = (obj.namespace().to_string(), obj.name().to_string());
                let key: StorageKey = key.into();
                inner.uids.insert(obj.uid().to_string(), (key.clone(), ns.clone(), name.clone()));
                inner.objects.entry(key).or_default().insert((ns, name), obj);
            }
        }
        store.persist = Some(persist);
        Ok(store)
    }

    /// The current (latest committed) resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.inner.lock().unwrap().rv
    }

    pub fn get(&self, key: &StorageKey, ns: &str, name: &str) -> Option<Object> {
        let inner = self.inner.lock().unwrap();
        inner.objects.get(key)?.get(&(ns.to_string(), name.to_string())).cloned()
    }

    /// Find an object by UID (garbage collection of dependents).
    pub fn locate_uid(&self, uid: &str) -> Option<(StorageKey, String, String)> {
        self.inner.lock().unwrap().uids.get(uid).cloned()
    }

    /// All objects of a resource (in one namespace when given), sorted by namespace
    /// and name, with the resourceVersion the list is consistent at.
    pub fn list(&self, key: &StorageKey, ns: Option<&str>) -> (Vec<Object>, u64) {
        let inner = self.inner.lock().unwrap();
        let items = match inner.objects.get(key) {
            None => vec![],
            Some(m) => match ns {
                Some(ns) => m
                    .range((ns.to_string(), String::new())..)
                    .take_while(|((n, _), _)| n == ns)
                    .map(|(_, v)| v.clone())
                    .collect(),
                None => m.values().cloned().collect(),
            },
        };
        (items, inner.rv)
    }

    /// Storage keys that hold objects in a namespace (namespace deletion).
    pub fn keys_with_objects_in(&self, ns: &str) -> Vec<StorageKey> {
        let inner = self.inner.lock().unwrap();
        inner
            .objects
            .iter()
            .filter(|(_, m)| m.range((ns.to_string(), String::new())..).next().is_some_and(|((n, _), _)| n == ns))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Commit a change: `Some(obj)` creates or replaces, `None` deletes. Assigns the
    /// next resourceVersion, records the event and notifies watchers. Returns the
    /// stored object (for a delete, the last state with the deletion's resourceVersion).
    pub fn commit(&self, key: &StorageKey, ns: &str, name: &str, expect: Expect, new: Option<Value>) -> Result<Object, CommitError> {
        // Encoded before the lock is taken; only the resourceVersion is written under it.
        self.write(key, ns, name, expect, new.map(Draft::new), None)
    }

    /// Delete the object, recording `last` (e.g. the update that removed its last
    /// finalizer) as its final state: what the DELETED event carries and what is returned.
    pub fn commit_delete_as(&self, key: &StorageKey, ns: &str, name: &str, expect: Expect, last: Value) -> Result<Object, CommitError> {
        self.write(key, ns, name, expect, None, Some(Draft::new(last)))
    }

    fn write(
        &self,
        key: &StorageKey,
        ns: &str,
        name: &str,
        expect: Expect,
        new: Option<Draft>,
        final_state: Option<Draft>,
    ) -> Result<Object, CommitError> {
        let mut inner = self.inner.lock().unwrap();
        let okey = (ns.to_string(), name.to_string());
        let current = inner.objects.get(key).and_then(|m| m.get(&okey)).cloned();
        match (expect, &current) {
            (Expect::Absent, Some(_)) => return Err(CommitError::AlreadyExists),
            (Expect::Version(_), None) => return Err(CommitError::NotFound),
            (Expect::Version(v), Some(cur)) if cur.rv() != v => return Err(CommitError::Conflict),
            _ => {}
        }
        let rv = inner.rv + 1;
        inner.rv = rv;
        let (etype, stored) = match new {
            Some(draft) => {
                let obj = draft.stamp(rv);
                inner.objects.entry(key.clone()).or_default().insert(okey, obj.clone());
                inner.uids.insert(obj.uid().to_string(), (key.clone(), ns.to_string(), name.to_string()));
                (if current.is_some() { EventType::Modified } else { EventType::Added }, obj)
            }
            None => {
                let cur = current.clone().ok_or(CommitError::NotFound)?;
                if let Some(m) = inner.objects.get_mut(key) {
                    m.remove(&okey);
                }
                inner.uids.remove(cur.uid());
                let last = match final_state {
                    Some(draft) => draft.stamp(rv),
                    None => cur.restamp(rv),
                };
                (EventType::Deleted, last)
            }
        };
        let event = Arc::new(Event { key: key.clone(), etype, object: stored.clone(), old: current, rv });
        inner.history.push_back((Instant::now(), event.clone()));
        inner.compact();
        if let Some(p) = &self.persist {
            let object = (etype != EventType::Deleted).then(|| stored.clone());
            p.send(PersistOp { key: object_path(key, ns, name), object, rv });
        }
        // Sent under the lock so watchers see events in resourceVersion order.
        let _ = self.tx.send(event);
        Ok(stored)
    }

    /// Start a watch of every event after `from`: the events still in the history,
    /// and a receiver for those that follow. `Err` when `from` is older than the history.
    pub fn watch_from(&self, from: u64) -> Result<(Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>), u64> {
        let mut inner = self.inner.lock().unwrap();
        inner.compact();
        if from < inner.compacted {
            return Err(inner.compacted);
        }
        let past = inner.history.iter().filter(|(_, e)| e.rv > from).map(|(_, e)| e.clone()).collect();
        Ok((past, self.tx.subscribe()))
    }

    /// A receiver of every future event (controllers inside the server).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Write everything committed so far and close the database (clean shutdown).
    /// Later commits are kept in memory only.
    pub fn close(&self) {
        if let Some(p) = &self.persist {
            p.close();
        }
    }
}

fn object_path(key: &str, ns: &str, name: &str) -> String {
    format!("{key}\u{0}{ns}\u{0}{name}")
}

const OBJECTS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("objects");
const META: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");

struct PersistOp {
    key: String,
    /// The object whose JSON is written; `None` removes the key.
    object: Option<Object>,
    rv: u64,
}

enum PersistMsg {
    Op(PersistOp),
    /// Write what is queued, then close the database (releasing its file lock).
    Close,
}

/// The write-behind persistence thread's handle.
struct Persist {
    tx: Mutex<mpsc::Sender<PersistMsg>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Persist {
    #[allow(clippy::type_complexity)]
    fn open(path: &Path) -> anyhow::Result<(Persist, u64, Vec<(String, Object)>)> {
        let db = redb::Database::create(path)?;
        let mut objects = Vec::new();
        let mut rv = 1;
        {
            let w = db.begin_write()?;
            w.open_table(OBJECTS)?;
            w.open_table(META)?;
            w.commit()?;
            let r = db.begin_read()?;
            let t = r.open_table(OBJECTS)?;
            for row in t.iter()? {
                let (k, v) = row?;
                let key = k.value().split('\u{0}').next().unwrap_or_default().to_string();
                match Object::load(v.value()) {
                    Ok(obj) => objects.push((key, obj)),
                    Err(e) => tracing::warn!("skipping unreadable stored object {:?}: {e}", k.value()),
                }
            }
            if let Some(v) = r.open_table(META)?.get("rv")? {
                rv = v.value();
            }
        }
        let (tx, rx) = mpsc::channel::<PersistMsg>();
        let thread = std::thread::Builder::new().name("store-persist".into()).spawn(move || persist_loop(db, rx))?;
        Ok((Persist { tx: Mutex::new(tx), thread: Mutex::new(Some(thread)) }, rv, objects))
    }

    fn send(&self, op: PersistOp) {
        let _ = self.tx.lock().unwrap().send(PersistMsg::Op(op));
    }

    fn close(&self) {
        let _ = self.tx.lock().unwrap().send(PersistMsg::Close);
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

fn persist_loop(db: redb::Database, rx: mpsc::Receiver<PersistMsg>) {
    let mut closing = false;
    while !closing {
        let Ok(first) = rx.recv() else { break };
        // Batch whatever is queued into one transaction.
        let mut ops = Vec::new();
        let mut next = Some(first);
        while let Some(msg) = next {
            match msg {
                PersistMsg::Op(op) => ops.push(op),
                PersistMsg::Close => closing = true,
            }
            next = if ops.len() < 4096 { rx.try_recv().ok() } else { None };
        }
        if !ops.is_empty() {
            if let Err(e) = write_batch(&db, &ops) {
                tracing::error!("persisting {} changes failed: {e}", ops.len());
            }
        }
    }
}

fn write_batch(db: &redb::Database, ops: &[PersistOp]) -> anyhow::Result<()> {
    let w = db.begin_write()?;
    {
        let mut t = w.open_table(OBJECTS)?;
        let mut rv = 0;
        for op in ops {
            match &op.object {
                Some(obj) => {
                    t.insert(op.key.as_str(), obj.json())?;
                }
                None => {
                    t.remove(op.key.as_str())?;
                }
            }
            rv = rv.max(op.rv);
        }
        w.open_table(META)?.insert("rv", rv)?;
    }
    w.commit()?;
    Ok(())
}
