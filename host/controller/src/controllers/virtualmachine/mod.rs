//! The VirtualMachine controller (role `controller`). A reconcile ([`Reconcile::run`]) is
//! one call per step:
//!
//! 1. finalizer `banlieue.io/virtualmachine`;
//! 2. guards: a cached copy older than this process's last decision waits for the watch;
//!    a paused VM pauses its Machine and stops there;
//! 3. resolve the VMClass, the VMImage and the user-data Secret (a GET of that one
//!    Secret: banlieue watches no Secrets, so a missing one is looked for again with backoff);
//!    check the declared addresses, and claim those from IP pools ([`crate::addressing`]): nothing is
//!    placed before every pool has answered;
//! 4. place: gather candidates ([`crate::placement::scheduling`]) and let the placement
//!    component choose — or keep the current placement while it still holds, and apply the
//!    `migrationPolicy` when it does not (sharded: a VM placed on another shard's Provider
//!    is handed over here);
//! 5. record the decision in `status.scheduled` and `status.infrastructureRef`
//!    *before* any Machine exists, so a crash never leaves a Machine nobody knows of;
//! 6. converge the Machine: on a move, delete the old one and wait until its finalizer has
//!    torn the backend VM down; then server-side-apply the `<Kind>Machine`;
//! 7. mirror the Machine's status; `Ready` only when the Machine says so.
//!
//! Deleting the VM deletes its Machine and waits for it to be gone, then releases its
//! IP address claims.

mod assumed;
mod moving;
mod network;
mod revert;
mod snapshots;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use banlieue_api::infra::{InfraMachineSpec, InfraMachineStatus, ResolvedVm};
use banlieue_api::provider::Provider;
use banlieue_api::vm::{DeletionPolicy, InfrastructureRef, MigrationPolicy, Scheduled, VirtualMachineStatus};
use banlieue_api::{PlacementPolicy, ProviderClass, VMClass, VMImage, VirtualMachine};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};

use self::assumed::Assumed;
use crate::addressing::{self, ipam};
use crate::failure::{api_failure, Failure};
use crate::framework::infra_kinds::PAUSED_ANNOTATION;
use crate::framework::infra_kinds;
use crate::framework::reconciler::{cached, hash_meta, CachesReady, Frame, Outcome, Retried};
use crate::placement::scheduling;
use crate::status::conditions::{self, ADDRESSES_READY, CONFIGURATION_APPLIED, CONFIGURATION_MATCHES, INFRASTRUCTURE_READY, PLACEMENT_VALID, READY, SCHEDULED};
use crate::status::finalizer;
use crate::status::reasons::Reason;
use crate::status;
use crate::{Context, Error, FIELD_MANAGER};

pub const FINALIZER: &str = "banlieue.io/virtualmachine";
pub const VM_LABEL: &str = "banlieue.io/vm";
/// When to look again at a VM whose cached copy was found older than the server's.
const STALE_CACHE_RETRY: std::time::Duration = std::time::Duration::from_millis(200);
/// When to look again, at the latest, at a VM waiting for its Machine to be gone. The
/// Machine's deletion event normally brings it back at once; but a deletion that happens
/// while the Machine watch is down (an API server restarting) is never an event — the
/// re-list just no longer holds the Machine — and the VM would wait forever (found by
/// `faults_api` against a SIGKILLed kube-apiserver: VMs stuck `Deleting` with their domains gone).
const MACHINE_GONE_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// What every reconcile of this controller shares.
struct Shared {
    ctx: Arc<Context>,
    frame: Frame<VirtualMachine>,
    vms: Store<VirtualMachine>,
    /// What a reconcile reads, kept by watches (the same ones that trigger reconciles).
    classes: Store<VMClass>,
    images: Store<VMImage>,
    providers: Store<Provider>,
    provider_classes: Store<ProviderClass>,
    caches_ready: CachesReady,
    /// Decisions this process made that the VM cache does not show yet.
    assumed: Assumed,
    /// Wakes a VM's reconcile (from watches other than the controller's own).
    wake: futures::channel::mpsc::UnboundedSender<ObjectRef<VirtualMachine>>,
    /// The watch on the VMs' IP address claims.
    claims: ipam::ClaimWatch,
}

impl Shared {
    async fn ready(&self) -> Result<(), Error> {
        self.caches_ready
            .wait(|| async {
                let not_ready = |_| Error::CacheStopped("VM reconciler");
                self.classes.wait_until_ready().await.map_err(not_ready)?;
                self.images.wait_until_ready().await.map_err(not_ready)?;
                self.providers.wait_until_ready().await.map_err(not_ready)?;
                self.provider_classes.wait_until_ready().await.map_err(not_ready)
            })
            .await
    }
}

pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    let client = ctx.client.clone();
    // The VM cache drops managedFields: they are most of a VM's size and no reconcile reads them.
    let (store, writer) = kube::runtime::reflector::store();
    let vm_changes = kube::runtime::reflector(
        writer,
        watcher(ctx.watched::<VirtualMachine>(), ctx.scope()).modify(|vm: &mut VirtualMachine| {
            vm.metadata.managed_fields = None;
        }),
    )
    .retried()
    .touched_objects()
    // Only what a reconcile acts on wakes it; its own status writes do not, except, when
    // sharded, a new placement (the VM moves to its Provider's shard, whose holder goes on).
    .predicate_filter(if ctx.shards.is_some() { acted_on_or_placed } else { acted_on_vm }, kube::runtime::PredicateConfig::default());
    let controller = Controller::for_stream(vm_changes, store.clone()).trigger_backoff(crate::framework::reconciler::PerWatch);
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tokio::spawn(watch_machines(ctx.clone(), tx.clone()));
    let by = |f: fn(&VirtualMachine, &str, Option<&str>) -> bool, store: Store<VirtualMachine>| {
        move |name: String, ns: Option<String>| -> Vec<ObjectRef<VirtualMachine>> {
            store
                .state()
                .into_iter()
                .filter(|vm| f(vm, &name, ns.as_deref()))
                .map(|vm| ObjectRef::from_obj(&*vm))
                .collect()
        }
    };
    let by_class = by(|vm, n, _| vm.spec.class_ref.name == n, store.clone());
    let by_image = by(|vm, n, _| vm.spec.image_ref.name == n, store.clone());
    let concerned = by(concerns_vm, store.clone());
    let unscheduled = by(|vm, _, _| unscheduled(vm), store.clone());
    let unscheduled_too = unscheduled.clone();
    let (classes, class_changes) = cached(Api::<VMClass>::all(client.clone()), ctx.scope());
    let (images, image_changes) = cached(Api::<VMImage>::all(client.clone()), ctx.scope());
    let (providers, provider_changes) = cached(ctx.watched::<Provider>(), ctx.scope());
    let (provider_classes, provider_class_changes) = cached(Api::<ProviderClass>::all(client.clone()), ctx.scope());
    let frame = Frame::new(ctx.clone(), "virtualmachine", store.clone(), ()).sharded_by(shard_key);
    ctx.metrics.fleet.virtual_machines(store.clone());
    // `status.operations` changes with every probe and concerns no VM.
    let provider_changes = provider_changes.filter(crate::framework::reconciler::provider_news(providers.clone()));
    let state = Arc::new(Shared {
        ctx: ctx.clone(),
        frame,
        vms: store,
        classes,
        images,
        providers,
        provider_classes,
        caches_ready: CachesReady::default(),
        assumed: Assumed::default(),
        wake: tx,
        claims: ipam::ClaimWatch::default(),
    });
    controller
        .reconcile_on(rx)
        .watches_stream(class_changes, move |o| by_class(o.name_any(), None))
        .watches_stream(image_changes, move |o| by_image(o.name_any(), None))
        .watches_stream(provider_changes, move |o| concerned(o.name_any(), o.namespace()))
        .watches_stream(provider_class_changes, move |o| unscheduled_too(o.name_any(), None))
        .watches_stream(crate::framework::reconciler::changes(Api::<PlacementPolicy>::all(client.clone()), ctx.scope()), move |o| unscheduled(o.name_any(), None))
        // A snapshot becoming Ready (or going) is news to a VM whose revertTo names it.
        .watches_stream(crate::framework::reconciler::changes(ctx.watched::<banlieue_api::VMSnapshot>(), ctx.scope()), |s| {
            s.namespace().map(|ns| ObjectRef::new(&s.spec.vm_ref.name).within(&ns))
        })
        .reconcile_all_on(crate::framework::reconciler::shard_gains(&ctx))
        .graceful_shutdown_on(stop)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.options.concurrency))
        .run(reconcile, |vm, err, state| state.frame.error_policy(&vm, err), state)
        .for_each(crate::framework::reconciler::log_run("virtualmachine"))
        .await;
    Ok(())
}

