//! How `kubectl vm` prints: aligned tables like kubectl's, `-o json|yaml` (whole
//! objects), and colour only when stdout is a terminal.

use clap::ValueEnum;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Columns (the default).
    #[value(skip)]
    Table,
    /// More columns.
    Wide,
    Json,
    Yaml,
}

/// `-o json|yaml`: a List of `items` (or the one object when `list_kind` is empty).
pub fn structured<T: serde::Serialize>(format: Format, list_kind: &str, items: &T) -> anyhow::Result<Option<String>> {
    let value = if list_kind.is_empty() {
        serde_json::to_value(items)?
    } else {
        serde_json::json!({"apiVersion": "v1", "kind": list_kind, "items": items})
    };
    Ok(match format {
        Format::Json => Some(format!("{}\n", serde_json::to_string_pretty(&value)?)),
        Format::Yaml => Some(serde_yaml::to_string(&value)?),
        Format::Table | Format::Wide => None,
    })
}

/// Columns padded to their widest cell, three spaces apart.
pub fn table(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = std::iter::once(header.iter().map(|h| h.to_string()).collect()).chain(rows).collect();
    let visible = |s: &str| strip_ansi(s).chars().count();
    let widths: Vec<usize> = (0..header.len()).map(|i| rows.iter().map(|r| r.get(i).map_or(0, |c| visible(c))).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(widths[i] - visible(cell) + 3));
            }
        }
        out.push('\n');
    }
    out
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut in_escape = false;
    for c in s.chars() {
        match (in_escape, c) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

/// `5s`, `3m`, `2h`, `4d`, as kubectl shows ages.
/// A Provider's recent health, from its status: `Ready, 3 of 120 operations failed in the last
/// 10m (last: create unavailable 2m ago: …)`.
pub fn provider_health(p: &banlieue_api::Provider) -> String {
    let status = p.status.clone().unwrap_or_default();
    let ready = match status.conditions.iter().find(|c| c.type_ == "Ready") {
        Some(c) if c.status == "True" => format!("Ready for {}", age(Some(&c.last_transition_time))),
        Some(c) => format!("not Ready for {} ({})", age(Some(&c.last_transition_time)), c.reason),
        None => "not probed yet".to_string(),
    };
    let Some(ops) = status.operations else { return format!("{ready}, no operations yet") };
    let mut out = format!("{ready}, {} of {} operations failed in the last {}m", ops.errors, ops.calls, ops.window_seconds / 60);
    if let Some(e) = ops.last_error {
        out.push_str(&format!(" (last: {} {} {} ago: {})", e.operation, e.reason, age(Some(&e.time)), e.message));
    }
    out
}

pub fn age(t: Option<&Time>) -> String {
    let Some(t) = t else { return "<unknown>".into() };
    let secs = k8s_openapi::jiff::Timestamp::now().duration_since(t.0).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Colour for a terminal; plain text otherwise.
#[derive(Clone, Copy)]
pub struct Paint {
    on: bool,
}

impl Paint {
    pub fn new(on: bool) -> Paint {
        Paint { on }
    }

    fn colour(self, code: &str, text: &str) -> String {
        if self.on { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_string() }
    }

    /// A condition status: True green, False red, anything else yellow.
    pub fn status(self, status: &str) -> String {
        match status {
            "True" => self.colour("32", status),
            "False" => self.colour("31", status),
            other => self.colour("33", other),
        }
    }

    /// An event type: Warning yellow.
    pub fn event(self, kind: &str) -> String {
        if kind == "Warning" { self.colour("33", kind) } else { kind.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_without_counting_colour_codes() {
        let paint = Paint::new(true);
        let out = table(&["NAME", "READY"], vec![vec!["web".into(), paint.status("True")], vec!["database".into(), paint.status("False")]].into_iter());
        let plain = strip_ansi(&out);
        assert_eq!(plain, "NAME       READY\nweb        True\ndatabase   False\n");
    }
}
