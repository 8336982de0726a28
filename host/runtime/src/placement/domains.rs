//! The candidates of a placement request as the contract passes them: every text
//! once, the facts domains share once per distinct set, placed VMs as counts per
//! distinct group, and the candidates as columns of numbers. [`DomainsBuilder`]
//! interns as the host gathers; [`Domains`] is only made by it, so every index it
//! holds points at something.

use std::hash::BuildHasher;
use std::ops::Range;

use hashbrown::HashTable;
use rustc_hash::{FxBuildHasher, FxHashMap};

use super::wire;

/// A candidate's free capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub cpus: u64,
    pub memory_mib: u64,
    pub storage_gib: u64,
}

/// The candidates of one request, with the tables they refer to.
#[derive(Clone, Debug)]
pub struct Domains {
    wire: wire::Domains,
}

fn no_candidates() -> wire::Candidates {
    wire::Candidates {
        provider: vec![],
        failure_domain: vec![],
        facts: vec![],
        cpus: vec![],
        memory_mib: vec![],
        storage_gib: vec![],
        vm_count: vec![],
        placed_ends: vec![],
    }
}

/// Text `index` of `texts` (ends as in the contract).
fn text_at<'a>(texts: &'a str, ends: &[u32], index: u32) -> &'a str {
    let i = index as usize;
    let start = if i == 0 { 0 } else { ends[i - 1] as usize };
    &texts[start..ends[i] as usize]
}

/// Entries `ends[i - 1] .. ends[i]` (from 0 for `i = 0`).
fn range(ends: &[u32], i: usize) -> Range<usize> {
    (if i == 0 { 0 } else { ends[i - 1] as usize })..ends[i] as usize
}

impl Domains {
    pub fn len(&self) -> usize {
        self.wire.candidates.provider.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Candidate `index`, if there is one.
    pub fn get(&self, index: u32) -> Option<CandidateRef<'_>> {
        ((index as usize) < self.len()).then_some(CandidateRef { domains: self, index })
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = CandidateRef<'_>> {
        (0..self.len() as u32).map(move |index| CandidateRef { domains: self, index })
    }

    /// Keep only the candidates `keep` says yes to. Their placed VMs are copied so
    /// each candidate's still end where the next one's start; the other tables stay
    /// as they are (entries nothing refers to any more are harmless).
    pub fn retain(&mut self, mut keep: impl FnMut(CandidateRef<'_>) -> bool) {
        let kept: Vec<usize> = self.iter().filter(|c| keep(*c)).map(|c| c.index as usize).collect();
        if kept.len() == self.len() {
            return;
        }
        let (old, w) = (std::mem::replace(&mut self.wire.candidates, no_candidates()), &mut self.wire);
        let (groups, counts) = (std::mem::take(&mut w.placed_groups), std::mem::take(&mut w.placed_counts));
        let c = &mut w.candidates;
        for i in kept {
            c.provider.push(old.provider[i]);
            c.failure_domain.push(old.failure_domain[i]);
            c.facts.push(old.facts[i]);
            c.cpus.push(old.cpus[i]);
            c.memory_mib.push(old.memory_mib[i]);
            c.storage_gib.push(old.storage_gib[i]);
            c.vm_count.push(old.vm_count[i]);
            let placed = range(&old.placed_ends, i);
            w.placed_groups.extend_from_slice(&groups[placed.clone()]);
            w.placed_counts.extend_from_slice(&counts[placed]);
            c.placed_ends.push(w.placed_groups.len() as u32);
        }
    }

    /// Text `index` of the table.
    pub fn text(&self, index: u32) -> &str {
        text_at(&self.wire.texts, &self.wire.text_ends, index)
    }

    /// The tables, as the contract passes them.
    pub fn wire(&self) -> &wire::Domains {
        &self.wire
    }

    pub fn into_wire(self) -> wire::Domains {
        self.wire
    }

    pub(super) fn texts<'a>(&'a self, list: &'a [u32]) -> impl ExactSizeIterator<Item = &'a str> + 'a {
        list.iter().map(|&t| self.text(t))
    }

