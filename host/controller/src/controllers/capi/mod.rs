//! The Cluster API v1beta2 infrastructure contract for banlieue's `<Kind>Cluster` and
//! `<Kind>Machine` kinds (role `controller`; the machines are then realised by
//! [`crate::controllers::machine`] like any other). The contract documents this follows are
//! CAPI's "Contract rules for InfraCluster" and "Contract rules for InfraMachine"
//! (`docs/book/src/developer/providers/contracts/infra-cluster.md`, `infra-machine.md`).
//!
//! - [`contract`]: what both roles read of CAPI (its kinds, a machine's cluster, pause,
//!   the v1beta1 failure fields), the one module of this tree the provider role imports;
//! - [`cluster`]: failure domains aggregated from the selected Providers, the control
//!   plane endpoint, `initialization.provisioned`, `Ready` and `Paused`;
//! - [`machine`]: a `<Kind>Machine` CAPI made from a `<Kind>MachineTemplate` is bound:
//!   its owner `Machine`'s bootstrap data becomes the user-data, its class and image are
//!   resolved and it is placed in a failure domain of its cluster.
//!
//! banlieue ships no cluster-lifecycle logic of its own: CAPI core and a control-plane
//! provider (k0smotron) decide what exists; banlieue realises it.

pub mod cluster;
pub mod contract;
pub mod machine;

use std::sync::Arc;

use crate::Context;

/// Reconcile the `<Kind>Cluster`s and bind the CAPI-made `<Kind>Machine`s of every
/// infrastructure kind, until `stop`.
pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), crate::Error> {
    crate::framework::infra_kinds::per_kind(ctx.client.clone(), ctx.scope(), stop, |kind, stop| {
        let (clusters, machines) = (cluster::reconcile_kind(ctx.clone(), kind.clone(), stop.clone()), machine::reconcile_kind(ctx.clone(), kind, stop));
        async move {
            futures::future::join(clusters, machines).await;
        }
    })
    .await;
    Ok(())
}
