//! The checks at the end of a run, once no event is left (quiescence).
//!
//! Job: [`final_checks`] reads every chunk whose create was acknowledged from the owner
//! the directory names (with the production chunk service, no network) and adds the
//! reads to the history; then checks
//! - that every live peer's ownership view agrees with the directory for these chunks;
//! - the history per chunk with the linearizability checker ([`crate::history::check`]):
//!   in `replicated` and `durable` runs no acknowledged write may be lost (reads of a
//!   change not yet acknowledged that a crash then lost are set aside: readers may see a
//!   change before it reached its durability); in `async` runs those acknowledged before
//!   a crash may be lost too ([`crate::history::relax_for_crash`]);
//! - every live peer's memory manager and log engine with their consistency walkers.
//!
//! Invariants: the checks only read; the first problem found becomes the run's failure.
//!
//! Callers: [`super::world::World::run`].

use crate::history::{self, Action, Crash, Operation, Outcome};

use super::world::{value_of, World, TOMBSTONE};
use super::SimDurability;

impl World {
    /// Final reads of every known chunk at its owner, and the ownership agreement.
    fn final_reads(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut cids = self.known_chunks();
        cids.sort();
        cids.dedup();
        let now = self.now() + 1;
        for (i, cid) in cids.into_iter().enumerate() {
            let owner = self.owner_in_directory(cid);
            for (peer, view) in self.ownership_views(cid) {
                if view != owner {
                    problems.push(format!(
                        "{peer} thinks {cid} is at {view}, the directory says {owner}"
                    ));
                }
            }
            let Some(service) = self.service_of(owner) else {
                continue;
            };
            let reply = service.execute(
                owner,
                myriad_proto::chunk::ChunkRequest::Get { cids: vec![cid] },
            );
            let read = match reply {
                myriad_proto::chunk::ChunkReply::Data(items) => match items.first() {
                    Some(Ok(bytes)) => Some(value_of(bytes)),
                    Some(Err(myriad_proto::chunk::ItemError::NotFound)) => Some(TOMBSTONE),
                    _ => None,
                },
                _ => None,
            };
            let Some(value) = read else {
                problems.push(format!("the final read of {cid} at {owner} failed"));
                continue;
            };
            let at = now + i as u64;
            self.history.push(Operation {
                key: cid.raw(),
                action: Action::Read(Some(value)),
                start: at,
                end: at,
                outcome: Outcome::Ok,
            });
        }
        problems
    }
}

/// Runs the final checks; records the first problem as the run's failure.
pub fn final_checks(world: &mut World) {
    let mut problems = world.final_reads();
    // A crash may lose what was not acknowledged yet; readers may have seen it (a change
    // is readable at its owner before it reached its durability, as the chunk service
    // documents): such reads are set aside. `async` may lose acknowledged writes too.
    let history = match (world.crashes.first(), world.crashes.last()) {
        (Some(&start), Some(&end)) => {
            let window = match world.scenario().durability {
                SimDurability::Async => u64::MAX,
                SimDurability::Replicated | SimDurability::Durable => 0,
            };
            history::relax_for_crash(&world.history, Crash { start, end, window })
        }
        _ => world.history.clone(),
    };
    // A chunk that does not exist (not yet, removed, or a lost create) reads as TOMBSTONE.
    if let Err(error) = history::check(&history, Some(TOMBSTONE)) {
        let lost: Vec<String> = history::lost_writes(&history)
            .iter()
            .map(|l| format!("{:?} lost, shown by {:?}", l.write, l.read))
            .collect();
        problems.push(format!("{error}; lost acknowledged writes: {lost:?}"));
    }
    problems.extend(world.consistency_problems());
    problems.extend(world.superpeer_problems());
    if let Some(problem) = problems.into_iter().next() {
        world.record_failure(problem);
    }
}
