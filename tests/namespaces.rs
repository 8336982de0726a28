//! Deleting a namespace, or a Provider by hand, never strands a VM on its backend (issue 28):
//! a Provider and its credentials Secret outlive the infrastructure Machines that need them
//! to tear their backend VMs down (in-use protection, `banlieue.io/in-use`). On libvirt's
//! test driver, against the embedded API server (or the cluster in `BANLIEUE_TEST_KUBECONFIG`,
//! whose kube-controller-manager then terminates the namespace).

use std::collections::BTreeSet;
use std::time::Instant;

use banlieue_api::{Provider, VirtualMachine};
use banlieue_controller::{IN_USE_FINALIZER as IN_USE, PROTECTED_SECRET};
use banlieue_libvirt::Libvirt;
use banlieue_tests::control::{libvirt_fixtures, libvirt_test_node, wait_for, ControlPlane};
use banlieue_tests::{await_deleted, within, TestEnv};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::{json, Value};

/// How many VMs the namespace-deletion test makes: `BANLIEUE_TEST_NAMESPACE_VMS`, or 150 (about
/// 10 s against the embedded server; the issue was found with 1,000).
fn vm_count() -> usize {
    std::env::var("BANLIEUE_TEST_NAMESPACE_VMS").ok().and_then(|n| n.parse().ok()).unwrap_or(150)
}

fn credentials(env: &TestEnv, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": env.ns}, "stringData": {"password": "s3cret"}})
}

/// A Provider on libvirt URI `uri` whose credentials are Secret `secret`.
fn provider(env: &TestEnv, name: &str, uri: &str, secret: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name, "namespace": env.ns},
           "spec": {"providerClassRef": {"name": env.libvirt_class()},
                    "connection": {"endpoint": uri, "credentialsRef": {"kind": "Secret", "name": secret}},
                    "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}},
                    "limits": {"maxConcurrentOperations": 1000, "operationsPerSecond": 10000}}})
}

fn vm(env: &TestEnv, name: &str, provider: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": env.ns},
           "spec": {"classRef": {"name": format!("{}-small", env.ns)}, "imageRef": {"name": format!("{}-debian", env.ns)},
                    "placement": {"providerRef": {"name": provider}}}})
}

