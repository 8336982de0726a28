//! Installing banlieue on a cluster: the `deploy/` kustomize tree renders, every object
//! in it passes the API server's schema, and each role, run with nothing but the RBAC
//! rules `deploy/base/rbac.yaml` grants its ServiceAccount, creates, powers and deletes
//! a VM — reading no Secret no banlieue object points at.
//!
//! The tree is applied with validation on against either server. The role runs read an
//! audit log: on the embedded server (which enforces RBAC for impersonated users as
//! kube-apiserver does) each role impersonates its ServiceAccount; on a real cluster each
//! role is a process of its own with its ServiceAccount's token, and the log is
//! kube-apiserver's (`BANLIEUE_TEST_AUDIT_LOG`).

use std::collections::{BTreeMap, BTreeSet};

use banlieue_api::VirtualMachine;
use banlieue_controller::permissions::Role;
use banlieue_libvirt::DomainState;
use banlieue_tests::control::{apply, repo_root, wait_for, ControlPlane};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};

fn embedded_only(test: &str) -> bool {
    if TestEnv::external() {
        eprintln!("skipped {test}: it installs cluster-wide objects and reads the embedded server's audit log");
        return true;
    }
    false
}

/// `kubectl kustomize <dir>` as JSON objects.
async fn render(env: &TestEnv, dir: &str) -> anyhow::Result<Vec<Value>> {
    let path = repo_root().join(dir);
    let yaml = env.kubectl(&["kustomize", &path.to_string_lossy()]).await?;
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&yaml) {
        let value: Value = serde::Deserialize::deserialize(doc)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[tokio::test]
async fn the_deploy_tree_renders_and_every_object_passes_the_server_schema() -> anyhow::Result<()> {
    // On both servers: on 1.24, kubectl validates against the server's OpenAPI v2 itself
    // (the server has no field validation), which refused the CRDs' optional enums once.
    let env = TestEnv::start("install").await?;
    let objects = render(&env, "deploy").await?;
    let kinds: BTreeMap<&str, usize> = objects.iter().fold(BTreeMap::new(), |mut m, o| {
        *m.entry(o["kind"].as_str().unwrap_or_default()).or_default() += 1;
        m
    });
    for (kind, n) in [("Namespace", 1), ("ServiceAccount", 4), ("ClusterRole", 6), ("ClusterRoleBinding", 4), ("Role", 4), ("RoleBinding", 4), ("Deployment", 4), ("PodDisruptionBudget", 4), ("Service", 1)] {
        assert_eq!(kinds.get(kind), Some(&n), "{kind} in {kinds:?}");
    }

    // The ClusterRole Cluster API's manager aggregates (the InfraMachine contract's RBAC rule),
    // bound to nobody by banlieue.
    let aggregated = of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["labels"]["cluster.x-k8s.io/aggregate-to-manager"] == "true")
        .expect("a ClusterRole labelled cluster.x-k8s.io/aggregate-to-manager");
    assert_eq!(aggregated["rules"][0]["apiGroups"], json!(["infrastructure.banlieue.io"]));
    // The one `edit` and `admin` aggregate: opening a VM's consoles.
    let console = of_kind(&objects, "ClusterRole").into_iter().find(|r| r["metadata"]["name"] == "banlieue-vm-console").expect("ClusterRole banlieue-vm-console");
    assert_eq!(console["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"], "true");
    assert_eq!(console["rules"][0]["resources"], json!(["virtualmachines/console", "virtualmachines/vnc"]));
    assert_eq!(console["rules"][0]["verbs"], json!(["get"]));

    // Each role's Deployment: its ServiceAccount, the restricted Pod Security profile,
    // probes on the metrics port, requests and a memory limit, a tagged image, a PDB.
    for role in Role::ALL {
        let name = role.account();
        let deployment = of_kind(&objects, "Deployment").into_iter().find(|d| d["metadata"]["name"] == name.as_str()).expect("deployment");
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], name.as_str());
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        let container = &pod["containers"][0];
        assert_eq!(container["args"][0], role.name());
        assert_eq!(container["image"], "ghcr.io/banlieue/banlieue:0.1.0");
        let sc = &container["securityContext"];
        assert_eq!((sc["allowPrivilegeEscalation"].clone(), sc["readOnlyRootFilesystem"].clone()), (json!(false), json!(true)));
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert!(container["resources"]["requests"]["memory"].is_string() && container["resources"]["limits"]["memory"].is_string());
        let labels = &deployment["spec"]["selector"]["matchLabels"];
        assert!(of_kind(&objects, "PodDisruptionBudget").iter().any(|p| &p["spec"]["selector"]["matchLabels"] == labels), "a PDB for {name}");
    }
    let overlay = render(&env, "deploy/overlays/local-registry").await?;
    for d in of_kind(&overlay, "Deployment") {
        assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "127.0.0.1:5000/banlieue:0.1.0");
    }

    // Applied as `kubectl apply -k deploy/` would, validation on: client-side apply, then
    // server-side (strict field validation where the server has it).
    let deploy = repo_root().join("deploy");
    env.kubectl(&["apply", "-k", &deploy.to_string_lossy()]).await?;
    env.kubectl(&["apply", "--server-side", "--force-conflicts", "--field-manager=banlieue-install", "-k", &deploy.to_string_lossy()]).await?;
    let listed = env.kubectl(&["get", "deployments,serviceaccounts,roles,rolebindings,poddisruptionbudgets,services", "-n", "banlieue-system", "-o", "name"]).await?;
    for role in Role::ALL {
        for kind in ["deployment.apps", "serviceaccount", "role.rbac.authorization.k8s.io", "poddisruptionbudget.policy"] {
            assert!(listed.contains(&format!("{kind}/{}", role.account())), "{kind}/{} in {listed}", role.account());
        }
    }
    let overlay_dir = repo_root().join("deploy/overlays/local-registry");
    // (It changes the image that the install above, and any before it, applied: take it over.)
    env.kubectl(&["apply", "--server-side", "--force-conflicts", "--dry-run=server", "--field-manager=banlieue-install", "-k", &overlay_dir.to_string_lossy()]).await?;

    // The schema is the real one: a misspelt field in a Deployment is refused with its path.
    let mut typo = of_kind(&objects, "Deployment")[0].clone();
    typo["spec"]["template"]["spec"]["securityContext"]["runAsNonRot"] = json!(true);
    let out = env
        .kubectl_raw(&["apply", "--server-side", "--dry-run=server", "--field-manager=banlieue-install", "-f", "-"], Some(&typo.to_string()), &[])
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("runAsNonRot"), "{stderr}");
    Ok(())
}

