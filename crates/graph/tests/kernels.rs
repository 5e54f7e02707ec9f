//! The BFS kernels without a cluster: parts as threads of this process against the
//! sequential BFS, top-down only against direction-optimizing, and the validation of good
//! and corrupted parent arrays (each check shown to fail).

use myriad_graph::bfs::{bfs_in_threads, sequential_levels, BfsOptions, NO_PARENT};
use myriad_graph::gen::Kronecker;
use myriad_graph::validate::{tree_levels, validate, ValidationError};
use myriad_graph::Edge;

fn graph(scale: u32, seed: u64) -> (u64, Vec<Edge>) {
    let kronecker = Kronecker::new(scale, 16, seed);
    let perm = kronecker.permutation();
    (
        kronecker.vertices(),
        kronecker.edges(&perm, 0, u64::MAX).collect(),
    )
}

/// Roots of nonzero degree, spread over the ID space.
fn roots(vertices: u64, edges: &[Edge], count: usize) -> Vec<u32> {
    let mut degree = vec![0u32; vertices as usize];
    for &(u, v) in edges {
        if u != v {
            degree[u as usize] += 1;
            degree[v as usize] += 1;
        }
    }
    (0..vertices as u32)
        .filter(|&v| degree[v as usize] > 0)
        .step_by(vertices as usize / count / 2 + 1)
        .take(count)
        .collect()
}

fn levels(parents: &[u32], root: u32) -> Vec<i64> {
    tree_levels(parents, root)
        .expect("a tree")
        .into_iter()
        .map(i64::from)
        .collect()
}

#[test]
fn distributed_bfs_matches_the_sequential_bfs() {
    for (scale, seed) in [(8, 1), (11, 2), (12, 3)] {
        let (vertices, edges) = graph(scale, seed);
        for root in roots(vertices, &edges, 4) {
            let want = sequential_levels(vertices as usize, &edges, root);
            for parts in [1, 2, 3] {
                for threads in [1, 2] {
                    let options = BfsOptions {
                        threads,
                        ..BfsOptions::default()
                    };
                    let parents =
                        bfs_in_threads(vertices, &edges, parts, root, &options).expect("bfs");
                    assert_eq!(
                        levels(&parents, root),
                        want,
                        "scale {scale} root {root} parts {parts} threads {threads}"
                    );
                    let in_component = validate(&parents, root, &edges).expect("valid");
                    assert!(in_component > 0);
                }
            }
        }
    }
}

#[test]
fn top_down_only_and_direction_optimizing_give_the_same_levels() {
    let (vertices, edges) = graph(12, 9);
    for root in roots(vertices, &edges, 6) {
        let top_down = BfsOptions {
            direction_optimizing: false,
            ..BfsOptions::default()
        };
        let a = bfs_in_threads(vertices, &edges, 2, root, &top_down).expect("top-down");
        let b = bfs_in_threads(vertices, &edges, 2, root, &BfsOptions::default()).expect("do");
        assert_eq!(levels(&a, root), levels(&b, root), "root {root}");
    }
}

#[test]
fn the_switch_to_bottom_up_happens_on_a_kronecker_graph() {
    use myriad_graph::bfs::{bfs, Solo};
    use myriad_graph::csr::{local_pairs, Adjacency, Partition};
    let (vertices, edges) = graph(12, 4);
    let partition = Partition::new(vertices, 1);
    let adjacency =
        Adjacency::from_pairs(vertices as usize, 0, &local_pairs(&partition, 0, &edges));
    let root = roots(vertices, &edges, 1)[0];
    let outcome = bfs(&Solo, &partition, &adjacency, root, &BfsOptions::default()).expect("bfs");
    assert!(outcome.bottom_up_levels > 0, "{outcome:?}");
    assert!(outcome.bottom_up_levels < outcome.levels, "{outcome:?}");
}

/// A valid parent array of a small graph, and the graph.
fn valid() -> (Vec<Edge>, Vec<u32>, u32) {
    let (vertices, edges) = graph(10, 5);
    let root = roots(vertices, &edges, 1)[0];
    let parents = bfs_in_threads(vertices, &edges, 2, root, &BfsOptions::default()).expect("bfs");
    validate(&parents, root, &edges).expect("the uncorrupted array is valid");
    (edges, parents, root)
}

#[test]
fn validation_rejects_each_kind_of_corruption() {
    let (edges, parents, root) = valid();
    let lv = tree_levels(&parents, root).expect("tree");
    let reached: Vec<u32> = (0..parents.len() as u32)
        .filter(|&v| v != root && parents[v as usize] != NO_PARENT)
        .collect();

    // 1. The root's parent is another vertex.
    let mut bad = parents.clone();
    bad[root as usize] = reached[0];
    assert!(matches!(
        validate(&bad, root, &edges),
        Err(ValidationError::RootNotOwnParent { .. })
    ));

    // 2a. A parent that is no vertex.
    let mut bad = parents.clone();
    bad[reached[1] as usize] = parents.len() as u32 + 5;
    assert!(matches!(
        validate(&bad, root, &edges),
        Err(ValidationError::ParentOutOfRange { .. })
    ));

    // 2b. A cycle: two reached vertices made each other's parent.
    let (a, b) = (reached[2], reached[3]);
    let mut bad = parents.clone();
    bad[a as usize] = b;
    bad[b as usize] = a;
    assert!(matches!(
        validate(&bad, root, &edges),
        Err(ValidationError::Cycle { .. })
    ));

    // 3. A level gap: a level-1 leaf (an edge to the root) re-parented to a vertex of
    // level >= 3 (no edge either, but the gap is found first by the edge check).
    let has_child: std::collections::HashSet<u32> = parents.iter().copied().collect();
    let deep = *reached
        .iter()
        .find(|&&v| lv[v as usize] >= 3)
        .expect("a tree of depth 3");
    let shallow_leaf = *reached
        .iter()
        .find(|&&v| lv[v as usize] == 1 && !has_child.contains(&v))
        .expect("a leaf at level 1");
    let mut bad = parents.clone();
    bad[shallow_leaf as usize] = deep;
    assert!(
        matches!(
            validate(&bad, root, &edges),
            Err(ValidationError::LevelGap { .. })
        ),
        "{:?}",
        validate(&bad, root, &edges)
    );

    // 4. A reached vertex left out of the tree (its component is no longer spanned):
    // a leaf of the tree is marked unreached.
    let leaf = *reached
        .iter()
        .find(|v| !has_child.contains(v))
        .expect("a leaf");
    let mut bad = parents.clone();
    bad[leaf as usize] = NO_PARENT;
    assert!(matches!(
        validate(&bad, root, &edges),
        Err(ValidationError::ComponentNotSpanned { .. })
    ));

    // 5. A tree edge that is not in the graph: a leaf re-parented to a vertex of the
    // same level as its parent that is not its neighbour.
    let neighbours: std::collections::HashSet<u32> = edges
        .iter()
        .filter_map(|&(u, v)| {
            if u == leaf {
                Some(v)
            } else if v == leaf {
                Some(u)
            } else {
                None
            }
        })
        .collect();
    let parent_level = lv[parents[leaf as usize] as usize];
    let stranger = (0..parents.len() as u32)
        .find(|&w| lv[w as usize] == parent_level && !neighbours.contains(&w) && w != leaf)
        .expect("a vertex at the parent's level that is no neighbour");
    let mut bad = parents.clone();
    bad[leaf as usize] = stranger;
    assert!(
        matches!(
            validate(&bad, root, &edges),
            Err(ValidationError::TreeEdgeNotInGraph { .. })
        ),
        "{:?}",
        validate(&bad, root, &edges)
    );
}
