//! The API-semantics suite: what banlieue relies on from a Kubernetes API server.
//! Runs against the embedded server, or any cluster given by `BANLIEUE_TEST_KUBECONFIG`;
//! every assertion holds on a real kube-apiserver too.

use std::collections::BTreeMap;

use anyhow::Context;

use banlieue_api::{VirtualMachine, VirtualMachinePool};
use banlieue_tests::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::Discovery;
use serde_json::{json, Value};

fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let data: BTreeMap<String, String> = data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap()
}

fn vm(name: &str) -> VirtualMachine {
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": name},
        "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}
    }))
    .unwrap()
}

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn discovery_lists_banlieue_kinds_with_short_names_and_subresources() -> anyhow::Result<()> {
    let env = TestEnv::start("discovery").await?;
    env.install_crds().await?;
    let discovery = Discovery::new(env.client.clone()).run().await?;
    let group = discovery.get("banlieue.io").expect("banlieue.io served");
    let (ar, caps) = group.recommended_kind("VirtualMachine").expect("VirtualMachine served");
    assert_eq!(ar.plural, "virtualmachines");
    assert!(caps.operations.iter().any(|v| v == "watch"));
    assert!(caps.subresources.iter().any(|(sub, _)| sub.plural == "status"));
    let (_, pool_caps) = group.recommended_kind("VirtualMachinePool").unwrap();
    assert!(pool_caps.subresources.iter().any(|(sub, _)| sub.plural == "scale"));
    let infra = discovery.get("infrastructure.banlieue.io").expect("infrastructure group served");
    assert!(infra.recommended_kind("LibvirtMachine").is_some());
    let out = env.kubectl(&["api-resources", "--api-group=banlieue.io", "-o", "wide"]).await?;
    assert!(out.lines().any(|l| l.starts_with("virtualmachines ") && l.contains(" vm ")), "{out}");
    assert!(out.contains("banlieue"), "categories listed: {out}");
    Ok(())
}

#[tokio::test]
async fn stale_update_conflicts_and_generation_counts_spec_changes_only() -> anyhow::Result<()> {
    let env = TestEnv::start("conflict").await?;
    env.install_crds().await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let created = vms.create(&PostParams::default(), &vm("web")).await?;
    assert_eq!(created.metadata.generation, Some(1));
    let rv1 = created.metadata.resource_version.clone().unwrap();

    let mut a = created.clone();
    a.spec.paused = true;
    let updated = vms.replace("web", &PostParams::default(), &a).await?;
    assert_eq!(updated.metadata.generation, Some(2), "spec change bumps generation");
    assert_ne!(updated.metadata.resource_version.as_deref(), Some(rv1.as_str()));

    // A writer holding the old resourceVersion loses.
    let mut stale = created.clone();
    stale.spec.migration_policy = banlieue_api::vm::MigrationPolicy::Never;
    let err = api_error(vms.replace("web", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!(err.code, 409);
    assert_eq!(err.reason, "Conflict");

    // Metadata-only changes keep the generation.
    let labelled = vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"tier": "web"}}}))).await?;
    assert_eq!(labelled.metadata.generation, Some(2));
    Ok(())
}

#[tokio::test]
async fn status_subresource_is_isolated_from_the_main_resource() -> anyhow::Result<()> {
    let env = TestEnv::start("status").await?;
    env.install_crds().await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    vms.create(&PostParams::default(), &vm("db")).await?;
    // The main endpoint ignores status...
    let p = vms.patch("db", &PatchParams::default(), &Patch::Merge(json!({"status": {"observedGeneration": 7}, "spec": {"paused": true}}))).await?;
    assert!(p.status.is_none_or(|s| s.observed_generation.is_none()));
    assert!(p.spec.paused);
    // ...the status endpoint ignores everything else, and doesn't bump generation.
    let s = vms.patch_status("db", &PatchParams::default(), &Patch::Merge(json!({"status": {"observedGeneration": 2}, "spec": {"paused": false}}))).await?;
    assert_eq!(s.status.unwrap().observed_generation, Some(2));
    assert!(s.spec.paused);
    assert_eq!(s.metadata.generation, Some(2));
    Ok(())
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() -> anyhow::Result<()> {
    let env = TestEnv::start("finalizers").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let mut c = cm("held", &[("a", "1")]);
    c.metadata.finalizers = Some(vec!["banlieue.io/test".into()]);
    cms.create(&PostParams::default(), &c).await?;
    // A delete that only marks the object answers with the object, marked.
    let marked = cms.delete("held", &DeleteParams::default()).await?.left().expect("the object, not a Status");
    assert!(marked.metadata.deletion_timestamp.is_some());
    let held = cms.get("held").await?;
    assert!(held.metadata.deletion_timestamp.is_some(), "marked for deletion");
    // No new finalizers once deleting.
    let err = cms.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": ["banlieue.io/test", "banlieue.io/other"]}}))).await.unwrap_err();
    assert_eq!(api_error(err).code, 422);
    // The update that removes the last finalizer answers with the object as it left it.
    let last = cms.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    assert!(last.metadata.finalizers.unwrap_or_default().is_empty(), "no finalizers in the response");
    await_deleted(&cms, "held").await?;
    assert!(cms.get_opt("held").await?.is_none());
    // A delete that removes the object at once answers with a Status, as kube-apiserver does.
    let gone = cms.create(&PostParams::default(), &cm("free", &[])).await?;
    let status = cms.delete("free", &DeleteParams::default()).await?.right().expect("a Status, not the object");
    assert!(status.is_success(), "{status:?}");
    let details = status.details.expect("details");
    assert_eq!((details.name.as_str(), details.kind.as_str(), details.uid.as_str()), ("free", "configmaps", gone.metadata.uid.as_deref().unwrap()));
    Ok(())
}

#[tokio::test]
async fn namespaces_carry_their_name_as_a_label() -> anyhow::Result<()> {
    let env = TestEnv::start("nslabel").await?;
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    let label = |ns: &k8s_openapi::api::core::v1::Namespace| ns.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/metadata.name")).cloned();
    assert_eq!(label(&nss.get(&env.ns).await?).as_deref(), Some(env.ns.as_str()));
    // It cannot be taken away or changed: every write puts it back.
    let patched = nss
        .patch(&env.ns, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"kubernetes.io/metadata.name": "other"}}})))
        .await?;
    assert_eq!(label(&patched).as_deref(), Some(env.ns.as_str()));
    Ok(())
}

