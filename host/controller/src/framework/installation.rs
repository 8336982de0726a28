//! One installation, one scope: which objects this control plane acts on.
//!
//! Two banlieue control planes on one cluster (a staging install beside production,
//! test runs in parallel) must never act on each other's objects: cluster-scoped kinds
//! have no namespace to tell them apart, so each would judge, import and status-write
//! the other's ProviderClasses, PlacementPolicies, VMClasses and VMImages. An
//! installation is named by `--instance NAME`; it acts only on objects labelled
//! `banlieue.io/instance=NAME`. The default installation (no name) acts only on objects
//! without that label, so a cluster with one installation needs no label at all.
//!
//! The scope is applied where objects enter a controller: every watch and list of
//! banlieue's kinds takes its selector from here ([`Installation::watch`],
//! [`Installation::list`]); a lookup by name checks [`Installation::owns`]; what the
//! installation makes (infrastructure Machines, pool members) carries its label
//! ([`Installation::mark`]); and Lease names carry the instance ([`Installation::lease`]),
//! so two installations never share a leader or a shard.

use std::collections::BTreeMap;

use kube::api::{ListParams, ObjectMeta};
use kube::runtime::watcher;

/// The label naming the installation an object belongs to.
pub use banlieue_api::INSTANCE_LABEL;

/// This control plane's installation: its instance name, or the default one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Installation {
    instance: Option<String>,
}

impl Installation {
    /// The installation named `instance` (`None` or empty: the default one). The name is a
    /// label value and part of Lease names: at most 40 characters of `a-z0-9-`.
    pub fn new(instance: Option<&str>) -> Result<Installation, String> {
        let Some(name) = instance.filter(|n| !n.is_empty()) else {
            return Ok(Installation::default());
        };
        let valid = name.len() <= 40
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !valid {
            return Err(format!("instance name {name:?}: use at most 40 characters of a-z, 0-9 and '-', starting and ending with a letter or digit"));
        }
        Ok(Installation { instance: Some(name.to_string()) })
    }

    /// The instance name (`None`: the default installation).
    pub fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    /// The label selector of this installation's objects.
    pub fn selector(&self) -> String {
        match &self.instance {
            Some(name) => format!("{INSTANCE_LABEL}={name}"),
            None => format!("!{INSTANCE_LABEL}"),
        }
    }

    /// A watch of this installation's objects, further narrowed by `selector` when given.
    pub fn watch(&self, selector: Option<&str>) -> watcher::Config {
        watcher::Config::default().labels(&self.and(selector))
    }

    /// A list of this installation's objects.
    pub fn list(&self) -> ListParams {
        ListParams::default().labels(&self.selector())
    }

    fn and(&self, selector: Option<&str>) -> String {
        match selector {
            Some(s) => format!("{s},{}", self.selector()),
            None => self.selector(),
        }
    }

    /// Whether `meta` belongs to this installation (for objects read by name).
    pub fn owns(&self, meta: &ObjectMeta) -> bool {
        meta.labels.as_ref().and_then(|l| l.get(INSTANCE_LABEL)).map(String::as_str) == self.instance.as_deref()
    }

    /// Label an object this installation makes as its own.
    pub fn mark(&self, labels: &mut BTreeMap<String, String>) {
        if let Some(name) = &self.instance {
            labels.insert(INSTANCE_LABEL.to_string(), name.clone());
        }
    }

    /// The name of a Lease (`banlieue-controller` → `banlieue-<instance>-controller`).
    pub fn lease(&self, name: &str) -> String {
        match (&self.instance, name.strip_prefix("banlieue-")) {
            (Some(instance), Some(rest)) => format!("banlieue-{instance}-{rest}"),
            (Some(instance), None) => format!("{instance}-{name}"),
            (None, _) => name.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(instance: Option<&str>) -> ObjectMeta {
        ObjectMeta { labels: instance.map(|i| [(INSTANCE_LABEL.to_string(), i.to_string())].into()), ..Default::default() }
    }

    #[test]
    fn the_default_installation_owns_only_unlabelled_objects() {
        let default = Installation::new(None).unwrap();
        assert_eq!(default.selector(), "!banlieue.io/instance");
        assert!(default.owns(&meta(None)));
        assert!(!default.owns(&meta(Some("staging"))));
        assert_eq!(default.lease("banlieue-controller"), "banlieue-controller");
        assert_eq!(Installation::new(Some("")).unwrap(), default);
    }

    #[test]
    fn a_named_installation_owns_only_its_labelled_objects() {
        let staging = Installation::new(Some("staging")).unwrap();
        assert_eq!(staging.selector(), "banlieue.io/instance=staging");
        assert_eq!(staging.and(Some("banlieue.io/pool")), "banlieue.io/pool,banlieue.io/instance=staging");
        assert!(staging.owns(&meta(Some("staging"))));
        assert!(!staging.owns(&meta(None)));
        assert!(!staging.owns(&meta(Some("prod"))));
        assert_eq!(staging.lease("banlieue-controller"), "banlieue-staging-controller");
        let mut labels = BTreeMap::new();
        staging.mark(&mut labels);
        assert_eq!(labels.get(INSTANCE_LABEL).map(String::as_str), Some("staging"));
    }

    #[test]
    fn instance_names_must_be_label_values_that_fit_a_lease_name() {
        for bad in ["Staging", "-a", "a-", "a_b", "a.b", &"x".repeat(41)] {
            assert!(Installation::new(Some(bad)).is_err(), "{bad}");
        }
        assert!(Installation::new(Some("team-a-2")).is_ok());
    }
}
