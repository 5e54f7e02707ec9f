//! The chunk API: routing each CID to its owner and the requests of [`myriad_proto::chunk`].
//!
//! # Job
//! [`Chunks`] turns calls (create, get, put, remove, their batches, offset access, resize,
//! locks, status, listing, stats, insert) into [`ChunkRequest`]s, sends each to the node
//! that owns the chunks, and turns the replies into typed results. [`BlockingChunks`]
//! offers the same calls to threads that run no async tasks.
//!
//! # Routing
//! The owner of a CID is the cached lookup range holding it, else its creator (chunks stay
//! on their creator unless migrated or recovered). A peer that does not own a CID answers
//! `NotOwner`: the client asks the [`Directory`] for the CID's range, caches it and tries
//! again; while the directory still names the node that refused (a restarted peer whose
//! earlier chunks are being recovered), rounds are [`RECOVERY_POLL`] apart and do not
//! count; after [`ChunkOptions::attempts_max`] quick rounds it keeps trying every
//! [`RECOVERY_POLL`] until the call's timeout (during a recovery or migration the
//! superpeers' ranges and the peers' ownership views change for a moment in an order a
//! client can observe; a call then waits instead of failing with "ownership kept
//! moving"). A batch is split per owner, the
//! parts are sent concurrently, and the results come back in the caller's order. An owner
//! that cannot be reached (or that the directory reports dead) gets one lookup refresh
//! (its chunks may have moved), then its items fail with
//! [`ClientError::NodeUnavailable`] — unless the directory says a recovery may move them
//! ([`Directory::may_recover`]: the owner failed, or its failure is not detected yet):
//! then the call waits, looking the chunk up every [`RECOVERY_POLL`], until its range
//! points elsewhere (and retries there) or the call's timeout ends it with
//! [`ClientError::NodeUnavailable`]. No answer within the call's timeout is
//! [`ClientError::Timeout`]. When the owner is the local node and a [`LocalChunks`] is
//! attached, the request is executed in process with no network hop.
//!
//! # Invariants
//! - Every call ends within [`ChunkOptions::timeout`] (plus a lock's own wait for
//!   [`Chunks::lock`]) with a result per item.
//! - Nothing a peer answers panics the client: a reply of the wrong shape or length is
//!   [`ClientError::Protocol`].
//! - The range cache holds at most [`CACHED_RANGES_MAX`] ranges per creator.
//!
//! # Who calls it
//! Applications, tools and benchmarks, through a `NetHandle` and a [`Directory`]
//! (`membership::Membership` in a cluster, a fixed table in tests).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_meta::LookupRange;
use myriad_net::{NetError, NetHandle, PendingResponse};
use myriad_proto::chunk::{ChunkReply, ChunkRequest, ChunkStats, ItemError};
use myriad_types::{ChunkId, NodeId};
use parking_lot::RwLock;
use tokio::time::Instant;

use crate::directory::Directory;
use crate::ClientError;

/// Most lookup ranges cached per creator; beyond it that creator's cache is emptied.
pub const CACHED_RANGES_MAX: usize = 4096;
/// How often routing looks a chunk up again while it waits for a recovery to move it.
pub const RECOVERY_POLL: Duration = Duration::from_millis(30);

/// Least time left on a call's deadline for which a routed call starts another round.
const ROUND_TIME_MIN: Duration = Duration::from_millis(5);

/// Items of one creator needing a fresh lookup in one round from which routing asks for
/// all of the creator's ranges at once ([`Directory::lookup_all`]).
pub const LOOKUP_ALL_ITEMS_MIN: usize = 8;

/// The range of `ranges` (sorted by creator and first LID, not overlapping) holding `cid`.
fn covering(ranges: &[LookupRange], cid: ChunkId) -> Option<&LookupRange> {
    let key = (cid.creator(), cid.local_id());
    let after = ranges.partition_point(|range| (range.creator, range.first) <= key);
    after
        .checked_sub(1)
        .map(|at| &ranges[at])
        .filter(|range| range.creator == key.0 && range.last >= key.1)
}

/// A chunk service in this process (a peer's own), called directly when the owner of a
/// chunk is the local node: no network hop. `myriad-node` implements it for its
/// `ChunkService`.
pub trait LocalChunks: Send + Sync + 'static {
    /// Executes `request` as if it came from this node.
    fn execute(&self, request: ChunkRequest) -> ChunkReply;
    /// The node whose chunks this service holds.
    fn node(&self) -> NodeId;
}

/// Settings of the chunk API.
#[derive(Debug, Clone)]
pub struct ChunkOptions {
    /// Longest a call takes before it fails with [`ClientError::Timeout`]. Default 2 s.
    pub timeout: Duration,
    /// Quick routing rounds per call: a round sends every unfinished item to its presumed
    /// owner; `NotOwner` answers and unreachable owners are looked up and retried in the
    /// next round. Further rounds are paced by [`RECOVERY_POLL`] until the timeout.
    /// Default 4.
    pub attempts_max: u32,
    /// Durability level sent with changing requests (0 = cluster default; see
    /// `myriad_proto::chunk::DURABILITY_*`). Default 0.
    pub durability: u8,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        ChunkOptions {
            timeout: Duration::from_secs(2),
            attempts_max: 4,
            durability: 0,
        }
    }
}

/// Why one request to one node did not produce a reply.
enum CallError {
    /// The node could not be reached (connect failed, connection lost, fenced, dead).
    Unreachable,
    /// Any other failure, final for the items of that request.
    Final(ClientError),
}

/// Where one request went.
enum Sent {
    Local(ChunkReply),
    Remote(PendingResponse),
    Failed(CallError),
}

/// Per-item parse of a reply: `count` results or a protocol error.
type ItemResults<T> = Result<Vec<Result<T, ItemError>>, ClientError>;

