//! Text from outside (a receiver's answer, a Redis key name) made safe to
//! print in a log line or a table: no character can start a new line or
//! drive the terminal.

/// `text` with every control character (ESC, CR, LF, ...) and every
/// bidirectional formatting character written as a Rust escape (`\u{1b}`,
/// `\r`, `\n`), cut to `max_chars` characters of the original (`...`
/// marks the cut).
pub fn escape(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars.saturating_mul(2)));
    for (i, c) in text.chars().enumerate() {
        if i == max_chars {
            out.push_str("...");
            break;
        }
        if c.is_control() || is_bidi(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `url` with the user and password it carries replaced by `***`
/// (`redis://admin:hunter2@host:6379` -> `redis://***@host:6379`): every
/// URL written into a message, a log line or an audit entry goes
/// through it.
pub fn redact_url(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    match url[start..authority_end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_string(),
    }
}

/// The characters that reorder the text shown around them.
fn is_bidi(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_length_bounded() {
        let forged = "\x1b[31mFAKE\x1b[0m\r\n2026 INFO delivered \u{202e}x";
        let safe = escape(forged, 100);
        assert_eq!(
            safe,
            "\\u{1b}[31mFAKE\\u{1b}[0m\\r\\n2026 INFO delivered \\u{202e}x"
        );
        assert!(!safe.chars().any(|c| c.is_control()));
        assert_eq!(escape("héllo wörld", 5), "héllo...");
        assert_eq!(escape("plain", 5), "plain");
    }

    #[test]
    fn credentials_in_urls_are_redacted() {
        assert_eq!(
            redact_url("redis://admin:hunter2@127.0.0.1:16399"),
            "redis://***@127.0.0.1:16399"
        );
        assert_eq!(redact_url("redis://:pw@h/0"), "redis://***@h/0");
        assert_eq!(
            redact_url("https://u:p@hooks.test/x?to=a@b"),
            "https://***@hooks.test/x?to=a@b"
        );
        assert_eq!(redact_url("http://h:1/p@q"), "http://h:1/p@q");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
