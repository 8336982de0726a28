//! The one way banlieue writes a reconciler. A role's reconcile function decides an
//! [`Outcome`]; its [`Frame`] times it for the metrics, keeps the object's backoff
//! (grown on each retry, reset when the object settles, forgotten when it leaves the
//! cache), and turns the outcome into the controller runtime's next look. Status is
//! written with [`crate::status::write`], which sends nothing when nothing changed.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;

use crate::{Context, Error};

/// Backoff of retried objects: 1 s, 2 s, 4 s … capped here, each wait jittered down to as
/// little as half (see [`jittered`]).
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What a reconcile decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Settled; look again after this long (or on a change).
    Requeue(Duration),
    /// Settled until something it watches changes.
    AwaitChange,
    /// Blocked by something that may clear by itself (a backend down, a Secret not there
    /// yet): look again after the object's backoff.
    Retry,
}

impl Outcome {
    /// After `failure`: retried with backoff when it may clear by itself, otherwise left
    /// until a change brings the object back.
    pub fn after(failure: &crate::Failure) -> Outcome {
        if failure.retry { Outcome::Retry } else { Outcome::AwaitChange }
    }
}

/// The scaffolding one controller shares between its reconciles.
pub struct Frame<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    pub ctx: Arc<Context>,
    /// The controller's name in metrics and logs (`virtualmachine`, `machine`, …).
    name: &'static str,
    cache: Store<K>,
    dyntype: K::DynamicType,
    backoff: Mutex<HashMap<ObjectRef<K>, u32>>,
    /// With sharding on, the key whose shard an object belongs to (see [`crate::framework::shards`]);
    /// `None`: a controller of a role that is not sharded.
    shard_key: Option<fn(&K) -> String>,
    /// The trace an object's reconciles continue, when it names one (see [`crate::ops::traces`]).
    continues: Option<fn(&K) -> Option<String>>,
}