    pub(super) fn labels<'a>(&'a self, list: &'a [wire::Label]) -> impl ExactSizeIterator<Item = (&'a str, &'a str)> + 'a {
        list.iter().map(|l| (self.text(l.key), self.text(l.value)))
    }
}

/// One candidate of [`Domains`].
#[derive(Clone, Copy)]
pub struct CandidateRef<'a> {
    domains: &'a Domains,
    index: u32,
}

impl<'a> CandidateRef<'a> {
    /// Its index: what a decision names.
    pub fn index(&self) -> u32 {
        self.index
    }

    fn columns(&self) -> &'a wire::Candidates {
        &self.domains.wire.candidates
    }

    /// `namespace/name` of the Provider.
    pub fn provider(&self) -> &'a str {
        self.domains.text(self.columns().provider[self.index as usize])
    }

    pub fn failure_domain(&self) -> &'a str {
        self.domains.text(self.columns().failure_domain[self.index as usize])
    }

    pub fn facts(&self) -> &'a wire::DomainFacts {
        &self.domains.wire.facts[self.columns().facts[self.index as usize] as usize]
    }

    pub fn provider_class(&self) -> &'a str {
        self.domains.text(self.facts().provider_class)
    }

    pub fn capacity(&self) -> Capacity {
        let (c, i) = (self.columns(), self.index as usize);
        Capacity { cpus: c.cpus[i], memory_mib: c.memory_mib[i], storage_gib: c.storage_gib[i] }
    }

    pub fn vm_count(&self) -> u32 {
        self.columns().vm_count[self.index as usize]
    }

    /// The placed VMs: each group once, with how many.
    pub fn placed(&self) -> impl ExactSizeIterator<Item = (&'a wire::VmGroup, u32)> + 'a {
        let w = &self.domains.wire;
        let placed = range(&w.candidates.placed_ends, self.index as usize);
        w.placed_groups[placed.clone()].iter().zip(&w.placed_counts[placed]).map(move |(&g, &n)| (&w.groups[g as usize], n))
    }
}

impl std::fmt::Debug for CandidateRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.provider(), self.failure_domain())
    }
}

/// Builds [`Domains`], interning texts, facts and groups as they come.
///
/// Texts are looked up by their place in the table itself, and facts and groups
/// by their text indices (a short `[u32]`), so meeting one already seen
/// allocates nothing and a new text is one copy into the table.
pub struct DomainsBuilder {
    wire: wire::Domains,
    /// Text indices, hashed by their text.
    texts: HashTable<u32>,
    facts: FxHashMap<Box<[u32]>, u32>,
    groups: FxHashMap<Box<[u32]>, u32>,
    /// Scratch space for keys and per-candidate groups.
    key: Vec<u32>,
    vm_groups: Vec<u32>,
}

impl Default for DomainsBuilder {
    fn default() -> Self {
        DomainsBuilder::with_capacity(0)
    }
}

impl DomainsBuilder {
    /// A builder with room for about `candidates` candidates.
    pub fn with_capacity(candidates: usize) -> Self {
        let mut wire = wire::Domains {
            texts: String::with_capacity(candidates * 8),
            text_ends: Vec::with_capacity(candidates),
            facts: vec![],
            groups: vec![],
            placed_groups: vec![],
            placed_counts: vec![],
            candidates: no_candidates(),
        };
        let c = &mut wire.candidates;
        for column in [&mut c.provider, &mut c.failure_domain, &mut c.facts, &mut c.vm_count, &mut c.placed_ends] {
            column.reserve(candidates);
        }
        for column in [&mut c.cpus, &mut c.memory_mib, &mut c.storage_gib] {
            column.reserve(candidates);
        }
        DomainsBuilder {
            wire,
            texts: HashTable::with_capacity(candidates),
            facts: FxHashMap::default(),
            groups: FxHashMap::default(),
            key: vec![],
            vm_groups: vec![],
        }
    }

