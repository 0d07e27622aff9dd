//! What a raidfs mount shows as its source in the mount table: the array's
//! identity, its name or `uuid=UUID`.
//!
//! mount(8) decides that an fstab line is already mounted (so `mount -a`
//! leaves it alone) by comparing the line's SPEC with the source and mount
//! point in the table; findmnt and fstests find a filesystem by its source.
//! So every mount must show its own source, and a mount made from a SPEC
//! that names the array shows that SPEC in the form it was written.

use uuid::Uuid;

/// A SPEC that names one array rather than listing its members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// `uuid=UUID` (or `UUID=UUID`, which only reaches us when the helper is
    /// called directly: mount(8) resolves the upper-case form itself).
    Uuid(Uuid),
    /// The array's name, as `raidfs create --name` recorded it.
    Name(String),
}

impl Identity {
    /// The identity SPEC names, if it is not a member list: `uuid=...`, or
    /// a word with no `/`, `,`, `:` or glob character that is not a path
    /// that exists (those name members).
    pub fn of_spec(spec: &str) -> Result<Option<Identity>, String> {
        if let Some(text) = strip_prefix_ignore_case(spec, "uuid=") {
            let uuid = Uuid::parse_str(text).map_err(|e| format!("UUID {text}: {e}"))?;
            return Ok(Some(Identity::Uuid(uuid)));
        }
        let member_like = spec.is_empty()
            || spec.contains(['/', ',', ':', '*', '?', '['])
            || std::path::Path::new(spec).exists();
        Ok((!member_like).then(|| Identity::Name(spec.to_string())))
    }

    /// The array's own identity: its name if it has one, else its UUID.
    pub fn of_array(name: &str, uuid: Uuid) -> Identity {
        if name.is_empty() {
            Identity::Uuid(uuid)
        } else {
            Identity::Name(name.to_string())
        }
    }

    /// The mount source: the name, or `uuid=` and the UUID in the form
    /// `raidfs examine` prints (lower case, with hyphens).
    pub fn source(&self) -> String {
        match self {
            Identity::Uuid(uuid) => format!("uuid={}", uuid.hyphenated()),
            Identity::Name(name) => name.clone(),
        }
    }
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "9cf61be9-5058-4d46-b508-521058ab4f25";

    #[test]
    fn specs_that_name_an_array() {
        let uuid = Uuid::parse_str(UUID).unwrap();
        for spec in [
            format!("uuid={UUID}"),
            format!("UUID={}", UUID.to_uppercase()),
        ] {
            assert_eq!(
                Identity::of_spec(&spec).unwrap(),
                Some(Identity::Uuid(uuid))
            );
        }
        assert_eq!(
            Identity::of_spec("home").unwrap(),
            Some(Identity::Name("home".into()))
        );
        assert!(Identity::of_spec("uuid=not-a-uuid").is_err());
    }

    #[test]
    fn uuid_prefix_in_any_case() {
        assert_eq!(strip_prefix_ignore_case("UUID=ab", "uuid="), Some("ab"));
        assert_eq!(strip_prefix_ignore_case("uuid=ab", "uuid="), Some("ab"));
        assert_eq!(strip_prefix_ignore_case("/uuid=ab", "uuid="), None);
    }

    #[test]
    fn member_lists_are_not_identities() {
        for spec in ["/srv/a.img", "a.img,b.img", "a:b", "m*.img", "m?.img", ""] {
            assert_eq!(Identity::of_spec(spec).unwrap(), None, "{spec}");
        }
    }

    #[test]
    fn the_source_is_the_name_or_the_canonical_uuid() {
        let uuid = Uuid::parse_str(&UUID.to_uppercase()).unwrap();
        assert_eq!(
            Identity::of_array("", uuid).source(),
            format!("uuid={UUID}")
        );
        assert_eq!(Identity::of_array("home", uuid).source(), "home");
        assert_eq!(
            Identity::of_spec(&format!("UUID={}", UUID.to_uppercase()))
                .unwrap()
                .unwrap()
                .source(),
            format!("uuid={UUID}")
        );
    }
}