/// Where each item of a [`Chunks::routed`] call stands, by item index.
struct Routing<T> {
    /// Final results; `None` while the item is still being routed.
    results: Vec<Option<Result<T, ClientError>>>,
    /// The item was looked up again once after its owner could not be reached.
    refreshed_after_failure: Vec<bool>,
    /// The unreachable owner whose chunks a recovery may move: the item waits for its
    /// range to point elsewhere.
    waiting_on: Vec<Option<NodeId>>,
    /// The node that answered `NotOwner` for an item in the last round.
    refused_by: Vec<Option<NodeId>>,
    /// The owner the item was last sent to.
    last_owner: Vec<NodeId>,
    /// The node whose last answer for an item was `NotOwner` (kept across rounds).
    last_refusal: Vec<Option<NodeId>>,
}

impl<T> Routing<T> {
    fn new(count: usize) -> Routing<T> {
        Routing {
            results: std::iter::repeat_with(|| None).take(count).collect(),
            refreshed_after_failure: vec![false; count],
            waiting_on: vec![None; count],
            refused_by: vec![None; count],
            last_owner: vec![NodeId(0); count],
            last_refusal: vec![None; count],
        }
    }

    /// The results in item order; an item without one ends with the last thing known of
    /// it: the dead owner it waited for, or the refusal of the owner it was last sent to.
    fn finish(self, cids: &[ChunkId]) -> Vec<Result<T, ClientError>> {
        let Routing {
            results,
            waiting_on,
            last_owner,
            ..
        } = self;
        results
            .into_iter()
            .enumerate()
            .map(|(index, result)| {
                result.unwrap_or_else(|| match waiting_on[index] {
                    Some(dead) => Err(ClientError::NodeUnavailable(dead)),
                    None => Err(item_failure(
                        ItemError::NotOwner,
                        cids[index],
                        last_owner[index],
                    )),
                })
            })
            .collect()
    }
}

/// The chunk API over one messaging endpoint. Cheap to share behind an `Arc`.
pub struct Chunks<D: Directory> {
    net: NetHandle,
    directory: Arc<D>,
    local: Option<Arc<dyn LocalChunks>>,
    options: ChunkOptions,
    /// Per creator: first LID → (last LID, owner).
    cache: RwLock<HashMap<NodeId, CachedRanges>>,
}

/// The cached ranges of one creator: first LID → (last LID, owner).
type CachedRanges = BTreeMap<u64, (u64, NodeId)>;

impl<D: Directory> std::fmt::Debug for Chunks<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunks")
            .field("node", &self.directory.local_node())
            .field("local", &self.local.as_ref().map(|local| local.node()))
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

fn net_failure(error: NetError, node: NodeId, timeout: Duration) -> CallError {
    match error {
        NetError::Timeout(_) | NetError::SendTimeout(_) => CallError::Final(ClientError::Timeout {
            what: format!("chunk request to node {node}"),
            timeout_ms: timeout.as_millis() as u64,
        }),
        NetError::Shutdown => CallError::Final(ClientError::Shutdown),
        NetError::MessageTooLarge {
            size_bytes,
            max_bytes,
        } => CallError::Final(ClientError::InvalidArgument(format!(
            "request of {size_bytes} bytes exceeds the message limit of {max_bytes}"
        ))),
        NetError::BlockingInAsyncContext => CallError::Final(ClientError::InvalidArgument(
            "blocking call inside an async runtime".into(),
        )),
        _ => CallError::Unreachable,
    }
}

/// The client error of an item error from `node` about `cid`.
fn item_failure(error: ItemError, cid: ChunkId, node: NodeId) -> ClientError {
    match error {
        ItemError::NotFound => ClientError::NotFound(cid),
        ItemError::NotOwner => ClientError::Server {
            node,
            reason: format!("ownership of chunk {cid} kept moving"),
        },
        ItemError::TooLarge => ClientError::OutOfSpace {
            node,
            reason: "larger than a chunk may be".into(),
        },
        ItemError::OutOfMemory => ClientError::OutOfSpace {
            node,
            reason: "out of memory".into(),
        },
        ItemError::LockTimeout => ClientError::LockTimeout(cid),
        ItemError::Invalid(reason) => {
            ClientError::InvalidArgument(format!("node {node} refused chunk {cid}: {reason}"))
        }
        ItemError::Internal(reason) => ClientError::Server { node, reason },
    }
}

fn wrong_reply(reply: &ChunkReply, expected: &str) -> ClientError {
    match reply {
        ChunkReply::Malformed(reason) => {
            ClientError::Protocol(format!("the peer could not decode the request: {reason}"))
        }
        other => ClientError::Protocol(format!("expected a {expected} reply, got {other:?}")),
    }
}

fn check_count<T>(items: Vec<T>, count: usize) -> Result<Vec<T>, ClientError> {
    if items.len() != count {
        return Err(ClientError::Protocol(format!(
            "reply has {} items for {count} requested",
            items.len()
        )));
    }
    Ok(items)
}

fn parse_data(reply: ChunkReply, count: usize) -> ItemResults<Bytes> {
    match reply {
        ChunkReply::Data(items) => check_count(items, count),
        ChunkReply::Failed(error) => Ok(vec![Err(error); count]),
        other => Err(wrong_reply(&other, "data")),
    }
}

fn parse_statuses(reply: ChunkReply, count: usize) -> ItemResults<()> {
    match reply {
        ChunkReply::Statuses(items) => check_count(items, count),
        ChunkReply::Failed(error) => Ok(vec![Err(error); count]),
        other => Err(wrong_reply(&other, "status")),
    }
}

fn parse_sizes(reply: ChunkReply, count: usize) -> ItemResults<u64> {
    match reply {
        ChunkReply::Sizes(items) => check_count(items, count),
        ChunkReply::Failed(error) => Ok(vec![Err(error); count]),
        other => Err(wrong_reply(&other, "size")),
    }
}

fn single<T>(mut results: Vec<Result<T, ClientError>>) -> Result<T, ClientError> {
    results
        .pop()
        .unwrap_or_else(|| Err(ClientError::Protocol("no result for the item".into())))
}

