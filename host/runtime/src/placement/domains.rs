//! The candidates of a placement request as the contract passes them: every text
//! once, the facts domains share once per distinct set, placed VMs as counts per
//! distinct group. [`DomainsBuilder`] interns as the host gathers; [`Domains`] is
//! only made by it, so every index it holds points at something.

use rustc_hash::FxHashMap;

use super::wire;
use super::Capacity;

/// The candidates of one request, with the tables they refer to.
#[derive(Clone, Debug)]
pub struct Domains {
    wire: wire::Domains,
}

impl Domains {
    pub fn len(&self) -> usize {
        self.wire.candidates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.wire.candidates.is_empty()
    }

    /// Candidate `index`, if there is one.
    pub fn get(&self, index: u32) -> Option<CandidateRef<'_>> {
        let raw = self.wire.candidates.get(index as usize)?;
        Some(CandidateRef { domains: self, index, raw })
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = CandidateRef<'_>> {
        self.wire.candidates.iter().enumerate().map(move |(i, raw)| CandidateRef { domains: self, index: i as u32, raw })
    }

    /// Keep only the candidates `keep` says yes to (the tables stay as they are:
    /// entries no candidate refers to any more are harmless).
    pub fn retain(&mut self, mut keep: impl FnMut(CandidateRef<'_>) -> bool) {
        let kept: Vec<bool> = self.iter().map(&mut keep).collect();
        let mut kept = kept.into_iter();
        self.wire.candidates.retain(|_| kept.next().unwrap_or(false));
    }

    /// Text `index` of the table.
    pub fn text(&self, index: u32) -> &str {
        let ends = &self.wire.text_ends;
        let i = index as usize;
        let start = if i == 0 { 0 } else { ends[i - 1] as usize };
        &self.wire.texts[start..ends[i] as usize]
    }

    /// The tables, as the contract passes them.
    pub fn wire(&self) -> &wire::Domains {
        &self.wire
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
    pub(super) raw: &'a wire::Candidate,
}

impl<'a> CandidateRef<'a> {
    /// Its index: what a decision names.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// `namespace/name` of the Provider.
    pub fn provider(&self) -> &'a str {
        self.domains.text(self.raw.provider)
    }

    pub fn failure_domain(&self) -> &'a str {
        self.domains.text(self.raw.failure_domain)
    }

    pub fn facts(&self) -> &'a wire::DomainFacts {
        &self.domains.wire.facts[self.raw.facts as usize]
    }

    pub fn provider_class(&self) -> &'a str {
        self.domains.text(self.facts().provider_class)
    }

    pub fn capacity(&self) -> Capacity {
        self.raw.capacity
    }

    pub fn vm_count(&self) -> u32 {
        self.raw.vm_count
    }

    /// The placed VMs: each group once, with how many.
    pub fn placed(&self) -> impl ExactSizeIterator<Item = (&'a wire::VmGroup, u32)> + 'a {
        let d = self.domains;
        let start = self.raw.placed_start as usize;
        d.wire.placed[start..start + self.raw.placed_len as usize].iter().map(move |p| (&d.wire.groups[p.group as usize], p.count))
    }
}

impl std::fmt::Debug for CandidateRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.provider(), self.failure_domain())
    }
}

/// Builds [`Domains`], interning texts, facts and groups as they come.
///
/// Facts and groups are keyed by their text indices (a short `[u32]`), so
/// looking up one already seen allocates nothing.
pub struct DomainsBuilder {
    wire: wire::Domains,
    texts: FxHashMap<Box<str>, u32>,
    facts: FxHashMap<Box<[u32]>, u32>,
    groups: FxHashMap<Box<[u32]>, u32>,
    /// Scratch space for keys and per-candidate groups.
    key: Vec<u32>,
    vm_groups: Vec<u32>,
}

impl Default for DomainsBuilder {
    fn default() -> Self {
        DomainsBuilder {
            wire: wire::Domains { texts: String::new(), text_ends: vec![], facts: vec![], groups: vec![], placed: vec![], candidates: vec![] },
            texts: FxHashMap::default(),
            facts: FxHashMap::default(),
            groups: FxHashMap::default(),
            key: vec![],
            vm_groups: vec![],
        }
    }
}

impl DomainsBuilder {
    /// The index of text `s`, added if new.
    pub fn text(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.texts.get(s) {
            return i;
        }
        let i = self.wire.text_ends.len() as u32;
        self.wire.texts.push_str(s);
        self.wire.text_ends.push(self.wire.texts.len() as u32);
        self.texts.insert(s.into(), i);
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
        let placed_start = self.wire.placed.len() as u32;
        let mut groups = std::mem::take(&mut self.vm_groups);
        groups.clear();
        groups.extend(vm_groups);
        groups.sort_unstable();
        for run in groups.chunk_by(|a, b| a == b) {
            self.wire.placed.push(wire::Placed { group: run[0], count: run.len() as u32 });
        }
        self.vm_groups = groups;
        let placed_len = self.wire.placed.len() as u32 - placed_start;
        self.wire.candidates.push(wire::Candidate { provider, failure_domain, facts, capacity, vm_count, placed_start, placed_len });
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
    fn retain_keeps_the_tables() {
        let mut b = DomainsBuilder::default();
        let f = b.facts("libvirt", [], &[], &[], &[]);
        let p = b.text("team/a");
        for fd in ["a1", "a2", "a3"] {
            let fd = b.text(fd);
            b.candidate(p, fd, f, Capacity { cpus: 1, memory_mib: 1, storage_gib: 1 }, 0, []);
        }
        let mut d = b.build();
        d.retain(|c| c.failure_domain() != "a2");
        assert_eq!(d.iter().map(|c| (c.index(), c.failure_domain())).collect::<Vec<_>>(), [(0, "a1"), (1, "a3")]);
    }
}
