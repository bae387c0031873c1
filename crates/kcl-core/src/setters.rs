//! Builder setters declared as a list: [`setters!`](crate::setters) writes
//! each `pub fn name(mut self, arg: T) -> Self` that only stores its
//! argument, so a builder reads as its documented names and types, and a
//! setter that does more (a conversion, a push, a check) stands out
//! written by hand.

/// Declares builder setters that store their argument in a field of the
/// same name, of `self` or of a field of it (`self.config`), as is or
/// wrapped (`= Some(d)`).
///
/// ```
/// use std::time::Duration;
///
/// #[derive(Debug, Default)]
/// pub struct Settings {
///     retries: u32,
///     timeout: Option<Duration>,
/// }
///
/// pub struct SettingsBuilder {
///     settings: Settings,
/// }
///
/// impl SettingsBuilder {
///     kcl_core::setters!(self.settings {
///         /// How many times to try again.
///         retries(n: u32),
///         /// How long one try may take (default: no limit).
///         timeout(d: Duration) = Some(d),
///     });
/// }
///
/// let b = SettingsBuilder { settings: Settings::default() }
///     .retries(3)
///     .timeout(Duration::from_secs(1));
/// assert_eq!(b.settings.retries, 3);
/// assert_eq!(b.settings.timeout, Some(Duration::from_secs(1)));
/// ```
///
/// Each setter is `pub`, takes `mut self` and returns `Self`; its
/// documentation and parameter name are as written in the list.
#[doc(hidden)]
#[macro_export]
macro_rules! setters {
    (self { $($list:tt)* }) => {
        $crate::setters!(@list [] $($list)*);
    };
    (self . $field:ident { $($list:tt)* }) => {
        $crate::setters!(@list [. $field] $($list)*);
    };
    (@list $place:tt $(
        $(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) $(= $value:expr)?
    ),* $(,)?) => {
        $( $crate::setters!(@one $place $(#[$doc])* $name($arg: $ty) $(= $value)?); )*
    };
    (@one [$($place:tt)*] $(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) $(= $value:expr)?) => {
        $(#[$doc])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self $($place)* . $name = $crate::setters!(@value $arg $($value)?);
            self
        }
    };
    (@value $arg:ident) => { $arg };
    (@value $arg:ident $value:expr) => { $value };
}
