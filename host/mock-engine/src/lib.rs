//! Mock engine (being written).
