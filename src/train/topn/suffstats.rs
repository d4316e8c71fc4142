//! The sufficient statistics of a `dp-topn` release as sums over users, computable in
//! parts (DESIGN 8, issue 22 item 3; docs/SCALING.md).
//!
//! Every statistic a `dp-topn` release noises is a sum over users of a term that depends
//! on that user's capped, clipped row only: the count sums (integers on the count grid),
//! the Gram trace and the Gram over the candidates (floats). So any partition of the
//! users (a shard: the users whose id hashes to `s` mod `S`, a partition of a
//! hash-partitioned table, a Citus worker) computes its partial sums, the parts are
//! added ([`CountSums::merge`], [`GramSums::merge`]), and the noise is drawn ONCE on the
//! merged sums by the trainer. The in-process trainer is the one-shard case.
//!
//! The cap's subset must then be the same whoever computes it, so it comes from a keyed
//! hash, not from a generator's stream ([`SubsetKey`], docs/privacy/dp-topn.md section
//! 2, "Cap"): a rating's digest is `HMAC-SHA256(key, be32(len(user)) || user || item)`
//! over the UTF-8 ids; a user keeps the `cap` ratings with the smallest digests
//! (byte-wise), and an RSM coin flip of rate `q` keeps a rating when
//! `u = be64(digest[24..32]) / 2^64 < q`. PostgreSQL computes the same digest from its
//! `sha256()` and the key's padded blocks (`store::suffstats_pg`).

use rand::RngCore;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::train::topn::contribution::Contribution;
use crate::train::TrainError;
use dprec_dp::rng::DpRng;

/// The release's secret key of the subset hash: 32 bytes drawn from the release's
/// sampling generator before any data is read. Never stored, logged or published.
/// A rating's digest is `HMAC-SHA256(key, be32(len(user)) || user || item)` (RFC 2104;
/// the states after the padded key blocks are kept, so a digest costs three SHA-256
/// blocks).
#[derive(Clone)]
pub struct SubsetKey {
    key: [u8; 32],
    inner: Sha256,
    outer: Sha256,
}

impl PartialEq for SubsetKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for SubsetKey {}

impl std::fmt::Debug for SubsetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubsetKey(..)")
    }
}

impl SubsetKey {
    pub fn new(key: [u8; 32]) -> Self {
        let (ipad, opad) = Self::pads_of(&key);
        Self {
            key,
            inner: Sha256::new().chain_update(ipad),
            outer: Sha256::new().chain_update(opad),
        }
    }

    pub fn draw(rng: &mut DpRng) -> Self {
        let mut k = [0u8; 32];
        rng.fill_bytes(&mut k);
        Self::new(k)
    }

    fn pads_of(key: &[u8; 32]) -> ([u8; 64], [u8; 64]) {
        let (mut ipad, mut opad) = ([0x36u8; 64], [0x5cu8; 64]);
        for (i, k) in key.iter().enumerate() {
            ipad[i] ^= k;
            opad[i] ^= k;
        }
        (ipad, opad)
    }

    /// HMAC's two padded key blocks `(K xor ipad, K xor opad)` (the key zero-padded to the
    /// 64-byte block): the database computes the digest as
    /// `sha256(opad || sha256(ipad || message))` with them.
    pub fn pads(&self) -> ([u8; 64], [u8; 64]) {
        Self::pads_of(&self.key)
    }

    /// `HMAC-SHA256(key, be32(len(user)) || user || item)`: the length prefix makes the
    /// encoding of (user, item) unambiguous.
    pub fn digest(&self, user: &str, item: &str) -> [u8; 32] {
        let inner = (self.inner.clone())
            .chain_update((user.len() as u32).to_be_bytes())
            .chain_update(user.as_bytes())
            .chain_update(item.as_bytes())
            .finalize();
        self.outer.clone().chain_update(inner).finalize().into()
    }
}

