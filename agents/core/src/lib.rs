//! nisse-core (being written).
