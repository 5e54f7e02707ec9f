//! [`Client`]: one handle on a cluster: the chunk API plus nameservice, barriers, temporary
//! storage, node lists and migration, async or blocking.
//!
//! A client joins the cluster as a node of role `Client` (the superpeers assign its ID and
//! watch it with heartbeats) and leaves on [`Client::shutdown`]. A peer process builds the
//! same handle over its own membership with [`Client::from_parts`], so that applications
//! inside a peer use one API, local chunks without a network hop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use myriad_meta::{Command, NodeRecord, Response, Role};
use myriad_net::{Endpoint, Handlers};
use myriad_proto::meta::{BarrierStatus, MetaReply, MetaRequest, StatusReply};
use myriad_proto::migrate::{MigrateReply, MigrateRequest};
use myriad_proto::recovery::RecoveryStatusReply;
use myriad_types::{ChunkId, NodeId};
use parking_lot::Mutex;
use tokio::runtime::Handle;

use crate::chunk::{BlockingChunks, ChunkOptions, Chunks};
use crate::membership::{JoinConfig, Membership};
use crate::ClientError;

mod balance;
mod drain;
mod monitor;

pub use balance::{plan as balance_plan, BalanceOptions, BalanceRound, PeerLoad};
pub use drain::{DrainOptions, DrainProgress, DrainReport, DRAIN_PIECE_CHUNKS};
pub use monitor::MONITOR_QUERY_TIMEOUT;

/// How long a superpeer may take to answer a recovery-status request.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Default of a client's `join.lane_spin`: a blocking call that is the only one of its
/// process waiting on a direct lane polls the lane this long for the answer before its
/// thread blocks (about one loopback round trip of a batch on a quiet machine; see
/// `myriad_net::Config::lane_spin`). Calls from several threads at once never spin.
pub const LANE_SPIN_DEFAULT: Duration = Duration::from_micros(50);

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Superpeers to contact and what to announce (the role is forced to `Client`).
    pub join: JoinConfig,
    /// Timeouts and retries of chunk calls.
    pub chunks: ChunkOptions,
}

impl ClientConfig {
    /// Defaults for the given superpeers, with no secret yet: set `join.secret` (or use
    /// [`ClientConfig::with_secret_file`]); joining without one is refused. Lone blocking
    /// calls spin for [`LANE_SPIN_DEFAULT`].
    pub fn new(superpeers: Vec<(NodeId, SocketAddr)>) -> ClientConfig {
        let mut join = JoinConfig::new(superpeers, Role::Client);
        join.lane_spin = LANE_SPIN_DEFAULT;
        ClientConfig {
            join,
            chunks: ChunkOptions::default(),
        }
    }

    /// Sets the cluster secret to the content of `path` (a file of mode `0600`, such as a
    /// local cluster's `DIR/secret`; see `myriad_net::secret::read_file`).
    pub fn with_secret_file(mut self, path: &std::path::Path) -> Result<ClientConfig, ClientError> {
        self.join.secret = myriad_net::secret::read_file(path)
            .map_err(|error| ClientError::InvalidArgument(error.to_string()))?;
        Ok(self)
    }

    /// Turns TLS on with the CA and certificate `NAME` of a directory written by
    /// `myriad cert` (`DIR/ca.pem`, `DIR/NAME.pem`, `DIR/NAME.key`).
    pub fn with_tls_dir(
        mut self,
        dir: &std::path::Path,
        name: &str,
    ) -> Result<ClientConfig, ClientError> {
        self.join.tls = Some(
            myriad_net::TlsConfig::from_dir(dir, name)
                .map_err(|error| ClientError::InvalidArgument(error.to_string()))?,
        );
        Ok(self)
    }
}

/// A connection to a cluster. Cheap to clone; every clone shares the node identity.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// Present when this client owns its endpoint (not when built over a peer's).
    endpoint: Mutex<Option<Endpoint>>,
    membership: Arc<Membership>,
    chunks: Chunks<Membership>,
    runtime: Handle,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("node", &self.inner.membership.node_id())
            .finish_non_exhaustive()
    }
}

fn unexpected(reply: MetaReply) -> ClientError {
    ClientError::Protocol(format!("unexpected superpeer reply: {reply:?}"))
}

