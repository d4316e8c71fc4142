//! Small dense linear algebra for per-user / per-item solves (d is tens, not thousands),
//! so no LAPACK dependency is needed.

/// Solves `a x = b` in place for a symmetric positive definite `a` (n x n, row-major) by
/// Cholesky factorisation. `a` is overwritten by its factor and `b` by the solution.
/// Returns `false` when `a` is not positive definite.
pub fn cholesky_solve(a: &mut [f64], b: &mut [f64], n: usize) -> bool {
    debug_assert_eq!(a.len(), n * n);
    debug_assert_eq!(b.len(), n);
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if d <= 0.0 || !d.is_finite() {
            return false;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
    }
    // Forward substitution L y = b.
    for i in 0..n {
        let mut s = b[i];
        for k in 0..i {
            s -= a[i * n + k] * b[k];
        }
        b[i] = s / a[i * n + i];
    }
    // Back substitution L^T x = y.
    for i in (0..n).rev() {
        let mut s = b[i];
        for k in i + 1..n {
            s -= a[k * n + i] * b[k];
        }
        b[i] = s / a[i * n + i];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_spd_system() {
        // a = m m^T + I for a fixed m, x known.
        let n = 4;
        let m = [
            1.0, 2.0, 0.0, 1.0, 0.5, -1.0, 3.0, 0.0, 0.0, 1.0, 1.0, 2.0, 1.0, 0.0, -2.0, 1.0,
        ];
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = (0..n).map(|k| m[i * n + k] * m[j * n + k]).sum::<f64>()
                    + if i == j { 1.0 } else { 0.0 };
            }
        }
        let x = [1.0, -2.0, 0.5, 3.0];
        let mut b: Vec<f64> = (0..n)
            .map(|i| (0..n).map(|j| a[i * n + j] * x[j]).sum())
            .collect();
        assert!(cholesky_solve(&mut a, &mut b, n));
        for i in 0..n {
            assert!((b[i] - x[i]).abs() < 1e-10);
        }
        let mut not_pd = vec![1.0, 2.0, 2.0, 1.0];
        assert!(!cholesky_solve(&mut not_pd, &mut [1.0, 1.0], 2));
    }
}
