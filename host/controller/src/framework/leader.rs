//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas of one
//! role never act at once. The holder renews every third of the lease; one that
//! cannot renew before the lease runs out stops acting (the caller exits), and a
//! candidate takes over only once the holder's lease has expired.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;

/// How long a lease holds without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// A held lease. `lost()` resolves if it could not be renewed in time.
pub struct Leadership {
    lost: watch::Receiver<bool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Resolves when leadership is lost.
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|lost| *lost).await;
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// Block until this process holds Lease `namespace/name` as `identity`.
pub async fn acquire(client: kube::Client, namespace: &str, name: &str, identity: &str) -> Leadership {
    acquire_for(client, namespace, name, identity, LEASE_DURATION).await
}

/// [`acquire`] with a lease of `duration` (tests use short ones).
pub async fn acquire_for(client: kube::Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Leadership {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    loop {
        match try_acquire(&api, name, identity, duration).await {
            Ok(true) => break,
            Ok(false) => tracing::debug!(lease = name, "held by another replica; waiting"),
            Err(e) => tracing::warn!(lease = name, error = %e, "leader election"),
        }
        tokio::time::sleep(duration / 3).await;
    }
    tracing::info!(lease = name, identity, "acquired leadership");
    let (tx, rx) = watch::channel(false);
    let (name, identity) = (name.to_string(), identity.to_string());
    let renewer = tokio::spawn(async move {
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(duration / 3).await;
            match try_acquire(&api, &name, &identity, duration).await {
                Ok(true) => last = tokio::time::Instant::now(),
                Ok(false) => break,
                Err(e) => tracing::warn!(lease = %name, error = %e, "renewing lease"),
            }
            if last.elapsed() >= duration {
                break;
            }
        }
        tracing::error!(lease = %name, "lost leadership");
        let _ = tx.send(true);
    });
    Leadership { lost: rx, renewer }
}

/// Take or renew the lease if it is ours or has expired. `Ok(false)`: another holder.
async fn try_acquire(api: &Api<Lease>, name: &str, identity: &str, duration: Duration) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let Some(mut lease) = api.get_opt(name).await? else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.into()),
                lease_duration_seconds: Some(duration.as_secs() as i32),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let ours = spec.holder_identity.as_deref() == Some(identity);
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(MicroTime(renewed)), Some(secs)) => {
            now.duration_since(*renewed).as_secs() >= i64::from(secs)
        }
        _ => true,
    };
    if !ours && !expired {
        return Ok(false);
    }
    if !ours {
        spec.holder_identity = Some(identity.into());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(duration.as_secs() as i32);
    spec.renew_time = Some(MicroTime(now));
    // The resourceVersion makes this a compare-and-swap: two candidates cannot both win.
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
