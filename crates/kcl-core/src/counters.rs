//! Counter sets declared once: [`counters!`](crate::counters) writes the
//! atomic struct the code bumps, the plain snapshot struct tests and tools
//! read, `snapshot()` and `since()` from one list of fields, so a counter
//! added to the list cannot be left out of the copy.

/// Declares a set of `AtomicU64` counters and its snapshot.
///
/// ```
/// kcl_core::counters! {
///     /// Counters of a reader.
///     pub struct ReaderStats => ReaderSnapshot {
///         counts {
///             /// Calls made.
///             calls,
///         }
///         levels {
///             /// Bytes held right now.
///             buffered,
///         }
///     }
/// }
/// let stats = ReaderStats::default();
/// stats.calls.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
/// let before = stats.snapshot();
/// stats.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
/// assert_eq!(stats.snapshot().since(&before).calls, 1);
/// ```
///
/// `counts` only grow, and `since` subtracts them; `levels` (gauges, peaks)
/// go up and down, and `since` keeps the later value. The fields of the
/// atomic struct are visible in the declaring crate only; each is read
/// with `Relaxed` ordering, so a snapshot is a set of counts, not one
/// instant.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $snap:ident {
            counts { $( $(#[$cmeta:meta])* $count:ident ),* $(,)? }
            $( levels { $( $(#[$lmeta:meta])* $level:ident ),* $(,)? } )?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( pub(crate) $count: ::std::sync::atomic::AtomicU64, )*
            $( $( pub(crate) $level: ::std::sync::atomic::AtomicU64, )* )?
        }

        #[doc = concat!("A copy of [`", stringify!($name), "`].")]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        $vis struct $snap {
            $( $(#[$cmeta])* pub $count: u64, )*
            $( $( $(#[$lmeta])* pub $level: u64, )* )?
        }

        impl $name {
            /// Reads every counter.
            pub fn snapshot(&self) -> $snap {
                use ::std::sync::atomic::Ordering::Relaxed;
                $snap {
                    $( $count: self.$count.load(Relaxed), )*
                    $( $( $level: self.$level.load(Relaxed), )* )?
                }
            }
        }

        impl $snap {
            /// The counts accumulated since `earlier`; levels as they are now.
            pub fn since(&self, earlier: &$snap) -> $snap {
                $snap {
                    $( $count: self.$count.saturating_sub(earlier.$count), )*
                    $( $( $level: self.$level, )* )?
                }
            }
        }
    };
}
