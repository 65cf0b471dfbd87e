//! nisse-ops (being written).
