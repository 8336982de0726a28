//! Addresses from IP pools (`spec.network.interfaces[].addressesFromPools`), through
//! Cluster API's IPAM contract (`ipam.cluster.x-k8s.io/v1beta1`): per NIC and pool, an
//! `IPAddressClaim` named `<owner>-<nic>-<index>` (owned by the VM or Machine, labelled with
//! it); the IPAM
//! provider answers with an `IPAddress` (`spec.address`, `prefix`, `gateway`) and names it
//! in the claim's `status.addressRef`. banlieue never allocates: any IPAM provider of the
//! contract (in-cluster pools, Infoblox, NetBox, …) serves the pools.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use banlieue_api::vm::{PoolRef, VmNetwork};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PartialObjectMeta, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::failure::{api_failure, Failure};
use crate::status::reasons::Reason;
use crate::Context;

pub const GROUP: &str = "ipam.cluster.x-k8s.io";
pub const VERSION: &str = "v1beta1";

pub fn claim_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, "IPAddressClaim"), "ipaddressclaims")
}

fn address_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, "IPAddress"), "ipaddresses")
}

/// A claim the VM's spec asks for: one per NIC and pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub name: String,
    pub nic: String,
    pub pool: PoolRef,
    /// The field that asks for it (for messages).
    pub field: String,
}

/// What a pool gave a NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    pub nic: String,
    /// With its prefix length: `10.0.0.5/24`.
    pub address: String,
    pub gateway: Option<String>,
}

/// The claims `owner`'s `spec.network` asks for, in order (`owner`: the VM or Machine name).
pub fn wanted(owner: &str, network: Option<&VmNetwork>) -> Vec<Wanted> {
    network
        .iter()
        .flat_map(|n| n.interfaces.iter().enumerate())
        .flat_map(|(i, iface)| {
            iface.addresses_from_pools.iter().enumerate().map(move |(j, pool)| Wanted {
                name: claim_name(owner, &iface.name, j),
                nic: iface.name.clone(),
                pool: pool.clone(),
                field: format!("spec.network.interfaces[{i}].addressesFromPools[{j}]"),
            })
        })
        .collect()
}

/// `<vm>-<nic>-<index>`, lower-cased into a name the API server takes.
fn claim_name(vm: &str, nic: &str, index: usize) -> String {
    let nic: String = nic.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    format!("{vm}-{nic}-{index}")
}

/// The watch on the claims a controller makes, started when it first makes one (before
/// that, the IPAM contract's CRDs need not exist).
#[derive(Default)]
pub struct ClaimWatch(tokio::sync::OnceCell<()>);

impl ClaimWatch {
    /// Start, once, the watch of the installation's claims labelled `label`, calling
    /// `wake(label value, namespace)` on every change (an IPAM provider answering) until it
    /// returns false. `IPAMNotInstalled` (retried) while the cluster does not serve the claims.
    pub async fn start<F>(&self, ctx: &Arc<Context>, ns: &str, label: &'static str, wake: F) -> Result<(), Failure>
    where
        F: Fn(&str, &str) -> bool + Send + Sync + 'static,
    {
        self.0
            .get_or_try_init(|| async {
                if !installed(&ctx.client, ns).await.map_err(|e| api_failure(&e))? {
                    let message = format!(
                        "spec.network names IP pools, but this cluster does not serve {GROUP}/{VERSION} IPAddressClaims: install Cluster API's IPAM CRDs and an IPAM provider for the pools"
                    );
                    return Err(Failure::transient(Reason::IPAMNotInstalled, message));
                }
                let api: Api<PartialObjectMeta<DynamicObject>> = match &ctx.options.namespace {
                    Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &claim_resource()),
                    None => Api::all_with(ctx.client.clone(), &claim_resource()),
                };
                let mut events = crate::framework::reconciler::changes(api, ctx.options.installation.watch(Some(label))).boxed();
                tokio::spawn(async move {
                    while let Some(claim) = events.next().await {
                        let Ok(claim) = claim else { continue };
                        if let (Some(owner), Some(ns)) = (claim.labels().get(label), claim.namespace())
                            && !wake(owner, &ns)
                        {
                            return;
                        }
                    }
                });
                Ok(())
            })
            .await
            .map(|_| ())
    }
}

