//! VirtualMachinePools end to end on libvirt's test driver: scaling in the documented
//! order, protected members, rolling updates within their bounds (watched, not
//! sampled), replacement of deleted and never-Ready members, and deletion with nothing
//! left on the backend. Against the embedded server or `BANLIEUE_TEST_KUBECONFIG`.

use std::collections::{BTreeMap, BTreeSet};

use banlieue_api::{VirtualMachine, VirtualMachinePool};
use banlieue_controller::pool::{member, plan, POOL_LABEL, REVISION_LABEL};
use banlieue_libvirt::Libvirt;
use banlieue_tests::control::{apply, libvirt_fixtures, libvirt_test_node, wait_for, ControlPlane};
use banlieue_tests::{await_deleted, within, TestEnv};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};

const HOST_A: &str = "test:///default";

/// The libvirt class, a VMClass, two VMImages (`debian`, `debian-next`) and Providers `a` (test:///default) and
/// `b` (a second test host); returns host b's URI.
async fn fixtures(env: &TestEnv) -> anyhow::Result<String> {
    let host_b = libvirt_test_node(env.dir(), "host-b", 16, 64, 500)?;
    libvirt_fixtures(env, &[("a", HOST_A), ("b", &host_b)]).await?;
    let ns = &env.ns;
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{ns}-debian-next")},
                              "spec": {"sources": [{"providerClass": env.libvirt_class(), "backingFile": "/var/lib/images/debian-next.qcow2"}]}})).await?;
    Ok(host_b)
}

fn pool(env: &TestEnv, name: &str, replicas: i32, extra: Value) -> Value {
    let ns = &env.ns;
    let mut spec = json!({
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-debian")}}},
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn members(env: &TestEnv, pool: &str) -> anyhow::Result<Vec<VirtualMachine>> {
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    Ok(vms.list(&ListParams::default().labels(&format!("{POOL_LABEL}={pool}"))).await?.items)
}

/// Wait until the pool reports `n` members, all Ready and on the current revision.
async fn settled(env: &TestEnv, name: &str, n: i32) -> anyhow::Result<VirtualMachinePool> {
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for(&pools, name, 90, &format!("{n} Ready members"), move |p: Option<&VirtualMachinePool>| {
        p.and_then(|p| Some((p.metadata.generation, p.status.as_ref()?)))
            .is_some_and(|(g, s)| s.observed_generation == g && s.replicas == n && s.ready_replicas == n && s.updated_replicas == n)
    })
    .await
}

async fn domains(libvirt: &Libvirt, ns: &str) -> anyhow::Result<BTreeSet<String>> {
    let prefix = format!("{ns}_");
    Ok(libvirt.domain_list().await?.into_iter().map(|d| d.name).filter(|n| n.starts_with(&prefix)).collect())
}

async fn scale(env: &TestEnv, name: &str, replicas: i32) -> anyhow::Result<()> {
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    pools.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}}))).await?;
    Ok(())
}

