"""Which platform a program is traced for: an explicit choice, or the devices the program will run on.

Backend-dependent choices (the MoE dispatch, Pallas kernels compiled or interpreted, the quantized recipe's
kernels or its reference) follow a `Platform`, never `jax.default_backend()` at trace time, so that a CPU host can
trace, lower and compile the exact GPU or TPU program (`jit(f).trace(...).lower(lowering_platforms=("cuda",))`, or
jax's CUDA plugin compiling for a GPU it does not have). `Platform.AUTO` resolves, while tracing, to the platform
of the devices the program will run on:
  1. the mesh the caller passes (a `Mesh`'s devices, an `AbstractMesh`'s `abstract_device`);
  2. else the mesh in context (`jax.set_mesh`, `jax.sharding.use_abstract_mesh`), which jax keys its trace cache on;
  3. else jax's default device (`jax_default_device`, else the first device): where a jit with no shardings runs.
An explicit CPU / GPU / TPU wins over all three. Models carry theirs in `ModelConfig.platform` (part of the
config, hence of every jit cache key that holds the config); kernels take `interpret` (True, False, or None for
"compiled on a GPU, interpreted on a CPU, refused on a TPU": the kernels lower through Triton only).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import jax

from pallas_kernels.formats import Impl


class Platform(enum.Enum):
  """The platform a program is for. AUTO: the devices it will run on (module docstring)."""

  AUTO = "auto"
  CPU = "cpu"
  GPU = "gpu"
  TPU = "tpu"


# Device.platform / AbstractDevice.platform / lowering-platform names -> Platform.
_BY_NAME = {"cpu": Platform.CPU, "gpu": Platform.GPU, "cuda": Platform.GPU, "rocm": Platform.GPU,
            "tpu": Platform.TPU}


def of_name(name: str) -> Platform:
  """Platform of a jax platform name ('cpu', 'gpu', 'cuda', 'rocm', 'tpu'), refused in one sentence otherwise."""
  try:
    return _BY_NAME[name.lower()]
  except KeyError:
    raise ValueError(f"unknown platform {name!r}; known: {', '.join(sorted(_BY_NAME))}.") from None


def of_devices(devices: Iterable[Any]) -> Platform:
  """The one platform of `devices` (jax Devices, compile-only ones included); mixed platforms are refused."""
  found = {of_name(d.platform) for d in devices}
  if len(found) != 1:
    raise ValueError(f"a program runs on one platform, got devices of {sorted(p.value for p in found) or 'none'}.")
  return found.pop()


def of_mesh(mesh: Any) -> Platform | None:
  """The platform of a `Mesh` or `AbstractMesh` (None for an abstract mesh that names no device)."""
  if mesh is None or mesh.empty:
    return None
  if isinstance(mesh, jax.sharding.AbstractMesh):  # its `devices` raises; `abstract_device` may be None
    return None if mesh.abstract_device is None else of_name(mesh.abstract_device.platform)
  return of_devices(mesh.devices.flat)


def _default_device_platform() -> Platform:
  device = jax.config.jax_default_device
  if device is None:
    return of_devices(jax.devices()[:1])
  if isinstance(device, str):  # jax accepts a platform name here
    return of_name(device)
  return of_devices([device])


def resolve(platform: Platform = Platform.AUTO, mesh: Any = None) -> Platform:
  """An explicit platform as given; AUTO -> the mesh's, else the context mesh's, else the default device's."""
  if not isinstance(platform, Platform):
    raise ValueError(f"unknown platform {platform!r}; pass a pallas_kernels.target.Platform.")
  if platform is not Platform.AUTO:
    return platform
  for candidate in (mesh, jax.sharding.get_abstract_mesh()):
    found = of_mesh(candidate)
    if found is not None:
      return found
  return _default_device_platform()


def resolve_interpret(interpret: bool | None, what: str) -> bool:
  """A Pallas kernel's `interpret` flag: as given, or for None compiled on a GPU and interpreted on a CPU; on a TPU
  the kernels (Triton only) are refused in one sentence naming the reference path."""
  if interpret is not None:
    return bool(interpret)
  platform = resolve()
  if platform is Platform.TPU:
    raise ValueError(f"{what}: the Pallas kernels compile for GPUs only (Triton); on a TPU pass "
                     "impl=Impl.REFERENCE (the bit-identical pure-jnp path the models use there) or interpret=True.")
  return platform is not Platform.GPU


def kernel_interpret(impl: Impl, interpret: bool | None, what: str) -> bool | None:
  """`resolve_interpret` for Impl.PALLAS; the REFERENCE implementation runs anywhere and keeps None."""
  return resolve_interpret(interpret, what) if impl is Impl.PALLAS else interpret
