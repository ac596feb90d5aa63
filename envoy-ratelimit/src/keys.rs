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
/// with [`HashTag::FirstEntry`], the first entry, `}` and `%` escaped so
/// that the tag is never cut short.
pub fn tag(mode: HashTag, domain: &str, entries: &[(&str, &str)]) -> String {
    let mut t = escape(domain);
    if let (HashTag::FirstEntry, Some((k, v))) = (mode, entries.first()) {
        t.push('|');
        t.push_str(&escape(k));
        t.push('_');
        t.push_str(&escape(v));
    }
    t
}

fn escape(s: &str) -> String {
    s.replace('%', "%25").replace('}', "%7D")
}

/// The key of one rule of a descriptor, before the fixed window's start and
/// salt: `<prefix>{<tag>}<rest>:<rule><algorithm letter><unit seconds>`,
/// `rest` being `.key_value` for each entry not in the tag.
pub fn base_key(
    prefix: &str,
    mode: HashTag,
    domain: &str,
    entries: &[(&str, &str)],
    rule: &str,
) -> String {
    let mut k = format!("{prefix}{{{}}}", tag(mode, domain, entries));
    let skip = usize::from(mode == HashTag::FirstEntry);
    for (key, value) in entries.iter().skip(skip) {
        k.push('.');
        k.push_str(key);
        if !value.is_empty() {
            k.push('_');
            k.push_str(value);
        }
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
    let u = unit.seconds() * 1000;
    let w = fixed_window_ms(unit);
    let from = (start_s * 1000).saturating_sub(u / 2);
    let to = start_s * 1000 + u + u / 2; // exclusive
    let plain = format!("{base}:{start_s}");
    for salt in 0..MAX_SALT {
        let key = if salt == 0 {
            plain.clone()
        } else {
            format!("{plain}~{salt}")
        };
        let off = key_offset(key.as_bytes(), w);
        // windows are [off + k w, off + (k + 1) w)
        let first = (from + w - off % w) / w;
        let last = (to - 1 + w - off % w) / w;
        if first == last {
            return key;
        }
    }
    plain
}

/// rl's per-key boundary offset of a window of `window_ms` (the module's
/// documented function: FNV-1a 64, MurmurHash3's fmix64, scaled).
pub fn key_offset(key: &[u8], window_ms: u64) -> u64 {
    let mut h = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
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
        assert_eq!(
            base_key("rl:", HashTag::FirstEntry, "d", &e, "0f60"),
            "rl:{d|remote_address_10.0.0.1}.path_/a}b:0f60"
        );
        assert_eq!(
            base_key("rl:", HashTag::Domain, "d%}", &e[..1], "0t1"),
            "rl:{d%25%7D}.remote_address_10.0.0.1:0t1"
        );
        assert_eq!(tag(HashTag::FirstEntry, "d", &[("k", "}")]), "d|k_%7D");
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
    fn offset_matches_the_module_reference() {
        // FNV-1a 64 of "" is its offset basis; a window of 1 ms has offset 0
        assert_eq!(key_offset(b"", 1), 0);
        assert!(key_offset(b"abc", 60_000) < 60_000);
    }
}
