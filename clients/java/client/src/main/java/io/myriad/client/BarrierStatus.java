package io.myriad.client;

/**
 * A barrier's state ({@code myriad_proto::meta::BarrierStatus}).
 *
 * @param size participants per round
 * @param round rounds released so far
 * @param signed participants signed on to the current round
 * @param lastReleased the values of the last released round: node ID to value
 */
public record BarrierStatus(long size, long round, long signed, java.util.Map<Integer, Long> lastReleased) {
}
