//! XML text for drivers that speak XML (libvirt domain XML, vim25 SOAP).

/// Escape `s` for XML character data and for attribute values in either quote style.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// The text `escape` (or any XML writer) made from `s`: the five predefined entities and
/// numeric character references; anything else is left as written.
pub fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(end) = rest.find(';').filter(|&e| e <= 12) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let entity = &rest[1..end];
        let c = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "apos" => Some('\''),
            "quot" => Some('"'),
            _ => entity
                .strip_prefix("#x")
                .map(|h| u32::from_str_radix(h, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse))
                .and_then(|n| n.ok())
                .and_then(char::from_u32),
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn unescape_undoes_escape_and_reads_character_references() {
        let s = r#"a<b>&'c'"d" &amp; é"#;
        assert_eq!(super::unescape(&super::escape(s)), s);
        assert_eq!(super::unescape("&#233;&#xE9; &unknown; & alone"), "éé &unknown; & alone");
    }

    #[test]
    fn escapes_markup_and_both_quotes() {
        assert_eq!(super::escape(r#"a<b>&'c'"d""#), "a&lt;b&gt;&amp;&apos;c&apos;&quot;d&quot;");
    }
}
