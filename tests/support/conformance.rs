//! `banlieue provider conformance` as an author runs it: the binary, and the manifests of a
//! backend written as an operator would (shared by the conformance suite and its bench).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// `banlieue provider conformance ARGS… --json` (bounded): exit code, the report, stderr.
pub async fn conformance(args: &[&str]) -> anyhow::Result<(i32, Value, String)> {
    let mut cmd = tokio::process::Command::new(crate::bootstrap::banlieue()?);
    cmd.args(["provider", "conformance", "--json"]).args(args).kill_on_drop(true);
    let out = crate::within(900, cmd.output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    Ok((out.status.code().unwrap_or(-1), report, stderr))
}

/// The manifests of one backend, as an operator writes them, in `dir`.
pub fn manifests(dir: &Path, objects: &[Value]) -> anyhow::Result<PathBuf> {
    let path = dir.join("backend.yaml");
    let docs: Vec<String> = objects.iter().map(serde_yaml::to_string).collect::<Result<_, _>>()?;
    std::fs::write(&path, docs.join("---\n"))?;
    Ok(path)
}

/// Provider `infra/under-test` at `endpoint`, with one storage and one network class.
pub fn provider(endpoint: &str, connection: Value, storage: (&str, &str), network: (&str, &str)) -> Value {
    let mut conn = connection;
    conn["endpoint"] = json!(endpoint);
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "under-test", "namespace": "infra"},
           "spec": {"providerClassRef": {"name": "under-test"}, "connection": conn,
                    "capabilities": {"storageClasses": {storage.0: storage.1}, "networkClasses": {network.0: network.1}}}})
}

/// Secret `infra/credentials` (what [`CREDENTIALS`] names).
pub fn secret(values: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = values.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "credentials", "namespace": "infra"}, "stringData": data})
}

/// A connection's `credentialsRef` to [`secret`].
pub const CREDENTIALS: &str = r#"{"credentialsRef": {"kind": "Secret", "name": "credentials"}}"#;

/// A built-in component's file (`guests/build.sh`).
pub fn driver(name: &str) -> String {
    crate::control::repo_root().join(format!("guests/dist/{name}.wasm")).display().to_string()
}

