//! Redis key names and the alignment of the peer's fixed windows.
//!
//! envoyproxy/ratelimit counts a fixed window `[S, S + unit)` with
//! `S = now - now % unit` (Unix seconds): every key of a unit resets at the
//! same instant. rl's `RL.WINDOW ... FIXED` shifts each key's boundaries by
//! an offset derived from the key's bytes. To count the peer's windows
//! exactly, a key carries its window start `S` (a new key each window, as in
//! the peer) and is counted in an rl fixed window of `4 × unit` whose
//! boundaries fall outside `[S - unit/2, S + 1.5 × unit)`: the key name
//! ends in a salt `~n` (the first `n` in 0, 1, 2, ... that qualifies, each
//! qualifying with probability 1/2), so the count of `[S, S + unit)` never
//! resets, even with half a unit of skew between this host's clock and
//! Redis's. The salt is a fixed function of the name, the same in every
//! instance of the service.

use crate::config::Unit;

/// How keys are grouped into Redis Cluster hash slots (the `{...}` tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HashTag {
    /// `{domain|first entry}`: a request's descriptors that start with the
    /// same entry (e.g. `remote_address`) share a slot; the load spreads
    /// over the cluster by that entry's value.
    FirstEntry,
    /// `{domain}`: every descriptor of a domain in one slot, so every
    /// request is decided in one atomic call; one slot per domain.
    Domain,
}

/// The hash tag's text for a descriptor (without braces): the domain and,
/// with [`HashTag::FirstEntry`], `|` and the first entry as `key_value`.
/// `%` and `}` are escaped everywhere (the tag is never cut short), `|` in
/// the domain and `_` in the value, so that distinct descriptors never
/// share a tag.
pub fn tag(mode: HashTag, domain: &str, entries: &[(&str, &str)]) -> String {
    let mut t = String::with_capacity(domain.len() + 32);
    match (mode, entries.first()) {
        (HashTag::FirstEntry, Some((k, v))) => {
            push_escaped(&mut t, domain, &['}', '|']);
            t.push('|');
            push_escaped(&mut t, k, &['}']);
            t.push('_');
            push_escaped(&mut t, v, &['}', '_']);
        }
        _ => push_escaped(&mut t, domain, &['}']),
    }
    t
}

