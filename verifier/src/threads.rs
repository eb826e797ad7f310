//! How many threads the verifier's parallel work uses (`pool`'s workers;
//! `sig::verify_many` in tests).

/// Number of worker threads for `requested` (0: one per core).
pub(crate) fn thread_count(requested: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
