//! Sensors (to come).
