//! The FUSE adapter: the only module that imports `fuser`.
