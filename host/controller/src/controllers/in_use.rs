//! In-use protection of Providers and their credentials Secrets (role `provider`), as
//! Kubernetes protects a PersistentVolumeClaim that Pods use (`kubernetes.io/pvc-protection`).
//!
//! A Machine's finalizer tears its backend VM down through its Provider: the driver of the
//! Provider's class, with the Provider's connection and credentials. Deleting a namespace
//! deletes everything in it at once, so without protection the Provider and its Secret went
//! first and every Machine still there waited forever for a Provider that was gone, its
//! backend VM never removed and the namespace left Terminating (issue 28). So the provider
//! role puts [`FINALIZER`] on each Provider and on the Secret its `credentialsRef` names,
//! and removes them only once no infrastructure Machine of the Provider's namespace names
//! the Provider. Until then the deleted Provider says so (`Ready=False`, reason `InUse`,
//! with how many Machines still use it) — and, not being Ready, gets no new VMs, while
//! the VMs placed on it stay where they are until deleted.
//!
//! The Secret protected is recorded on the Provider ([`PROTECTED_SECRET`]), so a Secret
//! the Provider no longer names (its `credentialsRef` changed) is released too, instead of
//! staying Terminating for ever once deleted. Several Providers may name one Secret: each
//! leaves it protected while another Provider of its namespace still needs it.

use std::time::{Duration, Instant};

use banlieue_api::provider::CredentialsKind;
use banlieue_api::{Provider, ProviderClass};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};

use crate::framework::reconciler::Outcome;
use crate::status::conditions::{self, READY};
use crate::status::reasons::Reason;
use crate::status::{self, finalizer};
use crate::{Context, Error};

/// Kept on a Provider and its credentials Secret while Machines use them (named like
/// banlieue's other finalizers: `banlieue.io/<what it guards>`).
pub const FINALIZER: &str = "banlieue.io/in-use";
/// The annotation on a Provider naming the Secret it put [`FINALIZER`] on.
pub const PROTECTED_SECRET: &str = "banlieue.io/protected-secret";
/// How often a deleted Provider that Machines still use counts them again, and at most how
/// often its condition is rewritten with the new count. Nothing wakes the Provider when its
/// last Machine goes (no watch of every Machine kind triggers it), and counting from the
/// caches costs no request; this bounds how long a namespace waits after its last Machine.
pub const RECHECK: Duration = Duration::from_secs(2);
/// Machines named in the `InUse` message (the count says how many there are).
const NAMED: usize = 3;

/// Count `store`'s Machines for in-use protection (and in the metrics). Not waited for
/// until it has listed them: kube's `Store::wait_until_ready` wakes only its last waiter,
/// which the kind's controller is, so a waiter here could wait forever. A cache still
/// listing holds no Machine — its kind's store is filled at once when the list is whole —
/// and a deleted Provider whose caches count none asks the API server before it goes.
pub fn add_cache(ctx: &Context, store: Store<DynamicObject>) {
    ctx.machine_caches.lock().unwrap_or_else(|e| e.into_inner()).push(store);
}

/// The Machines of every kind cached in this process that use `provider`.
fn users(ctx: &Context, provider: &Provider) -> Vec<String> {
    let (ns, name) = (provider.namespace().unwrap_or_default(), provider.name_any());
    let caches = ctx.machine_caches.lock().unwrap_or_else(|e| e.into_inner()).clone();
    caches
        .iter()
        .flat_map(|c| c.state())
        .filter(|m| uses(m, &ns, &name))
        .map(|m| format!("{} {}", m.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("Machine"), m.name_any()))
        .collect()
}

/// Whether Machine `m` needs Provider `provider` of namespace `ns`: it names it, and its
/// backend VM has not been torn down yet (a deleted Machine without the provider role's
/// finalizer only waits for others' finalizers, and is never reconciled again).
fn uses(m: &DynamicObject, ns: &str, provider: &str) -> bool {
    m.metadata.namespace.as_deref() == Some(ns)
        && m.data.pointer("/spec/providerRef/name").and_then(serde_json::Value::as_str) == Some(provider)
        && !(m.metadata.deletion_timestamp.is_some() && !finalizer::has(m, crate::framework::infra_kinds::MACHINE_FINALIZER))
}

/// The Secret `provider`'s `credentialsRef` names, if it names one.
fn credentials_secret(provider: &Provider) -> Option<String> {
    let r = provider.spec.connection.credentials_ref.as_ref()?;
    (r.kind == CredentialsKind::Secret).then(|| r.name.clone()).flatten().filter(|n| !n.is_empty())
}

fn protected_secret(provider: &Provider) -> Option<String> {
    provider.annotations().get(PROTECTED_SECRET).cloned().filter(|n| !n.is_empty())
}

