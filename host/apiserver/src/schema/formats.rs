//! String and number `format`s as kube-apiserver checks them.

use super::*;

fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0u32, |a, d| a * 10 + u32::from(d - b'0')))
}

/// `YYYY-MM-DD` with real calendar bounds.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let (Some(y), Some(m), Some(d)) = (digits(&b[0..4]), digits(&b[5..7]), digits(&b[8..10]))
    else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

/// RFC 3339 date-time: `2006-01-02T15:04:05[.frac](Z|+07:00)`.
fn is_date_time(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 20
        || !s.is_char_boundary(10)
        || !is_date(&s[..10])
        || !matches!(b[10], b'T' | b't')
    {
        return false;
    }
    let t = &b[11..];
    if t.len() < 9 || t[2] != b':' || t[5] != b':' {
        return false;
    }
    let (Some(h), Some(mi), Some(sec)) = (digits(&t[0..2]), digits(&t[3..5]), digits(&t[6..8]))
    else {
        return false;
    };
    if h > 23 || mi > 59 || sec > 60 {
        return false;
    }
    let mut rest = &t[8..];
    if rest.first() == Some(&b'.') {
        let n = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return false;
        }
        rest = &rest[1 + n..];
    }
    match rest {
        [b'Z'] | [b'z'] => true,
        [sign, h1, h2, b':', m1, m2] if *sign == b'+' || *sign == b'-' => {
            matches!((digits(&[*h1, *h2]), digits(&[*m1, *m2])), (Some(h), Some(m)) if h <= 23 && m <= 59)
        }
        _ => false,
    }
}

/// Standard (padded) base64, as Go's `base64.StdEncoding` accepts it; line
/// breaks are ignored like Go does.
fn is_base64(s: &str) -> bool {
    let b: Vec<u8> = s.bytes().filter(|c| *c != b'\r' && *c != b'\n').collect();
    if !b.len().is_multiple_of(4) {
        return false;
    }
    let pad = b.iter().rev().take_while(|c| **c == b'=').count();
    if pad > 2 {
        return false;
    }
    b[..b.len() - pad]
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
}

/// Deliberately loose: Go's url.Parse accepts nearly anything, so only
/// reject empty strings, whitespace and control characters.
fn is_uri(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Some(bits) = digits(bits.as_bytes()) else {
        return false;
    };
    if ip.parse::<std::net::Ipv4Addr>().is_ok() {
        bits <= 32
    } else if ip.parse::<std::net::Ipv6Addr>().is_ok() {
        bits <= 128
    } else {
        false
    }
}

/// `Some(ok)` for formats we know on strings, `None` for unknown formats
/// (Kubernetes ignores unknown formats too).
pub(super) fn string_format_ok(format: &str, s: &str) -> Option<bool> {
    Some(match format {
        "date-time" | "datetime" => is_date_time(s),
        "date" => is_date(s),
        "byte" => is_base64(s),
        "uri" => is_uri(s),
        "uuid" => is_uuid(s),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(s),
        _ => return None,
    })
}

pub(super) fn number_format_ok(format: &str, v: &Value) -> Option<bool> {
    let range = match format {
        "int32" => (i32::MIN as f64, i32::MAX as f64),
        "int64" => (i64::MIN as f64, i64::MAX as f64),
        _ => return None,
    };
    if !is_integer(v) {
        return Some(false);
    }
    if let Value::Number(n) = v {
        if let Some(i) = n.as_i64() {
            return Some(format != "int32" || i32::try_from(i).is_ok());
        }
        if n.is_u64() {
            return Some(false); // larger than i64::MAX
        }
        let f = n.as_f64().unwrap_or(f64::NAN);
        return Some(f >= range.0 && f <= range.1);
    }
    Some(false)
}