/// Every `(verb, group, resource[/subresource])` the rules grant.
fn granted(rules: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules.as_array().into_iter().flatten() {
        for group in rule["apiGroups"].as_array().into_iter().flatten() {
            for resource in rule["resources"].as_array().into_iter().flatten() {
                for verb in rule["verbs"].as_array().into_iter().flatten() {
                    out.insert((verb.as_str().unwrap_or_default().into(), group.as_str().unwrap_or_default().into(), resource.as_str().unwrap_or_default().into()));
                }
            }
        }
    }
    out
}

/// Where the fixtures' VMs run: a libvirt URI, its storage pool and network, and the
/// image's backing file.
struct Backend<'a> {
    uri: &'a str,
    pool: &'a str,
    network: &'a str,
    disk: &'a str,
}

/// libvirt's test driver in this process.
const TEST_DRIVER: Backend<'static> = Backend { uri: "test:///default", pool: "default-pool", network: "default", disk: "/var/lib/images/debian-12.qcow2" };

/// A libvirt ProviderClass `class` (and one with a kind of its own), a PlacementPolicy, a
/// VMClass, a VMImage, a Provider on `backend`, a user-data Secret and one nothing
/// references, a one-member pool `fleet` and VM `web`.
fn fixtures(ns: &str, class: &str, backend: &Backend) -> Vec<Value> {
    vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": class},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}}),
        // A class with a kind of its own: the operator installs its `SpareMachine` CRD.
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": format!("{ns}-spare")},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Spare", "capabilities": {"libvirt": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": format!("{ns}-binpack")},
               "spec": {"component": {"source": "builtin:placement-binpack"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{ns}-small")},
               "spec": {"cpus": 1, "memoryMiB": 512, "disks": [{"name": "root", "sizeGiB": 4, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}], "placementPolicyRef": {"name": format!("{ns}-binpack")}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{ns}-debian")},
               "spec": {"sources": [{"providerClass": class, "backingFile": backend.disk}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "a", "namespace": ns},
               "spec": {"providerClassRef": {"name": class}, "connection": {"endpoint": backend.uri},
                        "capabilities": {"storageClasses": {"standard": backend.pool}, "networkClasses": {"default": backend.network}}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "web-user-data", "namespace": ns},
               "stringData": {"user-data": "#cloud-config\n"}}),
        // In the same namespace, referenced by nothing: no role may read it.
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bystander", "namespace": ns},
               "stringData": {"password": "not banlieue's"}}),
        // It adopts what matches (nothing here), so it asks Provider `a` for a discovery first.
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool", "metadata": {"name": "fleet", "namespace": ns},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "fleet"}},
                        "adoptSelector": {"names": ["matches-nothing-*"]},
                        "template": {"metadata": {"labels": {"app": "fleet"}},
                                     "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-debian")},
                                              "placement": {"providerRef": {"name": "a"}}, "powerOffMode": "Hard"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web", "namespace": ns},
               "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-debian")},
                        "userData": {"name": "web-user-data", "key": "user-data"}, "powerOffMode": "Hard"}}),
    ]
}

#[tokio::test]
async fn each_role_runs_a_vm_with_only_its_rbac_rules_and_reads_only_referenced_secrets() -> anyhow::Result<()> {
    if embedded_only("each_role_runs_a_vm_with_only_its_rbac_rules_and_reads_only_referenced_secrets") {
        return Ok(());
    }
    let env = TestEnv::start("rbac").await?;
    env.install_crds().await?;
    env.create_namespace("banlieue-system").await?;
    let rbac = repo_root().join("deploy/base/rbac.yaml");
    env.kubectl(&["apply", "--server-side", "--field-manager=banlieue-install", "-f", &rbac.to_string_lossy()]).await?;
    let cp = ControlPlane::start_as_service_accounts(&env).await?;

    let ns = &env.ns;
    for object in fixtures(ns, &env.libvirt_class(), &TEST_DRIVER) {
        env.apply(object).await?;
    }

    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    let ready = |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    wait_for(&vms, "web", 90, "Ready", ready).await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(env.client.clone());
    wait_for(&crds, "sparemachines.infrastructure.banlieue.io", 30, "established", kube::runtime::wait::conditions::is_crd_established()).await?;
    let libvirt = cp.ctx.libvirt.get("test:///default").await?;
    let domain = format!("{ns}_web");
    let state = |name: &str| {
        let libvirt = libvirt.clone();
        let name = name.to_string();
        async move { anyhow::Ok(libvirt.domain_list().await?.into_iter().find(|d| d.name == name).map(|d| d.state)) }
    };
    assert_eq!(state(&domain).await?, Some(DomainState::Running));

    vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"desiredPowerState": "PoweredOff"}}))).await?;
    wait_for(&vms, "web", 60, "PoweredOff", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()?.observed_power_state).is_some_and(|p| p == banlieue_api::common::PowerState::PoweredOff)
    })
    .await?;
    assert_eq!(state(&domain).await?, Some(DomainState::Shutoff));

    let pools: Api<banlieue_api::VirtualMachinePool> = Api::namespaced(env.client.clone(), ns);
    let members = |n: i32| {
        move |p: Option<&banlieue_api::VirtualMachinePool>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.replicas == n && s.ready_replicas == n)
    };
    wait_for(&pools, "fleet", 90, "1 Ready member", members(1)).await?;
    let snaps = exercise_snapshots(&env.client, ns, |o| env.own(o)).await?;

    exercise_adoption(&env.client, ns, &domain, |o| env.own(o)).await?;
    assert_eq!(state(&domain).await?, None, "the domain is gone");
    assert!(snaps.get_opt("before").await?.is_none(), "the VM's snapshot went first");

    // The pool made its member, and scaled to zero deletes it.
    pools.patch("fleet", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 0}}))).await?;
    wait_for(&pools, "fleet", 60, "no member", members(0)).await?;
    await_deleted(&vms, "fleet-0").await?;

    // Each role found all its permissions at start-up.
    for (role, ctx) in &cp.roles {
        assert_eq!(ctx.readiness.report(), Ok(()), "{role:?}");
    }
    drop(cp);

    let log: Vec<Request> = env.embedded().expect("embedded").audit_log().into_iter().map(Request::from).collect();
    least_privilege(&log, &rbac)
}

