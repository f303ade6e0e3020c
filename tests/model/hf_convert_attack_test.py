"""Attacks on the HF checkpoint loaders, written the way a hostile or broken checkpoint release would be.

A checkpoint directory is untrusted input: safetensors headers, the shard index, config.json and its
quantization_config. Every attack goes through the real code path (`SafetensorsReader`, `HfWeights`,
`quantization_from_hf_config`, `convert_hf_checkpoint`) and must end in one sentence naming the file and the field
(`CheckpointFormatError`), in time proportional to the file, never a hang. Headers are compared with the
`safetensors` package, the reference implementation: whatever it refuses is refused here, whatever it accepts is
read here to the same values. The attacks that used to hang (a FIFO where a file should be) or cost in proportion to
a declared size (10^9 layers over a two-layer file) run in a child process under a memory limit and a timeout.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import ml_dtypes
import numpy as np
import safetensors
from safetensors import safe_open

from c2jax.model import hf_convert
from c2jax.model import presets
from c2jax.model import safetensors_io
from c2jax.model.checkpoint_files import CheckpointFormatError

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CFG = presets.model_config("tiny", {"n_layers": 2, "num_mtp_layers": 0})  # 1 dense + 1 MoE layer, 16 experts
_DTYPE_NAMES = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i4"): "I32", np.dtype("<u4"): "U32",
                np.dtype("<i2"): "I16", np.dtype("<u2"): "U16", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3"}


def _raw(header, data: bytes = b"", n: int | None = None) -> bytes:
  """A safetensors file: 8-byte header length (`n`, or the header's own), header (a JSON value or raw bytes), data."""
  h = header if isinstance(header, bytes) else json.dumps(header).encode()
  return struct.pack("<Q", len(h) if n is None else n) + h + data


def _save(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
  """A well-formed safetensors file of numpy arrays (any dtype of `_DTYPE_NAMES`), in the reference's layout."""
  header, data = {}, b""
  for name, a in tensors.items():
    raw = np.ascontiguousarray(a).tobytes()
    header[name] = {"dtype": _DTYPE_NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [len(data),
                                                                                             len(data) + len(raw)]}
    data += raw
  if metadata:
    header["__metadata__"] = metadata
  with open(path, "wb") as f:
    f.write(_raw(header, data))


def _reference_accepts(path: str) -> bool:
  """Whether the safetensors package opens the file (it validates the whole header when it opens)."""
  try:
    with safe_open(path, framework="np") as f:
      f.keys()
    return True
  except safetensors.SafetensorError:
    return False


def _refusal(fn) -> BaseException | None:
  try:
    fn()
  except Exception as e:  # noqa: BLE001 - the test decides what kind of refusal is right
    return e
  return None


def _tiny_release(directory: str, cfg=_CFG, dtypes: dict[str, np.dtype] | None = None) -> dict[str, np.ndarray]:
  """A float32 DeepSeek-V3 checkpoint of `cfg` (every tensor of its conversion plan) and its config.json."""
  os.makedirs(directory, exist_ok=True)
  shapes = hf_convert._leaf_shapes(cfg)
  rng = np.random.default_rng(0)
  tensors = {}
  for name, t in hf_convert.conversion_plan(cfg).items():
    shape = hf_convert._expected_hf_shape(shapes[t.path][len(t.index):], t.n_in)
    tensors[name] = rng.standard_normal(shape).astype((dtypes or {}).get(name, np.float32))
  _save(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(cfg.to_hf_dict(), f)
  return tensors


def _edit_config(directory: str, **changes) -> None:
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    config = json.load(f)
  config.update(changes)
  with open(path, "w") as f:
    json.dump(config, f)


def _in_child(code: str, timeout_s: float = 60, memory_bytes: int = 3 << 30) -> dict:
  """Runs `code` in a child process under an address-space limit (`resource.setrlimit`, set first thing in the
  child) and a timeout; returns {"result": None} when it ends, {"error": type name, "message": ...} when it raises,
  {"hung": True} on timeout."""
  driver = textwrap.dedent("""
      import json, resource
      resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
      try:
      {code}
          print(json.dumps({{"result": None}}))
      except BaseException as e:  # noqa: BLE001
          print(json.dumps({{"error": type(e).__name__, "message": str(e)}}))
      """).format(memory=memory_bytes, code=textwrap.indent(textwrap.dedent(code), "    "))
  env = {**os.environ, "PYTHONPATH": _ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
         "JAX_PLATFORMS": "cpu"}
  try:
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=timeout_s,
                          env=env, cwd=_ROOT)
  except subprocess.TimeoutExpired:
    return {"hung": True}
  lines = done.stdout.strip().splitlines()
  if not lines:
    return {"error": f"exit {done.returncode}", "message": done.stderr[-2000:]}
  return json.loads(lines[-1])


def _tmpdir(test: absltest.TestCase) -> str:
  d = tempfile.mkdtemp()
  test.addCleanup(lambda: subprocess.run(["rm", "-rf", d], check=False))
  return d


class _Case(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = _tmpdir(self)

  def assert_one_sentence(self, error: BaseException | None, *words: str):
    """`error` is a CheckpointFormatError of one sentence holding each of `words` (the file, the field)."""
    self.assertIsNotNone(error, "accepted")
    self.assertIsInstance(error, CheckpointFormatError, f"{type(error).__name__}: {error}")
    message = str(error)
    for w in words:
      self.assertIn(w, message)
    self.assertEqual(message.count(". "), 0, message)
    self.assertTrue(message.endswith("."), message)


def _e(**kw) -> dict:
  return {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **kw}


# (header, data) the reference refuses; each was read, mis-read or crashed on before.
_REFUSED = dict(
    list_header=([{"x": _e()}], b"\0" * 8),
    string_shape=({"x": _e(shape="2")}, b"\0" * 8),
    float_shape=({"x": _e(shape=[2.0])}, b"\0" * 8),
    fractional_shape=({"x": _e(shape=[2.5])}, b"\0" * 8),
    bool_shape=({"x": _e(shape=[True], data_offsets=[0, 4])}, b"\0" * 4),
    negative_shape=({"x": _e(shape=[-2, -1])}, b"\0" * 8),
    shape_beyond_u64_with_a_zero=({"x": _e(shape=[0, 2**70], data_offsets=[0, 0])}, b""),
    three_offsets=({"x": _e(data_offsets=[0, 8, 9])}, b"\0" * 8),
    string_offsets=({"x": _e(data_offsets=["0", "8"])}, b"\0" * 8),
    float_offsets=({"x": _e(data_offsets=[0.0, 8.0])}, b"\0" * 8),
    offsets_into_the_header=({"x": _e(data_offsets=[-8, 0])}, b""),
    overlapping_tensors=({"x": _e(), "y": _e()}, b"\0" * 8),
    gap_between_tensors=({"x": _e(), "y": _e(data_offsets=[12, 20])}, b"\0" * 20),
    trailing_bytes=({"x": _e()}, b"\0" * 12),
    metadata_int_value=({"x": _e(), "__metadata__": {"format": 1}}, b"\0" * 8),
    metadata_list=({"x": _e(), "__metadata__": ["pt"]}, b"\0" * 8),
    entry_not_an_object=({"x": "F32"}, b""),
    missing_data_offsets=({"x": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
    dtype_not_a_string=({"x": _e(dtype=["F32"])}, b"\0" * 8),
    nan_in_an_extra_field=(b'{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"q":NaN}}', b"\0" * 8),
    nan_shape=(b'{"x":{"dtype":"F32","shape":[NaN],"data_offsets":[0,8]}}', b"\0" * 8),
    invalid_utf8=(b'{"x\xff":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b"\0" * 8),
    deep_nesting=(b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b""),
    integer_of_5000_digits=(b'{"x":{"dtype":"F32","shape":[1' + b"0" * 5000 + b'],"data_offsets":[0,8]}}',
                            b"\0" * 8),
    reversed_offsets=({"x": _e(data_offsets=[8, 0])}, b"\0" * 8),
)
# (header, data) the reference accepts: read here too, to the same values.
_ACCEPTED = dict(
    plain=({"x": _e()}, np.arange(2, dtype="<f4").tobytes()),
    extra_field=({"x": _e(note="kept")}, b"\0" * 8),
    null_metadata=({"x": _e(), "__metadata__": None}, b"\0" * 8),
    no_tensors=({}, b""),
    zero_size_tensors=({"e": _e(shape=[0, 3], data_offsets=[0, 0]), "f": _e(shape=[0], data_offsets=[0, 0]),
                        "x": _e()}, b"\1" * 8),
    scalar=({"s": _e(shape=[], data_offsets=[0, 4])}, b"\0\0\x80\x3f"),
    keys_out_of_data_order=({"y": _e(data_offsets=[8, 16]), "x": _e()}, np.arange(4, dtype="<f4").tobytes()),
    padded_header=(b'{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}    ', b"\0" * 8),
)


class SafetensorsHeaderAttackTest(_Case):
  """Headers against the reference implementation: the same ones refused, the same values read from the rest."""

  @parameterized.named_parameters(*[(k, *v) for k, v in _REFUSED.items()])
  def test_refused_like_the_reference(self, header, data):
    path = os.path.join(self.tmp, "model.safetensors")
    with open(path, "wb") as f:
      f.write(_raw(header, data))
    self.assertFalse(_reference_accepts(path), "the variant must be one the reference refuses")
    self.assert_one_sentence(_refusal(lambda: safetensors_io.SafetensorsReader(path)), path)

  @parameterized.named_parameters(*[(k, *v) for k, v in _ACCEPTED.items()])
  def test_accepted_like_the_reference(self, header, data):
    path = os.path.join(self.tmp, "model.safetensors")
    with open(path, "wb") as f:
      f.write(_raw(header, data))
    self.assertTrue(_reference_accepts(path))
    reader = safetensors_io.SafetensorsReader(path)
    with safe_open(path, framework="np") as ref:
      self.assertCountEqual(reader.keys(), ref.keys())
      for name in ref.keys():
        np.testing.assert_array_equal(reader.get(name), ref.get_tensor(name), err_msg=name)

  @parameterized.named_parameters(
      ("beyond_the_file", 10_000, 100),
      ("beyond_the_format", 100_000_001, 100_000_100),  # a sparse file: nothing of it is read
      ("beyond_u63", 2**63 + 5, 100),
  )
  def test_header_length(self, n, size):
    path = os.path.join(self.tmp, "model.safetensors")
    with open(path, "wb") as f:
      f.write(struct.pack("<Q", n) + b"{}")
      f.truncate(size)
    self.assertFalse(_reference_accepts(path))
    self.assert_one_sentence(_refusal(lambda: safetensors_io.SafetensorsReader(path)), path, "header length")


class ShardIndexAttackTest(_Case):
  """The index names the shards: a name that leaves the directory, or a file that is not a regular one, is refused
  before anything is opened; a FIFO used to block the loader forever."""

  def _sharded(self, shard_name: str) -> str:
    """A checkpoint directory whose index maps its one tensor to `shard_name`; a valid shard sits outside it."""
    ckpt = os.path.join(self.tmp, "ckpt")
    os.makedirs(os.path.join(ckpt, "sub"))
    outside = os.path.join(self.tmp, "outside.safetensors")
    for path in (outside, os.path.join(ckpt, "sub", "x.safetensors")):
      _save(path, {"w": np.ones(3, np.float32)})
    with open(os.path.join(ckpt, safetensors_io.INDEX_FILE), "w") as f:
      json.dump({"metadata": {}, "weight_map": {"w": shard_name}}, f)
    return ckpt

  @parameterized.named_parameters(
      ("parent", "../outside.safetensors"),
      ("absolute", "/OUTSIDE"),
      ("subdirectory", "sub/x.safetensors"),
      ("empty", ""),
      ("dot", "."),
      ("dotdot", ".."),
      ("not_a_string", 7),
      ("a_list", ["model.safetensors"]),
  )
  def test_shard_name_must_be_a_plain_file_name(self, name):
    if name == "/OUTSIDE":
      name = os.path.join(self.tmp, "outside.safetensors")
    ckpt = self._sharded(name)
    self.assert_one_sentence(_refusal(lambda: safetensors_io.SafetensorsReader(ckpt)), safetensors_io.INDEX_FILE,
                             "weight_map")

  def test_symlink_out_of_the_directory(self):
    ckpt = self._sharded("model-00001.safetensors")
    os.symlink(os.path.join(self.tmp, "outside.safetensors"), os.path.join(ckpt, "model-00001.safetensors"))
    self.assert_one_sentence(_refusal(lambda: safetensors_io.SafetensorsReader(ckpt)), "model-00001.safetensors",
                             "outside the checkpoint directory")

  def test_symlinks_inside_and_the_hub_cache_layout_are_read(self):
    repo = os.path.join(self.tmp, "models--org--name")
    snapshot = os.path.join(repo, "snapshots", "abc123")
    os.makedirs(snapshot)
    os.makedirs(os.path.join(repo, "blobs"))
    _save(os.path.join(repo, "blobs", "f00d"), {"w": np.arange(3, dtype=np.float32)})
    os.symlink("../../blobs/f00d", os.path.join(snapshot, "model-00001.safetensors"))
    os.symlink("model-00001.safetensors", os.path.join(snapshot, "alias.safetensors"))
    with open(os.path.join(snapshot, safetensors_io.INDEX_FILE), "w") as f:
      json.dump({"weight_map": {"w": "model-00001.safetensors"}}, f)
    np.testing.assert_array_equal(safetensors_io.SafetensorsReader(snapshot).get("w"), [0, 1, 2])
    os.remove(os.path.join(snapshot, safetensors_io.INDEX_FILE))
    os.remove(os.path.join(snapshot, "model-00001.safetensors"))
    os.symlink("../../blobs/f00d", os.path.join(snapshot, "model.safetensors"))
    np.testing.assert_array_equal(safetensors_io.SafetensorsReader(snapshot).get("w"), [0, 1, 2])

  @parameterized.named_parameters(
      ("weight_map_a_list", {"weight_map": [["w", "x.safetensors"]]}),
      ("no_weight_map", {"metadata": {}}),
      ("index_a_list", [{"weight_map": {}}]),
      ("index_with_nan", "NaN"),
  )
  def test_malformed_index(self, index):
    ckpt = self._sharded("x.safetensors")
    with open(os.path.join(ckpt, safetensors_io.INDEX_FILE), "w") as f:
      f.write(index if isinstance(index, str) else json.dumps(index))
    self.assert_one_sentence(_refusal(lambda: safetensors_io.SafetensorsReader(ckpt)), safetensors_io.INDEX_FILE)

  @parameterized.named_parameters(
      ("fifo_shard", "model-00001.safetensors", True),
      ("fifo_index", safetensors_io.INDEX_FILE, False),
      ("fifo_single_file", "model.safetensors", False),
      ("symlink_to_a_fifo", "model-00001.safetensors", "link"),
  )
  def test_a_fifo_is_refused_not_waited_on(self, fifo_name, indexed):
    ckpt = os.path.join(self.tmp, "ckpt")
    os.makedirs(ckpt)
    if indexed:
      with open(os.path.join(ckpt, safetensors_io.INDEX_FILE), "w") as f:
        json.dump({"weight_map": {"w": "model-00001.safetensors"}}, f)
    if indexed == "link":
      os.mkfifo(os.path.join(ckpt, "pipe"))
      os.symlink("pipe", os.path.join(ckpt, fifo_name))
    else:
      os.mkfifo(os.path.join(ckpt, fifo_name))
    out = _in_child(f"""
        from c2jax.model import safetensors_io
        safetensors_io.SafetensorsReader({ckpt!r})
        """, timeout_s=30, memory_bytes=1 << 30)
    self.assertNotIn("hung", out, "the loader blocked on the FIFO")
    self.assertEqual(out.get("error"), "CheckpointFormatError", out)
    self.assertIn("not a regular file", out["message"])

  def test_a_fifo_config_json_is_refused_by_the_converter(self):
    ckpt = os.path.join(self.tmp, "ckpt")
    _tiny_release(ckpt)
    os.remove(os.path.join(ckpt, "config.json"))
    os.mkfifo(os.path.join(ckpt, "config.json"))
    out = _in_child(f"""
        from c2jax.model import hf_convert
        hf_convert.convert_hf_checkpoint({ckpt!r}, {os.path.join(self.tmp, "out")!r}, progress=False)
        """, timeout_s=60)
    self.assertNotIn("hung", out, "the converter blocked on the FIFO")
    self.assertEqual(out.get("error"), "CheckpointFormatError", out)
    self.assertIn("config.json", out["message"])


class DtypeAttackTest(_Case):
  """A float weight stored under an integer dtype (its bits, or rounded values) is refused, not converted."""

  @parameterized.named_parameters(
      ("float32_bits_as_i32", "model.layers.1.mlp.experts.3.up_proj.weight", np.float32, np.int32),
      ("float32_bits_as_u32", "model.norm.weight", np.float32, np.uint32),
      ("float16_bits_as_i16", "model.layers.0.self_attn.kv_b_proj.weight", np.float16, np.int16),
      ("float16_bits_as_u16", "lm_head.weight", np.float16, np.uint16),
      ("router_bias_as_i32", "model.layers.1.mlp.gate.e_score_correction_bias", np.float32, np.int32),
  )
  def test_float_weight_declared_integer(self, name, stored, declared):
    ckpt = os.path.join(self.tmp, "ckpt")
    tensors = _tiny_release(ckpt, dtypes={name: stored})
    tensors[name] = tensors[name].view(declared)  # the float's bit pattern under an integer dtype
    _save(os.path.join(ckpt, "model.safetensors"), tensors, {"format": "pt"})
    out = os.path.join(self.tmp, "out")
    self.assert_one_sentence(_refusal(lambda: hf_convert.convert_hf_checkpoint(ckpt, out, progress=False)), name,
                             np.dtype(declared).name)
    self.assertFalse(os.path.exists(out))

  def test_fp8_scale_declared_integer(self):
    ckpt = os.path.join(self.tmp, "ckpt")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors = _tiny_release(ckpt)
    tensors[name] = tensors[name].astype(ml_dtypes.float8_e4m3fn)
    shape = safetensors_io.expected_scale_shape(tensors[name].shape, (16, 16))
    tensors[name + "_scale_inv"] = np.ones(shape, np.float32).view(np.int32)
    _save(os.path.join(ckpt, "model.safetensors"), tensors, {"format": "pt"})
    _edit_config(ckpt, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16]})
    out = os.path.join(self.tmp, "out")
    self.assert_one_sentence(_refusal(lambda: hf_convert.convert_hf_checkpoint(ckpt, out, progress=False)),
                             name + "_scale_inv", "int32")
    self.assertFalse(os.path.exists(out))

  def test_float_release_converts(self):
    ckpt = os.path.join(self.tmp, "ckpt")
    _tiny_release(ckpt)
    summary = hf_convert.convert_hf_checkpoint(ckpt, os.path.join(self.tmp, "out"), progress=False)
    self.assertEqual(summary.num_tensors, len(hf_convert.conversion_plan(_CFG)))


_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
_INT4_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
                 "dynamic": False, "actorder": None}
_INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": _INT4_WEIGHTS, "input_activations": None}},
         "ignore": ["lm_head", "re:.*self_attn.*"]}


def _with(base: dict, path: tuple, value) -> dict:
  """A deep copy of `base` with the field at `path` set to `value`."""
  out = json.loads(json.dumps(base))
  target = out
  for key in path[:-1]:
    target = target[key]
  target[path[-1]] = value
  return out


class QuantizationConfigAttackTest(_Case):
  """Malformed quantization_config fields: one sentence naming the field, never a raw TypeError, a string read as
  its characters, a float truncated or a bool read as 1."""

  def test_release_configs_parse(self):
    parse = safetensors_io.quantization_from_hf_config
    self.assertEqual(parse({"quantization_config": _FP8}), safetensors_io.Fp8BlockQuant((128, 128)))
    self.assertEqual(parse({"text_config": {"quantization_config": _INT4}}).ignore, ("lm_head", "re:.*self_attn.*"))

  @parameterized.named_parameters(
      ("block_strings", ("weight_block_size",), ["a", "b"]),
      ("block_fraction", ("weight_block_size",), [128.7, 128]),
      ("block_float", ("weight_block_size",), [128.0, 128.0]),
      ("block_bool", ("weight_block_size",), [True, 128]),
      ("block_a_string", ("weight_block_size",), "ab"),
      ("block_an_object", ("weight_block_size",), {"a": 1, "b": 2}),
      ("block_an_int", ("weight_block_size",), 128),
      ("activation_scheme_a_list", ("activation_scheme",), ["dynamic"]),
  )
  def test_fp8(self, path, value):
    config = {"quantization_config": _with(_FP8, path, value)}
    self.assert_one_sentence(_refusal(lambda: safetensors_io.quantization_from_hf_config(config)), "config.json",
                             path[-1])

  @parameterized.named_parameters(
      ("targets_a_string", ("config_groups", "group_0", "targets"), "Linear", "targets"),
      ("ignore_a_string", ("ignore",), "lm_head", "ignore"),
      ("ignore_an_invalid_pattern", ("ignore",), ["re:(unclosed"], "ignore"),
      ("targets_not_strings", ("config_groups", "group_0", "targets"), [1, 2], "targets"),
      ("group_size_bool", ("config_groups", "group_0", "weights", "group_size"), True, "group_size"),
      ("num_bits_float", ("config_groups", "group_0", "weights", "num_bits"), 4.0, "num_bits"),
      ("symmetric_a_string", ("config_groups", "group_0", "weights", "symmetric"), "false", "symmetric"),
      ("actorder_true", ("config_groups", "group_0", "weights", "actorder"), True, "actorder"),
      ("weights_a_list", ("config_groups", "group_0", "weights"), [4], "weights"),
      ("group_a_string", ("config_groups", "group_0"), "W4A16", "group_0"),
      ("config_groups_a_list", ("config_groups",), [{"targets": ["Linear"]}], "config_groups"),
      ("sparsity_config_a_string", ("sparsity_config",), "dense", "sparsity_config"),
  )
  def test_int4(self, path, value, field):
    config = {"quantization_config": _with(_INT4, path, value)}
    self.assert_one_sentence(_refusal(lambda: safetensors_io.quantization_from_hf_config(config)), field)

  @parameterized.named_parameters(
      ("quantization_config_a_list", {"quantization_config": [_FP8]}, "quantization_config"),
      ("quantization_config_a_string", {"quantization_config": "fp8"}, "quantization_config"),
      ("text_config_a_list", {"text_config": [{"quantization_config": _FP8}]}, "text_config"),
      ("quant_method_a_list", {"quantization_config": _with(_FP8, ("quant_method",), ["fp8"])}, "quant_method"),
  )
  def test_config_structure(self, config, field):
    self.assert_one_sentence(_refusal(lambda: safetensors_io.quantization_from_hf_config(config)), "config.json",
                             field)


class ConfigAgainstFileAttackTest(_Case):
  """A config.json declaring far more than the file holds is refused in time proportional to the file: each runs in
  a child under a 3 GiB address-space limit and a 60 s timeout (before, the plan was built per declared layer and
  expert)."""

  @parameterized.named_parameters(
      ("a_billion_layers", {"num_hidden_layers": 10**9}, "num_hidden_layers"),
      ("a_hundred_million_experts", {"n_routed_experts": 10**8, "n_group": 1, "topk_group": 1},
       "n_routed_experts"),
      ("layers_and_experts", {"num_hidden_layers": 10**6, "n_routed_experts": 10**6, "n_group": 1, "topk_group": 1},
       "num_hidden_layers"),
  )
  def test_declared_sizes_beyond_the_file(self, changes, field):
    ckpt = os.path.join(self.tmp, "ckpt")
    _tiny_release(ckpt)
    _edit_config(ckpt, **changes)
    out = _in_child(f"""
        from c2jax.model import hf_convert
        hf_convert.convert_hf_checkpoint({ckpt!r}, {os.path.join(self.tmp, "out")!r}, progress=False)
        """, timeout_s=60)
    self.assertNotIn("hung", out, "the converter ran for a minute on a config it should refuse at once")
    self.assertEqual(out.get("error"), "CheckpointFormatError", out)
    self.assertIn(field, out["message"])
    self.assertIn("config.json", out["message"])

  @parameterized.named_parameters(
      ("layers_a_string", "num_hidden_layers", "2"),
      ("layers_a_float", "num_hidden_layers", 2.0),
      ("layers_negative", "num_hidden_layers", -1),
      ("experts_a_float", "n_routed_experts", 16.0),
      ("hidden_size_a_string", "hidden_size", "64"),
      ("kv_lora_rank_a_list", "kv_lora_rank", [32]),
      ("n_group_a_bool", "n_group", True),
      ("rms_norm_eps_a_string", "rms_norm_eps", "1e-6"),
      ("rope_theta_a_string", "rope_theta", "1e6"),
  )
  def test_count_fields(self, field, value):
    ckpt = os.path.join(self.tmp, "ckpt")
    _tiny_release(ckpt)
    _edit_config(ckpt, **{field: value})
    self.assert_one_sentence(_refusal(lambda: hf_convert.convert_hf_checkpoint(
        ckpt, os.path.join(self.tmp, "out"), progress=False)), "config.json", field)

  def test_missing_size_field(self):
    ckpt = os.path.join(self.tmp, "ckpt")
    _tiny_release(ckpt)
    with open(os.path.join(ckpt, "config.json")) as f:
      config = json.load(f)
    del config["qk_rope_head_dim"]
    with open(os.path.join(ckpt, "config.json"), "w") as f:
      json.dump(config, f)
    self.assert_one_sentence(_refusal(lambda: hf_convert.convert_hf_checkpoint(
        ckpt, os.path.join(self.tmp, "out"), progress=False)), "config.json", "qk_rope_head_dim")

  def test_layer_index_spelled_oddly_is_unexpected(self):
    # An index of thousands of digits used to reach int() (a raw ValueError); a non-ASCII digit is no layer either.
    ckpt = os.path.join(self.tmp, "ckpt")
    tensors = _tiny_release(ckpt)
    tensors["model.layers." + "9" * 5000 + ".x.weight"] = np.ones(2, np.float32)
    tensors["model.layers.\u0661.x.weight"] = np.ones(2, np.float32)
    _save(os.path.join(ckpt, "model.safetensors"), tensors)
    error = _refusal(lambda: hf_convert.convert_hf_checkpoint(ckpt, os.path.join(self.tmp, "out"), progress=False))
    self.assertIsInstance(error, ValueError)
    self.assertIn("2 unexpected tensors", str(error))


if __name__ == "__main__":
  absltest.main()
