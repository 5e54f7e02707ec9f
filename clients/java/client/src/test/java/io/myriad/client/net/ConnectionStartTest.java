package io.myriad.client.net;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import io.myriad.client.wire.Frame;
import java.io.DataInputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * An endpoint registers a connection before it starts the connection's reader, and
 * another thread may find it in between and send on it. So a connection must send from
 * the moment it exists: a request made before {@code start()} is written to the socket
 * (it once failed with a NullPointerException), and its response completes it once the
 * reader runs.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class ConnectionStartTest {
    @Test
    void aConnectionSendsBeforeItsReaderStarts() throws Exception {
        try (ServerSocket listener = new ServerSocket(0, 8, InetAddress.getLoopbackAddress());
                Endpoint endpoint = new Endpoint(7, "secret".getBytes(StandardCharsets.UTF_8), null, 300);
                Socket mine = new Socket(InetAddress.getLoopbackAddress(), listener.getLocalPort());
                Socket theirs = listener.accept()) {
            Connection connection = new Connection(endpoint, mine, 3, 1 << 20);
            byte[] payload = "before start".getBytes(StandardCharsets.UTF_8);
            CompletableFuture<byte[]> answer = connection.request(MessageType.CHUNK, payload);
            assertFalse(answer.isDone(), "the request is pending, not failed: " + answer);

            DataInputStream in = new DataInputStream(theirs.getInputStream());
            byte[] header = new byte[Frame.HEADER_BYTES];
            in.readFully(header);
            Frame frame = Frame.decode(header, 0);
            assertEquals(Frame.KIND_REQUEST, frame.kind);
            assertEquals(MessageType.CHUNK.type, frame.type);
            assertEquals(MessageType.CHUNK.subtype, frame.subtype);
            byte[] received = new byte[frame.payloadBytes];
            in.readFully(received);
            assertArrayEquals(payload, received);

            connection.start();
            byte[] reply = "answer".getBytes(StandardCharsets.UTF_8);
            theirs.getOutputStream().write(Connection.frames(Frame.KIND_RESPONSE, false, frame.type, frame.subtype,
                    frame.messageId, reply));
            theirs.getOutputStream().flush();
            assertArrayEquals(reply, answer.get(10, TimeUnit.SECONDS));
            connection.close("test over");
        }
    }
}
