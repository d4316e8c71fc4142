//! Dense symmetric linear algebra for item-item models (post-processing of released
//! Gram matrices; no privacy logic here): cyclic Jacobi eigen-decomposition of small
//! matrices, the top eigenvectors of larger ones by subspace iteration with
//! Rayleigh-Ritz, and the inverse of a symmetric positive definite matrix by Cholesky.
//!
//! Matrices are row-major `n x n` slices.

/// All eigenpairs of the symmetric `n x n` matrix `a` by cyclic Jacobi rotations.
/// Returns `(values, vectors)` sorted by descending eigenvalue; `vectors` is row-major
/// `n x n` with eigenvector `k` in column `k`.
pub fn jacobi_eigen(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(a.len(), n * n, "jacobi_eigen: matrix is not n x n");
    let mut m = a.to_vec();
    let mut v = vec![0.0; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    let scale: f64 = m
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| m[i * n + j] * m[i * n + j])
            .sum::<f64>()
            .sqrt();
        if off <= 1e-14 * scale {
            break;
        }
        for p in 0..n {
            for q in (p + 1)..n {
                let apq = m[p * n + q];
                if apq.abs() <= 1e-300 {
                    continue;
                }
                let theta = (m[q * n + q] - m[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                // Rotate rows and columns p, q of m (m <- J^T m J).
                for k in 0..n {
                    let (mkp, mkq) = (m[k * n + p], m[k * n + q]);
                    m[k * n + p] = c * mkp - s * mkq;
                    m[k * n + q] = s * mkp + c * mkq;
                }
                for k in 0..n {
                    let (mpk, mqk) = (m[p * n + k], m[q * n + k]);
                    m[p * n + k] = c * mpk - s * mqk;
                    m[q * n + k] = s * mpk + c * mqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| m[b * n + b].total_cmp(&m[a * n + a]));
    let values = order.iter().map(|&k| m[k * n + k]).collect();
    let mut vectors = vec![0.0; n * n];
    for (new, &old) in order.iter().enumerate() {
        for i in 0..n {
            vectors[i * n + new] = v[i * n + old];
        }
    }
    (values, vectors)
}

/// Orthonormalises the columns of the row-major `n x p` matrix `q` in place (modified
/// Gram-Schmidt, twice for stability); a column that vanishes is replaced by a unit
/// vector orthogonal to the others.
fn orthonormalise(q: &mut [f64], n: usize, p: usize) {
    for _pass in 0..2 {
        for j in 0..p {
            for k in 0..j {
                let dot: f64 = (0..n).map(|i| q[i * p + j] * q[i * p + k]).sum();
                for i in 0..n {
                    q[i * p + j] -= dot * q[i * p + k];
                }
            }
            let norm: f64 = (0..n).map(|i| q[i * p + j].powi(2)).sum::<f64>().sqrt();
            if norm > 1e-12 {
                for i in 0..n {
                    q[i * p + j] /= norm;
                }
            } else {
                // Degenerate column: restart it from a coordinate vector, re-orthogonalised.
                for i in 0..n {
                    q[i * p + j] = if i == j % n { 1.0 } else { 0.0 };
                }
                for k in 0..j {
                    let dot: f64 = (0..n).map(|i| q[i * p + j] * q[i * p + k]).sum();
                    for i in 0..n {
                        q[i * p + j] -= dot * q[i * p + k];
                    }
                }
                let norm: f64 = (0..n).map(|i| q[i * p + j].powi(2)).sum::<f64>().sqrt();
                for i in 0..n {
                    q[i * p + j] /= norm.max(1e-300);
                }
            }
        }
    }
}

/// `out = a * q` for row-major `a` (`n x n`) and `q` (`n x p`).
fn mat_block(a: &[f64], q: &[f64], n: usize, p: usize, out: &mut [f64]) {
    use rayon::prelude::*;
    out.par_chunks_mut(p).enumerate().for_each(|(i, row)| {
        row.iter_mut().for_each(|x| *x = 0.0);
        let ai = &a[i * n..(i + 1) * n];
        for (k, &aik) in ai.iter().enumerate() {
            if aik != 0.0 {
                let qk = &q[k * p..(k + 1) * p];
                for (r, &x) in row.iter_mut().zip(qk) {
                    *r += aik * x;
                }
            }
        }
    });
}

/// The `d` algebraically largest eigenpairs of the symmetric `n x n` matrix `a`:
/// `(values, vectors)` with `vectors` row-major `n x d` (eigenvector `k` in column `k`).
///
/// Matrices up to `n = 300` go through [`jacobi_eigen`] (exact to rounding). Larger
/// ones: [`subspace_eigen`].
/// `shift` must make `a + shift I` positive semi-definite for the iteration to find the
/// algebraically (not absolutely) largest eigenvalues; a bound on the most negative
/// eigenvalue of `a` (e.g. of its noise) does.
pub fn top_eigen(a: &[f64], n: usize, d: usize, shift: f64) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(a.len(), n * n, "top_eigen: matrix is not n x n");
    let d = d.min(n);
    if n > 300 {
        return subspace_eigen(a, n, d, shift);
    }
    let (vals, vecs) = jacobi_eigen(a, n);
    let mut out = vec![0.0; n * d];
    for i in 0..n {
        out[i * d..(i + 1) * d].copy_from_slice(&vecs[i * n..i * n + d]);
    }
    (vals[..d].to_vec(), out)
}

/// Subspace iteration on `a + shift I` with a block of `d + 8` vectors and Rayleigh-Ritz
/// every iteration, until the wanted Ritz values settle (relative 1e-12) or 1000
/// iterations. Converges at the rate `(lambda_{d+9} + shift) / (lambda_d + shift)`: fast
/// when the wanted eigenvalues stand clear of the rest.
pub fn subspace_eigen(a: &[f64], n: usize, d: usize, shift: f64) -> (Vec<f64>, Vec<f64>) {
    let d = d.min(n);
    let p = (d + 8).min(n);
    let mut shifted = a.to_vec();
    for i in 0..n {
        shifted[i * n + i] += shift;
    }
    // Deterministic start: a fixed pseudo-random block (post-processing needs no fresh
    // randomness, and a fixed start keeps results reproducible).
    let mut q: Vec<f64> = (0..n * p)
        .map(|k| {
            let x = (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
            (x as f64 / (1u64 << 53) as f64) - 0.5
        })
        .collect();
    orthonormalise(&mut q, n, p);
    let mut z = vec![0.0; n * p];
    let mut prev = vec![f64::INFINITY; d];
    let mut ritz_vals = vec![0.0; p];
    for _iter in 0..1000 {
        mat_block(&shifted, &q, n, p, &mut z);
        // Rayleigh-Ritz: H = Q^T (A + sI) Q, rotate Z's span to H's eigenvectors.
        let mut h = vec![0.0; p * p];
        for r in 0..p {
            for c in r..p {
                let x: f64 = (0..n).map(|i| q[i * p + r] * z[i * p + c]).sum();
                h[r * p + c] = x;
                h[c * p + r] = x;
            }
        }
        let (vals, w) = jacobi_eigen(&h, p);
        ritz_vals.copy_from_slice(&vals);
        // Next block: orthonormal basis of Z, rotated by W (same span as Q W scaled).
        let mut next = vec![0.0; n * p];
        for i in 0..n {
            for c in 0..p {
                next[i * p + c] = (0..p).map(|r| z[i * p + r] * w[r * p + c]).sum();
            }
        }
        orthonormalise(&mut next, n, p);
        q = next;
        let settled = (0..d)
            .all(|k| (ritz_vals[k] - prev[k]).abs() <= 1e-12 * ritz_vals[0].abs().max(1e-300));
        prev.copy_from_slice(&ritz_vals[..d]);
        if settled {
            break;
        }
    }
    // Final Rayleigh-Ritz on the converged block, on the unshifted matrix.
    mat_block(a, &q, n, p, &mut z);
    let mut h = vec![0.0; p * p];
    for r in 0..p {
        for c in r..p {
            let x: f64 = (0..n).map(|i| q[i * p + r] * z[i * p + c]).sum();
            h[r * p + c] = x;
            h[c * p + r] = x;
        }
    }
    let (vals, w) = jacobi_eigen(&h, p);
    let mut vecs = vec![0.0; n * d];
    for i in 0..n {
        for c in 0..d {
            vecs[i * d + c] = (0..p).map(|r| q[i * p + r] * w[r * p + c]).sum();
        }
    }
    (vals[..d].to_vec(), vecs)
}

/// Inverse of the symmetric positive definite `n x n` matrix `a` by Cholesky
/// factorisation; `None` when `a` is not (numerically) positive definite.
pub fn spd_inverse(a: &[f64], n: usize) -> Option<Vec<f64>> {
    assert_eq!(a.len(), n * n, "spd_inverse: matrix is not n x n");
    // Lower factor L (row-major), a = L L^T.
    let mut l = vec![0.0; n * n];
    for j in 0..n {
        let mut s = a[j * n + j];
        for k in 0..j {
            s -= l[j * n + k] * l[j * n + k];
        }
        if !s.is_finite() || s <= 0.0 {
            return None;
        }
        let ljj = s.sqrt();
        l[j * n + j] = ljj;
        for i in (j + 1)..n {
            let mut s = a[i * n + j];
            let (li, lj) = (&l[i * n..i * n + j], &l[j * n..j * n + j]);
            s -= li.iter().zip(lj).map(|(x, y)| x * y).sum::<f64>();
            l[i * n + j] = s / ljj;
        }
    }
    // Inverse of L (lower triangular), then a^-1 = L^-T L^-1.
    let mut li = vec![0.0; n * n];
    for j in 0..n {
        li[j * n + j] = 1.0 / l[j * n + j];
        for i in (j + 1)..n {
            let s: f64 = (j..i).map(|k| l[i * n + k] * li[k * n + j]).sum();
            li[i * n + j] = -s / l[i * n + i];
        }
    }
    use rayon::prelude::*;
    let mut inv = vec![0.0; n * n];
    inv.par_chunks_mut(n).enumerate().for_each(|(r, row)| {
        for (c, x) in row.iter_mut().enumerate() {
            let from = r.max(c);
            *x = (from..n).map(|k| li[k * n + r] * li[k * n + c]).sum();
        }
    });
    Some(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_symmetric(n: usize, seed: u64) -> Vec<f64> {
        use rand::Rng;
        let mut rng = dprec_dp::rng::seeded(seed);
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in i..n {
                let x: f64 = rng.random::<f64>() - 0.5;
                a[i * n + j] = x;
                a[j * n + i] = x;
            }
        }
        a
    }

    /// ||A v - lambda v|| for each returned pair, and orthonormal vectors.
    fn check_pairs(a: &[f64], n: usize, vals: &[f64], vecs: &[f64], d: usize, tol: f64) {
        for k in 0..d {
            let mut res = 0.0;
            for i in 0..n {
                let av: f64 = (0..n).map(|j| a[i * n + j] * vecs[j * d + k]).sum();
                res += (av - vals[k] * vecs[i * d + k]).powi(2);
            }
            assert!(res.sqrt() < tol, "pair {k}: residual {}", res.sqrt());
            for l in 0..d {
                let dot: f64 = (0..n).map(|i| vecs[i * d + k] * vecs[i * d + l]).sum();
                let want = if k == l { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-8, "columns {k},{l}: {dot}");
            }
        }
    }

    #[test]
    fn jacobi_solves_a_random_matrix() {
        let n = 12;
        let a = random_symmetric(n, 1);
        let (vals, vecs) = jacobi_eigen(&a, n);
        check_pairs(&a, n, &vals, &vecs, n, 1e-10);
        assert!(vals.windows(2).all(|w| w[0] >= w[1]));
        let trace: f64 = (0..n).map(|i| a[i * n + i]).sum();
        assert!((vals.iter().sum::<f64>() - trace).abs() < 1e-10);
    }

    /// A low-rank PSD matrix plus symmetric noise with negative eigenvalues: subspace
    /// iteration finds the algebraically largest (signal) eigenpairs, as Jacobi does.
    #[test]
    fn subspace_matches_jacobi_on_noisy_low_rank() {
        let n = 90;
        let mut a = random_symmetric(n, 2);
        for i in 0..n {
            for j in 0..n {
                let (u, v) = ((i as f64 * 0.37).sin(), (j as f64 * 0.37).sin());
                let (s, t) = ((i as f64 * 0.11).cos(), (j as f64 * 0.11).cos());
                a[i * n + j] += 30.0 * u * v + 12.0 * s * t;
            }
        }
        let (full, _) = jacobi_eigen(&a, n);
        let shift = (0..n)
            .map(|i| (0..n).map(|j| a[i * n + j].abs()).sum::<f64>())
            .fold(0.0, f64::max);
        let (vals, vecs) = subspace_eigen(&a, n, 2, shift);
        for k in 0..2 {
            assert!(
                (vals[k] - full[k]).abs() < 1e-6,
                "{k}: {} vs {}",
                vals[k],
                full[k]
            );
        }
        // Residual ~ sqrt(eigenvalue error x gap): 1e-2 on eigenvalues ~1e3.
        check_pairs(&a, n, &vals, &vecs, 2, 1e-2);
        let (vals, _) = top_eigen(&a, n, 3, shift);
        assert_eq!(vals, full[..3].to_vec());
    }

    #[test]
    fn spd_inverse_inverts_and_rejects_indefinite() {
        let n = 20;
        let mut a = random_symmetric(n, 3);
        for i in 0..n {
            a[i * n + i] += 5.0;
        }
        let inv = spd_inverse(&a, n).expect("positive definite");
        for i in 0..n {
            for j in 0..n {
                let x: f64 = (0..n).map(|k| a[i * n + k] * inv[k * n + j]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((x - want).abs() < 1e-10, "({i},{j}) {x}");
            }
        }
        let mut b = a.clone();
        b[0] = -1.0;
        assert!(spd_inverse(&b, n).is_none());
    }
}