impl Client {
    /// Joins the cluster with default settings and the cluster secret `secret`. Blocking:
    /// call from outside a tokio runtime.
    pub fn connect(
        superpeers: Vec<(NodeId, SocketAddr)>,
        secret: impl Into<Vec<u8>>,
    ) -> Result<Client, ClientError> {
        let mut config = ClientConfig::new(superpeers);
        config.join.secret = secret.into();
        Client::connect_with(config)
    }

    /// Joins the cluster. Blocking: call from outside a tokio runtime.
    pub fn connect_with(mut config: ClientConfig) -> Result<Client, ClientError> {
        config.join.role = Role::Client;
        let (endpoint, membership) = Membership::join_blocking(config.join, Handlers::new())?;
        Ok(Client::assemble(Some(endpoint), membership, config.chunks))
    }

    /// Joins the cluster from async code.
    pub async fn connect_async(mut config: ClientConfig) -> Result<Client, ClientError> {
        config.join.role = Role::Client;
        let (endpoint, membership) = Membership::join(config.join, Handlers::new()).await?;
        Ok(Client::assemble(Some(endpoint), membership, config.chunks))
    }

    fn assemble(
        endpoint: Option<Endpoint>,
        membership: Arc<Membership>,
        options: ChunkOptions,
    ) -> Client {
        let runtime = membership.net().runtime();
        let chunks = Chunks::new(membership.net().clone(), Arc::clone(&membership), options);
        Client {
            inner: Arc::new(Inner {
                endpoint: Mutex::new(endpoint),
                membership,
                chunks,
                runtime,
            }),
        }
    }

    /// A client over an existing node's membership and chunk API (a peer hosting an
    /// application). The node keeps its endpoint; [`Client::shutdown`] then does nothing.
    pub fn from_parts(membership: Arc<Membership>, chunks: Chunks<Membership>) -> Client {
        let runtime = membership.net().runtime();
        Client {
            inner: Arc::new(Inner {
                endpoint: Mutex::new(None),
                membership,
                chunks,
                runtime,
            }),
        }
    }

    /// This node's ID.
    pub fn node_id(&self) -> NodeId {
        self.inner.membership.node_id()
    }

    /// The node's view of the cluster (node table, events, raw metadata requests).
    pub fn membership(&self) -> &Arc<Membership> {
        &self.inner.membership
    }

    /// The async chunk API.
    pub fn chunks(&self) -> &Chunks<Membership> {
        &self.inner.chunks
    }

