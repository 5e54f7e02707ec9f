//! Myriad's peer-local memory manager (placeholder while the first layer lands).