/// Adoption under the roles' own RBAC: VM `web` let go of (`deletionPolicy: Orphan`: its
/// domain `domain` stays), discovered on Provider `a`, adopted again as `web-again`, which is
/// deleted with its domain.
async fn exercise_adoption(client: &kube::Client, ns: &str, domain: &str, own: impl Fn(Value) -> Value) -> anyhow::Result<()> {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"deletionPolicy": "Orphan"}}))).await?;
    vms.delete("web", &DeleteParams::default()).await?;
    banlieue_tests::within(180, await_deleted(&vms, "web")).await??;
    let providers: Api<banlieue_api::Provider> = Api::namespaced(client.clone(), ns);
    let patch = json!({"metadata": {"annotations": {banlieue_api::provider::DISCOVER_ANNOTATION: "released"}}});
    providers.patch("a", &PatchParams::default(), &Patch::Merge(patch)).await?;
    let answered = |p: Option<&banlieue_api::Provider>| p.and_then(|p| p.status.as_ref()?.discovery.as_ref()).is_some_and(|d| d.requested == "released");
    let a = wait_for(&providers, "a", 60, "the discovery", answered).await?;
    let found = a.status.and_then(|s| s.discovery).map(|d| d.machines).unwrap_or_default();
    let web = found.iter().find(|m| m.name == domain).ok_or_else(|| anyhow::anyhow!("{domain} is not discovered: {found:?}"))?;
    assert!(web.owner.is_none(), "released, so unmanaged: {web:?}");
    let again = json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web-again", "namespace": ns},
                       "spec": {"classRef": {"name": format!("{ns}-small")}, "placement": {"providerRef": {"name": "a"}},
                                "adopt": {"backendId": web.backend_id}, "powerOffMode": "Hard"}});
    vms.patch("web-again", &PatchParams::apply("test").force(), &Patch::Apply(own(again))).await?;
    let ready = |v: Option<&VirtualMachine>| v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    wait_for(&vms, "web-again", 120, "Ready, adopted", ready).await?;
    vms.delete("web-again", &DeleteParams::default()).await?;
    banlieue_tests::within(180, await_deleted(&vms, "web-again")).await??;
    Ok(())
}

