//! Errors: small `Copy` enums without strings, so that no_std callers can
//! match on them and hosts can wrap them.

use core::fmt;

/// Everything that can go wrong in `suffuse-core`.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// A ring or domain width outside `1..=64` bits.
    InvalidWidth,
    /// A value does not fit the width it was given for.
    ValueOutOfRange,
    /// A caller buffer has the wrong length for the shape it is used with.
    BufferLength,
    /// Keys of one kind were handed to an operation for another kind.
    KindMismatch,
    /// A batch evaluator cannot run this request (for example, no device).
    Unsupported,
    /// A serialized object failed validation.
    Wire(WireError),
    /// A structured univariate function descriptor is malformed.
    Suf(SufError),
}

/// Why a serialized key or frame was rejected.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireError {
    /// Fewer bytes than the header or the declared contents need.
    Truncated,
    /// More bytes than the declared contents.
    TrailingBytes,
    /// The magic number is not ours.
    BadMagic,
    /// A format version this build does not read.
    UnsupportedVersion,
    /// An enumerated header field holds an unknown value.
    UnknownTag,
    /// A width field is outside its allowed range.
    BadWidth,
    /// A reserved field is not zero.
    ReservedNonZero,
    /// A declared count overflows the address space.
    CountOverflow,
}

/// Why a structured univariate function was rejected.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SufError {
    /// Interval boundaries are not strictly increasing from 0 to 2^n.
    Boundaries,
    /// More intervals, outputs, coefficients or program steps than supported.
    Capacity,
    /// A polynomial exceeds the declared degree bound.
    Degree,
    /// A predicate's parameters do not fit its width.
    Predicate,
    /// A Boolean program is not a well-formed postfix expression.
    Program,
    /// Fixed-point metadata is inconsistent (for example f > n).
    FixedPoint,
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Self {
        Error::Wire(e)
    }
}

impl From<SufError> for Error {
    fn from(e: SufError) -> Self {
        Error::Suf(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidWidth => f.write_str("bit width outside 1..=64"),
            Error::ValueOutOfRange => f.write_str("value does not fit its bit width"),
            Error::BufferLength => f.write_str("buffer length does not match the shape"),
            Error::KindMismatch => f.write_str("keys of the wrong kind for this operation"),
            Error::Unsupported => f.write_str("operation not supported by this evaluator"),
            Error::Wire(e) => write!(f, "malformed serialized data: {e}"),
            Error::Suf(e) => write!(f, "malformed SUF descriptor: {e}"),
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireError::Truncated => "truncated",
            WireError::TrailingBytes => "trailing bytes after the declared contents",
            WireError::BadMagic => "bad magic number",
            WireError::UnsupportedVersion => "unsupported format version",
            WireError::UnknownTag => "unknown tag in header",
            WireError::BadWidth => "width field out of range",
            WireError::ReservedNonZero => "reserved field is not zero",
            WireError::CountOverflow => "declared count overflows",
        })
    }
}

impl fmt::Display for SufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SufError::Boundaries => "interval boundaries must increase strictly from 0 to 2^n",
            SufError::Capacity => "descriptor exceeds a fixed capacity",
            SufError::Degree => "polynomial exceeds the degree bound",
            SufError::Predicate => "predicate parameters do not fit the width",
            SufError::Program => "Boolean program is not well formed",
            SufError::FixedPoint => "inconsistent fixed-point metadata",
        })
    }
}

impl core::error::Error for Error {}
impl core::error::Error for WireError {}
impl core::error::Error for SufError {}
