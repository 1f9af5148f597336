//! The client APIs on one internal representation (IR).