impl<D: Directory> Chunks<D> {
    /// A chunk API sending through `net`, routing with `directory`.
    pub fn new(net: NetHandle, directory: Arc<D>, options: ChunkOptions) -> Chunks<D> {
        Chunks {
            net,
            directory,
            local: None,
            options,
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// Attaches this process's chunk service: requests for chunks it owns are executed
    /// directly, with no network hop.
    pub fn with_local(mut self, local: Arc<dyn LocalChunks>) -> Chunks<D> {
        self.local = Some(local);
        self
    }

    /// The options in effect.
    pub fn options(&self) -> &ChunkOptions {
        &self.options
    }

    /// The directory used for routing.
    pub fn directory(&self) -> &Arc<D> {
        &self.directory
    }

    /// The blocking view of this API (for threads that run no async tasks).
    pub fn blocking(&self) -> BlockingChunks<'_, D> {
        BlockingChunks { chunks: self }
    }

    // ----- routing -----------------------------------------------------------------------

    /// The node `cid` is sent to: the cached range holding it, else its creator.
    pub fn owner_of(&self, cid: ChunkId) -> NodeId {
        let creator = cid.creator();
        let local_id = cid.local_id();
        self.cache
            .read()
            .get(&creator)
            .and_then(|ranges| ranges.range(..=local_id).next_back())
            .filter(|(_, (last, _))| local_id <= *last)
            .map_or(creator, |(_, (_, owner))| *owner)
    }

    /// Caches a lookup range, replacing the cached ranges it overlaps.
    pub fn remember(&self, range: LookupRange) {
        if range.first > range.last {
            return;
        }
        let mut cache = self.cache.write();
        let ranges = cache.entry(range.creator).or_default();
        let overlapping: Vec<u64> = ranges
            .range(..=range.last)
            .rev()
            .take_while(|(_, (last, _))| *last >= range.first)
            .map(|(first, _)| *first)
            .collect();
        for first in overlapping {
            ranges.remove(&first);
        }
        if ranges.len() >= CACHED_RANGES_MAX {
            ranges.clear();
        }
        ranges.insert(range.first, (range.last, range.owner));
    }

    /// Forgets every cached range (all chunks are presumed on their creators again).
    pub fn clear_cache(&self) {
        self.cache.write().clear();
    }

    fn is_local(&self, node: NodeId) -> Option<&Arc<dyn LocalChunks>> {
        self.local.as_ref().filter(|local| local.node() == node)
    }

    /// Starts one request to `node`: executed at once if local, else queued on the
    /// network (so that requests to several nodes are in flight together).
    async fn start(&self, node: NodeId, request: ChunkRequest, deadline: Instant) -> Sent {
        if let Some(local) = self.is_local(node) {
            return Sent::Local(local.execute(request));
        }
        if !self.directory.is_alive(node) {
            return Sent::Failed(CallError::Unreachable);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Sent::Failed(CallError::Final(self.timeout_error(node)));
        }
        match self
            .net
            .request_later(
                node,
                myriad_proto::types::CHUNK,
                request.encode(),
                remaining,
            )
            .await
        {
            Ok(pending) => Sent::Remote(pending),
            Err(error) => Sent::Failed(net_failure(error, node, self.options.timeout)),
        }
    }

    /// Collects the reply of a started request.
    async fn finish(&self, node: NodeId, sent: Sent) -> Result<ChunkReply, CallError> {
        let bytes = match sent {
            Sent::Local(reply) => return Ok(reply),
            Sent::Failed(error) => return Err(error),
            Sent::Remote(pending) => pending
                .await
                .map_err(|error| net_failure(error, node, self.options.timeout))?,
        };
        ChunkReply::decode(bytes).map_err(|error| {
            CallError::Final(ClientError::Protocol(format!(
                "undecodable reply from node {node}: {error}"
            )))
        })
    }

    fn timeout_error(&self, node: NodeId) -> ClientError {
        ClientError::Timeout {
            what: format!("chunk request to node {node}"),
            timeout_ms: self.options.timeout.as_millis() as u64,
        }
    }

    /// One request to a named node (not routed by CID).
    async fn call_node(
        &self,
        node: NodeId,
        request: ChunkRequest,
        timeout: Duration,
    ) -> Result<ChunkReply, ClientError> {
        let deadline = Instant::now() + timeout;
        let sent = self.start(node, request, deadline).await;
        match self.finish(node, sent).await {
            Ok(ChunkReply::Malformed(reason)) => Err(ClientError::Protocol(format!(
                "node {node} could not decode the request: {reason}"
            ))),
            Ok(reply) => Ok(reply),
            Err(CallError::Unreachable) => Err(ClientError::NodeUnavailable(node)),
            Err(CallError::Final(error)) => Err(error),
        }
    }

    /// Routes items (one CID each) to their owners until each has a final result.
    ///
    /// `build(indices)` makes the request for the items at those indices (in that order);
    /// `parse(reply, count)` splits its reply into per-item results. Each round sends
    /// every unfinished item to its presumed owner; `NotOwner` items, and the items of an
    /// owner that could not be reached (once), are looked up and go to the next round.
    /// The steps of a round: [`group_by_owner`](Self::group_by_owner), send and collect
    /// ([`absorb`](Self::absorb)), [`refresh_lookups`](Self::refresh_lookups) and
    /// [`hold_waiting`](Self::hold_waiting).
    async fn routed<T, B, P>(
        &self,
        cids: &[ChunkId],
        extra_wait: Duration,
        build: B,
        parse: P,
    ) -> Vec<Result<T, ClientError>>
    where
        B: Fn(&[usize]) -> ChunkRequest,
        P: Fn(ChunkReply, usize) -> ItemResults<T>,
    {
        let deadline = Instant::now() + self.options.timeout + extra_wait;
        let mut routing = Routing::new(cids.len());
        let mut pending: Vec<usize> = (0..cids.len()).collect();
        let mut round = 0;
        while !pending.is_empty() {
            // A later round needs time for a round trip; with less left, the items end
            // with the answer they have (a refusal, or the owner they wait for).
            if round > 0 && deadline.saturating_duration_since(Instant::now()) < ROUND_TIME_MIN {
                break;
            }
            if round >= self.options.attempts_max {
                // Ownership kept moving: keep following it, paced, until the deadline.
                if Instant::now() + RECOVERY_POLL >= deadline {
                    break;
                }
                tokio::time::sleep(RECOVERY_POLL).await;
            }
            round += 1;
            let groups = self.group_by_owner(cids, &pending, &mut routing);
            pending.clear();
            // Send all parts first, then collect: the parts travel concurrently.
            let mut in_flight = Vec::with_capacity(groups.len());
            for (owner, indices) in groups {
                let sent = self.start(owner, build(&indices), deadline).await;
                in_flight.push((owner, indices, sent));
            }
            let mut to_refresh = Vec::new();
            for (owner, indices, sent) in in_flight {
                let outcome = match self.finish(owner, sent).await {
                    Ok(reply) => parse(reply, indices.len()).map_err(CallError::Final),
                    Err(error) => Err(error),
                };
                self.absorb(cids, owner, indices, outcome, &mut routing, &mut to_refresh);
            }
            self.refresh_lookups(cids, to_refresh, deadline, &mut routing, &mut pending)
                .await;
            if self.hold_waiting(cids, &mut pending, deadline, &mut routing) {
                round -= 1;
                tokio::time::sleep(RECOVERY_POLL).await;
            }
        }
        routing.finish(cids)
    }

    /// Groups the `pending` items by presumed owner, keeping the caller's order within
    /// each group, and notes the owner each item goes to.
    fn group_by_owner<T>(
        &self,
        cids: &[ChunkId],
        pending: &[usize],
        routing: &mut Routing<T>,
    ) -> Vec<(NodeId, Vec<usize>)> {
        let mut groups: Vec<(NodeId, Vec<usize>)> = Vec::new();
        for &index in pending {
            let owner = self.owner_of(cids[index]);
            routing.last_owner[index] = owner;
            match groups.iter_mut().find(|(node, _)| *node == owner) {
                Some((_, indices)) => indices.push(index),
                None => groups.push((owner, vec![index])),
            }
        }
        groups
    }

    /// Takes the outcome of the part sent to `owner` (the items at `indices`): final
    /// results, and in `to_refresh` the items to look up again.
    fn absorb<T>(
        &self,
        cids: &[ChunkId],
        owner: NodeId,
        indices: Vec<usize>,
        outcome: Result<Vec<Result<T, ItemError>>, CallError>,
        routing: &mut Routing<T>,
        to_refresh: &mut Vec<usize>,
    ) {
        match outcome {
            Ok(items) => {
                for (index, item) in indices.into_iter().zip(items) {
                    match item {
                        Ok(value) => routing.results[index] = Some(Ok(value)),
                        Err(ItemError::NotOwner) => {
                            routing.refused_by[index] = Some(owner);
                            routing.last_refusal[index] = Some(owner);
                            to_refresh.push(index);
                        }
                        Err(error) => {
                            routing.results[index] =
                                Some(Err(item_failure(error, cids[index], owner)))
                        }
                    }
                }
            }
            // The owner is unreachable: its chunks may have moved (migration, or
            // recovery after a failure), so look them up once more. While the
            // directory says a recovery may move them (the owner failed, or its
            // failure is not detected yet), keep looking them up every
            // `RECOVERY_POLL` until the range moves, bounded by `deadline`.
            Err(CallError::Unreachable) => {
                let recovering = self.directory.may_recover(owner);
                for index in indices {
                    if recovering {
                        routing.waiting_on[index] = Some(owner);
                        to_refresh.push(index);
                    } else if routing.refreshed_after_failure[index] {
                        routing.results[index] = Some(Err(ClientError::NodeUnavailable(owner)));
                    } else {
                        routing.refreshed_after_failure[index] = true;
                        to_refresh.push(index);
                    }
                }
            }
            Err(CallError::Final(error)) => {
                let timed_out = matches!(error, ClientError::Timeout { .. });
                for index in indices {
                    // The deadline ran out while asking again a node that had
                    // refused: its refusal is the last real answer.
                    if timed_out && routing.last_refusal[index] == Some(owner) {
                        continue;
                    }
                    routing.results[index] = Some(Err(error.clone()));
                }
            }
        }
    }

    /// Refreshes the lookups of the items in `to_refresh` and puts them back in `pending`
    /// (or ends them with the lookup's error). One answer covers a whole range, so items
    /// inside a range fetched this round are not looked up again.
    async fn refresh_lookups<T>(
        &self,
        cids: &[ChunkId],
        to_refresh: Vec<usize>,
        deadline: Instant,
        routing: &mut Routing<T>,
        pending: &mut Vec<usize>,
    ) {
        let mut fetched: Vec<LookupRange> = Vec::new();
        // Many items of one creator: one request for all its ranges instead of one
        // lookup per range (after a recovery a creator's IDs can be in thousands).
        let mut per_creator: HashMap<NodeId, usize> = HashMap::new();
        for &index in &to_refresh {
            *per_creator.entry(cids[index].creator()).or_default() += 1;
        }
        for (creator, count) in per_creator {
            if count < LOOKUP_ALL_ITEMS_MIN {
                continue;
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let all = tokio::time::timeout(remaining, self.directory.lookup_all(creator));
            if let Ok(Some(Ok(ranges))) = all.await {
                for range in ranges {
                    self.remember(range);
                    fetched.push(range);
                }
            }
        }
        fetched.sort_unstable_by_key(|range| (range.creator, range.first));
        for index in to_refresh {
            let cid = cids[index];
            let covered = covering(&fetched, cid).is_some();
            if !covered {
                let remaining = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(remaining, self.directory.lookup(cid)).await {
                    Ok(Ok(range)) => {
                        self.remember(range);
                        let at = fetched.partition_point(|known| {
                            (known.creator, known.first) < (range.creator, range.first)
                        });
                        fetched.insert(at, range);
                    }
                    Ok(Err(error)) => {
                        routing.results[index] = Some(Err(error));
                        continue;
                    }
                    Err(_) => {
                        routing.results[index] = Some(Err(ClientError::Timeout {
                            what: format!("lookup of chunk {cid}"),
                            timeout_ms: self.options.timeout.as_millis() as u64,
                        }));
                        continue;
                    }
                }
            }
            pending.push(index);
        }
    }

    /// Decides which pending items wait a poll interval before the next round; returns
    /// whether any does (such a round does not count as a routing attempt).
    fn hold_waiting<T>(
        &self,
        cids: &[ChunkId],
        pending: &mut Vec<usize>,
        deadline: Instant,
        routing: &mut Routing<T>,
    ) -> bool {
        // Items whose range still points to the owner they wait for: poll again after
        // a pause, or give up at the deadline.
        let mut still_waiting = false;
        pending.retain(|&index| {
            let Some(dead) = routing.waiting_on[index] else {
                return true;
            };
            if self.owner_of(cids[index]) != dead {
                routing.waiting_on[index] = None;
                return true;
            }
            if Instant::now() + RECOVERY_POLL >= deadline {
                routing.results[index] = Some(Err(ClientError::NodeUnavailable(dead)));
                return false;
            }
            still_waiting = true;
            true
        });
        // Items refused by the node the directory still names (a restarted peer whose
        // earlier chunks are being recovered, or a view that lags): wait a poll
        // interval and ask again, bounded by `deadline`, without using up a round.
        for &index in pending.iter() {
            let Some(refuser) = routing.refused_by[index].take() else {
                continue;
            };
            if self.owner_of(cids[index]) == refuser && Instant::now() + RECOVERY_POLL < deadline {
                still_waiting = true;
            }
        }
        still_waiting
    }

    // ----- creating (on a named peer) --------------------------------------------------

    /// Creates one zeroed chunk of `size` bytes on `peer`.
    pub async fn create(&self, peer: NodeId, size: u64) -> Result<ChunkId, ClientError> {
        let mut cids = self.create_batch(peer, &[size]).await?;
        cids.pop()
            .ok_or_else(|| ClientError::Protocol("create answered no CID".into()))
    }

    /// Creates zeroed chunks of these sizes on `peer` (all or nothing).
    pub async fn create_batch(
        &self,
        peer: NodeId,
        sizes: &[u64],
    ) -> Result<Vec<ChunkId>, ClientError> {
        let request = ChunkRequest::Create {
            durability: self.options.durability,
            sizes: sizes.to_vec(),
        };
        self.created(peer, request, sizes.len()).await
    }

    /// Creates chunks holding these payloads on `peer` (all or nothing).
    pub async fn create_with_data(
        &self,
        peer: NodeId,
        payloads: Vec<Bytes>,
    ) -> Result<Vec<ChunkId>, ClientError> {
        let count = payloads.len();
        let request = ChunkRequest::CreateWithData {
            durability: self.options.durability,
            payloads,
        };
        self.created(peer, request, count).await
    }

    async fn created(
        &self,
        peer: NodeId,
        request: ChunkRequest,
        count: usize,
    ) -> Result<Vec<ChunkId>, ClientError> {
        // A peer whose lease with the superpeers lapsed for a moment (see
        // `crate::lease`) refuses with `NotOwner`; ask again, paced, until the deadline.
        let deadline = Instant::now() + self.options.timeout;
        let reply = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.call_node(peer, request.clone(), left).await? {
                ChunkReply::Failed(ItemError::NotOwner)
                    if Instant::now() + RECOVERY_POLL < deadline =>
                {
                    tokio::time::sleep(RECOVERY_POLL).await;
                }
                reply => break reply,
            }
        };
        match reply {
            ChunkReply::Created(cids) => check_count(cids, count),
            ChunkReply::Failed(error) => Err(match error {
                ItemError::TooLarge | ItemError::OutOfMemory => ClientError::OutOfSpace {
                    node: peer,
                    reason: error.to_string(),
                },
                ItemError::Invalid(reason) => {
                    ClientError::InvalidArgument(format!("node {peer} refused: {reason}"))
                }
                other => ClientError::Server {
                    node: peer,
                    reason: other.to_string(),
                },
            }),
            other => Err(wrong_reply(&other, "created")),
        }
    }

    // ----- routed access -------------------------------------------------------------------

    /// Reads one chunk.
    pub async fn get(&self, cid: ChunkId) -> Result<Bytes, ClientError> {
        single(self.get_batch(&[cid]).await)
    }

    /// Reads many chunks; one result per CID, in order.
    pub async fn get_batch(&self, cids: &[ChunkId]) -> Vec<Result<Bytes, ClientError>> {
        self.routed(
            cids,
            Duration::ZERO,
            |indices| ChunkRequest::Get {
                cids: indices.iter().map(|&i| cids[i]).collect(),
            },
            parse_data,
        )
        .await
    }

    /// Replaces one chunk's bytes (`data` must have the chunk's size).
    pub async fn put(&self, cid: ChunkId, data: Bytes) -> Result<(), ClientError> {
        single(self.put_batch(&[(cid, data)]).await)
    }

    /// Replaces many chunks' bytes; one result per item, in order.
    pub async fn put_batch(&self, items: &[(ChunkId, Bytes)]) -> Vec<Result<(), ClientError>> {
        let cids: Vec<ChunkId> = items.iter().map(|(cid, _)| *cid).collect();
        let durability = self.options.durability;
        self.routed(
            &cids,
            Duration::ZERO,
            |indices| ChunkRequest::Put {
                durability,
                items: indices.iter().map(|&i| items[i].clone()).collect(),
            },
            parse_statuses,
        )
        .await
    }

    /// Removes one chunk.
    pub async fn remove(&self, cid: ChunkId) -> Result<(), ClientError> {
        single(self.remove_batch(&[cid]).await)
    }

    /// Removes many chunks; one result per CID, in order.
    pub async fn remove_batch(&self, cids: &[ChunkId]) -> Vec<Result<(), ClientError>> {
        let durability = self.options.durability;
        self.routed(
            cids,
            Duration::ZERO,
            |indices| ChunkRequest::Remove {
                durability,
                cids: indices.iter().map(|&i| cids[i]).collect(),
            },
            parse_statuses,
        )
        .await
    }

    /// The size of one chunk in bytes.
    pub async fn status(&self, cid: ChunkId) -> Result<u64, ClientError> {
        single(self.status_batch(&[cid]).await)
    }

    /// The sizes of many chunks; one result per CID, in order.
    pub async fn status_batch(&self, cids: &[ChunkId]) -> Vec<Result<u64, ClientError>> {
        self.routed(
            cids,
            Duration::ZERO,
            |indices| ChunkRequest::Status {
                cids: indices.iter().map(|&i| cids[i]).collect(),
            },
            parse_sizes,
        )
        .await
    }

    /// Reads `len` bytes at `offset` of a chunk.
    pub async fn read_at(&self, cid: ChunkId, offset: u64, len: u64) -> Result<Bytes, ClientError> {
        let request = ChunkRequest::ReadAt { cid, offset, len };
        single(
            self.routed(&[cid], Duration::ZERO, |_| request.clone(), parse_data)
                .await,
        )
    }

    /// Overwrites bytes at `offset` of a chunk.
    pub async fn write_at(
        &self,
        cid: ChunkId,
        offset: u64,
        data: Bytes,
    ) -> Result<(), ClientError> {
        let request = ChunkRequest::WriteAt {
            durability: self.options.durability,
            cid,
            offset,
            data,
        };
        single(
            self.routed(&[cid], Duration::ZERO, |_| request.clone(), parse_statuses)
                .await,
        )
    }

    /// Changes a chunk's size (keeping the common prefix, zero-filling growth).
    pub async fn resize(&self, cid: ChunkId, size: u64) -> Result<(), ClientError> {
        let request = ChunkRequest::Resize {
            durability: self.options.durability,
            cid,
            size,
        };
        single(
            self.routed(&[cid], Duration::ZERO, |_| request.clone(), parse_statuses)
                .await,
        )
    }

    /// Takes a chunk's write (or read) lock for this node, waiting at most `wait` at the
    /// owner (zero: try once). While this node holds the write lock, its `get` and `put`
    /// of the chunk work under the lock; other nodes wait.
    pub async fn lock(&self, cid: ChunkId, write: bool, wait: Duration) -> Result<(), ClientError> {
        let request = ChunkRequest::Lock {
            cid,
            write,
            timeout_ms: wait.as_millis().min(u128::from(u64::MAX)) as u64,
        };
        single(
            self.routed(&[cid], wait, |_| request.clone(), parse_statuses)
                .await,
        )
    }

    /// Releases a lock this node holds.
    pub async fn unlock(&self, cid: ChunkId, write: bool) -> Result<(), ClientError> {
        let request = ChunkRequest::Unlock { cid, write };
        single(
            self.routed(&[cid], Duration::ZERO, |_| request.clone(), parse_statuses)
                .await,
        )
    }

    // ----- per peer --------------------------------------------------------------------------

    /// The CID ranges of live chunks `peer` holds (of `creator`, or of all creators), at
    /// most `max`; the flag says whether more were left out.
    pub async fn list(
        &self,
        peer: NodeId,
        creator: Option<NodeId>,
        max: u64,
    ) -> Result<(Vec<(ChunkId, ChunkId)>, bool), ClientError> {
        let request = ChunkRequest::List { creator, max };
        match self.call_node(peer, request, self.options.timeout).await? {
            ChunkReply::Ranges { ranges, truncated } => Ok((ranges, truncated)),
            other => Err(wrong_reply(&other, "ranges")),
        }
    }

    /// The memory summary of `peer`.
    pub async fn stats(&self, peer: NodeId) -> Result<ChunkStats, ClientError> {
        match self
            .call_node(peer, ChunkRequest::Stats, self.options.timeout)
            .await?
        {
            ChunkReply::Stats(stats) => Ok(stats),
            other => Err(wrong_reply(&other, "stats")),
        }
    }

    /// Stores chunks on `peer` under their given IDs (migration, recovery); one result
    /// per item, in order. Ownership does not change: that is the superpeers' business.
    pub async fn insert(
        &self,
        peer: NodeId,
        items: Vec<(ChunkId, Bytes)>,
    ) -> Vec<Result<(), ClientError>> {
        let cids: Vec<ChunkId> = items.iter().map(|(cid, _)| *cid).collect();
        let count = items.len();
        let request = ChunkRequest::Insert {
            durability: self.options.durability,
            items,
        };
        let reply = self.call_node(peer, request, self.options.timeout).await;
        match reply.and_then(|reply| parse_statuses(reply, count)) {
            Ok(items) => items
                .into_iter()
                .zip(cids)
                .map(|(item, cid)| item.map_err(|error| item_failure(error, cid, peer)))
                .collect(),
            Err(error) => vec![Err(error); count],
        }
    }
}

/// The chunk API for threads that run no async tasks: each call blocks on the endpoint's
/// runtime until the async call ends. Called from inside an async runtime it fails with
/// [`ClientError::InvalidArgument`] instead of stalling it.
#[derive(Debug)]
pub struct BlockingChunks<'a, D: Directory> {
    chunks: &'a Chunks<D>,
}