/// A live Provider: give it [`FINALIZER`], and its credentials Secret too (releasing one it
/// no longer names). Best effort — a failure is logged and tried again on the next
/// reconcile, and does not hold up the probe (a missing permission shows on `/readyz`).
pub async fn protect(ctx: &Context, provider: &Provider, providers: &Store<Provider>) {
    if let Err(e) = try_protect(ctx, provider, providers).await {
        match &e {
            // Another write came first; its watch event brings the Provider back.
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => tracing::debug!(provider = %crate::key(provider), "in-use protection: conflict, tried again"),
            _ => tracing::warn!(provider = %crate::key(provider), error = %e, "cannot protect the Provider and its Secret from deletion while in use"),
        }
    }
}

async fn try_protect(ctx: &Context, provider: &Provider, providers: &Store<Provider>) -> Result<(), Error> {
    let ns = provider.namespace().unwrap_or_default();
    let (want, had) = (credentials_secret(provider), protected_secret(provider));
    let mut protected = had.clone();
    if want != had {
        // The new Secret first, then the old one released, then the record: a crash between
        // two steps leaves the record naming a Secret still to release, never one forgotten.
        protected = match &want {
            Some(name) => protect_secret(ctx, &ns, name).await?.then(|| name.clone()),
            None => None,
        };
        if let Some(old) = had.as_ref().filter(|old| protected.as_ref() != Some(*old)) {
            release_secret(ctx, provider, old, providers).await?;
        }
    }
    if finalizer::has(provider, FINALIZER) && protected == had {
        return Ok(());
    }
    let mut finalizers = provider.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.into());
    }
    // One write with the resourceVersion read: a concurrent change makes it fail (409).
    let mut patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": provider.resource_version()}});
    if protected != had {
        patch["metadata"]["annotations"] = serde_json::json!({ PROTECTED_SECRET: protected });
    }
    let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch(&provider.name_any(), &PatchParams::default(), &Patch::Merge(patch)).await?;
    Ok(())
}

