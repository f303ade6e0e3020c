"""Every notebook under notebooks/ runs top to bottom on the tiny configs (so that none of them rots)."""

import os
import pathlib

from absl.testing import absltest
from absl.testing import parameterized
import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.e2e  # the notebooks, executed (`make test-unit` leaves them out)

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_NOTEBOOKS = sorted((_ROOT / "notebooks").glob("*.ipynb"))


class NotebooksTest(parameterized.TestCase):

  def test_there_are_notebooks(self):
    self.assertNotEmpty(_NOTEBOOKS)

  @parameterized.named_parameters((p.stem, p) for p in _NOTEBOOKS)
  def test_runs(self, path):
    nb = nbformat.read(path, as_version=4)
    # The notebooks' first cell installs c2jax on Colab; here it is installed, and C2JAX_NOTEBOOK_TEST tells that
    # cell to skip the install (and the notebooks to use their smallest settings).
    env_before = os.environ.get("C2JAX_NOTEBOOK_TEST")
    os.environ["C2JAX_NOTEBOOK_TEST"] = "1"
    try:
      client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                       resources={"metadata": {"path": str(path.parent)}})
      client.execute()
    finally:
      if env_before is None:
        os.environ.pop("C2JAX_NOTEBOOK_TEST", None)
    errors = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    self.assertEqual(errors, [])


if __name__ == "__main__":
  absltest.main()
