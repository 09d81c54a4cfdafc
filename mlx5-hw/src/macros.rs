//! `prm_enum!`: a closed set of named PRM values over an open integer space.
//!
//! Devices write numbers this crate may not know (newer firmware, a bad
//! DMA read), so every enum declared here keeps an `Unknown(raw)` variant
//! instead of failing: converting a raw value never panics, and converting
//! back gives the same raw value.

/// Declares a `Copy` enum of named PRM values over an integer type, plus an
/// `Unknown(raw)` variant for every other value.
///
/// ```ignore
/// prm_enum! {
///     /// Command completion status (outbox byte 0).
///     pub enum CmdStatus: u8, unknown = "unknown status" {
///         /// The command completed.
///         Ok = 0x00 => "OK",
///         /// A parameter was out of range.
///         BadParam = 0x03 => "bad parameter",
///     }
/// }
/// ```
///
/// The generated enum has:
/// - `from_raw` / `to_raw` (`const fn`) and `From` conversions both ways;
/// - `name()`: the PRM / kernel name of the value (`"CREATE_CQ"`,
///   `"bad parameter"`), or the `unknown` text for `Unknown`;
/// - `is_known()` and `ALL`, the named values in declaration order;
/// - `Display` as `name(0xhex)`, the format Linux uses in its logs;
/// - `Debug`, `Clone`, `Copy`, and `PartialEq`/`Eq`/`Hash` defined on the
///   raw value, so a hand-built `Unknown(3)` equals the named variant for 3.
///
/// Every variant also gets a generated doc line with its name and value.
/// Each value must appear once: a duplicate is an unreachable-pattern warning.
macro_rules! prm_enum {
    (
        $(#[$attr:meta])*
        $vis:vis enum $name:ident : $repr:ty, unknown = $unknown:literal {
            $(
                $(#[$vattr:meta])*
                $variant:ident = $value:literal => $text:literal,
            )+
        }
    ) => {
        $(#[$attr])*
        #[derive(Copy, Clone, Debug)]
        $vis enum $name {
            $(
                $(#[$vattr])*
                #[doc = ""]
                #[doc = concat!("PRM name `", $text, "`, value `", stringify!($value), "`.")]
                $variant,
            )+
            /// A value without a name here; holds the raw value.
            Unknown($repr),
        }

        impl $name {
            /// Every named value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// Converts a raw value; values without a name become `Unknown`.
            #[inline]
            pub const fn from_raw(raw: $repr) -> Self {
                match raw {
                    $($value => Self::$variant,)+
                    other => Self::Unknown(other),
                }
            }

            /// The raw value, as the device reads or writes it.
            #[inline]
            pub const fn to_raw(self) -> $repr {
                match self {
                    $(Self::$variant => $value,)+
                    Self::Unknown(raw) => raw,
                }
            }

            /// The PRM / Linux name of the value, or the generic text for an
            /// unknown one.
            pub const fn name(&self) -> &'static str {
                match Self::from_raw(self.to_raw()) {
                    $(Self::$variant => $text,)+
                    Self::Unknown(_) => $unknown,
                }
            }

            /// Whether the value has a name here.
            pub const fn is_known(&self) -> bool {
                !matches!(Self::from_raw(self.to_raw()), Self::Unknown(_))
            }
        }

        impl ::core::convert::From<$repr> for $name {
            #[inline]
            fn from(raw: $repr) -> Self {
                Self::from_raw(raw)
            }
        }

        impl ::core::convert::From<$name> for $repr {
            #[inline]
            fn from(value: $name) -> Self {
                value.to_raw()
            }
        }

        impl ::core::cmp::PartialEq for $name {
            // Inline: a data path compares opcodes per message (the
            // model's send queue ~80 instructions a 64 B WRITE without).
            #[inline]
            fn eq(&self, other: &Self) -> bool {
                self.to_raw() == other.to_raw()
            }
        }

        impl ::core::cmp::Eq for $name {}

        impl ::core::hash::Hash for $name {
            fn hash<H: ::core::hash::Hasher>(&self, state: &mut H) {
                self.to_raw().hash(state);
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                write!(f, "{}({:#x})", self.name(), self.to_raw())
            }
        }
    };
}

pub(crate) use prm_enum;

#[cfg(test)]
mod tests {
    // `prm_enum!` is in textual scope here (defined above in this file).
    prm_enum! {
        /// A test enum.
        pub enum Sample: u16, unknown = "unknown sample" {
            /// First.
            One = 0x1 => "ONE",
            Big = 0xa00 => "BIG",
        }
    }

    #[test]
    fn round_trips_known_and_unknown() {
        assert_eq!(Sample::from(0x1u16), Sample::One);
        assert_eq!(u16::from(Sample::Big), 0xa00);
        let u = Sample::from(0x7777u16);
        assert_eq!(u, Sample::Unknown(0x7777));
        assert_eq!(u16::from(u), 0x7777);
        assert!(!u.is_known());
        assert_eq!(u.name(), "unknown sample");
        for v in Sample::ALL {
            assert_eq!(Sample::from_raw(v.to_raw()), *v);
            assert!(v.is_known());
        }
    }

    #[test]
    fn unknown_holding_a_named_value_is_that_value() {
        let odd = Sample::Unknown(0x1);
        assert_eq!(odd, Sample::One);
        assert_eq!(odd.name(), "ONE");
        assert!(odd.is_known());
        use std::collections::hash_map::DefaultHasher;
        use std::hash::{Hash, Hasher};
        let h = |s: Sample| {
            let mut st = DefaultHasher::new();
            s.hash(&mut st);
            st.finish()
        };
        assert_eq!(h(odd), h(Sample::One));
    }

    #[test]
    fn display_is_name_and_hex() {
        assert_eq!(Sample::Big.to_string(), "BIG(0xa00)");
        assert_eq!(Sample::Unknown(0x42).to_string(), "unknown sample(0x42)");
    }
}