/// Snapshots under the roles' own RBAC: one of VM `web` taken and reverted to (the provider
/// role takes it, the controller resolves the revert), and a schedule over pool `fleet` whose
/// retention deletes the older of its snapshots (the controller makes and deletes them; the
/// provider removes them from the backend). `own` labels an object as the caller's fixtures are.
async fn exercise_snapshots(client: &kube::Client, ns: &str, own: impl Fn(Value) -> Value) -> anyhow::Result<Api<banlieue_api::VMSnapshot>> {
    use banlieue_api::snapshot::SnapshotPhase;
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let snaps: Api<banlieue_api::VMSnapshot> = Api::namespaced(client.clone(), ns);
    let phase = |s: Option<&banlieue_api::VMSnapshot>| s.and_then(|s| s.status.as_ref()?.phase);
    apply(client, own(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMSnapshot", "metadata": {"name": "before", "namespace": ns}, "spec": {"vmRef": {"name": "web"}}}))).await?;
    wait_for(&snaps, "before", 120, "Ready", move |s: Option<&banlieue_api::VMSnapshot>| phase(s) == Some(SnapshotPhase::Ready)).await?;
    vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"revertTo": "before"}}))).await?;
    wait_for(&vms, "web", 180, "reverted", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()?.revert.as_ref()).is_some_and(|r| r.phase == banlieue_api::vm::RevertPhase::Reverted)
    })
    .await?;
    apply(client, own(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMSnapshotSchedule", "metadata": {"name": "often", "namespace": ns},
                             "spec": {"schedule": "* * * * * *", "selector": {"matchLabels": {"banlieue.io/pool": "fleet"}}, "retention": {"keepLast": 1}}})))
    .await?;
    let scheduled = kube::api::ListParams::default().labels("banlieue.io/snapshot-schedule=often");
    let first = banlieue_tests::within(120, async {
        loop {
            if let Some(s) = snaps.list(&scheduled).await?.items.into_iter().next() {
                return anyhow::Ok(s.name_any());
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await??;
    banlieue_tests::within(180, await_deleted(&snaps, &first)).await??;
    let schedules: Api<banlieue_api::VMSnapshotSchedule> = Api::namespaced(client.clone(), ns);
    schedules.patch("often", &PatchParams::default(), &Patch::Merge(json!({"spec": {"suspend": true}}))).await?;
    Ok(snaps)
}

/// A role of banlieue as its own `banlieue <role>` process, authenticated by a token of its
/// ServiceAccount, with the Deployment's arguments; killed when dropped.
struct RoleProcess {
    role: Role,
    metrics: u16,
    child: tokio::process::Child,
    log: std::path::PathBuf,
}

impl RoleProcess {
    async fn start(env: &TestEnv, role: Role) -> anyhow::Result<RoleProcess> {
        let token = env.kubectl(&["create", "token", &role.account(), "-n", banlieue_tests::SYSTEM_NAMESPACE, "--duration=2h"]).await?;
        let kubeconfig = env.dir().join(format!("{}.kubeconfig", role.name()));
        let admin = kube::config::Kubeconfig::read_from(&env.kubeconfig)?;
        let cluster = admin.clusters.first().and_then(|c| c.cluster.clone()).ok_or_else(|| anyhow::anyhow!("no cluster in {}", env.kubeconfig.display()))?;
        let config = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": role.account(), "user": {"token": token.trim()}}],
            "contexts": [{"name": "sa", "context": {"cluster": "c", "user": role.account()}}],
        });
        std::fs::write(&kubeconfig, serde_yaml::to_string(&config)?)?;
        let metrics = banlieue_test_backends::free_port();
        let log = env.dir().join(format!("{}.log", role.name()));
        // As deploy/base/roles.yaml runs them (the sharded roles with --shards=16).
        let mut cmd = tokio::process::Command::new(banlieue_tests::bootstrap::banlieue()?);
        cmd.arg(role.name()).arg(format!("--metrics-addr=127.0.0.1:{metrics}"));
        if matches!(role, Role::Controller | Role::Provider) {
            cmd.arg("--shards=16");
        }
        if role == Role::Provider {
            cmd.arg(format!("--console-listen=127.0.0.1:{}", banlieue_test_backends::free_port()));
        }
        let child = cmd
            .arg("--builtin-dir")
            .arg(banlieue_tests::control::guests_dist())
            .arg("--cache-dir")
            .arg(env.dir().join(format!("{}-cache", role.name())))
            .arg("--image-cache-dir")
            .arg(env.dir().join("image-cache"))
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info,kube=warn,hyper=warn")
            .env_remove("BANLIEUE_INSTANCE")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(env.dir().join(format!("{}.err", role.name())))?)
            .kill_on_drop(true)
            .spawn()?;
        Ok(RoleProcess { role, metrics, child, log })
    }

    /// `/readyz` answers 200 (polled, as a kubelet's readiness probe does).
    async fn ready(&mut self) -> anyhow::Result<()> {
        let url = format!("http://127.0.0.1:{}/readyz", self.metrics);
        let started = std::time::Instant::now();
        let mut last = String::new();
        while started.elapsed() < std::time::Duration::from_secs(60) {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("banlieue {} exited ({status}): {}", self.role.name(), self.said());
            }
            if let Ok(r) = banlieue_test_backends::http_client().get(&url).send().await {
                let code = r.status().as_u16();
                last = format!("{code} {}", r.text().await.unwrap_or_default());
                if code == 200 {
                    return Ok(());
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        anyhow::bail!("banlieue {}: /readyz not 200 within 60 s (last: {last}): {}", self.role.name(), self.said())
    }

    fn said(&self) -> String {
        let err = std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default();
        err.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

/// The install as a platform team makes it on a real cluster: `kubectl apply -k deploy/`,
/// then each role as a process of its own, authenticated with its own ServiceAccount's token
/// (not impersonated), with only the rules the install granted. Each is ready; a VM is
/// created, powered off and on, restarted and deleted, a pool scaled 0 → 3 → 0, on libvirtd
/// (checked with virsh); then, from the real server's audit log: nothing was refused, every
/// rule granted was used (or is listed with the test that uses it), no Secret was read but
/// by name and only the referenced one.
#[tokio::test]
async fn on_a_real_cluster_each_role_runs_with_its_own_service_account_token_and_only_the_installed_rules() -> anyhow::Result<()> {
    if !TestEnv::external() {
        eprintln!("skipped: needs a real cluster (BANLIEUE_TEST_KUBECONFIG) to issue ServiceAccount tokens; the embedded server's variant impersonates the same accounts");
        return Ok(());
    }
    let lv = banlieue_test_backends::libvirtd::Libvirtd::shared()?;
    let env = TestEnv::start("rbac-tokens").await?;
    // Where the audit log starts for this test (kube-apiserver's --audit-log-path).
    let audit = std::env::var_os("BANLIEUE_TEST_AUDIT_LOG").map(std::path::PathBuf::from);
    let audit_from = audit.as_ref().and_then(|p| std::fs::metadata(p).ok()).map_or(0, |m| m.len());
    // As on a cluster banlieue was never installed on: an earlier run's default-installation
    // Leases and the CRDs of the fixtures' own kind would spare the roles creating them.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(env.client.clone(), banlieue_tests::SYSTEM_NAMESPACE);
    let default_installation = |name: &str| Role::ALL.iter().any(|r| name == r.lease() || name.starts_with(&format!("{}-", r.lease())) && !name.contains("-test-"));
    for lease in leases.list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
        if default_installation(&lease.name_any()) {
            leases.delete(&lease.name_any(), &DeleteParams::default()).await?;
        }
    }
    for kind in ["machines", "machinetemplates", "clusters", "clustertemplates"] {
        env.kubectl(&["delete", "crd", &format!("spare{kind}.infrastructure.banlieue.io"), "--ignore-not-found"]).await?;
    }
    let deploy = repo_root().join("deploy");
    env.kubectl(&["apply", "--server-side", "--force-conflicts", "--field-manager=banlieue-install", "-k", &deploy.to_string_lossy()]).await?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(env.client.clone());
    wait_for(&crds, "virtualmachines.banlieue.io", 30, "established", kube::runtime::wait::conditions::is_crd_established()).await?;

    let mut roles = Vec::new();
    for role in Role::ALL {
        roles.push(RoleProcess::start(&env, role).await?);
    }
    for r in &mut roles {
        r.ready().await?;
    }

    // The default installation's objects (deploy/ runs it): unlabelled, as a user writes them.
    let ns = &env.ns;
    let class = env.libvirt_class();
    let disk = lv.guest_disk();
    let backend = Backend { uri: &lv.uri, pool: &lv.pool, network: &lv.network, disk: &disk };
    let _leftovers = banlieue_test_backends::libvirtd::Leftovers { lv, prefix: format!("{ns}_"), volumes: vec![] };
    for object in fixtures(ns, &class, &backend) {
        apply(&env.client, object).await?;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), ns);
    let ready = |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let domain = format!("{ns}_web");
    wait_for(&vms, "web", 180, "Ready", ready).await?;
    assert_eq!(lv.state(&domain)?.trim(), "running");

    let spec = |patch: Value| {
        let vms = vms.clone();
        async move { vms.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": patch}))).await }
    };
    spec(json!({"desiredPowerState": "PoweredOff"})).await?;
    wait_for(&vms, "web", 90, "PoweredOff", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()?.observed_power_state).is_some_and(|p| p == banlieue_api::common::PowerState::PoweredOff)
    })
    .await?;
    assert_eq!(lv.state(&domain)?.trim(), "shut off");
    spec(json!({"desiredPowerState": "PoweredOn"})).await?;
    wait_for(&vms, "web", 90, "PoweredOn", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()?.observed_power_state).is_some_and(|p| p == banlieue_api::common::PowerState::PoweredOn)
    })
    .await?;
    assert_eq!(lv.state(&domain)?.trim(), "running");
    let stamp = "2026-12-06T00:00:00Z";
    spec(json!({"restartRequestedAt": stamp})).await?;
    wait_for(&vms, "web", 90, "restart recorded", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()?.last_restart_requested_at.clone()).as_deref() == Some(stamp)
    })
    .await?;
    assert_eq!(lv.state(&domain)?.trim(), "running");
    let pools: Api<banlieue_api::VirtualMachinePool> = Api::namespaced(env.client.clone(), ns);
    let members = |n: i32| {
        move |p: Option<&banlieue_api::VirtualMachinePool>| p.and_then(|p| p.status.as_ref()).is_some_and(|s| s.replicas == n && s.ready_replicas == n)
    };
    wait_for(&pools, "fleet", 180, "1 Ready member", members(1)).await?;
    // The default installation's objects are unlabelled.
    let snaps = exercise_snapshots(&env.client, ns, |o| o).await?;
    exercise_adoption(&env.client, ns, &domain, |o| o).await?;
    assert!(lv.domains(&domain)?.is_empty(), "the domain is gone");
    assert!(snaps.get_opt("before").await?.is_none(), "the VM's snapshot went first");

    for n in [0, 3, 0] {
        pools.patch("fleet", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": n}}))).await?;
        wait_for(&pools, "fleet", 240, &format!("{n} Ready members"), members(n)).await?;
        // A member scaled in is gone once its finalizer saw its domain removed.
        for i in n..3 {
            banlieue_tests::within(120, await_deleted(&vms, &format!("fleet-{i}"))).await??;
        }
        assert_eq!(lv.domains(&format!("{ns}_fleet-"))?.len(), n as usize, "{n} domains on libvirt");
    }
    drop(roles);

    let Some(audit) = audit else {
        eprintln!("skipped the audit part: set BANLIEUE_TEST_AUDIT_LOG to the API server's audit log (kube-apiserver --audit-log-path)");
        return Ok(());
    };
    let mut text = std::fs::read(&audit)?;
    let text = String::from_utf8_lossy(&text.split_off((audit_from as usize).min(text.len()))).into_owned();
    let log: Vec<Request> = text.lines().filter_map(Request::from_kube_audit).collect();
    anyhow::ensure!(log.iter().any(|r| r.user == Role::Controller.user()), "no request of the controller in {}", audit.display());
    least_privilege(&log, &repo_root().join("deploy/base/rbac.yaml"))
}