impl<K> Frame<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    /// A frame over the controller's cache (`Controller::store()`).
    pub fn new(ctx: Arc<Context>, name: &'static str, cache: Store<K>, dyntype: K::DynamicType) -> Self {
        Frame { ctx, name, cache, dyntype, backoff: Mutex::default(), shard_key: None, continues: None }
    }

    /// Reconcile only the objects of the shards this replica holds, when sharding is on;
    /// an object's shard is that of `key` (its Provider's `namespace/name`, or its own).
    pub fn sharded_by(mut self, key: fn(&K) -> String) -> Self {
        self.shard_key = Some(key);
        self
    }

    /// Reconcile an object in the trace `parent` names (a `traceparent`), when it names one.
    pub fn continues_trace(mut self, parent: fn(&K) -> Option<String>) -> Self {
        self.continues = Some(parent);
        self
    }

    /// Run one reconcile of `obj` and decide the next look.
    pub async fn reconcile(&self, obj: &K, work: impl Future<Output = Result<Outcome, Error>>) -> Result<Action, Error> {
        // The one place sharding is enforced: another replica's object is left alone (a
        // shard gained later brings it back), and a shard lost mid-reconcile cancels the work.
        let mut guard = None;
        if let (Some(shards), Some(key)) = (&self.ctx.shards, self.shard_key) {
            match shards.hold(&key(obj)) {
                Some(g) => guard = Some(g),
                None => return Ok(Action::await_change()),
            }
        }
        let start = Instant::now();
        tracing::debug!(controller = self.name, object = %crate::key(obj), "reconcile");
        // One span per reconcile; the driver calls and backend requests it makes are its children.
        let meta = obj.meta();
        let span = tracing::info_span!(
            "reconcile",
            otel.name = %format!("reconcile {}", self.name),
            controller = self.name,
            k8s.namespace.name = meta.namespace.as_deref().unwrap_or_default(),
            k8s.object.name = meta.name.as_deref().unwrap_or_default(),
            k8s.object.uid = meta.uid.as_deref().unwrap_or_default(),
        );
        if let Some(parent) = self.continues.and_then(|f| f(obj)) {
            crate::ops::traces::continue_trace(&span, &parent);
        }
        let run = async {
            match guard.as_mut() {
                None => work.await,
                Some(guard) => tokio::select! {
                    result = work => result,
                    _ = guard.lost() => {
                        tracing::info!(controller = self.name, object = %crate::key(obj), "shard lost: reconcile cancelled, left to the shard's next holder");
                        Ok(Outcome::AwaitChange)
                    }
                },
            }
        };
        let result = tracing::Instrument::instrument(run, span).await;
        tracing::debug!(controller = self.name, object = %crate::key(obj), outcome = ?result.as_ref().map_err(|e| e.to_string()), "reconciled");
        self.ctx.metrics.reconciled(self.name, start.elapsed(), result.as_ref().err().map(|_| "Error"));
        let key = ObjectRef::from_obj_with(obj, self.dyntype.clone());
        Ok(match result? {
            Outcome::Requeue(after) => {
                self.settled(&key);
                Action::requeue(after)
            }
            Outcome::AwaitChange => {
                self.settled(&key);
                Action::await_change()
            }
            Outcome::Retry => Action::requeue(self.retry(key)),
        })
    }

    /// The controller runtime's error policy: log, and retry with the object's backoff.
    pub fn error_policy(&self, obj: &K, err: &Error) -> Action {
        tracing::warn!(controller = self.name, object = %crate::key(obj), error = %err, "reconcile failed");
        Action::requeue(self.retry(ObjectRef::from_obj_with(obj, self.dyntype.clone())))
    }

    fn settled(&self, key: &ObjectRef<K>) {
        self.lock().remove(key);
    }

    fn retry(&self, key: ObjectRef<K>) -> Duration {
        let mut backoff = self.lock();
        // Objects deleted while backing off are forgotten here, so the map stays small.
        backoff.retain(|k, _| self.cache.get(k).is_some());
        let n = backoff.entry(key).or_insert(0);
        *n = (*n + 1).min(10);
        jittered(backoff_after(*n))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<K>, u32>> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A controller over one dynamic kind (a `<Kind>Machine`, a `<Kind>Cluster`) in the
/// namespaces this process watches, woken only by what a reconcile acts on (its own
/// status writes do not wake it); with its cache and its [`Frame`] named `name`, sharded
/// by each object's own key (a caller may re-key it with [`Frame::sharded_by`]). Only the
/// installation's objects, narrowed further by `selector` when given.
pub fn dynamic_controller(
    ctx: &Arc<Context>,
    name: &'static str,
    resource: &kube::api::ApiResource,
    selector: Option<&str>,
) -> (kube::runtime::Controller<kube::api::DynamicObject>, Store<kube::api::DynamicObject>, Frame<kube::api::DynamicObject>) {
    use kube::runtime::{watcher, WatchStreamExt};
    let writer = kube::runtime::reflector::store::Writer::new(resource.clone());
    let store = writer.as_reader();
    // managedFields are most of a server-side-applied object's size, and no reconcile reads them.
    // A list's items may come without their kind: each cached object says it (the metrics count by it).
    let types = kube::api::TypeMeta { api_version: resource.api_version.clone(), kind: resource.kind.clone() };
    let changes = kube::runtime::reflector(
        writer,
        watcher(ctx.watched_dynamic(resource), ctx.options.installation.watch(selector)).modify(move |o| {
            o.metadata.managed_fields = None;
            o.types = Some(types.clone());
        }),
    )
        .retried()
        .touched_objects()
        .predicate_filter(acted_on_infra, kube::runtime::PredicateConfig::default());
    let controller = kube::runtime::Controller::for_stream_with(changes, store.clone(), resource.clone())
        .trigger_backoff(PerWatch)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.options.concurrency))
        .reconcile_all_on(shard_gains(ctx));
    let frame = Frame::new(ctx.clone(), name, store.clone(), resource.clone()).sharded_by(crate::key);
    (controller, store, frame)
}

