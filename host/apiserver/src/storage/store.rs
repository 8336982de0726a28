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
    /// Persisted stores: the highest resourceVersion the disk allows to be handed out.
    ceiling: u64,
}

/// How many resourceVersions are reserved on disk at a time. A restarted server starts past
/// the reservation, so it never hands out a resourceVersion a client saw before the crash
/// (a client watching from it would otherwise miss every event up to it).
const RV_BLOCK: u64 = 10_000;

/// The object store.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
    persist: Option<Persist>,
    /// Bumped by [`Store::expire`]: every open watch ends with `410 Gone`.
    expiries: tokio::sync::watch::Sender<u64>,
    /// The latest resourceVersion on disk (persisted stores): a write is acknowledged and
    /// its event sent to watchers only once it is there, so a SIGKILL loses nothing anyone saw.
    durable: Arc<tokio::sync::watch::Sender<u64>>,
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
                ceiling: 0,
            }),
            tx,
            persist: None,
            expiries: tokio::sync::watch::Sender::new(0),
            durable: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// A store persisted in `dir/objects.redb`, loaded with the objects stored there.
    pub fn open(dir: &Path, history_cap: usize) -> anyhow::Result<Self> {
        let mut store = Store::in_memory(history_cap);
        let (persist, rv, ceiling, objects) = Persist::open(&dir.join("objects.redb"), store.tx.clone(), store.durable.clone())?;
        {
            let mut inner = store.inner.lock().unwrap();
            // Past whatever was handed out before, even if it never reached the disk.
            inner.rv = rv.max(ceiling).max(1);
            inner.ceiling = inner.rv;
            inner.compacted = inner.rv;
            store.durable.send_replace(inner.rv);
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

    /// Wait until every change up to `rv` is on disk (at once for an in-memory store).
    pub async fn durable(&self, rv: u64) {
        if self.persist.is_some() {
            let mut durable = self.durable.subscribe();
            let _ = durable.wait_for(|d| *d >= rv).await;
        }
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
        if let Some(p) = &self.persist
            && rv > inner.ceiling
        {
            // No resourceVersion is handed out before the disk knows it may have been.
            inner.ceiling = rv + RV_BLOCK;
            p.reserve(inner.ceiling);
        }
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
        // Sent under the lock so watchers see events in resourceVersion order; by the
        // persistence thread once on disk when persisted.
        match &self.persist {
            Some(p) => {
                let object = (etype != EventType::Deleted).then(|| stored.clone());
                p.send(PersistOp { key: object_path(key, ns, name), object, rv, event });
            }
            None => {
                let _ = self.tx.send(event);
            }
        }
        Ok(stored)
    }

    /// Start a watch of every event after `from`: the events still in the history,
    /// and a receiver for those that follow. `Err` when `from` is older than the history.
    pub fn watch_from(&self, from: u64) -> Result<(Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>), u64> {
        // Subscribed before reading how far the disk is: an event sent before is in the
        // history up to that point, one sent after arrives live (watches skip repeats).
        let live = self.tx.subscribe();
        let mut inner = self.inner.lock().unwrap();
        inner.compact();
        if from < inner.compacted {
            return Err(inner.compacted);
        }
        let upto = if self.persist.is_some() { *self.durable.borrow() } else { u64::MAX };
        let past = inner.history.iter().filter(|(_, e)| e.rv > from && e.rv <= upto).map(|(_, e)| e.clone()).collect();
        Ok((past, live))
    }

    /// Compact the whole history and end every open watch with `410 Gone`, as when
    /// kube-apiserver's etcd is compacted past its watchers: each client must list again.
    /// For fault tests (`ApiServer::expire_watches`).
    pub fn expire(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.compacted = inner.rv;
        inner.history.clear();
        self.expiries.send_modify(|n| *n += 1);
    }

    /// Changes when [`Store::expire`] ends the open watches.
    pub fn expiries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.expiries.subscribe()
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
    /// Sent to watchers once written.
    event: Arc<Event>,
}

enum PersistMsg {
    Op(PersistOp),
    /// Record the resourceVersion ceiling, then answer.
    Reserve(u64, mpsc::SyncSender<()>),
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
    fn open(path: &Path, events: broadcast::Sender<Arc<Event>>, durable: Arc<tokio::sync::watch::Sender<u64>>) -> anyhow::Result<(Persist, u64, u64, Vec<(String, Object)>)> {
        let db = redb::Database::create(path)?;
        let mut objects = Vec::new();
        let (mut rv, mut ceiling) = (1, 0);
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
            if let Some(v) = r.open_table(META)?.get("ceiling")? {
                ceiling = v.value();
            }
        }
        let (tx, rx) = mpsc::channel::<PersistMsg>();
        let thread = std::thread::Builder::new().name("store-persist".into()).spawn(move || persist_loop(db, rx, events, durable))?;
        Ok((Persist { tx: Mutex::new(tx), thread: Mutex::new(Some(thread)) }, rv, ceiling, objects))
    }

    /// Write the resourceVersion ceiling and wait until it is on disk (every [`RV_BLOCK`] writes).
    fn reserve(&self, ceiling: u64) {
        let (done, wait) = mpsc::sync_channel(1);
        let _ = self.tx.lock().unwrap().send(PersistMsg::Reserve(ceiling, done));
        let _ = wait.recv();
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

fn persist_loop(db: redb::Database, rx: mpsc::Receiver<PersistMsg>, events: broadcast::Sender<Arc<Event>>, durable: Arc<tokio::sync::watch::Sender<u64>>) {
    let mut closing = false;
    while !closing {
        let Ok(first) = rx.recv() else { break };
        // Batch whatever is queued into one transaction.
        let mut ops = Vec::new();
        let mut reserved = Vec::new();
        let mut next = Some(first);
        while let Some(msg) = next {
            match msg {
                PersistMsg::Op(op) => ops.push(op),
                PersistMsg::Reserve(ceiling, done) => reserved.push((ceiling, done)),
                PersistMsg::Close => closing = true,
            }
            next = if ops.len() < 4096 { rx.try_recv().ok() } else { None };
        }
        if let Some(ceiling) = reserved.iter().map(|(c, _)| *c).max() {
            if let Err(e) = write_ceiling(&db, ceiling) {
                tracing::error!("persisting the resourceVersion ceiling failed: {e}");
            }
            reserved.into_iter().for_each(|(_, done)| { let _ = done.send(()); });
        }
        if let Some(last) = ops.last() {
            if let Err(e) = write_batch(&db, &ops) {
                tracing::error!("persisting {} changes failed: {e}", ops.len());
            }
            // On disk first, then visible: a writer waiting for `durable` is answered, and
            // anyone who sees the event sees a change a restart keeps.
            durable.send_replace(last.rv);
            for op in ops {
                let _ = events.send(op.event);
            }
        }
    }
}

fn write_ceiling(db: &redb::Database, ceiling: u64) -> anyhow::Result<()> {
    let w = db.begin_write()?;
    w.open_table(META)?.insert("ceiling", ceiling)?;
    w.commit()?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> StorageKey {
        "banlieue.io/virtualmachines".into()
    }

    fn vm(name: &str, uid: &str) -> Value {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
               "metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": {"app": "web"}},
               "spec": {"cpus": 2}})
    }

    fn served_rv(obj: &Object) -> String {
        let v: Value = serde_json::from_slice(obj.json()).unwrap();
        v["metadata"]["resourceVersion"].as_str().unwrap().to_string()
    }

    #[test]
    fn commits_assign_versions_into_the_stored_text_and_check_them() {
        let store = Store::in_memory(100);
        let a = store.commit(&key(), "ns", "a", Expect::Absent, Some(vm("a", "u-a"))).unwrap();
        assert_eq!((a.rv(), served_rv(&a)), (2, "2".to_string()));
        assert_eq!(store.commit(&key(), "ns", "a", Expect::Absent, Some(vm("a", "u-a"))).unwrap_err(), CommitError::AlreadyExists);
        assert_eq!(store.commit(&key(), "ns", "b", Expect::Version(2), Some(vm("b", "u-b"))).unwrap_err(), CommitError::NotFound);
        // A stale resourceVersion in the object itself is overwritten, not trusted.
        let mut changed = vm("a", "u-a");
        changed["metadata"]["resourceVersion"] = json!("1");
        changed["spec"]["cpus"] = json!(4);
        let a2 = store.commit(&key(), "ns", "a", Expect::Version(2), Some(changed)).unwrap();
        assert_eq!((a2.rv(), served_rv(&a2)), (3, "3".to_string()));
        assert_eq!(a2.value()["spec"]["cpus"], 4);
        assert_eq!(store.commit(&key(), "ns", "a", Expect::Version(2), Some(vm("a", "u-a"))).unwrap_err(), CommitError::Conflict);
        let got = store.get(&key(), "ns", "a").unwrap();
        assert_eq!(got.json(), a2.json());
        assert_eq!(store.locate_uid("u-a"), Some((key(), "ns".to_string(), "a".to_string())));
        assert_eq!(store.current_rv(), 3);
    }

    #[test]
    fn a_delete_carries_its_own_version_and_events_share_the_stored_text() {
        let store = Store::in_memory(100);
        let mut rx = store.subscribe();
        let a = store.commit(&key(), "ns", "a", Expect::Absent, Some(vm("a", "u-a"))).unwrap();
        let added = rx.try_recv().unwrap();
        assert_eq!(added.etype, EventType::Added);
        assert!(std::ptr::eq(added.object.json(), a.json()), "the event shares the stored buffer");
        let gone = store.commit(&key(), "ns", "a", Expect::Version(a.rv()), None).unwrap();
        assert_eq!((gone.rv(), served_rv(&gone)), (3, "3".to_string()));
        let mut expected = a.value();
        expected["metadata"]["resourceVersion"] = json!("3");
        assert_eq!(gone.value(), expected, "the last state, at the deletion's resourceVersion");
        let deleted = rx.try_recv().unwrap();
        assert_eq!(deleted.etype, EventType::Deleted);
        assert!(std::ptr::eq(deleted.old.as_ref().unwrap().json(), a.json()));
        assert!(store.get(&key(), "ns", "a").is_none() && store.locate_uid("u-a").is_none());
        // The history holds the same events: no copies.
        let (past, _) = store.watch_from(1).unwrap();
        assert_eq!(past.len(), 2);
        assert!(std::ptr::eq(past[1].object.json(), gone.json()));
    }

    #[test]
    fn watches_resume_from_the_history_or_are_told_it_is_gone() {
        let store = Store::in_memory(2);
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            store.commit(&key(), "ns", name, Expect::Absent, Some(vm(name, &format!("u-{i}")))).unwrap();
        }
        let (past, _) = store.watch_from(2).unwrap();
        assert_eq!(past.iter().map(|e| (e.rv, e.object.name())).collect::<Vec<_>>(), [(3, "b"), (4, "c")]);
        assert_eq!(store.watch_from(1).unwrap_err(), 2);
        let (items, rv) = store.list(&key(), Some("ns"));
        assert_eq!((items.len(), rv), (3, 4));
        assert_eq!(items.iter().map(served_rv).collect::<Vec<_>>(), ["2", "3", "4"]);
    }

    #[test]
    fn a_data_directory_gives_back_the_same_text() {
        let dir = std::env::temp_dir().join(format!("banlieue-store-test-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kept = {
            let store = Store::open(&dir, 100).unwrap();
            let a = store.commit(&key(), "ns", "a", Expect::Absent, Some(vm("a", "u-a"))).unwrap();
            let b = store.commit(&key(), "ns", "b", Expect::Absent, Some(vm("b", "u-b"))).unwrap();
            store.commit(&key(), "ns", "b", Expect::Version(b.rv()), None).unwrap();
            store.close();
            a
        };
        let store = Store::open(&dir, 100).unwrap();
        // Past every resourceVersion that may have been handed out (the first write reserved a block).
        assert_eq!(store.current_rv(), 2 + RV_BLOCK);
        let a = store.get(&key(), "ns", "a").unwrap();
        assert_eq!(a.json(), kept.json(), "byte for byte");
        assert_eq!((a.rv(), a.label("app")), (2, Some("web")));
        assert!(store.get(&key(), "ns", "b").is_none() && store.locate_uid("u-b").is_none());
        assert_eq!(store.locate_uid("u-a"), Some((key(), "ns".to_string(), "a".to_string())));
        // Writes go on from there.
        let a2 = store.commit(&key(), "ns", "a", Expect::Version(2), Some(vm("a", "u-a"))).unwrap();
        assert_eq!(served_rv(&a2), (3 + RV_BLOCK).to_string());
        store.close();
        let _ = std::fs::remove_dir_all(dir);
    }
}
