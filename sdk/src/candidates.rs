//! The candidates of a placement request, read through indices into the
//! request's shared tables (`banlieue:placement@0.2.0`'s `domains`).
//!
//! [`Candidates::new`] checks every index once, so the views here never fail:
//! a request whose indices point nowhere is refused as `invalid-spec` before a
//! policy sees it, and no lookup can panic afterwards.

use std::fmt;

use crate::bindings::placement::banlieue::placement::types as wire;
use crate::selector::{FAILURE_DOMAIN_KEY, PROVIDER_KEY};
use crate::{Error, Result};

/// A candidate's free capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub cpus: u64,
    pub memory_mib: u64,
    pub storage_gib: u64,
}

/// What is wrong with a request's tables, for the `invalid-spec` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corrupt {
    /// `text-ends[index]` is before the previous end, past `texts`, or inside a character.
    TextEnd { index: usize },
    /// A text index (of `what`) beyond `text-ends`.
    Text { what: &'static str, index: u32 },
    /// A candidate's facts index beyond `facts`.
    Facts { candidate: usize, index: u32 },
    /// A placed entry's group index beyond `groups`.
    Group { placed: usize, index: u32 },
    /// `placed-ends[candidate]` is before the previous end or past the placed VMs.
    Placed { candidate: usize },
    /// A list of `what` whose length differs from the one it goes with.
    Length { what: &'static str },
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corrupt::TextEnd { index } => write!(f, "text-ends[{index}] is out of order, past the texts or inside a character"),
            Corrupt::Text { what, index } => write!(f, "{what} names text {index}, which does not exist"),
            Corrupt::Facts { candidate, index } => write!(f, "candidate {candidate} names facts {index}, which do not exist"),
            Corrupt::Group { placed, index } => write!(f, "placed[{placed}] names group {index}, which does not exist"),
            Corrupt::Placed { candidate } => write!(f, "placed-ends[{candidate}] is out of order or past the placed VMs"),
            Corrupt::Length { what } => write!(f, "the {what} list has the wrong length"),
        }
    }
}

impl From<Corrupt> for Error {
    fn from(c: Corrupt) -> Error {
        Error::InvalidSpec(format!("placement request: {c}"))
    }
}

/// The candidates of one request, checked.
#[derive(Clone, Copy)]
pub struct Candidates<'a> {
    raw: &'a wire::Domains,
}

