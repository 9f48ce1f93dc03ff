//! A row-major product `C[M, N] (+)= A[M, K] B[K, N]` as cuBLASLt's column-major one.
//!
//! A row-major matrix is the column-major storage of its transpose, so cuBLASLt computes
//! `C^T = B^T A^T`: its first operand is our `B`, its second our `A`, its `m` our `N` and
//! its `n` our `M`. Each operand keeps its own strides: a row-major matrix is taken as
//! stored, a transposed view (unit stride down its rows) with cuBLASLt's transpose, so
//! neither `W^T` nor `h_c^T` is ever copied.

/// One matrix as cuBLASLt reads or writes it: column-major storage of `rows x cols` with
/// leading dimension `ld`, transposed before the product when `transposed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StoredMatrix {
    pub transposed: bool,
    pub rows: u64,
    pub cols: u64,
    pub ld: u64,
}

/// The row-major `X [rows, cols]` with element strides `strides`, seen by cuBLASLt as
/// `X^T` (`cols x rows` once its op is applied). `None` where neither dimension has unit
/// stride, the rows or columns overlap, or the matrix is empty.
pub(crate) fn as_transpose(rows: usize, cols: usize, strides: [usize; 2]) -> Option<StoredMatrix> {
    if rows == 0 || cols == 0 {
        return None;
    }
    let [row_stride, col_stride] = strides;
    // Unit steps along a row, rows apart: column-major `cols x rows` as stored.
    if (cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= cols) {
        let ld = if rows == 1 { cols } else { row_stride };
        return Some(StoredMatrix {
            transposed: false,
            rows: cols as u64,
            cols: rows as u64,
            ld: ld as u64,
        });
    }
    // A transposed view (unit steps down a column, columns apart): column-major
    // `rows x cols` as stored, transposed by cuBLASLt.
    if (rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= rows) {
        let ld = if cols == 1 { rows } else { col_stride };
        return Some(StoredMatrix {
            transposed: true,
            rows: rows as u64,
            cols: cols as u64,
            ld: ld as u64,
        });
    }
    None
}

/// A 2-D operand of a product: its shape and element strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Matrix {
    pub shape: [usize; 2],
    pub strides: [usize; 2],
}

/// `out [M, N] (+)= lhs [M, K] rhs [K, N]` in cuBLASLt's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LtProduct {
    /// cuBLASLt's `A` (`m x k` after its op): `rhs`.
    pub a: StoredMatrix,
    /// cuBLASLt's `B` (`k x n` after its op): `lhs`.
    pub b: StoredMatrix,
    /// cuBLASLt's `C` and `D` (`m x n`): `out`, never transposed.
    pub d: StoredMatrix,
    pub m: u64,
    pub n: u64,
    pub k: u64,
}

/// The product in cuBLASLt's terms, or `None` where the shapes disagree, a dimension is
/// empty, or an operand's strides have no unit dimension (the CubeCL path takes those).
pub(crate) fn lt_product(lhs: Matrix, rhs: Matrix, out: Matrix) -> Option<LtProduct> {
    let [m_rows, k] = lhs.shape;
    let [rhs_k, n_cols] = rhs.shape;
    if rhs_k != k || out.shape != [m_rows, n_cols] {
        return None;
    }
    let a = as_transpose(k, n_cols, rhs.strides)?;
    let b = as_transpose(m_rows, k, lhs.strides)?;
    let d = as_transpose(m_rows, n_cols, out.strides)?;
    if d.transposed {
        return None;
    }
    Some(LtProduct {
        a,
        b,
        d,
        m: n_cols as u64,
        n: m_rows as u64,
        k: k as u64,
    })
}