impl<D: Directory> BlockingChunks<'_, D> {
    fn block<T>(
        &self,
        future: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(ClientError::InvalidArgument(
                "blocking chunk call inside an async runtime; use the async API".into(),
            ));
        }
        self.chunks.net.runtime().block_on(future)
    }

    fn block_each<T>(
        &self,
        count: usize,
        future: impl Future<Output = Vec<Result<T, ClientError>>>,
    ) -> Vec<Result<T, ClientError>> {
        match self.block(async { Ok(future.await) }) {
            Ok(results) => results,
            Err(error) => (0..count).map(|_| Err(error.clone())).collect(),
        }
    }

    /// [`Chunks::create`].
    pub fn create(&self, peer: NodeId, size: u64) -> Result<ChunkId, ClientError> {
        self.block(self.chunks.create(peer, size))
    }

    /// [`Chunks::create_batch`].
    pub fn create_batch(&self, peer: NodeId, sizes: &[u64]) -> Result<Vec<ChunkId>, ClientError> {
        self.block(self.chunks.create_batch(peer, sizes))
    }

    /// [`Chunks::create_with_data`].
    pub fn create_with_data(
        &self,
        peer: NodeId,
        payloads: Vec<Bytes>,
    ) -> Result<Vec<ChunkId>, ClientError> {
        self.block(self.chunks.create_with_data(peer, payloads))
    }

    /// [`Chunks::get`].
    ///
    /// A single get to a remote owner first tries the messaging layer's blocking request
    /// directly (its send needs no runtime hand-off): in a debug build over loopback, a
    /// raw blocking request did 6,400 gets/s where `block_on` of the async call did 4,300
    /// (one run on a shared 2-core machine; with this path the two are within noise,
    /// see the `single_get_round_trips_per_second` test in `myriad-node`). Anything
    /// but a clean answer (`NotOwner`, an unreachable owner) falls back to the routed
    /// call, which refreshes the lookup and retries.
    ///
    /// The blocking request travels on one of the messaging layer's direct request lanes
    /// (`NetHandle::request_blocking`): the calling thread writes the request and reads
    /// the answer itself, with no hand-off to the I/O thread.
    pub fn get(&self, cid: ChunkId) -> Result<Bytes, ClientError> {
        let direct = self.direct(cid, || ChunkRequest::get_one(cid), parse_data);
        if let Some(result) = direct {
            return result;
        }
        self.block(self.chunks.get(cid))
    }

    /// The direct attempt of a single-item call to `cid`'s presumed owner (the blocking
    /// [`BlockingChunks::get`] and [`BlockingChunks::put`]); `None` to fall back to
    /// routing.
    fn direct<T>(
        &self,
        cid: ChunkId,
        request: impl FnOnce() -> ChunkRequest,
        parse: fn(ChunkReply, usize) -> ItemResults<T>,
    ) -> Option<Result<T, ClientError>> {
        let chunks = self.chunks;
        let owner = chunks.owner_of(cid);
        if chunks.is_local(owner).is_some() || !chunks.directory.is_alive(owner) {
            return None;
        }
        let reply = chunks.net.request_blocking(
            owner,
            myriad_proto::types::CHUNK,
            request().encode(),
            chunks.options.timeout,
        );
        let bytes = match reply {
            Ok(bytes) => bytes,
            Err(error) => {
                return match net_failure(error, owner, chunks.options.timeout) {
                    CallError::Unreachable => None,
                    CallError::Final(error) => Some(Err(error)),
                }
            }
        };
        let items = ChunkReply::decode(bytes)
            .map_err(|error| {
                ClientError::Protocol(format!("undecodable reply from node {owner}: {error}"))
            })
            .and_then(|reply| parse(reply, 1));
        match items.map(|mut items| items.pop()) {
            Ok(Some(Ok(data))) => Some(Ok(data)),
            Ok(Some(Err(ItemError::NotOwner))) => None,
            Ok(Some(Err(error))) => Some(Err(item_failure(error, cid, owner))),
            Ok(None) => Some(Err(ClientError::Protocol("no result for the item".into()))),
            Err(error) => Some(Err(error)),
        }
    }

    /// [`Chunks::get_batch`]. Like [`BlockingChunks::get`], first tried on this thread:
    /// one request per presumed owner, all sent before any answer is awaited (direct
    /// request lanes, see [`BlockingChunks::direct_batch`]); the items without a clean
    /// answer go through the routed call.
    pub fn get_batch(&self, cids: &[ChunkId]) -> Vec<Result<Bytes, ClientError>> {
        self.batch(
            cids,
            |indices| ChunkRequest::Get {
                cids: indices.iter().map(|&i| cids[i]).collect(),
            },
            parse_data,
            |rest| {
                let rest: Vec<ChunkId> = rest.iter().map(|&i| cids[i]).collect();
                self.block_each(rest.len(), self.chunks.get_batch(&rest))
            },
        )
    }

    /// A batched call on this thread with a routed fallback: [`direct_batch`]
    /// (Self::direct_batch) answers what it can; `routed(indices)` performs the call for
    /// the remaining items (their indices, in order) and returns their results in order.
    fn batch<T>(
        &self,
        cids: &[ChunkId],
        build: impl Fn(&[usize]) -> ChunkRequest,
        parse: fn(ChunkReply, usize) -> ItemResults<T>,
        routed: impl FnOnce(&[usize]) -> Vec<Result<T, ClientError>>,
    ) -> Vec<Result<T, ClientError>> {
        let Some(mut results) = self.direct_batch(cids, build, parse) else {
            let all: Vec<usize> = (0..cids.len()).collect();
            return routed(&all);
        };
        let rest: Vec<usize> = (0..cids.len()).filter(|&i| results[i].is_none()).collect();
        if !rest.is_empty() {
            for (index, result) in rest.iter().zip(routed(&rest)) {
                results[*index] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|result| {
                result
                    .unwrap_or_else(|| Err(ClientError::Protocol("no result for the item".into())))
            })
            .collect()
    }

    /// The direct attempt of a batched call: the items grouped by presumed owner, one
    /// request per owner, all sent from this thread before any answer is awaited
    /// (`NetHandle::requests_blocking`: no hand-off to the I/O thread when a direct lane
    /// is free). Per item: `Some` final result, or `None` to route it (`NotOwner`, an
    /// unreachable owner). `None` as a whole when some owner is this node, is not alive
    /// in the directory, or this thread runs async tasks: the routed call handles those.
    fn direct_batch<T>(
        &self,
        cids: &[ChunkId],
        build: impl Fn(&[usize]) -> ChunkRequest,
        parse: fn(ChunkReply, usize) -> ItemResults<T>,
    ) -> Option<Vec<Option<Result<T, ClientError>>>> {
        let chunks = self.chunks;
        if cids.is_empty() || tokio::runtime::Handle::try_current().is_ok() {
            return None;
        }
        let mut groups: Vec<(NodeId, Vec<usize>)> = Vec::new();
        for (index, &cid) in cids.iter().enumerate() {
            let owner = chunks.owner_of(cid);
            match groups.iter_mut().find(|(node, _)| *node == owner) {
                Some((_, indices)) => indices.push(index),
                None => {
                    if chunks.is_local(owner).is_some() || !chunks.directory.is_alive(owner) {
                        return None;
                    }
                    groups.push((owner, vec![index]));
                }
            }
        }
        let requests = groups
            .iter()
            .map(|(owner, indices)| (*owner, myriad_proto::types::CHUNK, build(indices).encode()))
            .collect();
        let replies = chunks
            .net
            .requests_blocking(requests, chunks.options.timeout);
        let mut results: Vec<Option<Result<T, ClientError>>> =
            (0..cids.len()).map(|_| None).collect();
        for ((owner, indices), reply) in groups.into_iter().zip(replies) {
            let bytes = match reply {
                Ok(bytes) => bytes,
                Err(error) => {
                    if let CallError::Final(error) =
                        net_failure(error, owner, chunks.options.timeout)
                    {
                        for &index in &indices {
                            results[index] = Some(Err(error.clone()));
                        }
                    }
                    continue;
                }
            };
            let items = ChunkReply::decode(bytes)
                .map_err(|error| {
                    ClientError::Protocol(format!("undecodable reply from node {owner}: {error}"))
                })
                .and_then(|reply| parse(reply, indices.len()));
            match items {
                Ok(items) => {
                    for (&index, item) in indices.iter().zip(items) {
                        results[index] = match item {
                            Ok(value) => Some(Ok(value)),
                            Err(ItemError::NotOwner) => None,
                            Err(error) => Some(Err(item_failure(error, cids[index], owner))),
                        };
                    }
                }
                Err(error) => {
                    for &index in &indices {
                        results[index] = Some(Err(error.clone()));
                    }
                }
            }
        }
        Some(results)
    }

    /// [`Chunks::put`]. Like [`BlockingChunks::get`], first tried as one blocking request
    /// to the presumed owner (on a direct request lane); anything but a clean answer falls
    /// back to the routed call.
    pub fn put(&self, cid: ChunkId, data: Bytes) -> Result<(), ClientError> {
        let durability = self.chunks.options.durability;
        let request = || ChunkRequest::Put {
            durability,
            items: vec![(cid, data.clone())],
        };
        if let Some(result) = self.direct(cid, request, parse_statuses) {
            return result;
        }
        self.block(self.chunks.put(cid, data))
    }

    /// [`Chunks::put_batch`], first tried on this thread like [`BlockingChunks::get_batch`].
    pub fn put_batch(&self, items: &[(ChunkId, Bytes)]) -> Vec<Result<(), ClientError>> {
        let cids: Vec<ChunkId> = items.iter().map(|(cid, _)| *cid).collect();
        let durability = self.chunks.options.durability;
        self.batch(
            &cids,
            |indices| ChunkRequest::Put {
                durability,
                items: indices.iter().map(|&i| items[i].clone()).collect(),
            },
            parse_statuses,
            |rest| {
                let rest: Vec<(ChunkId, Bytes)> = rest.iter().map(|&i| items[i].clone()).collect();
                self.block_each(rest.len(), self.chunks.put_batch(&rest))
            },
        )
    }

    /// [`Chunks::remove`].
    pub fn remove(&self, cid: ChunkId) -> Result<(), ClientError> {
        self.block(self.chunks.remove(cid))
    }

    /// [`Chunks::remove_batch`].
    pub fn remove_batch(&self, cids: &[ChunkId]) -> Vec<Result<(), ClientError>> {
        self.block_each(cids.len(), self.chunks.remove_batch(cids))
    }

    /// [`Chunks::status`].
    pub fn status(&self, cid: ChunkId) -> Result<u64, ClientError> {
        self.block(self.chunks.status(cid))
    }

    /// [`Chunks::status_batch`].
    pub fn status_batch(&self, cids: &[ChunkId]) -> Vec<Result<u64, ClientError>> {
        self.block_each(cids.len(), self.chunks.status_batch(cids))
    }

    /// [`Chunks::read_at`].
    pub fn read_at(&self, cid: ChunkId, offset: u64, len: u64) -> Result<Bytes, ClientError> {
        self.block(self.chunks.read_at(cid, offset, len))
    }

    /// [`Chunks::write_at`].
    pub fn write_at(&self, cid: ChunkId, offset: u64, data: Bytes) -> Result<(), ClientError> {
        self.block(self.chunks.write_at(cid, offset, data))
    }

    /// [`Chunks::resize`].
    pub fn resize(&self, cid: ChunkId, size: u64) -> Result<(), ClientError> {
        self.block(self.chunks.resize(cid, size))
    }

    /// [`Chunks::lock`].
    pub fn lock(&self, cid: ChunkId, write: bool, wait: Duration) -> Result<(), ClientError> {
        self.block(self.chunks.lock(cid, write, wait))
    }

    /// [`Chunks::unlock`].
    pub fn unlock(&self, cid: ChunkId, write: bool) -> Result<(), ClientError> {
        self.block(self.chunks.unlock(cid, write))
    }

    /// [`Chunks::list`].
    pub fn list(
        &self,
        peer: NodeId,
        creator: Option<NodeId>,
        max: u64,
    ) -> Result<(Vec<(ChunkId, ChunkId)>, bool), ClientError> {
        self.block(self.chunks.list(peer, creator, max))
    }

    /// [`Chunks::stats`].
    pub fn stats(&self, peer: NodeId) -> Result<ChunkStats, ClientError> {
        self.block(self.chunks.stats(peer))
    }

    /// [`Chunks::insert`].
    pub fn insert(
        &self,
        peer: NodeId,
        items: Vec<(ChunkId, Bytes)>,
    ) -> Vec<Result<(), ClientError>> {
        let count = items.len();
        self.block_each(count, self.chunks.insert(peer, items))
    }
}

#[cfg(test)]
mod covering_tests {
    use super::*;

    #[test]
    fn finds_the_range_holding_a_cid_or_none() {
        let range = |creator: u16, first: u64, last: u64| LookupRange {
            creator: NodeId(creator),
            first,
            last,
            owner: NodeId(9),
        };
        let ranges = [range(2, 0, 9), range(2, 20, 29), range(3, 5, 5)];
        let cid = |creator: u16, lid: u64| ChunkId::new(NodeId(creator), lid).expect("cid");
        assert_eq!(covering(&ranges, cid(2, 0)), Some(&ranges[0]));
        assert_eq!(covering(&ranges, cid(2, 9)), Some(&ranges[0]));
        assert_eq!(covering(&ranges, cid(2, 10)), None);
        assert_eq!(covering(&ranges, cid(2, 25)), Some(&ranges[1]));
        assert_eq!(covering(&ranges, cid(3, 5)), Some(&ranges[2]));
        assert_eq!(covering(&ranges, cid(3, 4)), None);
        assert_eq!(covering(&ranges, cid(1, 0)), None);
        assert_eq!(covering(&[], cid(2, 0)), None);
    }
}
