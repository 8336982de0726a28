//! `meta.k8s.io/v1` Table responses (what `kubectl get` prints), built from a
//! resource's printer columns.

use serde_json::{json, Value};

use crate::schema::registry::ResourceType;

/// A Table of `objs` (already in the served version).
pub fn table(rt: &ResourceType, objs: &[Value], list_meta: Value, include_object: Option<&str>) -> Value {
    let paths: Vec<Option<crate::schema::jsonpath::Path>> = rt.columns.iter().map(|c| crate::schema::jsonpath::parse(&c.json_path).ok()).collect();
    let defs: Vec<Value> = rt
        .columns
        .iter()
        .map(|c| json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}))
        .collect();
    let now = chrono::Utc::now();
    let rows: Vec<Value> = objs
        .iter()
        .map(|obj| {
            let cells: Vec<Value> = rt
                .columns
                .iter()
                .zip(&paths)
                .map(|(c, p)| {
                    let v = p.as_ref().map(|p| crate::schema::jsonpath::render(&crate::schema::jsonpath::eval(p, obj))).unwrap_or(Value::Null);
                    if c.type_ == "date" {
                        v.as_str()
                            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                            .map(|t| Value::String(human_duration((now - t.with_timezone(&chrono::Utc)).num_seconds())))
                            .unwrap_or(Value::String("<unknown>".into()))
                    } else {
                        v
                    }
                })
                .collect();
            let mut row = json!({"cells": cells});
            match include_object.unwrap_or("Metadata") {
                "None" => {}
                "Object" => row["object"] = obj.clone(),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
                    })
                }
            }
            row
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": defs, "rows": rows})
}

/// Kubernetes' human-readable age ("5s", "3m20s", "2d4h", ...).
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{h}h", hours / 24) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 { format!("{}y", hours / 24 / 365) } else { format!("{}y{d}d", hours / 24 / 365) };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(50 * 3600), "2d2h");
    }
}
