//! Signed file URLs.
