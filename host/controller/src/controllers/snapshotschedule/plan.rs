//! What one reconcile of a schedule does, decided without side effects: which VMs get a
//! snapshot for the current run (within each Provider's share), and which of the
//! schedule's snapshots retention removes.

use std::collections::BTreeMap;

use banlieue_api::snapshot::{Retention, SnapshotPhase};
use jiff::{SignedDuration, Timestamp};

/// A VM the selector picked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vm {
    pub name: String,
    /// The Provider it runs on (`None`: not placed yet — it waits, counting against no one).
    pub provider: Option<String>,
}

/// One of the schedule's snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub name: String,
    pub vm: String,
    /// The run that made it.
    pub run: Timestamp,
    pub phase: Option<SnapshotPhase>,
}

impl Taken {
    fn in_flight(&self) -> bool {
        matches!(self.phase, None | Some(SnapshotPhase::Pending | SnapshotPhase::InProgress))
    }
}

/// What a run still has to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Run {
    /// VMs to make a snapshot for now.
    pub create: Vec<String>,
    /// VMs waiting for a slot on their Provider (or for a placement).
    pub waiting: usize,
}

/// The snapshots run `run` still needs: one per VM that has none of that run, while its
/// Provider has fewer than `max_in_flight` of the schedule's snapshots under way.
pub fn run(run: Timestamp, vms: &[Vm], taken: &[Taken], max_in_flight: u32) -> Run {
    let provider_of: BTreeMap<&str, Option<&str>> = vms.iter().map(|v| (v.name.as_str(), v.provider.as_deref())).collect();
    let mut in_flight: BTreeMap<&str, u32> = BTreeMap::new();
    for t in taken.iter().filter(|t| t.in_flight()) {
        if let Some(Some(p)) = provider_of.get(t.vm.as_str()) {
            *in_flight.entry(p).or_default() += 1;
        }
    }
    let mut out = Run::default();
    for vm in vms {
        if taken.iter().any(|t| t.vm == vm.name && t.run == run) {
            continue;
        }
        let Some(provider) = vm.provider.as_deref() else {
            out.waiting += 1;
            continue;
        };
        let n = in_flight.entry(provider).or_default();
        if *n < max_in_flight.max(1) {
            *n += 1;
            out.create.push(vm.name.clone());
        } else {
            out.waiting += 1;
        }
    }
    out
}

