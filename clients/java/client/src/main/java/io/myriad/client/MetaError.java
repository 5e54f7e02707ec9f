package io.myriad.client;

/**
 * An error of the superpeer group's metadata state machine ({@code myriad_meta::MetaError}),
 * as it travels on the wire: its tag and its argument (a node ID, a barrier ID, a name or a
 * text; {@code zone} only for {@link Kind#ZONE_NOT_FOUND}).
 */
public final class MetaError {
    /** The variants, by wire tag. */
    public enum Kind {
        /** Tag 1: every assignable node ID is taken. */
        NODE_IDS_EXHAUSTED(1),
        /** Tag 2: no node has this ID ({@code node}). */
        UNKNOWN_NODE(2),
        /** Tag 3: the node is not alive ({@code node}). */
        NODE_NOT_ALIVE(3),
        /** Tag 4: the node is alive ({@code node}). */
        NODE_ALIVE(4),
        /** Tag 5: a reclaimed ID cannot be reclaimed by this node ({@code node}). */
        RECLAIM_REFUSED(5),
        /** Tag 6: an argument is outside its range ({@code text}). */
        INVALID_ARGUMENT(6),
        /** Tag 7: the name has no binding ({@code text}). */
        NAME_NOT_FOUND(7),
        /** Tag 8: the nameservice is full. */
        NAMES_FULL(8),
        /** Tag 9: no barrier has this ID ({@code number}). */
        BARRIER_NOT_FOUND(9),
        /** Tag 10: too many barriers. */
        BARRIERS_FULL(10),
        /** Tag 11: the node already signed on to this round ({@code node}). */
        ALREADY_SIGNED_ON(11),
        /** Tag 12: no temporary blob has this name ({@code text}). */
        TMP_NOT_FOUND(12),
        /** Tag 13: a temporary blob with this name exists ({@code text}). */
        TMP_EXISTS(13),
        /** Tag 14: temporary storage is full. */
        TMP_FULL(14),
        /** Tag 15: no such backup zone ({@code node} = owner, {@code number} = zone). */
        ZONE_NOT_FOUND(15);

        /** The wire tag. */
        public final int tag;

        Kind(int tag) {
            this.tag = tag;
        }
    }

    /** Which error. */
    public final Kind kind;
    /** The node argument, or -1. */
    public final int node;
    /** The numeric argument (barrier ID, zone), or -1. */
    public final long number;
    /** The text argument (name, explanation), or null. */
    public final String text;

    /** An error of {@code kind} with its arguments (unused ones -1 / null). */
    public MetaError(Kind kind, int node, long number, String text) {
        this.kind = kind;
        this.node = node;
        this.number = number;
        this.text = text;
    }

    @Override
    public String toString() {
        StringBuilder out = new StringBuilder(kind.name().toLowerCase().replace('_', ' '));
        if (node >= 0) {
            out.append(' ').append(ChunkIds.formatNode(node));
        }
        if (number >= 0) {
            out.append(' ').append(number);
        }
        if (text != null) {
            out.append(": ").append(text);
        }
        return out.toString();
    }

    @Override
    public boolean equals(Object other) {
        if (!(other instanceof MetaError)) {
            return false;
        }
        MetaError that = (MetaError) other;
        return kind == that.kind && node == that.node && number == that.number
                && java.util.Objects.equals(text, that.text);
    }

    @Override
    public int hashCode() {
        return java.util.Objects.hash(kind, node, number, text);
    }
}
