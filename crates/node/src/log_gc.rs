//! Deleting backup logs that no recovery will read again (issue 5: "when a backup fails or
//! leaves, affected zones get a replacement"; the logs the old assignment left behind must
//! not fill the disk).
//!
//! # Job
//! A peer's log engine holds zones of other peers. A zone's logs become garbage here when
//! the zone table in the superpeers' state no longer lists this peer among the zone's
//! backups: the zone was recovered and removed after its owner failed, its owner left, this
//! peer restored it and the zone was adopted with other backups (issue 6: the restorer's own
//! copy of the log; an adopted zone stays listed under its log owner, whoever holds it), or
//! this peer was replaced as its backup (after being thought unreachable, say). Every
//! [`LogGcOptions::interval`] the collector compares the local zones with the table, and
//! deletes a zone's files once it has been missing from the table (for this peer) in every
//! look for at least [`LogGcOptions::grace`].
//!
//! # Invariants
//! - A zone is deleted only after it was seen unlisted for the whole grace period: a zone
//!   whose registration is still on its way (a master registers a zone before its first
//!   write is acknowledged, but its first messages may arrive earlier) reappears well within
//!   it, which resets its clock.
//! - Nothing is deleted when the table cannot be read (superpeers unreachable): the clock
//!   only runs on answers.
//!
//! # Who calls it
//! [`crate::peer::PeerNode::start`] spawns [`run`] for a peer with the backup
//! capability; [`Collector`] is its testable core.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use myriad_membership::Membership;
use myriad_proto::meta::{MetaReply, MetaRequest};
use myriad_replication::BackupService;
use myriad_types::NodeId;

/// One owner's zones as the zone table lists them: `(zone, backups in order)`.
pub type OwnerZones = Vec<(u32, Vec<NodeId>)>;

/// The zone table's answers of one look, per owner (`None`: no answer for that owner).
pub type TableAnswers = BTreeMap<NodeId, Option<OwnerZones>>;

/// When and how eagerly the collector runs.
#[derive(Debug, Clone, Copy)]
pub struct LogGcOptions {
    /// Time between two looks at the zone table. Default 30 s.
    pub interval: Duration,
    /// How long a zone must stay unlisted before its logs are deleted. Default 5 min.
    pub grace: Duration,
}

impl Default for LogGcOptions {
    fn default() -> Self {
        LogGcOptions {
            interval: Duration::from_secs(30),
            grace: Duration::from_secs(300),
        }
    }
}

/// The collector's memory between looks: since when each local zone is unlisted.
#[derive(Debug)]
pub struct Collector {
    me: NodeId,
    grace: Duration,
    unlisted_since: HashMap<(NodeId, u32), Instant>,
}

impl Collector {
    /// A collector for the logs held by peer `me`.
    pub fn new(me: NodeId, grace: Duration) -> Collector {
        Collector {
            me,
            grace,
            unlisted_since: HashMap::new(),
        }
    }

    /// One look: `local` are the zones held here, `table` the zone table's answer per
    /// owner (`None`: that owner's zones could not be read this time). Returns the zones to
    /// delete now.
    pub fn look(
        &mut self,
        now: Instant,
        local: &[(NodeId, u32)],
        table: &TableAnswers,
    ) -> Vec<(NodeId, u32)> {
        let held: BTreeSet<(NodeId, u32)> = local.iter().copied().collect();
        // Zones gone from this engine need no clock any more.
        self.unlisted_since.retain(|zone, _| held.contains(zone));
        let mut delete = Vec::new();
        for &(owner, zone) in &held {
            let Some(Some(zones)) = table.get(&owner) else {
                // No answer for this owner: the clock neither runs nor resets.
                continue;
            };
            let listed = zones
                .iter()
                .any(|(z, backups)| *z == zone && backups.contains(&self.me));
            if listed {
                self.unlisted_since.remove(&(owner, zone));
                continue;
            }
            let since = *self.unlisted_since.entry((owner, zone)).or_insert(now);
            if now.saturating_duration_since(since) >= self.grace {
                delete.push((owner, zone));
            }
        }
        delete
    }

    /// Forgets a zone (after deleting it).
    pub fn forget(&mut self, owner: NodeId, zone: u32) {
        self.unlisted_since.remove(&(owner, zone));
    }
}

