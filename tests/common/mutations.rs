//! Corrupt payloads for the reliability suite: keys of every kind of
//! value the module stores, and deterministic mutations of their bytes.

use std::collections::HashSet;
use std::time::Duration;

use redis::Connection;

use super::call_ok;

/// Keys holding every kind of value the module stores, each set up by
/// its calls; returns the key names.
pub fn make_every_kind(con: &mut Connection, p: &str) -> Vec<String> {
    let kinds: &[(&str, &[&str])] = &[
        ("bucket", &["RL.TAKE {k} 10 1 100 COST 4"]),
        (
            "bucket-huge",
            &["RL.TAKE {k} 1000000000000000 1000000000 3 COST 999999999999"],
        ),
        (
            "strikes",
            &[
                "RL.TAKE {k} 1 1 100",
                "RL.TAKE {k} 1 1 100 STRIKES 5 100",
                "RL.TAKE {k} 1 1 100 STRIKES 5 100",
            ],
        ),
        (
            "timed-box",
            &[
                "RL.TAKE {k} 1 1 100",
                "RL.TAKE {k} 1 1 100 STRIKES 1 100 BOX 50 60 70 OFFENSES 1000",
            ],
        ),
        ("manual-box", &["RL.BOX TRIP {k} 3 0"]),
        ("offenses", &["RL.BOX TRIP {k} 1 10", "RL.BOX RELEASE {k}"]),
        (
            "sliding",
            &["RL.WINDOW {k} 10 100 COST 3", "RL.WINDOW {k} 10 100"],
        ),
        (
            "exact",
            &[
                "RL.WINDOW {k} 10 100 EXACT",
                "SLEEP",
                "RL.WINDOW {k} 10 100 EXACT COST 2",
                "SLEEP",
                "RL.WINDOW {k} 10 100 EXACT COST 3",
            ],
        ),
        ("fixed", &["RL.WINDOW {k} 10 100 FIXED COST 7"]),
        (
            "leases",
            &[
                "RL.LEASE ACQUIRE {k} 5 100 ID a",
                "RL.LEASE ACQUIRE {k} 5 100",
                "RL.LEASE ACQUIRE {k} 5 200 ID some-longer-lease-id",
            ],
        ),
        (
            "regional",
            &[
                "CONFIG SET rl.regions eu,us,ap",
                "CONFIG SET rl.region eu",
                "RL.QUOTA {k} 100 MONTH COST 3 REGION",
                "RL.QUOTA {k} 100 MONTH REFUND 1 REGION",
            ],
        ),
        (
            "everything",
            &[
                "RL.TAKE {k} 3 1 100 COST 3",
                "RL.TAKE {k} 3 1 100 STRIKES 3 100",
                "RL.WINDOW {k} 5 100 EXACT",
                "RL.LEASE ACQUIRE {k} 2 100 ID z",
                "RL.BOX TRIP {k} 2 100",
            ],
        ),
    ];
    let mut keys = Vec::new();
    for (name, calls) in kinds {
        let k = format!("{p}:{name}");
        for c in *calls {
            if *c == "SLEEP" {
                std::thread::sleep(Duration::from_millis(3));
            } else {
                call_ok(con, &c.replace("{k}", &k));
            }
        }
        keys.push(k);
    }
    keys
}

/// A small deterministic generator (SplitMix64).
pub struct Rng(u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// How a payload was made.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Mutation {
    /// A strict prefix of a valid payload.
    Truncated,
    /// One bit flipped.
    BitFlip,
    /// One byte set to one of the special values of `mutate`.
    ByteSet,
    /// Random multi-byte edits: overwrites, insertions, deletions, appends.
    Random,
}

/// Mutated variants of each of `bases`: every strict prefix, every bit
/// flipped, interesting bytes at every position, then random multi-byte
/// edits (overwrites, insertions, deletions, appends) until `total`
/// distinct payloads differ from every base.
pub fn mutate(bases: &[Vec<u8>], total: usize, seed: u64) -> Vec<(Mutation, Vec<u8>)> {
    let originals: HashSet<&Vec<u8>> = bases.iter().collect();
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut out = Vec::new();
    let mut push = |m: Mutation, v: Vec<u8>, out: &mut Vec<(Mutation, Vec<u8>)>| {
        if !originals.contains(&v) && seen.insert(v.clone()) {
            out.push((m, v));
        }
    };
    const SPECIAL: &[u8] = &[
        0x00, 0x01, 0x02, 0x03, 0x04, 0x7f, 0x80, 0x90, 0x9f, 0xa0, 0xc0, 0xc1, 0xc2, 0xc3, 0xcc,
        0xcd, 0xce, 0xcf, 0xd0, 0xd3, 0xdc, 0xdd, 0xff,
    ];
    for b in bases {
        for n in 0..b.len() {
            push(Mutation::Truncated, b[..n].to_vec(), &mut out);
        }
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut v = b.clone();
                v[i] ^= 1 << bit;
                push(Mutation::BitFlip, v, &mut out);
            }
            for &s in SPECIAL {
                let mut v = b.clone();
                v[i] = s;
                push(Mutation::ByteSet, v, &mut out);
            }
        }
    }
    let mut rng = Rng(seed);
    let mut attempts = 0;
    while out.len() < total && attempts < total * 20 {
        attempts += 1;
        let mut v = bases[rng.below(bases.len())].clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(5) {
                0 if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v[i] = rng.next() as u8;
                }
                1 => {
                    let i = rng.below(v.len() + 1);
                    v.insert(i, rng.next() as u8);
                }
                2 if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v.remove(i);
                }
                3 => {
                    for _ in 0..1 + rng.below(8) {
                        v.push(rng.next() as u8);
                    }
                }
                _ if v.len() > 2 => {
                    // Swap two bytes.
                    let (i, j) = (rng.below(v.len()), rng.below(v.len()));
                    v.swap(i, j);
                }
                _ => {}
            }
        }
        push(Mutation::Random, v, &mut out);
    }
    out
}

