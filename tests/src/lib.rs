//! Cross-crate test support for suffuse.