fn ready_condition(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> Option<(String, String, String)> {
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().and_then(|s| ready_condition(&s.conditions)).is_some_and(|(s, _, _)| s == "True")
}

fn provider_ready(p: &Provider) -> Option<(String, String, String)> {
    ready_condition(&p.status.as_ref()?.conditions)
}

/// The test namespace's domains and volumes, as libvirt itself lists them.
async fn on_backend(libvirt: &Libvirt, ns: &str) -> anyhow::Result<(BTreeSet<String>, BTreeSet<String>)> {
    let prefix = format!("{ns}_");
    let domains = libvirt.domain_list().await?.into_iter().map(|d| d.name).filter(|n| n.starts_with(&prefix)).collect();
    let volumes = libvirt.volume_list("default-pool").await?.into_iter().map(|v| v.name).filter(|n| n.starts_with(&prefix)).collect();
    Ok((domains, volumes))
}

/// Apply `names` as VMs on `provider`, 32 at a time, and wait (by watch, at most `secs`)
/// until every one is Ready.
async fn make_vms(env: &TestEnv, names: &[String], provider: &str, secs: u64) -> anyhow::Result<()> {
    futures::stream::iter(names.iter().map(|n| env.apply(vm(env, n, provider))))
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    let mut ready = BTreeSet::new();
    let mut stream = watcher(vms, watcher::Config::default()).applied_objects().boxed();
    within(secs, async {
        while let Some(vm) = stream.try_next().await? {
            let name = vm.name_any();
            if is_ready(&vm) && wanted.contains(name.as_str()) {
                ready.insert(name);
            } else {
                ready.remove(&name);
            }
            if ready.len() == wanted.len() {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the watch ended")
    })
    .await
    .map_err(|e| anyhow::anyhow!("{} of {} VMs Ready: {e}", ready.len(), wanted.len()))??;
    Ok(())
}

fn has_in_use<K: kube::Resource>(o: Option<&K>) -> bool {
    o.is_some_and(|o| o.meta().finalizers.iter().flatten().any(|f| f == IN_USE))
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_vms_from_the_backend_and_then_goes() -> anyhow::Result<()> {
    let n = vm_count();
    let env = TestEnv::start("ns-delete").await?;
    env.install_crds().await?;
    // On the embedded server each role runs as its ServiceAccount with only deploy/'s RBAC:
    // protecting Providers and Secrets needs nothing more.
    let cp = ControlPlane::start_as_installed(&env).await?;
    let uri = libvirt_test_node(env.dir(), "host", n as u32 + 8, n as u64 / 2 + 8, n as u64 * 2 + 16)?;
    libvirt_fixtures(&env, &[]).await?;
    env.apply(credentials(&env, "host-credentials")).await?;
    env.apply(provider(&env, "host", &uri, "host-credentials")).await?;
    let libvirt = cp.ctx.libvirt.get(&uri).await?;

    let started = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("vm-{i}")).collect();
    make_vms(&env, &names, "host", 60 + n as u64 / 2).await?;
    let made = started.elapsed();
    let (domains, volumes) = on_backend(&libvirt, &env.ns).await?;
    assert_eq!((domains.len(), volumes.len()), (n, n), "one domain and one volume per VM");
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for(&providers, "host", 30, "in-use finalizer", has_in_use).await?;
    wait_for(&secrets, "host-credentials", 30, "in-use finalizer", has_in_use).await?;

    // Deleted while every VM is running: the namespace goes only after every backend VM.
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    namespaces.delete(&env.ns, &DeleteParams::default()).await?;
    let deleting = Instant::now();
    let gone = within(60 + n as u64 / 2, kube::runtime::wait::await_condition(namespaces.clone(), &env.ns, |ns: Option<&Namespace>| ns.is_none())).await;
    if !matches!(gone, Ok(Ok(_))) {
        let (domains, _) = on_backend(&libvirt, &env.ns).await?;
        let provider = providers.get_opt("host").await?.map(|p| (p.finalizers().to_vec(), provider_ready(&p)));
        anyhow::bail!("namespace {} not gone ({gone:?}); {} domains left on the backend; Provider: {provider:?}", env.ns, domains.len());
    }
    let (domains, volumes) = on_backend(&libvirt, &env.ns).await?;
    assert!(domains.is_empty() && volumes.is_empty(), "left on the backend: {domains:?} {volumes:?}");
    eprintln!("{n} VMs: Ready in {made:.1?}; namespace deleted, backend empty, in {:.1?}", deleting.elapsed());
    Ok(())
}

#[tokio::test]
async fn a_provider_deleted_while_vms_use_it_stays_until_they_are_gone() -> anyhow::Result<()> {
    let env = TestEnv::start("provider-in-use").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    let (uri, spare_uri) = (libvirt_test_node(env.dir(), "host", 16, 64, 500)?, libvirt_test_node(env.dir(), "spare", 16, 64, 500)?);
    libvirt_fixtures(&env, &[]).await?;
    // Two Providers share one credentials Secret.
    env.apply(credentials(&env, "shared-credentials")).await?;
    env.apply(provider(&env, "host", &uri, "shared-credentials")).await?;
    env.apply(provider(&env, "spare", &spare_uri, "shared-credentials")).await?;
    let libvirt = cp.ctx.libvirt.get(&uri).await?;
    let providers: Api<Provider> = Api::namespaced(env.client.clone(), &env.ns);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    for p in ["host", "spare"] {
        let protected = wait_for(&providers, p, 30, "in-use finalizer", has_in_use).await?;
        assert_eq!(protected.annotations().get(PROTECTED_SECRET).map(String::as_str), Some("shared-credentials"));
    }
    wait_for(&secrets, "shared-credentials", 30, "in-use finalizer", has_in_use).await?;
    let names: Vec<String> = (0..3).map(|i| format!("web-{i}")).collect();
    make_vms(&env, &names, "host", 60).await?;

    // Deleted by hand while three VMs use it: it stays, and says why.
    providers.delete("host", &DeleteParams::default()).await?;
    let held = |count: &'static str| {
        move |p: Option<&Provider>| {
            p.and_then(provider_ready).is_some_and(|(s, r, m)| s == "False" && r == "InUse" && m.contains(&format!("{count} Machine(s) still use it")))
        }
    };
    let host = wait_for(&providers, "host", 30, "InUse (3)", held("3")).await?;
    assert!(host.metadata.deletion_timestamp.is_some());
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let said = events.list(&ListParams::default()).await?.items;
    assert!(
        said.iter().any(|e| e.reason.as_deref() == Some("InUse") && e.involved_object.name.as_deref() == Some("host")),
        "an InUse Event on the Provider: {:?}",
        said.iter().map(|e| (&e.reason, &e.message)).collect::<Vec<_>>()
    );
    // Its Secret, deleted by hand too, stays while a Provider needs it.
    secrets.delete("shared-credentials", &DeleteParams::default()).await?;
    let secret = secrets.get("shared-credentials").await?;
    assert!(secret.metadata.deletion_timestamp.is_some() && has_in_use(Some(&secret)));
    // No new VM is placed on a Provider being deleted; those on it stay where they are.
    env.apply(vm(&env, "late", "host")).await?;
    let late = wait_for(&vms, "late", 30, "NoCandidates", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Scheduled").cloned()).is_some_and(|c| c.reason == "NoCandidates")
    })
    .await?;
    let scheduled = late.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Scheduled").unwrap();
    assert!(scheduled.message.contains("InUse"), "{}", scheduled.message);
    for n in &names {
        assert!(vms.get(n).await.is_ok_and(|v| is_ready(&v)), "{n} stays Ready on the deleted Provider");
    }

    // One VM goes (torn down through the deleted Provider): the count follows.
    vms.delete("web-0", &DeleteParams::default()).await?;
    await_deleted(&vms, "web-0").await?;
    wait_for(&providers, "host", 30, "InUse (2)", held("2")).await?;
    // The last ones go: so does the Provider, after them.
    for n in names.iter().skip(1).chain([&"late".to_string()]) {
        vms.delete(n, &DeleteParams::default()).await?;
    }
    for n in names.iter().skip(1) {
        await_deleted(&vms, n).await?;
    }
    await_deleted(&providers, "host").await?;
    let (domains, volumes) = on_backend(&libvirt, &env.ns).await?;
    assert!(domains.is_empty() && volumes.is_empty(), "left on the backend: {domains:?} {volumes:?}");
    // The Secret stays for the Provider that still names it, and goes with it.
    let secret = secrets.get("shared-credentials").await?;
    assert!(has_in_use(Some(&secret)), "still protected for Provider spare");
    providers.delete("spare", &DeleteParams::default()).await?;
    await_deleted(&providers, "spare").await?;
    await_deleted(&secrets, "shared-credentials").await?;
    Ok(())
}
