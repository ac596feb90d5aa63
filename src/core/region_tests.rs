use super::*;
use crate::core::codec::{decode, decode_loaded, encode};
use crate::core::quota::days_from_civil;

const DAY_MS: i64 = 86_400_000;

fn name(s: &str) -> RegionName {
    RegionName::new(s.as_bytes()).expect("a valid name")
}

fn comp(region: &str, added: u64, refunded: u64) -> Component {
    Component {
        region: name(region),
        added,
        refunded,
    }
}

/// 2026-06-15 12:00 UTC, and the end of its month.
fn now() -> Millis {
    days_from_civil(2026, 6, 15) * DAY_MS + 12 * 3_600_000
}

fn june_end() -> Millis {
    days_from_civil(2026, 7, 1) * DAY_MS
}

fn monthly(limit: u64, local: &str) -> RegionalQuota {
    RegionalQuota {
        quota: Quota {
            limit,
            period: Period::Month,
        },
        local: name(local),
    }
}

#[test]
fn names_and_lists() {
    assert!(RegionName::new(b"eu-west_1").is_some());
    for bad in [&b""[..], b"eu west", b"eu.1", &[b'a'; 33], "é".as_bytes()] {
        assert!(RegionName::new(bad).is_none(), "{bad:?}");
    }
    assert!(RegionName::new(&[b'a'; 32]).is_some());
    let list = parse_region_list(b"eu,us,ap").expect("valid");
    assert_eq!(list.as_slice(), &[name("eu"), name("us"), name("ap")]);
    assert!(parse_region_list(b"").expect("empty").is_empty());
    assert_eq!(parse_region_list(b"eu,,us"), Err(RegionListError::BadName));
    assert_eq!(
        parse_region_list(b"eu,us,eu"),
        Err(RegionListError::Repeated)
    );
    let seventeen: Vec<String> = (0..17).map(|i| format!("r{i}")).collect();
    assert_eq!(
        parse_region_list(seventeen.join(",").as_bytes()),
        Err(RegionListError::TooMany)
    );
    assert!(name("ap") < name("eu") && name("eu") < name("eu1"));
}

#[test]
fn a_call_charges_the_local_component_and_decides_on_the_total() {
    let q = monthly(100, "eu");
    let mut state = None;
    let seen = q.see(None, now());
    assert_eq!(
        seen,
        QuotaSeen {
            count: 0,
            end: june_end()
        }
    );
    let after = q.charge(&mut state, &seen, 10, now());
    assert_eq!(after.count, 10);
    let counts = state.as_mut().expect("created");
    assert_eq!(counts.merge(&[comp("us", 85, 5)]), 1);
    let seen = q.see(state.as_ref(), now());
    assert_eq!(seen.count, 90);
    assert!(q.fits(&seen, 10) && !q.fits(&seen, 11));
    assert_eq!(q.balance(&seen), 10);
    // A refund gives back only the local component's own points.
    let counts = state.as_mut().expect("stored");
    let after = q.refund(counts, &seen, 50, now());
    assert_eq!(after.count, 80, "only eu's 10 come back");
    assert_eq!(counts.component(&name("eu")), Some(&comp("eu", 10, 10)));
    assert_eq!(counts.component(&name("us")), Some(&comp("us", 85, 5)));
}

#[test]
fn the_local_component_stops_at_the_legal_bound() {
    let mut counts = RegionCounts::new(Period::Day, june_end());
    assert!(counts.charge(&name("eu"), MAX_COMPONENT - 1));
    assert!(counts.charge(&name("eu"), 10));
    assert_eq!(
        counts.component(&name("eu")).map(|c| c.added),
        Some(MAX_COMPONENT)
    );
    assert!(!counts.charge(&name("eu"), 1));
}

