//! What a loss remembers of its incoming gradient between calls. The one pass forms the
//! gradient in forward for a guess of the incoming gradient; backward rescales it only
//! when the real one differs, and remembers the real one for the next call.

use std::any::Any;
use std::sync::{Arc, Mutex};

use burn::backend::{Backend, tensor::FloatTensor};
use burn::tensor::DType;

use crate::primitive::FloatOf;

/// The last incoming gradient a loss saw, per backend and device, kept on the device (f32
/// `[1]`): never read by the host. Clones share it. A loss module holds one for all its
/// calls; each call of the functions makes a new one, so they guess 1.
#[derive(Clone, Default)]
pub struct IncomingGuess {
    remembered: Arc<Mutex<Vec<Box<dyn Any + Send>>>>,
}

/// One backend's and device's guess.
struct Remembered<B: Backend> {
    device: B::Device,
    guess: FloatTensor<B>,
}

impl IncomingGuess {
    /// A guess of 1 on every device until backward remembers another.
    pub fn new() -> Self {
        Self::default()
    }

    /// The guess on `device`: the last incoming gradient remembered there, else 1.
    pub(crate) fn guess<B: Backend>(&self, device: &B::Device) -> FloatTensor<B> {
        let remembered = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        remembered
            .iter()
            .filter_map(|entry| entry.downcast_ref::<Remembered<B>>())
            .find(|entry| entry.device == *device)
            .map(|entry| entry.guess.clone())
            .unwrap_or_else(|| FloatOf::<B, 1>::ones([1], device, DType::F32).into_primitive())
    }

    /// Remembers `next` (f32 `[1]`, see [`next_guess`]) as the guess for the next call on
    /// `device`.
    pub(crate) fn remember<B: Backend>(&self, device: &B::Device, next: FloatTensor<B>) {
        let mut remembered = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        let existing = remembered
            .iter_mut()
            .filter_map(|entry| entry.downcast_mut::<Remembered<B>>())
            .find(|entry| entry.device == *device);
        match existing {
            Some(entry) => entry.guess = next,
            None => remembered.push(Box::new(Remembered::<B> {
                device: device.clone(),
                guess: next,
            })),
        }
    }
}

/// The guess for the next call after one whose real incoming gradient was `incoming`
/// (`[1]`, any float dtype) and whose guess was `current` (f32 `[1]`): `incoming` when it
/// is finite and not 0 (a gradient formed for 0 or NaN could not be rescaled), else
/// `current`. On the device, with tensor ops (cube backends do it inside the rescale).
pub(crate) fn next_guess<B: Backend>(
    incoming: FloatTensor<B>,
    current: FloatTensor<B>,
) -> FloatTensor<B> {
    let incoming = FloatOf::<B, 1>::new(incoming).cast(DType::F32).reshape([1]);
    let usable = incoming
        .clone()
        .is_finite()
        .and(incoming.clone().not_equal_elem(0.0));
    FloatOf::<B, 1>::new(current)
        .mask_where(usable, incoming)
        .into_primitive()
}

impl core::fmt::Debug for IncomingGuess {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("IncomingGuess")
    }
}
