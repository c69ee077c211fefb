"""Type stubs of the compiled core (private; the API is the package attnref)."""
from typing import Any, Dict, List, Optional

import numpy as np

class UncertifiedError(ArithmeticError): ...
class _Call: ...

def _make_call(kind: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, w_q: Optional[np.ndarray], w_k: Optional[np.ndarray],
               w_v: Optional[np.ndarray], w_o: Optional[np.ndarray], b_q: Optional[np.ndarray], b_k: Optional[np.ndarray],
               b_v: Optional[np.ndarray], b_o: Optional[np.ndarray], heads: int, kv_heads: int, scale: Optional[float],
               scale_placement: str, causal: str, alignment: str, diagonal_offset: int, window_left: Optional[int], window_right: Optional[int],
               window: bool, key_lengths: Optional[List[int]], mask: Optional[np.ndarray], mask_polarity: str,
               additive_mask: Optional[np.ndarray], empty_rows: str, softcap: Optional[float], alibi_slopes: Optional[List[float]],
               threads: int) -> _Call: ...
def _compute(call: _Call, arith: str, weights: bool, lse: bool) -> Dict[str, Any]: ...
def _mpfr_bits() -> List[int]: ...
def _judge(call: Optional[_Call], model: str, format: str, reference_u: float, expected_output: np.ndarray,
           expected_weights: Optional[np.ndarray], expected_lse: Optional[np.ndarray], actual_output: np.ndarray,
           actual_weights: Optional[np.ndarray], actual_lse: Optional[np.ndarray], output_row: int,
           ulp_limit: float) -> List[Dict[str, Any]]: ...
