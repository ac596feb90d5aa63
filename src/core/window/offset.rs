//! Where a key's windows begin: the boundary offset of [`key_offset`],
//! from the key's bytes alone, the same on every server.

/// The boundary offset of `key` for windows of `window_ms`, in
/// `0..window_ms` (0 when `window_ms <= 1`). A fixed algorithm, never a
/// randomized hasher, so a master, its replicas and every restart agree:
///
/// 1. `h` = the 64-bit FNV-1a hash of the key's bytes (offset basis
///    `0xcbf29ce484222325`, prime `0x100000001b3`);
/// 2. `h` = MurmurHash3's `fmix64` finalizer of `h` (`h ^= h >> 33;
///    h *= 0xff51afd7ed558ccd; h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53;
///    h ^= h >> 33`, wrapping), so that keys differing in one byte (`key:7`,
///    `key:8`) land far apart;
/// 3. the offset is `(h * window_ms) >> 64` (128-bit product).
pub fn key_offset(key: &[u8], window_ms: u64) -> u64 {
    let scaled = (u128::from(fmix64(fnv1a_64(key))) * u128::from(window_ms)) >> 64;
    // Below `window_ms`, which is a u64.
    u64::try_from(scaled).unwrap_or(0)
}

/// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The 64-bit FNV-1a hash (also what `RL.DISTINCT` keeps a member as).
/// Eight bytes a step (each step unrolled: one load, xor and multiply a
/// byte), then the rest one by one; the same hash as a byte-by-byte fold.
#[inline]
pub(crate) fn fnv1a_64(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let step = |h: u64, b: u8| (h ^ u64::from(b)).wrapping_mul(PRIME);
    let mut chunks = bytes.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325;
    for chunk in &mut chunks {
        for &b in chunk {
            h = step(h, b);
        }
    }
    chunks.remainder().iter().fold(h, |h, &b| step(h, b))
}