impl<'a> Candidates<'a> {
    /// Check that every index in `raw` points at something.
    pub fn new(raw: &'a wire::Domains) -> Result<Candidates<'a>> {
        check(raw)?;
        Ok(Candidates { raw })
    }

    pub fn len(&self) -> usize {
        self.raw.candidates.provider.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Candidate `index`, if there is one.
    pub fn get(&self, index: u32) -> Option<Candidate<'a>> {
        ((index as usize) < self.len()).then_some(Candidate { all: *self, index })
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = Candidate<'a>> + use<'a> {
        let all = *self;
        (0..self.len() as u32).map(move |index| Candidate { all, index })
    }

    /// Every distinct set of facts, in index order (see [`Facts::index`]).
    pub fn facts(&self) -> impl ExactSizeIterator<Item = Facts<'a>> + use<'a> {
        let all = *self;
        self.raw.facts.iter().enumerate().map(move |(i, raw)| Facts { all, index: i as u32, raw })
    }

    /// Every group of placed VMs, in index order (see [`PlacedGroup::index`]).
    pub fn groups(&self) -> impl ExactSizeIterator<Item = PlacedGroup<'a>> + use<'a> {
        let all = *self;
        self.raw.groups.iter().enumerate().map(move |(i, raw)| PlacedGroup { all, index: i as u32, raw })
    }

    /// The text at `index` ("" for one out of range, which [`Candidates::new`] refuses).
    pub fn text(&self, index: u32) -> &'a str {
        let ends = &self.raw.text_ends;
        let i = index as usize;
        let start = if i == 0 { 0 } else { ends.get(i - 1).copied().unwrap_or(0) as usize };
        let end = ends.get(i).copied().unwrap_or(0) as usize;
        self.raw.texts.get(start..end).unwrap_or("")
    }

    fn labels(&self, labels: &'a [wire::Label]) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        let all = *self;
        labels.iter().map(move |l| (all.text(l.key), all.text(l.value)))
    }

    fn label(&self, labels: &'a [wire::Label], key: &str) -> Option<&'a str> {
        self.labels(labels).find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

fn check(raw: &wire::Domains) -> Result<(), Corrupt> {
    let mut start = 0usize;
    for (index, &end) in raw.text_ends.iter().enumerate() {
        let end = end as usize;
        if end < start || raw.texts.get(start..end).is_none() {
            return Err(Corrupt::TextEnd { index });
        }
        start = end;
    }
    let texts = raw.text_ends.len();
    let text = |what, index: u32| if (index as usize) < texts { Ok(()) } else { Err(Corrupt::Text { what, index }) };
    let labels = |what, labels: &[wire::Label]| labels.iter().try_for_each(|l| text(what, l.key).and(text(what, l.value)));
    for f in &raw.facts {
        text("a provider class", f.provider_class)?;
        labels("a domain label", &f.labels)?;
        for &t in f.storage_classes.iter().chain(&f.network_classes).chain(&f.features) {
            text("a class or feature", t)?;
        }
    }
    for g in &raw.groups {
        text("a group's namespace", g.namespace)?;
        labels("a group's label", &g.labels)?;
    }
    if raw.placed_counts.len() != raw.placed_groups.len() {
        return Err(Corrupt::Length { what: "placed-counts" });
    }
    for (placed, &index) in raw.placed_groups.iter().enumerate() {
        if index as usize >= raw.groups.len() {
            return Err(Corrupt::Group { placed, index });
        }
    }
    let c = &raw.candidates;
    let n = c.provider.len();
    let columns = [
        ("failure-domain", c.failure_domain.len()),
        ("facts", c.facts.len()),
        ("cpus", c.cpus.len()),
        ("memory-mib", c.memory_mib.len()),
        ("storage-gib", c.storage_gib.len()),
        ("vm-count", c.vm_count.len()),
        ("placed-ends", c.placed_ends.len()),
    ];
    if let Some((what, _)) = columns.into_iter().find(|(_, len)| *len != n) {
        return Err(Corrupt::Length { what });
    }
    for i in 0..n {
        text("a candidate's provider", c.provider[i])?;
        text("a candidate's failure domain", c.failure_domain[i])?;
        if c.facts[i] as usize >= raw.facts.len() {
            return Err(Corrupt::Facts { candidate: i, index: c.facts[i] });
        }
        let start = if i == 0 { 0 } else { c.placed_ends[i - 1] };
        if c.placed_ends[i] < start || c.placed_ends[i] as usize > raw.placed_groups.len() {
            return Err(Corrupt::Placed { candidate: i });
        }
    }
    Ok(())
}

/// One failure domain of one Provider.
#[derive(Clone, Copy)]
pub struct Candidate<'a> {
    all: Candidates<'a>,
    index: u32,
}

impl<'a> Candidate<'a> {
    /// Its index among the request's candidates: what a decision names.
    pub fn index(&self) -> u32 {
        self.index
    }

    fn columns(&self) -> &'a wire::Candidates {
        &self.all.raw.candidates
    }

    /// `namespace/name` of the Provider.
    pub fn provider(&self) -> &'a str {
        self.all.text(self.columns().provider[self.index as usize])
    }

    /// The Provider's name, without its namespace.
    pub fn provider_name(&self) -> &'a str {
        let p = self.provider();
        p.rsplit_once('/').map_or(p, |(_, name)| name)
    }

    pub fn failure_domain(&self) -> &'a str {
        self.all.text(self.columns().failure_domain[self.index as usize])
    }

    /// What this domain shares with others: provider class, labels, classes, features.
    pub fn facts(&self) -> Facts<'a> {
        let index = self.columns().facts[self.index as usize];
        Facts { all: self.all, index, raw: &self.all.raw.facts[index as usize] }
    }

    pub fn provider_class(&self) -> &'a str {
        self.facts().provider_class()
    }

    /// The value of one of the domain's labels, `banlieue.io/provider` and
    /// `banlieue.io/failure-domain` included.
    pub fn label(&self, key: &str) -> Option<&'a str> {
        match key {
            PROVIDER_KEY => Some(self.provider_name()),
            FAILURE_DOMAIN_KEY => Some(self.failure_domain()),
            _ => self.facts().label(key),
        }
    }

    /// All of the domain's labels: its own, then `banlieue.io/provider` and `banlieue.io/failure-domain`.
    pub fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        let own = [(PROVIDER_KEY, self.provider_name()), (FAILURE_DOMAIN_KEY, self.failure_domain())];
        self.facts().labels().chain(own)
    }

    /// Free capacity.
    pub fn capacity(&self) -> Capacity {
        let (c, i) = (self.columns(), self.index as usize);
        Capacity { cpus: c.cpus[i], memory_mib: c.memory_mib[i], storage_gib: c.storage_gib[i] }
    }

    /// Number of VMs in the domain.
    pub fn vm_count(&self) -> u32 {
        self.columns().vm_count[self.index as usize]
    }

    /// The VMs in the domain the policy may match against: each group once, with how many.
    pub fn placed(&self) -> impl ExactSizeIterator<Item = (PlacedGroup<'a>, u32)> + use<'a> {
        let (all, ends, i) = (self.all, &self.columns().placed_ends, self.index as usize);
        let range = if i == 0 { 0 } else { ends[i - 1] as usize }..ends[i] as usize;
        let raw = all.raw;
        raw.placed_groups[range.clone()].iter().zip(&raw.placed_counts[range]).map(move |(&group, &count)| {
            (PlacedGroup { all, index: group, raw: &raw.groups[group as usize] }, count)
        })
    }
}

impl fmt::Debug for Candidate<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider(), self.failure_domain())
    }
}

