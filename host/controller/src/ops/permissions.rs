//! What each role may do on the API server. `deploy/base/rbac.yaml` is generated from
//! these rules (`banlieue rbacgen`), each role checks them at start-up with
//! SelfSubjectAccessReviews ([`missing`]), and the install suite runs the roles
//! with nothing more and checks every rule is used — so this list is the one place
//! a new API call must be declared.

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use crate::SYSTEM_NAMESPACE;

/// One of the control plane's roles (a Deployment and a ServiceAccount each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Controller,
    Provider,
    Operator,
    ImageBuilder,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Controller, Role::Provider, Role::Operator, Role::ImageBuilder];

    pub fn name(self) -> &'static str {
        match self {
            Role::Controller => "controller",
            Role::Provider => "provider",
            Role::Operator => "operator",
            Role::ImageBuilder => "imagebuilder",
        }
    }

    /// The role's ServiceAccount, its ClusterRole, Role and bindings share this name.
    pub fn account(self) -> String {
        format!("banlieue-{}", self.name())
    }

    /// The name of the Lease the role's replicas elect a leader with.
    pub fn lease(self) -> String {
        self.account()
    }

    /// The user the API server sees for the role's ServiceAccount.
    pub fn user(self) -> String {
        format!("system:serviceaccount:{SYSTEM_NAMESPACE}:{}", self.account())
    }
}

/// An RBAC rule: `verbs` on `resources` of API group `group` (`""` is core), limited to
/// objects named `names` when not empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub names: Vec<String>,
}