/// The addresses `wanted`'s claims hold (made when missing, owned by `owner`, labelled
/// `labels`), or why some are not there yet (every reason, joined).
pub async fn claim(client: &kube::Client, ns: &str, owner: &OwnerReference, labels: &BTreeMap<String, String>, wanted: &[Wanted]) -> Result<Result<Vec<Allocated>, String>, kube::Error> {
    let labels: serde_json::Map<String, Value> = labels.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    let (mut allocated, mut waiting) = (Vec::new(), Vec::new());
    for w in wanted {
        match allocation(client, ns, owner, &labels, w).await? {
            Ok(a) => allocated.push(a),
            Err(why) => waiting.push(why),
        }
    }
    Ok(if waiting.is_empty() { Ok(allocated) } else { Err(waiting.join("; ")) })
}

/// Whether the IPAM contract's kinds are served (a LIST of at most one claim).
async fn installed(client: &kube::Client, ns: &str) -> Result<bool, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &claim_resource());
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The address `w`'s claim holds, or why there is none yet (`Err(message)`). Makes the
/// claim when it is missing, and deletes one that names another pool (the same NIC and
/// index asked for a new pool): its deletion brings the VM back to claim again.
async fn allocation(client: &kube::Client, ns: &str, owner: &OwnerReference, labels: &serde_json::Map<String, Value>, w: &Wanted) -> Result<Result<Allocated, String>, kube::Error> {
    let claims: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &claim_resource());
    let waiting = |why: String| Ok(Err(format!("{} (pool {}): {why}", w.field, w.pool)));
    let Some(claim) = claims.get_opt(&w.name).await? else {
        let body = json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": "IPAddressClaim",
            "metadata": {"name": w.name, "namespace": ns, "labels": labels, "ownerReferences": [owner]},
            "spec": {"poolRef": {"apiGroup": w.pool.api_group, "kind": w.pool.kind, "name": w.pool.name}},
        });
        let claim: DynamicObject = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
        match claims.create(&PostParams::default(), &claim).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
        // The words of every look until the provider answers: one event, not one per look.
        return waiting(format!("waiting for the pool's IPAM provider to allocate IPAddressClaim {:?}", w.name));
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return waiting(format!("IPAddressClaim {:?} is being deleted; another is made once it is gone", w.name));
    }
    let pool = &claim.data["spec"]["poolRef"];
    if pool["name"] != w.pool.name.as_str() || pool["kind"] != w.pool.kind.as_str() || pool["apiGroup"] != w.pool.api_group.as_str() {
        claims.delete(&w.name, &DeleteParams::default()).await.map(|_| ()).or_else(not_found)?;
        return waiting(format!("IPAddressClaim {:?} was for another pool: released, another is made once it is gone", w.name));
    }
    let status = &claim.data["status"];
    let Some(address_name) = status["addressRef"]["name"].as_str().filter(|n| !n.is_empty()) else {
        // The IPAM provider says why it cannot allocate (a missing or exhausted pool) on
        // the claim's `Ready` condition: its words are the user's best lead.
        let said = status["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Ready" && c["status"] == "False");
        return waiting(match said {
            Some(c) => format!(
                "the IPAM provider cannot allocate IPAddressClaim {:?}: {}: {}",
                w.name,
                c["reason"].as_str().unwrap_or("NotReady"),
                c["message"].as_str().unwrap_or("(no message)")
            ),
            None => format!("waiting for the pool's IPAM provider to allocate IPAddressClaim {:?}", w.name),
        });
    };
    let addresses: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &address_resource());
    let Some(address) = addresses.get_opt(address_name).await? else {
        return waiting(format!("IPAddressClaim {:?} names IPAddress {address_name:?}, which does not exist (yet)", w.name));
    };
    match read_address(&address, &w.name) {
        Ok((address, gateway)) => Ok(Ok(Allocated { nic: w.nic.clone(), address, gateway })),
        Err(why) => waiting(why),
    }
}

