//! Discovery documents: `/version`, `/api`, `/apis`, and the resource lists
//! `kubectl api-resources` and kube-rs `Discovery` read.

use serde_json::{json, Value};

use crate::storage::state::State;

pub fn version() -> Value {
    json!({
        "major": "1", "minor": "34",
        "gitVersion": concat!("v1.34.0-banlieue.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "n/a", "compiler": "rustc", "platform": "linux/amd64",
    })
}

pub fn core_versions(state: &State) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": state.self_address()}],
    })
}

fn group_doc(state: &State, group: &str) -> Option<Value> {
    let versions = state.registry.read().unwrap().versions(group);
    let preferred = versions.first()?.clone();
    let vs: Vec<Value> = versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    Some(json!({
        "name": group,
        "versions": vs,
        "preferredVersion": {"groupVersion": format!("{group}/{preferred}"), "version": preferred},
    }))
}

pub fn group_list(state: &State) -> Value {
    let groups = state.registry.read().unwrap().groups();
    let docs: Vec<Value> = groups.iter().filter(|g| !g.is_empty()).filter_map(|g| group_doc(state, g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": docs})
}

pub fn group(state: &State, group: &str) -> Option<Value> {
    if group.is_empty() {
        return None;
    }
    let mut g = group_doc(state, group)?;
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

pub fn resource_list(state: &State, group: &str, version: &str) -> Option<Value> {
    let types = state.registry.read().unwrap().resources(group, version);
    if types.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let mut resources = Vec::new();
    for t in types {
        let mut r = json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
            "kind": t.kind, "verbs": t.verbs(),
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        if t.status_subresource {
            resources.push(json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced,
                                  "kind": t.kind, "verbs": ["get", "patch", "update"]}));
        }
        if t.scale.is_some() {
            resources.push(json!({"name": format!("{}/scale", t.plural), "singularName": "", "namespaced": t.namespaced,
                                  "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
        if t.builtin == Some(crate::schema::registry::Builtin::Namespace) {
            resources.push(json!({"name": "namespaces/finalize", "singularName": "", "namespaced": false,
                                  "kind": "Namespace", "verbs": ["update"]}));
        }
    }
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}
