//! Byte-level mutations for the unit tests that hold the fast parsers to the
//! strict ones: flip a byte, repeat a run, or cut a run, from a fixed seed
//! so that a failure reproduces.

/// `count` mutations of `base`, each one edit; runs are 1 to `max_run`
/// bytes long.
pub(crate) fn mutations(
    base: &[u8],
    seed: u64,
    count: usize,
    max_run: usize,
) -> impl Iterator<Item = Vec<u8>> + '_ {
    let mut state = seed;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count).map(move |_| {
        let mut m = base.to_vec();
        let at = (next() as usize) % m.len();
        let end = (at + 1 + (next() as usize) % max_run).min(m.len());
        match next() % 3 {
            0 => m[at] ^= (next() as u8) | 1,
            1 => {
                let run = m[at..end].to_vec();
                m.splice(at..at, run);
            }
            _ => {
                m.drain(at..end);
            }
        }
        m
    })
}
