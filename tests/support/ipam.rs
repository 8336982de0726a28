//! An IPAM provider's part, played by tests: Cluster API's IPAM contract kinds
//! (`tests/capi/ipam-crds.yaml`, unless the cluster serves them already) and the two
//! answers the contract lets a provider give a claim — an `IPAddress` named in the claim's
//! `status.addressRef`, or a `Ready=False` condition saying why there is none.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use crate::control::{repo_root, wait_for};

pub const GROUP: &str = "ipam.cluster.x-k8s.io";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1beta1", kind), plural)
}

/// The IPAM contract's CRDs, installed (server-side apply) when the cluster lacks them, and established.
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let names = ["ipaddressclaims.ipam.cluster.x-k8s.io", "ipaddresses.ipam.cluster.x-k8s.io"];
    if crds.get_opt(names[0]).await?.is_none() {
        let text = std::fs::read_to_string(repo_root().join("tests/capi/ipam-crds.yaml"))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let crd: CustomResourceDefinition = serde::Deserialize::deserialize(doc)?;
            crds.patch(&crd.name_any(), &PatchParams::apply("ipam-tests").force(), &Patch::Apply(&crd)).await?;
        }
    }
    for name in names {
        wait_for(&crds, name, 30, "established", kube::runtime::wait::conditions::is_crd_established()).await?;
    }
    Ok(())
}

pub fn claims(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource("IPAddressClaim", "ipaddressclaims"))
}

pub fn addresses(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource("IPAddress", "ipaddresses"))
}

/// A pool reference as a VM names it.
pub fn pool(name: &str) -> serde_json::Value {
    json!({"apiGroup": GROUP, "kind": "InClusterIPPool", "name": name})
}

/// Answer claim `claim` with IPAddress `name` (made for `for_claim`: a provider that
/// mixes claims up passes another claim's name) holding `address/prefix` via `gateway`.
pub async fn answer(client: &kube::Client, ns: &str, claim: &str, for_claim: &str, name: &str, address: &str, prefix: u8, gateway: &str) -> anyhow::Result<()> {
    let c = claims(client, ns).get(claim).await?;
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1beta1"), "kind": "IPAddress",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"claimRef": {"name": for_claim}, "poolRef": c.data["spec"]["poolRef"], "address": address, "prefix": prefix, "gateway": gateway},
    }))?;
    match addresses(client, ns).create(&PostParams::default(), &body).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    claims(client, ns).patch_status(claim, &PatchParams::default(), &Patch::Merge(json!({"status": {"addressRef": {"name": name}}}))).await?;
    Ok(())
}

/// Say on claim `claim` why no address can be allocated.
pub async fn refuse(client: &kube::Client, ns: &str, claim: &str, reason: &str, message: &str) -> anyhow::Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = json!({"type": "Ready", "status": "False", "severity": "Error", "reason": reason, "message": message, "lastTransitionTime": now});
    claims(client, ns).patch_status(claim, &PatchParams::default(), &Patch::Merge(json!({"status": {"conditions": [condition]}}))).await?;
    Ok(())
}

/// A running [`serve`]; dropping it stops it.
pub struct Served(tokio::task::JoinHandle<()>);

impl Drop for Served {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An in-cluster IPAM provider in miniature, for benchmarks: every claim of namespace `ns`
/// gets the next free address of `first`'s /16 (gateway `.0.1`), until it is dropped.
pub fn serve(client: kube::Client, ns: String, first: Ipv4Addr) -> Served {
    Served(tokio::spawn(async move {
        let api = claims(&client, &ns);
        let mut answered = BTreeSet::new();
        let mut next = u32::from(first);
        let gateway = Ipv4Addr::from((u32::from(first) & 0xffff_0000) | 1).to_string();
        let mut events = kube::runtime::watcher(api, Default::default()).boxed();
        while let Some(event) = events.next().await {
            let Ok(kube::runtime::watcher::Event::Apply(claim) | kube::runtime::watcher::Event::InitApply(claim)) = event else { continue };
            let name = claim.name_any();
            if claim.metadata.deletion_timestamp.is_some() || !answered.insert(name.clone()) {
                continue;
            }
            let address = Ipv4Addr::from(next).to_string();
            next += 1;
            let object = format!("{name}-{}", address.replace('.', "-"));
            if let Err(e) = answer(&client, &ns, &name, &name, &object, &address, 16, &gateway).await {
                eprintln!("ipam: answering {name}: {e:#}");
                answered.remove(&name);
            }
        }
    }))
}
