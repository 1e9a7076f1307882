//! Servers' log lines. A line often quotes what a peer sent: an abort
//! reason, a key-set id list, a standby digest, an error that carries
//! either. A peer must not be able to forge a line (a newline followed by
//! `served …`), move the terminal's cursor (escape sequences) or flood the
//! log, so every line is made printable and bounded before it is written
//! (issue 27).

/// Characters of a line kept at most; the rest is cut with a marker.
pub const MAX_CHARS: usize = 600;

/// `text` with every control character and every bidirectional or
/// zero-width formatting character escaped (`\n`, `\u{1b}`, `\u{202e}`),
/// cut to [`MAX_CHARS`] characters.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(4 * MAX_CHARS));
    for (i, c) in text.chars().enumerate() {
        if i == MAX_CHARS {
            out.push_str("… (cut)");
            break;
        }
        let hidden = matches!(
            c,
            '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}'
        );
        if c.is_control() || hidden {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes one log line of party `party`, made [`printable`].
pub fn line(party: u8, what: &str) {
    eprintln!("P{party}: {}", printable(what));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forged_lines_and_escapes_are_escaped_and_floods_cut() {
        let forged = "bye\nP0: key set 00: served in 0.1 s\u{1b}[2J\u{202e}";
        let p = printable(forged);
        assert!(!p.contains('\n') && !p.contains('\u{1b}') && !p.contains('\u{202e}'));
        assert!(
            p.contains("\\n") && p.contains("\\u{1b}") && p.contains("\\u{202e}"),
            "{p}"
        );
        let flood = "x".repeat(65_536);
        let p = printable(&flood);
        assert!(p.chars().count() <= MAX_CHARS + 8 && p.ends_with("(cut)"));
        assert_eq!(printable("plain text, ünïcode"), "plain text, ünïcode");
    }
}
