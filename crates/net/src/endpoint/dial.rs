//! Dialing: TCP connect and the connector's half of the handshake (greeting, proof check,
//! proof, verdict), async for the node's connection and blocking for a direct request
//! lane.
//!
//! Particular to this module: it only produces an authenticated socket, the peer's
//! instance and the acceptor's verdict; it never touches the connection table (the
//! `connect` task in `table.rs` installs what it dialed). Both halves check the same
//! things in the same order (`docs/wire-format.md`, section 1).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use super::shared::{role_refusal, Shared};
use crate::error::{HandshakeError, NetError};
use crate::lane::LaneSocket;
use crate::stream::NetStream;
use crate::wire::{self, Greeting, Verdict, GREETING_BYTES, PROOF_BYTES};
use crate::NodeId;

/// Why a lane could not be dialed.
pub(super) enum DialFailure {
    /// The time limit passed.
    TimedOut,
    /// Anything else, as the connection path reports it.
    Error(NetError),
}

/// TCP connect, the TLS handshake (if the endpoint has TLS) and the connector's half of
/// the handshake for a lane, with blocking calls on this thread, all within `limit`. The
/// socket is left blocking with no receive timeout and the send timeout as its write
/// timeout.
pub(super) fn dial_lane(
    shared: &Shared,
    node: NodeId,
    addr: SocketAddr,
    limit: Duration,
) -> Result<(LaneSocket, u64, Verdict), DialFailure> {
    use std::io::{Read, Write};
    let start = std::time::Instant::now();
    let io = |error: std::io::Error| match error.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => DialFailure::TimedOut,
        std::io::ErrorKind::ConnectionRefused => DialFailure::Error(NetError::ConnectRefused(node)),
        _ => DialFailure::Error(connect_failed(node, error)),
    };
    // Each step waits at most what is left of the limit (a zero timeout means "none" to
    // the socket calls, so an exhausted limit is a timeout here).
    let left = || {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            Err(DialFailure::TimedOut)
        } else {
            Ok(left)
        }
    };
    let tcp = std::net::TcpStream::connect_timeout(&addr, left()?).map_err(io)?;
    tcp.set_nodelay(true).map_err(io)?;
    tcp.set_write_timeout(Some(left()?)).map_err(io)?;
    tcp.set_read_timeout(Some(left()?)).map_err(io)?;
    let mut stream = match &shared.config.tls {
        None => LaneSocket::plain(tcp),
        Some(tls) => {
            let session =
                rustls::ClientConnection::new(tls.client.clone(), tls.server_name.clone())
                    .map_err(|e| DialFailure::Error(connect_failed(node, format!("TLS: {e}"))))?;
            let mut socket = LaneSocket::tls(tcp, session);
            socket.handshake().map_err(|error| match io(error) {
                DialFailure::TimedOut => DialFailure::TimedOut,
                DialFailure::Error(NetError::ConnectFailed { reason, .. }) => {
                    DialFailure::Error(connect_failed(node, format!("TLS: {reason}")))
                }
                failure => failure,
            })?;
            socket
        }
    };
    let ours = shared.greeting(true).encode();
    stream.write_all(&ours).map_err(io)?;
    stream.flush().map_err(io)?;
    let mut reply = [0u8; GREETING_BYTES + PROOF_BYTES];
    stream.read_exact(&mut reply).map_err(io)?;
    let (theirs, proof) = reply.split_at(GREETING_BYTES);
    let mut theirs_array = [0u8; GREETING_BYTES];
    theirs_array.copy_from_slice(theirs);
    let mut proof_array = [0u8; PROOF_BYTES];
    proof_array.copy_from_slice(proof);
    let greeting =
        Greeting::decode(&theirs_array).map_err(|e| DialFailure::Error(connect_failed(node, e)))?;
    if greeting.node != node.0 {
        return Err(DialFailure::Error(connect_failed(
            node,
            HandshakeError::UnexpectedNode(greeting.node),
        )));
    }
    let secret = &shared.config.secret;
    if wire::verify_acceptor_proof(secret, &ours, &theirs_array, &proof_array).is_err() {
        tracing::warn!(%node, %addr, "peer failed to prove the cluster secret (lane)");
        return Err(DialFailure::Error(NetError::AuthenticationFailed(node)));
    }
    if !shared.role_allowed(node, stream.peer_role()) {
        tracing::warn!(%node, %addr, "{} (lane)", role_refusal(node, stream.peer_role()));
        return Err(DialFailure::Error(NetError::AuthenticationFailed(node)));
    }
    stream
        .write_all(&wire::connector_proof(secret, &ours, &theirs_array))
        .map_err(io)?;
    stream.flush().map_err(io)?;
    stream.tcp().set_read_timeout(Some(left()?)).map_err(io)?;
    let mut verdict = [0u8; 1];
    if let Err(error) = stream.read_exact(&mut verdict) {
        // The acceptor closes without a verdict when our proof fails.
        return Err(match io(error) {
            DialFailure::TimedOut => DialFailure::TimedOut,
            DialFailure::Error(_) => DialFailure::Error(NetError::AuthenticationFailed(node)),
        });
    }
    let [verdict] = verdict;
    let verdict =
        Verdict::decode(verdict).map_err(|e| DialFailure::Error(connect_failed(node, e)))?;
    stream.tcp().set_read_timeout(None).map_err(io)?;
    stream
        .tcp()
        .set_write_timeout(Some(shared.config.send_timeout))
        .map_err(io)?;
    Ok((stream, greeting.instance, verdict))
}

