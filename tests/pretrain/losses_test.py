"""MTP self-distillation, document masks of packed rows, and the per-phase learning-rate schedule."""

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import losses
from c2jax.pretrain.step import document_mask


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


class MtpDistillTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.mtp = jax.random.normal(jax.random.key(0), (2, 3, 9, 7))  # [M, B, T, V]
    self.main = jax.random.normal(jax.random.key(1), (3, 9, 7))

  def test_matches_numpy_soft_cross_entropy_and_kl(self):
    d = losses.mtp_distill_loss(self.mtp, self.main)
    mtp, main = np.asarray(self.mtp, np.float64), np.asarray(self.main, np.float64)
    ce = kl = n = 0.0
    for k in (1, 2):
      for b in range(3):
        for i in range(9 - k - 1):
          p_log = _log_softmax(main[b, i + k])  # the main model predicts token i + k + 1 at position i + k
          q_log = _log_softmax(mtp[k - 1, b, i])
          p = np.exp(p_log)
          ce += -(p * q_log).sum()
          kl += (p * (p_log - q_log)).sum()
          n += 1
    np.testing.assert_allclose(float(d.ce.mean), ce / n, rtol=1e-5)
    np.testing.assert_allclose(float(d.kl.mean), kl / n, rtol=1e-4)

  def test_teacher_gets_no_gradient_and_student_does(self):
    g_main, g_mtp = jax.grad(lambda a, b: losses.mtp_distill_loss(b, a).ce.mean, argnums=(0, 1))(self.main, self.mtp)
    chex.assert_trees_all_equal(g_main, jnp.zeros_like(g_main))
    self.assertGreater(float(jnp.abs(g_mtp).max()), 1e-4)

  def test_kl_is_zero_when_the_student_copies_the_teacher(self):
    main = self.main
    copy = jnp.stack([jnp.pad(main[:, k:], ((0, 0), (0, k), (0, 0))) for k in (1, 2)])  # mtp[k-1, :, i] = main[:, i+k]
    d = losses.mtp_distill_loss(copy, main)
    self.assertLess(abs(float(d.kl.mean)), 1e-5)
    self.assertGreater(float(d.ce.mean), 0.5)  # the teacher's entropy remains

  def test_pairs_across_documents_and_masked_targets_are_dropped(self):
    seg = jnp.array([[1, 1, 1, 1, 2, 2, 2, 2, 0]] * 3)
    mask = jnp.ones((3, 9)).at[:, 8].set(0.0)
    w = losses.mtp_pair_weights(1, mask, seg, (3, 9))
    # depth 1: position i predicts token i + 2; valid only when both lie in one document and the target counts.
    np.testing.assert_array_equal(np.asarray(w[0]), [1, 1, 0, 0, 1, 1, 0])
    d = losses.mtp_distill_loss(self.mtp, self.main, mask, seg)
    hard = losses.mtp_loss(self.mtp, jnp.zeros((3, 9), jnp.int32), mask, seg)
    self.assertEqual(float(d.ce.weight), float(hard.weight))
    self.assertEqual(float(d.ce.weight), 3 * (4 + 2))  # depth 1: 4 pairs per row, depth 2: 2 pairs per row


class DocumentMaskTest(absltest.TestCase):

  def test_first_token_of_each_packed_document_is_never_a_target(self):
    batch = {"tokens": jnp.zeros((1, 6), jnp.int32), "segment_ids": jnp.array([[1, 1, 2, 2, 2, 0]]),
             "loss_mask": jnp.array([[0.0, 1, 1, 1, 1, 0]])}
    np.testing.assert_array_equal(np.asarray(document_mask(batch)), [[0, 1, 0, 1, 1, 0]])
    np.testing.assert_array_equal(np.asarray(document_mask({"tokens": jnp.zeros((2, 3), jnp.int32)})),
                                  np.ones((2, 3)))


if __name__ == "__main__":
  absltest.main()
