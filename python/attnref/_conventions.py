"""The conventions table shared by the docstrings of attnref.sdpa and attnref.mha (one copy)."""

CONVENTIONS = """
Conventions (attnref keyword = default; PyTorch / FlashAttention / ONNX Attention equivalent):

  scale=None            1/sqrt(dk) (computed exactly for the certified reference), or any float.
                        PyTorch SDPA ``scale=`` (default 1/sqrt(E)); FlashAttention ``softmax_scale``;
                        ONNX ``scale``.
  scale_placement=      "on_product": (q.k)*s  -- PyTorch's documented formula, cuDNN, the seed chapter.
    "on_product"        "on_query": (s*q).k    -- FlashAttention.
                        "split_sqrt": (sqrt(s)*q).(sqrt(s)*k) -- PyTorch's math backend, ONNX Attention.
                        (Equal in exact arithmetic: the certified reference is the same for all three;
                        the other arithmetics round differently.)
  causal=None           None: no causal mask. "top_left": key j allowed iff j <= i + diagonal_offset
                        -- PyTorch ``is_causal=True`` (tril), ONNX without a KV cache, JAX.
                        "bottom_right": j <= i + diagonal_offset + (Sk - Sq) -- FlashAttention >= 2.1
                        ``causal=True``, PyTorch ``causal_lower_right``, cuDNN BOTTOM_RIGHT.
  alignment=None        the diagonal diag(i) that causal, window and ALiBi share: "top_left" i +
                        diagonal_offset, "bottom_right" i + diagonal_offset + (Sk - Sq). Default: the
                        ``causal`` value, else "top_left". FlashAttention aligns window and ALiBi
                        bottom_right also without causal: pass alignment="bottom_right".
  diagonal_offset=0     shifts the diagonal of causal, window and ALiBi; ONNX's past-sequence length.
  window=None           (left, right): keys within [diag(i) - left, diag(i) + right], None = unbounded
                        side -- FlashAttention ``window_size=(left, right)`` (-1 there = None here).
                        PyTorch, ONNX: none.
  key_lengths=None      valid keys per batch entry (keys j >= length masked) -- PyTorch
                        ``key_padding_mask`` (True = ignore, so lengths = (~mask).sum(-1) for a
                        right-padded batch), FlashAttention ``cu_seqlens`` / ``seqused_k``, ONNX
                        ``nonpad_kv_seqlen``.
  mask=None             boolean mask broadcast to (B, H, Sq, Sk) (shapes (Sq, Sk), (B|1, H|1, Sq, Sk)).
  mask_polarity=        "true_means_attend": PyTorch SDPA bool ``attn_mask``, ONNX, JAX, FlashAttention
    "true_means_attend" ``key_padding_mask``. "true_means_masked": ``nn.MultiheadAttention``'s bool
                        ``attn_mask`` and ``key_padding_mask``.
  additive_mask=None    float mask added to the logits after soft-capping; -inf masks the key --
                        PyTorch float ``attn_mask``, ONNX float ``attn_mask``. FlashAttention: none.
  empty_rows="zero"     a query row with no attendable key: "zero" (weights 0, output 0) -- PyTorch
                        SDPA (``_safe_softmax``), FlashAttention, ONNX, cuDNN; "nan" (softmax of a row of
                        -inf) -- PyTorch ``nn.MultiheadAttention`` with ``need_weights``; "uniform" (mean
                        of V) -- what a finite fill such as -1e9 gives (JAX). lse is -inf for such rows
                        (PyTorch, FlashAttention's split-KV path; FlashAttention 2/3 write +inf).
  softcap=None          logits -> cap*tanh(logits/cap), before ALiBi and masks -- FlashAttention
                        ``softcap``, ONNX ``softcap``. PyTorch: none.
  alibi_slopes=None     one slope per query head: logits -= slope*|diag(i) - j| -- FlashAttention
                        ``alibi_slopes``. PyTorch, ONNX: none.
  GQA / MQA             k and v with Hkv heads dividing H: query head h reads kv head h // (H // Hkv)
                        -- PyTorch ``enable_gqa=True`` (repeat_interleave), FlashAttention, ONNX.
  return_weights=False  also return P (B, H, Sq, Sk) -- PyTorch ``need_weights`` (MHA), ONNX
                        ``qk_matmul_output``.
  return_lse=False      also return lse (B, H, Sq), natural log -- FlashAttention ``softmax_lse``.

  threads=0             worker threads (0 = every core); the results do not depend on it.

Arithmetic (``arith=``):
  "certified" (default) every element correctly rounded to float64: first double-double with
                        rigorous error bounds (the fast certified path, 106 bits, as `attnref generate`
                        certifies), accepted only when the whole enclosure rounds to one float64; the
                        query rows holding undecided elements are recomputed in MPFI interval arithmetic
                        through attnref's own templates (134 bits, escalating to 267, 535, 1065).
                        Weights and lse are certified too. The counts are in ``Reference.certification``
                        (``precisions_bits`` [106] when nothing escalated). An element that never
                        certifies (an exact rounding midpoint, an exact 0 by cancellation) raises
                        attnref.UncertifiedError naming it.
  "float64", "float32"  plain IEEE arithmetic, every operation rounded (attnref's fixed orders).
  policy names          attnref's precision policies (inputs first rounded to the storage format):
                        longdouble, float128, bin50, bf16, fp16, bf16_fp32acc, fp16_fp32acc,
                        fp32_p_bf16, fp32_p_fp8e4m3, fp32_p_fp8e5m2, the fp8 P-cast kernel models
                        fp32_p_fp8e4m3_s256, fp32_p_fp8e5m2_s256, bf16_materialised (attnref.POLICIES).
  "mpfr:BITS"           MPFR at BITS bits, for the compiled precisions attnref.MPFR_BITS (134, 267).
  Results of float32 and narrower arithmetics come back as float32 arrays (the values are exact in
  float32); all others as float64 (long double, binary128, bin50 and MPFR results rounded to float64).
"""
