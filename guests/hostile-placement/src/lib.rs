//! A placement policy whose decision names no candidate: the index just past the last one.

use banlieue_sdk::placement::{Candidates, Decision, Policy, Request, Result};

struct PastTheEnd;

impl Policy for PastTheEnd {
    fn choose(_: &Request, candidates: Candidates<'_>) -> Result<Decision> {
        Ok(Decision { candidate: candidates.len() as u32, score: 0, reason: "past the end".into() })
    }
}

banlieue_sdk::export_placement!(PastTheEnd);
