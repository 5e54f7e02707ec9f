//! The peer: a memory manager serving chunks to remote clients.
