//! Sharding the `controller` and `provider` roles across replicas.
//!
//! The work is cut into a fixed number of shards (`--shards`, the same on every replica);
//! an object belongs to the shard of its Provider (a Machine's `spec.providerRef`, a VM's
//! `status.scheduled.provider`, a Provider itself), or, with no Provider yet (a VM still to be
//! placed, a pool, a CAPI cluster), to the shard of its own `namespace/name`. Everything
//! that talks to one backend therefore runs in one replica, under that replica's
//! per-Provider limits.
//!
//! Each shard is a `coordination.k8s.io/v1` Lease `banlieue-<group>-shard-<n>`; each live
//! replica renews a member Lease `banlieue-<group>-replica-<identity>`. The group is the
//! sharded roles a process runs (`controller`, `provider`, or `controller-provider` for a
//! process running both): the replicas of each Deployment split the shards among themselves.
//! (All processes of one group must run the same roles.) Every replica computes the same
//! assignment from the live members (shard `n` goes to the `n mod m`-th of the `m` members,
//! sorted), takes the shards assigned to it once they are free or expired, and releases
//! those assigned to another member. Before a shard is released, or once its lease could
//! have expired (two renewals missed), the replica stops acting on it: the reconciles in
//! flight on it are cancelled ([`ShardGuard::lost`]) and no new one starts. A replica that
//! dies loses its shards when their leases expire, one lease duration after its last
//! renewal; the survivors take them over at that moment.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::SYSTEM_NAMESPACE;

/// How replicas split the work (`--shards`).
#[derive(Clone, Copy, Debug)]
pub struct Sharding {
    /// Number of shards; every replica must use the same.
    pub count: u32,
    /// How long a shard's lease holds without renewal (renewed every third of it).
    pub lease_duration: Duration,
}

/// The label that marks banlieue's shard and member leases (value `shard` or `member`).
pub const LEASE_LABEL: &str = "banlieue.io/lease";
/// The label naming a lease's group.
pub const GROUP_LABEL: &str = "banlieue.io/shard-group";
/// Expired member leases older than this many lease durations are deleted by the survivors.
const FORGET_MEMBERS_AFTER: u32 = 20;

/// Which shards this replica may act on now.
pub struct Shards {
    count: u32,
    held: watch::Sender<BTreeSet<u32>>,
    /// Counts shards gained, so a shard lost and then taken back is a gain however close
    /// together the two happen (a watch of `held` alone would see no change).
    gains: watch::Sender<u64>,
    /// Counts shards lost (given up or taken by another replica), for the metrics.
    losses: std::sync::atomic::AtomicU64,
    /// The replicas splitting these shards (`controller`, `provider` or
    /// `controller-provider`): each group numbers its shards from 0, so the metrics say which.
    group: std::sync::OnceLock<&'static str>,
    /// Reconciles running per shard; a shard is released only when none is.
    in_flight: Mutex<HashMap<u32, usize>>,
    settled: Notify,
}

/// Permission to act on one shard for the length of one reconcile.
pub struct ShardGuard {
    shards: Arc<Shards>,
    shard: u32,
    held: watch::Receiver<BTreeSet<u32>>,
}

impl ShardGuard {
    /// Resolves once this replica may no longer act on the shard.
    pub async fn lost(&mut self) {
        let shard = self.shard;
        let _ = self.held.wait_for(|h| !h.contains(&shard)).await;
    }
}

impl Drop for ShardGuard {
    fn drop(&mut self) {
        let mut in_flight = self.shards.lock();
        if let Some(n) = in_flight.get_mut(&self.shard) {
            *n = n.saturating_sub(1);
        }
        self.shards.settled.notify_waiters();
    }
}

/// FNV-1a: the same shard for the same key on every replica and every build.
pub fn shard_of(key: &str, count: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(count.max(1))) as u32
}

/// The shards the `index`-th of `members` live replicas is assigned.
pub fn assigned(count: u32, members: usize, index: usize) -> impl Iterator<Item = u32> {
    (0..count).filter(move |s| members > 0 && *s as usize % members == index)
}

impl Shards {
    pub fn new(count: u32) -> Arc<Shards> {
        Arc::new(Shards { count: count.max(1), held: watch::Sender::new(BTreeSet::new()), gains: watch::Sender::new(0), losses: Default::default(), group: Default::default(), in_flight: Mutex::default(), settled: Notify::new() })
    }

    /// Name the group these shards are split in (set once, when the split starts).
    pub fn split_in(&self, group: &'static str) {
        let _ = self.group.set(group);
    }

