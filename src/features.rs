//! Feature words of an on-disk format, split as ext4 splits them, so that a
//! release meeting a format written by a newer one knows what it may do:
//!
//! * **compat**: a reader that does not know the feature may read and write
//!   as if it were absent; unknown bits are kept as they are.
//! * **ro-compat**: a reader that does not know it may read, but writing
//!   would break what the feature maintains; only a read-only mount is let in.
//! * **incompat**: a reader that does not know it would misread the data;
//!   nothing is assembled or mounted.
//!
//! The superblock ([`crate::superblock`]) and the filesystem header
//! (`crate::fs::layout`) each carry one [`Features`] with their own bits.
//! This module owns the rules; each format owns its bit names.

use serde::{Deserialize, Serialize};

/// The three feature words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    pub compat: u64,
    pub ro_compat: u64,
    pub incompat: u64,
}

/// The bits a release knows in each word, with their names.
#[derive(Clone, Copy, Debug)]
pub struct Known {
    /// What the words belong to, for messages ("superblock", "filesystem header").
    pub what: &'static str,
    pub compat: &'static [(u64, &'static str)],
    pub ro_compat: &'static [(u64, &'static str)],
    pub incompat: &'static [(u64, &'static str)],
}

fn mask(names: &[(u64, &str)]) -> u64 {
    names.iter().fold(0, |m, (bit, _)| m | bit)
}

/// `bit 5 (0x20)` or `bits 5, 9 (0x220)`.
pub fn describe_bits(bits: u64) -> String {
    let numbers: Vec<String> = (0..64)
        .filter(|b| bits & (1u64 << b) != 0)
        .map(|b: u32| b.to_string())
        .collect();
    let noun = if numbers.len() == 1 { "bit" } else { "bits" };
    format!("{noun} {} ({bits:#x})", numbers.join(", "))
}

impl Known {
    pub fn compat_mask(&self) -> u64 {
        mask(self.compat)
    }

    pub fn ro_compat_mask(&self) -> u64 {
        mask(self.ro_compat)
    }

    pub fn incompat_mask(&self) -> u64 {
        mask(self.incompat)
    }

    /// Why `features` cannot be used at all: unknown incompat bits.
    pub fn refuse_open(&self, features: &Features) -> Result<(), String> {
        let unknown = features.incompat & !self.incompat_mask();
        if unknown == 0 {
            return Ok(());
        }
        Err(format!(
            "{} has unknown incompatible feature {}; this raidfs is too old for it (use a newer raidfs)",
            self.what,
            describe_bits(unknown)
        ))
    }

    /// Why `features` cannot be written: unknown incompat or ro-compat bits.
    /// Unknown compat bits never stop a writer.
    pub fn refuse_write(&self, features: &Features) -> Result<(), String> {
        self.refuse_open(features)?;
        let unknown = features.ro_compat & !self.ro_compat_mask();
        if unknown == 0 {
            return Ok(());
        }
        Err(format!(
            "{} has unknown read-only-compatible feature {}; this raidfs may only read it (mount with -o ro, or use a newer raidfs)",
            self.what,
            describe_bits(unknown)
        ))
    }

    /// Names of the set bits this release knows, and the others as numbers,
    /// as `compat: -; ro_compat: ppl; incompat: bit 7 (0x80)`.
    pub fn describe(&self, features: &Features) -> String {
        let word = |value: u64, names: &[(u64, &str)]| {
            let mut parts: Vec<String> = names
                .iter()
                .filter(|(bit, _)| value & bit != 0)
                .map(|(_, name)| name.to_string())
                .collect();
            let unknown = value & !mask(names);
            if unknown != 0 {
                parts.push(format!("unknown {}", describe_bits(unknown)));
            }
            if parts.is_empty() {
                "-".to_string()
            } else {
                parts.join(", ")
            }
        };
        format!(
            "compat: {}; ro_compat: {}; incompat: {}",
            word(features.compat, self.compat),
            word(features.ro_compat, self.ro_compat),
            word(features.incompat, self.incompat)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: Known = Known {
        what: "test header",
        compat: &[(1, "c0")],
        ro_compat: &[(2, "r1")],
        incompat: &[(1 << 3, "i3")],
    };

    #[test]
    fn unknown_bits_are_judged_by_their_word() {
        let ok = Features {
            compat: 1 | 1 << 40,
            ro_compat: 2,
            incompat: 1 << 3,
        };
        assert_eq!(
            KNOWN.refuse_write(&ok),
            Ok(()),
            "unknown compat is no obstacle"
        );
        let ro = Features {
            ro_compat: 2 | 1 << 9,
            ..ok
        };
        assert_eq!(KNOWN.refuse_open(&ro), Ok(()));
        let why = KNOWN.refuse_write(&ro).unwrap_err();
        assert!(
            why.contains("read-only-compatible feature bit 9 (0x200)"),
            "{why}"
        );
        assert!(why.contains("-o ro"), "{why}");
        let inc = Features {
            incompat: 1 << 3 | 1 << 5 | 1 << 63,
            ..ok
        };
        let why = KNOWN.refuse_open(&inc).unwrap_err();
        assert!(
            why.contains(
                "test header has unknown incompatible feature bits 5, 63 (0x8000000000000020)"
            ),
            "{why}"
        );
        assert_eq!(KNOWN.refuse_write(&inc), Err(why));
        assert_eq!(
            KNOWN.describe(&ro),
            "compat: c0, unknown bit 40 (0x10000000000); ro_compat: r1, unknown bit 9 (0x200); incompat: i3"
        );
    }
}