const fn rule(group: &'static str, resources: &'static [&'static str], verbs: &'static [&'static str]) -> Rule {
    Rule { group, resources, verbs, names: Vec::new() }
}

const READ: &[&str] = &["get", "list", "watch"];
const WATCH: &[&str] = &["list", "watch"];
const BANLIEUE: &str = "banlieue.io";
/// Every resource of this group is an infrastructure `<Kind>Machine`, and the kinds come
/// from ProviderClasses at run time, so rules name the group's resources with `*`.
const INFRASTRUCTURE: &str = "infrastructure.banlieue.io";
/// Cluster API core (read only; banlieue is an infrastructure provider).
const CAPI: &str = "cluster.x-k8s.io";
/// Cluster API's IPAM contract: banlieue claims addresses, an IPAM provider allocates.
const IPAM: &str = "ipam.cluster.x-k8s.io";

/// The rules a role needs cluster-wide (VMs and Providers live in any namespace).
pub fn cluster_rules(role: Role) -> Vec<Rule> {
    let mut rules = match role {
        Role::Controller => vec![
            // Pools create (apply) and delete their members.
            rule(BANLIEUE, &["virtualmachines"], &["list", "watch", "create", "patch", "delete"]),
            rule(BANLIEUE, &["virtualmachines/status", "virtualmachinepools/status"], &["patch"]),
            rule(BANLIEUE, &["virtualmachinepools"], WATCH),
            // Read from caches; a class's PlacementPolicy is fetched when a VM is placed, a
            // template's class and image when a machine CAPI made is bound.
            rule(BANLIEUE, &["providers", "providerclasses"], WATCH),
            // A pool that adopts reads its Provider's discovery, and asks for one (annotation).
            rule(BANLIEUE, &["providers"], &["get", "patch"]),
            rule(BANLIEUE, &["vmclasses", "vmimages", "placementpolicies"], READ),
            // CAPI's Clusters (pausing, failure domains) and Machines (bootstrap data).
            rule(CAPI, &["clusters", "machines"], READ),
            // Machines are created by server-side apply, which RBAC authorizes as `create` too.
            rule(INFRASTRUCTURE, &["*"], &["get", "list", "watch", "create", "patch", "delete"]),
            // A VM's addresses from IP pools: its claims (Cluster API's IPAM contract), and
            // the addresses the IPAM provider answers with.
            rule(IPAM, &["ipaddressclaims"], &["get", "list", "watch", "create", "delete"]),
            rule(IPAM, &["ipaddresses"], &["get"]),
            // A VM's `spec.revertTo` names a snapshot; a snapshot's change wakes its VM.
            rule(BANLIEUE, &["vmsnapshots"], READ),
            // Schedules make their runs' snapshots and delete those retention drops.
            rule(BANLIEUE, &["vmsnapshots"], &["create", "delete"]),
            rule(BANLIEUE, &["vmsnapshotschedules"], WATCH),
            rule(BANLIEUE, &["vmsnapshotschedules/status"], &["patch"]),
        ],
        Role::Provider => vec![
            // Read from caches (the machine path looks its Provider up there).
            rule(BANLIEUE, &["providers"], WATCH),
            rule(BANLIEUE, &["providers/status"], &["patch"]),
            // In-use protection: each Provider's finalizer, and the record of the Secret it
            // protects (`in_use`); and, below, the finalizer on that Secret.
            rule(BANLIEUE, &["providers"], &["patch"]),
            rule(BANLIEUE, &["providerclasses"], READ),
            rule(INFRASTRUCTURE, &["*"], &["list", "watch", "patch"]),
            // A CAPI Cluster's `spec.paused` pauses its machines.
            rule(CAPI, &["clusters"], READ),
            // Snapshots: each one's finalizer and owner (its VM), its status; the VM, its
            // Machine and its Provider read once per snapshot taken or deleted.
            rule(BANLIEUE, &["vmsnapshots"], &["list", "watch", "patch"]),
            rule(BANLIEUE, &["vmsnapshots/status"], &["patch"]),
            rule(BANLIEUE, &["virtualmachines", "providers"], &["get"]),
            rule(INFRASTRUCTURE, &["*"], &["get"]),
            // Consoles: who the caller is and whether they may open one, asked of the cluster
            // (never decided here); the VM watched while a session lasts (deleted or moved: closed).
            rule("authentication.k8s.io", &["tokenreviews"], &["create"]),
            rule("authorization.k8s.io", &["subjectaccessreviews"], &["create"]),
            rule(BANLIEUE, &["virtualmachines"], WATCH),
            // The cluster's id in the owner marks of adopted VMs: the kube-system Namespace's UID.
            Rule { names: vec!["kube-system".into()], ..rule("", &["namespaces"], &["get"]) },
        ],
        Role::Operator => vec![
            rule(BANLIEUE, &["providerclasses", "placementpolicies"], WATCH),
            rule(BANLIEUE, &["providerclasses/status", "placementpolicies/status"], &["patch"]),
            // Installs (server-side apply) the `<Kind>Machine` CRDs of each ProviderClass.
            rule("apiextensions.k8s.io", &["customresourcedefinitions"], &["create", "patch"]),
        ],
        Role::ImageBuilder => vec![
            // VMImages read fresh before an import (the watch cache may lag its own writes).
            rule(BANLIEUE, &["vmimages"], READ),
            rule(BANLIEUE, &["providers"], WATCH),
            // Its finalizer, and its status.
            rule(BANLIEUE, &["vmimages", "vmimages/status"], &["patch"]),
            // Whether VMs still use an image being deleted.
            rule(BANLIEUE, &["virtualmachines"], WATCH),
            // A Provider's class and driver, to import into it.
            rule(BANLIEUE, &["providerclasses"], &["get"]),
        ],
    };
    // Secrets are read one by one, by name, when a banlieue object references them:
    // user-data, Provider credentials, registry pull secrets. Never listed or watched.
    rules.push(rule("", &["secrets"], &["get"]));
    if role == Role::Provider {
        // A Provider's credentials Secret carries its in-use finalizer, added and removed by
        // name (a patch of `metadata.finalizers` only, never of the data).
        rules.push(rule("", &["secrets"], &["patch"]));
    }
    rules.push(rule("", &["events"], &["create"]));
    rules
}

/// The rules a role needs in banlieue's own namespace: its Lease, and only its Lease
/// (`create` cannot be limited by name in RBAC).
pub fn namespace_rules(role: Role) -> Vec<Rule> {
    let mut rules = vec![
        rule("coordination.k8s.io", &["leases"], &["create"]),
        Rule { names: vec![role.lease()], ..rule("coordination.k8s.io", &["leases"], &["get", "update"]) },
    ];
    if matches!(role, Role::Controller | Role::Provider) {
        // Sharded (`--shards`): the shard and member leases, whose names are not fixed.
        rules.push(rule("coordination.k8s.io", &["leases"], &["list", "update", "delete"]));
    }
    if role == Role::ImageBuilder {
        // VMImage builds: kairos-operator OSArtifacts, made in banlieue's namespace only.
        rules.push(rule("build.kairos.io", &["osartifacts"], &["list", "watch", "create", "patch", "delete"]));
    }
    rules
}

/// A permission the API server denied the role, as `verb group/resource` (for logs and `/readyz`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing(pub String);

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Ask the API server, one SelfSubjectAccessReview per verb and resource, which of the
/// role's rules this process lacks. An error means the review itself could not be made.
pub async fn missing(client: &kube::Client, role: Role) -> Result<Vec<Missing>, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let scoped = cluster_rules(role).into_iter().map(|r| (None, r)).chain(namespace_rules(role).into_iter().map(|r| (Some(SYSTEM_NAMESPACE), r)));
    let mut denied = Vec::new();
    for (namespace, rule) in scoped {
        for resource in rule.resources {
            let (resource, subresource) = match resource.split_once('/') {
                Some((r, s)) => (r, Some(s.to_string())),
                None => (*resource, None),
            };
            for verb in rule.verbs {
                let review = SelfSubjectAccessReview {
                    spec: SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(ResourceAttributes {
                            group: Some(rule.group.into()),
                            resource: Some(resource.into()),
                            subresource: subresource.clone(),
                            verb: Some((*verb).into()),
                            namespace: namespace.map(String::from),
                            name: rule.names.first().cloned(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let answer = api.create(&PostParams::default(), &review).await?;
                if !answer.status.is_some_and(|s| s.allowed) {
                    let group = if rule.group.is_empty() { String::new() } else { format!(".{}", rule.group) };
                    let sub = subresource.as_deref().map(|s| format!("/{s}")).unwrap_or_default();
                    let place = namespace.map(|ns| format!(" in namespace {ns}")).unwrap_or_default();
                    denied.push(Missing(format!("{verb} {resource}{group}{sub}{place}")));
                }
            }
        }
    }
    Ok(denied)
}