/// The RSM coin of a digest: its last 8 bytes as a uniform number in `[0, 1)` (the cap
/// orders by the leading bytes, so the two are independent for a random function).
pub fn coin(digest: &[u8; 32]) -> f64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[24..]);
    (u64::from_be_bytes(b) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A user's shard among `shards`: the first 8 bytes of `SHA-256(user)` mod `shards`
/// (public and data-independent; any partition of the users merges to the same sums).
pub fn shard_of(user: &str, shards: u32) -> u32 {
    let d = Sha256::digest(user.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    (u64::from_be_bytes(b) % u64::from(shards.max(1))) as u32
}

/// A user's count weight in grid units: `floor(min(1, clip / sqrt(m)) 2^bits)` for a row
/// of `m` items (exact: a power-of-two scaling; at most `2^bits`).
pub fn count_units(m: usize, clip: f64, bits: u32) -> i64 {
    let w = (clip / (m as f64).sqrt()).min(1.0);
    (w * (1i64 << bits) as f64).floor() as i64
}

/// A user's count weights in grid units when its `unliked` ratings weigh `omega` and the
/// `liked` ones 1 before the row is clipped to L2 norm `clip`: `(floor(s 2^bits),
/// floor(omega s 2^bits))` with `s = min(1, clip / sqrt(liked + omega^2 unliked))`, the
/// same float operations as the SQL of `store::suffstats_pg`. With no unliked rating (or
/// `omega = 1`) the first is [`count_units`] exactly.
pub fn weighted_count_units(
    liked: usize,
    unliked: usize,
    clip: f64,
    omega: f64,
    bits: u32,
) -> (i64, i64) {
    let s = (clip / ((liked as f64) + omega * omega * (unliked as f64)).sqrt()).min(1.0);
    let unit = (1i64 << bits) as f64;
    ((s * unit).floor() as i64, (omega * s * unit).floor() as i64)
}

/// A user's Gram weight `w^2`, `w = min(1, clip / sqrt(m))` for `m` candidate items (the
/// same float operations as the SQL of `store::suffstats_pg`).
pub fn gram_weight(m: usize, clip: f64) -> f64 {
    let w = (clip / (m as f64).sqrt()).min(1.0);
    w * w
}

/// Partial count sums: per item, `sum_u floor(w_u 2^bits)` over the shard's users with
/// the item in their capped row (integers: merging is exact).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountSums {
    pub bits: u32,
    pub units: Vec<i64>,
}

impl CountSums {
    pub fn zeros(n_items: usize, bits: u32) -> Self {
        Self {
            bits,
            units: vec![0; n_items],
        }
    }

    /// The shard's partial sums over its users' capped rows.
    pub fn of_rows<R: AsRef<[u32]>>(rows: &[R], n_items: usize, clip: f64, bits: u32) -> Self {
        let mut s = Self::zeros(n_items, bits);
        for row in rows {
            let row = row.as_ref();
            if row.is_empty() {
                continue;
            }
            let units = count_units(row.len(), clip, bits);
            for &j in row {
                s.units[j as usize] += units;
            }
        }
        s
    }

    /// [`CountSums::of_rows`] with the items after the first `liked[u]` of row `u`
    /// weighing `omega` ([`weighted_count_units`]; `liked` empty: every item weighs 1).
    pub fn of_weighted_rows<R: AsRef<[u32]>>(
        rows: &[R],
        liked: &[u32],
        n_items: usize,
        clip: f64,
        omega: f64,
        bits: u32,
    ) -> Self {
        if liked.is_empty() {
            return Self::of_rows(rows, n_items, clip, bits);
        }
        assert_eq!(rows.len(), liked.len(), "one liked count per row");
        let mut s = Self::zeros(n_items, bits);
        for (row, &l) in rows.iter().zip(liked) {
            let row = row.as_ref();
            let l = l as usize;
            if row.is_empty() {
                continue;
            }
            let (a, b) = weighted_count_units(l, row.len() - l, clip, omega, bits);
            row[..l].iter().for_each(|&j| s.units[j as usize] += a);
            row[l..].iter().for_each(|&j| s.units[j as usize] += b);
        }
        s
    }

    /// Adds another shard's sums (same grid and catalogue).
    pub fn merge(mut self, other: &Self) -> Self {
        assert_eq!(self.bits, other.bits, "count sums on different grids");
        assert_eq!(self.units.len(), other.units.len(), "different catalogues");
        self.units
            .iter_mut()
            .zip(&other.units)
            .for_each(|(a, b)| *a += b);
        self
    }
}

/// Partial Gram sums over `k` candidates: the upper triangle (row-major `k x k`, the
/// lower part zero) of `sum_u w_u^2 y_u y_u^T` and the trace statistic
/// `sum_u min(m_u, clip^2)`; `users` is how many users had a candidate (the bound of the
/// floating tolerance, [`GramSums::tolerance`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GramSums {
    pub k: usize,
    pub upper: Vec<f64>,
    pub trace: f64,
    pub users: u64,
}

