package io.myriad.ycsb;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.myriad.client.MyriadException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Properties;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import site.ycsb.DBException;

/** Where the binding takes the cluster secret from: its properties, never a default. */
class SecretPropertiesTest {
    @TempDir
    Path dir;

    private Path secretFile(Path file, String secret, String mode) throws IOException {
        Files.writeString(file, secret + "\n", StandardCharsets.UTF_8);
        Files.setPosixFilePermissions(file, PosixFilePermissions.fromString(mode));
        return file;
    }

    @Test
    void theSecretComesFromTheSecretFileElseTheClusterDirectory() throws Exception {
        Properties properties = new Properties();
        assertNull(MyriadYcsbClient.secret(properties), "no property: the environment's file or a refusal");
        secretFile(dir.resolve("secret"), "of-the-dir", "rw-------");
        properties.setProperty("myriad.cluster", dir.toString());
        assertArrayEquals("of-the-dir".getBytes(StandardCharsets.UTF_8), MyriadYcsbClient.secret(properties));
        Path other = secretFile(dir.resolve("other"), "of-the-file", "rw-------");
        properties.setProperty("myriad.secretfile", other.toString());
        assertArrayEquals("of-the-file".getBytes(StandardCharsets.UTF_8), MyriadYcsbClient.secret(properties));
    }

    @Test
    void aSecretOnTheCommandLineAndALooseFileAreRefused() throws Exception {
        Properties inline = new Properties();
        inline.setProperty("myriad.secret", "myriad");
        DBException refused = assertThrows(DBException.class, () -> MyriadYcsbClient.secret(inline));
        assertTrue(refused.getMessage().contains("myriad.secretfile"), refused.getMessage());
        Properties loose = new Properties();
        loose.setProperty("myriad.secretfile", secretFile(dir.resolve("loose"), "x", "rw-r--r--").toString());
        assertThrows(MyriadException.InvalidArgument.class, () -> MyriadYcsbClient.secret(loose));
    }
}
