//! The operations, grouped by what they touch: names (`namespace`,
//! `rename`), attributes (`attr`), extended attributes (`xattr`), file data
//! (`data`, and `copy` between files) and the extent map as lseek sees it
//! (`seek`).

pub mod attr;
pub mod checked;
pub mod copy;
pub mod data;
pub mod namespace;
pub mod rename;
pub mod seek;
pub mod xattr;