/// Whether a change of Provider `provider` in namespace `ns` concerns `vm`: a VM to be placed
/// (its candidates changed) or one placed on that Provider (its placement may no longer hold).
/// A VM placed on another Provider reads nothing of it; waking every VM of the namespace made
/// each change of a Provider's status (every probe that finds its capacity changed) cost one
/// reconcile and one Machine GET per VM.
fn concerns_vm(vm: &VirtualMachine, provider: &str, ns: Option<&str>) -> bool {
    vm.namespace().as_deref() == ns
        && (unscheduled(vm) || vm.status.as_ref().and_then(|s| s.scheduled.as_ref()).is_some_and(|s| s.provider == provider))
}

/// A VM to be placed (or placed again): not `Scheduled`.
fn unscheduled(vm: &VirtualMachine) -> bool {
    !vm.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, SCHEDULED))
}

/// A VM belongs to the shard of the Provider it is placed on, or, not placed yet, to its own.
pub fn shard_key(vm: &VirtualMachine) -> String {
    match vm.status.as_ref().and_then(|s| s.scheduled.as_ref()) {
        Some(s) => format!("{}/{}", vm.namespace().unwrap_or_default(), s.provider),
        None => crate::key(vm),
    }
}

/// What wakes a VM's reconcile: [`crate::framework::reconciler::acted_on`] without the finalizers (the
/// reconcile that adds banlieue's goes on by itself; no other finalizer concerns it).
fn acted_on_vm(vm: &VirtualMachine) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    vm.metadata.generation.hash(&mut h);
    hash_meta(&vm.metadata, false, &mut h);
    Some(h.finish())
}

/// [`acted_on_vm`], and the Provider the VM is placed on.
fn acted_on_or_placed(vm: &VirtualMachine) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    acted_on_vm(vm).hash(&mut h);
    vm.status.as_ref().and_then(|s| s.scheduled.as_ref()).map(|s| &s.provider).hash(&mut h);
    Some(h.finish())
}

/// Every change to a `<Kind>Machine` (of any kind, as kinds appear) reconciles the VM that owns it.
/// Only the owner is read here, so the watch asks for metadata only (the reconcile GETs the Machine).
async fn watch_machines(ctx: Arc<Context>, tx: futures::channel::mpsc::UnboundedSender<ObjectRef<VirtualMachine>>) {
    let mut kinds = infra_kinds::watch(ctx.client.clone(), ctx.scope()).boxed();
    while let Some(prefix) = kinds.next().await {
        let resource = infra_kinds::machine_resource(&prefix);
        let api: Api<PartialObjectMeta<DynamicObject>> = match &ctx.options.namespace {
            Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &resource),
            None => Api::all_with(ctx.client.clone(), &resource),
        };
        let (tx, scope) = (tx.clone(), ctx.scope());
        tokio::spawn(async move {
            let mut events = crate::framework::reconciler::changes(api, scope).boxed();
            while let Some(m) = events.next().await {
                let Ok(m) = m else { continue };
                let owner = m.owner_references().iter().find(|o| o.kind == "VirtualMachine" && o.api_version.starts_with(banlieue_api::GROUP));
                if let (Some(owner), Some(ns)) = (owner, m.namespace())
                    && tx.unbounded_send(ObjectRef::new(&owner.name).within(&ns)).is_err()
                {
                    return;
                }
            }
        });
    }
}

async fn reconcile(vm: Arc<VirtualMachine>, state: Arc<Shared>) -> Result<Action, Error> {
    state.ready().await?;
    state.frame.reconcile(&vm, Reconcile::new(&vm, &state).run()).await
}

/// Why the VM cannot progress: the failure, and the condition that shows it besides `Ready`.
struct Blocked {
    condition: &'static str,
    failure: Failure,
}

impl Blocked {
    fn on(condition: &'static str, failure: Failure) -> Blocked {
        Blocked { condition, failure }
    }
}

/// Blocked until something changes (a watch on what is missing brings the VM back).
fn blocked(condition: &'static str, reason: Reason, message: impl Into<String>) -> Blocked {
    Blocked::on(condition, Failure::until_changed(reason, message))
}

/// What the VM asks for, resolved from the caches (step 3).
struct Wanted {
    class: Arc<VMClass>,
    image: Arc<VMImage>,
    /// The provider classes the image has a source for.
    image_classes: BTreeSet<String>,
    /// The Providers of the VM's namespace, by name.
    providers: Vec<Arc<Provider>>,
}

/// The Machine that makes the VM on its Provider: its kind and name.
struct Target {
    resource: kube::api::ApiResource,
    reference: InfrastructureRef,
}

