//! Typed views of one backend's tensor primitives, for the code that composes Burn's own
//! ops below the dispatch layer: the portable path, the default bodies of the extension
//! traits and the autodiff steps. Burn 0.22's `Tensor<D>` routes through the backends it
//! was built with and cannot hold a generic `B`'s primitive, so these mirror the part of
//! its API the crate uses, each method one call of the backend's op.

use burn::backend::TensorMetadata;
use burn::backend::{
    Backend, DeviceSettings, get_device_settings,
    tensor::{BoolTensor, FloatTensor, IntTensor},
};
use burn::tensor::{BoolDType, DType, FloatDType, IntDType, Scalar, Shape, Slice, TensorData};

/// A float primitive of `B` seen as a rank-`D` tensor.
#[derive(Debug, Clone)]
pub(crate) struct FloatOf<B: Backend, const D: usize>(pub FloatTensor<B>);

/// An int primitive of `B` seen as a rank-`D` tensor.
#[derive(Debug, Clone)]
pub(crate) struct IntOf<B: Backend, const D: usize>(pub IntTensor<B>);

/// A bool primitive of `B` seen as a rank-`D` tensor.
#[derive(Debug, Clone)]
pub(crate) struct BoolOf<B: Backend, const D: usize>(pub BoolTensor<B>);

fn settings<B: Backend>(device: &B::Device) -> DeviceSettings {
    get_device_settings::<B>(device)
}

fn float_dtype(dtype: DType) -> FloatDType {
    FloatDType::from(dtype)
}

fn int_dtype(dtype: DType) -> IntDType {
    IntDType::from(dtype)
}

fn slices<const D: usize>(ranges: [core::ops::Range<usize>; D]) -> [Slice; D] {
    ranges.map(Slice::from)
}

impl<B: Backend, const D: usize> FloatOf<B, D> {
    pub fn new(primitive: FloatTensor<B>) -> Self {
        Self(primitive)
    }
    pub fn into_primitive(self) -> FloatTensor<B> {
        self.0
    }
    pub fn dims(&self) -> [usize; D] {
        self.0.shape().dims::<D>()
    }
    pub fn shape(&self) -> Shape {
        self.0.shape()
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype()
    }
    pub fn device(&self) -> B::Device {
        self.0.device()
    }
    fn bool_dtype(&self) -> BoolDType {
        settings::<B>(&self.device()).bool_dtype
    }

    pub fn zeros(shape: impl Into<Shape>, device: &B::Device, dtype: DType) -> Self {
        Self(B::float_zeros(shape.into(), device, float_dtype(dtype)))
    }
    pub fn ones(shape: impl Into<Shape>, device: &B::Device, dtype: DType) -> Self {
        Self(B::float_ones(shape.into(), device, float_dtype(dtype)))
    }
    pub fn full(shape: impl Into<Shape>, value: f64, device: &B::Device, dtype: DType) -> Self {
        Self(B::float_full(
            shape.into(),
            Scalar::from(value),
            device,
            float_dtype(dtype),
        ))
    }
    pub fn empty(shape: impl Into<Shape>, device: &B::Device, dtype: DType) -> Self {
        Self(B::float_empty(shape.into(), device, float_dtype(dtype)))
    }
    /// Host values on the device, in their own dtype.
    pub fn from_data(data: TensorData, device: &B::Device) -> Self {
        Self(B::float_from_data(data, device))
    }

    pub fn reshape<const D2: usize>(self, shape: [usize; D2]) -> FloatOf<B, D2> {
        FloatOf(B::float_reshape(self.0, Shape::new(shape)))
    }
    pub fn reshape_to<const D2: usize>(self, shape: Shape) -> FloatOf<B, D2> {
        FloatOf(B::float_reshape(self.0, shape))
    }
    pub fn cast(self, dtype: DType) -> Self {
        if self.dtype() == dtype {
            return self;
        }
        Self(B::float_cast(self.0, float_dtype(dtype)))
    }
    pub fn slice(self, ranges: [core::ops::Range<usize>; D]) -> Self {
        Self(B::float_slice(self.0, &slices(ranges)))
    }
    pub fn slice_assign(self, ranges: [core::ops::Range<usize>; D], value: Self) -> Self {
        Self(B::float_slice_assign(self.0, &slices(ranges), value.0))
    }
    /// `length` entries of dimension `dim` from `start`.
    pub fn narrow(self, dim: usize, start: usize, length: usize) -> Self {
        let shape = self.shape();
        let ranges: [core::ops::Range<usize>; D] = core::array::from_fn(|d| {
            if d == dim {
                start..start + length
            } else {
                0..shape[d]
            }
        });
        self.slice(ranges)
    }
    pub fn cat(tensors: Vec<Self>, dim: usize) -> Self {
        Self(B::float_cat(
            tensors.into_iter().map(|t| t.0).collect(),
            dim,
        ))
    }
    pub fn transpose(self) -> Self {
        Self(B::float_transpose(self.0))
    }
    pub fn expand(self, shape: [usize; D]) -> Self {
        Self(B::float_expand(self.0, Shape::new(shape)))
    }

