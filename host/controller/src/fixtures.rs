//! Objects for the controller's unit tests, written as a user would write them.

use banlieue_api::{Provider, VirtualMachine};
use serde_json::{json, Value};

/// Provider `ns/name` of class `libvirt` on `test:///default`, labelled `site: <name>`, with
/// storage class `fast` and network class `lan`; `Ready` as `ready` says, with the failure
/// domains `domains` (`[{"name": …, "capacity": …}]`).
pub fn provider(ns: &str, name: &str, ready: bool, domains: Value) -> Provider {
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": name, "namespace": ns, "labels": {"site": name}, "generation": 1},
        "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": "test:///default"},
                 "capabilities": {"storageClasses": {"fast": "pool"}, "networkClasses": {"lan": "default"}}},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }, "reason": "Probed", "message": "",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                   "failureDomains": domains}
    }))
    .expect("provider")
}

/// VirtualMachine `ns/name` (class `small`, image `debian`), placed on Provider `placed_on`
/// (failure domain `d`, `Scheduled=True`) when given.
pub fn vm(ns: &str, name: &str, placed_on: Option<&str>) -> VirtualMachine {
    let mut v = json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")},
        "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}
    });
    if let Some(p) = placed_on {
        v["status"] = json!({
            "scheduled": {"provider": p, "failureDomain": "d", "providerClass": "libvirt"},
            "conditions": [{"type": "Scheduled", "status": "True", "reason": "Scheduled", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        });
    }
    serde_json::from_value(v).expect("vm")
}
