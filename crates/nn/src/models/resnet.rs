//! ResNet-18 and ResNet-34 as torchvision defines them (`torchvision.models.resnet18`,
//! `resnet34`): a 7×7 stride-2 convolution, batch norm, ReLU and 3×3 stride-2 max pooling; four
//! stages of basic blocks (two 3×3 convolutions with batch norm, a 1×1 stride-2 projection on
//! the shortcut where the shape changes) of 64, 128, 256 and 512 channels; global average
//! pooling (`AdaptiveAvgPool2d((1, 1))`) and a linear classifier. Parameters and buffers carry
//! torchvision's names (`conv1.weight`, `layer2.0.downsample.1.running_var`, `fc.bias`, …), so
//! its `state_dict` saved as safetensors (`safetensors.torch.save_file(model.state_dict(),
//! path)`) loads as it is ([`ResNet::load_torchvision`]).
//!
//! ```
//! use arenagrad_nn::models::resnet::ResNet;
//! use arenagrad_nn::{Graph, Module, Rng, DType};
//! let mut model = ResNet::resnet18(10, &mut Rng::seed(0))?;
//! model.set_training(false);
//! let g = Graph::new();
//! let x = g.randn(&[1, 3, 32, 32], DType::F32)?;
//! assert_eq!(model.forward(&g, x)?.shape().as_slice(), &[1, 10]);
//! # Ok::<(), arenagrad_nn::NnError>(())
//! ```

use arenagrad_graph::{Graph, Tensor};

use crate::error::{config, input_shape, Result};
use crate::init::{FanMode, Init, Nonlinearity};
use crate::layers::conv::{Conv2d, Conv2dConfig};
use crate::layers::linear::Linear;
use crate::layers::norm::BatchNorm2d;
use crate::module::{Module, Visitor};
use crate::Rng;

/// A 3×3 (or 1×1) convolution without bias, initialised as torchvision does (Kaiming normal,
/// fan out, for ReLU).
fn conv(in_c: usize, out_c: usize, kernel: usize, stride: usize, rng: &mut Rng) -> Result<Conv2d> {
    let cfg = Conv2dConfig {
        stride: (stride, stride),
        padding: (kernel / 2, kernel / 2),
        bias: false,
        weight_init: Init::KaimingNormal {
            a: 0.0,
            mode: FanMode::FanOut,
            nonlinearity: Nonlinearity::ReLU,
        },
        ..Conv2dConfig::default()
    };
    Conv2d::with_config(in_c, out_c, (kernel, kernel), cfg, rng)
}

/// The shortcut's projection where a block changes shape: a 1×1 convolution and batch norm
/// (`downsample.0`, `downsample.1`).
#[derive(Debug)]
struct Downsample {
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl Module for Downsample {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        self.bn.forward(g, self.conv.forward(g, x)?)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("0", &self.conv);
        v.child("1", &self.bn);
    }

    fn set_training(&mut self, training: bool) {
        self.bn.set_training(training);
    }
}

/// `relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`.
#[derive(Debug)]
struct BasicBlock {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    downsample: Option<Downsample>,
}

impl BasicBlock {
    fn new(in_c: usize, out_c: usize, stride: usize, rng: &mut Rng) -> Result<Self> {
        Ok(BasicBlock {
            conv1: conv(in_c, out_c, 3, stride, rng)?,
            bn1: BatchNorm2d::new(out_c)?,
            conv2: conv(out_c, out_c, 3, 1, rng)?,
            bn2: BatchNorm2d::new(out_c)?,
            downsample: if stride != 1 || in_c != out_c {
                Some(Downsample {
                    conv: conv(in_c, out_c, 1, stride, rng)?,
                    bn: BatchNorm2d::new(out_c)?,
                })
            } else {
                None
            },
        })
    }
}

impl Module for BasicBlock {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let h = self.bn1.forward(g, self.conv1.forward(g, x)?)?.relu()?;
        let h = self.bn2.forward(g, self.conv2.forward(g, h)?)?;
        let shortcut = match &self.downsample {
            Some(d) => d.forward(g, x)?,
            None => x,
        };
        Ok(h.add(shortcut)?.relu()?)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("conv1", &self.conv1);
        v.child("bn1", &self.bn1);
        v.child("conv2", &self.conv2);
        v.child("bn2", &self.bn2);
        if let Some(d) = &self.downsample {
            v.child("downsample", d);
        }
    }

    fn set_training(&mut self, training: bool) {
        self.bn1.set_training(training);
        self.bn2.set_training(training);
        if let Some(d) = &mut self.downsample {
            d.set_training(training);
        }
    }
}

/// A stage (`layer1` … `layer4`): its blocks in order.
#[derive(Debug)]
struct Stage(Vec<BasicBlock>);