#[tokio::test]
async fn a_role_missing_a_permission_says_which_and_is_not_ready() -> anyhow::Result<()> {
    if embedded_only("a_role_missing_a_permission_says_which_and_is_not_ready") {
        return Ok(());
    }
    let env = TestEnv::start("rbac-missing").await?;
    env.install_crds().await?;
    env.create_namespace("banlieue-system").await?;
    // The controller's RBAC, less `create` on infrastructure machines.
    let rbac = std::fs::read_to_string(repo_root().join("deploy/base/rbac.yaml"))?;
    let mut docs: Vec<Value> = serde_yaml::Deserializer::from_str(&rbac).map(|d| serde::Deserialize::deserialize(d)).collect::<Result<_, _>>()?;
    for doc in docs.iter_mut().filter(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "banlieue-controller") {
        for rule in doc["rules"].as_array_mut().expect("rules").iter_mut().filter(|r| r["apiGroups"] == json!(["infrastructure.banlieue.io"])) {
            rule["verbs"].as_array_mut().expect("verbs").retain(|v| v != "create");
        }
    }
    for doc in docs {
        env.apply(doc).await?;
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let cp = ControlPlane::start_as_service_accounts_with(&env, |role, options| {
        if role == Role::Controller {
            options.metrics_addr = Some(metrics);
        }
    })
    .await?;
    let controller = cp.roles.iter().find(|(r, _)| *r == Role::Controller).map(|(_, c)| c.clone()).expect("controller");
    let report = banlieue_tests::within(30, async {
        loop {
            match controller.readiness.report() {
                Err(why) if why.contains("missing permission") => return why,
                _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    })
    .await?;
    assert_eq!(report, "controller: missing permission: create *.infrastructure.banlieue.io\n");
    // What the kubelet's readiness probe sees.
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
    let mut answer = String::new();
    banlieue_tests::within(10, stream.read_to_string(&mut answer)).await??;
    assert!(answer.starts_with("HTTP/1.1 503") && answer.contains("missing permission: create *.infrastructure.banlieue.io"), "{answer}");

    // What it may do still works, and the VM it cannot realise says why, in its condition.
    for object in fixtures(&env.ns, &env.libvirt_class(), &TEST_DRIVER) {
        env.apply(object).await?;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    let forbidden = |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "Forbidden"))
    };
    let vm = wait_for(&vms, "web", 60, "Ready=False Forbidden", forbidden).await?;
    let ready = vm.status.unwrap_or_default().conditions.into_iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains(&format!("User \"{}\" cannot create resource \"libvirtmachines\"", Role::Controller.user()))
            && ready.message.contains("deploy/base/rbac.yaml"),
        "{}",
        ready.message
    );
    Ok(())
}