impl GramSums {
    pub fn zeros(k: usize) -> Self {
        Self {
            k,
            upper: vec![0.0; k * k],
            trace: 0.0,
            users: 0,
        }
    }

    /// The shard's partial sums over its users' capped rows (`pos[j]`: item `j`'s
    /// candidate position, `u32::MAX` if not a candidate).
    pub fn of_rows<R: AsRef<[u32]> + Sync>(rows: &[R], pos: &[u32], k: usize, clip: f64) -> Self {
        rows.par_chunks(512)
            .fold(
                || Self::zeros(k),
                |mut acc, chunk| {
                    let mut p: Vec<usize> = Vec::new();
                    for row in chunk {
                        p.clear();
                        p.extend(
                            (row.as_ref().iter().map(|&j| pos[j as usize]))
                                .filter(|&a| a != u32::MAX)
                                .map(|a| a as usize),
                        );
                        if !p.is_empty() {
                            acc.add_user(&mut p, clip);
                        }
                    }
                    acc
                },
            )
            .reduce(|| Self::zeros(k), |a, b| a.merge(&b))
    }

    /// One user's term, from the candidate positions of its capped row.
    fn add_user(&mut self, p: &mut [usize], clip: f64) {
        p.sort_unstable();
        let w2 = gram_weight(p.len(), clip);
        for (i, &a) in p.iter().enumerate() {
            let base = a * self.k;
            for &b in &p[i..] {
                self.upper[base + b] += w2;
            }
        }
        self.trace += (p.len() as f64).min(clip * clip);
        self.users += 1;
    }

    /// Adds another shard's sums (same candidates).
    pub fn merge(mut self, other: &Self) -> Self {
        assert_eq!(self.k, other.k, "Gram sums over different candidates");
        self.upper
            .iter_mut()
            .zip(&other.upper)
            .for_each(|(a, b)| *a += b);
        self.trace += other.trace;
        self.users += other.users;
        self
    }

    /// The full symmetric `k x k` Gram.
    pub fn symmetric(&self) -> Vec<f64> {
        let (k, mut g) = (self.k, self.upper.clone());
        for a in 0..k {
            for b in 0..a {
                g[a * k + b] = g[b * k + a];
            }
        }
        g
    }

    /// How far two summation orders of the same sums can differ: every term is in
    /// `[0, max(1, clip^2)]` and each sum has at most `users` terms, so a recursive sum in
    /// any order is within `(users - 1) u S` of the exact `S` (`u = 2^-53`, Higham 2002,
    /// eq. 4.4, for nonnegative terms); two orders differ by at most twice that, i.e.
    /// `users * f64::EPSILON * S`.
    pub fn tolerance(users: u64, s: f64) -> f64 {
        users.max(1) as f64 * f64::EPSILON * s.abs()
    }
}

/// The candidate position of every item (`u32::MAX`: not a candidate).
pub fn candidate_positions(n_items: usize, candidates: &[u32]) -> Vec<u32> {
    let mut pos = vec![u32::MAX; n_items];
    for (a, &j) in candidates.iter().enumerate() {
        pos[j as usize] = a as u32;
    }
    pos
}

/// The users of shard `s` of `shards` (by [`shard_of`] of their labels): their rows.
pub fn shard_rows<'a>(
    rows: &'a [Vec<u32>],
    labels: &[String],
    s: u32,
    shards: u32,
) -> Vec<&'a [u32]> {
    rows.iter()
        .zip(labels)
        .filter(|(_, l)| shard_of(l, shards) == s)
        .map(|(r, _)| r.as_slice())
        .collect()
}

