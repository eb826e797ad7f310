//! Text shown to people: the characters that must never reach a terminal
//! or a page raw, and their visible escape (docs/protocol.md §11.2).
//!
//! Tool names, call ids, list ids and note text come from agents and MCP
//! servers, and protocol.md refuses none of these characters in them (a
//! tool name is whatever a server declares). Printed raw, a right-to-left
//! override (U+202E) reorders the rest of a report line, a newline forges a
//! line of its own, and a zero-width or other invisible character makes
//! two different names look the same. So every text output escapes them
//! visibly; the JSON report keeps the exact strings.
//!
//! The set is exact, so that two verifiers print the same bytes: general
//! categories as of Unicode 16.0.0 (the `unicode-general-category` crate's
//! tables).

use std::borrow::Cow;
use std::fmt::Write as _;

use unicode_general_category::{get_general_category, GeneralCategory};

/// The Unicode version the set is defined over.
pub const UNICODE_VERSION: (u64, u64, u64) = unicode_general_category::UNICODE_VERSION;

/// Whether `c` is escaped in text output (protocol.md §11.2): general
/// category Cc, Cf, Cs, Co or Cn (controls, format characters such as the
/// bidirectional controls, private use, unassigned), Zl or Zp (line and
/// paragraph separators), Zs except U+0020 (spaces that look like a space
/// but are not one), and the Default_Ignorable_Code_Point characters of
/// other categories, which render as nothing: U+034F, U+115F, U+1160,
/// U+17B4, U+17B5, U+180B–U+180D, U+180F, U+3164, U+FE00–U+FE0F, U+FFA0 and
/// U+E0100–U+E01EF.
#[must_use]
pub fn is_escaped(c: char) -> bool {
    use GeneralCategory as G;
    match get_general_category(c) {
        G::Control
        | G::Format
        | G::Surrogate
        | G::PrivateUse
        | G::Unassigned
        | G::LineSeparator
        | G::ParagraphSeparator => true,
        G::SpaceSeparator => c != ' ',
        _ => matches!(
            u32::from(c),
            0x034F
                | 0x115F
                | 0x1160
                | 0x17B4
                | 0x17B5
                | 0x180B..=0x180D
                | 0x180F
                | 0x3164
                | 0xFE00..=0xFE0F
                | 0xFFA0
                | 0xE0100..=0xE01EF
        ),
    }
}

/// `s` with every character of [`is_escaped`] written as `\u{h}`, `h` its
/// code point in lowercase hex without leading zeros (`\u{202e}`,
/// `\u{a}`). Other characters, the backslash included, are unchanged, so
/// honest text prints as it is; the escape is for reading and is not
/// reversible (the JSON report has the exact strings).
#[must_use]
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_keeping(s, |_| false)
}

/// [`escape`] for text of several lines: `\n` stays a line break, every
/// other escaped character (a `\r` too) is escaped.
#[must_use]
pub fn escape_lines(s: &str) -> Cow<'_, str> {
    escape_keeping(s, |c| c == '\n')
}

fn escape_keeping(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    let hidden = |c: char| is_escaped(c) && !keep(c);
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if hidden(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidi_controls_and_invisible_characters_are_escaped() {
        assert_eq!(escape("send\u{202e}txt.exe"), "send\\u{202e}txt.exe");
        for c in [
            '\u{0}',
            '\t',
            '\n',
            '\r',
            '\u{1b}',
            '\u{7f}',
            '\u{85}', // Cc
            '\u{ad}',
            '\u{61c}',
            '\u{200b}',
            '\u{200d}',
            '\u{200e}',
            '\u{200f}', // Cf
            '\u{202a}',
            '\u{202b}',
            '\u{202c}',
            '\u{202d}',
            '\u{202e}', // embeddings
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}', // isolates
            '\u{feff}',
            '\u{e0041}', // BOM, tag
            '\u{2028}',
            '\u{2029}', // Zl, Zp
            '\u{a0}',
            '\u{2000}',
            '\u{3000}', // Zs other than space
            '\u{e000}',
            '\u{10ffff}', // Co, Cn
            '\u{34f}',
            '\u{115f}',
            '\u{3164}',
            '\u{fe0f}',
            '\u{e0100}', // other ignorables
        ] {
            assert!(is_escaped(c), "U+{:04X}", u32::from(c));
        }
        assert_eq!(escape("a\u{e0100}"), "a\\u{e0100}");
        assert_eq!(escape("\u{0}"), "\\u{0}");
    }

    #[test]
    fn honest_text_is_unchanged_and_borrowed() {
        for s in [
            "refund",
            "get_weather, send_email",
            "a\\u{202e}b",            // a backslash stays as it is
            "Grüße 東京 مرحبا עברית", // letters of any script, right-to-left too
            "é (e + U+0301)",
            "emoji 🙂",
            "",
        ] {
            assert!(matches!(escape(s), Cow::Borrowed(_)), "{s}");
        }
        assert_eq!(escape("e\u{301}"), "e\u{301}", "combining marks are text");
    }

    #[test]
    fn lines_keep_their_breaks() {
        assert_eq!(escape_lines("a\u{202e}\nb\r\n"), "a\\u{202e}\nb\\u{d}\n");
        assert_eq!(escape("a\nb"), "a\\u{a}b");
    }

    #[test]
    fn the_set_is_unicode_16() {
        assert_eq!(UNICODE_VERSION, (16, 0, 0));
    }
}