#[tokio::test]
async fn scaling_out_spreads_and_scaling_in_follows_the_documented_order_sparing_protected_members() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-scale").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    let host_b = fixtures(&env).await?;
    let (a, b) = (cp.ctx.libvirt.get(HOST_A).await?, cp.ctx.libvirt.get(&host_b).await?);

    env.apply(pool(&env, "web", 0, json!({}))).await?;
    settled(&env, "web", 0).await?;
    scale(&env, "web", 5).await?;
    let web = settled(&env, "web", 5).await?;
    assert!(web.status.as_ref().and_then(|s| s.selector.as_deref()) == Some("app=web"), "the scale subresource's selector");
    let now = members(&env, "web").await?;
    let names: BTreeSet<String> = now.iter().map(|vm| vm.name_any()).collect();
    assert_eq!(names, (0..5).map(|i| format!("web-{i}")).collect::<BTreeSet<_>>());
    assert!(now.iter().all(|vm| vm.owner_references().iter().any(|o| o.kind == "VirtualMachinePool" && o.controller == Some(true))));
    // Spread by default: both hosts hold members, and the backends agree.
    let (on_a, on_b) = (domains(&a, &env.ns).await?.len(), domains(&b, &env.ns).await?.len());
    assert_eq!(on_a + on_b, 5);
    assert!(on_a >= 2 && on_b >= 2, "spread across failure domains: {on_a} on a, {on_b} on b");

    // Protect the member the order would take first; scale to 2.
    let planned: Vec<plan::Member> = now.iter().map(member).collect();
    let first = plan::scale_in(&planned, 4)[0].clone();
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    vms.patch(&first, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"banlieue.io/protected": "true"}}}))).await?;
    let planned: Vec<plan::Member> = members(&env, "web").await?.iter().map(member).collect();
    let expected: BTreeSet<String> = plan::scale_in(&planned, 2).into_iter().collect();
    assert!(!expected.contains(&first) && expected.len() == 3);
    scale(&env, "web", 2).await?;
    settled(&env, "web", 2).await?;
    for gone in &expected {
        await_deleted(&vms, gone).await?;
    }
    let left: BTreeSet<String> = members(&env, "web").await?.iter().map(|vm| vm.name_any()).collect();
    assert!(left.contains(&first), "the protected member stays: {left:?}");
    assert_eq!(left.len(), 2);
    let (on_a, on_b) = (domains(&a, &env.ns).await?, domains(&b, &env.ns).await?);
    assert_eq!(on_a.len() + on_b.len(), 2, "the backends hold the two members left");
    // Each deletion is an event on the pool saying why.
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let said: Vec<String> = events
        .list(&ListParams::default().fields("involvedObject.kind=VirtualMachinePool"))
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ScaledIn"))
        .filter_map(|e| e.message)
        .collect();
    for gone in &expected {
        assert!(said.iter().any(|m| m == &format!("deleted {gone} (scale in)")), "{said:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_rolling_update_replaces_every_member_within_max_unavailable() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-roll").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    let strategy = json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}});
    env.apply(pool(&env, "db", 3, strategy.clone())).await?;
    let before = settled(&env, "db", 3).await?;
    let old_revision = before.status.and_then(|s| s.current_revision).unwrap_or_default();

    // Watch every member from now on, then change the template.
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let list = vms.list(&ListParams::default().labels(&format!("{POOL_LABEL}=db"))).await?;
    let mut state: BTreeMap<String, (bool, bool)> = list.items.iter().map(|vm| (vm.name_any(), (ready(vm), false))).collect();
    let rv = list.metadata.resource_version.unwrap_or_default();
    let mut stream = vms.watch(&WatchParams::default().labels(&format!("{POOL_LABEL}=db")), &rv).await?.boxed();
    let mut changed = pool(&env, "db", 3, strategy);
    changed["spec"]["template"]["spec"]["imageRef"]["name"] = json!(format!("{}-debian-next", env.ns));
    env.apply(changed).await?;

    let mut worst = 0;
    let mut revisions: BTreeMap<String, String> = BTreeMap::new();
    within(120, async {
        while let Some(event) = stream.next().await {
            let (vm, gone) = match event? {
                WatchEvent::Added(vm) | WatchEvent::Modified(vm) => (vm, false),
                WatchEvent::Deleted(vm) => (vm, true),
                _ => continue,
            };
            let name = vm.name_any();
            if gone {
                state.remove(&name);
            } else {
                state.insert(name.clone(), (ready(&vm), vm.metadata.deletion_timestamp.is_some()));
                revisions.insert(name, vm.labels().get(REVISION_LABEL).cloned().unwrap_or_default());
            }
            // Unavailable: of 3 wanted, how many are not Ready and in service right now.
            let available = state.values().filter(|(r, deleting)| *r && !*deleting).count();
            worst = worst.max(3usize.saturating_sub(available));
            let done = state.len() == 3
                && state.iter().all(|(n, (r, d))| *r && !*d && revisions.get(n).is_some_and(|rev| rev != &old_revision));
            if done {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the watch ended")
    })
    .await??;
    assert!(worst <= 1, "at most maxUnavailable=1 member was unavailable during the update; saw {worst}");
    let after = settled(&env, "db", 3).await?;
    assert_ne!(after.status.and_then(|s| s.current_revision), Some(old_revision.clone()));
    for vm in members(&env, "db").await? {
        assert_eq!(vm.spec.image_ref.name, format!("{}-debian-next", env.ns));
        assert_ne!(vm.labels().get(REVISION_LABEL), Some(&old_revision));
    }
    Ok(())
}

/// A class grown under a pool's members (their `updatePolicy` the default
/// `OnNextPowerCycle`): the pool restarts them one at a time (maxUnavailable 1), watched, not
/// sampled; each member applies the change in that restart — libvirt's definition of every
/// domain shows the new vCPUs — and keeps its Machine.
#[tokio::test]
async fn a_class_change_is_applied_to_the_members_one_restart_at_a_time() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-grow").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    let host_b = fixtures(&env).await?;
    let class = |cpus: u32| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-grow", env.ns)},
               "spec": {"cpus": cpus, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}]}})
    };
    env.apply(class(1)).await?;
    let mut spec = pool(&env, "web", 3, json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}}));
    spec["spec"]["template"]["spec"]["classRef"]["name"] = json!(format!("{}-grow", env.ns));
    env.apply(spec).await?;
    settled(&env, "web", 3).await?;
    let machine_uids = |vms: &[VirtualMachine]| -> BTreeMap<String, String> {
        vms.iter().map(|vm| (vm.name_any(), vm.status.as_ref().and_then(|s| s.infrastructure_ref.as_ref()?.uid.clone()).unwrap_or_default())).collect()
    };
    let before = machine_uids(&members(&env, "web").await?);

    // Watch every member from now on, then grow the class.
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let list = vms.list(&ListParams::default().labels(&format!("{POOL_LABEL}=web"))).await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    let mut stream = vms.watch(&WatchParams::default().labels(&format!("{POOL_LABEL}=web")), &rv).await?.boxed();
    env.apply(class(2)).await?;
    // Per member: restarting (asked, not done), and applied.
    let mut state: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let mut worst = 0;
    within(120, async {
        while let Some(event) = stream.next().await {
            let (WatchEvent::Added(vm) | WatchEvent::Modified(vm)) = event? else { continue };
            let st = vm.status.clone().unwrap_or_default();
            let restarting = vm.spec.restart_requested_at.is_some() && vm.spec.restart_requested_at != st.last_restart_requested_at;
            let applied = st.conditions.iter().any(|c| c.type_ == "ConfigurationApplied" && c.status == "True") && st.last_restart_requested_at.is_some();
            state.insert(vm.name_any(), (restarting, applied));
            worst = worst.max(state.values().filter(|(r, _)| *r).count());
            if state.len() == 3 && state.values().all(|(r, a)| !*r && *a) {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the watch ended")
    })
    .await??;
    assert_eq!(worst, 1, "members restarted one at a time (maxUnavailable 1)");
    let after = members(&env, "web").await?;
    assert_eq!(machine_uids(&after), before, "every member kept its Machine");
    for vm in &after {
        let uri = match vm.status.as_ref().and_then(|s| s.scheduled.as_ref()).map(|s| s.provider.as_str()) {
            Some("a") => HOST_A.to_string(),
            _ => host_b.clone(),
        };
        // The control plane's own connection: a test host of a file is one per connection.
        let libvirt = cp.ctx.libvirt.get(&uri).await?;
        let xml = libvirt.domain_xml(&format!("{}_{}", env.ns, vm.name_any())).await?;
        assert!(xml.contains(">2</vcpu>"), "{} on {uri}: {xml}", vm.name_any());
    }
    Ok(())
}

#[tokio::test]
async fn a_deleted_member_is_replaced_and_deleting_the_pool_leaves_nothing_behind() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-heal").await?;
    env.install_crds().await?;
    let cp = ControlPlane::start(&env)?;
    let host_b = fixtures(&env).await?;
    let (a, b) = (cp.ctx.libvirt.get(HOST_A).await?, cp.ctx.libvirt.get(&host_b).await?);
    // Members are placed by the pool's own policy.
    let policy = format!("{}-binpack", env.ns);
    env.apply(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": policy},
                              "spec": {"component": {"source": "builtin:placement-binpack"}}})).await?;
    env.apply(pool(&env, "api", 3, json!({"placementPolicyRef": {"name": policy}}))).await?;
    settled(&env, "api", 3).await?;
    for member in members(&env, "api").await? {
        assert_eq!(member.spec.placement.as_ref().and_then(|p| p.policy_ref.as_ref()).map(|r| r.name.as_str()), Some(policy.as_str()));
        let scheduled = member.status.unwrap_or_default().conditions.into_iter().find(|c| c.type_ == "Scheduled").expect("Scheduled");
        assert!(scheduled.message.contains(&format!("by {policy}")), "{}", scheduled.message);
    }

    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let victim = members(&env, "api").await?[0].clone();
    vms.delete(&victim.name_any(), &DeleteParams::default()).await?;
    await_deleted(&vms, &victim.name_any()).await?;
    settled(&env, "api", 3).await?;
    let uids: BTreeSet<String> = members(&env, "api").await?.iter().filter_map(|vm| vm.uid()).collect();
    assert!(!uids.contains(&victim.uid().unwrap_or_default()), "a new member took its place");

    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    pools.delete("api", &DeleteParams::default()).await?;
    await_deleted(&pools, "api").await?;
    within(60, async {
        loop {
            if members(&env, "api").await?.is_empty() && domains(&a, &env.ns).await?.is_empty() && domains(&b, &env.ns).await?.is_empty() {
                return anyhow::Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await??;
    let machines: Api<kube::api::DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns,
        &kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", "LibvirtMachine"), "libvirtmachines"),
    );
    assert!(machines.list(&ListParams::default()).await?.items.is_empty(), "no Machine is left");
    Ok(())
}

#[tokio::test]
async fn a_member_that_never_becomes_ready_is_replaced_at_most_max_replacements_times() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-churn").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    // No Provider is named `nowhere`: members are never placed, for a reason the template
    // does not state (NoCandidates), so auto-healing replaces them — twice, then stops.
    let mut broken = pool(&env, "stuck", 1, json!({"autoHealing": {"notReadyTimeoutSeconds": 2, "maxReplacements": 2}}));
    broken["spec"]["template"]["spec"]["placement"] = json!({"providerRef": {"name": "nowhere"}});
    env.apply(broken).await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    let failed = wait_for(&pools, "stuck", 60, "ReplicaFailure AutoHealingLimit", |p: Option<&VirtualMachinePool>| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "ReplicaFailure" && c.reason == "AutoHealingLimit"))
    })
    .await?;
    let status = failed.status.unwrap_or_default();
    assert_eq!(status.replaced, 2);
    // Nothing more happens: the same single member stays, and the count stays at 2.
    let stuck = members(&env, "stuck").await?;
    assert_eq!(stuck.len(), 1);
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let replaced = |items: Vec<Event>| items.into_iter().filter(|e| e.message.as_deref().is_some_and(|m| m.ends_with("(not Ready in time)"))).count();
    assert_eq!(replaced(events.list(&ListParams::default()).await?.items), 2);
    Ok(())
}

