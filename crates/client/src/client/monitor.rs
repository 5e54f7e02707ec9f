//! Operator queries: the superpeers' monitoring reports (DXMonitor; see
//! `myriad_proto::monitor`) and a node's logging (`myriad_proto::logctl`).
//!
//! # Job
//! [`Client::monitoring`] asks the configured superpeers in turn for the reports they
//! kept and returns the first answer; [`Client::log_level`] sets or reads a node's log
//! filter; [`Client::log_info`] reads a backup peer's log engine state and
//! [`Client::lock_list`] a peer's chunk locks (JSON text).
//!
//! # Invariants
//! Each request waits at most [`MONITOR_QUERY_TIMEOUT`]; `monitoring` fails only when no
//! superpeer answers.
//!
//! # Who calls it
//! `myriad term` (`monitoring`, `loggerlevel`, `loginfo`, `chunklocklist`), tools.

use std::time::Duration;

use myriad_net::MessageType;
use myriad_proto::logctl::{LogLevelRequest, TextReply};
use myriad_proto::monitor::{MonitorQuery, MonitorReply};
use myriad_proto::types;
use myriad_types::NodeId;

use super::{BlockingClient, Client};
use crate::ClientError;

/// How long one superpeer may take to answer.
pub const MONITOR_QUERY_TIMEOUT: Duration = Duration::from_secs(2);

impl Client {
    /// The monitoring reports a superpeer kept (the first of the configured ones that
    /// answers).
    pub async fn monitoring(&self, query: MonitorQuery) -> Result<MonitorReply, ClientError> {
        let membership = self.membership();
        let mut last_error = String::from("no superpeer configured");
        for (superpeer, _) in membership.superpeers() {
            match membership
                .net()
                .request(
                    *superpeer,
                    types::MONITOR_QUERY,
                    query.encode(),
                    MONITOR_QUERY_TIMEOUT,
                )
                .await
            {
                Ok(bytes) => {
                    return MonitorReply::decode(bytes)
                        .map_err(|error| ClientError::Protocol(error.to_string()))
                }
                Err(error) => last_error = format!("{superpeer}: {error}"),
            }
        }
        Err(ClientError::SuperpeersUnavailable(last_error))
    }
}

impl Client {
    /// Sets `node`'s log filter (`tracing`'s `EnvFilter` syntax, e.g.
    /// `info,myriad_node::peer=debug`) or, with `None`, reads it; the filter in force.
    pub async fn log_level(
        &self,
        node: NodeId,
        filter: Option<String>,
    ) -> Result<String, ClientError> {
        let request = LogLevelRequest { filter }.encode();
        self.text_request(node, types::LOG_LEVEL, request).await
    }

    /// The chunk locks held at `peer`, as JSON text (an array of `cid`, `writer`,
    /// `readers`).
    pub async fn lock_list(&self, peer: NodeId) -> Result<String, ClientError> {
        self.text_request(peer, types::LOCK_LIST, bytes::Bytes::new())
            .await
    }

    /// A backup peer's log engine state, as JSON text.
    pub async fn log_info(&self, node: NodeId) -> Result<String, ClientError> {
        self.text_request(node, types::LOG_INFO, bytes::Bytes::new())
            .await
    }

    async fn text_request(
        &self,
        node: NodeId,
        message_type: MessageType,
        payload: bytes::Bytes,
    ) -> Result<String, ClientError> {
        let reply = self
            .membership()
            .net()
            .request(node, message_type, payload, MONITOR_QUERY_TIMEOUT)
            .await
            .map_err(|_| ClientError::NodeUnavailable(node))?;
        match TextReply::decode(reply) {
            Ok(TextReply::Ok(text)) => Ok(text),
            Ok(TextReply::Failed(reason)) => Err(ClientError::Server { node, reason }),
            Err(error) => Err(ClientError::Protocol(error.to_string())),
        }
    }
}

impl BlockingClient<'_> {
    /// See [`Client::log_level`].
    pub fn log_level(&self, node: NodeId, filter: Option<String>) -> Result<String, ClientError> {
        self.block_on(self.client.log_level(node, filter))
    }

    /// See [`Client::lock_list`].
    pub fn lock_list(&self, peer: NodeId) -> Result<String, ClientError> {
        self.block_on(self.client.lock_list(peer))
    }

    /// See [`Client::log_info`].
    pub fn log_info(&self, node: NodeId) -> Result<String, ClientError> {
        self.block_on(self.client.log_info(node))
    }

    /// See [`Client::monitoring`].
    pub fn monitoring(&self, query: MonitorQuery) -> Result<MonitorReply, ClientError> {
        self.block_on(self.client.monitoring(query))
    }
}