    /// The index of text `s`, added if new.
    pub fn text(&mut self, s: &str) -> u32 {
        let w = &mut self.wire;
        let hash = FxBuildHasher.hash_one(s);
        if let Some(&i) = self.texts.find(hash, |&i| text_at(&w.texts, &w.text_ends, i) == s) {
            return i;
        }
        let i = w.text_ends.len() as u32;
        w.texts.push_str(s);
        w.text_ends.push(w.texts.len() as u32);
        self.texts.insert_unique(hash, i, |&j| FxBuildHasher.hash_one(text_at(&w.texts, &w.text_ends, j)));
        i
    }

    /// The index of these facts, added if new. `labels` are the failure domain's
    /// own (the contract adds `banlieue.io/provider` and `banlieue.io/failure-domain`).
    pub fn facts<'s>(
        &mut self,
        provider_class: &str,
        labels: impl IntoIterator<Item = (&'s str, &'s str)>,
        storage_classes: &[String],
        network_classes: &[String],
        features: &[String],
    ) -> u32 {
        // Key: class, #labels, key/value pairs, then each list with its length.
        let mut key = std::mem::take(&mut self.key);
        key.clear();
        key.push(self.text(provider_class));
        key.push(0);
        for (k, v) in labels {
            key.extend([self.text(k), self.text(v)]);
            key[1] += 1;
        }
        for list in [storage_classes, network_classes, features] {
            key.push(list.len() as u32);
            key.extend(list.iter().map(|s| self.text(s)));
        }
        let index = match self.facts.get(&key[..]) {
            Some(&i) => i,
            None => {
                let i = self.wire.facts.len() as u32;
                self.wire.facts.push(facts_of(&key));
                self.facts.insert(key[..].into(), i);
                i
            }
        };
        self.key = key;
        index
    }

    /// The index of the group of placed VMs with this namespace and labels, added if new.
    pub fn group<'s>(&mut self, namespace: &str, labels: impl IntoIterator<Item = (&'s str, &'s str)>) -> u32 {
        let mut key = std::mem::take(&mut self.key);
        key.clear();
        key.push(self.text(namespace));
        for (k, v) in labels {
            key.extend([self.text(k), self.text(v)]);
        }
        let index = match self.groups.get(&key[..]) {
            Some(&i) => i,
            None => {
                let i = self.wire.groups.len() as u32;
                let labels = key[1..].chunks_exact(2).map(|kv| wire::Label { key: kv[0], value: kv[1] }).collect();
                self.wire.groups.push(wire::VmGroup { namespace: key[0], labels });
                self.groups.insert(key[..].into(), i);
                i
            }
        };
        self.key = key;
        index
    }

    /// Add a candidate. `vm_groups` has the group of each placed VM the policy may
    /// match against (from [`DomainsBuilder::group`]); `vm_count` counts the domain's VMs.
    pub fn candidate(&mut self, provider: u32, failure_domain: u32, facts: u32, capacity: Capacity, vm_count: u32, vm_groups: impl IntoIterator<Item = u32>) {
        let mut groups = std::mem::take(&mut self.vm_groups);
        groups.clear();
        groups.extend(vm_groups);
        groups.sort_unstable();
        for run in groups.chunk_by(|a, b| a == b) {
            self.wire.placed_groups.push(run[0]);
            self.wire.placed_counts.push(run.len() as u32);
        }
        self.vm_groups = groups;
        let c = &mut self.wire.candidates;
        c.provider.push(provider);
        c.failure_domain.push(failure_domain);
        c.facts.push(facts);
        c.cpus.push(capacity.cpus);
        c.memory_mib.push(capacity.memory_mib);
        c.storage_gib.push(capacity.storage_gib);
        c.vm_count.push(vm_count);
        c.placed_ends.push(self.wire.placed_groups.len() as u32);
    }

    pub fn build(self) -> Domains {
        Domains { wire: self.wire }
    }
}

