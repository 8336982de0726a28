//! What a conformance run found: one outcome per behaviour, printed for a person, as JUnit
//! XML for CI, or as JSON.

use serde::Serialize;

/// How a behaviour came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Passed,
    Failed,
    /// Does not apply to this driver or backend (said why); not a failure.
    NotApplicable,
    /// An optional behaviour the driver offers and that works.
    Supported,
    /// An optional behaviour the driver does not offer.
    Unsupported,
}

/// One behaviour's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub behaviour: &'static str,
    pub required: bool,
    pub status: Status,
    /// What was seen, in a line.
    pub detail: String,
    /// Why the contract asks it.
    pub why: &'static str,
    pub seconds: f64,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub driver: String,
    pub digest: String,
    pub contract: String,
    pub endpoint: String,
    pub outcomes: Vec<Outcome>,
    pub seconds: f64,
}

impl Report {
    /// Every required behaviour passed (or does not apply); an optional one that failed is
    /// reported, not counted.
    pub fn passed(&self) -> bool {
        !self.outcomes.iter().any(|o| o.required && o.status == Status::Failed)
    }

    fn count(&self, status: Status) -> usize {
        self.outcomes.iter().filter(|o| o.status == status).count()
    }

    /// For a person: one line per behaviour, failures with why they matter.
    pub fn text(&self) -> String {
        let mut out = format!("banlieue provider conformance: {} ({}, contract {}) against {}\n", self.driver, self.digest, self.contract, self.endpoint);
        for o in &self.outcomes {
            let mark = match o.status {
                Status::Passed => "PASS",
                Status::Failed => "FAIL",
                Status::NotApplicable => "N/A ",
                Status::Supported => "OK  ",
                Status::Unsupported => "--  ",
            };
            let kind = if o.required { "" } else { " (optional)" };
            out.push_str(&format!("  {mark} {:<24} {:>7.2}s  {}{kind}\n", o.behaviour, o.seconds, o.detail));
            if o.status == Status::Failed {
                out.push_str(&format!("       why it matters: {}\n", o.why));
            }
        }
        out.push_str(&format!(
            "{} passed, {} failed, {} not applicable; optional: {} supported, {} unsupported ({:.1}s)\n",
            self.count(Status::Passed),
            self.count(Status::Failed),
            self.count(Status::NotApplicable),
            self.count(Status::Supported),
            self.count(Status::Unsupported),
            self.seconds
        ));
        out
    }

    /// JUnit XML: one test case per behaviour; not applicable and unsupported are skipped.
    pub fn junit(&self) -> String {
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        // An optional behaviour that failed is reported as skipped with its words: only the
        // required ones fail a CI job.
        let failures = self.outcomes.iter().filter(|o| o.required && o.status == Status::Failed).count();
        let skipped = self.outcomes.len() - failures - self.count(Status::Passed) - self.count(Status::Supported);
        out.push_str(&format!(
            "<testsuite name=\"banlieue provider conformance: {}\" tests=\"{}\" failures=\"{failures}\" skipped=\"{skipped}\" time=\"{:.3}\">\n",
            xml(&self.driver),
            self.outcomes.len(),
            self.seconds
        ));
        for o in &self.outcomes {
            let class = if o.required { "required" } else { "optional" };
            out.push_str(&format!("  <testcase classname=\"{class}\" name=\"{}\" time=\"{:.3}\">", o.behaviour, o.seconds));
            match o.status {
                Status::Failed if o.required => out.push_str(&format!("<failure message=\"{}\">{}</failure>", xml(&o.detail), xml(o.why))),
                Status::Failed | Status::NotApplicable | Status::Unsupported => out.push_str(&format!("<skipped message=\"{}\"/>", xml(&o.detail))),
                Status::Passed | Status::Supported => {}
            }
            out.push_str("</testcase>\n");
        }
        out.push_str("</testsuite>\n");
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let o = |behaviour, status, detail: &str| Outcome { behaviour, required: true, status, detail: detail.into(), why: "a retried delete must succeed", seconds: 0.5 };
        Report {
            driver: "acme.wasm".into(),
            digest: "sha256:00".into(),
            contract: "0.6.0".into(),
            endpoint: "https://127.0.0.1:1".into(),
            outcomes: vec![o("delete", Status::Passed, "ok"), o("delete-again", Status::Failed, "want ok, got not-found: \"vm <x>\""), o("wrong-credentials", Status::NotApplicable, "no credentials")],
            seconds: 1.5,
        }
    }

    #[test]
    fn a_failure_fails_the_run_and_says_why_it_matters() {
        let r = report();
        assert!(!r.passed());
        let text = r.text();
        assert!(text.contains("FAIL delete-again"), "{text}");
        assert!(text.contains("why it matters: a retried delete must succeed"), "{text}");
        assert!(text.contains("1 passed, 1 failed, 1 not applicable"), "{text}");
    }

    #[test]
    fn junit_counts_and_escapes() {
        let x = report().junit();
        assert!(x.contains("tests=\"3\" failures=\"1\" skipped=\"1\""), "{x}");
        assert!(x.contains("<failure message=\"want ok, got not-found: &quot;vm &lt;x&gt;&quot;\">"), "{x}");
        assert!(x.contains("<skipped message=\"no credentials\"/>"), "{x}");
    }
}
