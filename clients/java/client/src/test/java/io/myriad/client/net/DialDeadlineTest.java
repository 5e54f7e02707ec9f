package io.myriad.client.net;

import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * A plain-TCP dial has no socket timeouts (its reads block in read(2)); a deadline task
 * bounds its connect and handshake instead. A listener that accepts and then never says a
 * word must fail the dial within the connect timeout, with a message that says so, and
 * leave no socket open.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class DialDeadlineTest {
    @Test
    void aSilentAcceptorFailsTheDialWithinItsTimeout() throws Exception {
        List<Socket> accepted = new ArrayList<>();
        try (ServerSocket silent = new ServerSocket(0, 8, InetAddress.getLoopbackAddress());
                Endpoint endpoint = new Endpoint(7, "secret".getBytes(StandardCharsets.UTF_8), null, 300)) {
            Thread acceptor = new Thread(() -> {
                try {
                    while (true) {
                        Socket socket = silent.accept();
                        synchronized (accepted) {
                            accepted.add(socket);
                        }
                    }
                } catch (java.io.IOException closed) {
                    // the test is over
                }
            });
            acceptor.setDaemon(true);
            acceptor.start();
            endpoint.setAddress(3, new InetSocketAddress(InetAddress.getLoopbackAddress(), silent.getLocalPort()));

            long started = System.nanoTime();
            ExecutionException failed = assertThrows(ExecutionException.class,
                    () -> endpoint.connection(3).get(10, TimeUnit.SECONDS));
            long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
            assertInstanceOf(ConnectionLostException.class, failed.getCause());
            assertTrue(failed.getCause().getMessage().contains("within 300 ms"), failed.getCause().getMessage());
            assertTrue(tookMs >= 250 && tookMs < 5_000, "the dial took " + tookMs + " ms");

            // The client closed its end: the acceptor's socket reads end of stream.
            Socket theirs;
            synchronized (accepted) {
                assertTrue(!accepted.isEmpty(), "the listener accepted the dial");
                theirs = accepted.get(0);
            }
            theirs.setSoTimeout(5_000);
            byte[] greeting = theirs.getInputStream().readAllBytes();
            assertTrue(greeting.length > 0, "the client sent its greeting before it gave up");
        } finally {
            synchronized (accepted) {
                for (Socket socket : accepted) {
                    socket.close();
                }
            }
        }
    }
}
