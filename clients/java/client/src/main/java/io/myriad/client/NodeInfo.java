package io.myriad.client;

/**
 * One node of the cluster's node table ({@code myriad_meta::NodeRecord}, wire layout).
 *
 * @param id node ID
 * @param role {@link #SUPERPEER}, {@link #PEER} or {@link #CLIENT}
 * @param address where it listens, {@code host:port}
 * @param capabilities bit flags (1 storage, 2 backup, 4 compute)
 * @param rack rack number
 * @param switchId switch number
 * @param state {@link #ALIVE}, {@link #FAILED} or {@link #LEFT}
 * @param failedEpoch the epoch of the failure verdict ({@link #FAILED} only, else 0)
 * @param incarnation process incarnations that held this ID
 * @param joinedEpoch the epoch when the current incarnation joined
 * @param released a gone peer's ID was released by an operator
 */
public record NodeInfo(int id, int role, String address, int capabilities, int rack, int switchId,
        int state, long failedEpoch, long incarnation, long joinedEpoch, boolean released) {
    /** Role code of a superpeer. */
    public static final int SUPERPEER = 1;
    /** Role code of a peer. */
    public static final int PEER = 2;
    /** Role code of a client. */
    public static final int CLIENT = 3;
    /** State: alive. */
    public static final int ALIVE = 0;
    /** State: declared failed. */
    public static final int FAILED = 1;
    /** State: left in an orderly way. */
    public static final int LEFT = 2;

    /** Whether the node is alive. */
    public boolean isAlive() {
        return state == ALIVE;
    }

    /** Whether the node is a peer (stores chunks). */
    public boolean isPeer() {
        return role == PEER;
    }
}