/// Put [`FINALIZER`] on Secret `name`; false when there is no such Secret to protect (not
/// created yet, or already being deleted, when no finalizer may be added).
async fn protect_secret(ctx: &Context, ns: &str, name: &str) -> Result<bool, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    match api.get_opt(name).await? {
        Some(s) if finalizer::has(&s, FINALIZER) => Ok(true),
        Some(s) if s.metadata.deletion_timestamp.is_none() => {
            finalizer::add(&api, &s, FINALIZER).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Take [`FINALIZER`] off Secret `name`, unless another Provider of `provider`'s namespace
/// still needs it: one that names it (or protected it) and is not deleted, or is deleted
/// and still in use. (Two deleted Providers released at once both see the other as not
/// needing it, so the last one never leaves it behind.)
async fn release_secret(ctx: &Context, provider: &Provider, name: &str, providers: &Store<Provider>) -> Result<(), Error> {
    let ns = provider.namespace().unwrap_or_default();
    let needed = providers.state().iter().any(|p| {
        p.namespace().as_deref() == Some(ns.as_str())
            && p.uid() != provider.uid()
            && [credentials_secret(p), protected_secret(p)].iter().flatten().any(|s| s == name)
            && (p.metadata.deletion_timestamp.is_none() || (finalizer::has(p.as_ref(), FINALIZER) && !users(ctx, p).is_empty()))
    });
    if needed {
        return Ok(());
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(s) = api.get_opt(name).await?.filter(|s| finalizer::has(s, FINALIZER)) {
        finalizer::remove(&api, &s, FINALIZER).await?;
    }
    Ok(())
}

/// A deleted Provider: hold it while Machines use it, saying so; then release its Secret
/// and itself.
pub async fn deleted(ctx: &Context, provider: &Provider, providers: &Store<Provider>) -> Result<Outcome, Error> {
    if !finalizer::has(provider, FINALIZER) {
        return Ok(Outcome::AwaitChange);
    }
    let mut users = users(ctx, provider);
    if users.is_empty() {
        // The caches say none: ask the API server before letting go (a Machine made a moment
        // ago may not be cached yet, nor the cache of its kind complete at start-up).
        users = match listed_users(ctx, provider).await? {
            Ok(users) => users,
            Err(why) => return hold(ctx, provider, why).await,
        };
    }
    if !users.is_empty() {
        let n = users.len();
        let some = users.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
        let more = if n > NAMED { ", …" } else { "" };
        let why = format!("being deleted, and {n} Machine(s) still use it ({some}{more}); it goes once they are gone");
        return hold(ctx, provider, why).await;
    }
    let ns = provider.namespace().unwrap_or_default();
    let mut secrets = vec![protected_secret(provider), credentials_secret(provider)];
    secrets.dedup();
    for name in secrets.iter().flatten() {
        release_secret(ctx, provider, name, providers).await?;
    }
    let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer::remove(&api, provider, FINALIZER).await?;
    ctx.in_use_reported.lock().unwrap_or_else(|e| e.into_inner()).remove(&provider.uid().unwrap_or_default());
    ctx.recent.forget(&crate::key(provider));
    tracing::info!(provider = %crate::key(provider), "no Machine uses the deleted Provider any more: released");
    Ok(Outcome::AwaitChange)
}

/// The Machines of `provider`'s class that use it, as the API server lists them; or why
/// that cannot be told.
async fn listed_users(ctx: &Context, provider: &Provider) -> Result<Result<Vec<String>, String>, Error> {
    let class_name = &provider.spec.provider_class_ref.name;
    // Another installation's class is absent to this one, as everywhere else.
    let class = Api::<ProviderClass>::all(ctx.client.clone()).get_opt(class_name).await?.filter(|c| ctx.options.installation.owns(&c.metadata));
    let Some(class) = class else {
        // Its Machines cannot be torn down either (`ProviderClassNotFound`): both wait for it.
        return Ok(Err(format!("being deleted, but its ProviderClass {class_name:?} is not found, so the Machines that may still use it are not known")));
    };
    let ns = provider.namespace().unwrap_or_default();
    let resource = crate::framework::infra_kinds::machine_resource(&class.spec.infrastructure_kind);
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
    let name = provider.name_any();
    let listed = api.list(&ctx.options.installation.list()).await?;
    Ok(Ok(listed.items.iter().filter(|m| uses(m, &ns, &name)).map(|m| format!("{} {}", resource.kind, m.name_any())).collect()))
}

/// Keep the finalizer, and say why on `Ready` (an Event too, the first time).
async fn hold(ctx: &Context, provider: &Provider, why: String) -> Result<Outcome, Error> {
    let generation = provider.metadata.generation;
    let mut st = provider.status.clone().unwrap_or_default();
    let was_held = conditions::get(&st.conditions, READY).is_some_and(|c| Reason::InUse == c.reason);
    let uid = provider.uid().unwrap_or_default();
    {
        let mut reported = ctx.in_use_reported.lock().unwrap_or_else(|e| e.into_inner());
        if was_held && reported.get(&uid).is_some_and(|at| at.elapsed() < RECHECK) {
            return Ok(Outcome::Requeue(RECHECK));
        }
        reported.insert(uid, Instant::now());
    }
    // The failure domains stay: the VMs placed on the Provider still hold their placement.
    conditions::set(&mut st.conditions, READY, false, Reason::InUse, why.clone(), generation);
    st.observed_generation = generation;
    if !was_held {
        ctx.event(&provider.object_ref(&()), false, Reason::InUse, "Delete", why).await;
    }
    let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &provider.namespace().unwrap_or_default());
    status::write(&api, &provider.name_any(), provider.status.as_ref(), &st).await?;
    Ok(Outcome::Requeue(RECHECK))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(provider: &str, deleting: bool, finalizers: &[&str]) -> DynamicObject {
        let mut m: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
            "metadata": {"name": "m", "namespace": "ns", "finalizers": finalizers},
            "spec": {"providerRef": {"name": provider}},
        }))
        .unwrap();
        if deleting {
            m.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        }
        m
    }

    #[test]
    fn a_machine_uses_its_provider_until_its_backend_vm_is_torn_down() {
        assert!(uses(&machine("host", false, &[]), "ns", "host"), "not finalized yet, still to be made");
        assert!(uses(&machine("host", true, &[crate::framework::infra_kinds::MACHINE_FINALIZER]), "ns", "host"), "being torn down");
        assert!(!uses(&machine("host", true, &["other.example/keep"]), "ns", "host"), "torn down, waiting for others");
        assert!(!uses(&machine("other", false, &[]), "ns", "host"));
        assert!(!uses(&machine("host", false, &[]), "elsewhere", "host"));
    }

    #[test]
    fn only_a_kubernetes_secret_is_protected() {
        let provider = |credentials: serde_json::Value| -> Provider {
            Provider::new("p", serde_json::from_value(serde_json::json!({"providerClassRef": {"name": "c"}, "connection": {"endpoint": "x", "credentialsRef": credentials}})).unwrap())
        };
        assert_eq!(credentials_secret(&provider(serde_json::json!({"kind": "Secret", "name": "creds"}))).as_deref(), Some("creds"));
        assert_eq!(credentials_secret(&provider(serde_json::json!({"kind": "Vault", "path": "infra/x"}))), None);
        assert_eq!(credentials_secret(&provider(serde_json::json!({"kind": "Secret"}))), None);
    }
}