/// A controller over one of banlieue's namespaced kinds (the installation's objects, in the
/// namespaces this process watches), woken only by what a reconcile acts on
/// ([`acted_on`]: its own status writes do not wake it), with its [`Frame`] named `name` and
/// sharded by `shard_key`.
pub fn typed_controller<K>(ctx: &Arc<Context>, name: &'static str, shard_key: fn(&K) -> String) -> (kube::runtime::Controller<K>, Frame<K>)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    use kube::runtime::{watcher, WatchStreamExt};
    let (store, writer) = kube::runtime::reflector::store();
    let changes = kube::runtime::reflector(writer, watcher(ctx.watched::<K>(), ctx.scope()))
        .retried()
        .touched_objects()
        .predicate_filter(acted_on, kube::runtime::PredicateConfig::default());
    let controller = kube::runtime::Controller::for_stream(changes, store.clone())
        .trigger_backoff(PerWatch)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.options.concurrency))
        .reconcile_all_on(shard_gains(ctx));
    (controller, Frame::new(ctx.clone(), name, store, ()).sharded_by(shard_key))
}

/// Yields when this replica gains a shard, so a controller looks at every object again
/// (those of other shards return at once); never, without sharding.
pub fn shard_gains(ctx: &Context) -> futures::stream::BoxStream<'static, ()> {
    use futures::StreamExt;
    match &ctx.shards {
        Some(shards) => shards.gained().boxed(),
        None => futures::stream::pending().boxed(),
    }
}

/// Each change of `api`'s objects (deletions too), from a [`Retried::retried`] watch: a
/// controller's trigger with no cache of its own. `config` is the installation's scope
/// ([`crate::framework::installation::Installation::watch`]) for banlieue's kinds.
pub fn changes<K>(api: kube::Api<K>, config: kube::runtime::watcher::Config) -> impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    use kube::runtime::{watcher, WatchStreamExt};
    watcher(api, config).retried().touched_objects()
}

/// A watch that keeps a cache of `api`'s objects (those `config` selects: the
/// installation's) and yields each change.
pub fn cached<K>(api: kube::Api<K>, config: kube::runtime::watcher::Config) -> (Store<K>, impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    use kube::runtime::{watcher, WatchStreamExt};
    let (reader, writer) = kube::runtime::reflector::store();
    let stream = kube::runtime::reflector(writer, watcher(api, config).modify(|o: &mut K| o.meta_mut().managed_fields = None))
        .retried()
        .touched_objects();
    (reader, stream)
}

/// Waits until a controller's caches are ready, for every reconcile at once.
///
/// kube-runtime's `Store::wait_until_ready` keeps a single waker (a oneshot receiver shared
/// by every waiter): of several reconciles waiting side by side, only the last to poll is
/// woken, and the others wait forever (their object is never reconciled again, every later
/// trigger queued behind the stuck one). So one reconcile waits on the stores and the others
/// wait on it, through a once-cell that wakes them all.
#[derive(Default)]
pub struct CachesReady(tokio::sync::OnceCell<()>);

impl CachesReady {
    /// Run `wait` (the stores' `wait_until_ready`) once; everyone returns when it has.
    pub async fn wait<F: Future<Output = Result<(), Error>>>(&self, wait: impl FnOnce() -> F) -> Result<(), Error> {
        self.0.get_or_try_init(wait).await.map(|_| ())
    }
}

/// What a controller's run stream yields, logged: the runtime's own failures (an object it
/// was asked about but no longer finds, a queue error) would otherwise pass unseen.
/// (Reconcile errors are logged by [`Frame::error_policy`].)
pub fn log_run<T, E: std::error::Error, Q: std::error::Error>(
    controller: &'static str,
) -> impl FnMut(Result<T, kube::runtime::controller::Error<E, Q>>) -> std::future::Ready<()> {
    move |result| {
        if let Err(e) = result
            && !matches!(e, kube::runtime::controller::Error::ReconcilerFailed(..))
        {
            tracing::debug!(controller, error = %e, "controller runtime");
        }
        std::future::ready(())
    }
}

