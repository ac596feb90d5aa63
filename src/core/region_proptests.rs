//! Merges of regional components are idempotent, commutative and
//! associative, and the total never counts a point twice: whatever order
//! and repetition the components of several regions arrive in, every
//! region ends with the same components, and the total is the exact sum
//! of what each region counted and gave back.

use proptest::prelude::*;

use super::quota::Period;
use super::region::{Component, RegionCounts, RegionName};
use super::testkit::config;

const END: i64 = 1_782_864_000_000;

fn names() -> Vec<RegionName> {
    ["ap", "eu", "us", "sa"]
        .iter()
        .filter_map(|n| RegionName::new(n.as_bytes()))
        .collect()
}

/// A region's local history: charges (true) and refunds (false).
fn history() -> impl Strategy<Value = Vec<(bool, u64)>> {
    prop::collection::vec((any::<bool>(), 0u64..50), 0..20)
}

/// A snapshot of some region's component at some point of its history.
fn component() -> impl Strategy<Value = Component> {
    (0usize..4, 1u64..1000, 0u64..1000).prop_map(|(i, added, refunded)| Component {
        region: names()[i],
        added,
        refunded: refunded.min(added),
    })
}

fn merged(parts: &[Component]) -> RegionCounts {
    let mut counts = RegionCounts::new(Period::Month, END);
    for c in parts {
        counts.merge(std::slice::from_ref(c));
    }
    counts
}

proptest! {
    #![proptest_config(config(256))]

    /// Idempotent: merging what is already merged changes nothing.
    #[test]
    fn idempotent(parts in prop::collection::vec(component(), 0..12)) {
        let mut once = merged(&parts);
        let before = once.clone();
        prop_assert_eq!(once.merge(&parts), 0);
        prop_assert_eq!(once, before);
    }

    /// Commutative and associative: any order, any grouping, the same.
    #[test]
    fn order_and_grouping_do_not_matter(
        parts in prop::collection::vec(component(), 0..12),
        seed in any::<u64>(),
        split in 0usize..12,
    ) {
        let mut shuffled = parts.clone();
        let mut s = seed;
        for i in (1..shuffled.len()).rev() {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            shuffled.swap(i, (s >> 33) as usize % (i + 1));
        }
        prop_assert_eq!(merged(&parts), merged(&shuffled));
        // (a merged into b) merged into c, against a into (b merged into c).
        let split = split.min(parts.len());
        let (left, right) = parts.split_at(split);
        let mut grouped = merged(left);
        grouped.merge(merged(right).components());
        prop_assert_eq!(grouped, merged(&parts));
    }

    /// Regions that exchange snapshots of their own components, repeated
    /// and out of order, converge to the same total: the exact sum of
    /// every region's own count; no view ever counts more than that sum.
    #[test]
    fn the_total_never_counts_twice(
        histories in prop::collection::vec(history(), 3),
        deliveries in prop::collection::vec((0usize..3, 0usize..3, 0usize..64), 0..60),
    ) {
        let regions = names();
        // Each region's own counts, after each step of its history.
        let mut views: Vec<RegionCounts> =
            (0..3).map(|_| RegionCounts::new(Period::Month, END)).collect();
        let mut snapshots: Vec<Vec<Component>> = vec![Vec::new(); 3];
        for (r, h) in histories.iter().enumerate() {
            for &(charge, points) in h {
                if charge {
                    views[r].charge(&regions[r], points);
                } else {
                    views[r].refund(&regions[r], points);
                }
                if let Some(c) = views[r].component(&regions[r]) {
                    snapshots[r].push(*c);
                }
            }
        }
        let exact: u64 = (0..3)
            .map(|r| views[r].component(&regions[r]).map_or(0, Component::count))
            .sum();
        // Deliver arbitrary snapshots (old ones too, repeated) everywhere.
        for &(from, to, which) in &deliveries {
            if from == to || snapshots[from].is_empty() {
                continue;
            }
            let snap = snapshots[from][which % snapshots[from].len()];
            views[to].merge(&[snap]);
            // Each component a view holds is one real reading of its
            // region (never a sum of two), so the total is a sum of one
            // reading per region.
            for (r, region) in regions.iter().enumerate().take(3) {
                if let Some(c) = views[to].component(region) {
                    prop_assert!(snapshots[r].contains(c), "{:?} was never {:?}'s reading", c, region);
                }
            }
        }
        // Then the latest of each, once more, everywhere: all agree.
        let latest: Vec<Option<Component>> =
            snapshots.iter().map(|s| s.last().copied()).collect();
        for (to, view) in views.iter_mut().enumerate() {
            for (from, last) in latest.iter().enumerate() {
                if let (true, Some(last)) = (from != to, last) {
                    view.merge(std::slice::from_ref(last));
                }
            }
        }
        for v in &views {
            prop_assert_eq!(v.total(), exact);
            prop_assert_eq!(v, &views[0]);
        }
    }
}
