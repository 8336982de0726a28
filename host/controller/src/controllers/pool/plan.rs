//! What a pool reconcile decides, as pure functions of the members it sees: which
//! members go when scaling in, how far a rolling update may go in one step, and which
//! existing VMs it adopts.
//! The reconciler (`pool`) only carries the decisions out.

use std::collections::{BTreeMap, BTreeSet};

/// One member as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// The template revision it was made from.
    pub revision: String,
    pub ready: bool,
    /// Where it runs, once scheduled.
    pub failure_domain: Option<String>,
    /// Creation order: larger is newer (the creation timestamp, in seconds).
    pub created: i64,
    /// Annotated `banlieue.io/protected`: never chosen for scale-in.
    pub protected: bool,
}

/// Members to delete to come down to `keep` (never a protected one), in the documented
/// order: members that are not Ready first; then members of the failure domain that has
/// the most members (so what stays is spread); then the newest; names break ties.
/// Fewer are returned when protected members are all that is left.
pub fn scale_in(members: &[Member], keep: usize) -> Vec<String> {
    let mut left: Vec<&Member> = members.iter().collect();
    let mut chosen = Vec::new();
    while left.len() > keep {
        let mut per_domain: BTreeMap<Option<&str>, usize> = BTreeMap::new();
        for m in &left {
            *per_domain.entry(m.failure_domain.as_deref()).or_default() += 1;
        }
        let next = left
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.protected)
            .max_by(|(_, a), (_, b)| {
                let key = |m: &Member| (!m.ready, per_domain[&m.failure_domain.as_deref()], m.created);
                key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
            })
            .map(|(i, _)| i);
        let Some(i) = next else { break };
        chosen.push(left.remove(i).name.clone());
    }
    chosen
}

/// Members to restart now so each applies a change of its class waiting for its next power
/// cycle (`pending`): Ready ones, oldest first, as long as those restarting already
/// (`cycling`) and those not Ready stay within `max_unavailable` (at least one at a time).
pub fn cycle(members: &[Member], pending: &BTreeSet<String>, cycling: &BTreeSet<String>, max_unavailable: usize) -> Vec<String> {
    let busy = members.iter().filter(|m| cycling.contains(&m.name) || !m.ready).count();
    let room = max_unavailable.max(1).saturating_sub(busy);
    let mut next: Vec<&Member> = members.iter().filter(|m| m.ready && pending.contains(&m.name) && !cycling.contains(&m.name)).collect();
    next.sort_by(|a, b| a.created.cmp(&b.created).then(a.name.cmp(&b.name)));
    next.into_iter().take(room).map(|m| m.name.clone()).collect()
}

/// One step of a rolling update towards `revision` with `replicas` members: how many
/// new members to create and which old ones to delete now, never going above
/// `replicas + max_surge` members nor below `replicas - max_unavailable` Ready ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub create: usize,
    pub delete: Vec<String>,
}

pub fn roll(members: &[Member], replicas: usize, revision: &str, max_surge: usize, max_unavailable: usize) -> Step {
    // Both zero would never progress; kube's Deployment refuses it, here surge 1 stands in.
    let max_surge = if max_surge == 0 && max_unavailable == 0 { 1 } else { max_surge };
    let (updated, old): (Vec<&Member>, Vec<&Member>) = members.iter().partition(|m| m.revision == revision);
    let total = members.len();
    let ready = members.iter().filter(|m| m.ready).count();
    let min_ready = replicas.saturating_sub(max_unavailable);

    let create = (replicas + max_surge).saturating_sub(total).min(replicas.saturating_sub(updated.len()));

    // Old members that are not Ready cost no availability: they go first. Then Ready ones,
    // as long as the Ready count stays at or above `min_ready` (members surged in and
    // Ready count towards it).
    let mut delete = Vec::new();
    let mut old: Vec<&Member> = old;
    old.sort_by(|a, b| a.ready.cmp(&b.ready).then(a.created.cmp(&b.created)).then(a.name.cmp(&b.name)));
    let mut ready_left = ready;
    for m in old {
        if m.ready {
            if ready_left <= min_ready {
                break;
            }
            ready_left -= 1;
        }
        delete.push(m.name.clone());
    }
    Step { create, delete }
}

