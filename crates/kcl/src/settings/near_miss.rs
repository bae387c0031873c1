//! Variables under the prefix that name no setting but nearly do.
//!
//! Such a variable cannot be refused (the prefix is shared with the
//! application's own variables), and ignoring it silently runs the
//! service on a default the operator thought they had changed: a
//! `KCL_LEASE_DURATON` of `30s` leaves the lease duration at 10 s.

use std::fmt;

use super::{FIELDS, variable};

/// A variable under the settings' prefix that is no setting but is close to
/// one, most likely a misspelling of it; reported by
/// [`Settings::near_misses`](super::Settings::near_misses) and logged as a
/// warning when the settings are read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NearMiss {
    /// The variable as set (`KCL_LEASE_DURATON`).
    pub variable: String,
    /// The setting's variable it is close to (`KCL_LEASE_DURATION`).
    pub meant: String,
}

impl fmt::Display for NearMiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is not a kcl setting and is ignored; did you mean {}?",
            self.variable, self.meant
        )
    }
}

/// `name`, a variable, if it is under `prefix`, is not a setting's variable
/// and is close to one.
pub(super) fn of_variable(prefix: &str, name: &str) -> Option<NearMiss> {
    let head = format!("{prefix}_");
    let rest = name
        .get(..head.len())
        .filter(|h| h.eq_ignore_ascii_case(&head))
        .map(|_| &name[head.len()..])?;
    if FIELDS.iter().any(|f| variable(prefix, f) == name) {
        return None;
    }
    closest(rest).map(|field| NearMiss {
        variable: name.to_owned(),
        meant: variable(prefix, field),
    })
}

/// The setting `key` (a variable's tail or a file key, in any case) is
/// closest to, if it is close enough to be a misspelling of it.
pub(super) fn closest(key: &str) -> Option<&'static str> {
    let key = key.to_ascii_lowercase();
    FIELDS
        .iter()
        .map(|field| (strsim::damerau_levenshtein(&key, field), *field))
        .filter(|(distance, field)| *distance <= allowed(field))
        .min()
        .map(|(_, field)| field)
}

/// Edits tolerated: two in a long name, one in a short one, so that an
/// application's own short variables (`KCL_PORT`) are not taken for typos.
fn allowed(field: &str) -> usize {
    if field.len() >= 10 { 2 } else { 1 }
}
