//! `RL.DISTINCT` against a naive model: every member ever recorded with
//! its last sighting, no memory bound. For any sequence of calls (time
//! moving forward, members from a small alphabet so they repeat), the
//! decision agrees with the model's counted set (the member plus the
//! `limit` most recent other members that still count), `PEEK` changes
//! nothing, and a key never keeps more than `limit + 1` members. And the
//! replication of a recording call: its patch carries only the member and
//! what was trimmed, and replayed on the replica's record (the master's
//! before the call) gives the master's bytes.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::distinct::{decide, member_hash, Distinct, DistinctCall, DistinctState};
use super::patch::{decode_patch, encode_patch_append};
use super::record::Holds;
use super::testkit::{config, decode, encode, Millis, Penalty, Record, Status, T0};

/// The model: last sighting of every member recorded.
#[derive(Default)]
struct Model {
    seen: BTreeMap<u8, Millis>,
}

impl Model {
    /// `(status, remaining, reset_ms, retry_after_ms)` of member `m` at `now`.
    fn read(&self, d: &Distinct, m: u8, now: Millis) -> (Status, i64, i64, i64) {
        let cut = now - d.window_ms as i64;
        let mut others: Vec<Millis> = self
            .seen
            .iter()
            .filter(|&(&k, &s)| k != m && s > cut)
            .map(|(_, &s)| s)
            .collect();
        others.sort_unstable_by(|a, b| b.cmp(a));
        others.truncate(d.limit as usize);
        let count = others.len() as u64 + 1;
        let oldest = others.last().copied().unwrap_or(now).min(now);
        let reset = oldest + d.window_ms as i64 - now;
        let allowed = count <= d.limit;
        (
            if allowed {
                Status::Allowed
            } else {
                Status::Throttled
            },
            d.limit.saturating_sub(count) as i64,
            reset,
            if allowed { 0 } else { reset },
        )
    }
}

/// One call: how far the clock moves first, the member, whether a `PEEK`.
fn step() -> impl Strategy<Value = (i64, u8, bool)> {
    (
        prop_oneof![Just(0i64), 0i64..50, 0i64..2_000],
        0u8..12,
        prop::bool::weighted(0.2),
    )
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn decisions_match_a_naive_set(
        limit in 1u64..6,
        window_ms in 1u64..3_000,
        steps in prop::collection::vec(step(), 1..80),
    ) {
        let d = Distinct { limit, window_ms };
        let mut slot: Option<Box<DistinctState>> = None;
        let mut penalty = Penalty::default();
        let mut model = Model::default();
        let mut now = T0;
        for (dt, m, peek) in steps {
            now += dt;
            let call = DistinctCall {
                distinct: d,
                member: member_hash(&[m]),
                peek,
                trip: None,
            };
            let before = slot.clone();
            let (got, fx) = decide(&mut slot, &mut penalty, &call, now);
            let expected = model.read(&d, m, now);
            let wire = (
                got.status,
                got.remaining,
                got.reset.as_ms().map_or(-1, |v| v as i64),
                got.retry_after.as_ms().map_or(-1, |v| v as i64),
            );
            prop_assert_eq!(wire, expected, "member {} at +{}", m, now - T0);
            prop_assert_eq!((got.limit, got.box_level, got.strikes_remaining), (limit, 0, None));
            if peek {
                prop_assert_eq!(&slot, &before, "PEEK writes nothing");
                prop_assert!(!fx.state);
            } else {
                model.seen.insert(m, now);
                prop_assert!(fx.state);
            }
            if let Some(state) = slot.as_deref() {
                prop_assert!(state.len() as u64 <= limit + 1, "memory bound");
            }
            prop_assert_eq!(penalty, Penalty::default());
        }
        // What is kept survives its encoding.
        if let Some(state) = slot {
            let mut record = Record::default();
            record.set_part(Some(state));
            let back = decode(&encode(&record)).expect("decodes");
            prop_assert_eq!(back, record);
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn a_recording_call_replicates_its_change_to_the_same_bytes(
        calls in prop::collection::vec((1u64..6, 1u64..3_000, step()), 1..60),
    ) {
        // The master's record as committed, and the replica's copy.
        let mut master = Record::default();
        let mut replica = Record::default();
        let mut penalty = Penalty::default();
        let mut now = T0;
        for (limit, window_ms, (dt, m, peek)) in calls {
            now += dt;
            let call = DistinctCall {
                distinct: Distinct { limit, window_ms },
                member: member_hash(&[m]),
                peek,
                trip: None,
            };
            let existed = master.part::<Box<DistinctState>>().is_some();
            let mut fresh = None;
            let slot = Holds::<Box<DistinctState>>::slot(&mut master).unwrap_or(&mut fresh);
            let (_, fx) = decide(slot, &mut penalty, &call, now);
            if !fx.state {
                continue;
            }
            if let Some(state) = fresh {
                master.set_part(Some(state));
            }
            // What `Call::commit` does with a key it did not create.
            master.prune(now);
            let plan = master.patch_plan(now);
            prop_assert_eq!(plan.distinct.is_some(), existed, "a change once the set exists");
            let mut bytes = Vec::new();
            encode_patch_append(&master, &plan, now, &mut bytes);
            master.clear_touched();
            if existed {
                let trimmed = plan.distinct.as_ref().map_or(0, |c| c.trimmed.len());
                prop_assert!(bytes.len() <= 48 + 9 * trimmed, "{} bytes", bytes.len());
            }
            let patch = decode_patch(&bytes, now).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            replica = patch.apply_onto(replica);
            prop_assert_eq!(encode(&replica), encode(&master), "at +{}", now - T0);
        }
    }
}