/// A count or a percentage of `of` (`"25%"`, rounded up for surge, down for unavailable
/// as kube's Deployment does); `None` when the text is neither.
pub fn resolve(value: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString, of: usize, round_up: bool) -> Option<usize> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match value {
        IntOrString::Int(n) => usize::try_from(*n).ok(),
        IntOrString::String(s) => {
            let pct: usize = s.strip_suffix('%')?.trim().parse().ok()?;
            let scaled = pct * of;
            Some(if round_up { scaled.div_ceil(100) } else { scaled / 100 })
        }
    }
}

/// The backend ids of the VMs a pool may adopt (`spec.adoptSelector`) from what its Provider's
/// discovery found: unmanaged, not templates, matching a name pattern or a tag, and not named
/// by any VM's `spec.adopt` yet (`claimed`: one on its way); by backend id.
pub fn adoptable(found: &[banlieue_api::provider::DiscoveredMachine], selector: &banlieue_api::vm::AdoptSelector, claimed: &BTreeSet<String>) -> Vec<String> {
    let mut ids: Vec<String> = found
        .iter()
        .filter(|m| m.owner.is_none() && !m.template && !claimed.contains(&m.backend_id))
        .filter(|m| selector.names.iter().any(|p| matches_pattern(p, &m.name)) || m.tags.iter().any(|t| selector.tags.contains(t)))
        .map(|m| m.backend_id.clone())
        .collect();
    ids.sort();
    ids
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters.
fn matches_pattern(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_patterns_match_whole_names_with_star_for_any_run() {
        for (pattern, name, matches) in [
            ("billing-*", "billing-db", true),
            ("billing-*", "billing-", true),
            ("billing-*", "old-billing-db", false),
            ("*-db", "billing-db", true),
            ("b*g-*b", "billing-db", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("*", "anything", true),
            ("a*a", "a", false),
        ] {
            assert_eq!(matches_pattern(pattern, name), matches, "{pattern} ~ {name}");
        }
    }

    #[test]
    fn a_pool_adopts_unmanaged_matching_vms_nobody_claims_yet() {
        use banlieue_api::provider::{DiscoveredMachine, MachineOwner};
        let vm = |id: &str, name: &str, tags: &[&str]| DiscoveredMachine {
            backend_id: id.into(),
            name: name.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        };
        let mut managed = vm("4", "web-4", &[]);
        managed.owner = Some(MachineOwner { machine: "team/x".into(), machine_uid: "u".into(), installation: String::new() });
        let mut template = vm("5", "web-tmpl", &[]);
        template.template = true;
        let found = [vm("3", "web-3", &[]), vm("1", "web-1", &[]), vm("2", "db-2", &["fleet"]), managed, template, vm("6", "web-6", &[])];
        let selector = banlieue_api::vm::AdoptSelector { names: vec!["web-*".into()], tags: vec!["fleet".into()] };
        let claimed = BTreeSet::from(["6".to_string()]);
        assert_eq!(adoptable(&found, &selector, &claimed), ["1", "2", "3"], "by id; managed, templates and claimed ones left out");
        assert!(adoptable(&found, &banlieue_api::vm::AdoptSelector::default(), &claimed).is_empty(), "an empty selector adopts nothing");
    }

    fn m(name: &str, revision: &str, ready: bool, domain: &str, created: i64) -> Member {
        Member { name: name.into(), revision: revision.into(), ready, failure_domain: Some(domain.into()), created, protected: false }
    }

    #[test]
    fn scale_in_takes_unready_then_the_crowded_domain_then_the_newest() {
        let members = [
            m("p-0", "r1", true, "a", 1),
            m("p-1", "r1", true, "a", 2),
            m("p-2", "r1", true, "a", 3),
            m("p-3", "r1", true, "b", 4),
            m("p-4", "r1", false, "b", 5),
        ];
        assert_eq!(scale_in(&members, 4), ["p-4"], "not Ready first");
        assert_eq!(scale_in(&members, 2), ["p-4", "p-2", "p-1"], "then domain a (3 members) from the newest, as long as it is the largest");
        assert_eq!(scale_in(&members, 0).len(), 5);
        assert!(scale_in(&members, 5).is_empty());
    }

    #[test]
    fn a_protected_member_is_never_chosen() {
        let mut members = vec![m("p-0", "r1", true, "a", 1), m("p-1", "r1", false, "a", 2)];
        members[1].protected = true;
        assert_eq!(scale_in(&members, 0), ["p-0"], "the protected, unready p-1 stays");
    }

    #[test]
    fn ties_break_on_the_name_so_the_order_is_deterministic() {
        let members = [m("p-a", "r1", true, "a", 1), m("p-b", "r1", true, "b", 1)];
        assert_eq!(scale_in(&members, 1), ["p-b"]);
    }

    #[test]
    fn a_rolling_update_surges_then_retires_old_members_within_the_bounds() {
        let old: Vec<Member> = (0..4).map(|i| m(&format!("p-{i}"), "r1", true, "a", i)).collect();
        // maxSurge 1, maxUnavailable 0: one new member first, no old one goes yet.
        assert_eq!(roll(&old, 4, "r2", 1, 0), Step { create: 1, delete: vec![] });
        // The new one is not Ready yet: still nothing may go.
        let mut members = old.clone();
        members.push(m("p-4", "r2", false, "a", 10));
        assert_eq!(roll(&members, 4, "r2", 1, 0), Step { create: 0, delete: vec![] });
        // Ready: the oldest old member goes.
        members[4].ready = true;
        assert_eq!(roll(&members, 4, "r2", 1, 0), Step { create: 0, delete: vec!["p-0".into()] });
    }

    #[test]
    fn max_unavailable_lets_old_members_go_before_new_ones_exist() {
        let old: Vec<Member> = (0..4).map(|i| m(&format!("p-{i}"), "r1", true, "a", i)).collect();
        let step = roll(&old, 4, "r2", 0, 2);
        assert_eq!(step, Step { create: 0, delete: vec!["p-0".into(), "p-1".into()] });
        // An old member that is not Ready goes first and costs nothing; then no Ready one
        // may go, as 3 Ready are the minimum.
        let mut members = old.clone();
        members[3].ready = false;
        assert_eq!(roll(&members, 4, "r2", 0, 1).delete, ["p-3"]);
    }

    #[test]
    fn a_finished_update_does_nothing() {
        let members: Vec<Member> = (0..3).map(|i| m(&format!("p-{i}"), "r2", true, "a", i)).collect();
        assert_eq!(roll(&members, 3, "r2", 1, 1), Step::default());
    }

    #[test]
    fn percentages_round_like_a_deployment() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        assert_eq!(resolve(&IntOrString::String("25%".into()), 10, true), Some(3));
        assert_eq!(resolve(&IntOrString::String("25%".into()), 10, false), Some(2));
        assert_eq!(resolve(&IntOrString::Int(2), 10, false), Some(2));
        assert_eq!(resolve(&IntOrString::String("lots".into()), 10, false), None);
        assert_eq!(resolve(&IntOrString::Int(-1), 10, false), None);
    }

    #[test]
    fn class_changes_are_cycled_oldest_first_within_max_unavailable() {
        let m = |name: &str, ready: bool, created: i64| Member { name: name.into(), revision: "r".into(), ready, failure_domain: None, created, protected: false };
        let members = [m("p-0", true, 1), m("p-1", true, 2), m("p-2", true, 3)];
        let all: BTreeSet<String> = ["p-0", "p-1", "p-2"].iter().map(|s| s.to_string()).collect();
        let none = BTreeSet::new();
        assert_eq!(cycle(&members, &all, &none, 0), ["p-0"], "one at a time when no member may be unavailable");
        assert_eq!(cycle(&members, &all, &none, 2), ["p-0", "p-1"]);
        let busy: BTreeSet<String> = ["p-0".to_string()].into();
        assert_eq!(cycle(&members, &all, &busy, 1), Vec::<String>::new(), "p-0 is restarting: wait for it");
        let not_ready = [m("p-0", false, 1), m("p-1", true, 2), m("p-2", true, 3)];
        assert_eq!(cycle(&not_ready, &all, &none, 1), Vec::<String>::new(), "a member not Ready takes the room");
        assert_eq!(cycle(&members, &none, &none, 3), Vec::<String>::new(), "nothing pending, nothing restarted");
    }
}
