//! Compressed sparse layouts of a rating set.
//!
//! [`Interactions`] holds both a user-major (CSR) and an item-major (CSC) copy, built
//! once in O(n) by counting sort. Each entry also records its position in the source
//! [`Ratings`] (`source`), so per-rating metadata (privacy preferences, ledger slots)
//! can be looked up from either view without a hash map.

use super::Ratings;

/// One compressed orientation: row `r` owns `indptr[r]..indptr[r + 1]`.
#[derive(Debug, Clone, Default)]
pub struct Compressed {
    pub indptr: Vec<usize>,
    /// Column index of each entry (item for the user-major view, user for the item-major one).
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
    /// Position of each entry in the source [`Ratings`].
    pub source: Vec<u32>,
}

/// The row offsets of a counting sort: `indptr[r]..indptr[r + 1]` is where the entries
/// whose row is `r` go (`rows` holds each entry's row, in any order).
fn row_offsets(n_rows: usize, rows: &[u32]) -> Vec<usize> {
    let mut indptr = vec![0usize; n_rows + 1];
    for &r in rows {
        indptr[r as usize + 1] += 1;
    }
    for r in 0..n_rows {
        indptr[r + 1] += indptr[r];
    }
    indptr
}

impl Compressed {
    /// Groups `rows[k]` -> (`cols[k]`, `values[k]`) by row, keeping input order within a row.
    fn build(n_rows: usize, rows: &[u32], cols: &[u32], values: &[f32]) -> Self {
        let n = rows.len();
        let indptr = row_offsets(n_rows, rows);
        let mut next = indptr.clone();
        let mut indices = vec![0u32; n];
        let mut vals = vec![0f32; n];
        let mut source = vec![0u32; n];
        for k in 0..n {
            let r = rows[k] as usize;
            let slot = next[r];
            next[r] += 1;
            indices[slot] = cols[k];
            vals[slot] = values[k];
            source[slot] = k as u32;
        }
        Self {
            indptr,
            indices,
            values: vals,
            source,
        }
    }

    pub fn n_rows(&self) -> usize {
        self.indptr.len().saturating_sub(1)
    }

    /// Number of entries in row `r`.
    pub fn row_len(&self, r: usize) -> usize {
        self.indptr[r + 1] - self.indptr[r]
    }

    /// The (column indices, values) of row `r`.
    pub fn row(&self, r: usize) -> (&[u32], &[f32]) {
        let span = self.indptr[r]..self.indptr[r + 1];
        (&self.indices[span.clone()], &self.values[span])
    }

    /// Source positions of row `r`'s entries.
    pub fn row_source(&self, r: usize) -> &[u32] {
        &self.source[self.indptr[r]..self.indptr[r + 1]]
    }

    /// The other orientation (`n_cols` rows), each row's entries in source order, exactly
    /// what [`Compressed::build`] makes from the source with rows and columns swapped.
    fn transpose(&self, n_cols: usize) -> Compressed {
        let n = self.indices.len();
        let indptr = row_offsets(n_cols, &self.indices);
        let mut next = indptr.clone();
        let mut indices = vec![0u32; n];
        let mut values = vec![0f32; n];
        let mut source = vec![0u32; n];
        for row in 0..self.n_rows() {
            for k in self.indptr[row]..self.indptr[row + 1] {
                let slot = &mut next[self.indices[k] as usize];
                indices[*slot] = row as u32;
                values[*slot] = self.values[k];
                source[*slot] = self.source[k];
                *slot += 1;
            }
        }
        let mut out = Compressed {
            indptr,
            indices,
            values,
            source,
        };
        // Rows were filled in this view's row order; the source order is what a direct
        // build gives (the same unless the source was not sorted by this view's rows).
        for c in 0..n_cols {
            let span = out.indptr[c]..out.indptr[c + 1];
            if out.source[span.clone()].windows(2).any(|w| w[0] > w[1]) {
                let mut entries: Vec<(u32, u32, f32)> = span
                    .clone()
                    .map(|k| (out.source[k], out.indices[k], out.values[k]))
                    .collect();
                entries.sort_unstable_by_key(|e| e.0);
                for (k, (s, i, v)) in span.zip(entries) {
                    (out.source[k], out.indices[k], out.values[k]) = (s, i, v);
                }
            }
        }
        out
    }