/// The CIDR and gateway of an `IPAddress`, checked to be `claim`'s.
fn read_address(address: &DynamicObject, claim: &str) -> Result<(String, Option<String>), String> {
    let name = address.name_any();
    let spec = &address.data["spec"];
    if spec["claimRef"]["name"] != claim {
        return Err(format!("IPAddress {name:?} belongs to claim {}, not {claim:?}: the IPAM provider answered with another claim's address", spec["claimRef"]["name"]));
    }
    let ip: IpAddr = spec["address"].as_str().and_then(|a| a.parse().ok()).ok_or_else(|| format!("IPAddress {name:?}: spec.address {} is not an IP address", spec["address"]))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = spec["prefix"].as_u64().filter(|p| *p <= max).ok_or_else(|| format!("IPAddress {name:?}: spec.prefix {} is not a prefix length of {ip}", spec["prefix"]))?;
    let gateway = match spec["gateway"].as_str().filter(|g| !g.is_empty()) {
        Some(g) => Some(g.parse::<IpAddr>().map_err(|_| format!("IPAddress {name:?}: spec.gateway {g:?} is not an IP address"))?.to_string()),
        None => None,
    };
    Ok((format!("{ip}/{prefix}"), gateway))
}

/// Delete claim `name` (gone already is fine): its IPAM provider frees the address.
pub async fn release(client: &kube::Client, ns: &str, name: &str) -> Result<(), kube::Error> {
    let claims: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &claim_resource());
    claims.delete(name, &DeleteParams::default()).await.map(|_| ()).or_else(not_found)
}

fn not_found(e: kube::Error) -> Result<(), kube::Error> {
    match e {
        kube::Error::Api(e) if e.code == 404 => Ok(()),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::common::StaticIp;
    use banlieue_api::vm::InterfaceAddressing;

    fn pool(name: &str) -> PoolRef {
        PoolRef { api_group: GROUP.into(), kind: "InClusterIPPool".into(), name: name.into() }
    }

    #[test]
    fn one_claim_per_nic_and_pool_named_after_both() {
        let iface = |name: &str, pools: Vec<PoolRef>| InterfaceAddressing { name: name.into(), ip: StaticIp::default(), addresses_from_pools: pools };
        let network = VmNetwork { interfaces: vec![iface("eth0", vec![pool("v4"), pool("v6")]), iface("Net_1", vec![pool("lan")])] };
        let names: Vec<(String, String)> = wanted("db", Some(&network)).into_iter().map(|w| (w.name, w.field)).collect();
        assert_eq!(
            names,
            [
                ("db-eth0-0".to_string(), "spec.network.interfaces[0].addressesFromPools[0]".to_string()),
                ("db-eth0-1".into(), "spec.network.interfaces[0].addressesFromPools[1]".into()),
                ("db-net-1-0".into(), "spec.network.interfaces[1].addressesFromPools[0]".into()),
            ]
        );
    }

    fn address(spec: Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta1", "kind": "IPAddress", "metadata": {"name": "a"}, "spec": spec})).unwrap()
    }

    #[test]
    fn an_address_is_read_only_when_it_is_the_claims_and_well_formed() {
        let good = address(json!({"claimRef": {"name": "db-eth0-0"}, "address": "10.9.0.7", "prefix": 24, "gateway": "10.9.0.1"}));
        assert_eq!(read_address(&good, "db-eth0-0"), Ok(("10.9.0.7/24".into(), Some("10.9.0.1".into()))));
        assert!(read_address(&good, "web-eth0-0").unwrap_err().contains("belongs to claim \"db-eth0-0\""));
        let no_gateway = address(json!({"claimRef": {"name": "c"}, "address": "2001:db8::7", "prefix": 64}));
        assert_eq!(read_address(&no_gateway, "c"), Ok(("2001:db8::7/64".into(), None)));
        let wide = address(json!({"claimRef": {"name": "c"}, "address": "10.9.0.7", "prefix": 33}));
        assert!(read_address(&wide, "c").unwrap_err().contains("spec.prefix 33"));
        let junk = address(json!({"claimRef": {"name": "c"}, "address": "ten", "prefix": 8}));
        assert!(read_address(&junk, "c").unwrap_err().contains("spec.address \"ten\""));
    }
}