/// Runs the collector until the membership's runtime stops: every `options.interval`, one
/// look and the deletions it calls for.
pub async fn run(backup: Arc<BackupService>, membership: Arc<Membership>, options: LogGcOptions) {
    let mut collector = Collector::new(membership.node_id(), options.grace);
    let mut ticker = tokio::time::interval(options.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let local = backup.zone_ids();
        if local.is_empty() {
            continue;
        }
        let owners: BTreeSet<NodeId> = local.iter().map(|(owner, _)| *owner).collect();
        let mut table = TableAnswers::new();
        for owner in owners {
            let zones = match membership.request(MetaRequest::Zones(owner)).await {
                Ok(MetaReply::Zones(zones)) => Some(zones),
                _ => None,
            };
            table.insert(owner, zones);
        }
        for (owner, zone) in collector.look(Instant::now(), &local, &table) {
            let backup = Arc::clone(&backup);
            let removed =
                tokio::task::spawn_blocking(move || backup.remove_zone(owner, zone)).await;
            match removed {
                Ok(Ok(())) => {
                    collector.forget(owner, zone);
                    tracing::info!(%owner, zone, "deleted the logs of a zone no longer backed up here");
                }
                Ok(Err(error)) => {
                    tracing::warn!(%owner, zone, %error, "could not delete a zone's logs")
                }
                Err(error) => tracing::warn!(%owner, zone, %error, "zone deletion task failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: NodeId = NodeId(5);

    type Entry = (u16, Option<Vec<(u32, Vec<u16>)>>);

    fn table(entries: &[Entry]) -> TableAnswers {
        entries
            .iter()
            .map(|(owner, zones)| {
                (
                    NodeId(*owner),
                    zones.as_ref().map(|zones| {
                        zones
                            .iter()
                            .map(|(z, b)| (*z, b.iter().map(|&n| NodeId(n)).collect()))
                            .collect()
                    }),
                )
            })
            .collect()
    }

    #[test]
    fn listed_zones_are_kept_and_unlisted_ones_go_after_the_grace() {
        let grace = Duration::from_secs(10);
        let mut gc = Collector::new(ME, grace);
        let t0 = Instant::now();
        let local = [(NodeId(2), 0), (NodeId(2), 1), (NodeId(3), 0)];
        // Zone 2/0 lists us; 2/1 lists others only; 3/0 is gone from the table.
        let answer = table(&[
            (2, Some(vec![(0, vec![5, 6]), (1, vec![6, 7])])),
            (3, Some(vec![])),
        ]);
        assert!(gc.look(t0, &local, &answer).is_empty());
        assert!(gc
            .look(t0 + Duration::from_secs(9), &local, &answer)
            .is_empty());
        let mut due = gc.look(t0 + grace, &local, &answer);
        due.sort();
        assert_eq!(due, vec![(NodeId(2), 1), (NodeId(3), 0)]);
    }

    #[test]
    fn a_zone_listed_again_restarts_its_clock() {
        let grace = Duration::from_secs(10);
        let mut gc = Collector::new(ME, grace);
        let t0 = Instant::now();
        let local = [(NodeId(2), 0)];
        let unlisted = table(&[(2, Some(vec![]))]);
        let listed = table(&[(2, Some(vec![(0, vec![5])]))]);
        assert!(gc.look(t0, &local, &unlisted).is_empty());
        assert!(gc
            .look(t0 + Duration::from_secs(6), &local, &listed)
            .is_empty());
        // Unlisted again: the grace counts from here, not from t0.
        assert!(gc
            .look(t0 + Duration::from_secs(12), &local, &unlisted)
            .is_empty());
        assert_eq!(
            gc.look(t0 + Duration::from_secs(22), &local, &unlisted),
            vec![(NodeId(2), 0)]
        );
    }

    #[test]
    fn no_answer_deletes_nothing_and_keeps_the_clock() {
        let grace = Duration::from_secs(10);
        let mut gc = Collector::new(ME, grace);
        let t0 = Instant::now();
        let local = [(NodeId(2), 0)];
        assert!(gc.look(t0, &local, &table(&[(2, Some(vec![]))])).is_empty());
        // The superpeers do not answer for a long time: nothing goes.
        assert!(gc
            .look(t0 + Duration::from_secs(60), &local, &table(&[(2, None)]))
            .is_empty());
        assert!(gc
            .look(t0 + Duration::from_secs(60), &local, &table(&[]))
            .is_empty());
        // Once they answer, the clock that ran before the silence counts.
        assert_eq!(
            gc.look(
                t0 + Duration::from_secs(61),
                &local,
                &table(&[(2, Some(vec![]))])
            ),
            vec![(NodeId(2), 0)]
        );
    }

    #[test]
    fn zones_no_longer_held_are_forgotten() {
        let mut gc = Collector::new(ME, Duration::from_secs(10));
        let t0 = Instant::now();
        let unlisted = table(&[(2, Some(vec![]))]);
        assert!(gc.look(t0, &[(NodeId(2), 0)], &unlisted).is_empty());
        // Deleted by someone else meanwhile; later held again: a fresh clock.
        assert!(gc
            .look(t0 + Duration::from_secs(5), &[], &unlisted)
            .is_empty());
        assert!(gc
            .look(t0 + Duration::from_secs(11), &[(NodeId(2), 0)], &unlisted)
            .is_empty());
    }
}
