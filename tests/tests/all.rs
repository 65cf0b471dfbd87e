//! Integration tests of Nisse against real servers (one binary for the
//! whole crate keeps link time down).

mod suite;
