package io.myriad.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Reading the cluster secret's file as the nodes do (docs/security.md): first line without
 * trailing whitespace, loose modes refused, the cluster directory's file found through
 * cluster.json, and no secret at all refused before anything is dialed.
 */
class SecretFileTest {
    @TempDir
    Path dir;

    private Path write(String name, String content, String mode) throws IOException {
        Path file = dir.resolve(name);
        Files.write(file, content.getBytes(StandardCharsets.ISO_8859_1));
        Files.setPosixFilePermissions(file, PosixFilePermissions.fromString(mode));
        return file;
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.ISO_8859_1);
    }

    @Test
    void theSecretIsTheFirstLineWithoutTrailingWhitespace() throws IOException {
        assertArrayEquals(bytes("abc123"), ClientConfig.readSecretFile(write("a", "abc123\n", "rw-------")));
        assertArrayEquals(bytes("abc123"), ClientConfig.readSecretFile(write("b", "abc123 \r\nsecond line\n", "r--------")));
        assertArrayEquals(bytes("  lead\tin"), ClientConfig.readSecretFile(write("c", "  lead\tin", "rw-------")));
        assertArrayEquals(bytes("\u00ff\u0001x"), ClientConfig.readSecretFile(write("d", "\u00ff\u0001x\n", "rw-------")));
        String longest = "k".repeat(ClientConfig.SECRET_BYTES_MAX);
        assertArrayEquals(bytes(longest), ClientConfig.readSecretFile(write("e", longest + "\n", "rw-------")));
    }

    @Test
    void looseModesEmptyAndOverlongSecretsAndMissingFilesAreRefused() throws IOException {
        for (String mode : new String[] {"rw-r-----", "rw----r--", "rw--w----", "rw-------"}) {
            Path file = write("loose", "abc\n", mode);
            if (mode.equals("rw-------")) {
                assertArrayEquals(bytes("abc"), ClientConfig.readSecretFile(file));
            } else {
                MyriadException.InvalidArgument refused = assertThrows(MyriadException.InvalidArgument.class,
                        () -> ClientConfig.readSecretFile(file), mode);
                assertTrue(refused.getMessage().contains("chmod 600"), refused.getMessage());
                assertTrue(!refused.getMessage().contains("abc"), "the secret is not in the message");
            }
        }
        assertThrows(MyriadException.InvalidArgument.class,
                () -> ClientConfig.readSecretFile(write("empty", " \n", "rw-------")));
        assertThrows(MyriadException.InvalidArgument.class,
                () -> ClientConfig.readSecretFile(write("emptyline", "\nsecond\n", "rw-------")));
        assertThrows(MyriadException.InvalidArgument.class, () -> ClientConfig.readSecretFile(
                write("long", "k".repeat(ClientConfig.SECRET_BYTES_MAX + 1) + "\n", "rw-------")));
        assertThrows(MyriadException.InvalidArgument.class, () -> ClientConfig.readSecretFile(dir.resolve("none")));
    }

    @Test
    void aClusterDirectorysSecretFileComesFromClusterJsonElseDirSecret() throws IOException {
        assertEquals(dir.resolve("secret"), ClientConfig.clusterSecretFile(dir));
        Files.writeString(dir.resolve("cluster.json"), "{\"version\":1,\"superpeers\":\"1=127.0.0.1:1\",\"nodes\":[]}");
        assertEquals(dir.resolve("secret"), ClientConfig.clusterSecretFile(dir));
        Files.writeString(dir.resolve("cluster.json"),
                "{\"version\": 1, \"secret_file\": \"/etc/my \\\"odd\\\" dir\\\\x\\u0041/s\", \"nodes\": []}");
        assertEquals(Path.of("/etc/my \"odd\" dir\\xA/s"), ClientConfig.clusterSecretFile(dir));
        write("elsewhere", "from-cluster-json\n", "rw-------");
        Files.writeString(dir.resolve("cluster.json"), "{\"secret_file\":\"" + dir.resolve("elsewhere") + "\"}");
        ClientConfig config = ClientConfig.of("1=127.0.0.1:1").withSecretFile(ClientConfig.clusterSecretFile(dir));
        assertArrayEquals(bytes("from-cluster-json"), config.secret);
    }

    @Test
    void withoutASecretTheEnvironmentsFileIsUsedElseJoiningIsRefused() throws IOException {
        assertNull(new ClientConfig().secret, "no default secret");
        MyriadException.InvalidArgument none = assertThrows(MyriadException.InvalidArgument.class,
                () -> ClientConfig.resolveSecret(null, Map.of()));
        assertTrue(none.getMessage().contains(ClientConfig.SECRET_FILE_ENV), none.getMessage());
        Path file = write("env", "from-env\n", "rw-------");
        assertArrayEquals(bytes("from-env"),
                ClientConfig.resolveSecret(null, Map.of(ClientConfig.SECRET_FILE_ENV, file.toString())));
        assertArrayEquals(bytes("given"),
                ClientConfig.resolveSecret(bytes("given"), Map.of(ClientConfig.SECRET_FILE_ENV, file.toString())));
        if (System.getenv(ClientConfig.SECRET_FILE_ENV) == null) {
            // No environment fallback here: connect refuses before dialing the (closed) port.
            assertThrows(MyriadException.InvalidArgument.class, () -> MyriadClient.connect("1=127.0.0.1:1"));
        }
    }
}
