package io.myriad.client;

/**
 * One superpeer's view of the group ({@code myriad_proto::meta::StatusReply}).
 *
 * @param node the superpeer that answered
 * @param epoch the cluster epoch in its applied state
 * @param leader the leader it knows of (-1: none)
 * @param term its Raft term
 * @param members the configured superpeers, ID to address
 */
public record SuperpeerStatus(int node, long epoch, int leader, long term, java.util.Map<Integer, String> members) {
}
