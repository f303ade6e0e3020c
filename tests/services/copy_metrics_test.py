"""The copying probe's batches by held-out source: a text source gives both probes; a source of token documents (an
SFT's recorded episodes, which the agentic main job's SFT evaluates on) gives the copy strings alone, where building
the names batch used to raise on the first document."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest
import numpy as np

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.services import copy_metrics
from tests import tiny

_CODE = "def area(width, height):\n  total = width * height\n  return total\n\nprint(area(2, 3))\n" * 8
_COPY_KEYS = {"copy_first_ce", "copy_second_ce", "copy_ratio"}


class CopyProbeSourcesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
    self.tok = ByteTokenizer()
    self.params = tiny.params(tiny.BYTES)

  def _evaluate(self, probe):
    return probe.evaluate(self.params, tiny.BYTES)

  def test_token_documents_give_the_copy_strings_alone(self):
    path = os.path.join(self.dir, "traces.jsonl")
    with open(path, "w") as f:
      for _ in range(3):
        ids = list(_CODE.encode())[:200]
        f.write(json.dumps({"tokens": ids, "weights": [1.0] * len(ids)}) + "\n")
    probe = copy_metrics.CopyProbe.build(self.tok, {"kind": "token_docs", "path": path}, seq_len=128, rows=2)
    self.assertIsNone(probe.name_tokens)
    got = self._evaluate(probe)
    self.assertEqual(set(got), _COPY_KEYS)
    self.assertAlmostEqual(got["copy_ratio"], got["copy_second_ce"] / got["copy_first_ce"])
    copy_metrics.plot([{"step": 0, **got}, {"step": 1, **got}], os.path.join(self.dir, "copying.png"))
    self.assertTrue(os.path.getsize(os.path.join(self.dir, "copying.png")))

  def test_a_text_source_gives_both_probes(self):
    path = os.path.join(self.dir, "code.jsonl")
    with open(path, "w") as f:
      for _ in range(3):
        f.write(json.dumps({"text": _CODE}) + "\n")
    probe = copy_metrics.CopyProbe.build(self.tok, {"kind": "jsonl", "path": path}, seq_len=128, rows=2)
    self.assertEqual(probe.name_tokens.shape, (2, 128))
    got = self._evaluate(probe)
    self.assertEqual(set(got), set(copy_metrics.KEYS))
    self.assertTrue(np.isfinite(got["name_ratio"]))


if __name__ == "__main__":
  absltest.main()
