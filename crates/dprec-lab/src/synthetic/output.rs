//! Writing a generated set in the MovieLens "latest" formats.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use dprec::data::{DataError, Dataset};

use super::splitmix64;

/// Writes `dataset` in the MovieLens "latest" `ratings.csv` format:
/// `userId,movieId,rating,timestamp`. Ids are the dense indices plus one (MovieLens ids
/// start at 1); timestamps are synthetic, a fixed hash of the (user, item) pair between
/// 2000 and 2015.
pub fn write_csv(dataset: &Dataset, path: &Path) -> Result<(), DataError> {
    write_csv_with_progress(dataset, path, &mut |_| {})
}

/// [`write_csv`], calling `progress(k)` after every `k` rows written.
pub fn write_csv_with_progress(
    dataset: &Dataset,
    path: &Path,
    progress: &mut dyn FnMut(usize),
) -> Result<(), DataError> {
    const START: u64 = 946_684_800; // 2000-01-01T00:00:00Z
    const SPAN: u64 = 15 * 365 * 86_400;
    const REPORT_EVERY: usize = 1 << 20;
    let io = |source| DataError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = File::create(path).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let r = &dataset.ratings;
    let mut body = || -> std::io::Result<()> {
        w.write_all(b"userId,movieId,rating,timestamp\n")?;
        for k in 0..r.len() {
            let (u, i, v) = (r.users[k], r.items[k], r.values[k]);
            let ts = START + splitmix64(((u as u64) << 32) | i as u64) % SPAN;
            if v.fract() == 0.0 {
                writeln!(w, "{},{},{:.1},{}", u as u64 + 1, i as u64 + 1, v, ts)?;
            } else {
                writeln!(w, "{},{},{},{}", u as u64 + 1, i as u64 + 1, v, ts)?;
            }
            if (k + 1) % REPORT_EVERY == 0 {
                progress(REPORT_EVERY);
            }
        }
        w.flush()?;
        progress(r.len() % REPORT_EVERY);
        Ok(())
    };
    body().map_err(io)
}
