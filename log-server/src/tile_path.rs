//! The C2SP tlog-tiles path grammar (docs/storage.md, "Read API", HTTP; c2sp.org/tlog-tiles):
//! `<L>/<N>[.p/<W>]` for hash tiles and `entries/<N>[.p/<W>]` for entry
//! bundles, as they follow `/tile/`. Only the spelling C2SP writes is
//! accepted, so a tile has exactly one URL (caches and mirrors depend on it).

use crate::tree::TILE_WIDTH;

/// A parsed C2SP tile path (without the leading `tile/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TilePath {
    /// `None` for an entry bundle (`entries`), else the hash tile level.
    pub level: Option<u8>,
    /// The tile index N.
    pub n: u64,
    /// `Some(w)` for a partial tile `.p/<W>`, 1 <= w < 256.
    pub partial: Option<u64>,
}

/// Parses `<L>/<N>[.p/<W>]` or `entries/<N>[.p/<W>]` as C2SP tlog-tiles
/// writes it: `N` in groups of three digits, all but the last prefixed `x`,
/// with no other spelling accepted.
///
/// # Errors
/// A message saying what is wrong.
pub fn parse_tile_path(path: &str) -> Result<TilePath, &'static str> {
    let mut parts: Vec<&str> = path.split('/').collect();
    if parts.len() < 2 {
        return Err("expected <L>/<N>[.p/<W>] or entries/<N>[.p/<W>]");
    }
    let level = match parts[0] {
        "entries" => None,
        l if !l.is_empty()
            && l.len() <= 2
            && l.bytes().all(|b| b.is_ascii_digit())
            && (l == "0" || !l.starts_with('0')) =>
        {
            let l: u8 = l.parse().map_err(|_| "bad level")?;
            if l > 7 {
                return Err("level must be 0 to 7 (a tree of 2^56 leaves)");
            }
            Some(l)
        }
        _ => return Err("level must be a decimal number or \"entries\""),
    };
    let mut partial = None;
    let last = parts.len() - 1;
    if parts[last - 1].ends_with(".p") && parts.len() >= 3 {
        let w = parts[last];
        let ok = !w.is_empty()
            && w.len() <= 3
            && w.bytes().all(|b| b.is_ascii_digit())
            && !w.starts_with('0');
        let w: u64 = if ok {
            w.parse().map_err(|_| "bad width")?
        } else {
            0
        };
        if !(1..TILE_WIDTH).contains(&w) {
            return Err("partial width must be 1 to 255 without leading zeros");
        }
        partial = Some(w);
        parts[last - 1] = &parts[last - 1][..parts[last - 1].len() - 2];
        parts.pop();
    }
    let groups = &parts[1..];
    if groups.is_empty() || groups.len() > 7 {
        return Err("bad tile index");
    }
    let mut n: u64 = 0;
    for (i, g) in groups.iter().enumerate() {
        let digits = if i + 1 < groups.len() {
            g.strip_prefix('x')
                .ok_or("tile index groups before the last must start with x")?
        } else {
            g
        };
        if digits.len() != 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err("tile index groups must be three digits");
        }
        if i == 0 && groups.len() > 1 && digits == "000" {
            return Err("tile index has a leading zero group");
        }
        let d: u64 = digits.parse().map_err(|_| "bad tile index")?;
        n = n
            .checked_mul(1000)
            .and_then(|n| n.checked_add(d))
            .ok_or("tile index out of range")?;
    }
    Ok(TilePath { level, n, partial })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(path: &str) -> TilePath {
        parse_tile_path(path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn full_and_partial_tiles_of_every_kind() {
        assert_eq!(
            ok("0/000"),
            TilePath {
                level: Some(0),
                n: 0,
                partial: None
            }
        );
        assert_eq!(ok("7/x001/x234/067").n, 1_234_067);
        assert_eq!(ok("3/x001/x234/067").level, Some(3));
        assert_eq!(
            ok("entries/x001/234.p/255"),
            TilePath {
                level: None,
                n: 1234,
                partial: Some(255)
            }
        );
        assert_eq!(ok("2/000.p/1").partial, Some(1));
        assert_eq!(
            ok("0/x999/x999/x999/x999/x999/999").n,
            999_999_999_999_999_999
        );
    }

    #[test]
    fn every_other_spelling_is_refused() {
        for bad in [
            "",
            "0",
            "entries",
            "8/000",
            "00/000",
            "01/000",
            "-1/000",
            "a/000",
            "0/0",
            "0/0000",
            "0/00a",
            "0/x000/001",
            "0/001/002",
            "0/x001",
            "0/000.p/0",
            "0/000.p/256",
            "0/000.p/01",
            "0/000.p/",
            "0/000.p/1/2",
            "0/000.p",
            "0/x1/000",
            "0/x001/x002/x003/x004/x005/x006/x007/008",
            // Seven groups that overflow 64 bits.
            "0/x999/x999/x999/x999/x999/x999/999",
        ] {
            assert!(parse_tile_path(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
