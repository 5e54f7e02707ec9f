//! Simulated network faults towards one node (the test fault switch); see
//! `NetHandle::set_fault`.

/// A simulated network fault towards one node (for tests of partitions and failures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Everything sent to the node is silently lost (requests time out).
    DropOutgoing,
    /// Everything received from the node is silently discarded.
    DropIncoming,
    /// Both: the node is cut off as by a network partition.
    Partition,
}

impl Fault {
    pub(crate) fn drops_outgoing(self) -> bool {
        matches!(self, Fault::DropOutgoing | Fault::Partition)
    }

    pub(crate) fn drops_incoming(self) -> bool {
        matches!(self, Fault::DropIncoming | Fault::Partition)
    }
}