fn owned_by(name: &str, owner: &ConfigMap) -> ConfigMap {
    let mut c = cm(name, &[]);
    c.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.metadata.name.clone().unwrap(),
        uid: owner.metadata.uid.clone().unwrap(),
        block_owner_deletion: Some(true),
        ..Default::default()
    }]);
    c
}

#[tokio::test]
async fn garbage_collection_background_foreground_and_orphan() -> anyhow::Result<()> {
    let env = TestEnv::start("gc").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let pp = PostParams::default();

    // Background: the owner goes at once, the dependent follows.
    let owner = cms.create(&pp, &cm("bg-owner", &[])).await?;
    cms.create(&pp, &owned_by("bg-dep", &owner)).await?;
    cms.delete("bg-owner", &DeleteParams::background()).await?;
    await_deleted(&cms, "bg-dep").await?;

    // Orphan: the dependent stays, without its owner reference.
    let owner = cms.create(&pp, &cm("or-owner", &[])).await?;
    cms.create(&pp, &owned_by("or-dep", &owner)).await?;
    cms.delete("or-owner", &DeleteParams::orphan()).await?;
    await_deleted(&cms, "or-owner").await?;
    let dep = cms.get("or-dep").await?;
    assert!(dep.metadata.owner_references.unwrap_or_default().is_empty());

    // Foreground: the owner is removed only after its dependents.
    let owner = cms.create(&pp, &cm("fg-owner", &[])).await?;
    let mut dep = owned_by("fg-dep", &owner);
    dep.metadata.finalizers = Some(vec!["banlieue.io/hold".into()]);
    cms.create(&pp, &dep).await?;
    cms.delete("fg-owner", &DeleteParams::foreground()).await?;
    let o = within(30, async {
        loop {
            let d = cms.get("fg-dep").await?;
            if d.metadata.deletion_timestamp.is_some() {
                return Ok::<_, anyhow::Error>(cms.get("fg-owner").await?);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await??;
    assert!(o.metadata.finalizers.unwrap_or_default().contains(&"foregroundDeletion".to_string()));
    cms.patch("fg-dep", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    await_deleted(&cms, "fg-owner").await?;
    Ok(())
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_objects() -> anyhow::Result<()> {
    let env = TestEnv::start("nsdel").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    for i in 0..3 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"), &[])).await?;
    }
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    nss.delete(&env.ns, &DeleteParams::default()).await?;
    let ns = nss.get_opt(&env.ns).await?;
    if let Some(ns) = ns {
        assert_eq!(ns.status.and_then(|s| s.phase).as_deref(), Some("Terminating"));
    }
    await_deleted(&nss, &env.ns).await?;
    assert!(cms.list(&ListParams::default()).await?.items.is_empty());
    Ok(())
}

/// As kube-controller-manager's namespace controller does: every object of a terminating
/// namespace is deleted, one with a finalizer stays (with its deletionTimestamp) until the
/// finalizer is removed, nothing new may be created meanwhile, and the namespace goes once
/// it is empty (banlieue's in-use protection of Providers relies on all of it).
#[tokio::test]
async fn a_terminating_namespace_waits_for_its_objects_finalizers() -> anyhow::Result<()> {
    let env = TestEnv::start("nsfin").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let mut held = cm("held", &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &held).await?;
    cms.create(&PostParams::default(), &cm("free", &[])).await?;
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    nss.delete(&env.ns, &DeleteParams::default()).await?;
    await_deleted(&cms, "free").await?;
    within(60, kube::runtime::wait::await_condition(cms.clone(), "held", |c: Option<&ConfigMap>| c.is_some_and(|c| c.metadata.deletion_timestamp.is_some()))).await??;
    let refused = cms.create(&PostParams::default(), &cm("late", &[])).await.unwrap_err();
    assert_eq!(api_error(refused).code, 403, "no new content in a terminating namespace");
    let ns = nss.get(&env.ns).await?;
    assert_eq!(ns.status.and_then(|s| s.phase).as_deref(), Some("Terminating"), "the namespace waits for the finalizer");
    cms.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    await_deleted(&nss, &env.ns).await?;
    Ok(())
}

#[tokio::test]
async fn label_and_field_selectors() -> anyhow::Result<()> {
    let env = TestEnv::start("selectors").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    for (name, tier, zone) in [("a", "web", Some("z1")), ("b", "db", Some("z2")), ("c", "web", None)] {
        let mut c = cm(name, &[]);
        let mut labels = BTreeMap::from([("tier".to_string(), tier.to_string())]);
        if let Some(z) = zone {
            labels.insert("zone".into(), z.into());
        }
        c.metadata.labels = Some(labels);
        cms.create(&PostParams::default(), &c).await?;
    }
    let names = |l: &kube::api::ObjectList<ConfigMap>| -> Vec<String> {
        let mut v: Vec<String> = l.items.iter().filter_map(|c| c.metadata.name.clone()).filter(|n| n.len() == 1).collect();
        v.sort();
        v
    };
    let q = |s: &str| ListParams::default().labels(s);
    assert_eq!(names(&cms.list(&q("tier=web")).await?), ["a", "c"]);
    assert_eq!(names(&cms.list(&q("tier!=web")).await?), ["b"]);
    assert_eq!(names(&cms.list(&q("zone in (z1,z2)")).await?), ["a", "b"]);
    assert_eq!(names(&cms.list(&q("tier,zone notin (z1)")).await?), ["b", "c"]);
    assert_eq!(names(&cms.list(&q("!zone")).await?), ["c"]);
    assert_eq!(names(&cms.list(&ListParams::default().fields("metadata.name=b")).await?), ["b"]);
    assert_eq!(names(&cms.list(&ListParams::default().fields("metadata.name!=b").labels("tier")).await?), ["a", "c"]);
    let bad = cms.list(&ListParams::default().fields("data.x=1")).await.unwrap_err();
    assert_eq!(api_error(bad).code, 400);
    Ok(())
}

#[tokio::test]
async fn list_pagination_with_limit_and_continue() -> anyhow::Result<()> {
    let env = TestEnv::start("paging").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    for i in 0..7 {
        cms.create(&PostParams::default(), &cm(&format!("p{i}"), &[])).await?;
    }
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(3).labels("");
    let mut pages = 0;
    loop {
        let page = cms.list(&lp).await?;
        pages += 1;
        assert!(page.items.len() <= 3);
        seen.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()).filter(|n| n.starts_with('p')));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, (0..7).map(|i| format!("p{i}")).collect::<Vec<_>>());
    assert!(pages >= 3);
    Ok(())
}

#[tokio::test]
async fn watch_from_a_resource_version_bookmarks_and_gone() -> anyhow::Result<()> {
    let env = TestEnv::start("watch").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let first = cms.create(&PostParams::default(), &cm("w", &[("v", "1")])).await?;
    let rv = first.metadata.resource_version.clone().unwrap();
    cms.patch("w", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await?;
    cms.delete("w", &DeleteParams::default()).await?;

    // Everything after `rv`, in order. (Only w's: kube-controller-manager adds
    // kube-root-ca.crt to a new namespace whenever it gets to it.)
    let stream = cms.watch(&WatchParams::default(), &rv).await?.boxed();
    let events = watch_until(stream, 30, |evs: &[WatchEvent<ConfigMap>]| evs.iter().any(|e| matches!(e, WatchEvent::Deleted(_)))).await?;
    let w = |c: &ConfigMap| c.metadata.name.as_deref() == Some("w");
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            WatchEvent::Modified(c) if w(c) => Some("MODIFIED"),
            WatchEvent::Deleted(c) if w(c) => Some("DELETED"),
            WatchEvent::Added(c) if w(c) => Some("ADDED"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["MODIFIED", "DELETED"]);

    // Initial events end with a bookmark.
    cms.create(&PostParams::default(), &cm("x", &[])).await?;
    // Streaming lists (the WatchList feature: alpha in 1.27, on by default from 1.32) are
    // refused where they are off — before 1.27 the `resourceVersionMatch` they send on a watch
    // is, later `sendInitialEvents` is — detected from the answer, skipped with a message.
    let wp = WatchParams::streaming_lists();
    let message = |e: &kube::Error| match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    };
    let refused = |e: &kube::Error| ["sendInitialEvents", "resourceVersionMatch is forbidden for watch"].iter().any(|m| message(e).contains(m));
    match cms.watch(&wp, "0").await {
        Err(e) if refused(&e) => {
            eprintln!("skipped streaming lists: they need the WatchList feature (Kubernetes 1.27 with it on, or 1.32 or newer); the server said: {}", message(&e))
        }
        stream => {
            let stream = stream?.boxed();
            let events = watch_until(stream, 30, |evs: &[WatchEvent<ConfigMap>]| {
                evs.iter().any(|e| matches!(e, WatchEvent::Bookmark(_) | WatchEvent::Error(_)))
            })
            .await?;
            match events.last() {
                Some(WatchEvent::Error(e)) if e.message.contains("sendInitialEvents") => {
                    eprintln!("skipped streaming lists: the server has no WatchList feature ({})", e.message)
                }
                Some(WatchEvent::Bookmark(b)) => {
                    assert!(events.iter().any(|e| matches!(e, WatchEvent::Added(c) if c.metadata.name.as_deref() == Some("x"))));
                    assert_eq!(b.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str), Some("true"));
                }
                other => panic!("a streaming list ends with a bookmark, got {other:?}"),
            }
        }
    }

    // A resourceVersion older than the history is Gone. Only the embedded server's small
    // history can be outrun here: kube-apiserver's watch cache grows while its events are
    // recent, and on a young one a ConfigMap watch from resourceVersion 1 replays them all
    // (a_watch_from_before_a_resource_was_served_is_gone pins its 410).
    if env.embedded().is_some() {
        for i in 0..(TEST_WATCH_HISTORY + 10) {
            cms.create(&PostParams::default(), &cm(&format!("g{i}"), &[])).await?;
        }
        let mut stream = cms.watch(&WatchParams::default(), "1").await?.boxed();
        let ev = within(30, stream.next()).await?.expect("one event");
        match ev? {
            WatchEvent::Error(e) => assert_eq!(e.code, 410),
            other => panic!("expected 410 Gone, got {other:?}"),
        }
    }
    Ok(())
}

/// The embedded server keeps events for a window (kube-apiserver's etcd compacts every 5
/// minutes): a watch from before it is `410 Gone`, however few events came since; this test
/// gives one server a 1-second window. (Embedded server only: kube-apiserver serves watches
/// from its watch cache, which keeps recent events past a compaction, so a test cannot wait
/// for it; a_watch_from_before_a_resource_was_served_is_gone pins its 410.)
#[tokio::test]
async fn a_watch_from_a_compacted_resource_version_is_gone() -> anyhow::Result<()> {
    if TestEnv::external() {
        eprintln!("skipped: the watch window is the embedded server's");
        return Ok(());
    }
    let env = TestEnv::start("compacted").await?;
    let config = banlieue_apiserver::Config { watch_window: std::time::Duration::from_secs(1), ..Default::default() };
    let server = banlieue_apiserver::ApiServer::start(config).await?;
    let path = env.dir().join("short-window-kubeconfig");
    server.write_kubeconfig(&path)?;
    let cms: Api<ConfigMap> = Api::namespaced(client_for(&path).await?, "default");
    let created = cms.create(&PostParams::default(), &cm("old", &[])).await?;
    cms.patch("old", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await?;
    // Gone once the create's event is older than the window.
    let from = created.metadata.resource_version.clone().unwrap();
    let code = within(30, async {
        loop {
            let mut stream = cms.watch(&WatchParams::default().timeout(2), &from).await?.boxed();
            match stream.next().await {
                Some(Ok(WatchEvent::Error(e))) => return anyhow::Ok(e.code),
                // Still resumable: it replays the patch. Look again shortly.
                _ => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
            }
        }
    })
    .await??;
    assert_eq!(code, 410);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn merge_json_and_strategic_patches() -> anyhow::Result<()> {
    let env = TestEnv::start("patches").await?;
    env.install_crds().await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    cms.create(&PostParams::default(), &cm("p", &[("a", "1"), ("b", "2")])).await?;
    let c = cms.patch("p", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": null, "c": "3"}}))).await?;
    assert_eq!(c.data.unwrap(), BTreeMap::from([("b".into(), "2".into()), ("c".into(), "3".into())]));
    let jp: json_patch::Patch = serde_json::from_value(json!([{"op": "test", "path": "/data/b", "value": "2"}, {"op": "replace", "path": "/data/b", "value": "20"}]))?;
    let c = cms.patch("p", &PatchParams::default(), &Patch::<()>::Json(jp)).await?;
    assert_eq!(c.data.unwrap()["b"], "20");
    let failing: json_patch::Patch = serde_json::from_value(json!([{"op": "test", "path": "/data/b", "value": "nope"}]))?;
    assert_eq!(api_error(cms.patch("p", &PatchParams::default(), &Patch::<()>::Json(failing)).await.unwrap_err()).code, 422);
    // Strategic merge: finalizers merge as a set.
    cms.patch("p", &PatchParams::default(), &Patch::Strategic(json!({"metadata": {"finalizers": ["x.io/a"]}}))).await?;
    let c = cms.patch("p", &PatchParams::default(), &Patch::Strategic(json!({"metadata": {"finalizers": ["x.io/b"]}}))).await?;
    // kube-apiserver's order for a merged primitive list: the patch's new items first.
    assert_eq!(c.metadata.finalizers.unwrap(), ["x.io/b", "x.io/a"]);
    cms.patch("p", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    // Custom resources have no strategic merge patch.
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    vms.create(&PostParams::default(), &vm("v")).await?;
    let err = vms.patch("v", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"paused": true}}))).await.unwrap_err();
    assert_eq!(api_error(err).code, 415);
    Ok(())
}

#[tokio::test]
async fn server_side_apply_owns_fields_and_detects_conflicts() -> anyhow::Result<()> {
    let env = TestEnv::start("ssa").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let cfg = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}, "data": data});
    let alice = PatchParams::apply("alice");
    let bob = PatchParams::apply("bob");
    let c = cms.patch("s", &alice, &Patch::Apply(cfg(json!({"a": "1", "shared": "x"})))).await?;
    let mf = c.metadata.managed_fields.unwrap();
    let entry = mf.iter().find(|m| m.manager.as_deref() == Some("alice")).expect("alice manages fields");
    assert_eq!(entry.operation.as_deref(), Some("Apply"));
    let fields = serde_json::to_value(&entry.fields_v1)?;
    assert!(fields.pointer("/f:data/f:a").is_some(), "{fields}");

    // Bob setting alice's field to another value conflicts...
    let err = api_error(cms.patch("s", &bob, &Patch::Apply(cfg(json!({"shared": "y"})))).await.unwrap_err());
    assert_eq!(err.code, 409);
    assert!(err.message.contains("alice"), "{}", err.message);
    // ...the same value is shared ownership, and force takes it over.
    cms.patch("s", &bob, &Patch::Apply(cfg(json!({"shared": "x", "b": "2"})))).await?;
    let c = cms.patch("s", &bob.clone().force(), &Patch::Apply(cfg(json!({"shared": "z", "b": "2"})))).await?;
    assert_eq!(c.data.as_ref().unwrap()["shared"], "z");

    // Fields alice no longer applies go away, unless someone else owns them.
    let c = cms.patch("s", &alice, &Patch::Apply(cfg(json!({})))).await?;
    let data = c.data.unwrap_or_default();
    assert!(!data.contains_key("a"), "dropped field removed: {data:?}");
    assert_eq!(data.get("shared").map(String::as_str), Some("z"));
    assert_eq!(data.get("b").map(String::as_str), Some("2"));

    // An update by another writer takes ownership from the appliers.
    let c = cms.patch("s", &PatchParams { field_manager: Some("carol".into()), ..Default::default() }, &Patch::Merge(json!({"data": {"b": "3"}}))).await?;
    let carol = c.metadata.managed_fields.unwrap().into_iter().find(|m| m.manager.as_deref() == Some("carol")).expect("carol");
    assert_eq!(carol.operation.as_deref(), Some("Update"));
    Ok(())
}

