package io.myriad.ycsb;

import io.myriad.client.ClientConfig;
import io.myriad.client.MyriadClient;
import java.nio.file.Path;

/**
 * Prints the chunk memory of a cluster's peers, summed: {@code chunks payload_bytes
 * used_bytes} (used = payload, slack and allocator metadata of the memory managers, the
 * owners' cost of the records; backups keep theirs on disk). Used by {@code scripts/ycsb}
 * after a load. Usage: {@code StoreStats <superpeer list> <cluster dir>} (the secret is
 * the cluster directory's: {@code cluster.json}'s {@code secret_file}, else
 * {@code DIR/secret}; TLS with its certificate {@code client} when the cluster was started
 * with {@code --tls}).
 */
public final class StoreStats {
    private StoreStats() {}

    /** Entry point. */
    public static void main(String[] args) {
        if (args.length != 2) {
            System.err.println("usage: StoreStats <superpeer list> <cluster dir>");
            System.exit(2);
        }
        ClientConfig config = ClientConfig.of(args[0])
                .withSecretFile(ClientConfig.clusterSecretFile(Path.of(args[1])));
        Path tls = ClientConfig.clusterTlsDir(Path.of(args[1]));
        if (tls != null) {
            config.withTlsDir(tls);
        }
        try (MyriadClient client = MyriadClient.connect(config)) {
            long chunks = 0;
            long payload = 0;
            long used = 0;
            for (int peer : client.peers()) {
                long[] stats = client.stats(peer);
                chunks += stats[0];
                payload += stats[1];
                used += stats[2];
            }
            System.out.println(chunks + " " + payload + " " + used);
        }
    }
}
