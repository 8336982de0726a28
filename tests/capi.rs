//! The Cluster API v1beta2 infrastructure contract, end to end on libvirt's test driver.
//! No CAPI controller runs here, so the tests play CAPI's part as its contract documents
//! describe it: CAPI's `Cluster` and `Machine` CRDs (their v1beta2 shapes, in
//! `tests/capi/crds.yaml`), a `Cluster` owning a `LibvirtCluster`, and per machine a
//! bootstrap Secret, a `Machine` and a `LibvirtMachine` cloned from a
//! `LibvirtMachineTemplate` with the labels, annotations and owner CAPI sets. What they
//! assert is what CAPI reads — and, on the backend, the libvirt domains themselves.
//! Against the embedded server (the roles then run as their ServiceAccounts, with only
//! `deploy/base/rbac.yaml`) or `BANLIEUE_TEST_KUBECONFIG`.

use std::collections::BTreeMap;

use banlieue_libvirt::Libvirt;
use banlieue_tests::control::{libvirt_fixtures, libvirt_test_node, network_config, repo_root, wait_for, ControlPlane};
use banlieue_tests::{await_deleted, TestEnv};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

const INFRA: &str = "infrastructure.banlieue.io";

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &format!("{}s", kind.to_ascii_lowercase()))
}

/// The objects of one test, and its control plane.
struct Capi {
    env: TestEnv,
    cp: ControlPlane,
    clusters: Api<DynamicObject>,
    machines: Api<DynamicObject>,
    infra_clusters: Api<DynamicObject>,
    infra_machines: Api<DynamicObject>,
}

impl Capi {
    /// banlieue's and CAPI's CRDs, RBAC, and the roles (as ServiceAccounts when embedded).
    async fn start(test: &str) -> anyhow::Result<Capi> {
        let env = TestEnv::start(test).await?;
        env.install_crds().await?;
        // CAPI's own CRDs on a cluster that has CAPI installed; else the contract's shapes.
        let crd_api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(env.client.clone());
        if crd_api.get_opt("machines.cluster.x-k8s.io").await?.is_none() {
            let crds = repo_root().join("tests/capi/crds.yaml");
            env.kubectl(&["apply", "--server-side", "--field-manager=capi-tests", "-f", &crds.to_string_lossy()]).await?;
        }
        for name in ["clusters.cluster.x-k8s.io", "machines.cluster.x-k8s.io"] {
            wait_for(&crd_api, name, 30, "established", kube::runtime::wait::conditions::is_crd_established()).await?;
        }
        let cp = ControlPlane::start_as_installed(&env).await?;
        let ns = env.ns.clone();
        let api = |r: ApiResource| Api::<DynamicObject>::namespaced_with(env.client.clone(), &ns, &r);
        Ok(Capi {
            clusters: api(resource("cluster.x-k8s.io", "v1beta2", "Cluster")),
            machines: api(resource("cluster.x-k8s.io", "v1beta2", "Machine")),
            infra_clusters: api(resource(INFRA, "v1alpha1", "LibvirtCluster")),
            infra_machines: api(resource(INFRA, "v1alpha1", "LibvirtMachine")),
            env,
            cp,
        })
    }

    fn ns(&self) -> &str {
        &self.env.ns
    }