pub(super) fn connect_failed(node: NodeId, error: impl std::fmt::Display) -> NetError {
    NetError::ConnectFailed {
        node,
        reason: error.to_string(),
    }
}

/// TCP connect and the dialer's half of the handshake.
pub(super) async fn dial(
    shared: &Shared,
    node: NodeId,
    addr: SocketAddr,
) -> Result<(NetStream, u64, Verdict), NetError> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::ConnectionRefused {
            NetError::ConnectRefused(node)
        } else {
            connect_failed(node, e)
        }
    })?;
    tcp.set_nodelay(true).map_err(|e| connect_failed(node, e))?;
    let stream = match &shared.config.tls {
        None => NetStream::plain(tcp),
        Some(tls) => NetStream::tls_connect(tcp, tls)
            .await
            .map_err(|e| connect_failed(node, format!("TLS: {e}")))?,
    };
    let ours = shared.greeting(false).encode();
    stream
        .write_all(&ours)
        .await
        .map_err(|e| connect_failed(node, e))?;
    let mut theirs = [0u8; GREETING_BYTES];
    stream
        .read_exact(&mut theirs)
        .await
        .map_err(|e| connect_failed(node, e))?;
    let mut proof = [0u8; PROOF_BYTES];
    stream
        .read_exact(&mut proof)
        .await
        .map_err(|e| connect_failed(node, e))?;
    let greeting = Greeting::decode(&theirs).map_err(|e| connect_failed(node, e))?;
    if greeting.node != node.0 {
        return Err(connect_failed(
            node,
            HandshakeError::UnexpectedNode(greeting.node),
        ));
    }
    let secret = &shared.config.secret;
    if wire::verify_acceptor_proof(secret, &ours, &theirs, &proof).is_err() {
        tracing::warn!(%node, %addr, "peer failed to prove the cluster secret");
        return Err(NetError::AuthenticationFailed(node));
    }
    if !shared.role_allowed(node, stream.peer_role()) {
        tracing::warn!(%node, %addr, "{}", role_refusal(node, stream.peer_role()));
        return Err(NetError::AuthenticationFailed(node));
    }
    let our_proof = wire::connector_proof(secret, &ours, &theirs);
    stream
        .write_all(&our_proof)
        .await
        .map_err(|e| connect_failed(node, e))?;
    let mut verdict = [0u8; 1];
    if stream.read_exact(&mut verdict).await.is_err() {
        // The acceptor closes without a verdict when our proof fails.
        return Err(NetError::AuthenticationFailed(node));
    }
    let [verdict] = verdict;
    let verdict = Verdict::decode(verdict).map_err(|e| connect_failed(node, e))?;
    Ok((stream, greeting.instance, verdict))
}