    /// The blocking twin of this client.
    pub fn blocking(&self) -> BlockingClient<'_> {
        BlockingClient { client: self }
    }

    async fn request(&self, request: MetaRequest) -> Result<MetaReply, ClientError> {
        Ok(self.inner.membership.request(request).await?)
    }

    /// Commits one of the client's own writes: at most once (a lost answer is an unknown
    /// outcome, never a second application behind the caller's back).
    async fn write(&self, command: Command) -> Result<Response, ClientError> {
        Ok(self.inner.membership.write_at_most_once(command).await?)
    }

    /// Binds `name` to `cid` (replacing an earlier binding).
    pub async fn name_register(&self, name: &str, cid: ChunkId) -> Result<(), ClientError> {
        self.write(Command::NameRegister {
            name: name.to_owned(),
            cid,
        })
        .await
        .map(|_| ())
    }

    /// The CID bound to `name`, if any.
    pub async fn name_get(&self, name: &str) -> Result<Option<ChunkId>, ClientError> {
        match self.request(MetaRequest::NameGet(name.to_owned())).await? {
            MetaReply::Name(cid) => Ok(cid),
            other => Err(unexpected(other)),
        }
    }

    /// Every registered name with its CID.
    pub async fn name_list(&self) -> Result<Vec<(String, ChunkId)>, ClientError> {
        match self.request(MetaRequest::NameList).await? {
            MetaReply::Names(names) => Ok(names),
            other => Err(unexpected(other)),
        }
    }

    /// Removes a name.
    pub async fn name_remove(&self, name: &str) -> Result<(), ClientError> {
        self.write(Command::NameRemove {
            name: name.to_owned(),
        })
        .await
        .map(|_| ())
    }

    /// Allocates a barrier for `size` participants; returns its ID.
    pub async fn barrier_alloc(&self, size: u32) -> Result<u32, ClientError> {
        match self.write(Command::BarrierAlloc { size }).await? {
            Response::BarrierAllocated(id) => Ok(id),
            other => Err(ClientError::Protocol(format!(
                "unexpected barrier reply: {other:?}"
            ))),
        }
    }

    /// Signs on to barrier `id` with `value` and waits (at most `timeout`) until the round
    /// is complete; returns every participant's value.
    pub async fn barrier_sign_on(
        &self,
        id: u32,
        value: u64,
        timeout: Duration,
    ) -> Result<Vec<(NodeId, u64)>, ClientError> {
        Ok(self
            .inner
            .membership
            .barrier_sign_on(id, value, timeout)
            .await?)
    }

    /// A barrier's size, round and sign-ons (`None`: no such barrier).
    pub async fn barrier_status(&self, id: u32) -> Result<Option<BarrierStatus>, ClientError> {
        match self.request(MetaRequest::BarrierStatus(id)).await? {
            MetaReply::Barrier(status) => Ok(status),
            other => Err(unexpected(other)),
        }
    }

    /// Changes a barrier's participant count.
    pub async fn barrier_resize(&self, id: u32, size: u32) -> Result<(), ClientError> {
        self.write(Command::BarrierResize { id, size })
            .await
            .map(|_| ())
    }

    /// Frees a barrier.
    pub async fn barrier_free(&self, id: u32) -> Result<(), ClientError> {
        self.write(Command::BarrierFree { id }).await.map(|_| ())
    }

    /// Stores a new blob in temporary storage (fails if the name exists).
    pub async fn tmp_create(&self, name: &str, data: Bytes) -> Result<(), ClientError> {
        self.write(Command::TmpPut {
            name: name.to_owned(),
            data: data.to_vec(),
            create_only: true,
        })
        .await
        .map(|_| ())
    }

    /// Stores a blob in temporary storage, replacing one of the same name.
    pub async fn tmp_put(&self, name: &str, data: Bytes) -> Result<(), ClientError> {
        self.write(Command::TmpPut {
            name: name.to_owned(),
            data: data.to_vec(),
            create_only: false,
        })
        .await
        .map(|_| ())
    }

    /// A blob from temporary storage (`None`: no such name).
    pub async fn tmp_get(&self, name: &str) -> Result<Option<Bytes>, ClientError> {
        match self.request(MetaRequest::TmpGet(name.to_owned())).await? {
            MetaReply::Tmp(data) => Ok(data.map(Bytes::from)),
            other => Err(unexpected(other)),
        }
    }

    /// Removes a blob from temporary storage.
    pub async fn tmp_remove(&self, name: &str) -> Result<(), ClientError> {
        self.write(Command::TmpRemove {
            name: name.to_owned(),
        })
        .await
        .map(|_| ())
    }

    /// Names and sizes of the blobs in temporary storage.
    pub async fn tmp_list(&self) -> Result<Vec<(String, u64)>, ClientError> {
        match self.request(MetaRequest::TmpList).await? {
            MetaReply::TmpList(list) => Ok(list),
            other => Err(unexpected(other)),
        }
    }

    /// The superpeers' node table (fresh, not this node's cached view).
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, ClientError> {
        match self.request(MetaRequest::Nodes).await? {
            MetaReply::Nodes(nodes) => Ok(nodes),
            other => Err(unexpected(other)),
        }
    }

    /// The ranges of `creator`'s CIDs that live elsewhere than on `creator`:
    /// `(first LID, last LID, owner)`.
    pub async fn lookup_tree(
        &self,
        creator: NodeId,
    ) -> Result<Vec<(u64, u64, NodeId)>, ClientError> {
        match self.request(MetaRequest::LookupTree(creator)).await? {
            MetaReply::LookupTree(ranges) => Ok(ranges),
            other => Err(unexpected(other)),
        }
    }

    /// The backup zones of `owner` and their backup peers.
    pub async fn zones(&self, owner: NodeId) -> Result<Vec<(u32, Vec<NodeId>)>, ClientError> {
        match self.request(MetaRequest::Zones(owner)).await? {
            MetaReply::Zones(zones) => Ok(zones),
            other => Err(unexpected(other)),
        }
    }

    /// The superpeer leader's recovery table: every zone recovery it coordinated, with its
    /// state, restorer, chunks and milliseconds since the failure. Asks the configured
    /// superpeers in turn until the leader answers (only the leader coordinates).
    pub async fn recovery_status(&self) -> Result<RecoveryStatusReply, ClientError> {
        Ok(self
            .inner
            .membership
            .recovery_status(STATUS_TIMEOUT)
            .await?)
    }

    /// The superpeer group's state as the answering superpeer sees it.
    pub async fn status(&self) -> Result<StatusReply, ClientError> {
        match self.request(MetaRequest::Status).await? {
            MetaReply::Status(status) => Ok(status),
            other => Err(unexpected(other)),
        }
    }

    /// Adds superpeer `id`, already running at `address` and started to join
    /// (`myriad superpeer --join`), to the Raft group; returns the leader's view of the
    /// group once the new member votes. Idempotent: adding a member again changes nothing.
    pub async fn add_superpeer(
        &self,
        id: NodeId,
        address: SocketAddr,
    ) -> Result<StatusReply, ClientError> {
        self.group_change(MetaRequest::AddSuperpeer {
            id,
            address: address.to_string(),
        })
        .await
    }

    /// Removes superpeer `id` from the Raft group; returns the leader's view of the group.
    pub async fn remove_superpeer(&self, id: NodeId) -> Result<StatusReply, ClientError> {
        self.group_change(MetaRequest::RemoveSuperpeer(id)).await
    }

    async fn group_change(&self, request: MetaRequest) -> Result<StatusReply, ClientError> {
        match self.request(request).await? {
            MetaReply::Status(status) => Ok(status),
            MetaReply::Response(Response::Error(error)) => Err(ClientError::Meta(error)),
            other => Err(unexpected(other)),
        }
    }

    /// Moves the chunks `first..=last` (CIDs of one creator, all on one owner) to peer `to`;
    /// returns how many chunks moved. Clients find them at the new owner afterwards.
    pub async fn migrate(
        &self,
        first: ChunkId,
        last: ChunkId,
        to: NodeId,
    ) -> Result<u64, ClientError> {
        if first.creator() != last.creator() || first > last {
            return Err(ClientError::InvalidArgument(format!(
                "{first}..={last} is not an ascending range of one creator"
            )));
        }
        let owner = self.inner.chunks.owner_of(first);
        self.migrate_from(owner, first, last, to).await
    }

    /// Like [`Client::migrate`], with the request sent to `owner` (the peer that holds the
    /// range) instead of the owner this client's cache names; the peer refuses a range it
    /// does not own. Used by [`Client::drain`], which knows the holder from its listing.
    pub async fn migrate_from(
        &self,
        owner: NodeId,
        first: ChunkId,
        last: ChunkId,
        to: NodeId,
    ) -> Result<u64, ClientError> {
        if first.creator() != last.creator() || first > last {
            return Err(ClientError::InvalidArgument(format!(
                "{first}..={last} is not an ascending range of one creator"
            )));
        }
        let payload = MigrateRequest { first, last, to }.encode();
        let timeout = Duration::from_secs(60);
        let reply = self
            .inner
            .membership
            .net()
            .request(owner, myriad_proto::types::MIGRATE, payload, timeout)
            .await
            .map_err(|_| ClientError::NodeUnavailable(owner))?;
        match MigrateReply::decode(reply) {
            Ok(MigrateReply::Moved(count)) => {
                self.inner.chunks.clear_cache();
                Ok(count)
            }
            Ok(MigrateReply::Failed(reason)) => Err(ClientError::Server {
                node: owner,
                reason,
            }),
            Err(error) => Err(ClientError::Protocol(error.to_string())),
        }
    }

    /// Leaves the cluster and closes the endpoint (when this client owns it). Other clones
    /// stop working. Blocking when called outside a runtime; best effort inside one.
    pub fn shutdown(&self) {
        let endpoint = self.inner.endpoint.lock().take();
        if let Some(endpoint) = endpoint {
            if Handle::try_current().is_err() {
                let membership = Arc::clone(&self.inner.membership);
                let left = self.inner.runtime.block_on(async move {
                    tokio::time::timeout(Duration::from_secs(2), membership.leave()).await
                });
                if !matches!(left, Ok(Ok(()))) {
                    tracing::warn!("the client could not leave the cluster in an orderly way");
                }
            }
            endpoint.shutdown();
        }
    }
}