/// Who computes the sums a release noises: the trainer's own rows ([`InProcess`]), or a
/// database over its ratings table (`store::suffstats_pg`). Every method returns the
/// exact, noise-free sums of the rows that [`SubsetKey`] `key` and the contribution
/// bounds `c` select; the trainer adds the noise once.
pub trait StatsSource {
    /// Per-item count sums on the grid `2^-bits` ([`CountSums`]).
    fn count_sums(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        bits: u32,
    ) -> Result<CountSums, TrainError>;
    /// The trace statistic `sum_u min(m_u, gram_clip^2)` over the candidates.
    fn trace(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        candidates: &[u32],
    ) -> Result<f64, TrainError>;
    /// The Gram sums over the candidates ([`GramSums`]).
    fn gram_sums(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        candidates: &[u32],
    ) -> Result<GramSums, TrainError>;
}

/// Rows drawn with one key cannot answer for another.
fn same_key(rows: &SubsetKey, asked: &SubsetKey) -> Result<(), TrainError> {
    if rows == asked {
        Ok(())
    } else {
        Err(TrainError::Source(
            "rows drawn with another subset key".into(),
        ))
    }
}

/// The trainer's capped rows (drawn with `key`), split into `shards` by [`shard_of`] of
/// the users' labels, each shard's sums computed on its own and merged. The trainer's
/// in-process path is the one-shard case ([`InProcess::one`]); more shards are the shard
/// path on one machine (and SQLite's, whose database cannot compute the sums), equal to
/// it (test `shard_sums_merge_to_the_one_shot_sums`).
pub struct InProcess<'a> {
    pub rows: &'a [Vec<u32>],
    /// Per row, how many of its items, at the front, are liked; the rest weigh
    /// `unliked_weight` in the counts (aligned with `rows`; empty: every item weighs 1).
    /// The Gram ignores it.
    pub liked: &'a [u32],
    pub key: &'a SubsetKey,
    pub n_items: usize,
    pub shards: u32,
    /// The users' labels (read only when `shards > 1`).
    pub labels: &'a [String],
}

impl<'a> InProcess<'a> {
    pub fn one(rows: &'a [Vec<u32>], key: &'a SubsetKey, n_items: usize) -> Self {
        Self {
            rows,
            liked: &[],
            key,
            n_items,
            shards: 1,
            labels: &[],
        }
    }

    fn parts(&self) -> Vec<Vec<&'a [u32]>> {
        if self.shards <= 1 {
            return vec![self.rows.iter().map(Vec::as_slice).collect()];
        }
        (0..self.shards)
            .map(|s| shard_rows(self.rows, self.labels, s, self.shards))
            .collect()
    }

    /// The liked counts of [`Self::parts`]' rows, part by part (empty parts when every
    /// item weighs 1; the trainer's own slice, not a copy, for one shard).
    fn liked_parts(&self) -> Vec<std::borrow::Cow<'a, [u32]>> {
        use std::borrow::Cow;
        let n = self.shards.max(1) as usize;
        if self.liked.is_empty() || n == 1 {
            return vec![Cow::Borrowed(self.liked); n];
        }
        (0..self.shards)
            .map(|s| {
                (self.liked.iter().zip(self.labels))
                    .filter(|(_, l)| shard_of(l, self.shards) == s)
                    .map(|(&k, _)| k)
                    .collect::<Vec<u32>>()
                    .into()
            })
            .collect()
    }
}

impl StatsSource for InProcess<'_> {
    fn count_sums(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        bits: u32,
    ) -> Result<CountSums, TrainError> {
        same_key(self.key, key)?;
        let zero = CountSums::zeros(self.n_items, bits);
        let liked = self.liked_parts();
        Ok(self.parts().iter().zip(&liked).fold(zero, |a, (p, l)| {
            a.merge(&CountSums::of_weighted_rows(
                p,
                l,
                self.n_items,
                c.count_clip,
                c.unliked_weight,
                bits,
            ))
        }))
    }

    fn trace(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        candidates: &[u32],
    ) -> Result<f64, TrainError> {
        same_key(self.key, key)?;
        Ok(self
            .parts()
            .iter()
            .map(|p| gram_trace(p, self.n_items, candidates, c.gram_clip))
            .sum())
    }

    fn gram_sums(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        candidates: &[u32],
    ) -> Result<GramSums, TrainError> {
        same_key(self.key, key)?;
        let pos = candidate_positions(self.n_items, candidates);
        let k = candidates.len();
        Ok(self.parts().iter().fold(GramSums::zeros(k), |a, p| {
            a.merge(&GramSums::of_rows(p, &pos, k, c.gram_clip))
        }))
    }
}