    /// The same view with only the entries whose source position passes `keep` (rows
    /// and their order unchanged). Used to leave out ratings whose own release budget
    /// cannot pay for a step: the choice depends on each rating alone.
    pub fn retain(&self, keep: impl Fn(usize) -> bool) -> Compressed {
        let mut out = Compressed {
            indptr: Vec::with_capacity(self.indptr.len()),
            ..Default::default()
        };
        out.indptr.push(0);
        for row in 0..self.n_rows() {
            for k in self.indptr[row]..self.indptr[row + 1] {
                if keep(self.source[k] as usize) {
                    out.indices.push(self.indices[k]);
                    out.values.push(self.values[k]);
                    out.source.push(self.source[k]);
                }
            }
            out.indptr.push(out.indices.len());
        }
        out
    }
}

/// A rating set in both user-major and item-major form.
///
/// The item-major view is built on first use: `dp-topn`, the served default, reads only
/// the user-major one, and at 20M ratings the other is 240 MB at the release's peak
/// (lab note bench-02, issue 22).
#[derive(Debug, Clone, Default)]
pub struct Interactions {
    pub by_user: Compressed,
    item_major: std::sync::OnceLock<Compressed>,
    pub n_users: usize,
    pub n_items: usize,
}

impl Interactions {
    pub fn new(r: &Ratings) -> Self {
        Self {
            by_user: Compressed::build(r.n_users, &r.users, &r.items, &r.values),
            item_major: std::sync::OnceLock::new(),
            n_users: r.n_users,
            n_items: r.n_items,
        }
    }

    /// The item-major view (built from the user-major one on first use).
    pub fn by_item(&self) -> &Compressed {
        self.item_major
            .get_or_init(|| self.by_user.transpose(self.n_items))
    }

    pub fn nnz(&self) -> usize {
        self.by_user.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_views_hold_the_same_entries() {
        let mut r = Ratings::default();
        for (u, i, v) in [(0, 2, 5.0), (1, 0, 3.0), (0, 0, 1.0), (2, 2, 4.0)] {
            r.push(u, i, v);
        }
        let m = Interactions::new(&r);
        assert_eq!(m.by_user.row(0), (&[2u32, 0][..], &[5.0f32, 1.0][..]));
        assert_eq!(m.by_user.row(1), (&[0u32][..], &[3.0f32][..]));
        assert_eq!(m.by_item().row(2), (&[0u32, 2][..], &[5.0f32, 4.0][..]));
        assert_eq!(m.by_item().row_len(1), 0);
        assert_eq!(m.by_item().row_source(0), &[1u32, 2]);
        let kept = m.by_user.retain(|k| k != 2);
        assert_eq!(kept.row(0), (&[2u32][..], &[5.0f32][..]));
        assert_eq!(kept.row_source(0), &[0u32]);
        assert_eq!(kept.row(2), m.by_user.row(2));
        assert_eq!(kept.n_rows(), 3);
        for k in 0..m.nnz() {
            let s = m.by_user.source[k] as usize;
            assert_eq!(m.by_user.values[k], r.values[s]);
        }
    }

    /// The item-major view built from the user-major one equals a direct build, entry
    /// for entry and in the same order, whether or not the source is sorted by user.
    #[test]
    fn the_item_major_view_equals_a_direct_build() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for sorted in [false, true] {
            let mut r = Ratings::with_dims(40, 30);
            let mut entries: Vec<(u32, u32, f32)> = (0..400)
                .map(|_| {
                    (
                        rng.random_range(0..40),
                        rng.random_range(0..30),
                        rng.random_range(1..=5) as f32,
                    )
                })
                .collect();
            if sorted {
                entries.sort_by_key(|e| e.0);
            }
            for (u, i, v) in entries {
                r.push(u, i, v);
            }
            let direct = Compressed::build(r.n_items, &r.items, &r.users, &r.values);
            let m = Interactions::new(&r);
            let lazy = m.by_item();
            assert_eq!(lazy.indptr, direct.indptr, "sorted {sorted}");
            assert_eq!(lazy.indices, direct.indices, "sorted {sorted}");
            assert_eq!(lazy.values, direct.values, "sorted {sorted}");
            assert_eq!(lazy.source, direct.source, "sorted {sorted}");
        }
    }
}