/// The VM's Machine as step 6 finds it.
enum Current {
    /// The Machine for this placement (none yet: it is made).
    Keep(Option<DynamicObject>),
    /// A Machine of another placement or being deleted: wait for it to go.
    Wait(Outcome),
    /// The Machine of the placement the VM is moving away from, carrying its disks.
    Carry(DynamicObject),
}

struct Reconcile<'a> {
    vm: &'a VirtualMachine,
    state: &'a Shared,
    ctx: &'a Context,
    api: Api<VirtualMachine>,
    ns: String,
    name: String,
    status: VirtualMachineStatus,
    generation: Option<i64>,
    /// A placement decision made by this reconcile, announced (as an event) once it is recorded.
    decided: Option<String>,
}

impl<'a> Reconcile<'a> {
    fn new(vm: &'a VirtualMachine, state: &'a Shared) -> Self {
        let ns = vm.namespace().unwrap_or_default();
        Reconcile {
            vm,
            state,
            ctx: &state.ctx,
            api: Api::namespaced(state.ctx.client.clone(), &ns),
            name: vm.name_any(),
            ns,
            status: vm.status.clone().unwrap_or_default(),
            generation: vm.metadata.generation,
            decided: None,
        }
    }

    async fn run(mut self) -> Result<Outcome, Error> {
        if self.vm.metadata.deletion_timestamp.is_some() {
            return self.delete().await;
        }
        if let Some(wait) = self.ensure_finalizer().await? {
            return Ok(wait);
        }
        // The Machine the status names, read once for this reconcile.
        let machine = match self.status.infrastructure_ref.clone() {
            Some(r) => self.get_machine(&r).await.map_err(api_error),
            None => Ok(None),
        };
        if let Some(wait) = self.guards(&machine).await? {
            return Ok(wait);
        }
        let outcome = match self.converge(machine).await {
            Ok(outcome) => outcome,
            Err(blocked) => self.report(blocked).await,
        };
        self.record().await?;
        Ok(outcome)
    }

    /// Step 1. Added with the resourceVersion read; the reconcile goes on (status writes do
    /// not depend on it), so a new VM costs one reconcile, not two.
    async fn ensure_finalizer(&self) -> Result<Option<Outcome>, Error> {
        if finalizer::has(self.vm, FINALIZER) {
            return Ok(None);
        }
        match finalizer::add(&self.api, self.vm, FINALIZER).await {
            Ok(()) => Ok(None),
            // The cached VM is older than the server's (a Machine event can wake this VM
            // before the watch has brought back the finalizer this process added): look
            // again shortly instead of failing into a backoff.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(Outcome::Requeue(STALE_CACHE_RETRY))),
            Err(e) => Err(e.into()),
        }
    }

    /// Step 2: what stops the reconcile before it resolves anything — a cached copy older
    /// than this process's last decision, or the VM paused (its Machine is paused with it).
    async fn guards(&self, machine: &Result<Option<DynamicObject>, Blocked>) -> Result<Option<Outcome>, Error> {
        if self.state.assumed.stale(self.vm) {
            return Ok(Some(Outcome::Requeue(STALE_CACHE_RETRY)));
        }
        if let Ok(Some(m)) = machine {
            self.set_machine_paused(m, self.vm.spec.paused).await?;
        }
        Ok(self.vm.spec.paused.then_some(Outcome::AwaitChange))
    }

    /// Steps 3 to 7: resolve, place, record, converge the Machine, mirror it.
    async fn converge(&mut self, machine: Result<Option<DynamicObject>, Blocked>) -> Result<Outcome, Blocked> {
        let wanted = self.resolve().await?;
        let addressing = self.claim_addresses().await?;
        let scheduled = self.place(&wanted).await?;
        if self.handed_over(&scheduled) {
            // Placed on a Provider of another shard: the decision is recorded here, and the
            // holder of that shard (woken by it) makes the Machine.
            self.record().await.map_err(status_error)?;
            return Ok(Outcome::AwaitChange);
        }
        let (provider, target) = self.target(&wanted, &scheduled)?;
        let existing = match self.current_machine(machine?, &target, &scheduled).await? {
            Current::Keep(existing) => existing,
            Current::Wait(outcome) => return Ok(outcome),
            Current::Carry(old) => return self.carry(old, &wanted, &provider, &target, &scheduled, &addressing).await,
        };
        let revert = self.revert(existing.as_ref()).await?;
        let restore = self.restore(&scheduled.provider, existing.as_ref()).await?;
        let mut spec = self.machine_spec(&wanted.class, &wanted.image, &provider, &scheduled, &addressing, existing.as_ref())?;
        spec.vm.revert = revert;
        spec.vm.restore = restore;
        self.note_machine(&target, &spec);
        // The decision and the Machine it names are recorded (one write) before the Machine exists.
        self.record().await.map_err(status_error)?;
        let machine = self.apply_machine(&target.resource, &target.reference.name, spec, existing).await?;
        // A Machine that has not reported yet leaves the VM as the decision put it
        // (provisioning there): its first status brings the VM back.
        if machine.data.get("status").is_some_and(|s| !s.is_null()) {
            self.mirror(&machine, &target.reference);
        }
        // A move's last step: the machine it left goes.
        if let Some(outcome) = self.finish_move().await? {
            return Ok(outcome);
        }
        Ok(Outcome::AwaitChange)
    }

    /// Say why the VM cannot progress: on the condition the failure belongs to and on
    /// `Ready`, announced once.
    async fn report(&mut self, Blocked { condition, failure }: Blocked) -> Outcome {
        let news = self.set(condition, false, failure.reason, failure.message.clone());
        self.set(READY, false, failure.reason, failure.message.clone());
        let outcome = Outcome::after(&failure);
        if news {
            // Waiting for an IPAM provider is the normal course of a VM with pools, not a fault.
            let warning = failure.reason != Reason::WaitingForIPAddress;
            self.event(warning, failure.reason, "Reconcile", failure.message).await;
        }
        outcome
    }

    /// Write the status (when it changed), then announce a decision it records.
    async fn record(&mut self) -> Result<(), Error> {
        if let Err(e) = self.write_status().await {
            if self.decided.take().is_some() {
                self.state.assumed.forget(self.vm);
            }
            return Err(e);
        }
        if let Some(message) = self.decided.take() {
            self.event(false, Reason::Scheduled, "Schedule", message).await;
        }
        Ok(())
    }

    /// Set a condition of the VM; whether that is news (see [`conditions::set`]).
    fn set(&mut self, type_: &str, status: bool, reason: Reason, message: impl Into<String>) -> bool {
        conditions::set(&mut self.status.conditions, type_, status, reason, message, self.generation)
    }

    async fn event(&self, warning: bool, reason: Reason, action: &str, note: impl Into<String>) {
        self.ctx.event(&self.vm.object_ref(&()), warning, reason, action, note).await;
    }

