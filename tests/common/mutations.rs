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

/// The payload version rl writes today.
pub const PAYLOAD_VERSION: u8 = 5;

/// The first byte of a patch payload (the parts a call reached; applied
/// onto a key's own record, so not stored verbatim).
pub const PATCH_MARKER: u8 = 0xD0;

/// The bytes a payload is stored as: the same, except that a payload of
/// version 4 (the layout of version 5 when no refusal's retry is recorded)
/// is stored again under version 5.
pub fn as_current(payload: &[u8]) -> Vec<u8> {
    let mut p = payload.to_vec();
    if p.first() == Some(&(PAYLOAD_VERSION - 1)) {
        p[0] = PAYLOAD_VERSION;
    }
    p
}