#[tokio::test]
async fn dry_run_changes_nothing() -> anyhow::Result<()> {
    let env = TestEnv::start("dryrun").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let pp = PostParams { dry_run: true, ..Default::default() };
    let c = cms.create(&pp, &cm("d", &[("a", "1")])).await?;
    assert_eq!(c.metadata.name.as_deref(), Some("d"));
    assert!(cms.get_opt("d").await?.is_none());
    cms.create(&PostParams::default(), &cm("d", &[("a", "1")])).await?;
    cms.patch("d", &PatchParams { dry_run: true, ..Default::default() }, &Patch::Merge(json!({"data": {"a": "2"}}))).await?;
    assert_eq!(cms.get("d").await?.data.unwrap()["a"], "1");
    cms.delete("d", &DeleteParams { dry_run: true, ..Default::default() }).await?;
    assert!(cms.get_opt("d").await?.is_some());
    Ok(())
}

#[tokio::test]
async fn schema_validation_defaulting_and_pruning() -> anyhow::Result<()> {
    let env = TestEnv::start("schema").await?;
    env.install_crds().await?;
    let gvk = GroupVersionKind::gvk("banlieue.io", "v1alpha1", "VMClass");
    let api: Api<DynamicObject> = Api::all_with(env.client.clone(), &ApiResource::from_gvk(&gvk));
    let obj = |spec: Value| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("c-{}", env.ns)}, "spec": spec})).unwrap()
    };
    // 422 naming every bad field.
    let err = api_error(api.create(&PostParams::default(), &obj(json!({"cpus": 0, "memoryMiB": "lots", "firmware": "EFI"}))).await.unwrap_err());
    assert_eq!(err.code, 422);
    for field in ["spec.cpus", "spec.memoryMiB", "spec.firmware"] {
        assert!(err.message.contains(field), "{field} in {}", err.message);
    }
    // Each cause names its field once, in `field`, as kube-apiserver does; kubectl joins the two.
    let causes = err.details.as_ref().map(|d| d.causes.clone()).unwrap_or_default();
    assert_eq!(causes.len(), 3, "{causes:?}");
    for c in &causes {
        assert!(!c.message.starts_with(&c.field), "{c:?}");
    }
    let bad = serde_json::to_string(&obj(json!({"cpus": 2, "memoryMiB": 1024, "firmware": "EFI"})))?;
    let out = env.kubectl_raw(&["create", "-f", "-"], Some(&bad), &[]).await?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(said.matches("spec.firmware").count(), 1, "{said}");
    // Defaults are filled, unknown fields pruned.
    let created = api.create(&PostParams::default(), &obj(json!({"cpus": 2, "memoryMiB": 1024, "bogus": true}))).await?;
    assert_eq!(created.data["spec"]["firmware"], "BIOS");
    assert!(created.data["spec"].get("bogus").is_none());
    // fieldValidation=Strict refuses unknown fields instead (server-side field validation: 1.25).
    if env.older_than(25, "server-side field validation (fieldValidation=Strict)").await? {
        api.delete(&format!("c-{}", env.ns), &DeleteParams::default()).await?;
        return Ok(());
    }
    let mut strict = obj(json!({"cpus": 2, "memoryMiB": 1024, "bogus": true}));
    strict.metadata.name = Some(format!("s-{}", env.ns));
    let req = http::Request::post("/apis/banlieue.io/v1alpha1/vmclasses?fieldValidation=Strict")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&strict)?)?;
    let err = env.client.request::<DynamicObject>(req).await.unwrap_err();
    let err = api_error(err);
    assert_eq!(err.code, 400);
    assert!(err.message.contains("bogus"), "{}", err.message);
    api.delete(&format!("c-{}", env.ns), &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn scale_subresource_reads_and_writes_replicas() -> anyhow::Result<()> {
    let env = TestEnv::start("scale").await?;
    env.install_crds().await?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(env.client.clone(), &env.ns);
    let pool: VirtualMachinePool = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "workers"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"pool": "workers"}},
                 "template": {"metadata": {"labels": {"pool": "workers"}}, "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}}}
    }))?;
    pools.create(&PostParams::default(), &pool).await?;
    let scale = pools.get_scale("workers").await?;
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    env.kubectl(&["scale", "-n", &env.ns, "vmpool/workers", "--replicas=5"]).await?;
    assert_eq!(pools.get("workers").await?.spec.replicas, 5);
    let s = pools.patch_scale("workers", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await?;
    assert_eq!(s.spec.unwrap().replicas, Some(1));
    assert_eq!(pools.get("workers").await?.spec.replicas, 1);
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_clear_status_errors() -> anyhow::Result<()> {
    let env = TestEnv::start("badinput").await?;
    let send = |method: &str, uri: String, ct: &str, body: Vec<u8>| {
        http::Request::builder().method(method).uri(uri).header("content-type", ct).body(kube::client::Body::from(body)).unwrap()
    };
    let base = format!("/api/v1/namespaces/{}/configmaps", env.ns);
    let status = |resp: http::Response<kube::client::Body>| resp.status().as_u16();
    assert_eq!(status(env.client.send(send("POST", base.clone(), "application/json", b"{not json".to_vec())).await?), 400);
    assert_eq!(status(env.client.send(send("GET", "/apis/nope.example.com/v1/things".into(), "application/json", vec![])).await?), 404);
    let big = serde_json::to_vec(&json!({"metadata": {"name": "big"}, "data": {"x": "a".repeat(4 * 1024 * 1024)}}))?;
    let code = match env.client.send(send("POST", base.clone(), "application/json", big)).await {
        Ok(r) => status(r),
        Err(e) => panic!("oversized body: {e}"),
    };
    assert_eq!(code, 413);
    env.client.send(send("POST", base.clone(), "application/json", serde_json::to_vec(&cm("t", &[]))?)).await?;
    assert_eq!(status(env.client.send(send("PATCH", format!("{base}/t"), "application/xml", b"<x/>".to_vec())).await?), 415);

    // Wrong or missing credentials.
    let kc = std::fs::read_to_string(&env.kubeconfig)?;
    if let Some(server) = env.embedded() {
        let bad = kc.replace(&server.token, "wrong-token");
        let path = env.dir().join("bad-kubeconfig");
        std::fs::write(&path, bad)?;
        let client = client_for(&path).await?;
        let err = Api::<ConfigMap>::namespaced(client, &env.ns).list(&ListParams::default()).await.unwrap_err();
        assert_eq!(api_error(err).code, 401);
    }
    Ok(())
}

#[tokio::test]
async fn persisted_objects_survive_a_restart() -> anyhow::Result<()> {
    if TestEnv::external() {
        eprintln!("skipped: restarting the server is the embedded server's");
        return Ok(());
    }
    let data = tempfile::tempdir()?;
    let mut env = TestEnv::start_with("persist", Some(data.path())).await?;
    env.install_crds().await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let created = vms.create(&PostParams::default(), &vm("keep")).await?;
    let ns = env.ns.clone();
    env.stop_server().await;
    drop(env);
    let env = TestEnv::start_with("persist2", Some(data.path())).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &ns);
    let again = vms.get("keep").await?;
    assert_eq!(again.metadata.uid, created.metadata.uid);
    // resourceVersions keep increasing across the restart.
    let next = vms.patch("keep", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": true}}))).await?;
    let rv = |o: &VirtualMachine| o.metadata.resource_version.clone().unwrap().parse::<u64>().unwrap();
    assert!(rv(&next) > rv(&created));
    Ok(())
}

/// A namespaced `Widget` CRD of the test's own group (so a shared cluster is left as it
/// was), served and established.
struct Widgets {
    crd: String,
    api_version: String,
    /// Widgets in the test's namespace.
    api: Api<DynamicObject>,
}

impl Widgets {
    async fn serve(env: &TestEnv) -> anyhow::Result<Widgets> {
        let group = format!("{}.test.banlieue.io", env.ns);
        let crd = format!("widgets.{group}");
        let definition: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": crd},
            "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}
        }))?;
        let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
        crds.create(&PostParams::default(), &definition).await?;
        within(30, kube::runtime::wait::await_condition(crds, &crd, kube::runtime::wait::conditions::is_crd_established())).await??;
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, "v1", "Widget"));
        Ok(Widgets { crd, api_version: ar.api_version.clone(), api: Api::namespaced_with(env.client.clone(), &env.ns, &ar) })
    }

    async fn create(&self, name: &str, size: i64) -> anyhow::Result<DynamicObject> {
        let w: DynamicObject = serde_json::from_value(json!({"apiVersion": self.api_version, "kind": "Widget", "metadata": {"name": name}, "spec": {"size": size}}))?;
        Ok(self.api.create(&PostParams::default(), &w).await?)
    }

    async fn delete_crd(&self) -> anyhow::Result<()> {
        Api::<CustomResourceDefinition>::all(self.api.clone().into_client()).delete(&self.crd, &DeleteParams::default()).await?;
        Ok(())
    }
}