/// The trace of [`gram`] without the matrix: `sum_u ||x_u||^2 = sum_u min(m_u, clip^2)`
/// over users with `m_u >= 1` of their items among the candidates.
pub fn gram_trace<R: AsRef<[u32]>>(
    rows: &[R],
    n_items: usize,
    candidates: &[u32],
    clip: f64,
) -> f64 {
    let mut is_candidate = vec![false; n_items];
    candidates
        .iter()
        .for_each(|&j| is_candidate[j as usize] = true);
    rows.iter()
        .map(|row| {
            row.as_ref()
                .iter()
                .filter(|&&j| is_candidate[j as usize])
                .count()
        })
        .filter(|&m| m > 0)
        .map(|m| (m as f64).min(clip * clip))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Interactions, RatingScale, Ratings};
    use crate::train::topn::contribution::Contribution;
    use crate::train::topn::dp_topn::sample_ratings;
    use crate::train::TrainData;
    use rand::Rng;

    fn ratings(n_users: u32, n_items: u32, seed: u64) -> Ratings {
        let mut g = dprec_dp::rng::seeded(seed);
        let mut r = Ratings::with_dims(n_users as usize, n_items as usize);
        for u in 0..n_users {
            // Light and heavy raters, so the cap binds for some.
            let n = g.random_range(1..=n_items.min(60));
            let mut items: Vec<u32> = (0..n_items).collect();
            rand::seq::SliceRandom::shuffle(items.as_mut_slice(), &mut g);
            for &j in &items[..n as usize] {
                r.push(u, j, 4.0);
            }
        }
        r
    }

    fn rows_with(r: &Ratings, key: &SubsetKey, cap: usize) -> Vec<Vec<u32>> {
        let m = Interactions::new(r);
        let data = TrainData::new(r, &m, RatingScale::ONE_TO_FIVE);
        sample_ratings(
            &data,
            crate::train::PerRating::Same {
                value: f64::INFINITY,
                len: r.len(),
            },
            1.0,
            1e-6,
            cap,
            None,
            key,
        )
        .unwrap()
        .rows
    }

    /// Over 3,000 keys a user's 3 of 10 ratings are a uniform subset: each item is kept
    /// 900 times in expectation (binomial sd 25.1; the bound, 5 sd, fails a subset rule
    /// that favours the first or last items, e.g. by index, at 100% or 0%).
    #[test]
    fn the_keyed_cap_keeps_a_uniform_subset() {
        let mut r = Ratings::with_dims(1, 10);
        (0..10).for_each(|j| r.push(0, j, 3.0));
        let mut kept = [0u32; 10];
        let mut g = dprec_dp::rng::seeded(1);
        for _ in 0..3000 {
            let row = &rows_with(&r, &SubsetKey::draw(&mut g), 3)[0];
            assert_eq!(row.len(), 3);
            row.iter().for_each(|&j| kept[j as usize] += 1);
        }
        for (j, &n) in kept.iter().enumerate() {
            assert!(
                (n as f64 - 900.0).abs() < 5.0 * 25.1,
                "item {j} kept {n} times"
            );
        }
        // The coin of a digest is uniform too: 20,000 coins have mean 1/2 within 5 sd.
        let key = SubsetKey::draw(&mut g);
        let mean = (0..20_000)
            .map(|i| coin(&key.digest("u", &i.to_string())))
            .sum::<f64>()
            / 20_000.0;
        assert!(
            (mean - 0.5).abs() < 5.0 * (1.0 / 12.0f64 / 20_000.0).sqrt(),
            "{mean}"
        );
    }

    /// The digest is HMAC-SHA256 (the `hmac` crate's, RFC 2104) of the length-prefixed ids.
    #[test]
    fn the_digest_is_hmac_sha256_of_the_ids() {
        use hmac::{Hmac, Mac};
        let key = SubsetKey::new([0xa5; 32]);
        let mut mac = Hmac::<Sha256>::new_from_slice(&[0xa5; 32]).unwrap();
        mac.update(&[0, 0, 0, 3]);
        mac.update("ü1".as_bytes());
        mac.update(b"item-7");
        let want: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(key.digest("ü1", "item-7"), want);
        assert_ne!(key.digest("ü1", "item-7"), key.digest("ü1i", "tem-7"));
    }

    /// A user's capped row depends only on its own ratings and the key: other users
    /// coming or going leave it unchanged, and one more rating of its own changes it by
    /// at most one swap (the rating-level bound of docs/privacy/dp-topn.md).
    #[test]
    fn a_users_subset_depends_only_on_its_own_ratings() {
        let key = SubsetKey::new([9; 32]);
        let r = ratings(40, 80, 2);
        let base = rows_with(&r, &key, 8);
        // User 0 gone (the others keep their indices by label: user 0's row is emptied).
        let mut without = Ratings::with_dims(40, 80);
        for i in 0..r.len() {
            if r.users[i] != 0 {
                without.push(r.users[i], r.items[i], r.values[i]);
            }
        }
        let rows = rows_with(&without, &key, 8);
        assert!(rows[0].is_empty());
        assert_eq!(&rows[1..], &base[1..]);
        // One more rating of a capped user: at most one item leaves, at most one enters.
        let u = (0..40).find(|&u| base[u].len() == 8).unwrap();
        let new_item = (0..80u32)
            .find(|j| !(0..r.len()).any(|i| r.users[i] == u as u32 && r.items[i] == *j))
            .unwrap();
        let mut more = r.clone();
        more.push(u as u32, new_item, 5.0);
        let after = &rows_with(&more, &key, 8)[u];
        let left = base[u].iter().filter(|j| !after.contains(j)).count();
        assert!(left <= 1 && after.len() == 8, "{:?} -> {after:?}", base[u]);
    }

    /// Partial sums over S shards of the users, merged, equal the one-shot sums: the
    /// counts exactly (integers), the Gram and trace within [`GramSums::tolerance`]
    /// (floats summed in another order). A shard that dropped or doubled a user fails.
    #[test]
    fn shard_sums_merge_to_the_one_shot_sums() {
        let r = ratings(300, 120, 3);
        let key = SubsetKey::new([5; 32]);
        let c = Contribution {
            cap: 16,
            count_clip: 3.0,
            gram_clip: 1.5,
            liked_min: None,
            unliked_weight: 1.0,
        };
        let rows = rows_with(&r, &key, c.cap);
        let labels: Vec<String> = (0..rows.len()).map(|u| u.to_string()).collect();
        let candidates: Vec<u32> = (0..120).step_by(3).collect();
        let pos = candidate_positions(120, &candidates);
        let one_counts = CountSums::of_rows(&rows, 120, c.count_clip, 12);
        let one_gram = GramSums::of_rows(&rows, &pos, candidates.len(), c.gram_clip);
        assert!(one_counts.units.iter().any(|&x| x > 0) && one_gram.users > 100);
        for shards in [1u32, 2, 3, 7] {
            let mut counts = CountSums::zeros(120, 12);
            let mut g = GramSums::zeros(candidates.len());
            for s in 0..shards {
                let part = shard_rows(&rows, &labels, s, shards);
                counts = counts.merge(&CountSums::of_rows(&part, 120, c.count_clip, 12));
                g = g.merge(&GramSums::of_rows(
                    &part,
                    &pos,
                    candidates.len(),
                    c.gram_clip,
                ));
            }
            assert_eq!(counts, one_counts, "{shards} shards");
            assert_eq!(g.users, one_gram.users);
            assert_gram_close(&g, &one_gram);
        }
    }

    /// The Gram sums and traces agree within the tolerance of their summation orders.
    pub fn assert_gram_close(a: &GramSums, b: &GramSums) {
        assert_eq!(a.k, b.k);
        for (i, (x, y)) in a.upper.iter().zip(&b.upper).enumerate() {
            let tol = GramSums::tolerance(a.users, x.max(*y));
            assert!((x - y).abs() <= tol, "entry {i}: {x} vs {y}");
        }
        let tol = GramSums::tolerance(a.users, a.trace.max(b.trace));
        assert!(
            (a.trace - b.trace).abs() <= tol,
            "trace {} vs {}",
            a.trace,
            b.trace
        );
    }
}