    /// Providers `(name, node)` on test hosts of their own; returns each one's URI and
    /// the name of its failure domain once it is probed.
    async fn providers(&self, names: &[&str]) -> anyhow::Result<BTreeMap<String, (String, String)>> {
        let mut uris = Vec::new();
        for name in names {
            uris.push((name.to_string(), libvirt_test_node(self.env.dir(), &format!("node-{name}"), 8, 32, 200)?));
        }
        let pairs: Vec<(&str, &str)> = uris.iter().map(|(n, u)| (n.as_str(), u.as_str())).collect();
        libvirt_fixtures(&self.env, &pairs).await?;
        let providers: Api<banlieue_api::Provider> = Api::namespaced(self.env.client.clone(), self.ns());
        let mut out = BTreeMap::new();
        for (name, uri) in uris {
            let p = wait_for(&providers, &name, 60, "a failure domain", |p: Option<&banlieue_api::Provider>| {
                p.and_then(|p| p.status.as_ref()).is_some_and(|s| !s.failure_domains.is_empty() && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .await?;
            let fd = p.status.and_then(|s| s.failure_domains.into_iter().next()).map(|f| f.name).unwrap_or_default();
            out.insert(name, (uri, fd));
        }
        Ok(out)
    }

    /// A `Cluster` and its `LibvirtCluster` (with `spec`), owned and labelled as CAPI's
    /// Cluster controller does.
    async fn cluster(&self, name: &str, spec: Value) -> anyhow::Result<()> {
        self.cluster_with(name, spec, json!({}), json!({})).await
    }

    /// The same, with more `labels` and `annotations` on the LibvirtCluster.
    async fn cluster_with(&self, name: &str, spec: Value, labels: Value, annotations: Value) -> anyhow::Result<()> {
        // The LibvirtCluster belongs to the test's installation, as its user would label it.
        let mut all_labels = self.env.own(json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": name}}}))["metadata"]["labels"].clone();
        if let (Some(all), Some(more)) = (all_labels.as_object_mut(), labels.as_object()) {
            all.extend(more.clone());
        }
        let ns = self.ns();
        let cluster = self
            .clusters
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": name, "namespace": ns},
                "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "LibvirtCluster", "name": name}}}))?)
            .await?;
        self.infra_clusters
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "apiVersion": format!("{INFRA}/v1alpha1"), "kind": "LibvirtCluster",
                "metadata": {"name": name, "namespace": ns, "labels": all_labels, "annotations": annotations,
                             "ownerReferences": [owner(&cluster, "Cluster")]},
                "spec": spec}))?)
            .await?;
        Ok(())
    }

    /// One CAPI machine of `cluster`: the bootstrap Secret (unless `bootstrap` is None), the
    /// `Machine`, and the `LibvirtMachine` cloned from template `template`'s spec, which the
    /// Machine then owns.
    async fn machine(&self, cluster: &str, name: &str, template: &Value, control_plane: bool, failure_domain: Option<&str>, bootstrap: Option<&str>) -> anyhow::Result<()> {
        let ns = self.ns();
        if let Some(value) = bootstrap {
            bootstrap_secret(&self.env, name, json!({"value": b64(value), "format": b64("cloud-config")})).await?;
        }
        let mut labels = json!({"cluster.x-k8s.io/cluster-name": cluster});
        if let (Some(all), Some(from_template)) = (labels.as_object_mut(), template["spec"]["template"]["metadata"]["labels"].as_object()) {
            // CAPI's clone carries the template's `spec.template.metadata.labels`.
            all.extend(from_template.clone());
        }
        if control_plane {
            labels["cluster.x-k8s.io/control-plane"] = json!("");
        }
        let mut spec = json!({"clusterName": cluster, "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "K0sWorkerConfig", "name": name}},
                              "infrastructureRef": {"apiGroup": INFRA, "kind": "LibvirtMachine", "name": name}});
        if bootstrap.is_some() {
            spec["bootstrap"]["dataSecretName"] = json!(name);
        }
        if let Some(fd) = failure_domain {
            spec["failureDomain"] = json!(fd);
        }
        let machine = self
            .machines
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": spec}))?)
            .await?;
        // The clone, as CAPI's MachineSet makes it (`cloned-from` annotations), then owned by
        // the Machine, as CAPI's Machine controller sets it.
        let template_name = template["metadata"]["name"].as_str().unwrap_or_default();
        self.infra_machines
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "apiVersion": format!("{INFRA}/v1alpha1"), "kind": "LibvirtMachine",
                "metadata": {"name": name, "namespace": ns, "labels": labels,
                             "annotations": {"cluster.x-k8s.io/cloned-from-name": template_name,
                                             "cluster.x-k8s.io/cloned-from-groupkind": format!("LibvirtMachineTemplate.{INFRA}")}},
                "spec": template["spec"]["template"]["spec"]}))?)
            .await?;
        let patch = json!({"metadata": {"ownerReferences": [owner(&machine, "Machine")]}});
        self.infra_machines.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await?;
        Ok(())
    }

    /// Wait until the machine is provisioned and Ready, as CAPI reads it.
    async fn provisioned(&self, name: &str) -> anyhow::Result<DynamicObject> {
        wait_for(&self.infra_machines, name, 90, "provisioned and Ready", |m: Option<&DynamicObject>| {
            m.is_some_and(|m| {
                m.data.pointer("/status/initialization/provisioned") == Some(&json!(true))
                    && condition(m, "Ready").is_some_and(|c| c["status"] == "True")
                    && m.data.pointer("/spec/providerID").is_some_and(Value::is_string)
            })
        })
        .await
    }

    /// Wait until the machine's `Ready` condition has `reason`.
    async fn ready_reason(&self, name: &str, reason: &str) -> anyhow::Result<DynamicObject> {
        wait_for(&self.infra_machines, name, 60, &format!("Ready=False/{reason}"), |m: Option<&DynamicObject>| {
            m.and_then(|m| condition(m, "Ready")).is_some_and(|c| c["status"] == "False" && c["reason"] == reason)
        })
        .await
    }

    /// The libvirt domain of machine `name` on `uri`, if any.
    async fn domain(&self, uri: &str, name: &str) -> anyhow::Result<Option<String>> {
        let libvirt: Libvirt = self.cp.ctx.libvirt.get(uri).await?;
        let domain = format!("{}_{name}", self.ns());
        if !libvirt.domain_list().await?.iter().any(|d| d.name == domain) {
            return Ok(None);
        }
        Ok(Some(libvirt.domain_xml(&domain).await?))
    }
}