    pub fn add(self, other: Self) -> Self {
        Self(B::float_add(self.0, other.0))
    }
    pub fn sub(self, other: Self) -> Self {
        Self(B::float_sub(self.0, other.0))
    }
    pub fn mul(self, other: Self) -> Self {
        Self(B::float_mul(self.0, other.0))
    }
    pub fn div(self, other: Self) -> Self {
        Self(B::float_div(self.0, other.0))
    }
    pub fn add_scalar(self, value: f64) -> Self {
        Self(B::float_add_scalar(self.0, Scalar::from(value)))
    }
    pub fn sub_scalar(self, value: f64) -> Self {
        Self(B::float_sub_scalar(self.0, Scalar::from(value)))
    }
    pub fn mul_scalar(self, value: f64) -> Self {
        Self(B::float_mul_scalar(self.0, Scalar::from(value)))
    }
    pub fn div_scalar(self, value: f64) -> Self {
        Self(B::float_div_scalar(self.0, Scalar::from(value)))
    }
    pub fn neg(self) -> Self {
        Self(B::float_neg(self.0))
    }
    pub fn exp(self) -> Self {
        Self(B::float_exp(self.0))
    }
    pub fn log(self) -> Self {
        Self(B::float_log(self.0))
    }
    pub fn tanh(self) -> Self {
        Self(B::float_tanh(self.0))
    }
    pub fn powi_scalar(self, power: i32) -> Self {
        Self(B::float_powi_scalar(self.0, Scalar::from(power)))
    }
    pub fn clamp_min(self, min: f64) -> Self {
        Self(B::float_clamp_min(self.0, Scalar::from(min)))
    }
    pub fn matmul(self, other: Self) -> Self {
        Self(B::float_matmul(self.0, other.0))
    }

    pub fn sum(self) -> FloatOf<B, 1> {
        FloatOf(B::float_reshape(B::float_sum(self.0), Shape::new([1])))
    }
    pub fn sum_dim(self, dim: usize) -> Self {
        Self(B::float_sum_dim(self.0, dim))
    }
    pub fn max_dim(self, dim: usize) -> Self {
        Self(B::float_max_dim(self.0, dim))
    }
    pub fn argmax(self, dim: usize, dtype: DType) -> IntOf<B, D> {
        IntOf(B::float_argmax(self.0, dim, int_dtype(dtype)))
    }
    pub fn gather(self, dim: usize, indices: IntOf<B, D>) -> Self {
        Self(B::float_gather(dim, self.0, indices.0))
    }
    pub fn select(self, dim: usize, indices: IntOf<B, 1>) -> Self {
        Self(B::float_select(self.0, dim, indices.0))
    }

    pub fn mask_where(self, mask: BoolOf<B, D>, value: Self) -> Self {
        Self(B::float_mask_where(self.0, mask.0, value.0))
    }
    pub fn mask_fill(self, mask: BoolOf<B, D>, value: f64) -> Self {
        Self(B::float_mask_fill(self.0, mask.0, Scalar::from(value)))
    }
    pub fn equal(self, other: Self) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::float_equal(self.0, other.0, dtype))
    }
    pub fn equal_elem(self, value: f64) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::float_equal_elem(self.0, Scalar::from(value), dtype))
    }
    pub fn not_equal_elem(self, value: f64) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::float_not_equal_elem(self.0, Scalar::from(value), dtype))
    }
    pub fn greater_elem(self, value: f64) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::float_greater_elem(self.0, Scalar::from(value), dtype))
    }
    // Consumes `self`, as Burn's `Tensor::is_nan` does.
    #[allow(clippy::wrong_self_convention)]
    pub fn is_nan(self) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::float_is_nan(self.0, dtype))
    }
    /// Neither NaN nor infinite.
    #[allow(clippy::wrong_self_convention)]
    pub fn is_finite(self) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        let nan = B::float_is_nan(self.0.clone(), dtype);
        let inf = B::float_is_inf(self.0, dtype);
        BoolOf(B::bool_not(B::bool_or(nan, inf)))
    }
}

impl<B: Backend, const D: usize> IntOf<B, D> {
    pub fn new(primitive: IntTensor<B>) -> Self {
        Self(primitive)
    }
    pub fn into_primitive(self) -> IntTensor<B> {
        self.0
    }
    pub fn dims(&self) -> [usize; D] {
        self.0.shape().dims::<D>()
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype()
    }
    pub fn device(&self) -> B::Device {
        self.0.device()
    }
    fn bool_dtype(&self) -> BoolDType {
        settings::<B>(&self.device()).bool_dtype
    }