/// The blocking form of [`Client`]: the same calls, each waiting for its result. Use it
/// from plain threads, never from inside a tokio runtime.
#[derive(Debug, Clone, Copy)]
pub struct BlockingClient<'a> {
    client: &'a Client,
}

macro_rules! blocking {
    ($(#[$doc:meta] fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            #[$doc]
            pub fn $name(&self, $($arg: $ty),*) -> $ret {
                self.block_on(self.client.$name($($arg),*))
            }
        )*
    };
}

impl BlockingClient<'_> {
    fn block_on<T>(
        &self,
        future: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        if Handle::try_current().is_ok() {
            return Err(ClientError::InvalidArgument(
                "blocking client calls cannot run inside a tokio runtime; use the async API"
                    .to_owned(),
            ));
        }
        self.client.inner.runtime.block_on(future)
    }

    /// The blocking chunk API.
    pub fn chunks(&self) -> BlockingChunks<'_, Membership> {
        self.client.inner.chunks.blocking()
    }

    blocking! {
        /// See [`Client::name_register`].
        fn name_register(name: &str, cid: ChunkId) -> Result<(), ClientError>;
        /// See [`Client::name_get`].
        fn name_get(name: &str) -> Result<Option<ChunkId>, ClientError>;
        /// See [`Client::name_list`].
        fn name_list() -> Result<Vec<(String, ChunkId)>, ClientError>;
        /// See [`Client::name_remove`].
        fn name_remove(name: &str) -> Result<(), ClientError>;
        /// See [`Client::barrier_alloc`].
        fn barrier_alloc(size: u32) -> Result<u32, ClientError>;
        /// See [`Client::barrier_sign_on`].
        fn barrier_sign_on(id: u32, value: u64, timeout: Duration) -> Result<Vec<(NodeId, u64)>, ClientError>;
        /// See [`Client::barrier_status`].
        fn barrier_status(id: u32) -> Result<Option<BarrierStatus>, ClientError>;
        /// See [`Client::barrier_resize`].
        fn barrier_resize(id: u32, size: u32) -> Result<(), ClientError>;
        /// See [`Client::barrier_free`].
        fn barrier_free(id: u32) -> Result<(), ClientError>;
        /// See [`Client::tmp_create`].
        fn tmp_create(name: &str, data: Bytes) -> Result<(), ClientError>;
        /// See [`Client::tmp_put`].
        fn tmp_put(name: &str, data: Bytes) -> Result<(), ClientError>;
        /// See [`Client::tmp_get`].
        fn tmp_get(name: &str) -> Result<Option<Bytes>, ClientError>;
        /// See [`Client::tmp_remove`].
        fn tmp_remove(name: &str) -> Result<(), ClientError>;
        /// See [`Client::tmp_list`].
        fn tmp_list() -> Result<Vec<(String, u64)>, ClientError>;
        /// See [`Client::nodes`].
        fn nodes() -> Result<Vec<NodeRecord>, ClientError>;
        /// See [`Client::lookup_tree`].
        fn lookup_tree(creator: NodeId) -> Result<Vec<(u64, u64, NodeId)>, ClientError>;
        /// See [`Client::zones`].
        fn zones(owner: NodeId) -> Result<Vec<(u32, Vec<NodeId>)>, ClientError>;
        /// See [`Client::status`].
        fn status() -> Result<StatusReply, ClientError>;
        /// See [`Client::recovery_status`].
        fn recovery_status() -> Result<RecoveryStatusReply, ClientError>;
        /// See [`Client::migrate`].
        fn migrate(first: ChunkId, last: ChunkId, to: NodeId) -> Result<u64, ClientError>;
        /// See [`Client::migrate_from`].
        fn migrate_from(owner: NodeId, first: ChunkId, last: ChunkId, to: NodeId) -> Result<u64, ClientError>;
        /// See [`Client::add_superpeer`].
        fn add_superpeer(id: NodeId, address: SocketAddr) -> Result<StatusReply, ClientError>;
        /// See [`Client::remove_superpeer`].
        fn remove_superpeer(id: NodeId) -> Result<StatusReply, ClientError>;
    }
}