fn owner(obj: &DynamicObject, kind: &str) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind, "name": obj.name_any(), "uid": obj.uid(), "controller": true, "blockOwnerDeletion": true})
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

async fn bootstrap_secret(env: &TestEnv, name: &str, data: Value) -> anyhow::Result<()> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(env.client.clone(), &env.ns);
    let secret = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
                                               "type": "cluster.x-k8s.io/secret", "data": data}))?;
    secrets.create(&PostParams::default(), &secret).await?;
    Ok(())
}

fn condition<'a>(obj: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    obj.data.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == type_)
}

/// A LibvirtMachineTemplate whose machines belong to the test's installation (the labels of
/// `spec.template.metadata`, which CAPI copies onto each clone).
fn template(env: &TestEnv, name: &str, class: &str, image: &str) -> Value {
    let labels = env.own(json!({"metadata": {}}))["metadata"]["labels"].clone();
    let mut t = json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "LibvirtMachineTemplate", "metadata": {"name": name, "namespace": env.ns},
           "spec": {"template": {"spec": {"classRef": {"name": class}, "imageRef": {"name": image}}}}});
    if labels.is_object() {
        t["spec"]["template"]["metadata"] = json!({"labels": labels});
    }
    t
}

fn failure_domains(c: &DynamicObject) -> Vec<(String, bool)> {
    c.data
        .pointer("/status/failureDomains")
        .and_then(Value::as_array)
        .map(|l| l.iter().map(|d| (d["name"].as_str().unwrap_or_default().to_string(), d["controlPlane"] == json!(true))).collect())
        .unwrap_or_default()
}

/// The user-data the test driver's domain records (base64 in banlieue's metadata).
fn recorded_user_data(xml: &str) -> Option<String> {
    use base64::Engine;
    let tag = xml.find("<banlieue:user-data")?;
    let start = tag + xml[tag..].find('>')? + 1;
    let end = start + xml[start..].find('<')?;
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(&xml[start..end]).ok()?).ok()
}

