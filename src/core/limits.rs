//! Bounds on every number a caller can give. Keeping inputs inside these
//! bounds is what lets the core do exact integer arithmetic in `i128`
//! without overflow (see the module docs of [`crate::core::bucket`]).

/// Largest capacity, token count or cost accepted (10^15 points).
pub const MAX_POINTS: u64 = 1_000_000_000_000_000;

/// Largest duration accepted for any argument given in seconds: 100 years,
/// in milliseconds.
pub const MAX_DURATION_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// Largest strike threshold accepted.
pub const MAX_THRESHOLD: u64 = 1_000_000_000;

/// Most buckets one `RL.TAKE` call may name: the first key plus 15 `ALSO`.
pub const MAX_BUCKETS: usize = 16;

/// Largest box level.
pub const MAX_BOX_LEVEL: u8 = 3;

/// Default offense memory, `OFFENSES 86400`.
pub const DEFAULT_OFFENSES_TTL_MS: u64 = 86_400_000;

/// Default box durations, `BOX 300 3600 86400`.
pub const DEFAULT_BOX_MS: [u64; 3] = [300_000, 3_600_000, 86_400_000];

/// Most leases one key may hold at once (`max` above it is an error).
pub const MAX_LEASES: u64 = 1_000;

/// Longest lease id accepted with `ID` (bytes).
pub const MAX_LEASE_ID_LEN: usize = 128;

/// Largest `limit` accepted by `RL.WINDOW ... EXACT`: a sliding log holds at
/// most one entry per point it counts, so this bounds its length (and its
/// encoding, a few bytes per entry).
pub const MAX_EXACT_LIMIT: u64 = 10_000;

/// Largest `limit` accepted by `RL.DISTINCT`: a key keeps at most
/// `limit + 1` members (16 bytes each in its payload), so this bounds its
/// memory and its encoding (about 190 KB).
pub const MAX_DISTINCT_LIMIT: u64 = 10_000;
