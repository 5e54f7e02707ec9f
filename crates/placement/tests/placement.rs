//! Placement strategies: distinct backups never on the master, disjunctive first backups,
//! racks, copysets agreed by every master, and replacement after a failure.

use std::collections::BTreeSet;

use myriad_placement::placement::copysets;
use myriad_placement::{Candidate, Placement, PlacementError, Strategy};
use myriad_types::NodeId;
use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use rand::{rngs::SmallRng, SeedableRng};

fn peers(count: u16, racks: u16) -> Vec<Candidate> {
    (1..=count)
        .map(|id| Candidate {
            node: NodeId(id),
            rack: id % racks.max(1),
            switch: 0,
        })
        .collect()
}

fn strategies() -> impl proptest::strategy::Strategy<Value = myriad_placement::Strategy> {
    prop_oneof![
        Just(myriad_placement::Strategy::RANDOM),
        Just(myriad_placement::Strategy::DISJUNCTIVE),
        Just(myriad_placement::Strategy::RACK_AWARE),
        (1u32..6).prop_map(myriad_placement::Strategy::copyset),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn backups_are_distinct_candidates_and_never_the_master(
        strategy in strategies(),
        count in 1u16..20,
        replication in 1usize..5,
        seed in any::<u64>(),
    ) {
        let candidates = peers(count, 4);
        let master = candidates[0];
        let mut placement = Placement::new(master, replication, strategy);
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..10 {
            match placement.place(&candidates, &mut rng) {
                Ok(backups) => {
                    let distinct: BTreeSet<NodeId> = backups.iter().copied().collect();
                    prop_assert_eq!(distinct.len(), backups.len());
                    prop_assert!(!distinct.contains(&master.node));
                    prop_assert_eq!(backups.len(), replication.min(count as usize - 1));
                    prop_assert!(backups.iter().all(|b| candidates.iter().any(|c| c.node == *b)));
                    // Replacing any backup keeps R distinct and drops the failed one.
                    let failed = backups[0];
                    let replaced = placement.replace(&backups, failed, &candidates, &mut rng);
                    prop_assert!(!replaced.contains(&failed));
                    prop_assert_eq!(
                        replaced.iter().collect::<BTreeSet<_>>().len(),
                        replaced.len()
                    );
                    prop_assert_eq!(&replaced[..backups.len() - 1], &backups[1..]);
                    prop_assert_eq!(replaced.len(), replication.min(count as usize - 2));
                }
                Err(error) => prop_assert_eq!(error, PlacementError::NoCandidates),
            }
        }
    }

    #[test]
    fn copysets_do_not_depend_on_input_order(
        mut nodes in prop::collection::vec(1u16..500, 1..60),
        replication in 2usize..4,
        scatter in 1u32..6,
    ) {
        let ids: Vec<NodeId> = nodes.iter().copied().map(NodeId).collect();
        let a = copysets(&ids, replication, scatter);
        nodes.reverse();
        let ids: Vec<NodeId> = nodes.iter().copied().map(NodeId).collect();
        prop_assert_eq!(&a, &copysets(&ids, replication, scatter));
        let distinct: BTreeSet<NodeId> = ids.iter().copied().collect();
        for set in &a {
            prop_assert_eq!(set.len(), replication.min(distinct.len()));
            prop_assert_eq!(set.iter().collect::<BTreeSet<_>>().len(), set.len());
        }
        // Every node is in at least one copyset.
        for node in &distinct {
            prop_assert!(a.iter().any(|set| set.contains(node)));
        }
    }
}

#[test]
fn disjunctive_first_backups_cover_every_candidate_before_repeating() {
    let candidates = peers(13, 1);
    let master = candidates[0];
    let mut placement = Placement::new(master, 3, Strategy::DISJUNCTIVE);
    let mut rng = SmallRng::seed_from_u64(1);
    let firsts: Vec<NodeId> = (0..12)
        .map(|_| placement.place(&candidates, &mut rng).unwrap()[0])
        .collect();
    assert_eq!(firsts.iter().collect::<BTreeSet<_>>().len(), 12);
}

#[test]
fn rack_aware_backups_use_distinct_racks_away_from_the_master() {
    let candidates = peers(20, 5);
    let master = candidates[0];
    let mut placement = Placement::new(master, 3, Strategy::RACK_AWARE);
    let mut rng = SmallRng::seed_from_u64(2);
    for _ in 0..50 {
        let backups = placement.place(&candidates, &mut rng).unwrap();
        let racks: BTreeSet<u16> = backups
            .iter()
            .map(|b| candidates.iter().find(|c| c.node == *b).unwrap().rack)
            .collect();
        assert_eq!(racks.len(), 3);
        assert!(!racks.contains(&master.rack));
    }
}

#[test]
fn copyset_placement_uses_few_distinct_backup_sets_and_masters_agree_on_replacements() {
    let candidates = peers(31, 1);
    let master = candidates[0];
    let others: Vec<NodeId> = candidates[1..].iter().map(|c| c.node).collect();
    let sets: BTreeSet<BTreeSet<NodeId>> = copysets(&others, 3, 2)
        .into_iter()
        .map(|set| set.into_iter().collect())
        .collect();
    let mut placement = Placement::new(master, 3, Strategy::copyset(2));
    let mut rng = SmallRng::seed_from_u64(3);
    let mut used = BTreeSet::new();
    for _ in 0..500 {
        let backups: BTreeSet<NodeId> = placement
            .place(&candidates, &mut rng)
            .unwrap()
            .into_iter()
            .collect();
        assert!(sets.contains(&backups), "{backups:?} is not a copyset");
        used.insert(backups);
    }
    // 30 backups, R = 3, S = 2: one permutation, 10 copysets (random choice would use
    // hundreds of distinct sets in 500 zones).
    assert!(used.len() <= 10, "{} distinct sets", used.len());
    // Two masters with different RNGs pick the same replacement for the same group.
    let group: Vec<NodeId> = copysets(&others, 3, 2)[0].clone();
    let a = Placement::new(master, 3, Strategy::copyset(2)).replace(
        &group,
        group[1],
        &candidates,
        &mut SmallRng::seed_from_u64(10),
    );
    let b = Placement::new(candidates[5], 3, Strategy::copyset(2)).replace(
        &group,
        group[1],
        &candidates,
        &mut SmallRng::seed_from_u64(20),
    );
    assert_eq!(a, b);
}

#[test]
fn too_few_peers_give_fewer_backups_that_fill_up_later() {
    let candidates = peers(2, 1);
    let master = candidates[0];
    let mut placement = Placement::new(master, 3, Strategy::RANDOM);
    let mut rng = SmallRng::seed_from_u64(4);
    let backups = placement.place(&candidates, &mut rng).unwrap();
    assert_eq!(backups, vec![NodeId(2)]);
    let more = peers(6, 1);
    let filled = placement.extend(&backups, &more, &mut rng);
    assert_eq!(filled.len(), 3);
    assert_eq!(filled[0], NodeId(2));
    assert_eq!(
        Placement::new(master, 3, Strategy::RANDOM).place(&[master], &mut rng),
        Err(PlacementError::NoCandidates)
    );
}