/// Appends `s` with `%` and each of `special` as `%XX` (hexadecimal).
fn push_escaped(out: &mut String, s: &str, special: &[char]) {
    if !s.contains(|c| c == '%' || special.contains(&c)) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        if c == '%' || special.contains(&c) {
            // the special characters are ASCII: one byte, two digits
            out.push_str(&format!("%{:02X}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
}

/// The key of one rule of a descriptor, before the fixed window's start and
/// salt: `<prefix>{<tag>}<rest>:<rule>`, `tag` being [`tag`]'s for the
/// descriptor and `rest` `.key_value` for each entry not in the tag (`.key_`
/// for an empty value). Keys escape `%` and `.`, values `%` and `_`, so that
/// the entries can be read back from the right: a value runs from its
/// entry's last `_` and a key from the `.` before it.
pub fn base_key(
    prefix: &str,
    mode: HashTag,
    tag: &str,
    entries: &[(&str, &str)],
    rule: &str,
) -> String {
    let mut k = String::with_capacity(prefix.len() + tag.len() + rule.len() + 48);
    k.push_str(prefix);
    k.push('{');
    k.push_str(tag);
    k.push('}');
    let skip = usize::from(mode == HashTag::FirstEntry);
    for (key, value) in entries.iter().skip(skip) {
        k.push('.');
        push_escaped(&mut k, key, &['.']);
        k.push('_');
        push_escaped(&mut k, value, &['_']);
    }
    k.push(':');
    k.push_str(rule);
    k
}

/// The peer's window start for `now_ms`: Unix seconds truncated to the unit.
pub fn window_start(now_ms: u64, unit: Unit) -> u64 {
    let now = now_ms / 1000;
    now - now % unit.seconds()
}

/// Milliseconds from `now_ms` to the end of the peer's window.
pub fn until_window_end(now_ms: u64, unit: Unit) -> u64 {
    (window_start(now_ms, unit) + unit.seconds()) * 1000 - now_ms
}

/// The rl window length (ms) that counts a peer window of `unit`.
pub fn fixed_window_ms(unit: Unit) -> u64 {
    4 * unit.seconds() * 1000
}

/// Bounded search for the salt; the chance that none of them qualifies is
/// 2^-64.
const MAX_SALT: u32 = 64;

/// The key counting the peer window starting at `start_s` (seconds): `base`
/// with `:<start>` and, when needed, `~<salt>`, so that rl's fixed window of
/// [`fixed_window_ms`] holds `[start - unit/2, start + 1.5 unit)` (see the
/// module's documentation).
pub fn aligned_key(base: &str, start_s: u64, unit: Unit) -> String {
    use std::fmt::Write;
    let u = unit.seconds() * 1000;
    let w = fixed_window_ms(unit);
    let from = (start_s * 1000).saturating_sub(u / 2);
    let to = start_s * 1000 + u + u / 2; // exclusive
    let mut key = String::with_capacity(base.len() + 24);
    key.push_str(base);
    let _ = write!(key, ":{start_s}");
    let plain = fnv1a(FNV_BASIS, key.as_bytes());
    let mut salt_text = String::with_capacity(4);
    for salt in 0..MAX_SALT {
        let h = if salt == 0 {
            plain
        } else {
            salt_text.clear();
            let _ = write!(salt_text, "~{salt}");
            fnv1a(plain, salt_text.as_bytes())
        };
        let off = offset_of_hash(h, w);
        // windows are [off + k w, off + (k + 1) w)
        let first = (from + w - off % w) / w;
        let last = (to - 1 + w - off % w) / w;
        if first == last {
            key.push_str(&salt_text);
            return key;
        }
    }
    key
}

const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a 64 of `bytes`, continuing from the state `h`.
fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// rl's per-key boundary offset of a window of `window_ms` (the module's
/// documented function: FNV-1a 64, MurmurHash3's fmix64, scaled).
pub fn key_offset(key: &[u8], window_ms: u64) -> u64 {
    offset_of_hash(fnv1a(FNV_BASIS, key), window_ms)
}

/// The offset from a key's FNV-1a 64 hash: fmix64, scaled to the window.
fn offset_of_hash(mut h: u64, window_ms: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    u64::try_from((u128::from(h) * u128::from(window_ms)) >> 64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_keys() {
        let e = [("remote_address", "10.0.0.1"), ("path", "/a}b")];
        let first = tag(HashTag::FirstEntry, "d", &e);
        assert_eq!(
            base_key("rl:", HashTag::FirstEntry, &first, &e, "0f60"),
            "rl:{d|remote_address_10.0.0.1}.path_/a}b:0f60"
        );
        let domain = tag(HashTag::Domain, "d%}", &e[..1]);
        assert_eq!(
            base_key("rl:", HashTag::Domain, &domain, &e[..1], "0t1"),
            "rl:{d%25%7D}.remote_address_10.0.0.1:0t1"
        );
        assert_eq!(tag(HashTag::FirstEntry, "d", &[("k", "}")]), "d|k_%7D");
    }

    /// Distinct descriptors never share a key: an entry's value cannot
    /// pose as more entries, nor a domain as a first entry.
    #[test]
    fn keys_are_unambiguous() {
        let key = |mode, domain: &str, e: &[(&str, &str)]| {
            base_key("rl:", mode, &tag(mode, domain, e), e, "0f60")
        };
        for mode in [HashTag::FirstEntry, HashTag::Domain] {
            type Entries<'a> = &'a [(&'a str, &'a str)];
            let pairs: [(Entries, Entries); 4] = [
                (
                    &[("ip", "1"), ("user", "bob.path_/login")],
                    &[("ip", "1"), ("user", "bob"), ("path", "/login")],
                ),
                (&[("ip", "1"), ("a_b", "")], &[("ip", "1"), ("a", "b")]),
                (
                    &[("ip", "1"), ("a", "b.c")],
                    &[("ip", "1"), ("a", "b"), ("c", "")],
                ),
                (&[("ip", "1"), ("a", "%2E")], &[("ip", "1"), ("a", ".")]),
            ];
            for (a, b) in pairs {
                assert_ne!(key(mode, "d", a), key(mode, "d", b), "{a:?} {b:?}");
            }
        }
        let f = HashTag::FirstEntry;
        assert_ne!(key(f, "d", &[("k_x", "y")]), key(f, "d", &[("k", "x_y")]));
        assert_ne!(key(f, "d|k", &[("x", "y")]), key(f, "d", &[("k|x", "y")]));
        // keys without those characters keep their names
        assert_eq!(
            key(f, "d", &[("remote_address", "10.0.0.1"), ("path", "/a")]),
            "rl:{d|remote_address_10.0.0.1}.path_/a:0f60"
        );
    }

    #[test]
    fn windows_start_at_the_unit() {
        assert_eq!(window_start(1_700_000_123_456, Unit::Minute), 1_700_000_100);
        assert_eq!(until_window_end(1_700_000_123_456, Unit::Minute), 36_544);
        assert_eq!(window_start(86_400_000 * 3 + 5, Unit::Day), 86_400 * 3);
    }

    #[test]
    fn aligned_keys_hold_the_whole_window() {
        for unit in [Unit::Second, Unit::Minute, Unit::Hour, Unit::Year] {
            let u = unit.seconds();
            for i in 0..200u64 {
                let start = (1_700_000_000 / u + i) * u;
                let key = aligned_key(&format!("rl:{{d}}.k_{i}:0f"), start, unit);
                let w = fixed_window_ms(unit);
                let off = key_offset(key.as_bytes(), w);
                // the rl window holding start - u/2 also holds start + 1.5 u - 1 ms
                let lo = start * 1000 - u * 500;
                let hi = start * 1000 + u * 1500 - 1;
                assert_eq!((lo + w - off) / w, (hi + w - off) / w, "{key} offset {off}");
            }
        }
    }

    #[test]
    fn aligned_keys_take_the_first_salt_that_qualifies() {
        // the search as the definition reads: format each candidate, hash it
        let reference = |base: &str, start: u64, unit: Unit| {
            let (u, w) = (unit.seconds() * 1000, fixed_window_ms(unit));
            let (from, to) = (start * 1000 - u / 2, start * 1000 + u + u / 2);
            (0..MAX_SALT)
                .map(|s| match s {
                    0 => format!("{base}:{start}"),
                    _ => format!("{base}:{start}~{s}"),
                })
                .find(|k| {
                    let off = key_offset(k.as_bytes(), w);
                    (from + w - off % w) / w == (to - 1 + w - off % w) / w
                })
                .unwrap_or_else(|| format!("{base}:{start}"))
        };
        let mut salted = 0;
        for unit in [Unit::Second, Unit::Minute, Unit::Day] {
            for i in 0..300u64 {
                let base = format!("rl-envoy:{{bench|generic_key_{i}}}:0f{}", unit.seconds());
                let start = (1_700_000_000 / unit.seconds() + i) * unit.seconds();
                let key = aligned_key(&base, start, unit);
                assert_eq!(key, reference(&base, start, unit));
                salted += usize::from(key.contains('~'));
            }
        }
        assert!(salted > 100, "{salted} salted keys");
    }

    #[test]
    fn offset_matches_the_module_reference() {
        // FNV-1a 64 of "" is its offset basis; a window of 1 ms has offset 0
        assert_eq!(key_offset(b"", 1), 0);
        assert!(key_offset(b"abc", 60_000) < 60_000);
    }
}
