package io.myriad.client;

/**
 * When a change is acknowledged (the durability byte of changing chunk requests; see the
 * README's durability modes).
 */
public enum Durability {
    /** 0: the cluster's configured default. */
    DEFAULT(0),
    /** 1: stored in the owner's memory; backups follow. */
    ASYNC(1),
    /** 2: every backup holds it in its log engine's write buffer. */
    REPLICATED(2),
    /** 3: every backup wrote it to disk, synced. */
    DURABLE(3);

    /** The wire byte. */
    public final int code;

    Durability(int code) {
        this.code = code;
    }

    /** The level named {@code name} (case-insensitive: default, async, replicated, durable). */
    public static Durability parse(String name) {
        for (Durability level : values()) {
            if (level.name().equalsIgnoreCase(name.trim())) {
                return level;
            }
        }
        throw new MyriadException.InvalidArgument("unknown durability " + name);
    }
}
