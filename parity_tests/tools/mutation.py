"""Bug injection: how strong is the parity suite? (issue 12, item 7)

Each mutant is a realistic bug, written by hand as exact text replacements in the library. For
each one the script copies the repository (tracked and untracked, non-ignored files) into a
temporary directory, applies that one mutant there, runs the tests that should catch it (``-x``,
with ``PYTHONPATH`` and the working directory at the copy, under a time limit) and records the
first failing test, or that none failed. The working tree is never touched.

    .venv/bin/python -m parity_tests.tools.mutation            # every mutant, then table and score
    .venv/bin/python -m parity_tests.tools.mutation --only softmax_axis dropout_in_eval
    .venv/bin/python -m parity_tests.tools.mutation --check    # only: do all old texts still exist?
    .venv/bin/python -m parity_tests.tools.mutation --baseline # the selected tests pass unmutated?
    .venv/bin/python -m parity_tests.tools.mutation --new-only # the tests without a twin alone

A mutant whose old text is no longer found exactly once is reported as ``stale`` (the code moved
on: rewrite the mutant), never skipped in silence. Statuses: ``caught`` (a test failed, or the
mutated code failed to import), ``SURVIVED`` (every selected test passed), ``timeout``, ``stale``.
The score is caught / (mutants that are not stale). Several mutants write the same bug into
both twins: those are the bugs twin parity cannot see, which the tests without a twin
(``test_references``, ``test_invariance``, ``test_dropout``, ``test_layer_norm``, ``test_bf16``,
``test_lookups``) are there for. Each mutant's test selection lists the twin-parity test that
would be expected to see the bug first, then the test written for its class, so the table shows
which one caught it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

J, TR, PT = "jaxformer/", "torch_ref/", "parity_tests/"
ATTN, MASKS, LAYERS, PARAMS = "nn/attention.py", "nn/masks.py", "nn/layers.py", "nn/params.py"
BERT, GPT, ED = "models/bert.py", "models/gpt.py", "models/encoder_decoder.py"
T_ATTN, T_MASKS = PT + "nn/test_attention.py", PT + "nn/test_masks.py"
T_BERT, T_GPT, T_ED = PT + "models/test_bert.py", PT + "models/test_gpt.py", \
    PT + "models/test_encoder_decoder.py"
T_REF, T_INV = PT + "models/test_references.py", PT + "models/test_invariance.py"
T_BF16, T_DROP = PT + "models/test_bf16.py", PT + "nn/test_dropout.py"
T_LN, T_LOOK = PT + "nn/test_layer_norm.py", PT + "nn/test_lookups.py"
BAD = PT + "test_bad_input.py"
NEW = (T_REF, T_INV, T_BF16, T_DROP, T_LN, T_LOOK)  # the tests without a twin (issue 12)


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, exact old text, new text)
    tests: tuple[str, ...]  # pytest node ids or paths, in the order they run


def both(path: str, old: str, new: str, torch_old: str | None = None,
         torch_new: str | None = None) -> tuple[tuple[str, str, str], ...]:
    """The same bug in ``jaxformer/<path>`` and its twin ``torch_ref/<path>``."""
    return ((J + path, old, new),
            (TR + path, old if torch_old is None else torch_old,
             new if torch_new is None else torch_new))


# jaxformer/nn/attention.py has two einsum paths (uncached, and cached decoding) with the same
# lines; these anchors pick the uncached one, the one every model call without a cache takes.
SCALE = "scores = scores / math.sqrt(q.shape[-1])  # (B, nh, T, S)"
SOFTMAX = SCALE + "\n    if mask is not None:\n        scores = jnp.where(mask, scores, " \
    "MASK_VALUE)\n    weights = jax.nn.softmax(scores, axis=-1)"
DROP = '        weights = dropout(weights)\n    return jnp.einsum("bhts,bshd->bthd"'

MUTANTS = [
    # --- attention -------------------------------------------------------------------------
    Mutant("attention_scale_sqrt_hidden",  # seed 002's sqrt(embed_size), jax einsum path
           ((J + ATTN, SCALE, SCALE.replace("q.shape[-1]", "q.shape[-1] * q.shape[-2]")),),
           (T_ATTN + "::test_attention_matches_torch_sdpa_math",)),
    Mutant("attention_scale_both_einsum_paths",
           both(ATTN, SCALE, SCALE.replace("q.shape[-1]", "q.shape[-1] * q.shape[-2]"),
                "/ math.sqrt(q.shape[-1])", "/ math.sqrt(q.shape[-1] * q.shape[1])"),
           (T_ATTN + "::test_multi_head_attention_matches_torch",
            T_ATTN + "::test_attention_matches_torch_sdpa_math")),
    Mutant("softmax_over_queries",  # seed 002's softmax axis
           ((J + ATTN, SOFTMAX, SOFTMAX.replace("axis=-1", "axis=-2")),),
           (T_ATTN + "::test_attention_matches_torch_sdpa_math",)),
    Mutant("causal_mask_off_by_one_both_sides",
           ((J + MASKS, "k=k_len - q_len)[None, None]", "k=k_len - q_len + 1)[None, None]"),
            (TR + MASKS, "diagonal=k_len - q_len)", "diagonal=k_len - q_len + 1)")),
           (T_GPT + "::test_model_parity", T_GPT + "::test_against_sdpa_causal_reference")),
    Mutant("dropout_in_eval_torch_attention",
           ((TR + ATTN, "dropout.training and dropout.p > 0", "dropout.p > 0"),),
           (T_ATTN + "::test_multi_head_attention_matches_torch",)),
    # --- masks -------------------------------------------------------------------------------
    Mutant("bert_padding_mask_dropped",
           ((J + BERT, "mask = None if attention_mask is None else padding_mask(attention_mask)",
             "mask = None"),),
           (T_BERT + "::test_bert_model",)),
    Mutant("gpt_padding_mask_dropped_both_sides",
           both(GPT, "padding = None if attention_mask is None else padding_mask(attention_mask)",
                "padding = None"),
           (T_GPT + "::test_model_parity", T_INV + "::test_gpt_ignores_masked_content")),
    Mutant("ed_target_padding_mask_dropped_both_sides",
           ((J + ED, "self_mask = combine_masks(causal_mask(T), padding_mask(tgt_mask))",
             "self_mask = combine_masks(causal_mask(T))"),
            (TR + ED, "padding_mask(tgt_mask))  # (B, 1, T, T)", "None)  # (B, 1, T, T)")),
           (T_ED + "::test_model_parity", T_ED + "::test_matches_torch_nn_transformer",
            T_INV, T_REF)),
    Mutant("ed_cross_attention_padding_dropped_both_sides",
           both(ED, "cross_mask = None if src_mask is None else padding_mask(src_mask)",
                "cross_mask = None"),
           (T_ED + "::test_model_parity", T_INV, T_REF)),
    # --- LayerNorm, activation ---------------------------------------------------------------
    Mutant("layer_norm_eps_flax_default",  # the factory forgets eps: NNX's 1e-6
           ((J + PARAMS, "epsilon=config.layer_norm_eps,", ""),),
           (T_BERT + "::test_bert_model", T_LN)),
    Mutant("layer_norm_eps_1e-5_both_sides",
           ((J + PARAMS, "epsilon=config.layer_norm_eps,", "epsilon=1e-5,"),
            (TR + PARAMS, "eps=config.layer_norm_eps)", "eps=1e-5)")),
           (T_BERT + "::test_bert_model", T_LN)),
    Mutant("layer_norm_one_pass_variance",
           ((J + PARAMS, "use_fast_variance=False", "use_fast_variance=True"),),
           (T_BERT + "::test_bert_model", T_LN)),
    Mutant("gelu_tanh_for_exact",
           ((J + LAYERS, "jax.nn.gelu(x, approximate=False)", "jax.nn.gelu(x, approximate=True)"),),
           (T_BERT + "::test_feed_forward",)),
    Mutant("gelu_tanh_for_exact_both_sides",
           ((J + LAYERS, "jax.nn.gelu(x, approximate=False)", "jax.nn.gelu(x, approximate=True)"),
            (TR + LAYERS, 'F.gelu(x, approximate="none")', 'F.gelu(x, approximate="tanh")')),
           (T_BERT + "::test_feed_forward", T_REF + "::test_bert_for_pretraining_against_float64"
            "_reference")),
    Mutant("pre_post_ln_swapped_both_sides",
           both(LAYERS, "        if self.pre_norm:\n", "        if not self.pre_norm:\n"),
           (T_BERT + "::test_bert_model", T_REF + "::test_bert_for_pretraining_against_float64"
            "_reference")),
    # --- positions and embeddings -------------------------------------------------------------
    Mutant("gpt_positions_ignore_left_padding",
           ((J + GPT, "position_ids = position_ids_from_mask(attention_mask)  # (B, T)",
             "position_ids = jnp.arange(T)[None]  # (B, T)"),),
           (T_GPT + "::test_model_parity",)),
    Mutant("gpt_positions_ignore_left_padding_both_sides",
           both(GPT, "position_ids = position_ids_from_mask(attention_mask)  # (B, T)",
                "position_ids = jnp.arange(T)[None]  # (B, T)", None,
                "position_ids = torch.arange(T, device=input_ids.device)[None]  # (B, T)"),
           (T_GPT + "::test_model_parity", T_REF + "::test_gpt_embeddings_formula")),
    Mutant("ed_embedding_scale_head_dim_both_sides",
           both(ED, "self.scale = math.sqrt(config.hidden_size)",
                "self.scale = math.sqrt(config.head_dim)"),
           (T_ED + "::test_model_parity", T_ED + "::test_matches_torch_nn_transformer",
            T_REF + "::test_encoder_decoder_embeddings_formula")),
    Mutant("sinusoid_sin_cos_swapped_shared_numerics",  # one file both twins import
           (("jaxformer/numerics.py", "table[:, 0::2] = np.sin(position * div_term)\n"
             "    table[:, 1::2] = np.cos(position * div_term)",
             "table[:, 0::2] = np.cos(position * div_term)\n"
             "    table[:, 1::2] = np.sin(position * div_term)"),),
           (T_ED + "::test_model_parity", T_REF + "::test_encoder_decoder_embeddings_formula")),
    # --- conversion ---------------------------------------------------------------------------
    Mutant("conversion_skips_transpose",
           ((J + "checkpoints/convert.py", "value = given[key].T if transpose else given[key]",
             "value = given[key]"),),
           (T_BERT + "::test_bert_model",)),
    Mutant("gpt2_fused_qkv_split_swapped",
           ((J + "checkpoints/hf/gpt2.py", 'for p in ("query", "key", "value")',
             'for p in ("key", "query", "value")'),),
           (PT + "checkpoints/test_hf.py::test_gpt2_import_matches_transformers",)),
    # --- train mode -----------------------------------------------------------------------------
    Mutant("decoder_dropout_on_residual_input_both_sides",  # seed 002's decoder bug
           both(ED, "x = self.self_attention_norm(x + self.dropout(h))",
                "x = self.self_attention_norm(self.dropout(x) + h)"),
           (T_ED + "::test_model_parity", T_DROP)),
    Mutant("attention_dropout_not_rescaled_both_sides",
           both(ATTN, DROP,
                DROP.replace("dropout(weights)", "dropout(weights) * (1 - dropout.rate)"),
                "        weights = dropout(weights)\n",
                "        weights = dropout(weights) * (1 - dropout.p)\n"),
           (T_ATTN + "::test_attention_dropout_needs_einsum",
            T_ATTN + "::test_multi_head_attention_dropout_train_mode", T_DROP)),
    Mutant("bert_embedding_dropout_before_layer_norm_both_sides",
           both(BERT, "            x = self.layer_norm(x)\n        return self.dropout(x)",
                "            x = self.layer_norm(self.dropout(x))\n        return x"),
           (T_BERT + "::test_embedding_dropout_rate_and_scaling", T_DROP)),
    # --- dtypes ---------------------------------------------------------------------------------
    Mutant("bf16_parameters",
           ((J + PARAMS, "use_bias=use_bias, dtype=jnp.dtype(config.dtype),",
             "use_bias=use_bias, dtype=jnp.dtype(config.dtype), "
             "param_dtype=jnp.dtype(config.dtype),"),),
           (T_BERT + "::test_bert_model", T_BF16)),
    Mutant("bf16_compute_dtype_ignored_by_linear",
           ((J + PARAMS, "use_bias=use_bias, dtype=jnp.dtype(config.dtype),",
             "use_bias=use_bias,"),),
           (T_BERT + "::test_bert_model", T_BF16)),
    # --- bad input under jit ----------------------------------------------------------------------
    Mutant("negative_token_id_wraps",
           ((J + PARAMS, "ids = jnp.where(inputs < 0, self.num_embeddings, inputs)",
             "ids = inputs"),),
           (BAD + "::test_token_id_out_of_vocabulary", T_LOOK)),
    Mutant("negative_masked_position_wraps",
           ((J + BERT, "positions = jnp.where(positions < 0, hidden_states.shape[1], positions)",
             "positions = positions + 0"),),
           (BAD + "::test_masked_positions_out_of_range", T_LOOK)),
    Mutant("mask_values_not_checked",
           (("jaxformer/validate.py", "not np.isin(values, (0, 1)).all()",
             "not np.isin(values != 0, (0, 1)).all()"),),
           (BAD + "::test_attention_mask_wrong_shape", T_LOOK)),
    Mutant("closure_ids_read_by_jax",  # issue 12 item 3: .min() on a captured JAX array
           (("jaxformer/validate.py", "values = host_values(ids)",
             "values = None if is_traced(ids) else ids"),),
           (BAD + "::test_token_id_out_of_vocabulary", T_LOOK)),
    Mutant("checked_mode_without_index_checks",
           ((J + "nn/jit.py", "errors=checkify.index_checks | checkify.nan_checks",
             "errors=checkify.user_checks"),),
           (T_LOOK,)),
]


# ------------------------------------------------------------------------------------------------
# machinery


def snapshot(dest: Path) -> None:
    """Copy the files git knows or would add (tracked + untracked, not ignored) into ``dest``."""
    names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def apply(mutant: Mutant, tree: Path, write: bool = True) -> str | None:
    """Apply the edits in ``tree`` (all or none); None, or why the mutant is stale."""
    texts = {}
    for path, old, new in mutant.edits:
        file = tree / path
        if not file.is_file():
            return f"{path} does not exist"
        text = texts.get(path, file.read_text())
        count = text.count(old)
        if count != 1:
            return f"{path}: old text found {count} times: {old.strip()[:60]!r}"
        texts[path] = text.replace(old, new)
    if write:
        for path, text in texts.items():
            (tree / path).write_text(text)
    return None


def pytest(tree: Path, tests, timeout: float, extra=("-x",)) -> tuple[int | None, str, float]:
    """Run pytest in ``tree``; (exit code or None on timeout, output, seconds)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *tests]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the process group this run started
        out, _ = proc.communicate()
        return None, out, time.monotonic() - start


