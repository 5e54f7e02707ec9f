//! The Graph500 validation of a BFS parent array against the input edge list.
//!
//! # Job
//! The checks of the Graph500 specification, each with its own [`ValidationError`]:
//! 1. the root is its own parent ([`ValidationError::RootNotOwnParent`]);
//! 2. every parent is a vertex and following parents from any reached vertex ends at the
//!    root without a cycle ([`ValidationError::ParentOutOfRange`],
//!    [`ValidationError::Cycle`]): the parents form a tree, whose levels are computed here
//!    (so tree edges join levels `l` and `l + 1` by construction);
//! 3. every input edge joins vertices whose levels differ by at most one
//!    ([`ValidationError::LevelGap`]);
//! 4. no input edge joins a reached and an unreached vertex: the tree spans the root's
//!    whole component ([`ValidationError::ComponentNotSpanned`]);
//! 5. every tree edge `(parent, vertex)` is an input edge
//!    ([`ValidationError::TreeEdgeNotInGraph`]).
//!
//! The work splits for a distributed run: [`tree_levels`] on the whole parent array, then
//! [`check_edges`] over each part's share of the input edges (marking the tree edges it
//! saw), then [`check_tree_edges_found`] once the marks of all parts are ORed together.
//! [`validate`] runs all of it in one process.
//!
//! The TEPS edge count is the number of input edges (self-loops and duplicates included,
//! as listed) whose endpoints were reached ([`EdgeCheck::edges_in_component`]).
//!
//! # Who calls it
//! The BFS task ([`crate::task`]) after each BFS, tests.

use thiserror::Error;

use crate::bfs::NO_PARENT;
use crate::bitmap::Bitmap;
use crate::Edge;

/// Why a parent array is not a valid BFS tree (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValidationError {
    /// Check 1.
    #[error("the root {root} is not its own parent (parent {parent})")]
    RootNotOwnParent {
        /// The root.
        root: u32,
        /// Its parent in the array.
        parent: u32,
    },
    /// Check 2: a parent that is no vertex.
    #[error("vertex {vertex} has parent {parent}, not a vertex")]
    ParentOutOfRange {
        /// The vertex.
        vertex: u32,
        /// Its parent.
        parent: u32,
    },
    /// Check 2: following parents from `vertex` never reaches the root.
    #[error("following the parents from vertex {vertex} does not reach the root")]
    Cycle {
        /// Where the walk started.
        vertex: u32,
    },
    /// Check 3.
    #[error("edge ({u}, {v}) joins levels {lu} and {lv}")]
    LevelGap {
        /// One endpoint.
        u: u32,
        /// The other.
        v: u32,
        /// Level of `u`.
        lu: i32,
        /// Level of `v`.
        lv: i32,
    },
    /// Check 4.
    #[error("edge ({u}, {v}) leaves the tree: only one endpoint was reached")]
    ComponentNotSpanned {
        /// One endpoint.
        u: u32,
        /// The other.
        v: u32,
    },
    /// Check 5.
    #[error("tree edge ({parent}, {vertex}) is not an edge of the graph")]
    TreeEdgeNotInGraph {
        /// The vertex.
        vertex: u32,
        /// Its parent.
        parent: u32,
    },
    /// The array does not fit the graph.
    #[error("{0}")]
    Shape(String),
}

/// Checks 1 and 2 on the whole parent array; the level of every vertex (-1: unreached).
pub fn tree_levels(parents: &[u32], root: u32) -> Result<Vec<i32>, ValidationError> {
    let n = parents.len();
    let Some(&root_parent) = parents.get(root as usize) else {
        return Err(ValidationError::Shape(format!(
            "root {root} outside {n} vertices"
        )));
    };
    if root_parent != root {
        return Err(ValidationError::RootNotOwnParent {
            root,
            parent: root_parent,
        });
    }
    const UNKNOWN: i32 = -2;
    let mut levels: Vec<i32> = parents
        .iter()
        .map(|&p| if p == NO_PARENT { -1 } else { UNKNOWN })
        .collect();
    levels[root as usize] = 0;
    let mut path = Vec::new();
    for start in 0..n {
        if levels[start] != UNKNOWN {
            continue;
        }
        path.clear();
        let mut v = start;
        while levels[v] == UNKNOWN {
            if path.len() > n {
                return Err(ValidationError::Cycle {
                    vertex: start as u32,
                });
            }
            path.push(v);
            let parent = parents[v];
            if parent as usize >= n {
                return Err(ValidationError::ParentOutOfRange {
                    vertex: v as u32,
                    parent,
                });
            }
            v = parent as usize;
        }
        if levels[v] < 0 {
            // The walk ended at an unreached vertex: the tree is broken there.
            return Err(ValidationError::Cycle {
                vertex: start as u32,
            });
        }
        let mut level = levels[v];
        for &w in path.iter().rev() {
            level += 1;
            levels[w] = level;
        }
    }
    Ok(levels)
}

/// What [`check_edges`] found in a share of the input edges.
#[derive(Debug)]
pub struct EdgeCheck {
    /// Vertices whose tree edge to their parent was seen among the edges.
    pub found: Bitmap,
    /// Edges with both endpoints reached.
    pub edges_in_component: u64,
    /// The first failed check (3 or 4), if any.
    pub error: Option<ValidationError>,
}

/// Checks 3 and 4 on `edges`, counting the component's edges and marking tree edges.
pub fn check_edges(
    parents: &[u32],
    levels: &[i32],
    edges: impl IntoIterator<Item = Edge>,
) -> EdgeCheck {
    let found = Bitmap::new(parents.len());
    let mut edges_in_component = 0;
    let mut error = None;
    for (u, v) in edges {
        let (Some(&lu), Some(&lv)) = (levels.get(u as usize), levels.get(v as usize)) else {
            error.get_or_insert(ValidationError::Shape(format!(
                "edge ({u}, {v}) outside {} vertices",
                parents.len()
            )));
            continue;
        };
        if lu < 0 && lv < 0 {
            continue;
        }
        if lu < 0 || lv < 0 {
            error.get_or_insert(ValidationError::ComponentNotSpanned { u, v });
            continue;
        }
        if (lu - lv).abs() > 1 {
            error.get_or_insert(ValidationError::LevelGap { u, v, lu, lv });
        }
        edges_in_component += 1;
        if parents[v as usize] == u {
            found.set(v as usize);
        }
        if parents[u as usize] == v {
            found.set(u as usize);
        }
    }
    EdgeCheck {
        found,
        edges_in_component,
        error,
    }
}

/// Check 5 for the vertices `range`: every reached vertex but the root had its tree edge
/// marked in `found` (the marks of every share of the edges).
pub fn check_tree_edges_found(
    parents: &[u32],
    root: u32,
    found: &Bitmap,
    range: std::ops::Range<usize>,
) -> Result<(), ValidationError> {
    for vertex in range {
        let parent = parents[vertex];
        if parent != NO_PARENT && vertex != root as usize && !found.get(vertex) {
            return Err(ValidationError::TreeEdgeNotInGraph {
                vertex: vertex as u32,
                parent,
            });
        }
    }
    Ok(())
}

/// Every check in one process; the number of input edges in the root's component.
pub fn validate(parents: &[u32], root: u32, edges: &[Edge]) -> Result<u64, ValidationError> {
    let levels = tree_levels(parents, root)?;
    let check = check_edges(parents, &levels, edges.iter().copied());
    if let Some(error) = check.error {
        return Err(error);
    }
    check_tree_edges_found(parents, root, &check.found, 0..parents.len())?;
    Ok(check.edges_in_component)
}
