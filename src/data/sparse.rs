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

impl Compressed {
    /// Groups `rows[k]` -> (`cols[k]`, `values[k]`) by row, keeping input order within a row.
    fn build(n_rows: usize, rows: &[u32], cols: &[u32], values: &[f32]) -> Self {
        let n = rows.len();
        let mut indptr = vec![0usize; n_rows + 1];
        for &r in rows {
            indptr[r as usize + 1] += 1;
        }
        for r in 0..n_rows {
            indptr[r + 1] += indptr[r];
        }
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
#[derive(Debug, Clone, Default)]
pub struct Interactions {
    pub by_user: Compressed,
    pub by_item: Compressed,
    pub n_users: usize,
    pub n_items: usize,
}

impl Interactions {
    pub fn new(r: &Ratings) -> Self {
        Self {
            by_user: Compressed::build(r.n_users, &r.users, &r.items, &r.values),
            by_item: Compressed::build(r.n_items, &r.items, &r.users, &r.values),
            n_users: r.n_users,
            n_items: r.n_items,
        }
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
        assert_eq!(m.by_item.row(2), (&[0u32, 2][..], &[5.0f32, 4.0][..]));
        assert_eq!(m.by_item.row_len(1), 0);
        assert_eq!(m.by_item.row_source(0), &[1u32, 2]);
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
}