    pub fn full(shape: impl Into<Shape>, value: i64, device: &B::Device, dtype: DType) -> Self {
        Self(B::int_full(
            shape.into(),
            Scalar::from(value),
            device,
            int_dtype(dtype),
        ))
    }
    pub fn zeros(shape: impl Into<Shape>, device: &B::Device, dtype: DType) -> Self {
        Self(B::int_zeros(shape.into(), device, int_dtype(dtype)))
    }
    pub fn empty(shape: impl Into<Shape>, device: &B::Device, dtype: DType) -> Self {
        Self(B::int_empty(shape.into(), device, int_dtype(dtype)))
    }
    pub fn reshape<const D2: usize>(self, shape: [usize; D2]) -> IntOf<B, D2> {
        IntOf(B::int_reshape(self.0, Shape::new(shape)))
    }
    pub fn cast(self, dtype: DType) -> Self {
        if self.dtype() == dtype {
            return self;
        }
        Self(B::int_cast(self.0, int_dtype(dtype)))
    }
    pub fn float(self, dtype: DType) -> FloatOf<B, D> {
        FloatOf(B::int_into_float(self.0, float_dtype(dtype)))
    }
    pub fn slice(self, ranges: [core::ops::Range<usize>; D]) -> Self {
        Self(B::int_slice(self.0, &slices(ranges)))
    }
    pub fn cat(tensors: Vec<Self>, dim: usize) -> Self {
        Self(B::int_cat(tensors.into_iter().map(|t| t.0).collect(), dim))
    }
    pub fn gather(self, dim: usize, indices: Self) -> Self {
        Self(B::int_gather(dim, self.0, indices.0))
    }
    pub fn add_scalar(self, value: i64) -> Self {
        Self(B::int_add_scalar(self.0, Scalar::from(value)))
    }
    pub fn sub_scalar(self, value: i64) -> Self {
        Self(B::int_sub_scalar(self.0, Scalar::from(value)))
    }
    pub fn clamp(self, min: i64, max: i64) -> Self {
        Self(B::int_clamp(self.0, Scalar::from(min), Scalar::from(max)))
    }
    pub fn clamp_max(self, max: i64) -> Self {
        Self(B::int_clamp_max(self.0, Scalar::from(max)))
    }
    pub fn min(self) -> IntOf<B, 1> {
        IntOf(B::int_reshape(B::int_min(self.0), Shape::new([1])))
    }
    pub fn mask_where(self, mask: BoolOf<B, D>, value: Self) -> Self {
        Self(B::int_mask_where(self.0, mask.0, value.0))
    }
    pub fn mask_fill(self, mask: BoolOf<B, D>, value: impl Into<Scalar>) -> Self {
        Self(B::int_mask_fill(self.0, mask.0, value.into()))
    }
    pub fn expand(self, shape: [usize; D]) -> Self {
        Self(B::int_expand(self.0, Shape::new(shape)))
    }
    pub fn min_dim(self, dim: usize) -> Self {
        Self(B::int_min_dim(self.0, dim))
    }
    pub fn equal(self, other: Self) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::int_equal(self.0, other.0, dtype))
    }
    pub fn equal_elem(self, value: i64) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::int_equal_elem(self.0, Scalar::from(value), dtype))
    }
    pub fn not_equal_elem(self, value: i64) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::int_not_equal_elem(self.0, Scalar::from(value), dtype))
    }
    pub fn lower_elem(self, value: i64) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::int_lower_elem(self.0, Scalar::from(value), dtype))
    }
    pub fn greater_equal_elem(self, value: i64) -> BoolOf<B, D> {
        let dtype = self.bool_dtype();
        BoolOf(B::int_greater_equal_elem(
            self.0,
            Scalar::from(value),
            dtype,
        ))
    }
}

impl<B: Backend> IntOf<B, 1> {
    pub fn arange(range: core::ops::Range<i64>, device: &B::Device, dtype: DType) -> Self {
        Self(B::int_arange(range, device, int_dtype(dtype)))
    }
}

impl<B: Backend> FloatOf<B, 1> {
    /// A per-row value of any shape and float dtype (weights, an incoming gradient) as the
    /// ops compute with it: f32 `[n]`, its elements in order.
    pub fn flat_f32(primitive: FloatTensor<B>) -> Self {
        let len = primitive.shape().num_elements();
        Self(B::float_reshape(primitive, Shape::new([len]))).cast(DType::F32)
    }
}

impl<B: Backend, const D: usize> BoolOf<B, D> {
    pub fn not(self) -> Self {
        Self(B::bool_not(self.0))
    }
    pub fn and(self, other: Self) -> Self {
        Self(B::bool_and(self.0, other.0))
    }
    pub fn or(self, other: Self) -> Self {
        Self(B::bool_or(self.0, other.0))
    }
    pub fn expand(self, shape: [usize; D]) -> Self {
        Self(B::bool_expand(self.0, Shape::new(shape)))
    }
    pub fn float(self, dtype: DType) -> FloatOf<B, D> {
        FloatOf(B::bool_into_float(self.0, float_dtype(dtype)))
    }
}

impl<B: Backend, const D: usize> FloatOf<B, D> {
    pub fn int(self, dtype: DType) -> IntOf<B, D> {
        IntOf(B::float_into_int(self.0, int_dtype(dtype)))
    }
}

impl<B: Backend, const D: usize> IntOf<B, D> {
    pub fn div_scalar(self, value: i64) -> Self {
        Self(B::int_div_scalar(self.0, Scalar::from(value)))
    }
}
