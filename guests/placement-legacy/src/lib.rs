//! A placement policy built against `banlieue:placement@0.1.0` with wit-bindgen
//! directly (the SDK implements 0.2.0): it picks the candidate with the most free
//! memory. With `parameters` `"elsewhere"` it names a failure domain that is not a
//! candidate, so tests can check the host refuses that.

wit_bindgen::generate!({
    path: ["../../wit/host", "../../wit/placement-0.1"],
    world: "banlieue:placement/placement",
    generate_all,
});

use exports::banlieue::placement::policy::{Candidate, Decision, Error, Guest, Request};

struct MostMemory;

impl Guest for MostMemory {
    fn contract_version() -> String {
        "0.1.0".into()
    }

    fn choose(request: Request, candidates: Vec<Candidate>) -> Result<Decision, Error> {
        let best = candidates
            .into_iter()
            .max_by_key(|c| c.capacity.memory_mib)
            .ok_or_else(|| Error::Unavailable("no candidates".into()))?;
        let failure_domain = if request.parameters == "\"elsewhere\"" { format!("{}-elsewhere", best.failure_domain) } else { best.failure_domain };
        Ok(Decision { provider: best.provider, failure_domain, score: best.capacity.memory_mib as i64, reason: "most free memory".into() })
    }
}

export!(MostMemory);