/// The facts a key from [`DomainsBuilder::facts`] stands for.
fn facts_of(key: &[u32]) -> wire::DomainFacts {
    let labels_end = 2 + 2 * key[1] as usize;
    let labels = key[2..labels_end].chunks_exact(2).map(|kv| wire::Label { key: kv[0], value: kv[1] }).collect();
    let mut rest = &key[labels_end..];
    let mut list = || {
        let (n, tail) = rest.split_first().expect("a facts key has three lists");
        let (items, tail) = tail.split_at(*n as usize);
        rest = tail;
        items.to_vec()
    };
    let (storage_classes, network_classes, features) = (list(), list(), list());
    wire::DomainFacts { provider_class: key[0], labels, storage_classes, network_classes, features }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn texts_facts_and_groups_are_interned_once() {
        let mut b = DomainsBuilder::default();
        let p = b.text("team/a");
        assert_eq!(b.text("team/a"), p);
        let lan = strings(&["lan"]);
        let f1 = b.facts("libvirt", [("zone", "z1")], &strings(&["fast"]), &lan, &[]);
        let f2 = b.facts("libvirt", [("zone", "z1")], &strings(&["fast"]), &lan, &[]);
        // The same texts in another list are other facts.
        let f3 = b.facts("libvirt", [("zone", "z1")], &[], &lan, &strings(&["fast"]));
        assert_eq!((f1, f2), (0, 0));
        assert_eq!(f3, 1);
        let web = b.group("team", [("app", "web")]);
        let db = b.group("team", [("app", "db")]);
        assert_eq!(b.group("team", [("app", "web")]), web);
        let cap = Capacity { cpus: 8, memory_mib: 1024, storage_gib: 10 };
        let (a1, a2) = (b.text("a1"), b.text("a2"));
        b.candidate(p, a1, f1, cap, 3, [db, web, db]);
        b.candidate(p, a2, f3, cap, 0, []);
        let d = b.build();
        assert_eq!(d.wire().facts.len(), 2);
        assert_eq!(d.wire().text_ends.len(), 12, "team/a libvirt zone z1 fast lan team app web db a1 a2");
        assert_eq!(d.wire().groups.len(), 2);
        let c = d.get(0).unwrap();
        assert_eq!((c.provider(), c.failure_domain(), c.provider_class(), c.vm_count()), ("team/a", "a1", "libvirt", 3));
        assert_eq!(d.texts(&c.facts().storage_classes).collect::<Vec<_>>(), ["fast"]);
        assert_eq!(d.labels(&c.facts().labels).collect::<Vec<_>>(), [("zone", "z1")]);
        let placed: Vec<(Vec<(&str, &str)>, u32)> = c.placed().map(|(g, n)| (d.labels(&g.labels).collect(), n)).collect();
        assert_eq!(placed, [(vec![("app", "web")], 1), (vec![("app", "db")], 2)]);
        let c = d.get(1).unwrap();
        assert_eq!(d.texts(&c.facts().features).collect::<Vec<_>>(), ["fast"]);
        assert!(c.facts().storage_classes.is_empty() && c.placed().len() == 0);
        assert!(d.get(2).is_none());
    }

    #[test]
    fn retain_keeps_each_candidates_placed_vms() {
        let mut b = DomainsBuilder::default();
        let f = b.facts("libvirt", [], &[], &[], &[]);
        let (web, db) = (b.group("team", [("app", "web")]), b.group("team", [("app", "db")]));
        let p = b.text("team/a");
        for (fd, vms) in [("a1", vec![web, web]), ("a2", vec![db]), ("a3", vec![db, web])] {
            let fd = b.text(fd);
            b.candidate(p, fd, f, Capacity { cpus: 1, memory_mib: 1, storage_gib: 1 }, vms.len() as u32, vms);
        }
        let mut d = b.build();
        d.retain(|c| c.failure_domain() != "a2");
        let placed = |c: CandidateRef<'_>| c.placed().map(|(g, n)| (d.labels(&g.labels).next().unwrap().1.to_string(), n)).collect::<Vec<_>>();
        let left: Vec<_> = d.iter().map(|c| (c.index(), c.failure_domain(), placed(c))).collect();
        assert_eq!(left, [(0, "a1", vec![("web".to_string(), 2)]), (1, "a3", vec![("web".into(), 1), ("db".into(), 1)])]);
    }
}
