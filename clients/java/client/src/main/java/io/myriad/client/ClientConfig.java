package io.myriad.client;

import io.myriad.client.net.Tls;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermission;
import java.time.Duration;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * How a {@link MyriadClient} connects: the superpeers, the cluster secret, where it listens
 * (the watching superpeer dials it for heartbeats), timeouts, routing rounds and the
 * default durability of changes. Mutable until passed to {@link MyriadClient#connect}.
 *
 * <p>There is no default secret: set {@link #secret} or call {@link #withSecretFile} (a
 * local cluster's file is {@link #clusterSecretFile}); with neither, {@code connect} reads
 * the file named by the environment variable {@value #SECRET_FILE_ENV} and refuses to join
 * if that is unset. Secret files follow {@code docs/security.md}: the secret is the first
 * line without trailing whitespace, 1 to 1,024 bytes, and a file that group or others may
 * read or write is refused.
 *
 * <p>TLS ({@code docs/security.md}): {@link #withTlsDir} loads the cluster CA and this
 * client's certificate from a directory of {@code myriad cert} ({@code DIR/tls} of a
 * cluster started with {@code myriad cluster start --tls}, see {@link #clusterTlsDir});
 * every connection then runs TLS 1.3 with mutual authentication, and the HMAC handshake
 * with the secret inside it.
 */
public final class ClientConfig {
    /** The environment variable naming the secret file when no secret is configured. */
    public static final String SECRET_FILE_ENV = "MYRIAD_SECRET_FILE";
    /** The secret file's name in a cluster directory ({@code DIR/secret}). */
    public static final String SECRET_FILE_NAME = "secret";
    /** The cluster description in a cluster directory ({@code DIR/cluster.json}). */
    public static final String CLUSTER_FILE_NAME = "cluster.json";
    /** Longest secret accepted (bytes), as the nodes'. */
    public static final int SECRET_BYTES_MAX = 1024;
    /** The certificate name of a cluster's clients ({@code myriad cluster start --tls} issues it). */
    public static final String TLS_NAME_DEFAULT = "client";
    private static final Pattern SECRET_FILE_KEY = Pattern.compile("\"secret_file\"\\s*:\\s*\"((?:[^\"\\\\]|\\\\.)*)\"");
    private static final Pattern TLS_DIR_KEY = Pattern.compile("\"tls_dir\"\\s*:\\s*\"((?:[^\"\\\\]|\\\\.)*)\"");

    /** Superpeer IDs and addresses, in the order they are tried. */
    public final Map<Integer, InetSocketAddress> superpeers = new LinkedHashMap<>();
    /**
     * The cluster secret; {@code null} (the default): {@code connect} sets it from the file
     * named by {@value #SECRET_FILE_ENV}, or refuses to join if that is unset.
     */
    public byte[] secret;
    /**
     * TLS for every connection ({@code null}, the default: plain TCP after the HMAC
     * handshake); set by {@link #withTlsDir} or {@link #withTlsFiles}.
     */
    public Tls tls;
    /** Where this client accepts connections (port 0: any free port). */
    public InetSocketAddress listen = new InetSocketAddress("127.0.0.1", 0);
    /** Longest a chunk call takes (default 2 s). */
    public Duration chunkTimeout = Duration.ofSeconds(2);
    /** Longest a metadata call, and the join, take (default 10 s). */
    public Duration metaTimeout = Duration.ofSeconds(10);
    /** Longest a connection attempt and its handshake take (default 2 s). */
    public Duration connectTimeout = Duration.ofSeconds(2);
    /**
     * Whether blocking single-chunk calls use direct request lanes (default true; false:
     * they go over the node's shared connection, answered through its reader thread).
     * Ignored under TLS: lanes are off there, as on the nodes.
     */
    public boolean lanes = true;
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

    /** Sets {@link #secret} to the secret of {@code file} (see {@link #readSecretFile}). */
    public ClientConfig withSecretFile(Path file) {
        this.secret = readSecretFile(file);
        return this;
    }

    /**
     * Turns TLS on with the CA and certificate {@code name} of a directory written by
     * {@code myriad cert} ({@code DIR/ca.pem}, {@code DIR/NAME.pem}, {@code DIR/NAME.key}),
     * as the Rust client's {@code ClientConfig::with_tls_dir}. The files are read now.
     *
     * @throws MyriadException.InvalidArgument a file is missing or does not load
     */
    public ClientConfig withTlsDir(Path dir, String name) {
        this.tls = Tls.fromDir(dir, name);
        return this;
    }

    /** {@link #withTlsDir} with the certificate {@value #TLS_NAME_DEFAULT}. */
    public ClientConfig withTlsDir(Path dir) {
        return withTlsDir(dir, TLS_NAME_DEFAULT);
    }

    /**
     * Turns TLS on with PEM files of any name: the CA certificate, this client's certificate
     * (chain) and its PKCS#8 private key.
     *
     * @throws MyriadException.InvalidArgument a file is missing or does not load
     */
    public ClientConfig withTlsFiles(Path ca, Path cert, Path key) {
        this.tls = Tls.fromPemFiles(ca, cert, key);
        return this;
    }

    /**
     * The TLS directory of a local cluster directory ({@code cluster.json}'s
     * {@code "tls_dir"}, written by {@code myriad cluster start --tls}), or {@code null} for
     * a cluster without TLS (or a directory without {@code cluster.json}).
     */
    public static Path clusterTlsDir(Path dir) {
        Path clusterFile = dir.resolve(CLUSTER_FILE_NAME);
        String json;
        try {
            json = Files.readString(clusterFile, StandardCharsets.UTF_8);
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            throw new MyriadException.InvalidArgument("cluster file " + clusterFile + ": " + e);
        }
        Matcher matcher = TLS_DIR_KEY.matcher(json);
        if (!matcher.find() || matcher.group(1).isEmpty()) {
            return null;
        }
        return dir.resolve(jsonUnescape(matcher.group(1), clusterFile, "tls_dir"));
    }

    /**
     * The secret {@code connect} uses: {@link #secret} if set, else the file named by
     * {@code env}'s {@value #SECRET_FILE_ENV}; throws {@link MyriadException.InvalidArgument}
     * if there is neither or the file is not usable.
     */
    static byte[] resolveSecret(byte[] secret, Map<String, String> env) {
        if (secret != null) {
            return secret;
        }
        String file = env.get(SECRET_FILE_ENV);
        if (file == null || file.isEmpty()) {
            throw new MyriadException.InvalidArgument("no cluster secret: set ClientConfig.secret, call "
                    + "withSecretFile(FILE) (a local cluster's DIR/secret) or set " + SECRET_FILE_ENV);
        }
        return readSecretFile(Path.of(file));
    }

    /**
     * Reads a cluster secret file: its first line without trailing whitespace, 1 to
     * {@value #SECRET_BYTES_MAX} bytes. Refuses a file that group or others may read or
     * write (as the nodes do). Errors name the file, never its content.
     */
    public static byte[] readSecretFile(Path file) {
        try {
            Set<PosixFilePermission> permissions;
            try {
                permissions = Files.getPosixFilePermissions(file);
            } catch (UnsupportedOperationException e) {
                permissions = Set.of();
            }
            for (PosixFilePermission permission : permissions) {
                String name = permission.name();
                if (name.startsWith("GROUP_") || name.startsWith("OTHERS_")) {
                    throw new MyriadException.InvalidArgument("cluster secret file " + file
                            + " may be read or written by other users; run chmod 600 " + file);
                }
            }
            if (Files.size(file) > 2L * SECRET_BYTES_MAX + 2) {
                throw new MyriadException.InvalidArgument("cluster secret file " + file + ": longer than "
                        + SECRET_BYTES_MAX + " bytes");
            }
            byte[] bytes = Files.readAllBytes(file);
            int end = 0;
            while (end < bytes.length && bytes[end] != '\n') {
                end++;
            }
            while (end > 0 && isAsciiWhitespace(bytes[end - 1])) {
                end--;
            }
            if (end == 0 || end > SECRET_BYTES_MAX) {
                throw new MyriadException.InvalidArgument("cluster secret file " + file
                        + ": the secret must have 1 to " + SECRET_BYTES_MAX + " bytes");
            }
            return Arrays.copyOf(bytes, end);
        } catch (IOException e) {
            throw new MyriadException.InvalidArgument("cluster secret file " + file + ": " + e);
        }
    }

    private static boolean isAsciiWhitespace(byte b) {
        return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == 0x0c;
    }

    /**
     * The secret file of a local cluster directory (written by {@code myriad cluster start}):
     * {@code cluster.json}'s {@code "secret_file"}, else {@code DIR/secret} (directories
     * without that key, or without a {@code cluster.json}).
     */
    public static Path clusterSecretFile(Path dir) {
        Path clusterFile = dir.resolve(CLUSTER_FILE_NAME);
        String json;
        try {
            json = Files.readString(clusterFile, StandardCharsets.UTF_8);
        } catch (NoSuchFileException e) {
            return dir.resolve(SECRET_FILE_NAME);
        } catch (IOException e) {
            throw new MyriadException.InvalidArgument("cluster file " + clusterFile + ": " + e);
        }
        Matcher matcher = SECRET_FILE_KEY.matcher(json);
        if (!matcher.find() || matcher.group(1).isEmpty()) {
            return dir.resolve(SECRET_FILE_NAME);
        }
        return dir.resolve(jsonUnescape(matcher.group(1), clusterFile, "secret_file"));
    }

    /** A JSON string's content without its escapes. */
    private static String jsonUnescape(String text, Path source, String key) {
        StringBuilder out = new StringBuilder(text.length());
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (c != '\\') {
                out.append(c);
                continue;
            }
            if (i + 1 >= text.length()) {
                throw new MyriadException.InvalidArgument("cluster file " + source + ": bad escape in " + key);
            }
            char e = text.charAt(++i);
            switch (e) {
                case '"', '\\', '/' -> out.append(e);
                case 'b' -> out.append('\b');
                case 'f' -> out.append('\f');
                case 'n' -> out.append('\n');
                case 'r' -> out.append('\r');
                case 't' -> out.append('\t');
                case 'u' -> {
                    if (i + 4 >= text.length()) {
                        throw new MyriadException.InvalidArgument("cluster file " + source + ": bad escape in " + key);
                    }
                    try {
                        out.append((char) Integer.parseInt(text.substring(i + 1, i + 5), 16));
                    } catch (NumberFormatException ex) {
                        throw new MyriadException.InvalidArgument("cluster file " + source + ": bad escape in " + key);
                    }
                    i += 4;
                }
                default -> throw new MyriadException.InvalidArgument("cluster file " + source
                        + ": bad escape in " + key);
            }
        }
        return out.toString();
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
