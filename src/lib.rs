//! Driver.