#[test]
fn merges_by_period() {
    let m = |end, comps: &[Component]| Merge {
        period: Period::Month,
        end,
        components: comps.iter().copied().collect(),
    };
    let mut state = None;
    assert_eq!(
        merge(&mut state, &m(june_end(), &[comp("us", 0, 0)]), now()),
        0
    );
    assert!(state.is_none(), "zeros alone create nothing");
    assert_eq!(
        merge(&mut state, &m(june_end(), &[comp("us", 5, 1)]), now()),
        1
    );
    assert_eq!(
        merge(&mut state, &m(june_end(), &[comp("us", 5, 1)]), now()),
        0
    );
    assert_eq!(
        merge(&mut state, &m(june_end(), &[comp("us", 4, 2)]), now()),
        1
    );
    let us = state
        .as_ref()
        .and_then(|s| s.component(&name("us")).copied());
    assert_eq!(us, Some(comp("us", 5, 2)));
    // An earlier period is ignored; a past one too.
    let may_end = days_from_civil(2026, 6, 1) * DAY_MS;
    assert_eq!(
        merge(&mut state, &m(may_end, &[comp("ap", 9, 0)]), now()),
        0
    );
    // A later period leaves the running one's counts alone (a region whose
    // clock is ahead at the turn), then, once June is over here, replaces
    // them.
    let july_end = days_from_civil(2026, 8, 1) * DAY_MS;
    assert_eq!(
        merge(&mut state, &m(july_end, &[comp("ap", 9, 0)]), now()),
        0
    );
    assert_eq!(state.as_ref().map(|s| s.end), Some(june_end()));
    assert_eq!(
        merge(&mut state, &m(july_end, &[comp("ap", 9, 0)]), june_end()),
        1
    );
    let s = state.as_ref().expect("replaced");
    assert_eq!((s.end, s.components()), (july_end, &[comp("ap", 9, 0)][..]));
}

#[test]
fn acceptable_period_ends() {
    let n = now();
    assert!(is_acceptable_end(Period::Month, june_end(), n));
    assert!(is_acceptable_end(
        Period::Month,
        days_from_civil(2026, 8, 1) * DAY_MS,
        n
    ));
    assert!(!is_acceptable_end(
        Period::Month,
        days_from_civil(2026, 9, 1) * DAY_MS,
        n
    ));
    assert!(!is_acceptable_end(Period::Month, june_end() + 1, n));
    assert!(is_acceptable_end(
        Period::Month,
        days_from_civil(2020, 3, 1) * DAY_MS,
        n
    ));
    assert!(
        !is_acceptable_end(Period::Week, june_end(), n),
        "a Wednesday"
    );
    assert!(
        !is_acceptable_end(Period::Day, june_end(), n),
        "a day end, but 15 days ahead"
    );
    assert!(is_acceptable_end(
        Period::Day,
        days_from_civil(2026, 6, 17) * DAY_MS,
        n
    ));
}

#[test]
fn conflicts_between_plain_and_regional_keys() {
    let q = monthly(10, "eu");
    let mut record = Record::default();
    record.set_part(Some(QuotaState {
        end: june_end(),
        count: 3,
    }));
    assert_eq!(q.conflict(&record, now()), Some(Conflict::Plain));
    assert_eq!(
        q.conflict(&record, june_end()),
        None,
        "a plain count that ended"
    );
    let mut record = Record::default();
    let mut counts = RegionCounts::new(Period::Month, june_end());
    counts.charge(&name("eu"), 1);
    record.set_part(Some(Box::new(counts)));
    assert_eq!(q.quota.conflict(&record, now()), Some(Conflict::Regional));
    assert_eq!(q.conflict(&record, now()), None);
    let daily = RegionalQuota {
        quota: Quota {
            limit: 10,
            period: Period::Day,
        },
        ..q
    };
    assert_eq!(
        daily.conflict(&record, now()),
        Some(Conflict::Period(Period::Month))
    );
}

#[test]
fn stored_counts_round_trip_and_are_validated() {
    let mut counts = RegionCounts::new(Period::Month, june_end());
    counts.merge(&[comp("us", 7, 2), comp("ap", 3, 0)]);
    counts.charge(&name("eu"), 4);
    let mut record = Record::default();
    record.set_part(Some(Box::new(counts.clone())));
    let bytes = encode(&record);
    assert_eq!(decode_loaded(&bytes, now()), Ok(record.clone()));
    let bad = |edit: fn(&mut RegionCounts)| {
        let mut c = counts.clone();
        edit(&mut c);
        let mut r = Record::default();
        r.set_part(Some(Box::new(c)));
        decode(&encode(&r)).is_err()
    };
    assert!(bad(|c| c.components[0].refunded = c.components[0].added + 1));
    assert!(bad(|c| c.components[0].added = MAX_COMPONENT + 1));
    assert!(bad(|c| c.components.swap(0, 1)), "unsorted");
    assert!(bad(|c| c.components[1] = c.components[0]), "repeated");
    assert!(bad(|c| c.end += 1), "not a period end");
    assert!(bad(|c| c.components.clear()));
    assert!(bad(|c| c.components[0].added = 0));
    // A name outside the alphabet in the bytes is refused.
    let text = bytes
        .iter()
        .position(|&b| b == b'u')
        .expect("us in the payload");
    let mut forged = bytes.clone();
    forged[text] = b'.';
    assert!(decode(&forged).is_err());
}