    /// Step 3: the VM's class, image and user-data, and the Providers of its namespace.
    async fn resolve(&self) -> Result<Wanted, Blocked> {
        let spec = &self.vm.spec;
        let class = self
            .state
            .classes
            .get(&ObjectRef::new(&spec.class_ref.name))
            .ok_or_else(|| blocked(SCHEDULED, Reason::ClassNotFound, format!("VMClass {:?} not found", spec.class_ref.name)))?;
        // An adopted VM keeps what it boots from: its image, if named at all, only says what that is.
        if spec.adopt.is_some() && spec.placement.as_ref().and_then(|p| p.provider_ref.as_ref()).is_none() {
            return Err(blocked(SCHEDULED, Reason::InvalidSpec, "spec.adopt needs spec.placement.providerRef: the Provider whose backend holds the VM"));
        }
        if spec.image_ref.name.is_empty() && spec.adopt.is_none() {
            return Err(blocked(SCHEDULED, Reason::ImageNotFound, "spec.imageRef is required (only a VM that adopts one, spec.adopt, may leave it out)"));
        }
        let image = match spec.image_ref.name.as_str() {
            "" => Arc::new(VMImage::default()),
            name => self.state.images.get(&ObjectRef::new(name)).ok_or_else(|| blocked(SCHEDULED, Reason::ImageNotFound, format!("VMImage {name:?} not found")))?,
        };
        // Addresses are checked before the VM is placed: a bad one makes nothing.
        addressing::check(self.vm.spec.network.as_ref(), &class).map_err(|m| blocked(ADDRESSES_READY, Reason::InvalidNetwork, m))?;
        if let Some((ip, other)) = network::conflict(self.vm, self.state.vms.state().iter().map(|v| &**v)) {
            // Retried: the address is this VM's once the other lets it go (nothing else wakes it).
            let message = format!("spec.network: {ip} is VirtualMachine {other:?}'s address already: give this VM another one");
            return Err(Blocked::on(ADDRESSES_READY, Failure::transient(Reason::AddressConflict, message)));
        }
        // User-data is read when the backend VM is made: checked here (one GET) only while
        // the VM has no Machine yet, so a missing Secret shows before anything is made.
        let has_machine = self.status.infrastructure_ref.as_ref().is_some_and(|r| r.uid.is_some());
        if let (Some(u), false) = (&spec.user_data, has_machine) {
            let secret = Api::<Secret>::namespaced(self.ctx.client.clone(), &self.ns)
                .get_opt(&u.name)
                .await
                .map_err(api_error)?
                .ok_or_else(|| Blocked::on(SCHEDULED, Failure::transient(Reason::UserDataNotFound, format!("user-data Secret {:?} not found", u.name))))?;
            let has_key = secret.data.as_ref().is_some_and(|d| d.contains_key(&u.key)) || secret.string_data.as_ref().is_some_and(|d| d.contains_key(&u.key));
            if !has_key {
                return Err(Blocked::on(SCHEDULED, Failure::transient(Reason::UserDataNotFound, format!("Secret {:?} has no key {:?}", u.name, u.key))));
            }
        }
        let mut providers: Vec<Arc<Provider>> =
            self.state.providers.state().into_iter().filter(|p| p.namespace().as_deref() == Some(self.ns.as_str())).collect();
        providers.sort_by_key(|p| p.name_any());
        let image_classes = match spec.adopt {
            // Any Provider may hold the VM to adopt, whatever images it has.
            Some(_) => providers.iter().map(|p| p.spec.provider_class_ref.name.clone()).collect(),
            None => image.spec.sources.iter().map(|s| s.provider_class.clone()).collect(),
        };
        Ok(Wanted { class, image, image_classes, providers })
    }

    /// Step 3, addresses from pools: release the claims the spec no longer asks for, make
    /// (recorded first) those it does, and read what each pool gave. Every addressed NIC's
    /// addressing, once every pool has answered; until then the VM waits, placed nowhere
    /// (the claims' watch brings it back).
    async fn claim_addresses(&mut self) -> Result<BTreeMap<String, banlieue_api::common::StaticIp>, Blocked> {
        let wanted = ipam::wanted(&self.name, self.vm.spec.network.as_ref());
        let client = self.ctx.client.clone();
        let released: Vec<String> = self.status.ip_address_claims.iter().filter(|n| !wanted.iter().any(|w| &&w.name == n)).cloned().collect();
        for name in released {
            ipam::release(&client, &self.ns, &name).await.map_err(api_error)?;
            self.status.ip_address_claims.retain(|n| *n != name);
        }
        if !wanted.is_empty() {
            self.watch_claims().await?;
            let new: Vec<String> = wanted.iter().filter(|w| !self.status.ip_address_claims.contains(&w.name)).map(|w| w.name.clone()).collect();
            if !new.is_empty() {
                self.status.ip_address_claims.extend(new);
                self.record().await.map_err(status_error)?;
            }
        }
        let owner = self.vm.controller_owner_ref(&()).ok_or_else(|| blocked(READY, Reason::Internal, "VM has no uid"))?;
        let mut labels = BTreeMap::from([(VM_LABEL.to_string(), self.name.clone())]);
        self.ctx.options.installation.mark(&mut labels);
        let allocated = ipam::claim(&client, &self.ns, &owner, &labels, &wanted)
            .await
            .map_err(api_error)?
            .map_err(|why| blocked(ADDRESSES_READY, Reason::WaitingForIPAddress, why))?;
        addressing::resolve(self.vm.spec.network.as_ref(), &allocated).map_err(|m| blocked(ADDRESSES_READY, Reason::InvalidNetwork, m))
    }

    /// Start the claims' watch once (each claim's change brings its VM back).
    async fn watch_claims(&self) -> Result<(), Blocked> {
        let wake = self.state.wake.clone();
        self.state
            .claims
            .start(&self.state.ctx, &self.ns, VM_LABEL, move |vm, ns| wake.unbounded_send(ObjectRef::new(vm).within(ns)).is_ok())
            .await
            .map_err(|f| Blocked::on(ADDRESSES_READY, f))
    }

    /// Whether, sharded, the VM's placement puts it on another shard's Provider.
    fn handed_over(&self, scheduled: &Scheduled) -> bool {
        let Some(shards) = &self.ctx.shards else { return false };
        shards.shard_of(&shard_key(self.vm)) != shards.shard_of(&format!("{}/{}", self.ns, scheduled.provider))
    }

