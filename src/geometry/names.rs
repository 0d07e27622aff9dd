//! Names of levels and layouts as md and mdadm spell them: parsing from the
//! command line or a configuration, and display in reports.

use super::{Layout, Level};
use std::fmt;
use std::str::FromStr;

/// A level or layout name that is not recognised.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown {what} {given:?}: expected one of {expected}")]
pub struct NameError {
    /// "RAID level" or "RAID5/6 layout".
    pub what: &'static str,
    pub given: String,
    pub expected: &'static str,
}

/// Lower-case, with `_` read as `-`, so "Left_Symmetric" and "RAID5" are accepted.
fn normalise(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('_', "-")
}

impl Level {
    /// Parse md's level names: "0", "raid0", "stripe", "1", "raid1",
    /// "mirror", "5", "raid5", "6", "raid6", "10", "raid10" (any case).
    pub fn parse(name: &str) -> Result<Level, NameError> {
        let normalised = normalise(name);
        let bare = normalised.strip_prefix("raid").unwrap_or(&normalised);
        match bare {
            "0" | "stripe" => Ok(Level::Raid0),
            "1" | "mirror" => Ok(Level::Raid1),
            "5" => Ok(Level::Raid5),
            "6" => Ok(Level::Raid6),
            "10" => Ok(Level::Raid10),
            _ => Err(NameError {
                what: "RAID level",
                given: name.to_string(),
                expected: "0, 1, 5, 6, 10 (or raid0, raid1, raid5, raid6, raid10, stripe, mirror)",
            }),
        }
    }

    /// md's name for the level ("raid5").
    pub fn md_name(self) -> &'static str {
        match self {
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Raid5 => "raid5",
            Level::Raid6 => "raid6",
            Level::Raid10 => "raid10",
        }
    }
}

impl Layout {
    /// md's default RAID5/6 layout.
    pub const DEFAULT: Layout = Layout::LeftSymmetric;

    /// Parse md's layout names: "left-asymmetric", "right-asymmetric",
    /// "left-symmetric", "right-symmetric", their short forms "la", "ra",
    /// "ls", "rs", and "default" (left-symmetric); any case, `_` for `-`.
    pub fn parse(name: &str) -> Result<Layout, NameError> {
        match normalise(name).as_str() {
            "left-asymmetric" | "la" => Ok(Layout::LeftAsymmetric),
            "right-asymmetric" | "ra" => Ok(Layout::RightAsymmetric),
            "left-symmetric" | "ls" | "default" => Ok(Layout::LeftSymmetric),
            "right-symmetric" | "rs" => Ok(Layout::RightSymmetric),
            _ => Err(NameError {
                what: "RAID5/6 layout",
                given: name.to_string(),
                expected: "left-asymmetric (la), right-asymmetric (ra), \
                           left-symmetric (ls, default), right-symmetric (rs)",
            }),
        }
    }

    /// md's name for the layout ("left-symmetric").
    pub fn md_name(self) -> &'static str {
        match self {
            Layout::LeftAsymmetric => "left-asymmetric",
            Layout::RightAsymmetric => "right-asymmetric",
            Layout::LeftSymmetric => "left-symmetric",
            Layout::RightSymmetric => "right-symmetric",
        }
    }
}

impl Default for Layout {
    fn default() -> Layout {
        Layout::DEFAULT
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.md_name())
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.md_name())
    }
}

impl FromStr for Level {
    type Err = NameError;
    fn from_str(name: &str) -> Result<Level, NameError> {
        Level::parse(name)
    }
}

impl FromStr for Layout {
    type Err = NameError;
    fn from_str(name: &str) -> Result<Layout, NameError> {
        Layout::parse(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_every_spelling_and_display_round_trips() {
        for (names, level) in [
            (&["0", "raid0", "RAID0", "stripe"][..], Level::Raid0),
            (&["1", "raid1", "mirror"][..], Level::Raid1),
            (&["5", "raid5", "Raid5"][..], Level::Raid5),
            (&["6", "raid6"][..], Level::Raid6),
            (&["10", "raid10", " RAID10 "][..], Level::Raid10),
        ] {
            for name in names {
                assert_eq!(Level::parse(name), Ok(level), "{name}");
            }
            assert_eq!(level.to_string().parse::<Level>(), Ok(level));
        }
    }

    #[test]
    fn layouts_parse_long_and_short_names_and_display_round_trips() {
        for (names, layout) in [
            (&["left-asymmetric", "la", "LA"][..], Layout::LeftAsymmetric),
            (&["right-asymmetric", "ra"][..], Layout::RightAsymmetric),
            (
                &["left-symmetric", "ls", "default", "Left_Symmetric"][..],
                Layout::LeftSymmetric,
            ),
            (&["right-symmetric", "rs"][..], Layout::RightSymmetric),
        ] {
            for name in names {
                assert_eq!(Layout::parse(name), Ok(layout), "{name}");
            }
            assert_eq!(layout.to_string().parse::<Layout>(), Ok(layout));
        }
    }

    #[test]
    fn unknown_names_are_rejected_with_the_accepted_ones_listed() {
        let level = Level::parse("raid7").unwrap_err().to_string();
        assert!(
            level.contains("\"raid7\"") && level.contains("raid10"),
            "{level}"
        );
        assert!(Level::parse("").is_err());
        assert!(Level::parse("raid").is_err());
        let layout = Layout::parse("left").unwrap_err().to_string();
        assert!(
            layout.contains("\"left\"") && layout.contains("left-symmetric"),
            "{layout}"
        );
    }
}
