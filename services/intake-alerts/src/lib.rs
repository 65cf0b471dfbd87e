//! intake-alerts (being written).
