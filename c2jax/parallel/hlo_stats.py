"""Accounting of XLA's compiled programs: collectives, matmul FLOPs and buffer sizes read from HLO text and dumps
(the XLA side of `tools/plan.py` and `tools/bench_parallel.py`, beside the analytic model of `c2jax.parallel.plan`).

`hlo_collectives` and `hlo_dot_flops` parse HLO text (compiled, dumped after SPMD partitioning, or
`lowered.as_text(dialect="hlo")`, where shard_map's explicit collectives already appear with per-device shapes),
multiply every instruction by how often its computation runs (while bodies by their trip count: `known_trip_count`
when XLA gives it, else the loop bound read from the condition; unknown bounds, e.g. the data-dependent EP rounds,
count once and are reported), and sum the operand bytes and wire bytes of all-gather, reduce-scatter, all-reduce,
all-to-all and collective-permute, and 2 x M x N x K of every dot. `expert_weight_gathers` picks out the
all-gathers of routed-expert weights; `buffer_assignment_bytes` reads the sizes of XLA's buffer-assignment dump.

Wire bytes are what one device sends per step; for these ring / pairwise collectives it also receives as much:
(g - 1) / g of the buffer for all-gather, reduce-scatter and all-to-all over a group of g, 2 (g - 1) / g of it for
all-reduce (`ring_factor`). The analytic model counts with the same convention.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Iterable, Mapping

from c2jax.model.config import ModelConfig
from c2jax.parallel.mesh import EXPERT, TENSOR


def ring_factor(group: int) -> float:
  """(g - 1) / g: the share of a buffer one device sends in a ring all-gather / reduce-scatter of g devices."""
  return (group - 1) / group if group > 1 else 0.0


_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
              "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5, "f8e4m3fn": 1, "f8e5m2": 1,
              "f8e4m3": 1, "f8e8m0fnu": 1, "f4e2m1fn": 0.5, "token": 0}
_SHAPE_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
# Computation headers: 'ENTRY %main.1 (p: f32[2]) -> f32[2] {' (compiled text) or 'region_0.3 {' (lowered HLO).
_HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)(\s*\(.*\)\s*->\s*.*)?\s*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def shape_bytes(type_text: str) -> float:
  """Bytes of an HLO type: an array 'bf16[4,8]{1,0}' or a tuple of them."""
  total = 0.0
  for dtype, dims in _SHAPE_RE.findall(type_text):
    if dtype not in _HLO_BYTES:
      continue
    total += _HLO_BYTES[dtype] * math.prod(int(x) for x in dims.split(",") if x)
  return total


def _split_type(rest: str) -> tuple[str, str]:
  """'TYPE opcode(...), attrs' -> (TYPE, 'opcode(...), attrs')."""
  if rest.startswith("("):
    depth = 0
    for i, c in enumerate(rest):
      depth += c == "("
      depth -= c == ")"
      if depth == 0:
        return rest[:i + 1], rest[i + 1:].lstrip()
  head, _, tail = rest.partition(" ")
  return head, tail


def _split_call(text: str) -> tuple[str, str, str]:
  """'opcode(a, b), attrs' -> (opcode, 'a, b', attrs)."""
  op, paren, rest = text.partition("(")
  if not paren:
    return op.strip(), "", ""
  depth = 1
  for i, c in enumerate(rest):
    depth += c == "("
    depth -= c == ")"
    if depth == 0:
      return op.strip(), rest[:i], rest[i + 1:]
  return op.strip(), rest, ""


@dataclasses.dataclass(frozen=True)
class HloInstruction:
  name: str
  type_text: str
  opcode: str
  operands: tuple[str, ...]
  attrs: str


@dataclasses.dataclass
class HloModule:
  """Computations of an HLO text module: name -> instructions, the entry, and every instruction's type."""

  computations: dict[str, list[HloInstruction]]
  entry: str
  types: dict[str, str]


