//! A real Prometheus (Debian's `prometheus`) on 127.0.0.1, scraping the targets a test
//! names every second and evaluating its rule files every second, queried through its
//! HTTP API (`/api/v1/query`, `/api/v1/alerts`). Its data lives in a directory of the
//! test's, removed with it. `promtool` ([`promtool`]) checks and unit-tests rule files.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::{free_port, http_client, ChildGuard};

pub struct Prometheus {
    pub url: String,
    dir: PathBuf,
    _child: ChildGuard,
}

fn installed(bin: &str) -> anyhow::Result<()> {
    let found = std::process::Command::new(bin).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    anyhow::ensure!(found, "{bin} is not installed: scripts/install-deps.sh installs Debian's prometheus, which has it");
    Ok(())
}

impl Prometheus {
    /// Start one in `dir` scraping `targets` (`host:port`, path `/metrics`) as job
    /// `banlieue`, with `rules` (rule files, `groups:` at the top) loaded.
    pub async fn start(dir: &Path, targets: &[String], rules: &[PathBuf]) -> anyhow::Result<Prometheus> {
        installed("prometheus")?;
        std::fs::create_dir_all(dir)?;
        let config = serde_json::json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": rules,
            "scrape_configs": [{"job_name": "banlieue", "static_configs": [{"targets": targets}]}],
        });
        // JSON is YAML.
        std::fs::write(dir.join("prometheus.yml"), serde_json::to_vec_pretty(&config)?)?;
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting prometheus")?;
        let mut child = ChildGuard(child);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.0.try_wait()? {
                bail!("prometheus exited ({status}):\n{}", std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default());
            }
            if http_client().get(format!("{url}/-/ready")).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() > deadline {
                bail!("prometheus did not get ready on {url} within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Prometheus { url, dir: dir.to_path_buf(), _child: child })
    }

    /// An instant query: each series' labels and value. A query Prometheus refuses is an error
    /// with its words.
    pub async fn query(&self, expr: &str) -> anyhow::Result<Vec<(serde_json::Map<String, Value>, f64)>> {
        let resp: Value = http_client().get(format!("{}/api/v1/query?query={}", self.url, encoded(expr))).send().await?.json().await?;
        if resp["status"] != "success" {
            bail!("prometheus refused {expr:?}: {} {}", resp["errorType"], resp["error"]);
        }
        let data = &resp["data"];
        let values = match data["resultType"].as_str() {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![serde_json::json!({"metric": {}, "value": data["result"]})],
            other => bail!("{expr:?} gave a {other:?}, not a vector"),
        };
        Ok(values
            .iter()
            .map(|s| {
                let v = s["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
                (s["metric"].as_object().cloned().unwrap_or_default(), v)
            })
            .collect())
    }

    /// The one value of `expr`, once it has one that `ok` accepts (bounded): scrapes come
    /// every second and a rate needs two.
    pub async fn await_value(&self, expr: &str, secs: u64, ok: impl Fn(f64) -> bool) -> anyhow::Result<f64> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let got = self.query(expr).await?;
            if let [(_, v)] = got.as_slice() {
                if ok(*v) {
                    return Ok(*v);
                }
            }
            if Instant::now() > deadline {
                bail!("{expr} was {got:?} after {secs} s");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The alerts Prometheus holds now (`/api/v1/alerts`): name, state (`pending`, `firing`), labels.
    pub async fn alerts(&self) -> anyhow::Result<Vec<(String, String, serde_json::Map<String, Value>)>> {
        let resp: Value = http_client().get(format!("{}/api/v1/alerts", self.url)).send().await?.json().await?;
        Ok(resp["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|a| {
                let labels = a["labels"].as_object().cloned().unwrap_or_default();
                let name = labels.get("alertname").and_then(Value::as_str).unwrap_or_default().to_string();
                (name, a["state"].as_str().unwrap_or_default().to_string(), labels)
            })
            .collect())
    }

    /// Its log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

/// `s` as a URL query value.
fn encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Run `promtool ARGS` in `dir`; its output, or an error with it.
pub fn promtool(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    installed("promtool")?;
    let out = std::process::Command::new("promtool").args(args).current_dir(dir).output().context("running promtool")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    anyhow::ensure!(out.status.success(), "promtool {} failed:\n{text}", args.join(" "));
    Ok(text)
}