/// The longest wait before the `n`th retry in a row.
pub fn backoff_after(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(16)).min(MAX_BACKOFF)
}

/// A wait drawn uniformly from the upper half of `ceiling`: objects that fail together (every
/// Machine of a backend that went down) spread their retries instead of hitting the backend
/// in lockstep, and none waits longer than its ceiling.
pub fn jittered(ceiling: Duration) -> Duration {
    let ms = ceiling.as_millis() as u64;
    Duration::from_millis(ms - rand::random_range(0..=ms / 2))
}

/// A hash of what a reconcile acts on: the spec (generation), labels, annotations,
/// owners (CAPI sets a machine's after creating it), finalizers and deletion. Used as a predicate so a reconciler's own status writes
/// do not wake it again.
pub fn acted_on<K: Resource>(obj: &K) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    obj.meta().generation.hash(&mut h);
    hash_meta(obj.meta(), true, &mut h);
    Some(h.finish())
}

/// The metadata part of [`acted_on`]: labels, annotations, owners, deletion and, when
/// `finalizers`, the finalizers.
pub fn hash_meta(meta: &kube::api::ObjectMeta, finalizers: bool, h: &mut impl Hasher) {
    meta.labels.hash(h);
    meta.annotations.hash(h);
    for o in meta.owner_references.iter().flatten() {
        o.uid.hash(h);
    }
    if finalizers {
        meta.finalizers.hash(h);
    }
    meta.deletion_timestamp.is_some().hash(h);
}

