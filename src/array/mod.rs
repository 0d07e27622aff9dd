//! The array engine: assembles members, maps the logical space through
//! allocation groups and their geometry, and performs reads and writes with
//! redundancy, degraded operation and member failure handling.