    /// The Provider the VM is placed on, and the Machine (kind and name) that makes it there.
    fn target(&self, wanted: &Wanted, scheduled: &Scheduled) -> Result<(Arc<Provider>, Target), Blocked> {
        let provider = wanted
            .providers
            .iter()
            .find(|p| p.name_any() == scheduled.provider)
            .cloned()
            .ok_or_else(|| blocked(SCHEDULED, Reason::ProviderNotFound, format!("Provider {:?} not found", scheduled.provider)))?;
        let provider_class = self
            .state
            .provider_classes
            .get(&ObjectRef::new(&scheduled.provider_class))
            .ok_or_else(|| blocked(INFRASTRUCTURE_READY, Reason::ProviderClassNotFound, format!("ProviderClass {:?} not found", scheduled.provider_class)))?;
        let resource = infra_kinds::machine_resource(&provider_class.spec.infrastructure_kind);
        // A VM moved within one kind runs on a Machine of another name (see [`moving::moved_name`]).
        let name = match &self.status.infrastructure_ref {
            Some(r) if r.kind == resource.kind => r.name.clone(),
            _ => self.name.clone(),
        };
        let reference = InfrastructureRef { api_version: resource.api_version.clone(), kind: resource.kind.clone(), name, uid: None };
        Ok((provider, Target { resource, reference }))
    }

    /// Step 6, first half: the Machine the VM has, if it is the one for `scheduled` — or,
    /// when it was made for another placement, its teardown first.
    async fn current_machine(&mut self, machine: Option<DynamicObject>, target: &Target, scheduled: &Scheduled) -> Result<Current, Blocked> {
        let (Some(current), Some(old)) = (self.status.infrastructure_ref.clone(), machine) else { return Ok(Current::Keep(None)) };
        let old_spec: InfraMachineSpec = serde_json::from_value(old.data.get("spec").cloned().unwrap_or_default()).unwrap_or_default();
        let same = current.kind == target.reference.kind
            && old_spec.provider_ref.as_ref().map(|r| r.name.as_str()) == Some(scheduled.provider.as_str())
            && old_spec.failure_domain.as_deref() == Some(scheduled.failure_domain.as_str());
        if !same {
            if self.carrying() {
                return Ok(Current::Carry(old));
            }
            return self.move_away(&current, &old, scheduled).await.map(Current::Wait);
        }
        if old.metadata.deletion_timestamp.is_some() {
            // Deleted by someone else: its finalizer tears the backend VM down, and its
            // deletion brings the VM back to make a new one (re-applying now would ask
            // for a finalizer on an object being deleted, which the API server refuses).
            self.mirror(&old, &target.reference);
            return Ok(Current::Wait(Outcome::Requeue(MACHINE_GONE_RECHECK)));
        }
        Ok(Current::Keep(Some(old)))
    }

    /// Step 5: the Machine the decision names, and which import it is made from (for the
    /// imagebuilder to keep that import while the machine uses it), into the status.
    fn note_machine(&mut self, target: &Target, spec: &InfraMachineSpec) {
        let reference = &target.reference;
        if self.status.infrastructure_ref.as_ref().map(|r| (&r.kind, &r.name)) != Some((&reference.kind, &reference.name)) {
            self.status.infrastructure_ref = Some(reference.clone());
        }
        let made_from = ["template", "backingFile"].iter().find_map(|k| spec.vm.image.get(*k).cloned());
        if let Some(s) = self.status.scheduled.as_mut() {
            s.image = made_from;
        }
    }

    /// Keep the current placement while it holds; otherwise follow `migrationPolicy`.
    /// A new decision is written to status before anything acts on it.
    /// Step 4.
    async fn place(&mut self, wanted: &Wanted) -> Result<Scheduled, Blocked> {
        let Wanted { class, image, image_classes, providers } = wanted;
        let current = self.status.scheduled.clone();
        if let Some(current) = &current {
            let all = scheduling::candidates(self.vm, class, image_classes, providers, &self.state.assumed.placed_vms(&self.state.vms), false).map_err(|m| blocked(SCHEDULED, Reason::InvalidPlacement, m))?;
            if scheduling::still_valid(current, &all, &self.ns) {
                self.set(PLACEMENT_VALID, true, Reason::PlacementHolds, holds(current));
                return Ok(current.clone());
            }
            let why = format!("{}/{} no longer satisfies the placement", current.provider, current.failure_domain);
            if self.reverting() {
                // Not moved from under a revert: the snapshot is on this machine.
                self.set(PLACEMENT_VALID, false, Reason::MigrationPending, format!("{why}; it moves once its revert is done"));
                return Ok(current.clone());
            }
            let restart_bumped = self.vm.spec.restart_requested_at.is_some() && self.vm.spec.restart_requested_at != self.status.last_restart_requested_at;
            match self.vm.spec.migration_policy {
                MigrationPolicy::Automatic => {}
                MigrationPolicy::Manual if restart_bumped => {}
                MigrationPolicy::Manual => {
                    self.set(PLACEMENT_VALID, false, Reason::MigrationPending, format!("{why}; bump spec.restartRequestedAt to move it"));
                    return Ok(current.clone());
                }
                MigrationPolicy::Never => {
                    self.set(PLACEMENT_VALID, false, Reason::MigrationDisabled, format!("{why}; migrationPolicy is Never"));
                    return Ok(current.clone());
                }
                MigrationPolicy::AutomaticDroppingSnapshots => {}
            }
            if let Some(failed) = self.move_failed() {
                self.set(PLACEMENT_VALID, false, Reason::MoveFailed, format!("{why}; the last move failed ({failed}): change the VM's spec to try again"));
                return Ok(current.clone());
            }
            let source = providers.iter().find(|p| p.name_any() == current.provider).map(|p| &**p);
            if let Some(cannot) = self.carries().then(|| moving::lacks(source, &current.provider, "disk-export")).flatten() {
                self.set(PLACEMENT_VALID, false, Reason::CannotCarryDisks, format!("{why}; {cannot}"));
                return Ok(current.clone());
            }
            if let Some(stays) = self.snapshots_allow_move().await? {
                self.set(PLACEMENT_VALID, false, Reason::SnapshotsBlockMove, format!("{why}; {stays}"));
                return Ok(current.clone());
            }
            match self.choose(class, image, image_classes, providers).await {
                Ok(next) if self.carries() => {
                    let target = providers.iter().find(|p| p.name_any() == next.provider).map(|p| &**p);
                    if let Some(cannot) = moving::lacks(target, &next.provider, "disk-import") {
                        self.unchoose(current);
                        self.set(PLACEMENT_VALID, false, Reason::CannotCarryDisks, format!("{why}; it would move to {}/{}, but {cannot}", next.provider, next.failure_domain));
                        return Ok(current.clone());
                    }
                    self.start_move(current.clone(), &next);
                    self.set(PLACEMENT_VALID, true, Reason::Rescheduled, format!("{why}; moving to {}/{}, carrying its disks", next.provider, next.failure_domain));
                    Ok(next)
                }
                Ok(next) => {
                    self.set(PLACEMENT_VALID, true, Reason::Rescheduled, format!("{why}; moving to {}/{}", next.provider, next.failure_domain));
                    Ok(next)
                }
                Err(Blocked { failure, .. }) => {
                    // Nowhere to go: the VM keeps running where it is.
                    self.set(PLACEMENT_VALID, false, failure.reason, format!("{why}, and it cannot move: {}", failure.message));
                    Ok(current.clone())
                }
            }
        } else {
            let next = self.choose(class, image, image_classes, providers).await?;
            // The words of every later reconcile, so confirming the placement writes nothing.
            self.set(PLACEMENT_VALID, true, Reason::PlacementHolds, holds(&next));
            Ok(next)
        }
    }