/// A filter of the Provider events of a watch keeping `providers`: those its controller acts
/// on, which is any change but one to `status.operations` alone — that changes with every
/// probe (see [`crate::ops::recent`]) and concerns no reconcile. A Provider gone from the
/// cache (deleted) always passes: kube's `predicate_filter` would take its last event for
/// the copy it saw before.
pub fn provider_news(
    providers: Store<banlieue_api::Provider>,
) -> impl FnMut(&Result<banlieue_api::Provider, kube::runtime::watcher::Error>) -> std::future::Ready<bool> + Send {
    let mut seen: HashMap<ObjectRef<banlieue_api::Provider>, u64> = HashMap::new();
    move |event| {
        let Ok(p) = event else { return std::future::ready(true) };
        let key = ObjectRef::from_obj(p);
        if providers.get(&key).is_none() {
            seen.remove(&key);
            return std::future::ready(true);
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        hash_meta(&p.metadata, true, &mut h);
        p.metadata.generation.hash(&mut h);
        let status = p.status.clone().map(|s| banlieue_api::provider::ProviderStatus { operations: None, ..s });
        serde_json::to_string(&status).unwrap_or_default().hash(&mut h);
        std::future::ready(seen.insert(key, h.finish()) != Some(h.finish()))
    }
}

/// [`acted_on`] for `<Kind>Machine`s and `<Kind>Cluster`s: the spec itself instead of its
/// generation, less `spec.providerID`, which the provider role sets right after `create`:
/// that patch needs no second reconcile (nor a second look by the VM's Machine binder).
pub fn acted_on_infra(obj: &kube::api::DynamicObject) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut spec = obj.data.get("spec").cloned().unwrap_or_default();
    if let Some(s) = spec.as_object_mut() {
        s.remove("providerID");
    }
    spec.to_string().hash(&mut h);
    hash_meta(&obj.metadata, true, &mut h);
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    /// Regression: reconciles waiting side by side for a cache (the first VMs of a resumed
    /// `banlieue bootstrap`) must all go on once it is ready, not only the last one to wait.
    #[tokio::test(flavor = "current_thread")]
    async fn every_reconcile_waiting_for_the_caches_goes_on_once_they_are_ready() {
        let (reader, mut writer) = kube::runtime::reflector::store::<ConfigMap>();
        let gate = Arc::new(CachesReady::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (gate, reader) = (gate.clone(), reader.clone());
                tokio::spawn(async move { gate.wait(|| async { reader.wait_until_ready().await.map_err(|_| Error::CacheStopped("ConfigMap")) }).await })
            })
            .collect();
        // Every waiter polls (and parks) before the cache is filled.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        for w in waiters {
            let done = tokio::time::timeout(Duration::from_secs(5), w).await;
            assert!(matches!(done, Ok(Ok(Ok(())))), "a waiter was left behind: {done:?}");
        }
    }

    #[test]
    fn backoff_doubles_from_one_second_to_the_cap() {
        let waits: Vec<u64> = (1..=10).map(|n| backoff_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
        assert_eq!(backoff_after(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn retries_are_jittered_within_the_upper_half_of_the_backoff() {
        for ceiling in [backoff_after(1), backoff_after(4), MAX_BACKOFF] {
            let draws: Vec<Duration> = (0..200).map(|_| jittered(ceiling)).collect();
            assert!(draws.iter().all(|d| *d >= ceiling / 2 && *d <= ceiling), "{ceiling:?}: {draws:?}");
            let distinct: std::collections::BTreeSet<&Duration> = draws.iter().collect();
            assert!(distinct.len() > 20, "{ceiling:?}: spread, not one value: {distinct:?}");
        }
    }

    #[test]
    fn status_changes_do_not_count_as_acted_on() {
        let mut cm = ConfigMap { metadata: ObjectMeta { name: Some("a".into()), generation: Some(1), ..Default::default() }, ..Default::default() };
        let before = acted_on(&cm);
        cm.metadata.resource_version = Some("42".into());
        cm.metadata.managed_fields = Some(vec![]);
        assert_eq!(acted_on(&cm), before, "a new resourceVersion alone (a status write) is not acted on");
        cm.metadata.generation = Some(2);
        assert_ne!(acted_on(&cm), before);
        let generation_two = acted_on(&cm);
        cm.metadata.finalizers = Some(vec!["x".into()]);
        assert_ne!(acted_on(&cm), generation_two);
    }
}

/// How a watch waits after an error: 0.25 s doubling up to 5 s, jittered, and back to 0.25 s
/// after any success. kube's default grows to 30 s (and more with jitter) and forgets only
/// after 2 minutes without an error; a controller applies it to *all* its triggers at once, so
/// a few failed watches during API server restarts kept every VM event waiting for minutes
/// (found by `faults_api`). A restarted API server is noticed within seconds; the price of a
/// retry is one LIST per watch. Applied to each watch on its own by [`Retried::retried`].
pub struct WatchBackoff {
    next: Duration,
}

const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(250);
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(5);

pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff { next: WATCH_BACKOFF_MIN }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = jittered(self.next);
        self.next = (self.next * 2).min(WATCH_BACKOFF_MAX);
        Some(wait)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_MIN;
    }
}

/// Every watch stream banlieue reads goes through [`Retried::retried`]: its errors are waited
/// on with [`watch_backoff`], by that watch alone, except a `410 Gone`. A 410 is the API
/// server's routine "list again" (after its restart, or when a watch fell behind its
/// history): the watcher has already dropped its resourceVersion, and waiting before the list
/// only delays every event behind it. Backing off a 410 as an error kept a controller's
/// triggers paused for seconds after each API server restart (up to 20 s in `faults_api`).
/// A 410 within [`ROUTINE_EXPIRY`] of the last one is waited on like any error, so a server
/// answering 410 to every watch is not listed in a loop.
pub trait Retried<T: Send>: futures::Stream<Item = Result<T, kube::runtime::watcher::Error>> + Send + Sized {
    fn retried(self) -> impl futures::Stream<Item = Result<T, kube::runtime::watcher::Error>> + Send {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        self.filter(waited_on()).backoff(watch_backoff())
    }
}

/// The filter of [`Retried::retried`]: whether an item goes on to the backoff — all but a
/// `410 Gone` less than [`ROUTINE_EXPIRY`] after the last.
fn waited_on<T>() -> impl FnMut(&Result<T, kube::runtime::watcher::Error>) -> std::future::Ready<bool> + Send {
    let mut last_expiry: Option<Instant> = None;
    move |item| {
        let expired = matches!(item, Err(kube::runtime::watcher::Error::WatchError(status)) if status.code == 410);
        let listed_at_once = expired && last_expiry.is_none_or(|at| at.elapsed() >= ROUTINE_EXPIRY);
        if expired {
            last_expiry = Some(Instant::now());
        }
        if listed_at_once {
            tracing::debug!("watch expired (410 Gone): listing again at once");
        }
        std::future::ready(!listed_at_once)
    }
}

impl<T: Send, S: futures::Stream<Item = Result<T, kube::runtime::watcher::Error>> + Send + Sized> Retried<T> for S {}

/// How often a watch may list again at once after `410 Gone` (see [`Retried`]).
pub const ROUTINE_EXPIRY: Duration = Duration::from_secs(1);

/// A controller's trigger backoff: none. Each of its trigger streams already waits on its own
/// errors ([`Retried::retried`]); a backoff over the merged triggers paused all of them for
/// one watch's error (kube's `Controller::new` and `.watches` build watches without one, so
/// banlieue's controllers use `for_stream`/`watches_stream` over [`cached`] or
/// [`Retried::retried`] watches only).
pub struct PerWatch;

impl Iterator for PerWatch {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for PerWatch {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod watch_backoff_tests {
    use super::*;
    use futures::StreamExt;
    use kube::runtime::utils::Backoff;

    fn gone() -> Result<u32, kube::runtime::watcher::Error> {
        let status = kube::core::Status::failure("too old resource version", "Expired").with_code(410);
        Err(kube::runtime::watcher::Error::WatchError(Box::new(status)))
    }

    /// What of `items` goes on to the backoff, errors as text.
    async fn waited(items: Vec<Result<u32, kube::runtime::watcher::Error>>) -> Vec<Result<u32, String>> {
        futures::stream::iter(items).filter(waited_on()).map(|item| item.map_err(|e| e.to_string())).collect().await
    }

    #[tokio::test]
    async fn a_410_is_listed_again_at_once_not_backed_off() {
        assert_eq!(waited(vec![Ok(1), gone(), Ok(2)]).await, vec![Ok(1), Ok(2)]);
    }

    #[tokio::test]
    async fn a_410_again_within_a_second_is_waited_on_like_any_error() {
        let seen = waited(vec![gone(), Ok(1), gone(), Ok(2)]).await;
        assert!(matches!(seen.as_slice(), [Ok(1), Err(e), Ok(2)] if e.contains("too old")), "{seen:?}");
    }

    #[tokio::test]
    async fn other_errors_are_waited_on() {
        let seen = waited(vec![Err(kube::runtime::watcher::Error::NoResourceVersion), Ok(1)]).await;
        assert!(matches!(seen.as_slice(), [Err(_), Ok(1)]), "{seen:?}");
    }

    #[test]
    fn watch_retries_stay_within_seconds_and_start_over_after_a_success() {
        let mut b = watch_backoff();
        let waits: Vec<Duration> = (&mut b).take(12).collect();
        assert!(waits[0] <= WATCH_BACKOFF_MIN && waits[0] >= WATCH_BACKOFF_MIN / 2, "{waits:?}");
        assert!(waits.iter().all(|w| *w <= WATCH_BACKOFF_MAX), "{waits:?}");
        assert!(waits[11] >= WATCH_BACKOFF_MAX / 2, "grows to the cap: {waits:?}");
        b.reset();
        assert!(b.next().unwrap() <= WATCH_BACKOFF_MIN);
    }
}
