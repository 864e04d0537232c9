"""einsum against numpy's (float64), over explicit and implicit outputs, ellipses, repeated indices, traces, outer
products, broadcasting and chains; its contraction order, gradients, vmap and errors."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp

RNG = np.random.default_rng(4)
A, B, C = (RNG.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 5), (5, 2)))
SQ = RNG.standard_normal((4, 4)).astype(np.float32)
T, U = RNG.standard_normal((2, 3, 4)).astype(np.float32), RNG.standard_normal((2, 4, 5)).astype(np.float32)
CASES = [("ij,jk->ik", A, B), ("ij,jk,kl->il", A, B, C), ("ii->", SQ), ("ii->i", SQ), ("ij->ji", A), ("ij->", A),
         ("ij", A), ("ij,jk", A, B), ("i,j->ij", A[0], B[0]), ("bij,bjk->bik", T, U), ("...ij,...jk->...ik", T, U),
         ("bij,bjk", T, U), ("i,i", A[0], A[0]), ("ijk->kji", T), ("...i->...", T), ("ij,ij->ij", A, A),
         ("i...->...", T), ("iij->j", RNG.standard_normal((3, 3, 2)).astype(np.float32)), ("ij,kl->ijkl", A, C),
         ("...j,j->...", T, A[0]), ("ab,cb->ac", A, np.ones((2, 4), np.float32)), ("ij,1j->i".replace("1", "k"), A,
                                                                                   np.ones((1, 4), np.float32))]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_numpy(case):
  subscripts, *operands = case
  got = np.asarray(tnp.einsum(subscripts, *operands))
  want = np.einsum(subscripts, *[o.astype(np.float64) for o in operands])
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_dtypes_order_gradients_and_vmap():
  ints = tnp.einsum("ij,jk->ik", np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2))
  assert ints.dtype == np.int32 and np.array_equal(np.asarray(ints), np.arange(6).reshape(2, 3) @ np.arange(6).reshape(
    3, 2))
  assert tnp.einsum("i,i->", tnp.ones(3, tnp.bfloat16), tnp.ones(3, tnp.bfloat16)).dtype == tnp.bfloat16
  # a chain whose right pair is small is contracted right first: no (1000, 1000) intermediate
  text = str(tj.make_jaxpr(lambda a, b, c: tnp.einsum("ij,jk,kl->il", a, b, c))(
    tnp.ones((1000, 2)), tnp.ones((2, 1000)), tnp.ones((1000, 1))))
  assert "f32[1000,1000]" not in text
  grad = tj.grad(lambda a: tnp.einsum("ij,jk,kl->", a, B, C))(tnp.asarray(A))
  np.testing.assert_allclose(np.asarray(grad), np.broadcast_to((B @ C).sum(axis=1), (3, 4)), rtol=1e-5)
  batched = tj.vmap(lambda t: tnp.einsum("ij,jk->ik", t, B))(tnp.asarray(T))
  np.testing.assert_allclose(np.asarray(batched), np.einsum("bij,jk->bik", T, B), rtol=1e-5)


def test_errors():
  with pytest.raises(ValueError, match="operands"):
    tnp.einsum("ij,jk->ik", A)
  with pytest.raises(ValueError, match="invalid subscript"):
    tnp.einsum("i2->i", A)
  with pytest.raises(ValueError, match="does not appear"):
    tnp.einsum("ij->iz", A)
  with pytest.raises(ValueError, match="sizes"):
    tnp.einsum("ij,ij->ij", A, B)
  with pytest.raises(ValueError, match="do not match"):
    tnp.einsum("ijk->i", A)