def parse_hlo(text: str) -> HloModule:
  """Parses HLO text into computations of instructions (name, result type, opcode, operand names, attributes)."""
  comps: dict[str, list[HloInstruction]] = {}
  types: dict[str, str] = {}
  entry, current = "", None
  for line in text.splitlines():
    if current is None:
      m = _HEADER_RE.match(line)
      if m:
        current = m.group(2)
        comps[current] = []
        if m.group(1):
          entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    m = _INSTR_RE.match(line)
    if not m:
      continue
    name, rest = m.groups()
    type_text, call = _split_type(rest)
    opcode, operands, attrs = _split_call(call)
    ops = tuple(o.strip().split(" ")[-1].lstrip("%") for o in _split_top(operands) if o.strip())
    types[name] = type_text
    comps[current].append(HloInstruction(name, type_text, opcode, ops, attrs))
  return HloModule(comps, entry, types)


def _split_top(text: str) -> list[str]:
  """Splits on commas outside brackets and braces."""
  out, depth, cur = [], 0, []
  for c in text:
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    if c == "," and depth == 0:
      out.append("".join(cur))
      cur = []
    else:
      cur.append(c)
  if cur:
    out.append("".join(cur))
  return out


_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_CALLEE_RE = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES_RE = re.compile(r"branch_computations=\{([^}]*)\}")
_CALLED_RE = re.compile(r"called_computations=\{([^}]*)\}")


def _loop_bound(module: HloModule, cond: str) -> int | None:
  """The constant a counter is compared against in a while condition (scan / fori_loop from 0), or None."""
  instrs = module.computations.get(cond, [])
  consts = {}
  for ins in instrs:
    if ins.opcode == "constant" and re.match(r"^s(32|64)\[\]", ins.type_text):
      consts[ins.name] = int(ins.operands[0]) if ins.operands and ins.operands[0].lstrip("-").isdigit() else None
  for ins in instrs:
    names = list(ins.operands)
    if ins.opcode == "fusion":  # the compare may sit inside a fusion; look for its constant there
      m = re.search(r"calls=%?([\w.\-]+)", ins.attrs)
      sub = _loop_bound(module, m.group(1)) if m else None
      if sub is not None:
        return sub
    if ins.opcode == "compare" and "direction=LT" in ins.attrs:
      for nm in names:
        if consts.get(nm) is not None:
          return consts[nm]
  if len([v for v in consts.values() if v]) == 1:
    return next(v for v in consts.values() if v)
  return None


def execution_counts(module: HloModule) -> tuple[dict[str, float], list[str]]:
  """How many times each computation runs per call of the entry, and the while loops of unknown trip count."""
  edges: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
  unknown = []
  for comp, instrs in module.computations.items():
    for ins in instrs:
      trip = 1.0
      if ins.opcode == "while":
        m = _TRIP_RE.search(ins.attrs)
        cond = re.search(r"condition=%?([\w.\-]+)", ins.attrs)
        bound = int(m.group(1)) if m else (_loop_bound(module, cond.group(1)) if cond else None)
        if bound is None:
          unknown.append(ins.name)
        trip = float(bound) if bound is not None else 1.0
      for kind, callee in _CALLEE_RE.findall(ins.attrs):
        # to_apply names both `call` targets (shard_map bodies before optimization) and reductions' scalar
        # computations (which hold neither collectives nor dots).
        edges[comp].append((callee, trip if kind in ("body", "condition") else 1.0))
      for group in _BRANCHES_RE.findall(ins.attrs) + _CALLED_RE.findall(ins.attrs):
        for callee in group.split(","):
          edges[comp].append((callee.strip().lstrip("%"), 1.0))
  counts: dict[str, float] = collections.defaultdict(float)
  # Computations form a DAG; accumulate in topological order (callers before callees).
  order: list[str] = []
  seen: set[str] = set()

  def visit(c: str):
    if c in seen:
      return
    seen.add(c)
    for callee, _ in edges.get(c, ()):
      visit(callee)
    order.append(c)

  visit(module.entry)
  counts[module.entry] = 1.0
  for c in reversed(order):
    for callee, factor in edges.get(c, ()):
      counts[callee] += counts[c] * factor
  return dict(counts), unknown


