//! The server's own controllers, driven by the store's events (no polling):
//! owner-reference garbage collection (background, foreground, orphan),
//! namespace termination, and removal of a deleted CRD's objects.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::objects::builtins::CRD_CLEANUP_FINALIZER;
use crate::objects::meta;
use crate::objects::{delete_object, write, Current, FieldValidation, Propagation, WriteError, WriteOpts};
use crate::schema::registry::{Builtin, ResourceType, StorageKey};
use crate::storage::object::Object;
use crate::storage::state::State;
use crate::storage::store::{Event, EventType};

const MANAGER: &str = "generic-garbage-collector";

type ObjRef = (StorageKey, String, String);

struct Collector {
    state: Arc<State>,
    /// owner UID → its dependents.
    dependents: HashMap<String, BTreeSet<ObjRef>>,
    /// dependent → the owner UIDs it is indexed under.
    owners_of: HashMap<ObjRef, Vec<String>>,
}

pub fn spawn(state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let rx = state.store.subscribe();
    tokio::spawn(async move {
        let mut c = Collector { state, dependents: HashMap::new(), owners_of: HashMap::new() };
        let mut rx = rx;
        c.resync();
        loop {
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = stop.changed() => return,
            };
            match ev {
                Ok(ev) => c.handle(&ev),
                Err(broadcast::error::RecvError::Lagged(_)) => c.resync(),
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

impl Collector {
    fn rt_for(&self, key: &str) -> Option<Arc<ResourceType>> {
        self.state.registry.read().unwrap().all().into_iter().find(|t| &*t.storage_key() == key)
    }

    fn index(&mut self, r: ObjRef, obj: Option<&Object>) {
        if let Some(old) = self.owners_of.remove(&r) {
            for o in old {
                if let Some(set) = self.dependents.get_mut(&o) {
                    set.remove(&r);
                    if set.is_empty() {
                        self.dependents.remove(&o);
                    }
                }
            }
        }
        if let Some(obj) = obj {
            let owners: Vec<String> = obj.owner_uids().map(String::from).collect();
            if !owners.is_empty() {
                for o in &owners {
                    self.dependents.entry(o.clone()).or_default().insert(r.clone());
                }
                self.owners_of.insert(r, owners);
            }
        }
    }

    /// Rebuild the index and redo whatever work is pending (start, or missed events).
    fn resync(&mut self) {
        self.dependents.clear();
        self.owners_of.clear();
        let types = self.state.registry.read().unwrap().all();
        let mut seen = BTreeSet::new();
        let mut all = Vec::new();
        for t in types {
            let key = t.storage_key();
            if !seen.insert(key.clone()) {
                continue;
            }
            for obj in self.state.store.list(&key, None).0 {
                let r = (key.clone(), obj.namespace().to_string(), obj.name().to_string());
                self.index(r, Some(&obj));
                all.push((key.clone(), obj));
            }
        }
        for (key, obj) in all {
            self.process(&key, &obj);
            if obj.owner_uids().next().is_some() {
                self.collect_if_orphaned(&key, &obj);
            }
        }
    }

    fn handle(&mut self, ev: &Event) {
        let namespace = ev.object.namespace();
        let r = (ev.key.clone(), namespace.to_string(), ev.object.name().to_string());
        match ev.etype {
            EventType::Added | EventType::Modified => {
                self.index(r, Some(&ev.object));
                if ev.etype == EventType::Added && ev.object.owner_uids().next().is_some() {
                    self.collect_if_orphaned(&ev.key, &ev.object);
                }
                self.process(&ev.key, &ev.object);
            }
            EventType::Deleted => {
                self.index(r, None);
                let uid = ev.object.uid();
                // Dependents of the removed object.
                let deps: Vec<ObjRef> = self.dependents.get(uid).map(|s| s.iter().cloned().collect()).unwrap_or_default();
                for (k, ns, name) in deps {
                    if let Some(obj) = self.state.store.get(&k, &ns, &name) {
                        self.collect_if_orphaned(&k, &obj);
                    }
                }
                // Owners waiting in foreground deletion for this object to go.
                for owner in ev.object.owner_uids() {
                    if let Some((k, ns, name)) = self.state.store.locate_uid(owner) {
                        if let Some(o) = self.state.store.get(&k, &ns, &name) {
                            self.process(&k, &o);
                        }
                    }
                }
                // A namespace or CRD waiting for its contents to go.
                if !namespace.is_empty() {
                    let ns_rt = self.state.builtin("", "namespaces");
                    if let Some(n) = self.state.store.get(&ns_rt.storage_key(), "", namespace) {
                        self.process(&ns_rt.storage_key(), &n);
                    }
                }
                if let Some(rt) = self.rt_for(&ev.key) {
                    if let Some(crd_name) = &rt.crd_name {
                        let crd_rt = self.state.builtin("apiextensions.k8s.io", "customresourcedefinitions");
                        if let Some(crd) = self.state.store.get(&crd_rt.storage_key(), "", crd_name) {
                            self.process(&crd_rt.storage_key(), &crd);
                        }
                    }
                }
            }
        }
    }

    /// Delete a dependent none of whose owners exist any more.
    fn collect_if_orphaned(&mut self, key: &StorageKey, obj: &Object) {
        let alive = obj.owner_uids().any(|u| self.state.store.locate_uid(u).is_some());
        if !alive && !obj.is_deleting() {
            if let Some(rt) = self.rt_for(key) {
                self.delete(&rt, obj, Propagation::Background);
            }
        }
    }

    /// Work on an object that is being deleted.
    fn process(&mut self, key: &StorageKey, obj: &Object) {
        if !obj.is_deleting() {
            return;
        }
        let Some(rt) = self.rt_for(key) else { return };
        let finalizers = meta::finalizers(&obj.value());
        let uid = obj.uid().to_string();
        let deps: Vec<ObjRef> = self.dependents.get(&uid).map(|s| s.iter().cloned().collect()).unwrap_or_default();
        if finalizers.iter().any(|f| f == "orphan") {
            for (k, ns, name) in &deps {
                if let (Some(d), Some(drt)) = (self.state.store.get(k, ns, name), self.rt_for(k)) {
                    self.update(&drt, &d, |v| remove_owner_ref(v, &uid));
                }
            }
            self.update(&rt, obj, |v| drop_finalizer(v, "orphan"));
            return;
        }
        if finalizers.iter().any(|f| f == "foregroundDeletion") {
            if deps.is_empty() {
                self.update(&rt, obj, |v| drop_finalizer(v, "foregroundDeletion"));
            } else {
                for (k, ns, name) in &deps {
                    if let (Some(d), Some(drt)) = (self.state.store.get(k, ns, name), self.rt_for(k)) {
                        if !d.is_deleting() {
                            self.delete(&drt, &d, Propagation::Foreground);
                        }
                    }
                }
            }
            return;
        }
        match rt.builtin {
            Some(Builtin::Namespace) => self.terminate_namespace(&rt, obj),
            Some(Builtin::Crd) if finalizers.iter().any(|f| f == CRD_CLEANUP_FINALIZER) => self.cleanup_crd(&rt, obj),
            _ => {}
        }
    }

    /// Delete everything in a terminating namespace; finalize it once empty.
    fn terminate_namespace(&mut self, rt: &ResourceType, ns_obj: &Object) {
        let ns = ns_obj.name().to_string();
        let keys = self.state.store.keys_with_objects_in(&ns);
        if keys.is_empty() {
            self.update(rt, ns_obj, |v| {
                v["spec"]["finalizers"] = Value::Array(vec![]);
            });
            return;
        }
        for key in keys {
            let Some(t) = self.rt_for(&key) else { continue };
            for obj in self.state.store.list(&key, Some(&ns)).0 {
                if !obj.is_deleting() {
                    self.delete(&t, &obj, Propagation::Background);
                }
            }
        }
    }

    /// Delete every object of a deleted CRD; drop its finalizer once none remain.
    fn cleanup_crd(&mut self, crd_rt: &ResourceType, crd: &Object) {
        let name = crd.name();
        let types: Vec<Arc<ResourceType>> =
            self.state.registry.read().unwrap().all().into_iter().filter(|t| t.crd_name.as_deref() == Some(name)).collect();
        let mut remaining = 0;
        if let Some(t) = types.first() {
            for obj in self.state.store.list(&t.storage_key(), None).0 {
                remaining += 1;
                if !obj.is_deleting() {
                    self.delete(t, &obj, Propagation::Background);
                }
            }
        }
        if remaining == 0 {
            self.update(crd_rt, crd, |v| drop_finalizer(v, CRD_CLEANUP_FINALIZER));
        }
    }

    /// Delete an object, re-reading it when it changed underneath: a namespace's objects are
    /// deleted once, when it terminates, so one lost to a concurrent write (a controller's
    /// status update) would otherwise keep it Terminating until something else in it goes.
    fn delete(&self, rt: &ResourceType, obj: &Object, p: Propagation) {
        for _ in 0..8 {
            let Some(cur) = self.state.store.get(&rt.storage_key(), obj.namespace(), obj.name()) else { return };
            if cur.uid() != obj.uid() {
                return;
            }
            match delete_object(&self.state, rt, &cur, p, false) {
                Ok(_) => return,
                Err(WriteError::Stale) => continue,
                Err(WriteError::Api(e)) => return tracing::warn!("garbage collector could not delete {}: {e}", obj.name()),
            }
        }
    }

    /// Re-read and update an object, retrying when it changed underneath.
    fn update(&self, rt: &ResourceType, obj: &Object, f: impl Fn(&mut Value)) {
        for _ in 0..8 {
            let Some(cur) = self.state.store.get(&rt.storage_key(), obj.namespace(), obj.name()) else { return };
            if cur.uid() != obj.uid() {
                return;
            }
            let cur = Current::of(cur);
            let mut new = cur.tree.clone();
            f(&mut new);
            let opts = WriteOpts { manager: MANAGER, subresource: None, fv: FieldValidation::Ignore, dry_run: false, managed_done: false };
            match write(&self.state, rt, &cur, new, &opts, &mut vec![]) {
                Ok(_) => return,
                Err(WriteError::Stale) => continue,
                Err(WriteError::Api(e)) => return tracing::warn!("garbage collector could not update {}: {e}", obj.name()),
            }
        }
    }
}

fn drop_finalizer(v: &mut Value, f: &str) {
    let rest: Vec<String> = meta::finalizers(v).into_iter().filter(|x| x != f).collect();
    meta::set_finalizers(v, &rest);
}

fn remove_owner_ref(v: &mut Value, uid: &str) {
    let m = meta::meta_mut(v);
    if let Some(Value::Array(refs)) = m.get_mut("ownerReferences") {
        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
        if refs.is_empty() {
            m.remove("ownerReferences");
        }
    }
}
