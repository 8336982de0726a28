//! The committed CRDs are exactly what the types generate, and round-trip.

use std::path::PathBuf;

use banlieue_api::crdgen::{all_crds, rendered_files};
use banlieue_api::infra::{infrastructure_crds, CAPI_CONTRACT_LABEL};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
}

#[test]
fn committed_crds_match_the_types() {
    for (name, content) in rendered_files() {
        let on_disk = std::fs::read_to_string(crd_dir().join(&name)).unwrap_or_default();
        assert!(on_disk == content, "deploy/crds/{name} is stale: run `cargo run -p banlieue -- crdgen`");
    }
}

#[test]
fn crds_round_trip_through_yaml() {
    for crd in all_crds() {
        let yaml = banlieue_api::crdgen::to_yaml(&crd);
        let back: CustomResourceDefinition = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(back, crd);
    }
}

#[test]
fn third_party_classes_get_the_same_infrastructure_shapes() {
    let acme = infrastructure_crds("Acme").unwrap();
    let libvirt = infrastructure_crds("Libvirt").unwrap();
    let kinds: Vec<&str> = acme.iter().map(|c| c.spec.names.kind.as_str()).collect();
    assert_eq!(kinds, ["AcmeMachine", "AcmeMachineTemplate", "AcmeCluster", "AcmeClusterTemplate"]);
    for (a, l) in acme.iter().zip(&libvirt) {
        assert_eq!(a.spec.versions[0].schema, l.spec.versions[0].schema, "one shared schema");
        assert_eq!(a.metadata.labels.as_ref().unwrap()[CAPI_CONTRACT_LABEL], "v1alpha1");
        assert_eq!(a.spec.group, "infrastructure.banlieue.io");
    }
    assert_eq!(acme[0].metadata.name.as_deref(), Some("acmemachines.infrastructure.banlieue.io"));
    for bad in ["", "acme", "Ac-me", "Acme Corp", &"A".repeat(49)] {
        assert!(infrastructure_crds(bad).is_err(), "{bad:?} must be refused");
    }
}

#[test]
fn every_kind_has_status_short_name_and_category() {
    for crd in all_crds() {
        let v = &crd.spec.versions[0];
        assert!(v.subresources.as_ref().is_some_and(|s| s.status.is_some()) || crd.spec.names.kind.ends_with("Template"), "{}", crd.spec.names.kind);
        assert!(crd.spec.names.categories.as_ref().is_some_and(|c| c.contains(&"banlieue".to_string())));
        if crd.spec.group == "banlieue.io" {
            assert!(crd.spec.names.short_names.as_ref().is_some_and(|s| !s.is_empty()), "{}", crd.spec.names.kind);
        }
    }
    let pool = all_crds().into_iter().find(|c| c.spec.names.kind == "VirtualMachinePool").unwrap();
    let scale = pool.spec.versions[0].subresources.as_ref().unwrap().scale.as_ref().unwrap();
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
}

/// Servers before 1.28 publish a `nullable` object without its properties in OpenAPI v2
/// (`kubectl explain vm.spec.placement` shows nothing): optional objects carry no flag,
/// in the committed CRDs and in those the operator installs for a new kind.
#[test]
fn no_object_schema_is_nullable() {
    fn objects_marked_nullable(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                if map.get("type") == Some(&serde_json::json!("object")) && map.get("nullable") == Some(&serde_json::json!(true)) {
                    out.push(path.to_string());
                }
                map.iter().for_each(|(k, v)| objects_marked_nullable(v, &format!("{path}.{k}"), out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| objects_marked_nullable(v, path, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for crd in all_crds().into_iter().chain(infrastructure_crds("Acme").unwrap()) {
        let name = crd.metadata.name.clone().unwrap_or_default();
        objects_marked_nullable(&serde_json::to_value(&crd).unwrap(), &name, &mut found);
    }
    assert!(found.is_empty(), "nullable objects: {found:#?}");
    // `placement` is optional and keeps its properties.
    let vm = serde_json::to_value(all_crds().into_iter().find(|c| c.spec.names.kind == "VirtualMachine").unwrap()).unwrap();
    let placement = &vm["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["placement"];
    assert!(placement["properties"]["providerRef"].is_object() && placement.get("nullable").is_none(), "{placement:#}");
}
