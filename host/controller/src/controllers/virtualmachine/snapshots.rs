//! What a VM's snapshots mean for the VM's own flow: they live on its backend machine, so
//! a move would lose them (refused unless `migrationPolicy: AutomaticDroppingSnapshots`, which
//! deletes them first), and the VM's deletion removes them from the backend before its machine.

use banlieue_api::snapshot::SnapshotPhase;
use banlieue_api::vm::MigrationPolicy;
use banlieue_api::VMSnapshot;
use kube::api::{Api, DeleteParams, ListParams};
use kube::ResourceExt;

use super::{Blocked, Reconcile};
use crate::failure::api_failure;
use crate::status::reasons::Reason;

impl Reconcile<'_> {
    /// The VM's snapshots that still hold something (not Failed), being deleted or not.
    async fn snapshots(&self) -> Result<Vec<VMSnapshot>, kube::Error> {
        let all = Api::<VMSnapshot>::namespaced(self.ctx.client.clone(), &self.ns).list(&ListParams::default()).await?;
        Ok(all
            .items
            .into_iter()
            .filter(|s| s.spec.vm_ref.name == self.name && s.status.as_ref().and_then(|st| st.phase) != Some(SnapshotPhase::Failed))
            .collect())
    }

    /// Before a move: `Ok(None)` when the VM may go (no snapshots, or they were dropped as
    /// the policy allows); else why it stays.
    pub(super) async fn snapshots_allow_move(&mut self) -> Result<Option<String>, Blocked> {
        let snapshots = self.snapshots().await.map_err(|e| Blocked::on(crate::status::conditions::READY, api_failure(&e)))?;
        if snapshots.is_empty() {
            return Ok(None);
        }
        let names: Vec<String> = snapshots.iter().map(|s| s.name_any()).collect();
        if self.vm.spec.migration_policy != MigrationPolicy::AutomaticDroppingSnapshots {
            return Ok(Some(format!(
                "it has {} snapshot(s) ({}) on the machine it would leave: delete them, or set migrationPolicy: AutomaticDroppingSnapshots",
                names.len(),
                names.join(", ")
            )));
        }
        self.delete_snapshots(&snapshots).await.map_err(|e| Blocked::on(crate::status::conditions::READY, api_failure(&e)))?;
        self.event(true, Reason::SnapshotsDropped, "Move", format!("deleted its snapshots {} before moving (migrationPolicy AutomaticDroppingSnapshots)", names.join(", "))).await;
        Ok(None)
    }

    /// Before the VM's machine is deleted: its snapshots are deleted (their reconciler removes
    /// them from the backend) — those kept past the VM (`retainOnVMDeletion`) keep only their
    /// record. Whether some are still going.
    pub(super) async fn snapshots_gone(&self) -> Result<bool, kube::Error> {
        let going: Vec<VMSnapshot> = self.snapshots().await?.into_iter().filter(|s| !s.spec.retain_on_vm_deletion).collect();
        self.delete_snapshots(&going).await?;
        Ok(going.is_empty())
    }

    async fn delete_snapshots(&self, snapshots: &[VMSnapshot]) -> Result<(), kube::Error> {
        let api = Api::<VMSnapshot>::namespaced(self.ctx.client.clone(), &self.ns);
        for s in snapshots.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
            match api.delete(&s.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
