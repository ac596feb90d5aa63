//! The response fields Envoy adds: `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers, in the same form as rl's gateway
//! sends them), `Retry-After` on `OVER_LIMIT`, and optionally the peer's
//! legacy `X-RateLimit-Limit` / `-Remaining` / `-Reset`.

/// Whole seconds from milliseconds, rounded up (clients are never early).
pub fn seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Appends a structured-field String: `"..."` with `\` and `"` escaped;
/// bytes outside printable ASCII (which a String cannot hold) become `?`.
fn push_sf_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' | '"' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

/// One policy of `RateLimit-Policy`: `"name";q=quota;w=window`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The policy's name.
    pub name: String,
    /// Requests per window.
    pub quota: u64,
    /// The window in seconds.
    pub window: u64,
}

/// The `RateLimit-Policy` value: the policies, once each, in order.
pub fn policy_field(policies: &[Policy]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(policies.len() * 48);
    for (i, p) in policies.iter().enumerate() {
        if policies[..i].iter().any(|q| q.name == p.name) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        push_sf_string(&mut out, &p.name);
        let _ = write!(out, ";q={};w={}", p.quota, p.window);
    }
    out
}

/// The `RateLimit` value of the binding policy: `r` points left, `t`
/// seconds until its quota is back (none for a penalty box).
pub fn ratelimit_field(name: &str, remaining: u64, reset_s: Option<u64>) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(name.len() + 32);
    push_sf_string(&mut out, name);
    let _ = write!(out, ";r={remaining}");
    if let Some(t) = reset_s {
        let _ = write!(out, ";t={t}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let p = [
            Policy {
                name: "per-ip".into(),
                quota: 10,
                window: 60,
            },
            Policy {
                name: "a\"b\\c\u{e9}".into(),
                quota: 5,
                window: 1,
            },
            Policy {
                name: "per-ip".into(),
                quota: 10,
                window: 60,
            },
        ];
        assert_eq!(
            policy_field(&p),
            r#""per-ip";q=10;w=60, "a\"b\\c?";q=5;w=1"#
        );
        assert_eq!(
            ratelimit_field("per-ip", 3, Some(42)),
            r#""per-ip";r=3;t=42"#
        );
        assert_eq!(ratelimit_field("box", 0, None), r#""box";r=0"#);
        assert_eq!(seconds(0), 0);
        assert_eq!(seconds(1), 1);
        assert_eq!(seconds(1000), 1);
        assert_eq!(seconds(1001), 2);
    }
}
