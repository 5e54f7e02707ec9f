//! Chunk access served by peers: requests, replies and their encodings.