/// The alignment cuBLASLt may assume of an operand starting at `address` with leading
/// dimension `ld` of `elem_bytes`-byte elements: the largest power of two dividing both
/// byte counts, at most 256 (its default requirement, and the most it asks about).
pub(crate) fn alignment_bytes(address: u64, ld: u64, elem_bytes: u64) -> u32 {
    let combined = address | (ld * elem_bytes) | 256;
    1u32 << combined.trailing_zeros().min(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads element `(i, j)` of `X` through cuBLASLt's view of it (`op(stored)` is
    /// `X^T`, so `X[i][j]` is `op(stored)[j][i]`).
    fn element_through_lt(stored: StoredMatrix, i: usize, j: usize) -> usize {
        let (r, c) = if stored.transposed { (i, j) } else { (j, i) };
        // Column-major: element (r, c) at r + c * ld.
        r + c * stored.ld as usize
    }

    /// Every element of a matrix and of its transposed view, at padded strides, comes
    /// back from the offset cuBLASLt's view gives it.
    #[test]
    fn views_address_every_element_where_the_strides_put_it() {
        for (rows, cols, pad) in [(3, 5, 0), (4, 1, 2), (1, 6, 3), (7, 2, 1), (1, 1, 0)] {
            let strides = [cols + pad, 1];
            let stored = as_transpose(rows, cols, strides).expect("row-major");
            assert!(!stored.transposed);
            assert!(stored.ld >= stored.rows);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(element_through_lt(stored, i, j), i * strides[0] + j);
                }
            }
            // The transposed view of a row-major [cols, rows] matrix.
            let t_strides = [1, rows + pad];
            let stored = as_transpose(rows, cols, t_strides).expect("transposed view");
            assert!(stored.ld >= stored.rows);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(element_through_lt(stored, i, j), i + j * t_strides[1]);
                }
            }
        }
    }

    #[test]
    fn overlapping_or_strided_matrices_are_refused() {
        assert_eq!(as_transpose(4, 8, [4, 1]), None);
        assert_eq!(as_transpose(4, 8, [16, 2]), None);
        assert_eq!(as_transpose(0, 8, [8, 1]), None);
    }

    /// The fused linear cross-entropy's three chunk products: the logits `h_c W`, the
    /// hidden-state gradient `dlogits W^T` and the weight gradient `h_c^T dlogits`.
    #[test]
    fn the_heads_products_map_to_cublaslt() {
        let (rows, width, vocab, padded) = (64, 32, 1000, 1024);
        let hidden = Matrix {
            shape: [rows, width],
            strides: [width, 1],
        };
        let weight = Matrix {
            shape: [width, vocab],
            strides: [padded, 1],
        };
        let logits = Matrix {
            shape: [rows, vocab],
            strides: [vocab, 1],
        };
        let product = lt_product(hidden, weight, logits).expect("logits");
        assert_eq!((product.m, product.n, product.k), (1000, 64, 32));
        assert!(!product.a.transposed && !product.b.transposed);
        assert_eq!((product.a.ld, product.b.ld, product.d.ld), (1024, 32, 1000));

        let weight_t = Matrix {
            shape: [vocab, width],
            strides: [1, padded],
        };
        let hidden_grad = Matrix {
            shape: [rows, width],
            strides: [width, 1],
        };
        let product = lt_product(logits, weight_t, hidden_grad).expect("hidden gradient");
        assert_eq!((product.m, product.n, product.k), (32, 64, 1000));
        assert!(product.a.transposed && !product.b.transposed);

        let hidden_t = Matrix {
            shape: [width, rows],
            strides: [1, width],
        };
        let weight_grad = Matrix {
            shape: [width, vocab],
            strides: [padded, 1],
        };
        let product = lt_product(hidden_t, logits, weight_grad).expect("weight gradient");
        assert_eq!((product.m, product.n, product.k), (1000, 32, 64));
        assert!(!product.a.transposed && product.b.transposed);
        assert_eq!(product.d.ld, 1024);
    }

    #[test]
    fn alignment_is_the_largest_common_power_of_two() {
        assert_eq!(alignment_bytes(0x1000, 1024, 2), 256);
        assert_eq!(alignment_bytes(0x1008, 1024, 2), 8);
        assert_eq!(alignment_bytes(0x1000, 1001, 2), 2);
        assert_eq!(alignment_bytes(0x1000, 1001, 4), 4);
    }
}