    /// The group these shards are split in (`""` before the split starts).
    pub fn group(&self) -> &'static str {
        self.group.get().copied().unwrap_or_default()
    }

    /// Shards gained and lost since the process started (the metrics' handovers).
    pub fn handovers(&self) -> (u64, u64) {
        (*self.gains.borrow(), self.losses.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// The shard `key` (`namespace/name` of a Provider, or of the object itself) belongs to.
    pub fn shard_of(&self, key: &str) -> u32 {
        shard_of(key, self.count)
    }

    /// The shards held now.
    pub fn held(&self) -> BTreeSet<u32> {
        self.held.borrow().clone()
    }

    /// Follow the shards held (tests and status wait on it).
    pub fn subscribe(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.held.subscribe()
    }

    /// Act on `key`'s shard, if this replica holds it.
    pub fn hold(self: &Arc<Self>, key: &str) -> Option<ShardGuard> {
        let shard = self.shard_of(key);
        let mut in_flight = self.lock();
        // Checked under the lock `release` takes, so a release never misses a reconcile.
        if !self.held.borrow().contains(&shard) {
            return None;
        }
        *in_flight.entry(shard).or_insert(0) += 1;
        Some(ShardGuard { shards: self.clone(), shard, held: self.held.subscribe() })
    }

    /// Yields each time this replica gains a shard (its objects need a look).
    pub fn gained(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let rx = self.gains.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            rx.borrow_and_update();
            Some(((), rx))
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, usize>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn gain(&self, shard: u32) {
        if self.held.send_if_modified(|h| h.insert(shard)) {
            self.gains.send_modify(|n| *n += 1);
        }
    }

    /// Stop acting on `shard`: no new reconcile starts, those running are cancelled.
    fn stop(&self, shard: u32) {
        let _in_flight = self.lock();
        if self.held.send_if_modified(|h| h.remove(&shard)) {
            self.losses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Wait (bounded) until no reconcile runs on `shard`.
    async fn drained(&self, shard: u32, within: Duration) -> bool {
        tokio::time::timeout(within, async {
            loop {
                let settled = self.settled.notified();
                if self.lock().get(&shard).copied().unwrap_or(0) == 0 {
                    return;
                }
                settled.await;
            }
        })
        .await
        .is_ok()
    }

    /// Keep this replica's member lease and its shards' leases until `stop`; then release them.
    pub async fn run(self: Arc<Self>, client: kube::Client, group: &str, identity: String, lease_duration: Duration, stop: impl Future<Output = ()>) {
        let api: Api<Lease> = Api::namespaced(client, SYSTEM_NAMESPACE);
        let mut keeper = Keeper { shards: self, api, group: group.to_string(), identity, duration: lease_duration, renewed: BTreeMap::new() };
        let tick = lease_duration / 3;
        tokio::pin!(stop);
        loop {
            // Deadlines are checked between and during rounds: a hanging API server must not
            // keep this replica acting on a shard another may already have taken.
            keeper.enforce_deadlines();
            let budget = keeper.until_deadline().min(tick).max(Duration::from_millis(10));
            let wake = tokio::select! {
                _ = &mut stop => break,
                wake = tokio::time::timeout(budget, keeper.round()) => wake.unwrap_or(tick),
            };
            keeper.enforce_deadlines();
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(wake.min(keeper.until_deadline())) => {}
            }
        }
        keeper.release_all().await;
    }
}

/// The lease loop's state.
struct Keeper {
    shards: Arc<Shards>,
    api: Api<Lease>,
    /// The sharded roles this process runs (see the module's documentation).
    group: String,
    identity: String,
    duration: Duration,
    /// When each held shard's lease was last renewed (sent), by this replica's clock.
    renewed: BTreeMap<u32, Instant>,
}

fn shard_lease(group: &str, n: u32) -> String {
    format!("banlieue-{group}-shard-{n}")
}

/// A Lease name for a replica identity (`host-1234` → `banlieue-<group>-replica-host-1234`).
fn member_lease(group: &str, identity: &str) -> String {
    let clean: String = identity.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' }).collect();
    let mut name = format!("banlieue-{group}-replica-{}", clean.trim_matches(|c: char| !c.is_ascii_alphanumeric()));
    name.truncate(253);
    name
}

fn holder(l: &Lease) -> Option<&str> {
    l.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// When `l` runs out (its holder's renewal plus its duration); `None`: never held.
fn expiry(l: &Lease) -> Option<Timestamp> {
    let spec = l.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    renewed.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds?))).ok()
}

fn live(l: &Lease, now: Timestamp) -> bool {
    holder(l).is_some() && expiry(l).is_some_and(|e| e > now)
}

impl Keeper {
    /// One round: renew membership, read every lease, take, keep and release shards.
    /// Returns how long to sleep (shorter when a shard this replica wants expires sooner).
    async fn round(&mut self) -> Duration {
        let tick = self.duration / 3;
        let now = Timestamp::now();
        let sent = Instant::now();
        let member = member_lease(&self.group, &self.identity);
        let leases = match self.api.list(&self.selector()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %e, "listing shard leases");
                return tick;
            }
        };
        let by_name: HashMap<String, &Lease> = leases.iter().map(|l| (l.metadata.name.clone().unwrap_or_default(), l)).collect();
        if let Err(e) = self.take(by_name.get(&member).copied(), &member, "member", now).await {
            tracing::warn!(error = %e, "renewing this replica's member lease");
            return tick;
        }
        let mut members: Vec<String> = leases
            .iter()
            .filter(|l| l.metadata.labels.as_ref().and_then(|m| m.get(LEASE_LABEL)).map(String::as_str) == Some("member") && live(l, now))
            .filter_map(|l| holder(l).map(str::to_string))
            .chain([self.identity.clone()])
            .collect();
        members.sort();
        members.dedup();
        let me = members.iter().position(|m| *m == self.identity).unwrap_or(0);
        let mine: BTreeSet<u32> = assigned(self.shards.count, members.len(), me).collect();
        let mut wake = tick;
        for n in 0..self.shards.count {
            let name = shard_lease(&self.group, n);
            let lease = by_name.get(&name).copied();
            let held_by_me = lease.and_then(holder) == Some(self.identity.as_str());
            if mine.contains(&n) {
                let free = lease.is_none_or(|l| !live(l, now));
                if held_by_me || free {
                    match self.take(lease, &name, "shard", now).await {
                        Ok(true) => {
                            self.renewed.insert(n, sent);
                            if !self.shards.held.borrow().contains(&n) {
                                tracing::info!(shard = n, identity = %self.identity, "took shard");
                                self.shards.gain(n);
                            }
                        }
                        Ok(false) => self.lose(n, "another replica took it"),
                        Err(e) => tracing::warn!(shard = n, error = %e, "renewing shard lease"),
                    }
                } else if let Some(e) = lease.and_then(expiry) {
                    // Held by a replica that may be gone: look again the moment it runs out.
                    let left = Duration::try_from(e.duration_since(now)).unwrap_or_default();
                    wake = wake.min(left + Duration::from_millis(50));
                }
            } else if held_by_me {
                self.release(n, lease).await;
            }
        }
        self.forget_dead_members(&leases, now).await;
        wake
    }

    /// Create, take over or renew a lease for this replica (a compare-and-swap on its
    /// resourceVersion). `Ok(false)`: another replica won.
    async fn take(&self, lease: Option<&Lease>, name: &str, kind: &str, now: Timestamp) -> Result<bool, kube::Error> {
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        };
        let result = match lease {
            None => {
                let labels = [(LEASE_LABEL.to_string(), kind.to_string()), (GROUP_LABEL.to_string(), self.group.clone())];
                let new = Lease {
                    metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels.into()), ..Default::default() },
                    spec: Some(LeaseSpec { acquire_time: Some(MicroTime(now)), lease_transitions: Some(0), ..spec }),
                };
                self.api.create(&PostParams::default(), &new).await
            }
            Some(l) => {
                let mut l = l.clone();
                let old = l.spec.take().unwrap_or_default();
                let ours = old.holder_identity.as_deref() == Some(self.identity.as_str());
                l.spec = Some(LeaseSpec {
                    acquire_time: if ours { old.acquire_time } else { Some(MicroTime(now)) },
                    lease_transitions: Some(old.lease_transitions.unwrap_or(0) + i32::from(!ours)),
                    ..spec
                });
                self.api.replace(name, &PostParams::default(), &l).await
            }
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn lose(&mut self, n: u32, why: &str) {
        if self.renewed.remove(&n).is_some() || self.shards.held.borrow().contains(&n) {
            tracing::warn!(shard = n, why, "stopped acting on shard");
        }
        self.shards.stop(n);
    }

    /// Hand a shard to the replica it is assigned to: stop, wait for the reconciles in
    /// flight, then clear the holder (the next owner takes it at once).
    async fn release(&mut self, n: u32, lease: Option<&Lease>) {
        self.shards.stop(n);
        if !self.shards.drained(n, self.duration / 3).await {
            // Still running: try again next round; the deadline still holds.
            return;
        }
        let Some(mut l) = lease.cloned() else { return };
        if let Some(spec) = l.spec.as_mut() {
            spec.holder_identity = None;
        }
        match self.api.replace(&shard_lease(&self.group, n), &PostParams::default(), &l).await {
            Ok(_) => {
                tracing::info!(shard = n, identity = %self.identity, "released shard");
                self.renewed.remove(&n);
            }
            Err(e) => tracing::warn!(shard = n, error = %e, "releasing shard lease"),
        }
    }

    /// A shard whose lease this replica could not renew in time is no longer acted on:
    /// after two missed renewals, a third of the lease is left as margin before another
    /// replica may take it.
    fn enforce_deadlines(&mut self) {
        let limit = self.duration * 2 / 3;
        let late: Vec<u32> = self.renewed.iter().filter(|(_, at)| at.elapsed() >= limit).map(|(n, _)| *n).collect();
        for n in late {
            self.lose(n, "its lease could not be renewed in time");
        }
    }

    /// This group's leases.
    fn selector(&self) -> ListParams {
        ListParams::default().labels(&format!("{LEASE_LABEL},{GROUP_LABEL}={}", self.group))
    }

    /// Time left before the first held shard must be given up.
    fn until_deadline(&self) -> Duration {
        let limit = self.duration * 2 / 3;
        self.renewed.values().map(|at| limit.saturating_sub(at.elapsed())).min().unwrap_or(self.duration)
    }

    async fn forget_dead_members(&self, leases: &[Lease], now: Timestamp) {
        let long_ago = k8s_openapi::jiff::SignedDuration::from_secs((self.duration.as_secs() * u64::from(FORGET_MEMBERS_AFTER)) as i64);
        for l in leases {
            let is_member = l.metadata.labels.as_ref().and_then(|m| m.get(LEASE_LABEL)).map(String::as_str) == Some("member");
            let dead = expiry(l).is_some_and(|e| e.checked_add(long_ago).is_ok_and(|t| t < now));
            if is_member && dead {
                let name = l.metadata.name.clone().unwrap_or_default();
                let _ = self.api.delete(&name, &DeleteParams::default()).await;
            }
        }
    }

    /// On shutdown: stop everything, then free the leases so the others take over at once.
    async fn release_all(&mut self) {
        let held: Vec<u32> = self.renewed.keys().copied().collect();
        let leases = self.api.list(&self.selector()).await.map(|l| l.items).unwrap_or_default();
        for n in held {
            let lease = leases.iter().find(|l| l.metadata.name.as_deref() == Some(shard_lease(&self.group, n).as_str()));
            self.release(n, lease).await;
        }
        let member = member_lease(&self.group, &self.identity);
        let _ = self.api.delete(&member, &DeleteParams::default()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_shards_the_same_way_everywhere() {
        assert_eq!(shard_of("team/vsphere-a", 16), shard_of("team/vsphere-a", 16));
        let mut seen = BTreeSet::new();
        for i in 0..200 {
            let s = shard_of(&format!("team/p{i}"), 16);
            assert!(s < 16);
            seen.insert(s);
        }
        assert_eq!(seen.len(), 16, "200 keys reach every shard");
        assert_eq!(shard_of("anything", 1), 0);
    }

    #[test]
    fn every_shard_is_assigned_to_exactly_one_member() {
        for members in 1..5 {
            let mut all: Vec<u32> = (0..members).flat_map(|i| assigned(16, members, i)).collect();
            all.sort();
            assert_eq!(all, (0..16).collect::<Vec<_>>(), "{members} members");
            let sizes: Vec<usize> = (0..members).map(|i| assigned(16, members, i).count()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
        }
    }

    #[test]
    fn member_lease_names_are_valid() {
        assert_eq!(member_lease("controller", "Node_1-4242"), "banlieue-controller-replica-node-1-4242");
        assert!(member_lease("provider", &"x".repeat(400)).len() <= 253);
    }

    #[tokio::test]
    async fn a_stopped_shard_cancels_its_reconciles_and_admits_no_new_one() {
        let shards = Shards::new(4);
        let key = "team/p";
        let n = shards.shard_of(key);
        assert!(shards.hold(key).is_none(), "nothing is held at first");
        shards.gain(n);
        let mut guard = shards.hold(key).expect("held");
        let lost = tokio::spawn(async move {
            guard.lost().await;
        });
        assert!(!shards.drained(n, Duration::from_millis(50)).await, "a reconcile is in flight until its guard goes");
        shards.stop(n);
        tokio::time::timeout(Duration::from_secs(5), lost).await.expect("the guard learns it lost the shard").unwrap();
        assert!(shards.drained(n, Duration::from_secs(5)).await);
        assert!(shards.hold(key).is_none());
    }

    #[tokio::test]
    async fn a_shard_lost_and_taken_back_is_a_gain() {
        use futures::StreamExt;
        let shards = Shards::new(4);
        let mut gained = std::pin::pin!(shards.gained());
        let within = Duration::from_secs(5);
        shards.gain(1);
        assert!(tokio::time::timeout(within, gained.next()).await.is_ok(), "the first shard is a gain");
        shards.stop(1);
        shards.gain(1);
        assert!(tokio::time::timeout(within, gained.next()).await.is_ok(), "taking back a lost shard is a gain");
        shards.stop(1);
        assert!(tokio::time::timeout(Duration::from_millis(100), gained.next()).await.is_err(), "a loss is not a gain");
    }
}
