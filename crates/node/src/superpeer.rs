//! One member of the superpeer group.
