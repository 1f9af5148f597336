//! Gateway (being written).