#[tokio::test]
async fn a_template_naming_a_missing_class_reports_replica_failure_and_makes_nothing_more() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-badclass").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    let mut bad = pool(&env, "bad", 3, json!({}));
    bad["spec"]["template"]["spec"]["classRef"]["name"] = json!("no-such-class");
    env.apply(bad).await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    let failed = wait_for(&pools, "bad", 60, "ReplicaFailure ClassNotFound", |p: Option<&VirtualMachinePool>| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "ReplicaFailure" && c.reason == "ClassNotFound"))
    })
    .await?;
    let c = failed.status.unwrap_or_default().conditions.into_iter().find(|c| c.type_ == "ReplicaFailure").expect("condition");
    assert!(c.message.contains("no-such-class"), "{}", c.message);
    // The members made before the first one failed stay; no more come.
    let count = members(&env, "bad").await?.len();
    assert!((1..=3).contains(&count));
    pools.patch("bad", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 5}}))).await?;
    wait_for(&pools, "bad", 30, "observed", |p: Option<&VirtualMachinePool>| {
        p.is_some_and(|p| p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation)
    })
    .await?;
    assert_eq!(members(&env, "bad").await?.len(), count, "a broken template makes nothing more");
    // Out-of-range replicas are refused by the schema.
    let refused = pools.patch("bad", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1001}}))).await;
    assert!(matches!(refused, Err(kube::Error::Api(ref s)) if s.code == 422), "{refused:?}");
    let refused = pools.patch("bad", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": -1}}))).await;
    assert!(matches!(refused, Err(kube::Error::Api(ref s)) if s.code == 422), "{refused:?}");
    Ok(())
}

