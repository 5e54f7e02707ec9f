//! The chunk API: routing each CID to its owner and the requests of [`myriad_proto::chunk`].
