//! rechecks