impl Module for Stage {
    fn forward<'g>(&self, g: &'g Graph, mut x: Tensor<'g>) -> Result<Tensor<'g>> {
        for b in &self.0 {
            x = b.forward(g, x)?;
        }
        Ok(x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        for (i, b) in self.0.iter().enumerate() {
            v.child(&i.to_string(), b);
        }
    }

    fn set_training(&mut self, training: bool) {
        for b in &mut self.0 {
            b.set_training(training);
        }
    }
}

/// A ResNet of basic blocks (see the module documentation). Made in training mode, as a
/// PyTorch module is; [`ResNet::from_torchvision`] returns it in evaluation mode.
#[derive(Debug)]
pub struct ResNet {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    layers: [Stage; 4],
    fc: Linear,
}

impl ResNet {
    /// ResNet-18 (two blocks per stage) with `num_classes` outputs (1000 for ImageNet),
    /// initialised as torchvision initialises it: convolutions Kaiming normal (fan out),
    /// batch norms 1 and 0, the classifier as `nn.Linear`.
    pub fn resnet18(num_classes: usize, rng: &mut Rng) -> Result<Self> {
        Self::with_blocks([2, 2, 2, 2], num_classes, rng)
    }

    /// ResNet-34 (3, 4, 6 and 3 blocks per stage).
    pub fn resnet34(num_classes: usize, rng: &mut Rng) -> Result<Self> {
        Self::with_blocks([3, 4, 6, 3], num_classes, rng)
    }

    /// A ResNet of basic blocks with `blocks[i]` blocks in stage `i`.
    pub fn with_blocks(blocks: [usize; 4], num_classes: usize, rng: &mut Rng) -> Result<Self> {
        if num_classes == 0 || blocks.contains(&0) {
            return Err(config(
                "ResNet",
                format!("every stage needs a block and there must be a class: {blocks:?}, {num_classes}"),
            ));
        }
        let conv1 = conv(3, 64, 7, 2, rng)?;
        let mut in_c = 64;
        let mut stage = |i: usize, rng: &mut Rng| -> Result<Stage> {
            let out_c = 64 << i;
            let mut v = Vec::with_capacity(blocks[i]);
            for b in 0..blocks[i] {
                let stride = if b == 0 && i > 0 { 2 } else { 1 };
                v.push(BasicBlock::new(in_c, out_c, stride, rng)?);
                in_c = out_c;
            }
            Ok(Stage(v))
        };
        let layers = [
            stage(0, rng)?,
            stage(1, rng)?,
            stage(2, rng)?,
            stage(3, rng)?,
        ];
        Ok(ResNet {
            conv1,
            bn1: BatchNorm2d::new(64)?,
            layers,
            fc: Linear::new(512, num_classes, rng)?,
        })
    }

    /// ResNet-18 from a torchvision `state_dict` saved as safetensors, in evaluation mode: its
    /// classes counted from `fc.weight`, the weights loaded by their names
    /// ([`ResNet::load_torchvision`]).
    #[cfg(feature = "checkpoint")]
    pub fn from_torchvision(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let path = path.as_ref();
        let tensors = Self::torchvision_names().read(path)?;
        let classes = tensors
            .iter()
            .find(|(n, _)| n == "fc.weight")
            .map(|(_, t)| t.shape()[0])
            .ok_or_else(|| config("ResNet", format!("{} has no fc.weight", path.display())))?;
        let mut model = Self::resnet18(classes, &mut Rng::seed(0))?;
        crate::checkpoint::load_state_dict(&model, tensors, true, path)?;
        model.set_training(false);
        Ok(model)
    }

    /// Loads a torchvision `state_dict` saved as safetensors (a file, a shard index or a
    /// directory) into this model, strictly: every parameter and running statistic by
    /// torchvision's name (the `num_batches_tracked` counters, which only matter for a
    /// momentum of `None`, left out). Any missing, unexpected or mis-shaped name is an error
    /// listing them all, and nothing is loaded then.
    #[cfg(feature = "checkpoint")]
    pub fn load_torchvision(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let tensors = Self::torchvision_names().read(path)?;
        crate::checkpoint::load_state_dict(self, tensors, true, path).map(|_| ())
    }

    #[cfg(feature = "checkpoint")]
    fn torchvision_names() -> crate::checkpoint::KeyMap {
        crate::checkpoint::KeyMap::new().drop("*num_batches_tracked")
    }
}

impl Module for ResNet {
    /// `x`: images `[batch, 3, height, width]`; the class scores `[batch, classes]`.
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let s = x.try_shape()?;
        if s.len() != 4 || s[1] != 3 {
            return Err(input_shape(
                "ResNet",
                "images [batch, 3, height, width]",
                &s,
            ));
        }
        let x = self.bn1.forward(g, self.conv1.forward(g, x)?)?.relu()?;
        let mut x = x.max_pool2d((3, 3), (2, 2), (1, 1))?;
        for l in &self.layers {
            x = l.forward(g, x)?;
        }
        // Global average pooling: AdaptiveAvgPool2d((1, 1)) and flatten.
        let x = x.mean_axes(&[2, 3], false)?;
        self.fc.forward(g, x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("conv1", &self.conv1);
        v.child("bn1", &self.bn1);
        for (i, l) in self.layers.iter().enumerate() {
            v.child(&format!("layer{}", i + 1), l);
        }
        v.child("fc", &self.fc);
    }

    fn set_training(&mut self, training: bool) {
        self.bn1.set_training(training);
        for l in &mut self.layers {
            l.set_training(training);
        }
    }
}
