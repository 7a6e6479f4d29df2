"""What real pretrained-model workflows put in a namespace, at the engine level.

The end-to-end proof with all-MiniLM-L6-v2 in real kernels is tests/kernel/test_real_model.py;
these are the small, fast reproductions of what it exercises.
"""

from __future__ import annotations

import os

import pytest

from jupyter_pause.checkpoint import WriteCache, read, write


def _blob_files(store) -> set[str]:
    root = os.path.join(store.root, "blobs")
    return {f for _, _, fs in os.walk(root) for f in fs}


def test_checkpoint_right_after_a_restore_writes_almost_nothing(store, key):
    """Resume, then pause again without touching anything (a user who only looked at results).

    The fresh kernel has written nothing yet, so only what read() remembers about the storages
    it created lets the writer skip them; without it every pack is streamed to a temp file,
    fsync'd, hashed and found to exist already (272 MB for MiniLM + AdamW)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 512)).sum().backward()
    opt.step()
    first = write({"model": model, "opt": opt}, store, key=key, cache=WriteCache())
    assert first.bytes_total > 3_000_000  # weights + two AdamW moments
    files = _blob_files(store)

    values = read(store, key=key).values  # what %restore / the server does in the new kernel
    again = write(values, store, key=key, cache=WriteCache())  # that kernel's (empty) cache

    assert set(again.manifest.blobs) == set(first.manifest.blobs)  # the very same content...
    assert _blob_files(store) == files  # ...and no new blob on disk
    assert again.bytes_written < again.bytes_total // 100, (
        f"{again.bytes_written} of {again.bytes_total} bytes rewritten after a restore"
    )


def test_training_step_with_a_few_untouched_parameters_does_not_pin_the_old_pack(store, key):
    """Fine-tuning leaves some parameters unchanged (no gradient: MiniLM's unused pooler, frozen
    layers). Reusing their old pack entries by reference must not pin the WHOLE previous pack
    for a few bytes (MiniLM + AdamW after one more step: 518 MiB "in total" for 260 MiB of
    tensors, and a restore that read both packs, 543 MB)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.Linear(512, 512), torch.nn.Linear(8, 8)
    )
    opt = torch.optim.AdamW(model.parameters())
    x = torch.ones(4, 512)

    def train_step() -> None:  # model[2] gets no gradient, like an unused pooler
        model[1](model[0](x)).sum().backward()
        opt.step()
        opt.zero_grad()

    ns = {"model": model, "opt": opt}
    cache = WriteCache()
    train_step()
    first = write(ns, store, key=key, cache=cache)
    train_step()
    second = write(ns, store, key=key, cache=cache)
    assert second.bytes_written > 0.9 * first.bytes_total  # nearly everything changed

    done: list[int] = []
    rr = read(
        store, key=key, checkpoint_id=second.checkpoint_id, progress=lambda d, t: done.append(d)
    )
    assert torch.equal(rr.values["model"][0].weight, model[0].weight)
    assert torch.equal(rr.values["model"][2].weight, model[2].weight)
    assert max(done) < 1.1 * first.bytes_total, f"the restore read {max(done)} bytes"
    assert second.bytes_total < 1.1 * first.bytes_total, (
        f"second checkpoint references {second.bytes_total} bytes of blobs for "
        f"{first.bytes_total} bytes of state (the whole previous pack is kept for "
        f"{model[2].weight.nbytes + model[2].bias.nbytes} unchanged bytes)"
    )


def test_unchanged_inference_tensor_is_not_rewritten(store, key):
    """``SentenceTransformer.encode(..., convert_to_tensor=True)`` (and any code under
    ``torch.inference_mode()``) returns inference tensors. They have no version counter, so the
    cache cannot use it: without another check, embeddings of a whole corpus would be written
    again at every checkpoint."""
    torch = pytest.importorskip("torch")
    with torch.inference_mode():
        corpus_embeddings = torch.randn(2000, 384)
    assert corpus_embeddings.is_inference()
    ns = {"corpus_embeddings": corpus_embeddings}
    cache = WriteCache()
    first = write(ns, store, key=key, cache=cache)
    assert first.bytes_written >= corpus_embeddings.nbytes
    second = write(ns, store, key=key, cache=cache)
    assert second.bytes_written < 64 * 1024, f"{second.bytes_written} bytes rewritten"


def test_hugging_face_objects_roundtrip(store, key):
    """Tied weights, a Rust-backed tokenizer (``tokenizers``) and its Encoding, bf16, a config."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=24,
    )
    mlm = transformers.BertForMaskedLM(cfg).eval()
    assert mlm.cls.predictions.decoder.weight is mlm.bert.embeddings.word_embeddings.weight
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "pause"]
    wp = tokenizers.Tokenizer(
        tokenizers.models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]")
    )
    wp.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    enc = wp.encode("hello pause world")
    half = torch.nn.Linear(4, 4).to(torch.bfloat16)
    ns = {"mlm": mlm, "wp": wp, "enc": enc, "half": half, "cfg": cfg}

    w = write(ns, store, key=key)
    assert {v.name: v.status for v in w.variables} == dict.fromkeys(ns, "saved")
    rr = read(store, key=key, device="cpu")
    assert {v.name: v.status for v in rr.variables} == dict.fromkeys(ns, "restored")
    v = rr.values

    m = v["mlm"]
    assert m.cls.predictions.decoder.weight is m.bert.embeddings.word_embeddings.weight
    x = torch.tensor([[2, 4, 6, 5, 3]])
    with torch.no_grad():
        assert torch.equal(m(x).logits, mlm(x).logits)
    assert v["wp"].encode("hello pause world").ids == enc.ids == v["enc"].ids
    assert v["half"].weight.dtype == torch.bfloat16 and torch.equal(v["half"].weight, half.weight)
    assert v["cfg"].to_dict() == cfg.to_dict()
