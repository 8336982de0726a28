//! How every reconcile runs: the [`reconciler`] frame (outcome, backoff, metrics, watches),
//! the [`installation`] whose objects it sees, the `<Kind>Machine` kinds that exist
//! ([`infra_kinds`]), and who acts — one [`leader`] per role, or [`shards`] — at what
//! pace ([`throttle`]).

pub mod infra_kinds;
pub mod installation;
pub mod leader;
pub mod reconciler;
pub mod shards;
pub mod throttle;
