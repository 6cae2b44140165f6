//! Convolution and pooling over `[N, C, H, W]` images.

use arenagrad_graph::{DType, Graph, Parameter, Tensor};

use crate::error::{config, input_shape, Result};
use crate::functional as F;
use crate::init::Init;
use crate::module::{Module, Visitor};
use crate::Rng;

/// Options of a [`Conv2d`] layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv2dConfig {
    /// Step between windows, `(h, w)` (default `(1, 1)`).
    pub stride: (usize, usize),
    /// Zeros added on each side, `(h, w)` (default `(0, 0)`).
    pub padding: (usize, usize),
    /// Spacing between kernel taps, `(h, w)` (default `(1, 1)`).
    pub dilation: (usize, usize),
    /// Channel groups: input and output channels are split into `groups` independent
    /// convolutions (default 1; `groups == in_channels` is a depthwise convolution).
    pub groups: usize,
    /// Whether to add a bias (default true).
    pub bias: bool,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
    /// How to fill the weight (default [`Init::FanInUniform`], PyTorch's).
    pub weight_init: Init,
    /// How to fill the bias, with the weight's fans (default [`Init::FanInUniform`]).
    pub bias_init: Init,
}

impl Default for Conv2dConfig {
    fn default() -> Self {
        Conv2dConfig {
            stride: (1, 1),
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
            bias: true,
            dtype: DType::F32,
            weight_init: Init::PYTORCH_DEFAULT,
            bias_init: Init::PYTORCH_DEFAULT,
        }
    }
}

impl Conv2dConfig {
    /// These options with this stride.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s);
        self
    }
    /// These options with this padding.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p);
        self
    }
    /// These options with this dilation.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d);
        self
    }
    /// These options with this many groups.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
    /// The options with this dtype.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }
    /// The options with or without a bias.
    pub fn bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }
}

/// A 2-D convolution (cross-correlation, as in PyTorch): `[N, C, H, W]` → `[N, O, Ho, Wo]` with
/// `Ho = ⌊(H + 2·ph − dh·(kh − 1) − 1) / sh⌋ + 1` (likewise `Wo`). `weight` is
/// `[O, C/groups, kh, kw]`, `bias` `[O]`.
///
/// ```
/// use arenagrad_nn::{Conv2d, Conv2dConfig, DType, Graph, Module, Rng};
/// let mut rng = Rng::seed(0);
/// let conv = Conv2d::with_config(1, 8, (3, 3), Conv2dConfig::default().padding(1), &mut rng)?;
/// let g = Graph::new();
/// let y = conv.forward(&g, g.randn(&[2, 1, 28, 28], DType::F32)?)?;
/// assert_eq!(y.shape().as_slice(), &[2, 8, 28, 28]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct Conv2d {
    weight: Parameter,
    bias: Option<Parameter>,
    stride: (usize, usize),
    padding: (usize, usize),
    dilation: (usize, usize),
    groups: usize,
}

fn positive(component: &'static str, what: &str, v: (usize, usize)) -> Result<()> {
    if v.0 == 0 || v.1 == 0 {
        return Err(config(
            component,
            format!("{what} must be positive, got {v:?}"),
        ));
    }
    Ok(())
}

impl Conv2d {
    /// An f32 convolution with a bias, stride 1, no padding, initialised as PyTorch does.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: (usize, usize),
        rng: &mut Rng,
    ) -> Result<Self> {
        Self::with_config(
            in_channels,
            out_channels,
            kernel,
            Conv2dConfig::default(),
            rng,
        )
    }

    /// A convolution with the given options.
    pub fn with_config(
        in_channels: usize,
        out_channels: usize,
        kernel: (usize, usize),
        cfg: Conv2dConfig,
        rng: &mut Rng,
    ) -> Result<Self> {
        let c = "Conv2d";
        positive(c, "kernel", kernel)?;
        positive(c, "stride", cfg.stride)?;
        positive(c, "dilation", cfg.dilation)?;
        if in_channels == 0 || out_channels == 0 {
            return Err(config(c, "channels must be positive"));
        }
        if cfg.groups == 0
            || !in_channels.is_multiple_of(cfg.groups)
            || !out_channels.is_multiple_of(cfg.groups)
        {
            return Err(config(
                c,
                format!(
                    "groups {} must divide in_channels {in_channels} and out_channels {out_channels}",
                    cfg.groups
                ),
            ));
        }
        let shape = [out_channels, in_channels / cfg.groups, kernel.0, kernel.1];
        let (weight, bias) = crate::init::weight_and_bias(
            &shape,
            (cfg.weight_init, cfg.bias_init),
            cfg.bias,
            cfg.dtype,
            rng,
        )?;
        Ok(Conv2d {
            weight,
            bias,
            stride: cfg.stride,
            padding: cfg.padding,
            dilation: cfg.dilation,
            groups: cfg.groups,
        })
    }

    /// A convolution over existing parameters: `weight` `[O, C/groups, kh, kw]`, `bias` `[O]`.
    /// Only the geometry fields of `cfg` are used.
    pub fn from_parameters(
        weight: Parameter,
        bias: Option<Parameter>,
        cfg: Conv2dConfig,
    ) -> Result<Self> {
        let c = "Conv2d";
        let ws = weight.shape();
        if ws.len() != 4 || ws.contains(&0) {
            return Err(config(
                c,
                format!("weight shape {ws:?} is not [O, C/groups, kh, kw]"),
            ));
        }
        positive(c, "stride", cfg.stride)?;
        positive(c, "dilation", cfg.dilation)?;
        if cfg.groups == 0 || !ws[0].is_multiple_of(cfg.groups) {
            return Err(config(
                c,
                format!("groups {} must divide out_channels {}", cfg.groups, ws[0]),
            ));
        }
        if let Some(b) = &bias {
            if b.shape() != [ws[0]] || b.dtype() != weight.dtype() {
                return Err(config(
                    c,
                    format!("bias {:?} does not fit weight {ws:?}", b.shape()),
                ));
            }
        }
        Ok(Conv2d {
            weight,
            bias,
            stride: cfg.stride,
            padding: cfg.padding,
            dilation: cfg.dilation,
            groups: cfg.groups,
        })
    }

    /// The weight, `[O, C/groups, kh, kw]`.
    pub fn weight(&self) -> &Parameter {
        &self.weight
    }

    /// The bias, `[O]`, if any.
    pub fn bias(&self) -> Option<&Parameter> {
        self.bias.as_ref()
    }
}