def first_failure(output: str) -> str:
    """The first ``FAILED``/``ERROR`` node id of pytest's short summary."""
    for line in output.splitlines():
        match = re.match(r"(FAILED|ERROR) (\S+)", line)
        if match:
            return match.group(2) if match.group(1) == "FAILED" else f"error in {match.group(2)}"
    return ""


def run_mutant(mutant: Mutant, base: Path, timeout: float, keep: bool) -> dict:
    tree = Path(tempfile.mkdtemp(prefix=f"mutant-{mutant.name}-"))
    try:
        shutil.copytree(base, tree, dirs_exist_ok=True)
        stale = apply(mutant, tree)
        if stale:
            return {"status": "stale", "detail": stale, "seconds": 0.0}
        code, out, seconds = pytest(tree, mutant.tests, timeout)
        if code is None:
            return {"status": "timeout", "detail": f"> {timeout:.0f} s", "seconds": seconds}
        if code == 0:
            return {"status": "SURVIVED", "detail": "every selected test passed",
                    "seconds": seconds}
        failure = first_failure(out)
        if code in (1, 2) and failure:  # 2: interrupted, e.g. the mutant broke an import
            return {"status": "caught", "detail": failure, "seconds": seconds}
        last = out.strip().splitlines()[-1] if out.strip() else ""
        return {"status": f"exit {code}", "detail": last, "seconds": seconds}
    finally:
        if not keep:
            shutil.rmtree(tree, ignore_errors=True)


