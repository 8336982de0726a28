#!/usr/bin/env bash
# Leave a shared cluster as the test run found it (BANLIEUE_TEST_KUBECONFIG).
#
#   scripts/test-cluster.sh snapshot > before   what banlieue-related cluster-scoped objects exist
#   scripts/test-cluster.sh restore before      remove what the run added
#
# A test's control plane is gone when the run ends, so nothing would remove the
# finalizers of its VMs and Machines: their namespaces would stay Terminating. restore
# drops those finalizers in every test namespace (label banlieue.io/test=true), deletes
# the namespaces, then the cluster-scoped objects and CRDs that were not there before.
set -euo pipefail
export KUBECONFIG=${BANLIEUE_TEST_KUBECONFIG:?set BANLIEUE_TEST_KUBECONFIG}

cluster_objects() {
    {
        kubectl get crd -o name | grep -E '\.(infrastructure\.)?banlieue\.io$|\.cluster\.x-k8s\.io$' || true
        kubectl get vmclasses,vmimages,providerclasses,placementpolicies -o name 2>/dev/null || true
        kubectl get clusterroles,clusterrolebindings -o name | grep -E '/banlieue-' || true
        kubectl get namespace banlieue-system -o name 2>/dev/null || true
    } | sort
}

case "${1:-}" in
snapshot)
    cluster_objects
    ;;
restore)
    before=${2:?restore needs the snapshot file}
    for ns in $(kubectl get namespaces -l banlieue.io/test=true -o jsonpath='{.items[*].metadata.name}'); do
        for obj in $(kubectl get banlieue -n "$ns" -o name 2>/dev/null); do
            kubectl patch -n "$ns" "$obj" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
        done
        kubectl delete namespace "$ns" --wait=false --ignore-not-found >/dev/null
    done
    added=$(comm -13 "$before" <(cluster_objects))
    # Objects first (their finalizers dropped: no controller runs now), CRDs last.
    for obj in $(grep -v '^customresourcedefinition' <<<"$added" || true); do
        kubectl patch "$obj" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
        kubectl delete "$obj" --wait=false --ignore-not-found >/dev/null
    done
    for crd in $(grep '^customresourcedefinition' <<<"$added" || true); do
        kubectl delete "$crd" --timeout=60s --ignore-not-found >/dev/null
    done
    echo "test cluster restored: $(wc -w <<<"$added") cluster-scoped objects removed"
    ;;
*)
    echo "usage: $0 snapshot | restore FILE" >&2
    exit 2
    ;;
esac