impl Module for Conv2d {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let b = match &self.bias {
            Some(b) => Some(g.param(b)?),
            None => None,
        };
        F::conv2d(
            x,
            g.param(&self.weight)?,
            b,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }
}

fn pool_check(
    op: &'static str,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<()> {
    positive(op, "kernel", kernel)?;
    positive(op, "stride", stride)?;
    if padding.0 > kernel.0 / 2 || padding.1 > kernel.1 / 2 {
        return Err(config(
            op,
            format!("padding {padding:?} must be at most half the kernel {kernel:?}"),
        ));
    }
    Ok(())
}

fn image_input(op: &'static str, x: &Tensor<'_>) -> Result<()> {
    let s = x.try_shape()?;
    if s.len() != 4 {
        return Err(input_shape(op, "[N, C, H, W]", &s));
    }
    Ok(())
}

/// The two pooling layers differ only in the graph op they call; one definition serves both.
macro_rules! pool_layer {
    ($(#[$doc:meta])* $name:ident, |$x:ident, $p:ident| $apply:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            kernel: (usize, usize),
            stride: (usize, usize),
            padding: (usize, usize),
        }

        impl $name {
            /// Pooling with stride equal to the kernel and no padding.
            pub fn new(kernel: (usize, usize)) -> Result<Self> {
                Self::with_options(kernel, kernel, (0, 0))
            }

            /// Pooling with explicit stride and padding (padding at most half the kernel).
            pub fn with_options(
                kernel: (usize, usize),
                stride: (usize, usize),
                padding: (usize, usize),
            ) -> Result<Self> {
                pool_check(stringify!($name), kernel, stride, padding)?;
                Ok($name { kernel, stride, padding })
            }
        }

        impl Module for $name {
            fn forward<'g>(&self, _g: &'g Graph, $x: Tensor<'g>) -> Result<Tensor<'g>> {
                image_input(stringify!($name), &$x)?;
                let $p = self;
                $apply
            }
        }
    };
}

pool_layer!(
/// Max pooling over `kernel` windows of an `[N, C, H, W]` input, padding counting as `−∞`.
/// Outputs are input elements exactly; on ties the first element of the window takes the
/// gradient, as in PyTorch.
///
/// ```
/// use arenagrad_nn::{DType, Graph, MaxPool2d, Module};
/// let pool = MaxPool2d::new((2, 2))?; // stride defaults to the kernel
/// let g = Graph::new();
/// let x = g.from_f64(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2], DType::F64)?;
/// assert_eq!(pool.forward(&g, x)?.to_vec::<f64>()?, vec![4.0]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
    MaxPool2d,
    |x, p| F::max_pool2d(x, p.kernel, p.stride, p.padding)
);

pool_layer!(
/// Average pooling over `kernel` windows of an `[N, C, H, W]` input; padding zeros count toward
/// the average (PyTorch's `count_include_pad = true`).
///
/// ```
/// use arenagrad_nn::{AvgPool2d, DType, Graph, Module};
/// let pool = AvgPool2d::new((2, 2))?;
/// let g = Graph::new();
/// let x = g.from_f64(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2], DType::F64)?;
/// assert_eq!(pool.forward(&g, x)?.to_vec::<f64>()?, vec![2.5]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
    AvgPool2d,
    |x, p| Ok(x.avg_pool2d(p.kernel, p.stride, p.padding)?)
);