/// `make image` (with the debug binary this run already built), pushed to a real
/// registry and inspected there; then its only layer unpacked and the binary run from
/// it — as the image's user, with nothing but the image's files — against the
/// embedded server. (podman cannot start containers on these machines: crun's
/// `setrlimit` is denied; a chroot runs the same files as the same user.)
#[tokio::test]
async fn the_image_is_built_pushed_inspected_and_runs_the_roles() -> anyhow::Result<()> {
    if embedded_only("the_image_is_built_pushed_inspected_and_runs_the_roles") {
        return Ok(());
    }
    let registry = banlieue_test_backends::registry::Registry::start().await?;
    let root = repo_root();
    let out = tokio::process::Command::new(root.join("scripts/image.sh"))
        .env("PROFILE", "debug")
        .env("PUSH", &registry.host)
        .current_dir(&root)
        .output()
        .await?;
    assert!(out.status.success(), "scripts/image.sh: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let revision = String::from_utf8(std::process::Command::new("git").args(["rev-parse", "HEAD"]).current_dir(&root).output()?.stdout)?.trim().to_string();
    let version = env!("CARGO_PKG_VERSION");

    // Both tags name the same manifest; one layer; the config says who runs what.
    let (manifest, digest) = registry.manifest("banlieue", version).await?;
    let (_, by_commit) = registry.manifest("banlieue", &revision).await?;
    assert_eq!(digest, by_commit, "the :{version} and :{revision} tags are one image");
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    assert_eq!(layers.len(), 1, "{manifest:#}");
    let config: Value = serde_json::from_slice(&registry.blob("banlieue", manifest["config"]["digest"].as_str().unwrap_or_default()).await?)?;
    let c = &config["config"];
    assert_eq!(c["User"], "65532:65532");
    assert_eq!(c["Entrypoint"], json!(["/usr/bin/banlieue"]));
    assert_eq!(c["Cmd"], json!(["run"]));
    assert!(c["Env"].as_array().is_some_and(|e| e.contains(&json!("BANLIEUE_BUILTIN_DIR=/usr/lib/banlieue/components"))), "{c:#}");
    assert_eq!(c["Labels"]["org.opencontainers.image.version"], version);
    assert_eq!(c["Labels"]["org.opencontainers.image.revision"], revision.as_str());
    assert!(c["Labels"]["org.opencontainers.image.source"].as_str().is_some_and(|s| s.starts_with("https://")));

    // The layer, unpacked: the binary, its libraries and the components; no shell.
    let rootfs = registry.dir().join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    let layer = registry.dir().join("layer.tar.gz");
    std::fs::write(&layer, registry.blob("banlieue", layers[0]["digest"].as_str().unwrap_or_default()).await?)?;
    let untar = std::process::Command::new("tar").arg("-xzf").arg(&layer).arg("-C").arg(&rootfs).status()?;
    assert!(untar.success());
    assert!(!rootfs.join("bin/sh").exists() && !rootfs.join("usr/bin/sh").exists(), "no shell in the image");
    assert!(rootfs.join("usr/lib/banlieue/components/provider-libvirt.wasm").exists());
    let as_image_user = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new("/usr/sbin/chroot");
        cmd.arg("--userspec=65532:65532").arg(&rootfs).arg("/usr/bin/banlieue").args(args).env_clear();
        for kv in c["Env"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
        cmd
    };
    let out = as_image_user(&["--version"]).output().await?;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("banlieue {version}"), "{}", String::from_utf8_lossy(&out.stderr));

    // `banlieue run` from the image against the embedded server: the operator loads the
    // built-in libvirt driver from the image's component directory.
    let env = TestEnv::start("image").await?;
    env.install_crds().await?;
    env.create_namespace("banlieue-system").await?;
    std::fs::copy(&env.kubeconfig, rootfs.join("tmp/kubeconfig"))?;
    std::os::unix::fs::chown(rootfs.join("tmp/kubeconfig"), Some(65532), Some(65532))?;
    let metrics = banlieue_test_backends::free_port();
    let mut run = as_image_user(&["run", &format!("--metrics-addr=127.0.0.1:{metrics}")]);
    run.env("KUBECONFIG", "/tmp/kubeconfig").env("BANLIEUE_CACHE_DIR", "/var/cache/banlieue").kill_on_drop(true);
    let mut process = run.stderr(std::process::Stdio::piped()).spawn()?;
    // Unlabelled, as a user writes it: `banlieue run` here is the default installation.
    apply(
        &env.client,
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": "libvirt"},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}}),
    )
    .await?;
    let classes: Api<banlieue_api::ProviderClass> = Api::all(env.client.clone());
    let ready = |c: Option<&banlieue_api::ProviderClass>| {
        c.and_then(|c| c.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let loaded = tokio::select! {
        r = wait_for(&classes, "libvirt", 60, "Ready", ready) => r.map(|_| ()),
        exited = process.wait() => Err(anyhow::anyhow!("banlieue run exited: {exited:?}")),
    };
    // Ready once every role has checked its permissions (polled, as a kubelet does).
    let readyz = banlieue_tests::within(30, async {
        loop {
            let answer = banlieue_test_backends::http_client().get(format!("http://127.0.0.1:{metrics}/readyz")).send().await;
            if let Ok(r) = answer {
                let status = r.status().as_u16();
                let body = r.text().await.unwrap_or_default();
                if status == 200 {
                    return (status, body);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    let _ = process.start_kill();
    let output = process.wait_with_output().await?;
    loaded.map_err(|e| anyhow::anyhow!("{e}\nbanlieue run from the image said:\n{}", String::from_utf8_lossy(&output.stderr)))?;
    assert_eq!(readyz.ok().map(|(s, _)| s), Some(200), "{}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

/// An overlay that forgets the image's tag fails the image check (`make image` runs it on
/// every install root) with the overlay and the field to set; a complete one passes.
#[tokio::test]
async fn an_overlay_without_an_image_tag_is_refused_with_what_to_set() -> anyhow::Result<()> {
    let root = repo_root();
    std::fs::create_dir_all(root.join("target"))?;
    let dir = tempfile::tempdir_in(root.join("target"))?;
    let overlay = dir.path().to_string_lossy().into_owned();
    let check = |kustomization: &str| {
        std::fs::write(dir.path().join("kustomization.yaml"), kustomization)?;
        let out = std::process::Command::new(root.join("scripts/check-images.sh")).arg(&overlay).current_dir(&root).output()?;
        anyhow::Ok((out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()))
    };
    let base = "resources:\n  - ../../deploy/base\n";
    let (ok, said) = check(&format!("{base}images:\n  - name: banlieue\n    newName: 127.0.0.1:5000/banlieue\n"))?;
    assert!(!ok && said.contains("127.0.0.1:5000/banlieue") && said.contains("images[].newTag") && said.contains(&overlay), "{said}");
    let (ok, said) = check(base)?;
    assert!(!ok && said.contains("image \"banlieue\""), "{said}");
    let (ok, said) = check(&format!("{base}images:\n  - name: banlieue\n    newName: 127.0.0.1:5000/banlieue\n    newTag: 0.1.0\n"))?;
    assert!(ok, "{said}");
    Ok(())
}

/// One request in an API server's audit log, as the least-privilege check reads it.
#[derive(Debug)]
struct Request {
    user: String,
    verb: String,
    group: String,
    resource: String,
    subresource: Option<String>,
    name: Option<String>,
    code: u16,
    /// Refused by authorization (RBAC), not by admission: kube-apiserver also answers 403 to
    /// a create in a namespace being deleted, which a role may meet on a shared cluster.
    forbidden: bool,
}

impl From<banlieue_apiserver::audit::AuditEntry> for Request {
    fn from(e: banlieue_apiserver::audit::AuditEntry) -> Request {
        let forbidden = e.code == 403;
        Request { user: e.user, verb: e.verb, group: e.group, resource: e.resource, subresource: e.subresource, name: e.name, code: e.code, forbidden }
    }
}

impl Request {
    /// A line of kube-apiserver's JSON audit log (`None`: not a request on a resource).
    fn from_kube_audit(line: &str) -> Option<Request> {
        let e: Value = serde_json::from_str(line).ok()?;
        let object = e.get("objectRef")?;
        let text = |v: &Value| v.as_str().map(str::to_string);
        Some(Request {
            user: text(&e["user"]["username"])?,
            verb: text(&e["verb"])?,
            group: text(&object["apiGroup"]).unwrap_or_default(),
            resource: text(&object["resource"])?,
            subresource: text(&object["subresource"]),
            name: text(&object["name"]),
            code: e["responseStatus"]["code"].as_u64().and_then(|c| u16::try_from(c).ok()).unwrap_or(0),
            forbidden: e["annotations"]["authorization.k8s.io/decision"] == "forbid",
        })
    }
}

/// From an audit log of a run of every role with `rbac`'s rules: no request of a role
/// was denied, every rule a role holds was used (least privilege; or is listed with the
/// test that uses it), and no role listed, watched or read a Secret nothing references.
fn least_privilege(log: &[Request], rbac: &std::path::Path) -> anyhow::Result<()> {
    let rendered: Vec<Value> = serde_yaml::Deserializer::from_str(&std::fs::read_to_string(&rbac)?)
        .map(|d| serde::Deserialize::deserialize(d))
        .collect::<Result<_, _>>()?;
    // Rules that this flow cannot exercise, and the test that does.
    let exercised_elsewhere: BTreeSet<(&str, &str, &str, &str)> = BTreeSet::from([
        // Registry pull secrets of OCI components (control_loop's signed-artifact tests).
        ("operator", "get", "", "secrets"),
        // Warnings about components that fail to load (control_loop's hostile and bad-class tests).
        ("operator", "create", "", "events"),
        // Renewing a Lease, a third of its duration after taking it (control_loop's lease test).
        // The sharded roles (the controller and provider as deploy/ runs them, with --shards)
        // read no leader Lease by name: the embedded variant of this test runs them unsharded.
        ("controller", "get", "coordination.k8s.io", "leases"),
        ("provider", "get", "coordination.k8s.io", "leases"),
        ("controller", "update", "coordination.k8s.io", "leases"),
        ("provider", "update", "coordination.k8s.io", "leases"),
        ("operator", "update", "coordination.k8s.io", "leases"),
        ("imagebuilder", "update", "coordination.k8s.io", "leases"),
        // Shard and member leases (providers' sharding test, which runs two replicas' roles as
        // these ServiceAccounts).
        ("controller", "list", "coordination.k8s.io", "leases"),
        ("controller", "delete", "coordination.k8s.io", "leases"),
        ("provider", "list", "coordination.k8s.io", "leases"),
        ("provider", "delete", "coordination.k8s.io", "leases"),
        // Cluster API objects, and a template's class and image (the CAPI suite, which runs
        // the roles as these ServiceAccounts too).
        ("controller", "get", "banlieue.io", "vmclasses"),
        ("controller", "get", "banlieue.io", "vmimages"),
        ("controller", "get", "cluster.x-k8s.io", "clusters"),
        ("controller", "list", "cluster.x-k8s.io", "clusters"),
        ("controller", "watch", "cluster.x-k8s.io", "clusters"),
        ("controller", "get", "cluster.x-k8s.io", "machines"),
        ("controller", "list", "cluster.x-k8s.io", "machines"),
        ("controller", "watch", "cluster.x-k8s.io", "machines"),
        ("provider", "get", "cluster.x-k8s.io", "clusters"),
        ("provider", "list", "cluster.x-k8s.io", "clusters"),
        ("provider", "watch", "cluster.x-k8s.io", "clusters"),
        // Addresses from IP pools: Cluster API IPAM claims and the addresses answering them
        // (control_loop's IP pool test, which runs the roles as these ServiceAccounts too).
        ("controller", "get", "ipam.cluster.x-k8s.io", "ipaddressclaims"),
        ("controller", "list", "ipam.cluster.x-k8s.io", "ipaddressclaims"),
        ("controller", "watch", "ipam.cluster.x-k8s.io", "ipaddressclaims"),
        ("controller", "create", "ipam.cluster.x-k8s.io", "ipaddressclaims"),
        ("controller", "delete", "ipam.cluster.x-k8s.io", "ipaddressclaims"),
        ("controller", "get", "ipam.cluster.x-k8s.io", "ipaddresses"),
        // VMImage builds: kairos-operator's OSArtifacts (the images suite's build test, which
        // installs their CRD and runs the roles as these ServiceAccounts too).
        ("imagebuilder", "list", "build.kairos.io", "osartifacts"),
        ("imagebuilder", "watch", "build.kairos.io", "osartifacts"),
        ("imagebuilder", "create", "build.kairos.io", "osartifacts"),
        ("imagebuilder", "patch", "build.kairos.io", "osartifacts"),
        ("imagebuilder", "delete", "build.kairos.io", "osartifacts"),
        // VMImages with url sources (the images suite, which runs the roles as these
        // ServiceAccounts too).
        ("imagebuilder", "patch", "banlieue.io", "vmimages/status"),
        ("imagebuilder", "patch", "banlieue.io", "vmimages"),
        ("imagebuilder", "get", "banlieue.io", "vmimages"),
        ("imagebuilder", "create", "", "events"),
        ("imagebuilder", "get", "banlieue.io", "providerclasses"),
        // Credentials of Providers that have them (vSphere, Proxmox VE), read for an import
        // exactly as the provider role reads them (`grants::backend`); the images suite's
        // libvirtd Provider has none.
        ("imagebuilder", "get", "", "secrets"),
        // The in-use finalizer of a Provider's credentials Secret (the namespaces suite, which
        // runs the roles as these ServiceAccounts too); this flow's Provider has no credentials.
        ("provider", "patch", "", "secrets"),
        // Consoles: the caller's token and permission asked of the cluster, the VM watched
        // while a session lasts (the consoles suite, which runs the roles as these
        // ServiceAccounts too and opens consoles on libvirtd's guest).
        ("provider", "create", "authentication.k8s.io", "tokenreviews"),
        ("provider", "create", "authorization.k8s.io", "subjectaccessreviews"),
        ("provider", "list", "banlieue.io", "virtualmachines"),
        ("provider", "watch", "banlieue.io", "virtualmachines"),
    ]);
    for role in Role::ALL {
        let user = role.user();
        let mine: Vec<_> = log.iter().filter(|e| e.user == user).collect();
        let denied: Vec<_> = mine.iter().filter(|e| e.forbidden).collect();
        assert!(denied.is_empty(), "{role:?} was denied: {denied:#?}");
        let used: BTreeSet<(String, String, String)> = mine
            .iter()
            .flat_map(|e| {
                let resource = match &e.subresource {
                    Some(s) => format!("{}/{s}", e.resource),
                    None => e.resource.clone(),
                };
                // kube-apiserver audits a server-side apply that creates the object as a
                // `patch` answered 201, having authorized `create` as well.
                let created = (e.verb == "patch" && e.code == 201).then(|| ("create".to_string(), e.group.clone(), resource.clone()));
                [Some((e.verb.clone(), e.group.clone(), resource)), created].into_iter().flatten()
            })
            .collect();
        let rules = rendered
            .iter()
            .filter(|o| (o["kind"] == "ClusterRole" || o["kind"] == "Role") && o["metadata"]["name"] == role.account().as_str())
            .flat_map(|o| granted(&o["rules"]))
            .collect::<BTreeSet<_>>();
        let unused: Vec<_> = rules
            .iter()
            .filter(|(verb, group, resource)| {
                !exercised_elsewhere.contains(&(role.name(), verb.as_str(), group.as_str(), resource.as_str()))
                    && !used.iter().any(|(v, g, r)| v == verb && g == group && (r == resource || resource == "*"))
            })
            .collect();
        assert!(unused.is_empty(), "{role:?} holds rules it never used: {unused:?}; used: {used:?}");
    }
    // The roles' reads (kube-apiserver's own informers watch Secrets too, as system:apiserver).
    let secret_reads: Vec<_> = log.iter().filter(|e| e.resource == "secrets" && Role::ALL.iter().any(|r| r.user() == e.user)).collect();
    assert!(secret_reads.iter().all(|e| e.verb == "get"), "secrets are only read by name: {secret_reads:#?}");
    assert!(!secret_reads.iter().any(|e| e.name.as_deref() == Some("bystander")), "{secret_reads:#?}");
    assert!(secret_reads.iter().any(|e| e.name.as_deref() == Some("web-user-data")), "the user-data Secret is read: {secret_reads:#?}");
    Ok(())
}