#[tokio::test]
async fn a_workload_cluster_on_two_providers_as_capi_drives_it() -> anyhow::Result<()> {
    let t = Capi::start("capi-cluster").await?;
    let ns = t.ns().to_string();
    let providers = t.providers(&["lab-a", "lab-b"]).await?;
    let (uri_a, fd_a) = providers["lab-a"].clone();
    let (uri_b, fd_b) = providers["lab-b"].clone();
    let (domain_a, domain_b) = (format!("lab-a/{fd_a}"), format!("lab-b/{fd_b}"));

    // The cluster spans both Providers; only lab-a's domain takes control planes.
    t.cluster("demo", json!({"providerRefs": [{"name": "lab-a"}, {"name": "lab-b"}],
                             "controlPlaneSelector": {"matchLabels": {"banlieue.io/provider": "lab-a"}}})).await?;
    let c = wait_for(&t.infra_clusters, "demo", 60, "two failure domains, waiting for the endpoint", |c: Option<&DynamicObject>| {
        c.is_some_and(|c| failure_domains(c).len() == 2 && condition(c, "Ready").is_some_and(|r| r["reason"] == "WaitingForControlPlaneEndpoint"))
    })
    .await?;
    assert_eq!(failure_domains(&c), vec![(domain_a.clone(), true), (domain_b.clone(), false)]);
    assert_eq!(c.data.pointer("/status/initialization/provisioned"), Some(&json!(false)), "not provisioned without an endpoint");
    assert_eq!(condition(&c, "Paused").map(|p| p["status"].clone()), Some(json!("False")));
    let attributes = c.data.pointer("/status/failureDomains/0/attributes").cloned().unwrap_or_default();
    assert_eq!(attributes["banlieue.io/provider"], "lab-a");
    assert_eq!(attributes["banlieue.io/host"], fd_a.as_str(), "the domain's own labels are attributes: {attributes}");

    // The control-plane provider sets the endpoint; the infrastructure is then provisioned.
    let endpoint = json!({"spec": {"controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}}});
    t.infra_clusters.patch("demo", &PatchParams::default(), &Patch::Merge(endpoint)).await?;
    let c = wait_for(&t.infra_clusters, "demo", 60, "provisioned", |c: Option<&DynamicObject>| {
        c.is_some_and(|c| c.data.pointer("/status/initialization/provisioned") == Some(&json!(true)))
    })
    .await?;
    assert_eq!(c.data.pointer("/status/ready"), Some(&json!(true)), "v1beta1 readers see status.ready");
    assert_eq!(condition(&c, "Ready").map(|r| r["status"].clone()), Some(json!("True")));

    // ClusterClass validates templates with a server-side-apply dry run: it passes and creates nothing.
    let workers = template(&t.env, "workers", &format!("{ns}-small"), &format!("{ns}-debian"));
    let templates = Api::<DynamicObject>::namespaced_with(t.env.client.clone(), &ns, &resource(INFRA, "v1alpha1", "LibvirtMachineTemplate"));
    let dry = PatchParams::apply("capi-topology").dry_run();
    templates.patch("workers", &dry, &Patch::Apply(&workers)).await?;
    assert!(templates.get_opt("workers").await?.is_none(), "a dry run creates nothing");
    let cluster_templates = Api::<DynamicObject>::namespaced_with(t.env.client.clone(), &ns, &resource(INFRA, "v1alpha1", "LibvirtClusterTemplate"));
    let cluster_template = json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "LibvirtClusterTemplate", "metadata": {"name": "two-labs", "namespace": ns},
        "spec": {"template": {"spec": {"providerRefs": [{"name": "lab-a"}, {"name": "lab-b"}], "controlPlaneSelector": {"matchLabels": {"banlieue.io/provider": "lab-a"}}}}}});
    cluster_templates.patch("two-labs", &dry, &Patch::Apply(&cluster_template)).await?;
    assert!(cluster_templates.get_opt("two-labs").await?.is_none());
    t.env.apply(workers.clone()).await?;

    // A control-plane machine without a failure domain goes where control planes may.
    t.machine("demo", "cp-0", &workers, true, None, Some("#cloud-config\nhostname: cp-0\n")).await?;
    let cp0 = t.provisioned("cp-0").await?;
    assert_eq!(cp0.data.pointer("/spec/failureDomain"), Some(&json!(domain_a)));
    assert_eq!(cp0.data.pointer("/status/failureDomain"), Some(&json!(domain_a)), "status.failureDomain is what CAPI reads");
    assert_eq!(cp0.data.pointer("/status/ready"), Some(&json!(true)));
    assert!(cp0.data.pointer("/status/addresses").and_then(Value::as_array).is_some_and(|a| !a.is_empty()), "addresses: {:?}", cp0.data.get("status"));
    assert_eq!(cp0.annotations().get("cluster.x-k8s.io/cloned-from-name").map(String::as_str), Some("workers"), "the clone annotations are kept");
    let provider_id = cp0.data.pointer("/spec/providerID").and_then(Value::as_str).unwrap_or_default().to_string();
    assert!(provider_id.starts_with("libvirt://"), "{provider_id}");
    let xml = t.domain(&uri_a, "cp-0").await?.expect("cp-0's domain on lab-a");
    assert_eq!(recorded_user_data(&xml).as_deref(), Some("#cloud-config\nhostname: cp-0\n"), "the bootstrap data is the user-data");
    assert!(t.domain(&uri_b, "cp-0").await?.is_none());

    // A second control plane also goes to lab-a, where spread alone would put it on lab-b.
    t.machine("demo", "cp-1", &workers, true, None, Some("#cloud-config\nhostname: cp-1\n")).await?;
    let cp1 = t.provisioned("cp-1").await?;
    assert_eq!(cp1.data.pointer("/spec/failureDomain"), Some(&json!(domain_a)), "control planes only in domains marked for them");
    assert!(t.domain(&uri_a, "cp-1").await?.is_some());

    // Workers spread across the cluster's domains; one CAPI put in a domain stays there.
    t.machine("demo", "w-0", &workers, false, None, Some("#cloud-config\n")).await?;
    let w0 = t.provisioned("w-0").await?;
    assert_eq!(w0.data.pointer("/spec/failureDomain"), Some(&json!(domain_b)), "spread puts the first worker where no control plane is");
    assert!(t.domain(&uri_b, "w-0").await?.is_some());
    t.machine("demo", "w-1", &workers, false, Some(&domain_a), Some("#cloud-config\n")).await?;
    let w1 = t.provisioned("w-1").await?;
    assert_eq!(w1.data.pointer("/status/failureDomain"), Some(&json!(domain_a)));
    assert!(t.domain(&uri_a, "w-1").await?.is_some());

    // A Machine whose bootstrap provider has not written its data yet waits, with nothing made.
    t.machine("demo", "w-2", &workers, false, None, None).await?;
    let w2 = t.ready_reason("w-2", "WaitingForBootstrapData").await?;
    assert!(condition(&w2, "Ready").is_some_and(|c| c["message"].as_str().unwrap_or_default().contains("dataSecretName")), "{:?}", condition(&w2, "Ready"));
    assert!(w2.data.pointer("/spec/providerRef").is_none());
    bootstrap_secret(&t.env, "w-2", json!({"value": b64("#cloud-config\nhostname: w-2\n")})).await?;
    t.machines.patch("w-2", &PatchParams::default(), &Patch::Merge(json!({"spec": {"bootstrap": {"dataSecretName": "w-2"}}}))).await?;
    t.provisioned("w-2").await?;

    // Pausing the Cluster stops everything of it; unpausing resumes.
    t.clusters.patch("demo", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": true}}))).await?;
    let paused = |m: Option<&DynamicObject>| m.and_then(|m| condition(m, "Paused")).is_some_and(|c| c["status"] == "True");
    wait_for(&t.infra_machines, "w-1", 30, "Paused", paused).await?;
    wait_for(&t.infra_clusters, "demo", 30, "Paused", paused).await?;
    t.machine("demo", "w-3", &workers, false, None, Some("#cloud-config\n")).await?;
    let w3 = wait_for(&t.infra_machines, "w-3", 30, "Paused", paused).await?;
    assert!(w3.data.pointer("/spec/providerRef").is_none(), "a paused cluster's machine is not bound");
    assert!(t.domain(&uri_a, "w-3").await?.is_none() && t.domain(&uri_b, "w-3").await?.is_none());
    t.clusters.patch("demo", &PatchParams::default(), &Patch::Merge(json!({"spec": {"paused": false}}))).await?;
    t.provisioned("w-3").await?;
    wait_for(&t.infra_machines, "w-1", 30, "unpaused", |m: Option<&DynamicObject>| {
        m.and_then(|m| condition(m, "Paused")).is_some_and(|c| c["status"] == "False")
    })
    .await?;

    // CAPI deletes a Machine's infrastructure machine with it: the domain goes too.
    t.machines.delete("w-0", &DeleteParams::default()).await?;
    t.infra_machines.delete("w-0", &DeleteParams::default()).await?;
    await_deleted(&t.infra_machines, "w-0").await?;
    assert!(t.domain(&uri_b, "w-0").await?.is_none(), "the backend domain is removed");

    // The roles did everything with the RBAC of deploy/ (a denied request would be a Forbidden condition).
    assert_eq!(t.cp.permissions_complete(), Ok(()));
    Ok(())
}

#[tokio::test]
async fn failure_domains_follow_providers_and_managed_clusters_are_left_alone() -> anyhow::Result<()> {
    let t = Capi::start("capi-domains").await?;
    let providers = t.providers(&["one"]).await?;
    let fd_one = providers["one"].1.clone();
    // Another manager's cluster (the contract's label) is never touched.
    let endpoint = |host: &str| json!({"controlPlaneEndpoint": {"host": host, "port": 6443}});
    t.cluster_with("foreign", endpoint("192.0.2.1"), json!({"cluster.x-k8s.io/managed-by": "someone-else"}), json!({})).await?;
    // A cluster whose control plane k0smotron hosts: banlieue leaves status.ready to it.
    t.cluster_with("hosted", endpoint("192.0.2.2"), json!({}), json!({"cluster.x-k8s.io/managed-by": "k0smotron"})).await?;
    // Without providerRefs or a selector, a cluster takes every Provider of its namespace.
    t.cluster("all", endpoint("192.0.2.3")).await?;
    let names = |c: &DynamicObject| failure_domains(c).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    let one = format!("one/{fd_one}");
    wait_for(&t.infra_clusters, "all", 60, "one failure domain", |c: Option<&DynamicObject>| c.is_some_and(|c| names(c) == [one.clone()])).await?;

    let more = t.providers(&["two"]).await?;
    let two = format!("two/{}", more["two"].1);
    wait_for(&t.infra_clusters, "all", 60, "two failure domains", |c: Option<&DynamicObject>| c.is_some_and(|c| names(c) == [one.clone(), two.clone()])).await?;
    let hosted = wait_for(&t.infra_clusters, "hosted", 60, "two failure domains", |c: Option<&DynamicObject>| c.is_some_and(|c| names(c).len() == 2)).await?;
    assert_eq!(hosted.data.pointer("/status/initialization/provisioned"), Some(&json!(true)));
    assert!(hosted.data.pointer("/status/ready").is_none(), "status.ready is k0smotron's: {:?}", hosted.data.get("status"));

    let providers_api: Api<banlieue_api::Provider> = Api::namespaced(t.env.client.clone(), t.ns());
    providers_api.delete("one", &DeleteParams::default()).await?;
    let all = wait_for(&t.infra_clusters, "all", 60, "only two's domain", |c: Option<&DynamicObject>| c.is_some_and(|c| names(c) == [two.clone()])).await?;
    assert_eq!(all.data.pointer("/status/initialization/provisioned"), Some(&json!(true)), "provisioned stays true");

    // Every change above woke the namespace's clusters; the foreign one has no status of ours.
    let foreign = t.infra_clusters.get("foreign").await?;
    assert!(foreign.data.get("status").is_none_or(|s| s.get("failureDomains").is_none() && s.get("conditions").is_none()), "{:?}", foreign.data.get("status"));
    Ok(())
}

/// A template's NICs take addresses from an IP pool (Cluster API's IPAM contract, the test
/// playing the IPAM provider): each machine claims its own address (the claim owned by the
/// machine), stays unbound with nothing on the backend until the provider answers, then gets
/// the address in its `spec.vm.nics` and in the domain's network configuration; the claim
/// is released once the machine is gone (the garbage collector, through its owner).
#[tokio::test]
async fn machines_from_a_template_take_their_addresses_from_an_ip_pool() -> anyhow::Result<()> {
    use banlieue_tests::ipam;
    let t = Capi::start("capi-ipam").await?;
    ipam::install_crds(&t.env.client).await?;
    let ns = t.ns().to_string();
    let providers = t.providers(&["lab"]).await?;
    let (uri, _) = providers["lab"].clone();
    t.cluster("demo", json!({"controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}})).await?;
    wait_for(&t.infra_clusters, "demo", 60, "provisioned", |c: Option<&DynamicObject>| {
        c.is_some_and(|c| c.data.pointer("/status/initialization/provisioned") == Some(&json!(true)))
    })
    .await?;
    let mut pooled = template(&t.env, "pooled", &format!("{ns}-small"), &format!("{ns}-debian"));
    pooled["spec"]["template"]["spec"]["network"] =
        json!({"interfaces": [{"name": "eth0", "nameservers": ["10.9.0.2"], "addressesFromPools": [ipam::pool("nodes")]}]});
    let claims = ipam::claims(&t.env.client, &ns);
    for (i, name) in ["w-0", "w-1"].into_iter().enumerate() {
        t.machine("demo", name, &pooled, false, None, Some("#cloud-config\n")).await?;
        let m = t.ready_reason(name, "WaitingForIPAddress").await?;
        let claim = wait_for(&claims, &format!("{name}-eth0-0"), 30, "the machine's claim", |c: Option<&DynamicObject>| c.is_some()).await?;
        assert_eq!(claim.owner_references()[0].uid, m.uid().unwrap_or_default(), "the claim is the machine's");
        assert_eq!(claim.data["spec"]["poolRef"], ipam::pool("nodes"));
        assert!(t.domain(&uri, name).await?.is_none() && m.data.pointer("/spec/providerRef").is_none(), "nothing before the address");
        let address = format!("10.9.0.{}", 21 + i);
        ipam::answer(&t.env.client, &ns, &format!("{name}-eth0-0"), &format!("{name}-eth0-0"), &format!("nodes-{}", address.replace('.', "-")), &address, 24, "10.9.0.1").await?;
        let m = t.provisioned(name).await?;
        let nic = &m.data["spec"]["vm"]["nics"][0];
        assert_eq!((&nic["addresses"], &nic["gateway"], &nic["nameservers"]), (&json!([format!("{address}/24")]), &json!("10.9.0.1"), &json!(["10.9.0.2"])), "{nic}");
        let config = network_config(&t.domain(&uri, name).await?.expect("the domain"))?;
        assert_eq!(config["ethernets"]["eth0"]["addresses"], json!([format!("{address}/24")]), "{config}");
    }

    // CAPI deletes the Machine's infrastructure machine; its claim goes once it is gone.
    t.machines.delete("w-0", &DeleteParams::default()).await?;
    t.infra_machines.delete("w-0", &DeleteParams::default()).await?;
    await_deleted(&t.infra_machines, "w-0").await?;
    await_deleted(&claims, "w-0-eth0-0").await?;
    assert!(claims.get_opt("w-1-eth0-0").await?.is_some(), "the other machine keeps its address");
    Ok(())
}

#[tokio::test]
async fn bad_templates_and_bootstrap_data_say_what_is_wrong_and_create_nothing() -> anyhow::Result<()> {
    let t = Capi::start("capi-bad").await?;
    let ns = t.ns().to_string();
    let providers = t.providers(&["lab"]).await?;
    let (uri, fd) = providers["lab"].clone();
    t.cluster("demo", json!({"controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}})).await?;
    wait_for(&t.infra_clusters, "demo", 60, "provisioned", |c: Option<&DynamicObject>| {
        c.is_some_and(|c| c.data.pointer("/status/initialization/provisioned") == Some(&json!(true)))
    })
    .await?;

    let mut no_ref = template(&t.env, "no-ref", "x", &format!("{ns}-debian"));
    no_ref["spec"]["template"]["spec"].as_object_mut().map(|s| s.remove("classRef"));
    t.machine("demo", "m-ref", &no_ref, false, None, Some("#cloud-config\n")).await?;
    let m = t.ready_reason("m-ref", "InvalidSpec").await?;
    assert!(condition(&m, "Ready").is_some_and(|c| c["message"].as_str().unwrap_or_default().contains("classRef")));
    let failure = m.data.pointer("/status/deprecated/v1beta1").cloned().unwrap_or_default();
    assert_eq!(failure["failureReason"], "InvalidConfiguration", "v1beta1 readers see the terminal failure: {failure}");

    let no_class = template(&t.env, "no-class", "no-such-class", &format!("{ns}-debian"));
    t.machine("demo", "m-class", &no_class, false, None, Some("#cloud-config\n")).await?;
    let m = t.ready_reason("m-class", "ClassNotFound").await?;
    assert!(condition(&m, "Ready").is_some_and(|c| c["message"].as_str().unwrap_or_default().contains("no-such-class")));

    let no_image = template(&t.env, "no-image", &format!("{ns}-small"), "no-such-image");
    t.machine("demo", "m-image", &no_image, false, None, Some("#cloud-config\n")).await?;
    let m = t.ready_reason("m-image", "ImageNotFound").await?;
    assert!(condition(&m, "Ready").is_some_and(|c| c["message"].as_str().unwrap_or_default().contains("no-such-image")));

    let good = template(&t.env, "good", &format!("{ns}-small"), &format!("{ns}-debian"));
    t.machine("demo", "m-domain", &good, false, Some("elsewhere/rack-9"), Some("#cloud-config\n")).await?;
    let m = t.ready_reason("m-domain", "FailureDomainNotFound").await?;
    let message = condition(&m, "Ready").and_then(|c| c["message"].as_str()).unwrap_or_default().to_string();
    assert!(message.contains("elsewhere/rack-9") && message.contains(&format!("lab/{fd}")), "{message}");

    t.machine("demo", "m-value", &good, false, None, None).await?;
    bootstrap_secret(&t.env, "m-value", json!({"format": b64("cloud-config")})).await?;
    t.machines.patch("m-value", &PatchParams::default(), &Patch::Merge(json!({"spec": {"bootstrap": {"dataSecretName": "m-value"}}}))).await?;
    let m = t.ready_reason("m-value", "InvalidBootstrapData").await?;
    assert!(condition(&m, "Ready").is_some_and(|c| c["message"].as_str().unwrap_or_default().contains("\"value\"")));

    // A cluster whose selector cannot work: a condition, and the v1beta1 failure fields.
    t.cluster("broken", json!({"controlPlaneEndpoint": {"host": "192.0.2.11", "port": 6443},
                               "controlPlaneSelector": {"matchExpressions": [{"key": "tier", "operator": "Bogus"}]}})).await?;
    let broken = wait_for(&t.infra_clusters, "broken", 60, "Ready=False/InvalidSpec", |c: Option<&DynamicObject>| {
        c.and_then(|c| condition(c, "Ready")).is_some_and(|r| r["reason"] == "InvalidSpec")
    })
    .await?;
    assert!(condition(&broken, "Ready").is_some_and(|r| r["message"].as_str().unwrap_or_default().contains("controlPlaneSelector")));
    assert_eq!(broken.data.pointer("/status/deprecated/v1beta1/failureReason"), Some(&json!("InvalidConfiguration")));
    assert_ne!(broken.data.pointer("/status/initialization/provisioned"), Some(&json!(true)));

    // Nothing of any of them reached the backend, and none was bound.
    for name in ["m-ref", "m-class", "m-image", "m-domain", "m-value"] {
        assert!(t.domain(&uri, name).await?.is_none(), "{name} has a domain");
        assert!(t.infra_machines.get(name).await?.data.pointer("/spec/providerRef").is_none(), "{name} was bound");
    }
    // A good machine in the same cluster still comes up: the bad ones block nothing.
    t.machine("demo", "m-good", &good, false, None, Some("#cloud-config\n")).await?;
    t.provisioned("m-good").await?;
    assert!(t.domain(&uri, "m-good").await?.is_some());
    Ok(())
}

#[tokio::test]
async fn the_capi_example_is_accepted_by_the_contract_shapes() -> anyhow::Result<()> {
    let t = Capi::start("capi-example").await?;
    // Every object of examples/capi/ that CAPI core or banlieue serves, dry-run applied in
    // the test's namespace (k0smotron's kinds are not installed here).
    let mut checked = Vec::new();
    for file in ["cluster.yaml", "libvirtcluster.yaml", "libvirtmachinetemplate.yaml", "machinedeployment.yaml"] {
        let text = std::fs::read_to_string(repo_root().join("examples/capi").join(file))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut object: Value = serde::Deserialize::deserialize(doc)?;
            let api_version = object["apiVersion"].as_str().unwrap_or_default().to_string();
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let (group, version) = api_version.split_once('/').unwrap_or_default();
            if group != "cluster.x-k8s.io" && group != INFRA {
                continue;
            }
            object["metadata"]["namespace"] = json!(t.ns());
            let api = Api::<DynamicObject>::namespaced_with(t.env.client.clone(), t.ns(), &resource(group, version, &kind));
            let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
            api.patch(&name, &PatchParams::apply("capi-example").dry_run(), &Patch::Apply(&object))
                .await
                .map_err(|e| anyhow::anyhow!("examples/capi/{file}: {kind} {name}: {e}"))?;
            checked.push(kind);
        }
    }
    checked.sort();
    assert_eq!(checked, ["Cluster", "LibvirtCluster", "LibvirtMachineTemplate", "MachineDeployment"]);
    Ok(())
}
