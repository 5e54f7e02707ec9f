//! Metadata requests served by the superpeer group, joining, heartbeats, failure reports
//! and pushed events: messages and their encodings.
