//! Faults of the Kubernetes API: the embedded server SIGKILLed and restarted (a process of
//! its own with `--data-dir`, `banlieue-test-apiserver`) during creates, deletes and a pool
//! scale, and watch-expiry storms (every open watch ended with `410 Gone`, the history
//! compacted) during a pool scale. The control plane runs in this process against libvirt's
//! test driver (whose state this process's connection holds); every end state is checked on
//! libvirt's own domain list.
//!
//! These suites restart and compact the server they talk to, which a test cannot do to a
//! shared cluster: they always run on the embedded server they start, also when
//! `BANLIEUE_TEST_KUBECONFIG` names a cluster.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use banlieue_api::{VirtualMachine, VirtualMachinePool};
use banlieue_libvirt::Libvirt;
use banlieue_tests::apiserver::ApiServerProcess;
use banlieue_tests::control::{apply, libvirt_fixtures, libvirt_test_node, ControlPlane};
use banlieue_tests::faults::{iterations, Rng, Tally};
use banlieue_tests::TestEnv;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

const SERVER: &str = env!("CARGO_BIN_EXE_banlieue-test-apiserver");
const HOST_A: &str = "test:///default";

/// Writes the server acknowledged before it was SIGKILLed are all there after the restart:
/// creates, then updates, then deletes, each killed right after the last acknowledgement.
#[tokio::test]
async fn acknowledged_writes_survive_a_sigkill_of_the_api_server() -> anyhow::Result<()> {
    let mut server = ApiServerProcess::start(SERVER).await?;
    let env = TestEnv::connect("api-kill-writes", &server.kubeconfig()).await?;
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let rounds = iterations(2, 10);
    let n = 200;
    let mut lost = 0;
    for round in 0..rounds {
        let names: Vec<String> = (0..n).map(|i| format!("r{round}-{i}")).collect();
        // Creates, 20 at a time; every one acknowledged; then SIGKILL at once.
        futures::stream::iter(names.iter())
            .map(|name| {
                let maps = maps.clone();
                let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "1"}})).expect("configmap");
                async move { maps.create(&PostParams::default(), &cm).await }
            })
            .buffer_unordered(20)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        server.sigkill();
        server.restart().await?;
        let found: BTreeSet<String> = maps.list(&ListParams::default()).await?.items.iter().map(|c| c.name_any()).collect();
        lost += names.iter().filter(|n| !found.contains(*n)).count();
        let names: Vec<String> = names.into_iter().filter(|n| found.contains(n)).collect();

        // Updates.
        futures::stream::iter(names.iter())
            .map(|name| {
                let maps = maps.clone();
                async move { maps.patch(name, &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await }
            })
            .buffer_unordered(20)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        server.sigkill();
        server.restart().await?;
        let items = maps.list(&ListParams::default()).await?.items;
        lost += items.iter().filter(|c| names.contains(&c.name_any()) && c.data.as_ref().and_then(|d| d.get("v")).map(String::as_str) != Some("2")).count();

        // Deletes.
        futures::stream::iter(names.iter())
            .map(|name| {
                let maps = maps.clone();
                async move { maps.delete(name, &Default::default()).await }
            })
            .buffer_unordered(20)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        server.sigkill();
        server.restart().await?;
        let left = maps.list(&ListParams::default()).await?.items;
        lost += left.iter().filter(|c| names.contains(&c.name_any())).count();
    }
    println!("RELIABILITY suite=api-sigkill-acknowledged-writes iterations={rounds} faults={} writes={} lost={lost}", rounds * 3, rounds * 3 * n);
    assert_eq!(lost, 0, "acknowledged writes lost across SIGKILL");
    Ok(())
}