    async fn choose(
        &mut self,
        class: &VMClass,
        image: &VMImage,
        image_classes: &BTreeSet<String>,
        providers: &[Arc<Provider>],
    ) -> Result<Scheduled, Blocked> {
        let _placing = self.state.assumed.placing.lock().await;
        let found = scheduling::candidates(self.vm, class, image_classes, providers, &self.state.assumed.placed_vms(&self.state.vms), true).map_err(|m| blocked(SCHEDULED, Reason::InvalidPlacement, m))?;
        if found.candidates.is_empty() {
            let mut why = found.excluded.clone();
            if why.is_empty() {
                why.push(format!("no Provider in namespace {} matches the placement", self.ns));
            }
            why.truncate(5);
            return Err(blocked(SCHEDULED, Reason::NoCandidates, format!("no failure domain fits: {}", why.join("; "))));
        }
        // The VM's own policy (a pool sets its own on members), else the class's, else spread.
        let policy_ref = self.vm.spec.placement.as_ref().and_then(|p| p.policy_ref.as_ref()).or(class.spec.placement_policy_ref.as_ref());
        let request = |parameters: &BTreeMap<String, serde_json::Value>| scheduling::request(self.vm, class, parameters);
        let candidates = scheduling::prefer_imported(found.candidates, image);
        let decision = scheduling::decide(self.ctx, policy_ref, request, &candidates, format!("{}/{}", self.ns, self.name))
            .await
            .map_err(|f| Blocked::on(SCHEDULED, f))?;
        let (chosen, policy_name) = (&decision.candidate, &decision.policy);
        let provider_name = chosen.provider.rsplit('/').next().unwrap_or_default().to_string();
        let provider = providers.iter().find(|p| p.name_any() == provider_name).ok_or_else(|| blocked(SCHEDULED, Reason::ProviderNotFound, provider_name.clone()))?;
        let caps = &provider.spec.capabilities;
        let scheduled = Scheduled {
            provider: provider_name,
            provider_class: chosen.provider_class.clone(),
            failure_domain: chosen.failure_domain.clone(),
            storage: class.spec.disks.iter().filter_map(|d| Some((d.storage_class.clone(), caps.storage_classes.get(&d.storage_class)?.clone()))).collect(),
            networks: class.spec.nics.iter().filter_map(|n| Some((n.network_class.clone(), caps.network_classes.get(&n.network_class)?.clone()))).collect(),
            // Known once its machine is made.
            image: None,
        };
        let message = format!("{}/{} by {policy_name}: {}", scheduled.provider, scheduled.failure_domain, decision.why);
        self.set(SCHEDULED, true, Reason::Scheduled, message.clone());
        // Until a Machine for this decision says otherwise, the VM is not ready.
        let (reason, note) = match &self.status.infrastructure_ref {
            Some(r) => (Reason::Moving, format!("moving from {} {} to {}/{}", r.kind, r.name, scheduled.provider, scheduled.failure_domain)),
            None => (Reason::Provisioning, format!("creating the machine on {}/{}", scheduled.provider, scheduled.failure_domain)),
        };
        self.set(INFRASTRUCTURE_READY, false, reason, note.clone());
        self.set(READY, false, reason, note);
        self.status.scheduled = Some(scheduled.clone());
        self.state.assumed.assume(self.vm, scheduled.clone());
        // Recorded (and announced) by `apply` before anything is made for it, or at the end
        // of the reconcile when something else stops it first.
        self.decided = Some(message);
        Ok(scheduled)
    }

    /// Take back a decision `choose` made (the VM stays on `current`).
    fn unchoose(&mut self, current: &Scheduled) {
        self.status.scheduled = Some(current.clone());
        self.state.assumed.assume(self.vm, current.clone());
        self.decided = None;
        self.set(SCHEDULED, true, Reason::Scheduled, holds(current));
    }

