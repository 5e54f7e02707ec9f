package io.myriad.client;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * How a {@link MyriadClient} connects: the superpeers, the cluster secret, where it listens
 * (the watching superpeer dials it for heartbeats), timeouts, routing rounds and the
 * default durability of changes. Mutable until passed to {@link MyriadClient#connect}.
 */
public final class ClientConfig {
    /** Superpeer IDs and addresses, in the order they are tried. */
    public final Map<Integer, InetSocketAddress> superpeers = new LinkedHashMap<>();
    /** The cluster secret (default {@code "myriad"}, the nodes' default). */
    public byte[] secret = "myriad".getBytes(StandardCharsets.UTF_8);
    /** Where this client accepts connections (port 0: any free port). */
    public InetSocketAddress listen = new InetSocketAddress("127.0.0.1", 0);
    /** Longest a chunk call takes (default 2 s). */
    public Duration chunkTimeout = Duration.ofSeconds(2);
    /** Longest a metadata call, and the join, take (default 10 s). */
    public Duration metaTimeout = Duration.ofSeconds(10);
    /** Longest a connection attempt and its handshake take (default 2 s). */
    public Duration connectTimeout = Duration.ofSeconds(2);
    /** Quick routing rounds per chunk call before rounds are paced (default 4). */
    public int attemptsMax = 4;
    /** Durability of changes when a call names none. */
    public Durability durability = Durability.DEFAULT;

    /** A configuration with the given superpeer list ({@code "1=127.0.0.1:P1,2=..."}). */
    public static ClientConfig of(String superpeerList) {
        ClientConfig config = new ClientConfig();
        config.superpeers.putAll(parseSuperpeers(superpeerList));
        return config;
    }

    /** Parses {@code "1=host:port,2=host:port"} (the nodes' {@code --superpeers} syntax). */
    public static Map<Integer, InetSocketAddress> parseSuperpeers(String list) {
        Map<Integer, InetSocketAddress> out = new LinkedHashMap<>();
        for (String entry : list.split(",")) {
            String trimmed = entry.trim();
            if (trimmed.isEmpty()) {
                continue;
            }
            int eq = trimmed.indexOf('=');
            int colon = trimmed.lastIndexOf(':');
            if (eq <= 0 || colon <= eq) {
                throw new MyriadException.InvalidArgument("bad superpeer entry " + trimmed);
            }
            try {
                int id = Integer.parseInt(trimmed.substring(0, eq));
                String host = trimmed.substring(eq + 1, colon);
                int port = Integer.parseInt(trimmed.substring(colon + 1));
                out.put(id, new InetSocketAddress(host, port));
            } catch (NumberFormatException e) {
                throw new MyriadException.InvalidArgument("bad superpeer entry " + trimmed);
            }
        }
        return out;
    }

    /** Parses {@code host:port}. */
    public static InetSocketAddress parseAddress(String text) {
        int colon = text.lastIndexOf(':');
        if (colon <= 0) {
            throw new MyriadException.InvalidArgument("bad address " + text);
        }
        try {
            return new InetSocketAddress(text.substring(0, colon), Integer.parseInt(text.substring(colon + 1)));
        } catch (NumberFormatException e) {
            throw new MyriadException.InvalidArgument("bad address " + text);
        }
    }
}
