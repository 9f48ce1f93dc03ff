//! The tiling's rows of tiles per plane, picked from the product's shape.

use cubek::matmul::multi_level::definition::MultiRowStrategy;

/// How many rows of `mma` tiles each computing plane of the kernel takes. The cube's
/// output tile is the same either way: computing planes of one row of tiles each, or half
/// as many of two, which load each tile of the right operand once for both rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlaneRows {
    /// One row of tiles per plane.
    One,
    /// Two rows of tiles per plane.
    Two,
}

/// Inner length from which [`PlaneRows::for_product`] gives each plane two rows.
const LONG_INNER: usize = 16_384;

/// Output rows above which [`PlaneRows::for_product`] gives each plane two rows whatever
/// the inner length (where cubek-matmul's own selection starts giving two).
const TALL_OUTPUT: usize = 2048;

impl PlaneRows {
    /// The rows per plane for an output of `rows` rows over `inner` columns: two over a
    /// long inner dimension (a chunk's hidden-state gradient, over the vocabulary), where
    /// the main loop is all the time, or on a tall output (the weight gradient of a head
    /// more than 2048 wide); one otherwise (a narrower head's weight-gradient chunk
    /// products, over the chunk's rows), where writing the sum weighs more.
    pub fn for_product(rows: usize, inner: usize) -> Self {
        if inner >= LONG_INNER || rows > TALL_OUTPUT {
            Self::Two
        } else {
            Self::One
        }
    }

    pub(crate) fn strategy(self) -> MultiRowStrategy {
        match self {
            Self::One => MultiRowStrategy::Never,
            Self::Two => MultiRowStrategy::Always(2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PlaneRows;

    #[test]
    fn two_rows_over_a_long_inner_dimension_or_a_tall_output() {
        // A chunk's hidden-state gradient (over the vocabulary), split or not.
        assert_eq!(PlaneRows::for_product(1536, 37_952), PlaneRows::Two);
        assert_eq!(PlaneRows::for_product(2048, 128_256), PlaneRows::Two);
        // A weight-gradient chunk product: two rows on a 4096-wide head only.
        assert_eq!(PlaneRows::for_product(4096, 2048), PlaneRows::Two);
        assert_eq!(PlaneRows::for_product(2048, 1536), PlaneRows::One);
        assert_eq!(PlaneRows::for_product(768, 5120), PlaneRows::One);
    }
}
