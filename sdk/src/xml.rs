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

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_markup_and_both_quotes() {
        assert_eq!(super::escape(r#"a<b>&'c'"d""#), "a&lt;b&gt;&amp;&apos;c&apos;&quot;d&quot;");
    }
}
