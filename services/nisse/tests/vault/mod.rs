//! The vault services as `nisse` processes: killed mid-write, rebuilt from
//! the stream, the world from the command line, and memory end to end.

mod kill;
mod memory;
mod world;
