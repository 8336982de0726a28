use banlieue_sdk::bindings::placement::exports::banlieue::placement::policy::{Guest, Request, Candidate, Decision, Error};
struct P;
impl Guest for P {
    fn contract_version() -> String { "0.1.0".into() }
    fn choose(_r: Request, c: Vec<Candidate>) -> Result<Decision, Error> {
        let c = c.into_iter().next().ok_or(Error::Unavailable("none".into()))?;
        Ok(Decision { provider: c.provider, failure_domain: c.failure_domain, score: 0, reason: "x".into() })
    }
}
banlieue_sdk::bindings::placement::export_placement_world!(P);
