//! Joining a cluster, the node table, metadata requests to the superpeer group, events.
