//! The operations, grouped by what they touch: names (`namespace`),
//! attributes (`attr`), extended attributes (`xattr`) and file data (`data`).

pub mod attr;
pub mod checked;
pub mod data;
pub mod namespace;
pub mod rename;
pub mod xattr;
