//! Which geometry each allocated group has, and where it lies.
//!
//! An array has one shape (the data geometry of its level and the metadata
//! geometry that goes with its member count), except during a reshape:
//! then the superblock's geometry fields describe the target, and the
//! groups the reshape has not reached keep the old shape, recorded in the
//! superblock's reshape record. A group normally lies in its own slice of
//! every member; while the reshape moves it, its copy at the staging slice
//! may be the one in force. [`Array::region`] asks here for every request,
//! so this module is the one place that knows both.

use super::personality::Personality;
use super::ArrayResult;
use crate::geometry::{Geometry, GeometryError};
use crate::superblock::{GeometrySpec, GroupProfile, Superblock};

/// The geometries of data and metadata groups of one shape, with their
/// personalities (chosen once here, not per request).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub data: Geometry,
    pub meta: Geometry,
    pub data_personality: Personality,
    pub meta_personality: Personality,
}

impl Shape {
    pub(crate) fn new(data: Geometry) -> Result<Shape, GeometryError> {
        let meta = Geometry::metadata(data.members, data.chunk)?;
        Ok(Shape {
            data,
            meta,
            data_personality: Personality::of_geometry(&data),
            meta_personality: Personality::of_geometry(&meta),
        })
    }

    /// The shape a recorded geometry describes.
    pub(crate) fn of_spec(spec: &GeometrySpec) -> Result<Shape, GeometryError> {
        Shape::new(Geometry::new(
            spec.level,
            spec.members as usize,
            spec.chunk,
            spec.copies as usize,
            spec.layout,
        )?)
    }

    /// The geometry and personality of a group with `profile`.
    pub(crate) fn of(&self, profile: GroupProfile) -> Option<(Geometry, Personality)> {
        match profile {
            GroupProfile::Metadata => Some((self.meta, self.meta_personality)),
            GroupProfile::Data => Some((self.data, self.data_personality)),
            GroupProfile::Unallocated => None,
        }
    }

    /// Whether every group of this shape keeps its data with `failed` gone.
    pub(crate) fn survives(&self, failed: &[usize]) -> bool {
        // Slots past this shape's members hold none of its groups.
        let own: Vec<usize> = failed
            .iter()
            .copied()
            .filter(|&s| s < self.data.members)
            .collect();
        self.data_personality.survives(&self.data, &own)
            && self.meta_personality.survives(&self.meta, &own)
    }
}

/// The shapes in force: the array's own and, during a reshape, the old one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shapes {
    pub current: Shape,
    pub from: Option<Shape>,
}

impl Shapes {
    /// The shapes a superblock describes.
    pub(crate) fn of(sb: &Superblock) -> ArrayResult<Shapes> {
        let current = Shape::new(super::data_geometry(sb)?)?;
        let from = match &sb.reshape {
            Some(r) => Some(Shape::of_spec(&r.from)?),
            None => None,
        };
        Ok(Shapes { current, from })
    }

    /// Where group `group` lies now and in which geometry: the slice (a
    /// group index: its own, or the staging slice while its copy there is
    /// the one in force), the geometry and the personality. None for an
    /// unallocated group.
    pub(crate) fn place(
        &self,
        sb: &Superblock,
        group: u32,
    ) -> Option<(u32, Geometry, Personality)> {
        let profile = sb.groups.get(group as usize).copied()?;
        let (shape, slice) = match (&sb.reshape, &self.from) {
            (Some(r), Some(from)) if r.is_pending(group) => {
                let slice = match r.staged {
                    Some(g) if g == group => r.staging,
                    _ => group,
                };
                (from, slice)
            }
            _ => (&self.current, group),
        };
        let (geometry, personality) = shape.of(profile)?;
        Some((slice, geometry, personality))
    }

    /// Whether every group, in whichever shape it has, keeps its data with
    /// `failed` slots gone.
    pub(crate) fn survive(&self, failed: &[usize]) -> bool {
        self.current.survives(failed) && self.from.is_none_or(|f| f.survives(failed))
    }
}
