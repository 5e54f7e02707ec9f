//! Reading the superpeers' monitoring reports (DXMonitor; see `myriad_proto::monitor`).
//!
//! # Job
//! [`Client::monitoring`] asks the configured superpeers in turn for the reports they
//! kept and returns the first answer.
//!
//! # Invariants
//! Each superpeer is asked with [`MONITOR_QUERY_TIMEOUT`]; the call fails only when none
//! answers.
//!
//! # Who calls it
//! `myriad term` (`monitoring`), tools.

use std::time::Duration;

use myriad_proto::monitor::{MonitorQuery, MonitorReply};
use myriad_proto::types;

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

impl BlockingClient<'_> {
    /// See [`Client::monitoring`].
    pub fn monitoring(&self, query: MonitorQuery) -> Result<MonitorReply, ClientError> {
        self.block_on(self.client.monitoring(query))
    }
}