/// The newest payload version rl writes (a record holding regional
/// counts).
pub const PAYLOAD_VERSION: u8 = 7;

/// The first byte of a patch payload (the parts a call reached; applied
/// onto a key's own record, so not stored verbatim).
pub const PATCH_MARKER: u8 = 0xD0;

/// How many parts a payload of [`PAYLOAD_VERSION`] holds.
pub const PAYLOAD_PARTS: u8 = 7;

/// The version (and number of parts) every record without regional
/// counts is written in.
pub const PLAIN_VERSION: u8 = 6;

/// The oldest payload version whose parts have today's bytes: versions 4
/// to 7 hold their parts alike (a penalty with no retry recorded has the
/// same bytes in all).
pub const SAME_LAYOUT_SINCE: u8 = 4;

/// The bytes a payload is stored as: the same, except that a payload with
/// today's layout (from [`SAME_LAYOUT_SINCE`]) is stored in the oldest
/// version that holds its parts: [`PLAIN_VERSION`] unless its last part
/// (the regional counts) is there. Its version byte and array header say
/// so, with one MessagePack nil (`0xc0`) per part it lacks added, or its
/// trailing nils past that version's parts dropped.
pub fn as_current(payload: &[u8]) -> Vec<u8> {
    let mut p = payload.to_vec();
    let same_layout =
        (SAME_LAYOUT_SINCE..=PAYLOAD_VERSION).contains(&p.first().copied().unwrap_or(0));
    let Some(header @ 0x90..=0x9f) = p.get(1).copied() else {
        return p;
    };
    let parts = header & 0x0f;
    if !same_layout || parts > PAYLOAD_PARTS {
        return p;
    }
    // Which parts are there (a nil is absent); bytes that do not parse are
    // refused by the module whatever this says.
    let Ok(present) = rmp_serde::from_slice::<Vec<Option<serde::de::IgnoredAny>>>(&p[1..]) else {
        return p;
    };
    let last = present
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    let version = if last > usize::from(PLAIN_VERSION) {
        PAYLOAD_VERSION
    } else {
        PLAIN_VERSION
    };
    p[0] = version;
    p[1] = 0x90 | version;
    if parts > version {
        // trailing nils, one byte each
        p.truncate(p.len() - usize::from(parts - version));
    } else {
        p.extend(std::iter::repeat_n(0xc0, usize::from(version - parts)));
    }
    p
}

/// Appends Redis's RDB length encoding of `n` (the minimal form).
pub fn rdb_len(n: usize, out: &mut Vec<u8>) {
    if n < 64 {
        out.push(n as u8);
    } else if n < 16384 {
        out.extend_from_slice(&[0x40 | (n >> 8) as u8, n as u8]);
    } else {
        out.push(0x80);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// A `DUMP` body of a module value: type 7, the 9-byte module id, one
/// string (opcode 5) holding `payload` uncompressed, module EOF (0).
pub fn frame(type_and_id: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut v = type_and_id.to_vec();
    v.push(0x05);
    rdb_len(payload.len(), &mut v);
    v.extend_from_slice(payload);
    v.push(0x00);
    v
}

/// The inverse of [`frame`]: (type and module id, payload).
pub fn unframe(body: &[u8]) -> Option<(&[u8], &[u8])> {
    if body.len() < 13 || body[0] != 7 || body[1] != 0x81 || body[10] != 0x05 {
        return None;
    }
    let (len, at) = match body[11] >> 6 {
        0 => (usize::from(body[11] & 0x3f), 12),
        1 => (
            (usize::from(body[11] & 0x3f) << 8) | usize::from(body[12]),
            13,
        ),
        2 if body[11] == 0x80 && body.len() >= 16 => (
            u32::from_be_bytes(body[12..16].try_into().ok()?) as usize,
            16,
        ),
        _ => return None,
    };
    if body.len() != at + len + 1 || body[at + len] != 0 {
        return None;
    }
    Some((&body[..10], &body[at..at + len]))
}
