//! Starting the roles a process runs, each behind its own Lease (or, sharded, on the
//! shards this replica holds), and holding `/readyz` until each has its permissions.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::{capi, machine, operator, pool, provider, snapshotschedule, virtualmachine, vmimage, vmsnapshot};
use crate::framework::leader;
use crate::ops::metrics;
use crate::ops::permissions::{self, Role};
use crate::{Context, SYSTEM_NAMESPACE};

/// Which roles this process runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Roles {
    pub controller: bool,
    pub provider: bool,
    pub operator: bool,
    pub imagebuilder: bool,
}

impl Roles {
    pub const ALL: Roles = Roles { controller: true, provider: true, operator: true, imagebuilder: true };

    /// The roles switched on, in start order.
    pub fn enabled(self) -> Vec<Role> {
        [(Role::Operator, self.operator), (Role::ImageBuilder, self.imagebuilder), (Role::Provider, self.provider), (Role::Controller, self.controller)]
            .into_iter()
            .filter_map(|(role, on)| on.then_some(role))
            .collect()
    }
}

/// How often a role whose permissions are incomplete asks again (RBAC fixed later
/// makes it ready without a restart).
const PERMISSION_RECHECK: Duration = Duration::from_secs(30);

/// Run the roles until `shutdown` resolves (or leadership is lost, which is an error:
/// the process should exit and be restarted).
pub async fn run(ctx: Arc<Context>, roles: Roles, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    if let Some(addr) = ctx.options.metrics_addr {
        // Bound before anything runs: a port in use stops the process, said so.
        let listener = metrics::bind(addr).await?;
        let (metrics, readiness) = (ctx.metrics.clone(), ctx.readiness.clone());
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(listener, metrics, readiness).await {
                tracing::error!(error = %e, "metrics endpoint");
            }
        });
    }
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(handouts) = ctx.handouts.clone() {
        let stop = stopped();
        // In the role set: it ends with the process's roles.
        tasks.spawn(async move {
            tokio::select! {
                served = handouts.serve() => served.map_err(|e| anyhow::anyhow!("serving carried-disk downloads: {e}")),
                _ = stop => Ok(()),
            }
        });
    }
    if let (Some(consoles), true) = (ctx.consoles.clone(), roles.provider) {
        let stop = stopped();
        let ctx = ctx.clone();
        // The provider role's: it holds the drivers and grants a console is opened with.
        tasks.spawn(async move {
            tokio::select! {
                served = consoles.serve(ctx) => served.map_err(|e| anyhow::anyhow!("serving consoles: {e}")),
                _ = stop => Ok(()),
            }
        });
    }
    let sharded = |role: Role| ctx.shards.is_some() && matches!(role, Role::Controller | Role::Provider);
    if let (Some(shards), Some(sharding)) = (&ctx.shards, ctx.options.sharding) {
        // The replicas running the same sharded roles split the shards among themselves.
        let group = match (roles.controller, roles.provider) {
            (true, true) => Some("controller-provider"),
            (true, false) => Some("controller"),
            (false, true) => Some("provider"),
            (false, false) => None,
        };
        if let Some(group) = group {
            shards.split_in(group);
            // Another installation's replicas split their own shards, under other Lease names.
            let group = ctx.options.installation.lease(group);
            let (shards, client, identity) = (shards.clone(), ctx.client.clone(), ctx.options.identity.clone());
            let stop = stopped();
            // In the role set: a killed process's leases are no longer renewed.
            tasks.spawn(async move {
                shards.run(client, &group, identity, sharding.lease_duration, stop).await;
                Ok(())
            });
        }
    }
    for role in roles.enabled() {
        let sharded = sharded(role);
        ctx.readiness.checking(role);
        tokio::spawn(check_permissions(ctx.clone(), role, stopped()));
        let ctx = ctx.clone();
        let stopped = stopped.clone();
        ctx.metrics.role_active(role.name(), false);
        tasks.spawn(async move {
            let mut leadership = None;
            // A sharded role needs no leader: each replica acts only on the shards it holds.
            if ctx.options.leader_election && !sharded {
                leadership = Some(leader::acquire(ctx.client.clone(), SYSTEM_NAMESPACE, &ctx.options.installation.lease(&role.lease()), &ctx.options.identity).await);
            }
            ctx.metrics.role_active(role.name(), true);
            let lost = async {
                match &mut leadership {
                    Some(l) => l.lost().await,
                    None => std::future::pending().await,
                }
            };
            let work = async {
                match role {
                    Role::Operator => operator::run(ctx.clone(), stopped()).await,
                    Role::ImageBuilder => vmimage::run(ctx.clone(), stopped()).await,
                    Role::Provider => futures::future::try_join3(provider::run(ctx.clone(), stopped()), machine::run(ctx.clone(), stopped()), vmsnapshot::run(ctx.clone(), stopped())).await.map(drop),
                    Role::Controller => futures::future::try_join4(
                        virtualmachine::run(ctx.clone(), stopped()),
                        pool::run(ctx.clone(), stopped()),
                        capi::run(ctx.clone(), stopped()),
                        snapshotschedule::run(ctx.clone(), stopped()),
                    )
                    .await
                    .map(drop),
                }
            };
            let role = role.name();
            tokio::select! {
                r = work => r.map_err(|e| anyhow::anyhow!("role {role}: {e}")),
                _ = lost => Err(anyhow::anyhow!("role {role} lost its lease")),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// Ask the API server which of `role`'s permissions this process lacks, log each one,
/// and keep `/readyz` failing until none is missing. The role runs meanwhile: what it
/// may do still works, and each denied call is logged by the API client.
async fn check_permissions(ctx: Arc<Context>, role: Role, stopped: impl Future<Output = ()>) {
    let check = async {
        loop {
            match permissions::missing(&ctx.client, role).await {
                Ok(missing) if missing.is_empty() => {
                    ctx.readiness.checked(role, missing);
                    tracing::info!(role = role.name(), "every permission the role needs is granted");
                    return;
                }
                Ok(missing) => {
                    for m in &missing {
                        tracing::error!(role = role.name(), user = %role.user(), "missing permission: {m} (see deploy/base/rbac.yaml)");
                    }
                    ctx.readiness.checked(role, missing);
                }
                Err(e) => {
                    // Reviews need no permission on a real cluster; if they fail, the API
                    // server is unreachable or does not offer them: don't hold readiness on it.
                    tracing::warn!(role = role.name(), error = %e, "cannot review the role's permissions");
                    ctx.readiness.checked(role, Vec::new());
                    return;
                }
            }
            tokio::time::sleep(PERMISSION_RECHECK).await;
        }
    };
    tokio::select! {
        _ = check => {}
        _ = stopped => {}
    }
}