#[tokio::test]
async fn deleting_a_pool_with_cascade_orphan_leaves_its_members() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-orphan").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    env.apply(pool(&env, "keep", 2, json!({}))).await?;
    settled(&env, "keep", 2).await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    pools.delete("keep", &DeleteParams::orphan()).await?;
    await_deleted(&pools, "keep").await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    for name in ["keep-0", "keep-1"] {
        let member = wait_for(&vms, name, 30, "no owner", |v: Option<&VirtualMachine>| v.is_some_and(|v| v.owner_references().is_empty())).await?;
        assert!(member.metadata.deletion_timestamp.is_none() && ready(&member), "{name} stays, Ready");
        vms.delete(name, &DeleteParams::default()).await?;
        await_deleted(&vms, name).await?;
    }
    Ok(())
}

/// examples/pool/README.md, step by step, with `-n` for the test's namespace and a
/// Provider `dev` on libvirt's test driver as `banlieue dev` makes.
#[tokio::test]
async fn the_pool_walkthrough_works_as_written() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-walkthrough").await?;
    env.install_crds().await?;
    // The walkthrough's objects carry no installation label, as a user writes them: the
    // default installation acts on them (the only one of this suite's tests that runs it).
    let _cp = ControlPlane::start_with(&env, |o| o.installation = Default::default())?;
    let ns = env.ns.clone();
    apply(&env.client, json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "libvirt"},
        "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}})).await?;
    apply(&env.client, json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "dev", "namespace": ns},
        "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": HOST_A},
                 "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}}}})).await?;
    let root = banlieue_tests::control::repo_root();
    let path = banlieue_tests::control::path_with_workspace_binaries();
    let run = |args: Vec<String>| {
        let env = &env;
        let path = path.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = env.kubectl_raw(&args, None, &[("PATH", &path)]).await?;
            anyhow::ensure!(out.status.success(), "kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
            anyhow::Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        }
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let file = |p: &str| root.join(p).to_string_lossy().into_owned();

    // 1. Make the pool.
    run(s(&["apply", "-n", &ns, "-f", &file("examples/quickstart/vm.yaml"), "-f", &file("examples/pool/pool.yaml")])).await?;
    run(s(&["vm", "scale", "web", "3", "--wait", "-n", &ns])).await?;
    let pools = run(s(&["vm", "pools", "-n", &ns])).await?;
    assert!(pools.lines().any(|l| l.split_whitespace().take(5).eq(["web", "3", "3", "3", "3"])), "{pools}");
    // 2. Scale through the scale subresource, then wait with the plugin.
    run(s(&["scale", "vmpool/web", "--replicas=5", "-n", &ns])).await?;
    run(s(&["vm", "scale", "web", "5", "--wait", "-n", &ns])).await?;
    // 3. Protect the newest member, scale in: it stays.
    run(s(&["annotate", "vm", "web-4", "banlieue.io/protected=true", "-n", &ns])).await?;
    run(s(&["vm", "scale", "web", "2", "--wait", "-n", &ns])).await?;
    let left: BTreeSet<String> = members(&env, "web").await?.iter().map(|vm| vm.name_any()).collect();
    assert_eq!(left, BTreeSet::from(["web-0".to_string(), "web-4".to_string()]));
    // 4. Roll out a new template.
    run(s(&["patch", "vmpool", "web", "-n", &ns, "--type=merge", "-p", r#"{"spec":{"template":{"metadata":{"labels":{"app":"web","release":"2"}}}}}"#])).await?;
    let rolled = settled(&env, "web", 2).await?;
    let revision = rolled.status.and_then(|s| s.current_revision).unwrap_or_default();
    let current: Vec<VirtualMachine> = members(&env, "web").await?.into_iter().filter(|vm| vm.metadata.deletion_timestamp.is_none()).collect();
    assert_eq!(current.len(), 2);
    assert!(current.iter().all(|vm| vm.labels().get(REVISION_LABEL) == Some(&revision) && vm.labels().get("release").is_some_and(|r| r == "2")));
    // 5. Power a member, then clean up.
    let first = current[0].name_any();
    run(s(&["vm", "stop", &first, "--wait", "-n", &ns])).await?;
    run(s(&["vm", "start", &first, "--wait", "-n", &ns])).await?;
    run(s(&["delete", "vmpool", "web", "-n", &ns])).await?;
    within(60, async {
        while !members(&env, "web").await?.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        anyhow::Ok(())
    })
    .await??;
    Ok(())
}

#[tokio::test]
async fn a_selector_that_does_not_match_the_template_makes_no_member_and_says_why() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-selector").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    let mut odd = pool(&env, "odd", 2, json!({}));
    odd["spec"]["selector"] = json!({"matchLabels": {"app": "something-else"}});
    env.apply(odd).await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    let failed = wait_for(&pools, "odd", 30, "ReplicaFailure InvalidSelector", |p: Option<&VirtualMachinePool>| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "ReplicaFailure" && c.reason == "InvalidSelector"))
    })
    .await?;
    let c = failed.status.unwrap_or_default().conditions.into_iter().find(|c| c.type_ == "ReplicaFailure").expect("condition");
    assert!(c.message.contains("does not match spec.template.metadata.labels"), "{}", c.message);
    assert!(members(&env, "odd").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_paused_pool_changes_nothing_until_it_is_unpaused() -> anyhow::Result<()> {
    let env = TestEnv::start("pool-paused").await?;
    env.install_crds().await?;
    let _cp = ControlPlane::start(&env)?;
    fixtures(&env).await?;
    env.apply(pool(&env, "calm", 2, json!({}))).await?;
    settled(&env, "calm", 2).await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    pools.patch("calm", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": true, "replicas": 4}}))).await?;
    let paused = wait_for(&pools, "calm", 30, "Progressing=False Paused", |p: Option<&VirtualMachinePool>| {
        p.is_some_and(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.observed_generation == p.metadata.generation && s.conditions.iter().any(|c| c.type_ == "Progressing" && c.reason == "Paused" && c.status == "False")
            })
        })
    })
    .await?;
    assert_eq!(paused.status.map(|s| s.replicas), Some(2));
    assert_eq!(members(&env, "calm").await?.len(), 2, "no member made while paused");
    pools.patch("calm", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": false}}))).await?;
    settled(&env, "calm", 4).await?;
    Ok(())
}
