//! The gauges of how things are, read at each scrape from what this process holds: the
//! controllers' informer caches (VMs, Machines, Providers, pools, images), the throttles,
//! the shards and the backend sessions. A controller adds its cache as a [`Source`] when it
//! starts; a process standing by for a role has none of that role's caches and exports
//! none of its gauges. A relist swaps a cache's content at once, so a scrape sees the
//! list before or after, never half of it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use banlieue_api::{Provider, VMImage, VirtualMachine, VirtualMachinePool};
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::{provider_labels, Labels};

/// One family read at scrape time.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
pub struct Desc {
    pub name: &'static str,
    help: &'static str,
    counter: bool,
}

const fn gauge(name: &'static str, help: &'static str) -> Desc {
    Desc { name, help, counter: false }
}

pub const VIRTUAL_MACHINES: Desc = gauge("virtualmachines", "VirtualMachines by phase (Pending, Provisioning, Ready, NotReady, Deleting), per namespace and Provider");
pub const VM_CONDITIONS: Desc = gauge("virtualmachine_conditions", "VirtualMachines per condition, status and reason");
pub const PROVISIONING_OLDEST: Desc = gauge("virtualmachine_provisioning_oldest_seconds", "Age of the oldest VM not provisioned yet (Pending or Provisioning)");
pub const MACHINES: Desc = gauge("machines", "Infrastructure Machines by kind and phase, per namespace and Provider");
pub const PROVIDER_READY: Desc = gauge("provider_ready", "1 when the Provider is Ready, else 0");
pub const FREE_CPUS: Desc = gauge("provider_free_cpus", "Free CPUs of a failure domain, as the driver's last probe said");
pub const FREE_MEMORY: Desc = gauge("provider_free_memory_bytes", "Free memory of a failure domain, as the driver's last probe said");
pub const FREE_STORAGE: Desc = gauge("provider_free_storage_bytes", "Free storage of a failure domain, as the driver's last probe said");
pub const POOL_REPLICAS: Desc = gauge("pool_replicas", "VirtualMachinePool replicas: desired, current, ready, updated");
pub const IMAGE_IMPORTS: Desc = gauge("vmimage_imports", "VMImage imports per Provider by phase");
pub const THROTTLE_QUEUED: Desc = gauge("throttle_queued", "Machine operations waiting for one of their Provider's slots or rate");
pub const THROTTLE_IN_FLIGHT: Desc = gauge("throttle_in_flight", "Machine operations under way, per Provider");
pub const SHARDS: Desc = gauge("shards", "Shards the work is split into (--shards)");
pub const SHARD_HELD: Desc = gauge("shard_held", "1 for each shard this replica holds");
pub const SHARD_HANDOVERS: Desc = Desc { name: "shard_handovers", help: "Shards this replica gained or lost", counter: true };
pub const LOGINS: Desc = Desc { name: "backend_logins", help: "Backend sessions a driver stored (logins), per Provider", counter: true };
pub const SESSION_REUSES: Desc = Desc { name: "backend_session_reuses", help: "Driver calls that found their Provider's stored session and reused it", counter: true };

/// What one scrape read, summed per series.
#[derive(Default)]
pub struct Snapshot {
    values: BTreeMap<Desc, BTreeMap<Labels, f64>>,
}

impl Snapshot {
    pub fn add(&mut self, desc: Desc, labels: Labels, value: f64) {
        *self.values.entry(desc).or_default().entry(labels).or_default() += value;
    }

    /// Keep the largest value seen for the series.
    pub fn max(&mut self, desc: Desc, labels: Labels, value: f64) {
        let v = self.values.entry(desc).or_default().entry(labels).or_insert(value);
        *v = v.max(value);
    }

    /// The series of one family (tests).
    pub fn series(&self, desc: Desc) -> BTreeMap<Labels, f64> {
        self.values.get(&desc).cloned().unwrap_or_default()
    }

    /// How many series in all (the cardinality bound is on this).
    pub fn len(&self) -> usize {
        self.values.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Something read at each scrape.
pub type Source = Box<dyn Fn(&mut Snapshot) + Send + Sync>;

/// The sources of this process.
#[derive(Default)]
pub struct Fleet {
    sources: Mutex<Vec<Source>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").finish_non_exhaustive()
    }
}

impl Fleet {
    pub fn add(&self, source: Source) {
        self.lock().push(source);
    }

    /// Read every source now.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        for source in self.lock().iter() {
            source(&mut s);
        }
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Source>> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The VMs of `store`.
    pub fn virtual_machines(&self, store: Store<VirtualMachine>) {
        self.add(Box::new(move |s| {
            let now = k8s_openapi::jiff::Timestamp::now();
            store.state().iter().for_each(|vm| virtual_machine(s, vm, now));
        }));
    }

    /// The Machines of the provider role's caches (one per infrastructure kind).
    pub fn machines(&self, caches: Arc<Mutex<Vec<Store<DynamicObject>>>>) {
        self.add(Box::new(move |s| {
            let stores = caches.lock().unwrap_or_else(|e| e.into_inner()).clone();
            stores.iter().flat_map(Store::state).for_each(|m| machine(s, &m));
        }));
    }

    pub fn providers(&self, store: Store<Provider>) {
        self.add(Box::new(move |s| store.state().iter().for_each(|p| provider(s, p))));
    }

    pub fn pools(&self, store: Store<VirtualMachinePool>) {
        self.add(Box::new(move |s| store.state().iter().for_each(|p| pool(s, p))));
    }

