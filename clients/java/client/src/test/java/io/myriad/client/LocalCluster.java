package io.myriad.client;

import java.io.File;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * A real local Myriad cluster for the live tests: superpeer and peer processes of the
 * {@code myriad} binary (environment variable {@code MYRIAD_BIN}, else system property
 * {@code myriad.bin}, else {@code ../../target/debug/myriad}) on 127.0.0.1, each started
 * with {@code --exit-with-parent <this JVM>} and its own ready file, log and data directory
 * under a temporary directory. The cluster secret is a random one in {@code DIR/secret}
 * (mode 0600, created before any node starts, as {@code myriad cluster start} does), given
 * to every node as {@code --secret-file}; clients take it from {@link #config()}. With TLS
 * ({@link #startTls}) the binary's {@code myriad cert} writes a cluster CA and the
 * certificates {@code superpeer}, {@code peer} and {@code client} to {@code DIR/tls} (the
 * layout of {@code myriad cluster start --tls}), and every node runs with
 * {@code --tls-dir DIR/tls --tls-name superpeer|peer}.
 *
 * <p>Invariant: every process it starts is killed by {@link #close} (tests use
 * try-with-resources or {@code @AfterAll}), and by a JVM shutdown hook if the test JVM
 * ends first; the nodes also exit on their own once this JVM is gone. Every wait is
 * bounded.
 */
public final class LocalCluster implements AutoCloseable {
    private static final Pattern NODE_ID = Pattern.compile("\"node_id\"\\s*:\\s*(\\d+)");
    private static final Pattern ADDRESS = Pattern.compile("\"address\"\\s*:\\s*\"([^\"]+)\"");

    /** A started node. */
    public static final class Node {
        /** Its name (superpeer-1, peer-2). */
        public final String name;
        /** Its process. */
        public final Process process;
        /** Its node ID (from its ready file). */
        public int id;
        /** Its address. */
        public String address;
        /** Its log file. */
        public final Path log;

        Node(String name, Process process, Path log) {
            this.name = name;
            this.process = process;
            this.log = log;
        }
    }

    private final Path dir;
    private final Path secretFile;
    private final Path tlsDir;
    private final List<Node> nodes = new ArrayList<>();
    private final String superpeerList;
    private final Thread hook;

    /** The binary the tests run. */
    public static Path binary() {
        String env = System.getenv("MYRIAD_BIN");
        String path = env != null && !env.isBlank() ? env : System.getProperty("myriad.bin", "../../target/debug/myriad");
        Path binary = Path.of(path).toAbsolutePath().normalize();
        if (!Files.isExecutable(binary)) {
            throw new IllegalStateException("the myriad binary " + binary
                    + " does not exist: build it (cargo build -p myriad) or set MYRIAD_BIN");
        }
        return binary;
    }

    /**
     * Starts {@code superpeers} superpeers and {@code peers} peers; {@code peerArgs} are
     * added to every peer's command line, {@code config} (TOML, may be null) given to every
     * node. Returns once every node wrote its ready file (or throws, killing what started).
     */
    public static LocalCluster start(int superpeers, int peers, List<String> peerArgs, String config) throws IOException {
        return new LocalCluster(superpeers, peers, peerArgs, config, false);
    }

    /** {@link #start} with TLS for every connection (certificates in {@link #tlsDir}). */
    public static LocalCluster startTls(int superpeers, int peers, List<String> peerArgs) throws IOException {
        return new LocalCluster(superpeers, peers, peerArgs, null, true);
    }

    private LocalCluster(int superpeers, int peers, List<String> peerArgs, String config, boolean tls)
            throws IOException {
        dir = Files.createTempDirectory("myriad-java-");
        secretFile = dir.resolve(ClientConfig.SECRET_FILE_NAME);
        tlsDir = tls ? dir.resolve("tls") : null;
        hook = new Thread(this::killAll, "myriad-cluster-kill");
        Runtime.getRuntime().addShutdownHook(hook);
        try {
            writeSecret(secretFile);
            if (tls) {
                cert("ca", tlsDir.toString());
                for (String role : List.of("superpeer", "peer", "client")) {
                    cert("issue", tlsDir.toString(), role, "--role", role);
                }
            }
            Path configFile = null;
            if (config != null) {
                configFile = dir.resolve("myriad.toml");
                Files.writeString(configFile, config);
            }
            List<Integer> ports = new ArrayList<>();
            StringBuilder list = new StringBuilder();
            for (int i = 1; i <= superpeers; i++) {
                int port = freePort();
                ports.add(port);
                list.append(i > 1 ? "," : "").append(i).append("=127.0.0.1:").append(port);
            }
            superpeerList = list.toString();
            List<Node> group = new ArrayList<>();
            for (int i = 1; i <= superpeers; i++) {
                List<String> args = new ArrayList<>(List.of("superpeer", "--id", String.valueOf(i), "--listen",
                        "127.0.0.1:" + ports.get(i - 1)));
                group.add(spawn("superpeer-" + i, args, configFile));
            }
            awaitReady(group);
            group.clear();
            for (int i = 1; i <= peers; i++) {
                List<String> args = new ArrayList<>(List.of("peer", "--listen", "127.0.0.1:0"));
                args.addAll(peerArgs);
                group.add(spawn("peer-" + i, args, configFile));
            }
            awaitReady(group);
        } catch (IOException | RuntimeException e) {
            close();
            throw e;
        }
    }

    /** Creates {@code file} with mode 0600 (given at creation) holding a random secret: 64 hex digits. */
    private static void writeSecret(Path file) throws IOException {
        byte[] random = new byte[32];
        new SecureRandom().nextBytes(random);
        StringBuilder hex = new StringBuilder();
        for (byte b : random) {
            hex.append(String.format("%02x", b & 0xff));
        }
        Files.createFile(file, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
        Files.writeString(file, hex + "\n", StandardCharsets.UTF_8);
    }

    /**
     * Runs {@code myriad cert ARGS...} (bounded: 30 s) and checks that it succeeded;
     * returns its output.
     */
    public static String cert(String... args) throws IOException {
        List<String> command = new ArrayList<>(List.of(binary().toString(), "cert"));
        command.addAll(List.of(args));
        Path out = Files.createTempFile("myriad-cert-", ".txt");
        try {
            Process process = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(out.toFile())
                    .start();
            try {
                if (!process.waitFor(30, java.util.concurrent.TimeUnit.SECONDS)) {
                    throw new IllegalStateException("myriad cert " + command + " did not end in 30 s");
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IOException("interrupted");
            } finally {
                process.destroyForcibly();
            }
            String text = Files.readString(out, StandardCharsets.UTF_8);
            if (process.exitValue() != 0) {
                throw new IllegalStateException(command + " failed: " + text);
            }
            return text;
        } finally {
            Files.deleteIfExists(out);
        }
    }

    private static int freePort() throws IOException {
        try (ServerSocket socket = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            return socket.getLocalPort();
        }
    }

    private Node spawn(String name, List<String> args, Path configFile) throws IOException {
        Path data = dir.resolve("data").resolve(name);
        Path run = dir.resolve("run");
        Path logs = dir.resolve("logs");
        Files.createDirectories(data);
        Files.createDirectories(run);
        Files.createDirectories(logs);
        List<String> command = new ArrayList<>();
        command.add(binary().toString());
        command.addAll(args);
        command.addAll(List.of("--superpeers", superpeerList, "--data-dir", data.toString(), "--ready-file",
                run.resolve(name + ".ready").toString(), "--exit-with-parent",
                String.valueOf(ProcessHandle.current().pid()), "--secret-file", secretFile.toString()));
        if (configFile != null) {
            command.addAll(List.of("--config", configFile.toString()));
        }
        if (tlsDir != null) {
            command.addAll(List.of("--tls-dir", tlsDir.toString(), "--tls-name",
                    name.startsWith("superpeer") ? "superpeer" : "peer"));
        }
        Path log = logs.resolve(name + ".log");
        ProcessBuilder builder = new ProcessBuilder(command).redirectErrorStream(true)
                .redirectOutput(log.toFile());
        builder.environment().putIfAbsent("RUST_LOG", "warn");
        Node node;
        synchronized (nodes) {
            node = new Node(name, builder.start(), log);
            nodes.add(node);
        }
        return node;
    }

    private void awaitReady(List<Node> group) throws IOException {
        long deadline = System.nanoTime() + 30_000_000_000L;
        for (Node node : group) {
            Path ready = dir.resolve("run").resolve(node.name + ".ready");
            while (true) {
                if (Files.exists(ready)) {
                    String line = Files.readString(ready, StandardCharsets.UTF_8);
                    Matcher id = NODE_ID.matcher(line);
                    Matcher address = ADDRESS.matcher(line);
                    if (id.find() && address.find()) {
                        node.id = Integer.parseInt(id.group(1));
                        node.address = address.group(1);
                        break;
                    }
                }
                if (!node.process.isAlive()) {
                    throw new IllegalStateException(node.name + " exited before it was ready; log:\n" + tail(node));
                }
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException(node.name + " not ready after 30 s; log:\n" + tail(node));
                }
                try {
                    Thread.sleep(20);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IOException("interrupted");
                }
            }
        }
    }

    /** The last lines of a node's log. */
    public static String tail(Node node) {
        try {
            List<String> lines = Files.readAllLines(node.log, StandardCharsets.UTF_8);
            return String.join("\n", lines.subList(Math.max(0, lines.size() - 30), lines.size()));
        } catch (IOException e) {
            return "(no log: " + e.getMessage() + ")";
        }
    }

    /** The {@code --superpeers} list. */
    public String superpeers() {
        return superpeerList;
    }

    /** The cluster directory ({@code secret}, {@code logs/}, {@code data/}, {@code run/}). */
    public Path dir() {
        return dir;
    }

    /** The cluster secret's file ({@code DIR/secret}, mode 0600). */
    public Path secretFile() {
        return secretFile;
    }

    /** The TLS directory ({@code DIR/tls}: {@code ca.pem}, {@code client.pem}, ...), or null without TLS. */
    public Path tlsDir() {
        return tlsDir;
    }

    /**
     * A client configuration for this cluster: its superpeers and its secret (read from the
     * file); with TLS, the certificate {@code client} of {@link #tlsDir}.
     */
    public ClientConfig config() {
        ClientConfig config = ClientConfig.of(superpeerList).withSecretFile(secretFile);
        return tlsDir == null ? config : config.withTlsDir(tlsDir, "client");
    }

    /** Every node started. */
    public List<Node> nodes() {
        synchronized (nodes) {
            return new ArrayList<>(nodes);
        }
    }

    /** The peers' node IDs, in start order. */
    public List<Integer> peerIds() {
        List<Integer> ids = new ArrayList<>();
        for (Node node : nodes()) {
            if (node.name.startsWith("peer-")) {
                ids.add(node.id);
            }
        }
        return ids;
    }

    /** The process IDs of every node (for memory measurements). */
    public List<Long> pids() {
        List<Long> pids = new ArrayList<>();
        for (Node node : nodes()) {
            pids.add(node.process.pid());
        }
        return pids;
    }

    /** SIGKILLs one node and waits until it is gone. */
    public void kill(Node node) throws InterruptedException {
        node.process.destroyForcibly();
        node.process.waitFor(10, java.util.concurrent.TimeUnit.SECONDS);
    }

    private void killAll() {
        for (Node node : nodes()) {
            node.process.destroyForcibly();
        }
        for (Node node : nodes()) {
            try {
                node.process.waitFor(10, java.util.concurrent.TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    /** SIGKILLs every node, waits for them, removes the directory. */
    @Override
    public void close() {
        killAll();
        try {
            Runtime.getRuntime().removeShutdownHook(hook);
        } catch (IllegalStateException ignored) {
            // the JVM is shutting down: the hook runs anyway
        }
        try (Stream<Path> walk = Files.walk(dir)) {
            walk.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
        } catch (IOException ignored) {
            // best effort: a temporary directory
        }
    }
}