    async fn get_machine(&self, r: &InfrastructureRef) -> Result<Option<DynamicObject>, kube::Error> {
        let resource = resource_of(r);
        let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource);
        api.get_opt(&r.name).await
    }

    async fn move_away(&mut self, current: &InfrastructureRef, old: &DynamicObject, next: &Scheduled) -> Result<Outcome, Blocked> {
        if old.metadata.deletion_timestamp.is_none() {
            let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource_of(current));
            api.delete(&current.name, &DeleteParams::default()).await.map_err(api_error)?;
            self.event(false, Reason::Moving, "Move", format!("tearing down {} {} before recreating on {}/{}", current.kind, current.name, next.provider, next.failure_domain)).await;
        }
        let message = format!("waiting for {} {} to be torn down before moving to {}/{}", current.kind, current.name, next.provider, next.failure_domain);
        self.set(INFRASTRUCTURE_READY, false, Reason::Moving, message.clone());
        self.set(READY, false, Reason::Moving, message);
        self.status.addresses.clear();
        self.status.disks.clear();
        self.status.interfaces.clear();
        self.status.phase = None;
        // The old Machine's deletion event brings the VM back (or, missed, the recheck).
        Ok(Outcome::Requeue(MACHINE_GONE_RECHECK))
    }

    /// The Machine's spec for `scheduled`. An existing machine keeps the image it was made from.
    fn machine_spec(
        &self,
        class: &VMClass,
        image: &VMImage,
        provider: &Provider,
        scheduled: &Scheduled,
        addressing: &BTreeMap<String, banlieue_api::common::StaticIp>,
        existing: Option<&DynamicObject>,
    ) -> Result<InfraMachineSpec, Blocked> {
        let made_from = existing.and_then(|m| serde_json::from_value(m.data["spec"]["vm"]["image"].clone()).ok());
        // Only the VM's first machine adopts (a machine keeps what it was made as): one made
        // later — by a move — is banlieue's own. Whether it is brought to its class follows
        // the VM's `applyClass` as it is now (set once its differences are seen).
        let adopt = match existing {
            Some(m) => serde_json::from_value::<Option<banlieue_api::vm::VmAdopt>>(m.data["spec"]["vm"]["adopt"].clone()).ok().flatten().map(|mut a| {
                a.apply_class = self.vm.spec.adopt.as_ref().is_some_and(|v| v.apply_class && v.backend_id == a.backend_id);
                a
            }),
            None if self.status.infrastructure_ref.as_ref().is_none_or(|r| r.uid.is_none()) => self.vm.spec.adopt.clone(),
            None => None,
        };
        let image = if adopt.is_some() { None } else { Some(image) };
        let resolved = crate::placement::resolve::machine_vm(class, image, provider, &scheduled.provider_class, made_from)
            .map_err(|f| Blocked::on(SCHEDULED, f))?;
        Ok(InfraMachineSpec {
            provider_id: None,
            failure_domain: Some(scheduled.failure_domain.clone()),
            provider_ref: Some(banlieue_api::common::NameRef { name: scheduled.provider.clone() }),
            vm: ResolvedVm {
                nics: addressing::addressed(resolved.nics.clone(), addressing),
                user_data: self.vm.spec.user_data.clone(),
                user_data_format: self.vm.spec.user_data_format,
                power_state: self.vm.spec.desired_power_state,
                power_off_mode: self.vm.spec.power_off_mode,
                restart_requested_at: self.vm.spec.restart_requested_at.clone(),
                update_policy: Some(self.vm.spec.update_policy),
                adopt,
                ..resolved
            },
            ..Default::default()
        })
    }

    /// Server-side-apply the Machine (skipped when it already says all of this). It is made
    /// with the machine reconciler's finalizer, saving that reconciler a write of its own.
    async fn apply_machine(&self, resource: &kube::api::ApiResource, name: &str, spec: InfraMachineSpec, existing: Option<DynamicObject>) -> Result<DynamicObject, Blocked> {
        let owner = self.vm.controller_owner_ref(&()).ok_or_else(|| blocked(READY, Reason::Internal, "VM has no uid"))?;
        // The Machine belongs to the VM's installation: its provider role acts on it.
        let mut labels = std::collections::BTreeMap::from([(VM_LABEL.to_string(), self.name.clone())]);
        self.ctx.options.installation.mark(&mut labels);
        // A new Machine continues this reconcile's trace (when traces are on); a later apply
        // keeps what it was made with, so the annotation is written once.
        let trace = match &existing {
            Some(m) => m.annotations().get(crate::ops::traces::TRACEPARENT).cloned(),
            None => crate::ops::traces::traceparent(),
        };
        let mut body = serde_json::json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {
                "name": name,
                "namespace": self.ns,
                "labels": labels,
                "ownerReferences": [owner],
                "finalizers": [crate::framework::infra_kinds::MACHINE_FINALIZER],
            },
            "spec": spec,
        });
        if let Some(trace) = trace {
            body["metadata"]["annotations"] = serde_json::json!({ crate::ops::traces::TRACEPARENT: trace });
        }
        // Most reconciles change nothing in the Machine: skip the write then.
        if let Some(m) = existing {
            let mut current = m.data.get("spec").cloned().unwrap_or_default();
            if let Some(c) = current.as_object_mut() {
                c.remove("providerID");
            }
            let owned = m.owner_references().iter().any(|o| o.uid == owner.uid && o.controller == Some(true));
            if owned && current == body["spec"] && labels.iter().all(|(k, v)| m.labels().get(k) == Some(v)) {
                return Ok(m);
            }
        }
        let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, resource);
        api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await.map_err(|e| {
            let failure = api_failure(&e).context(format_args!("applying {} {name}", resource.kind));
            let reason = if failure.reason == Reason::Forbidden { Reason::Forbidden } else { Reason::MachineApplyFailed };
            Blocked::on(INFRASTRUCTURE_READY, Failure { reason, ..failure })
        })
    }

    /// Copy what the Machine reports. `Ready` only when the Machine is Ready.
    fn mirror(&mut self, machine: &DynamicObject, target: &InfrastructureRef) {
        let st: InfraMachineStatus = machine.data.get("status").cloned().and_then(|s| serde_json::from_value(s).ok()).unwrap_or_default();
        let nics: Vec<banlieue_api::infra::ResolvedNic> = serde_json::from_value(machine.data["spec"]["vm"]["nics"].clone()).unwrap_or_default();
        self.status.infrastructure_ref = Some(InfrastructureRef { uid: machine.uid(), ..target.clone() });
        self.status.initialization = st.initialization.clone();
        let (addresses, reported) = network::merge(&addressing::static_ips(&nics), &st.addresses);
        self.status.addresses = addresses;
        match reported {
            Ok(()) => self.set(ADDRESSES_READY, true, Reason::AddressesReported, "the backend reports every address of the VM"),
            Err(why) => self.set(ADDRESSES_READY, false, Reason::WaitingForAddress, why),
        };
        self.status.hardware = st.hardware.as_ref().map(|h| banlieue_api::vm::VmHardware { cpus: h.cpus, memory_mib: h.memory_mib });
        let hardware = st.hardware.clone().unwrap_or_default();
        self.status.disks = hardware.disks;
        self.status.interfaces = hardware.interfaces;
        for type_ in [CONFIGURATION_APPLIED, CONFIGURATION_MATCHES] {
            if let Some(c) = conditions::get(&st.conditions, type_) {
                let (holds, reason, message) = (c.status == "True", c.reason.clone(), format!("{} {}: {}", target.kind, target.name, c.message));
                conditions::set_reported(&mut self.status.conditions, type_, holds, &reason, message, self.generation);
            }
        }
        self.status.observed_power_state = st.power_state;
        self.status.phase = st.phase;
        self.mirror_revert(st.reverted_to.as_deref());
        if st.last_restart_requested_at.is_some() {
            self.status.last_restart_requested_at = st.last_restart_requested_at.clone();
        }
        let (ready, reason, message) = match conditions::get(&st.conditions, READY) {
            Some(c) => (c.status == "True", c.reason.clone(), format!("{} {}: {}", target.kind, target.name, c.message)),
            None => (false, Reason::WaitingForInfrastructure.to_string(), format!("{} {} has not reported yet", target.kind, target.name)),
        };
        // The Machine's words, as it said them.
        conditions::set_reported(&mut self.status.conditions, INFRASTRUCTURE_READY, ready, &reason, message.clone(), self.generation);
        conditions::set_reported(&mut self.status.conditions, READY, ready, &reason, message, self.generation);
    }

    async fn set_machine_paused(&self, m: &DynamicObject, paused: bool) -> Result<(), Error> {
        let Some(r) = &self.status.infrastructure_ref else { return Ok(()) };
        if m.annotations().contains_key(PAUSED_ANNOTATION) == paused {
            return Ok(());
        }
        let value = if paused { serde_json::json!("true") } else { serde_json::Value::Null };
        let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource_of(r));
        api.patch(&r.name, &PatchParams::default(), &Patch::Merge(serde_json::json!({"metadata": {"annotations": {PAUSED_ANNOTATION: value}}})))
            .await?;
        self.event(false, if paused { Reason::Paused } else { Reason::Resumed }, "Pause", format!("{} {} is {}", r.kind, r.name, if paused { "paused" } else { "reconciled again" })).await;
        Ok(())
    }

    /// Delete the Machine, wait for it to be gone (its finalizer removes the backend VM), then let the VM go.
    async fn delete(mut self) -> Result<Outcome, Error> {
        if !finalizer::has(self.vm, FINALIZER) {
            return Ok(Outcome::AwaitChange);
        }
        // A move under way has made (or is making) the Machine it goes to: it goes first.
        if let Some(to) = self.status.moving.as_ref().map(|m| m.to.machine.clone()).filter(|t| !t.name.is_empty() && self.status.infrastructure_ref.as_ref() != Some(t)) {
            if let Some(m) = self.get_machine(&to).await? {
                if m.metadata.deletion_timestamp.is_none() {
                    let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource_of(&to));
                    api.delete(&to.name, &DeleteParams::default()).await?;
                }
                self.set(READY, false, Reason::Deleting, format!("waiting for {} {} (where the VM was moving) to be deleted", to.kind, to.name));
                self.write_status().await?;
                return Ok(Outcome::Requeue(MACHINE_GONE_RECHECK));
            }
        }
        // Likewise the Machine a finished move is removing.
        if let Some(from) = self.status.moving.as_ref().filter(|m| m.phase == banlieue_api::vm::MovePhase::RemovingSource).map(|m| m.from.machine.clone()) {
            if self.get_machine(&from).await?.is_some() {
                self.set(READY, false, Reason::Deleting, format!("waiting for {} {} (the VM moved from there) to be deleted", from.kind, from.name));
                self.write_status().await?;
                return Ok(Outcome::Requeue(MACHINE_GONE_RECHECK));
            }
        }
        if let Some(r) = self.status.infrastructure_ref.clone() {
            match self.get_machine(&r).await? {
                Some(m) => {
                    // Its snapshots leave the backend first (each one's deletion brings the VM back).
                    if !self.snapshots_gone().await? {
                        let message = "waiting for its snapshots to be deleted from the backend".to_string();
                        self.set(READY, false, Reason::Deleting, message);
                        self.write_status().await?;
                        return Ok(Outcome::Requeue(MACHINE_GONE_RECHECK));
                    }
                    if m.metadata.deletion_timestamp.is_none() {
                        let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource_of(&r));
                        // The Machine leaves its backend VM as the VM says now (machines a move
                        // replaces are always deleted: the policy reaches a Machine only here).
                        if self.vm.spec.deletion_policy == DeletionPolicy::Orphan && m.data["spec"]["vm"]["deletionPolicy"] != "Orphan" {
                            let patch = serde_json::json!({ "spec": { "vm": { "deletionPolicy": DeletionPolicy::Orphan } } });
                            api.patch(&r.name, &PatchParams::default(), &Patch::Merge(patch)).await?;
                        }
                        api.delete(&r.name, &DeleteParams::default()).await?;
                        self.event(false, Reason::Deleting, "Delete", format!("deleting {} {}", r.kind, r.name)).await;
                    }
                    let message = format!("waiting for {} {} (and its backend VM) to be deleted", r.kind, r.name);
                    self.set(READY, false, Reason::Deleting, message.clone());
                    self.set(INFRASTRUCTURE_READY, false, Reason::Deleting, message);
                    self.write_status().await?;
                    return Ok(Outcome::Requeue(MACHINE_GONE_RECHECK));
                }
                None => {}
            }
        }
        // The backend VM is gone: its addresses go back to their pools.
        for claim in std::mem::take(&mut self.status.ip_address_claims) {
            ipam::release(&self.ctx.client, &self.ns, &claim).await?;
        }
        finalizer::remove(&self.api, self.vm, FINALIZER).await?;
        self.ctx.metrics.vm_deleted(&self.provider_class(), since(self.vm.metadata.deletion_timestamp.as_ref()));
        self.state.assumed.forget(self.vm);
        Ok(Outcome::AwaitChange)
    }

    async fn write_status(&mut self) -> Result<(), Error> {
        self.status.observed_generation = self.generation;
        // The first Ready is the end of the VM's apply → Ready, written once and measured once.
        let first_ready = self.status.first_ready_time.is_none() && conditions::is_true(&self.status.conditions, READY);
        if first_ready {
            self.status.first_ready_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        }
        status::write(&self.api, &self.name, self.vm.status.as_ref(), &self.status).await?;
        // A VM Ready before banlieue kept the time (an upgrade) gets it now, unmeasured.
        let was_ready = self.vm.status.as_ref().is_some_and(|s| conditions::is_true(&s.conditions, READY));
        if first_ready && !was_ready {
            self.ctx.metrics.vm_ready(&self.provider_class(), since(self.vm.metadata.creation_timestamp.as_ref()));
        }
        Ok(())
    }

    /// The ProviderClass the VM is placed on (`""` before it is).
    fn provider_class(&self) -> String {
        self.status.scheduled.as_ref().map(|s| s.provider_class.clone()).unwrap_or_default()
    }
}