    pub fn images(&self, store: Store<VMImage>) {
        self.add(Box::new(move |s| store.state().iter().for_each(|i| image(s, i))));
    }
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Where a VM stands, in one word.
pub fn vm_phase(vm: &VirtualMachine) -> &'static str {
    let status = vm.status.clone().unwrap_or_default();
    if vm.metadata.deletion_timestamp.is_some() {
        "Deleting"
    } else if condition(&status.conditions, "Ready").is_some_and(|c| c.status == "True") {
        "Ready"
    } else if status.scheduled.is_none() {
        "Pending"
    } else if status.initialization.as_ref().and_then(|i| i.provisioned) != Some(true) {
        "Provisioning"
    } else {
        "NotReady"
    }
}

pub fn virtual_machine(s: &mut Snapshot, vm: &VirtualMachine, now: k8s_openapi::jiff::Timestamp) {
    let ns = vm.namespace().unwrap_or_default();
    let provider = vm.status.as_ref().and_then(|st| st.scheduled.as_ref()).map(|sc| sc.provider.clone()).unwrap_or_default();
    let at = || vec![("namespace", ns.clone()), ("provider", provider.clone())];
    let phase = vm_phase(vm);
    let mut labels = at();
    labels.push(("phase", phase.to_string()));
    s.add(VIRTUAL_MACHINES, labels, 1.0);
    // 0 where no VM waits, so that the series is there to be alerted on.
    let waiting = matches!(phase, "Pending" | "Provisioning");
    let age = vm.metadata.creation_timestamp.as_ref().filter(|_| waiting).map(|t| (now.as_second() - t.0.as_second()).max(0) as f64);
    s.max(PROVISIONING_OLDEST, at(), age.unwrap_or(0.0));
    for c in vm.status.as_ref().map(|st| st.conditions.as_slice()).unwrap_or_default() {
        let mut labels = at();
        labels.extend([("condition", c.type_.clone()), ("status", c.status.clone()), ("reason", c.reason.clone())]);
        s.add(VM_CONDITIONS, labels, 1.0);
    }
}

pub fn machine(s: &mut Snapshot, m: &DynamicObject) {
    let kind = m.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
    let phase = if m.metadata.deletion_timestamp.is_some() {
        "Deleting".to_string()
    } else {
        m.data["status"]["phase"].as_str().unwrap_or("Unknown").to_string()
    };
    let provider = m.data["spec"]["providerRef"]["name"].as_str().unwrap_or_default().to_string();
    let labels = vec![("namespace", m.namespace().unwrap_or_default()), ("provider", provider), ("kind", kind), ("phase", phase)];
    s.add(MACHINES, labels, 1.0);
}

pub fn provider(s: &mut Snapshot, p: &Provider) {
    let at = || provider_labels(&crate::key(p));
    let status = p.status.clone().unwrap_or_default();
    let ready = condition(&status.conditions, "Ready").is_some_and(|c| c.status == "True");
    let mut labels = at();
    labels.push(("class", p.spec.provider_class_ref.name.clone()));
    s.add(PROVIDER_READY, labels, if ready { 1.0 } else { 0.0 });
    for fd in &status.failure_domains {
        let mut labels = at();
        labels.push(("failure_domain", fd.name.clone()));
        s.add(FREE_CPUS, labels.clone(), fd.capacity.cpus as f64);
        s.add(FREE_MEMORY, labels.clone(), fd.capacity.memory_mib as f64 * 1024.0 * 1024.0);
        s.add(FREE_STORAGE, labels, fd.capacity.storage_gib as f64 * 1024.0 * 1024.0 * 1024.0);
    }
}

pub fn pool(s: &mut Snapshot, p: &VirtualMachinePool) {
    let status = p.status.clone().unwrap_or_default();
    let at = |state: &str| vec![("namespace", p.namespace().unwrap_or_default()), ("pool", p.name_any()), ("state", state.to_string())];
    s.add(POOL_REPLICAS, at("desired"), f64::from(p.spec.replicas));
    s.add(POOL_REPLICAS, at("current"), f64::from(status.replicas));
    s.add(POOL_REPLICAS, at("ready"), f64::from(status.ready_replicas));
    s.add(POOL_REPLICAS, at("updated"), f64::from(status.updated_replicas));
}

pub fn image(s: &mut Snapshot, i: &VMImage) {
    for import in i.status.iter().flat_map(|st| st.providers.iter()) {
        let mut labels = provider_labels(&import.provider);
        labels.push(("phase", format!("{:?}", import.phase)));
        s.add(IMAGE_IMPORTS, labels, 1.0);
    }
}

/// Writes a [`Fleet`]'s snapshot into each scrape.
#[derive(Debug)]
pub struct Collector(pub Arc<Fleet>);

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (desc, series) in self.0.snapshot().values {
            if desc.counter {
                let family: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>> = Family::default();
                series.iter().for_each(|(l, v)| {
                    family.get_or_create(l).inc_by(*v);
                });
                family.encode(encoder.encode_descriptor(desc.name, desc.help, None, family.metric_type())?)?;
            } else {
                let family: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
                series.iter().for_each(|(l, v)| {
                    family.get_or_create(l).set(*v);
                });
                family.encode(encoder.encode_descriptor(desc.name, desc.help, None, family.metric_type())?)?;
            }
        }
        Ok(())
    }
}
