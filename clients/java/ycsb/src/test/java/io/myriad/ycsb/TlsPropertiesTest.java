package io.myriad.ycsb;

import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.myriad.client.ClientConfig;
import io.myriad.client.LocalCluster;
import io.myriad.client.MyriadException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import site.ycsb.DBException;

/**
 * Where the binding takes its TLS certificates from: {@code myriad.tls.dir} and
 * {@code myriad.tls.name}, else the TLS directory of {@code myriad.cluster}; certificates
 * written by the real {@code myriad cert}.
 */
class TlsPropertiesTest {
    @TempDir
    Path dir;

    @Test
    void theCertificatesComeFromTheTlsDirectoryElseTheClusterDirectory() throws Exception {
        Path tls = dir.resolve("tls");
        LocalCluster.cert("ca", tls.toString());
        LocalCluster.cert("issue", tls.toString(), "client", "--role", "client");
        LocalCluster.cert("issue", tls.toString(), "bench", "--role", "client");

        ClientConfig none = ClientConfig.of("1=127.0.0.1:1");
        MyriadYcsbClient.tls(new Properties(), none);
        assertNull(none.tls, "no property, no TLS");

        Properties explicit = new Properties();
        explicit.setProperty("myriad.tls.dir", tls.toString());
        ClientConfig byDir = ClientConfig.of("1=127.0.0.1:1");
        MyriadYcsbClient.tls(explicit, byDir);
        assertNotNull(byDir.tls, "myriad.tls.dir with the certificate client");
        explicit.setProperty("myriad.tls.name", "bench");
        MyriadYcsbClient.tls(explicit, ClientConfig.of("1=127.0.0.1:1"));
        explicit.setProperty("myriad.tls.name", "nobody");
        MyriadException missing = assertThrows(MyriadException.InvalidArgument.class,
                () -> MyriadYcsbClient.tls(explicit, ClientConfig.of("1=127.0.0.1:1")));
        assertTrue(missing.getMessage().contains("nobody.pem"), missing.getMessage());

        // A cluster directory of `myriad cluster start --tls` names its TLS directory.
        Files.writeString(dir.resolve("cluster.json"), "{\"tls_dir\":\"tls\",\"secret_file\":\"secret\"}");
        Properties cluster = new Properties();
        cluster.setProperty("myriad.cluster", dir.toString());
        ClientConfig byCluster = ClientConfig.of("1=127.0.0.1:1");
        MyriadYcsbClient.tls(cluster, byCluster);
        assertNotNull(byCluster.tls, "the cluster's TLS directory");

        Properties nameOnly = new Properties();
        nameOnly.setProperty("myriad.tls.name", "client");
        assertThrows(DBException.class, () -> MyriadYcsbClient.tls(nameOnly, ClientConfig.of("1=127.0.0.1:1")));
    }
}