def group_size(attrs: str) -> int:
  """Devices per replica group of a collective's attributes (all three HLO spellings), 0 if none is given."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", attrs)
  if m:
    sizes = {k.strip("' "): int(v) for k, v in (kv.split("=") for kv in m.group(1).split(","))}
    return math.prod(sizes[a.strip("' ")] for a in m.group(2).split(",") if a.strip())
  m = re.search(r"replica_groups=\[([\d,]+)\]<=", attrs)
  if m:
    return int(m.group(1).split(",")[-1])
  m = re.search(r"replica_groups=\{(\{[^}]*\})", attrs)
  if m:
    return len([x for x in m.group(1).strip("{}").split(",") if x.strip()])
  m = re.search(r"source_target_pairs=\{(.*?)\}\s*(,|$)", attrs)
  if m:
    return 2 if m.group(1).strip() else 0
  return 0


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
  """One collective instruction of the compiled program.

  Attributes:
    kind: one of `COLLECTIVES`.
    name: instruction name.
    result_type: its HLO result type.
    operand_bytes / result_bytes: per execution, per device.
    group: devices per replica group.
    executions: how many times it runs per step (loop trip counts).
    op_name: the JAX op path from the metadata (fwd ops have 'jvp(', bwd ones 'transpose(').
  """

  kind: str
  name: str
  result_type: str
  operand_bytes: float
  result_bytes: float
  group: int
  executions: float
  op_name: str

  @property
  def wire_bytes(self) -> float:
    """Bytes this device sends per step (ring / pairwise algorithms)."""
    g = self.group
    if self.kind == "all-gather":
      per = self.result_bytes * ring_factor(g)
    elif self.kind == "reduce-scatter":
      per = self.operand_bytes * ring_factor(g)
    elif self.kind == "all-reduce":
      per = 2 * self.operand_bytes * ring_factor(g)
    elif self.kind == "all-to-all":
      per = self.operand_bytes * ring_factor(g)
    else:
      per = self.operand_bytes if g else 0.0
    return per * self.executions


def hlo_collectives(text: str) -> tuple[list[CollectiveRecord], list[str]]:
  """Every collective of an HLO text module with its per-step executions; also the loops of unknown trip count."""
  module = parse_hlo(text)
  counts, unknown = execution_counts(module)
  out = []
  for comp, instrs in module.computations.items():
    runs = counts.get(comp, 0.0)
    if not runs:
      continue
    for ins in instrs:
      kind = ins.opcode[:-len("-start")] if ins.opcode.endswith("-start") else ins.opcode
      if kind not in COLLECTIVES:
        continue
      operand_bytes = sum(shape_bytes(module.types.get(o, "")) for o in ins.operands)
      result_type = ins.type_text
      result_bytes = shape_bytes(result_type)
      if ins.opcode == "all-gather-start":  # returns (operands, results)
        result_bytes -= operand_bytes
      elif ins.opcode == "collective-permute-start":  # returns (operand, result, scratch)
        result_bytes = operand_bytes
      op_name = re.search(r'op_name="([^"]*)"', ins.attrs)
      out.append(CollectiveRecord(kind=kind, name=ins.name, result_type=result_type, operand_bytes=operand_bytes,
                                  result_bytes=result_bytes, group=group_size(ins.attrs), executions=runs,
                                  op_name=op_name.group(1) if op_name else ""))
  return out, unknown


def summarize_collectives(records: Iterable[CollectiveRecord]) -> dict[str, dict[str, float]]:
  """kind -> {count (instructions), executions, operand_bytes, wire_bytes} per step and device."""
  out: dict[str, dict[str, float]] = {}
  for r in records:
    s = out.setdefault(r.kind, {"count": 0, "executions": 0.0, "operand_bytes": 0.0, "wire_bytes": 0.0})
    s["count"] += 1
    s["executions"] += r.executions
    s["operand_bytes"] += r.operand_bytes * r.executions
    s["wire_bytes"] += r.wire_bytes
  return out


def _dims(type_text: str) -> list[int]:
  m = _SHAPE_RE.search(type_text)
  return [int(x) for x in m.group(2).split(",") if x] if m else []


def hlo_dot_flops(text: str) -> tuple[float, list[str]]:
  """2 x (result elements) x (contracted size) summed over every dot, times its executions per step."""
  module = parse_hlo(text)
  counts, unknown = execution_counts(module)
  total = 0.0
  for comp, instrs in module.computations.items():
    runs = counts.get(comp, 0.0)
    if not runs:
      continue
    for ins in instrs:
      if ins.opcode != "dot":
        continue
      lhs = _dims(module.types.get(ins.operands[0], "")) if ins.operands else []
      m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs)
      contract = math.prod(lhs[int(i)] for i in m.group(1).split(",") if i) if m and lhs else 1
      total += 2.0 * math.prod(_dims(ins.type_text)) * contract * runs
  return total, unknown


def expert_weight_gathers(records: Iterable[CollectiveRecord], cfg: ModelConfig,
                          mesh_shape: Mapping[str, int]) -> dict[str, float]:
  """All-gathers whose result is a routed-expert weight block [.., X, D, F_t] or [.., X, F_t, D], X in {E_l, E}.

  Returns {bytes: result bytes x executions, wire_bytes, full_expert_bytes: of those, the ones that hold all E
  experts on a device (the degenerate case when the expert axis is split)}. A shape heuristic: another weight
  with the same trailing dims and a leading dim equal to E_l or E would count too.
  """
  e = cfg.n_routed_experts
  el = e // mesh_shape.get(EXPERT, 1)
  d, f = cfg.d_model, cfg.moe_intermediate_size // mesh_shape.get(TENSOR, 1)
  out = {"bytes": 0.0, "wire_bytes": 0.0, "full_expert_bytes": 0.0, "count": 0}
  for r in records:
    if r.kind != "all-gather":
      continue
    dims = _dims(r.result_type)
    if len(dims) < 3 or tuple(dims[-2:]) not in ((d, f), (f, d)) or dims[-3] not in (e, el):
      continue
    out["count"] += 1
    out["bytes"] += r.result_bytes * r.executions
    out["wire_bytes"] += r.wire_bytes
    if dims[-3] == e and mesh_shape.get(EXPERT, 1) > 1:
      out["full_expert_bytes"] += r.result_bytes * r.executions
  return out


_ALLOCATION_RE = re.compile(r"^allocation \d+: size (\d+), (parameter|preallocated-temp|output|maybe-live-out|"
                            r"thread-local|constant)?")


def buffer_assignment_bytes(text: str) -> dict[str, float]:
  """Sizes from XLA's buffer-assignment dump (`*-buffer-assignment.txt`): the figures of `memory_analysis`.

  Returns {argument_bytes: parameter allocations, temp_bytes: the preallocated temp buffer plus other
  non-parameter allocations, total_bytes: all allocations}.
  """
  out = {"argument_bytes": 0.0, "temp_bytes": 0.0, "total_bytes": 0.0}
  for line in text.splitlines():
    m = _ALLOCATION_RE.match(line)
    if not m:
      continue
    size = float(m.group(1))
    out["total_bytes"] += size
    if m.group(2) == "parameter":
      out["argument_bytes"] += size
    elif m.group(2) in ("preallocated-temp", "thread-local", None):
      out["temp_bytes"] += size
  return out