/// The first event of a watch (bounded).
async fn first_event<K>(stream: impl futures::Stream<Item = kube::Result<WatchEvent<K>>>) -> anyhow::Result<WatchEvent<K>> {
    Ok(watch_until(Box::pin(stream), 30, |evs: &[WatchEvent<K>]| !evs.is_empty()).await?.remove(0))
}

#[tokio::test]
async fn crds_serve_at_once_and_their_deletion_removes_objects() -> anyhow::Result<()> {
    let env = TestEnv::start("crdlife").await?;
    let widgets = Widgets::serve(&env).await?;
    widgets.create("w", 3).await?;
    assert_eq!(widgets.api.get("w").await?.data["spec"]["size"], 3);
    widgets.delete_crd().await?;
    await_deleted(&Api::<CustomResourceDefinition>::all(env.client.clone()), &widgets.crd).await?;
    // kube-apiserver may answer a list with an empty one for a moment after the CRD is
    // gone (its handler stops serving asynchronously): the objects are gone at once, the
    // resource soon after. There is no event to await for the latter, so ask again.
    within(30, async {
        loop {
            match widgets.api.list(&ListParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => return anyhow::Ok(()),
                Ok(list) => assert!(list.items.is_empty(), "objects outlive their CRD: {:?}", list.items),
                Err(e) => return Err(e.into()),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .context("the deleted CRD's resource is still served")??;
    Ok(())
}

/// kube-apiserver serves each resource's watches from a cache that starts when it begins
/// serving the resource. A custom resource's history so starts with its CRD: a watch from
/// before is `410 Gone` even on a young server, where a built-in resource's watch from
/// resourceVersion 1 still replays every event. The embedded server does the same.
#[tokio::test]
async fn a_watch_from_before_a_resource_was_served_is_gone() -> anyhow::Result<()> {
    let env = TestEnv::start("servedsince").await?;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let before = cms.create(&PostParams::default(), &cm("before", &[])).await?.metadata.resource_version.unwrap();
    let widgets = Widgets::serve(&env).await?;
    let created = widgets.create("w", 1).await?;
    widgets.api.patch("w", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 2}}))).await?;

    // From before the CRD: gone, in kube-apiserver's words.
    match first_event(widgets.api.watch(&WatchParams::default(), &before).await?).await? {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"), "{e:?}");
            assert!(e.message.starts_with(&format!("too old resource version: {before} (")), "{}", e.message);
        }
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    // From the widget's creation: the change after it.
    let rv = created.metadata.resource_version.unwrap();
    match first_event(widgets.api.watch(&WatchParams::default(), &rv).await?).await? {
        WatchEvent::Modified(w) => assert_eq!(w.data["spec"]["size"], 2),
        other => panic!("expected the patch, got {other:?}"),
    }
    // A built-in resource served all along replays from the same resourceVersion (besides
    // the patch, maybe the kube-root-ca.crt kube-controller-manager adds to the namespace).
    cms.patch("before", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await?;
    let patched = |e: &WatchEvent<ConfigMap>| matches!(e, WatchEvent::Modified(c) if c.metadata.name.as_deref() == Some("before"));
    let stream = cms.watch(&WatchParams::default(), &before).await?.boxed();
    let events = watch_until(stream, 30, |evs: &[WatchEvent<ConfigMap>]| evs.iter().any(|e| patched(e) || matches!(e, WatchEvent::Error(_)))).await?;
    assert!(events.last().is_some_and(patched), "{events:?}");
    widgets.delete_crd().await
}

/// kube-apiserver answers a path none of its API groups serves with Go's plain-text
/// `404 page not found`; only under `/api` and its own groups does a handler answer with a
/// `Status`. A deleted CRD's resources are such a path. The embedded server does the same.
#[tokio::test]
async fn unknown_paths_are_plain_404s_outside_the_servers_own_groups() -> anyhow::Result<()> {
    let env = TestEnv::start("notfound").await?;
    let get = |uri: String| {
        let client = env.client.clone();
        async move {
            let req = http::Request::builder().uri(uri).body(kube::client::Body::empty()).unwrap();
            let resp = client.send(req).await?;
            let code = resp.status().as_u16();
            let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
            let body = resp.into_body().collect_bytes().await?;
            anyhow::Ok((code, ct, String::from_utf8_lossy(&body).into_owned()))
        }
    };
    for uri in ["/apis/nope.example.com/v1/things".to_string(), "/apis/nope.example.com".into(), format!("/apis/nope.example.com/v1/namespaces/{}/things/x", env.ns)] {
        let (code, ct, body) = get(uri.clone()).await?;
        assert_eq!((code, body.trim()), (404, "404 page not found"), "{uri}");
        assert!(ct.starts_with("text/plain"), "{uri}: {ct}");
    }
    for uri in [format!("/api/v1/namespaces/{}/nopes", env.ns), "/apis/rbac.authorization.k8s.io/v1/nopes".into(), format!("/api/v1/namespaces/{}/configmaps/x/nope", env.ns)] {
        let (code, ct, body) = get(uri.clone()).await?;
        assert_eq!(code, 404, "{uri}");
        assert!(ct.starts_with("application/json"), "{uri}: {ct}");
        let status: kube::core::Status = serde_json::from_str(&body)?;
        assert_eq!((status.reason.as_str(), status.message.as_str()), ("NotFound", "the server could not find the requested resource"), "{uri}");
    }
    // A CRD's group answers for its own: an unknown subresource is its object not found, an
    // unknown resource (or the whole group once the CRD is gone) plain text.
    let widgets = Widgets::serve(&env).await?;
    widgets.create("w", 1).await?;
    let url = widgets.api.resource_url();
    let (code, _, body) = get(format!("{url}/w/nope")).await?;
    let status: kube::core::Status = serde_json::from_str(&body).with_context(|| body.clone())?;
    assert_eq!((code, status.reason.as_str(), status.message), (404, "NotFound", format!("{} \"w\" not found", widgets.crd)));
    let (code, _, body) = get(url.replace("/widgets", "/gadgets")).await?;
    assert_eq!((code, body.trim()), (404, "404 page not found"));
    widgets.delete_crd().await
}

/// The embedded server records who asked for what, in RBAC's terms: the RBAC and
/// Secret checks of the suites read this log. (Embedded server only: a real cluster's
/// audit log is its operator's.)
#[tokio::test]
async fn requests_are_authorized_by_rbac_and_audited_with_the_impersonated_user() -> anyhow::Result<()> {
    if TestEnv::external() {
        eprintln!("skipped: the audit log is the embedded server's");
        return Ok(());
    }
    let env = TestEnv::start("audit").await?;
    const SA: &str = "system:serviceaccount:banlieue-system:banlieue-controller";
    let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig)?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.auth_info.impersonate = Some(SA.into());
    let as_sa = kube::Client::try_from(cfg)?;
    let cms: Api<ConfigMap> = Api::namespaced(as_sa.clone(), &env.ns);

    // Nothing granted: kube-apiserver's 403, in its words.
    let denied = cms.get_opt("absent").await.expect_err("no rule grants it");
    let kube::Error::Api(status) = denied else { panic!("{denied:?}") };
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        format!("configmaps \"absent\" is forbidden: User \"{SA}\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"{}\"", env.ns)
    );
    let review = |verb: &str, ns: &str| {
        serde_json::from_value::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>(json!({
            "spec": {"resourceAttributes": {"verb": verb, "resource": "configmaps", "namespace": ns}}}))
    };
    let reviews: Api<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview> = Api::all(as_sa.clone());
    let allowed = |r: k8s_openapi::api::authorization::v1::SelfSubjectAccessReview| r.status.is_some_and(|s| s.allowed);
    assert!(!allowed(reviews.create(&PostParams::default(), &review("get", &env.ns)?).await?));

    // A Role and a RoleBinding in the namespace grant get and list there, and nothing else.
    for object in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "read-cm", "namespace": env.ns},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "read-cm", "namespace": env.ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-cm"},
               "subjects": [{"kind": "ServiceAccount", "name": "banlieue-controller", "namespace": "banlieue-system"}]}),
    ] {
        banlieue_tests::control::apply(&env.client, object).await?;
    }
    assert!(cms.get_opt("absent").await?.is_none());
    cms.list(&ListParams::default()).await?;
    assert!(allowed(reviews.create(&PostParams::default(), &review("list", &env.ns)?).await?));
    assert!(!allowed(reviews.create(&PostParams::default(), &review("delete", &env.ns)?).await?));
    assert!(!allowed(reviews.create(&PostParams::default(), &review("get", "default")?).await?), "a RoleBinding grants in its namespace only");
    let create = cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "x"}}))?).await;
    assert!(matches!(create, Err(kube::Error::Api(ref s)) if s.code == 403), "{create:?}");

    let log = env.embedded().expect("embedded server").audit_log();
    let mine: Vec<_> = log.iter().filter(|e| e.user == SA).collect();
    let seen: Vec<(&str, Option<&str>, u16)> = mine.iter().map(|e| (e.verb.as_str(), e.name.as_deref(), e.code)).collect();
    assert_eq!(seen, vec![("get", Some("absent"), 403), ("get", Some("absent"), 404), ("list", None, 200), ("create", None, 403)], "{mine:#?}");
    assert!(mine.iter().all(|e| e.group.is_empty() && e.resource == "configmaps" && e.namespace.as_deref() == Some(env.ns.as_str())));
    assert!(log.iter().any(|e| e.user == "admin" && e.verb == "create" && e.resource == "namespaces"), "the test's own requests are admin's");
    Ok(())
}
