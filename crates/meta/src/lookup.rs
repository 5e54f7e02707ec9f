//! Range-based chunk locations of one creator.
//!
//! A chunk lives on its creator until it is migrated or recovered elsewhere, so the tree only
//! stores the *exceptions*: maximal LID ranges whose owner is not the creator. A lookup answers
//! with the whole maximal range around the LID (an exception, or the gap between two, which
//! the creator owns), so callers cache ranges, not single CIDs.
//!
//! Invariants (checked by [`LookupTree::check`]): ranges do not overlap, `first <= last`, no
//! range is owned by the creator, and two adjacent ranges never have the same owner.

use std::collections::BTreeMap;
use std::ops::Bound;

use myriad_types::{NodeId, LOCAL_ID_MAX};

/// A maximal LID range of one creator with one owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupRange {
    /// The creator whose LIDs these are.
    pub creator: NodeId,
    /// First LID of the range.
    pub first: u64,
    /// Last LID of the range (inclusive).
    pub last: u64,
    /// The node that holds these chunks now.
    pub owner: NodeId,
}

/// The exceptions of one creator: `first LID -> (last LID, owner)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LookupTree {
    ranges: BTreeMap<u64, (u64, NodeId)>,
}

impl LookupTree {
    /// Number of stored exception ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether every chunk of the creator is still on the creator.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The stored exceptions in LID order as `(first, last, owner)`.
    pub fn exceptions(&self) -> impl Iterator<Item = (u64, u64, NodeId)> + '_ {
        self.ranges
            .iter()
            .map(|(&first, &(last, owner))| (first, last, owner))
    }

    /// The maximal range around `local_id` (which must be ≤ [`LOCAL_ID_MAX`]).
    pub fn lookup(&self, creator: NodeId, local_id: u64) -> LookupRange {
        let below = self.ranges.range(..=local_id).next_back();
        if let Some((&first, &(last, owner))) = below {
            if local_id <= last {
                return LookupRange {
                    creator,
                    first,
                    last,
                    owner,
                };
            }
        }
        let first = below.map_or(0, |(_, &(last, _))| last + 1);
        let last = self
            .ranges
            .range((Bound::Excluded(local_id), Bound::Unbounded))
            .next()
            .map_or(LOCAL_ID_MAX, |(&next, _)| next - 1);
        LookupRange {
            creator,
            first,
            last,
            owner: creator,
        }
    }

    /// Records that LIDs `first..=last` of `creator` now live on `owner`. Splits and merges
    /// ranges so the invariants hold. `first <= last <= LOCAL_ID_MAX` is the caller's check.
    pub fn set_owner(&mut self, creator: NodeId, first: u64, last: u64, owner: NodeId) {
        debug_assert!(first <= last && last <= LOCAL_ID_MAX);
        // Cut a range that starts before `first` and reaches into the new range.
        if let Some((&start, &(end, previous))) = self.ranges.range(..first).next_back() {
            if end >= first {
                self.ranges.insert(start, (first - 1, previous));
                if end > last {
                    self.ranges.insert(last + 1, (end, previous));
                }
            }
        }
        // Remove ranges starting inside, keeping the tail of the last one.
        let inside: Vec<u64> = self.ranges.range(first..=last).map(|(&s, _)| s).collect();
        for start in inside {
            if let Some((end, previous)) = self.ranges.remove(&start) {
                if end > last {
                    self.ranges.insert(last + 1, (end, previous));
                }
            }
        }
        if owner != creator {
            self.ranges.insert(first, (last, owner));
        }
        self.merge_around(first);
        if last < LOCAL_ID_MAX {
            self.merge_around(last + 1);
        }
    }

    /// Merges the range starting at `start` (if any) with its left neighbour when they touch
    /// and share an owner.
    fn merge_around(&mut self, start: u64) {
        let Some(&(end, owner)) = self.ranges.get(&start) else {
            return;
        };
        if start == 0 {
            return;
        }
        if let Some((&left, &(left_end, left_owner))) = self.ranges.range(..start).next_back() {
            if left_end + 1 == start && left_owner == owner {
                self.ranges.remove(&start);
                self.ranges.insert(left, (end, owner));
            }
        }
    }

    /// Inserts a decoded exception; the caller runs [`check`](Self::check) afterwards.
    pub(crate) fn insert_raw(&mut self, first: u64, last: u64, owner: NodeId) {
        self.ranges.insert(first, (last, owner));
    }

    /// Verifies the invariants; returns a description of the first violation.
    pub fn check(&self, creator: NodeId) -> Result<(), &'static str> {
        let mut previous: Option<(u64, NodeId)> = None;
        for (&first, &(last, owner)) in &self.ranges {
            if first > last || last > LOCAL_ID_MAX {
                return Err("lookup range with first > last or beyond the LID space");
            }
            if owner == creator {
                return Err("lookup range owned by its creator");
            }
            if let Some((previous_last, previous_owner)) = previous {
                if previous_last >= first {
                    return Err("overlapping lookup ranges");
                }
                if previous_last + 1 == first && previous_owner == owner {
                    return Err("adjacent lookup ranges with one owner");
                }
            }
            previous = Some((last, owner));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const CREATOR: NodeId = NodeId(1);

    #[test]
    fn empty_tree_answers_the_whole_space_owned_by_the_creator() {
        let tree = LookupTree::default();
        let range = tree.lookup(CREATOR, 12345);
        assert_eq!(
            (range.first, range.last, range.owner),
            (0, LOCAL_ID_MAX, CREATOR)
        );
    }

    #[test]
    fn split_and_merge_back() {
        let mut tree = LookupTree::default();
        tree.set_owner(CREATOR, 100, 199, NodeId(2));
        tree.set_owner(CREATOR, 150, 160, NodeId(3));
        assert_eq!(tree.len(), 3);
        assert_eq!(tree.lookup(CREATOR, 120).last, 149);
        assert_eq!(tree.lookup(CREATOR, 155).owner, NodeId(3));
        assert_eq!(tree.lookup(CREATOR, 170).first, 161);
        tree.set_owner(CREATOR, 150, 160, NodeId(2));
        assert_eq!(tree.len(), 1);
        tree.set_owner(CREATOR, 0, LOCAL_ID_MAX, CREATOR);
        assert!(tree.is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random ownership changes over a small LID space agree with a per-LID map, and
        /// every answer is the maximal range of one owner.
        #[test]
        fn matches_a_per_lid_model(
            ops in proptest::collection::vec((0u64..64, 0u64..64, 1u16..5), 1..40)
        ) {
            let mut tree = LookupTree::default();
            let mut model: HashMap<u64, NodeId> = HashMap::new();
            for (a, b, owner) in ops {
                let (first, last) = (a.min(b), a.max(b));
                tree.set_owner(CREATOR, first, last, NodeId(owner));
                for lid in first..=last {
                    model.insert(lid, NodeId(owner));
                }
                prop_assert_eq!(tree.check(CREATOR), Ok(()));
                for lid in 0..70u64 {
                    let expected = model.get(&lid).copied().unwrap_or(CREATOR);
                    let range = tree.lookup(CREATOR, lid);
                    prop_assert_eq!(range.owner, expected);
                    prop_assert!(range.first <= lid && lid <= range.last);
                    for inner in range.first..=range.last.min(70) {
                        prop_assert_eq!(model.get(&inner).copied().unwrap_or(CREATOR), expected);
                    }
                    if range.first > 0 {
                        let left = model.get(&(range.first - 1)).copied().unwrap_or(CREATOR);
                        prop_assert_ne!(left, expected);
                    }
                    if range.last < 70 {
                        let right = model.get(&(range.last + 1)).copied().unwrap_or(CREATOR);
                        prop_assert_ne!(right, expected);
                    }
                }
            }
        }
    }
}