/// The schedule's snapshots retention removes, per VM: Ready ones beyond the newest
/// `keepLast` or older than `maxAge`; Failed ones once a newer one of the VM is Ready. One
/// being taken is never removed (a run's snapshot counts once it is Ready).
pub fn expired(taken: &[Taken], retention: &Retention, max_age: Option<SignedDuration>, now: Timestamp) -> Vec<String> {
    let mut by_vm: BTreeMap<&str, Vec<&Taken>> = BTreeMap::new();
    for t in taken {
        by_vm.entry(&t.vm).or_default().push(t);
    }
    let mut out = Vec::new();
    for list in by_vm.values_mut() {
        list.sort_by(|a, b| b.run.cmp(&a.run).then_with(|| a.name.cmp(&b.name)));
        let newest_ready = list.iter().find(|t| t.phase == Some(SnapshotPhase::Ready)).map(|t| t.run);
        let mut kept = 0u32;
        for t in list.iter() {
            match t.phase {
                Some(SnapshotPhase::Ready) => {
                    let too_many = retention.keep_last.is_some_and(|k| kept >= k);
                    let too_old = max_age.is_some_and(|age| now.duration_since(t.run) > age);
                    if too_many || too_old {
                        out.push(t.name.clone());
                    } else {
                        kept += 1;
                    }
                }
                Some(SnapshotPhase::Failed) if newest_ready.is_some_and(|r| r > t.run) => out.push(t.name.clone()),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// `retention`, checked: at least one of its fields, `keepLast` at least 1, `maxAge` a
/// positive duration (`36h`, `7d`, `2w`, `1d 12h`; a day is 24 hours).
pub fn check_retention(retention: &Retention) -> Result<Option<SignedDuration>, String> {
    if retention.keep_last.is_none() && retention.max_age.is_none() {
        return Err("spec.retention: set keepLast, maxAge or both (a schedule keeping everything fills its backends)".into());
    }
    if retention.keep_last == Some(0) {
        return Err("spec.retention.keepLast: 0 keeps nothing; at least 1".into());
    }
    let Some(age) = &retention.max_age else { return Ok(None) };
    let bad = || format!("spec.retention.maxAge: {age:?} is not a duration such as 36h, 7d or 1d 12h");
    let span: jiff::Span = age.parse().map_err(|_| bad())?;
    let d = span.to_duration(jiff::SpanRelativeTo::days_are_24_hours()).map_err(|_| bad())?;
    if d <= SignedDuration::ZERO {
        return Err(format!("spec.retention.maxAge: {age:?} keeps nothing; a positive duration"));
    }
    Ok(Some(d))
}

/// The name of VM `vm`'s snapshot of run `run` of schedule `schedule`: the same for every
/// reconcile of that run, so a crash between making it and recording it makes no second.
pub fn snapshot_name(schedule: &str, vm: &str, run: Timestamp) -> String {
    let name = format!("{schedule}-{vm}-{}", run.as_second());
    if name.len() <= 253 {
        return name;
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (schedule, vm).hash(&mut h);
    format!("{}-{:016x}-{}", &schedule[..schedule.len().min(200)], h.finish(), run.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn vm(name: &str, provider: &str) -> Vm {
        Vm { name: name.into(), provider: (!provider.is_empty()).then(|| provider.into()) }
    }

    fn taken(name: &str, vm: &str, run: i64, phase: Option<SnapshotPhase>) -> Taken {
        Taken { name: name.into(), vm: vm.into(), run: t(run), phase }
    }

    #[test]
    fn a_run_makes_one_snapshot_per_vm_within_each_providers_share() {
        let vms = [vm("a", "p1"), vm("b", "p1"), vm("c", "p1"), vm("d", "p2"), vm("e", "")];
        let r = run(t(60), &vms, &[], 2);
        assert_eq!(r, Run { create: vec!["a".into(), "b".into(), "d".into()], waiting: 2 });
        // Next reconcile: a and b are under way, d is Ready: c still waits on p1.
        let under_way = [
            taken("s-a", "a", 60, Some(SnapshotPhase::InProgress)),
            taken("s-b", "b", 60, None),
            taken("s-d", "d", 60, Some(SnapshotPhase::Ready)),
        ];
        assert_eq!(run(t(60), &vms, &under_way, 2), Run { create: vec![], waiting: 2 });
        // a is done: c goes.
        let a_done = [taken("s-a", "a", 60, Some(SnapshotPhase::Ready)), under_way[1].clone(), under_way[2].clone()];
        assert_eq!(run(t(60), &vms, &a_done, 2), Run { create: vec!["c".into()], waiting: 1 });
        // A new run: everyone again (the old run's snapshots are its own).
        assert_eq!(run(t(120), &vms, &a_done, 10).create, ["a", "b", "c", "d"]);
    }

    #[test]
    fn retention_keeps_the_newest_ready_ones_and_none_too_old() {
        let list = [
            taken("a4", "a", 240, Some(SnapshotPhase::InProgress)),
            taken("a3", "a", 180, Some(SnapshotPhase::Ready)),
            taken("a2", "a", 120, Some(SnapshotPhase::Failed)),
            taken("a1", "a", 60, Some(SnapshotPhase::Ready)),
            taken("a0", "a", 0, Some(SnapshotPhase::Ready)),
            taken("b0", "b", 0, Some(SnapshotPhase::Ready)),
        ];
        let keep2 = Retention { keep_last: Some(2), max_age: None };
        assert_eq!(expired(&list, &keep2, None, t(240)), ["a0", "a2"], "one under way is not counted; a failure older than a Ready one goes");
        let keep1 = Retention { keep_last: Some(1), max_age: None };
        assert_eq!(expired(&list, &keep1, None, t(240)), ["a0", "a1", "a2"]);
        let young = Retention { keep_last: None, max_age: Some("90s".into()) };
        let age = check_retention(&young).unwrap();
        assert_eq!(expired(&list, &young, age, t(240)), ["a0", "a1", "a2", "b0"]);
    }

    #[test]
    fn retention_is_checked_naming_the_field() {
        assert!(check_retention(&Retention::default()).unwrap_err().starts_with("spec.retention:"));
        assert!(check_retention(&Retention { keep_last: Some(0), max_age: None }).unwrap_err().starts_with("spec.retention.keepLast"));
        assert!(check_retention(&Retention { keep_last: None, max_age: Some("soon".into()) }).unwrap_err().starts_with("spec.retention.maxAge"));
        assert_eq!(check_retention(&Retention { keep_last: None, max_age: Some("7d".into()) }).unwrap(), Some(SignedDuration::from_hours(168)));
        assert_eq!(check_retention(&Retention { keep_last: None, max_age: Some("1d 12h".into()) }).unwrap(), Some(SignedDuration::from_hours(36)));
    }

    #[test]
    fn snapshot_names_are_stable_per_run_and_valid_lengths() {
        assert_eq!(snapshot_name("nightly", "web-0", t(0)), "nightly-web-0-1800000000");
        let long = snapshot_name(&"s".repeat(200), &"v".repeat(200), t(0));
        assert!(long.len() <= 253 && long == snapshot_name(&"s".repeat(200), &"v".repeat(200), t(0)));
    }
}