def check_imports_come_from(tree: Path) -> None:
    """The copy, not the working tree (an editable install), must be what Python imports."""
    code = "import jaxformer, torch_ref, parity_tests; print(jaxformer.__file__, " \
           "torch_ref.__file__, parity_tests.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, check=True, text=True,
                         capture_output=True, env=dict(os.environ, PYTHONPATH=str(tree))).stdout
    if not all(Path(p).resolve().is_relative_to(tree.resolve()) for p in out.split()):
        sys.exit(f"imports do not come from the copy {tree}: {out}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per mutant")
    parser.add_argument("--check", action="store_true", help="only report stale mutants")
    parser.add_argument("--baseline", action="store_true",
                        help="run every selected test on the unmutated copy")
    parser.add_argument("--keep", action="store_true", help="keep the mutated copies")
    parser.add_argument("--new-only", action="store_true",
                        help="select only the tests without a twin (test_references, ...): does "
                             "each class of bug have its own test, even where an older test also "
                             "catches it?")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutants: {sorted(unknown)}")
    if args.new_only:
        mutants = [dataclasses.replace(m, tests=new) for m in mutants
                   if (new := tuple(t for t in m.tests if t.split("::")[0] in NEW))]
    base = Path(tempfile.mkdtemp(prefix="mutation-base-"))
    try:
        snapshot(base)
        if args.check:
            stale = {m.name: apply(m, base, write=False) for m in mutants}
            for name, why in stale.items():
                print(f"{name:52} {'stale: ' + why if why else 'ok'}")
            return int(any(stale.values()))
        check_imports_come_from(base)
        if args.baseline:
            tests = list(dict.fromkeys(t for m in mutants for t in m.tests))
            code, out, seconds = pytest(base, tests, args.timeout * 4, extra=())
            print(out[-3000:])
            print(f"baseline: pytest exit {code} in {seconds:.0f} s")
            return 0 if code == 0 else 1
        results = {}
        for i, mutant in enumerate(mutants, 1):
            results[mutant.name] = run_mutant(mutant, base, args.timeout, args.keep)
            r = results[mutant.name]
            print(f"[{i}/{len(mutants)}] {mutant.name}: {r['status']} ({r['seconds']:.0f} s) "
                  f"{r['detail']}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n{'mutant':52} {'status':9} {'s':>4}  caught by")
    for name, r in results.items():
        print(f"{name:52} {r['status']:9} {r['seconds']:4.0f}  {r['detail']}")
    live = [r for r in results.values() if r["status"] != "stale"]
    caught = sum(r["status"] == "caught" for r in live)
    stale = len(results) - len(live)
    print(f"\nscore: {caught}/{len(live)} caught ({stale} stale)")
    return 0 if caught == len(live) and not stale else 1


if __name__ == "__main__":
    sys.exit(main())