/// A set of facts some failure domains share.
#[derive(Clone, Copy)]
pub struct Facts<'a> {
    all: Candidates<'a>,
    index: u32,
    raw: &'a wire::DomainFacts,
}

impl<'a> Facts<'a> {
    /// Its index among the request's facts: work that depends only on the facts
    /// can be done once per index rather than once per candidate.
    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn provider_class(&self) -> &'a str {
        self.all.text(self.raw.provider_class)
    }

    /// The failure domain's own labels (without the two [`Candidate::label`] adds).
    pub fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        self.all.labels(&self.raw.labels)
    }

    pub fn label(&self, key: &str) -> Option<&'a str> {
        self.all.label(&self.raw.labels, key)
    }

    pub fn storage_classes(&self) -> impl ExactSizeIterator<Item = &'a str> + Clone + use<'a> {
        self.texts(&self.raw.storage_classes)
    }

    pub fn network_classes(&self) -> impl ExactSizeIterator<Item = &'a str> + Clone + use<'a> {
        self.texts(&self.raw.network_classes)
    }

    pub fn features(&self) -> impl ExactSizeIterator<Item = &'a str> + Clone + use<'a> {
        self.texts(&self.raw.features)
    }

    fn texts(&self, list: &'a [u32]) -> impl ExactSizeIterator<Item = &'a str> + Clone + use<'a> {
        let all = self.all;
        list.iter().map(move |&t| all.text(t))
    }
}

/// The namespace and labels some placed VMs share.
#[derive(Clone, Copy)]
pub struct PlacedGroup<'a> {
    all: Candidates<'a>,
    index: u32,
    raw: &'a wire::VmGroup,
}

impl<'a> PlacedGroup<'a> {
    /// Its index among the request's groups: a test of a group can be done once per index.
    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn namespace(&self) -> &'a str {
        self.all.text(self.raw.namespace)
    }

    pub fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        self.all.labels(&self.raw.labels)
    }

    pub fn label(&self, key: &str) -> Option<&'a str> {
        self.all.label(&self.raw.labels, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::fixtures::{candidate, domains};

    fn sample() -> wire::Domains {
        domains(&[
            candidate("ns/p", "a").with_labels(&[("zone", "z1")]).with_vms("ns", &[("app", "web")], 2),
            candidate("ns/p", "b").with_labels(&[("zone", "z1")]),
        ])
    }

    #[test]
    fn views_answer_from_the_shared_tables() {
        let raw = sample();
        let all = Candidates::new(&raw).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(raw.facts.len(), 1, "both domains share their facts");
        let a = all.get(0).unwrap();
        assert_eq!((a.provider(), a.provider_name(), a.failure_domain()), ("ns/p", "p", "a"));
        assert_eq!((a.label("zone"), a.label(PROVIDER_KEY), a.label(FAILURE_DOMAIN_KEY)), (Some("z1"), Some("p"), Some("a")));
        assert_eq!(a.labels().collect::<Vec<_>>(), [("zone", "z1"), (PROVIDER_KEY, "p"), (FAILURE_DOMAIN_KEY, "a")]);
        let placed: Vec<_> = a.placed().map(|(g, n)| (g.namespace(), g.label("app"), n)).collect();
        assert_eq!(placed, [("ns", Some("web"), 2)]);
        assert_eq!(all.get(1).unwrap().placed().len(), 0);
        assert!(all.get(2).is_none());
    }

    #[test]
    fn every_kind_of_bad_index_is_invalid_spec() {
        let cases: [(&str, fn(&mut wire::Domains)); 10] = [
            ("text end past the texts", |d| *d.text_ends.last_mut().unwrap() += 100),
            ("text ends out of order", |d| d.text_ends.swap(0, 1)),
            ("a provider", |d| d.candidates.provider[0] = 999),
            ("a class", |d| d.facts[0].storage_classes.push(999)),
            ("facts", |d| d.candidates.facts[1] = 7),
            ("a group", |d| d.placed_groups[0] = 3),
            ("a placed end past the placed VMs", |d| d.candidates.placed_ends[1] = 2),
            ("placed ends out of order", |d| d.candidates.placed_ends[1] = 0),
            ("a short column", |d| d.candidates.memory_mib.truncate(1)),
            ("placed counts of another length", |d| d.placed_counts.push(1)),
        ];
        for (what, corrupt) in cases {
            let mut raw = sample();
            corrupt(&mut raw);
            match Candidates::new(&raw) {
                Err(Error::InvalidSpec(m)) => assert!(m.starts_with("placement request: "), "{what}: {m}"),
                Err(e) => panic!("{what}: {e:?}"),
                Ok(_) => panic!("{what}: accepted"),
            }
        }
        let mut inside_a_char = sample();
        inside_a_char.texts.push('é');
        inside_a_char.text_ends.push(inside_a_char.texts.len() as u32 - 1);
        assert!(matches!(Candidates::new(&inside_a_char), Err(Error::InvalidSpec(_))));
    }
}