/// How long ago `t` was (zero when unknown or in the future).
fn since(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> std::time::Duration {
    let now = k8s_openapi::jiff::Timestamp::now();
    t.map(|t| std::time::Duration::from_millis((now.as_millisecond() - t.0.as_millisecond()).max(0) as u64)).unwrap_or_default()
}

/// `PlacementValid`'s message while the placement holds.
fn holds(s: &Scheduled) -> String {
    format!("{}/{} satisfies the placement", s.provider, s.failure_domain)
}

/// A failed status write, retried.
fn status_error(e: Error) -> Blocked {
    match e {
        Error::Kube(e) => api_error(e),
        other => Blocked::on(READY, Failure::transient(Reason::Internal, other.to_string())),
    }
}

/// A failed API call, retried.
fn api_error(e: kube::Error) -> Blocked {
    Blocked::on(READY, api_failure(&e))
}

fn resource_of(r: &InfrastructureRef) -> kube::api::ApiResource {
    infra_kinds::machine_resource_of_kind(&r.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(ns: &str, placed_on: Option<&str>) -> VirtualMachine {
        crate::fixtures::vm(ns, "vm", placed_on)
    }

    #[test]
    fn a_provider_change_concerns_the_vms_to_place_and_those_placed_on_it_only() {
        assert!(concerns_vm(&vm("team", None), "a", Some("team")), "a VM to be placed");
        assert!(concerns_vm(&vm("team", Some("a")), "a", Some("team")), "a VM placed on it");
        assert!(!concerns_vm(&vm("team", Some("b")), "a", Some("team")), "a VM placed on another Provider");
        assert!(!concerns_vm(&vm("other", None), "a", Some("team")), "a VM of another namespace");
    }
}
