//! The lane path of [`NetHandle::request_blocking`]: when a direct request lane is used,
//! taking an idle one or opening a new one, and mapping its failures to the errors of the
//! connection path.
//!
//! Particular to this module: the calling thread does all the work itself (blocking
//! socket calls, no runtime involved once the node's connection exists); the pools of
//! idle lanes are `crate::lane`, the blocking handshake `dial.rs`. A lane is never used
//! towards a node with a network filter set (the filters live on connections).

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::dial::{dial_lane, DialFailure};
use super::handle::NetHandle;
use super::whole_header;
use crate::config::{DEADLINE_FAR, LANE_CHECK_IDLE};
use crate::error::NetError;
use crate::handler::MessageType;
use crate::lane::{Lane, LaneFailure, Take};
use crate::wire::{Kind, Verdict, FRAME_PAYLOAD_BYTES_MAX};
use crate::NodeId;

/// The deadline of a request with `timeout` from now (far away if it overflows).
pub(super) fn lane_deadline(timeout: Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + DEADLINE_FAR)
}

impl NetHandle {
    /// The lane path of [`NetHandle::request_blocking`]; `None` to use the connection.
    pub(super) fn request_on_lane(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
        timeout: Duration,
    ) -> Option<Result<Bytes, NetError>> {
        let deadline = lane_deadline(timeout);
        let caller = self.shared.lanes.caller();
        let mut lane = match self.acquire_lane(to, message_type, payload, deadline)? {
            Ok(lane) => lane,
            Err(error) => return Some(Err(error)),
        };
        let header = whole_header(Kind::Request, message_type, 0, payload.len());
        let config = &self.shared.config;
        let spin = caller.spin(config.lane_spin);
        let result = lane.call(header, payload, deadline, spin, config.message_bytes_max);
        caller.spun_on(&mut lane);
        Some(self.release_lane(to, lane, result))
    }

    /// A lane to `to` for this request, idle or newly opened, taken out of the pool;
    /// `None` to use the connection (lanes off, an ordered type, a payload over one
    /// frame, a network filter on `to`, or every lane to `to` busy).
    pub(super) fn acquire_lane(
        &self,
        to: NodeId,
        message_type: MessageType,
        payload: &Bytes,
        deadline: std::time::Instant,
    ) -> Option<Result<Lane, NetError>> {
        let max = self.shared.config.lanes_per_node_max;
        if max == 0 || message_type.ordered || payload.len() > FRAME_PAYLOAD_BYTES_MAX {
            return None;
        }
        if let Err(error) = self.check_open().and_then(|()| self.check_size(payload)) {
            return Some(Err(error));
        }
        if self.shared.faults_any.load(Ordering::Acquire)
            && self.shared.faults.read().contains_key(&to)
        {
            return None;
        }
        if self.is_fenced(to) {
            return Some(Err(NetError::Fenced(to)));
        }
        // The peer's instance as its connection knows it: an idle lane of another one
        // (the peer restarted) is never reused, even if its socket looks open.
        let instance = if let Some(conn) = self.lookup(to) {
            // Lane traffic counts as use of the node's connection (least recently used
            // eviction must not pick a connection whose lanes are busy).
            conn.touch(self.shared.now_ms());
            conn.peer_instance
        } else {
            // The node's connection comes first, as on the connection path: its events
            // report the node, and its errors are the ones a failed request gives.
            let until = Instant::from_std(deadline);
            let connected = self.block_on(async {
                match tokio::time::timeout_at(until, self.shared.connection(to)).await {
                    Ok(conn) => conn.map(|conn| conn.peer_instance),
                    Err(_) => Err(NetError::Timeout(to)),
                }
            });
            match connected {
                Ok(instance) => instance,
                Err(error) => return Some(Err(error)),
            }
        };
        let lanes = &self.shared.lanes;
        // Bounded: each pass takes an idle lane out of the pool for good or ends.
        loop {
            match lanes.take(to, max) {
                Take::Idle(mut lane) => {
                    if lane.peer_instance != instance || lane.is_stale(LANE_CHECK_IDLE) {
                        lanes.discard(to, lane);
                        continue;
                    }
                    return Some(Ok(lane));
                }
                Take::Open => {
                    return match self.open_lane(to, deadline) {
                        Ok(Some(lane)) => Some(Ok(lane)),
                        Ok(None) => None,
                        Err(error) => Some(Err(error)),
                    }
                }
                Take::Full => return None,
            }
        }
    }

    /// Ends the use of a lane: back to the pool after a complete response, dropped after
    /// any failure, which becomes the error the connection path would have given.
    pub(super) fn release_lane(
        &self,
        to: NodeId,
        lane: Lane,
        result: Result<Bytes, LaneFailure>,
    ) -> Result<Bytes, NetError> {
        let lanes = &self.shared.lanes;
        match result {
            Ok(response) => {
                lanes.give_back(to, lane);
                Ok(response)
            }
            Err(failure) => {
                lanes.discard(to, lane);
                if self.shared.shut_down.load(Ordering::Acquire) {
                    return Err(NetError::Shutdown);
                }
                if self.is_fenced(to) {
                    return Err(NetError::Fenced(to));
                }
                Err(match failure {
                    LaneFailure::Timeout => NetError::Timeout(to),
                    LaneFailure::Io(_) => NetError::ConnectionLost(to),
                    LaneFailure::Protocol(_) | LaneFailure::Unexpected => {
                        tracing::warn!(peer = %to, %failure, "lane closed");
                        NetError::ConnectionLost(to)
                    }
                })
            }
        }
    }

    /// Opens a lane to `to` on this thread (a slot is reserved by the caller). `Ok(None)`:
    /// the peer holds its maximum of lanes from us; use the connection.
    fn open_lane(
        &self,
        to: NodeId,
        deadline: std::time::Instant,
    ) -> Result<Option<Lane>, NetError> {
        let lanes = &self.shared.lanes;
        let opened = self
            .address(to)
            .ok_or(NetError::UnknownNode(to))
            .and_then(|addr| {
                let connect_timeout = self.shared.config.connect_timeout;
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                // As on the connection path: the request's own deadline, if shorter, makes a
                // slow connect a request timeout.
                let (limit, timed_out) = if left < connect_timeout {
                    (left, NetError::Timeout(to))
                } else {
                    (connect_timeout, NetError::ConnectTimeout(to))
                };
                dial_lane(&self.shared, to, addr, limit).map_err(|failure| match failure {
                    DialFailure::TimedOut => timed_out,
                    DialFailure::Error(error) => error,
                })
            });
        let (stream, peer_instance, verdict) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                lanes.open_failed(to);
                return Err(error);
            }
        };
        match verdict {
            Verdict::Accepted => {}
            Verdict::Duplicate => {
                lanes.open_failed(to);
                return Ok(None);
            }
            Verdict::Refused => {
                lanes.open_failed(to);
                return Err(NetError::Fenced(to));
            }
        }
        let Some(lane) = lanes.opened(to, stream, peer_instance) else {
            return Ok(None);
        };
        if self.is_fenced(to) {
            lanes.discard(to, lane);
            return Err(NetError::Fenced(to));
        }
        Ok(Some(lane))
    }
}
