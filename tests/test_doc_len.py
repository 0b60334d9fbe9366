"""--doc-len: packed sequences whose attention is masked to each document. Attention's FLOPs and kernel length
follow the documents; GEMMs, memory and communication the sequence. Refused where the kernel would compute
every key anyway, with context parallelism, and at or beyond the sequence's length."""

import json

import pytest
from cloud_stubs import cli_run

from trainready.errors import UsageError
from trainready.plan import efficiency as eff
from trainready.plan.job import JobSpec
from trainready.plan.memory import estimate_memory
from trainready.plan.performance import (
    _micro_batch_time,
    estimate_step,
    flops_per_token,
    model_flops_per_token,
    recompute_flops_per_token,
)
from trainready.plan.recipes import FRAMEWORKS, PACKED_DOCUMENTS, recipe_for
from trainready.plan.setup import resolve
from trainready.plan.track_record import regime_of


def setup(catalog, **kw):
    base = dict(model="llama-3.1-8b", instance="p5.48xlarge", micro_batch=1, seq_len=32768, stack="torchtitan",
                activation_checkpointing="full")
    base.update(kw)
    return resolve(JobSpec(**base), catalog)


def test_attention_runs_as_if_each_document_were_a_sequence(catalog):
    """A micro-batch of one 32k sequence packed with 2k documents: its attention is 16 documents' attention, each
    as a 2k-token sequence's (the same FLOPs and kernel efficiency), and the MFU numerator counts that."""
    packed = setup(catalog, doc_len=2048)
    short = setup(catalog, seq_len=2048)
    e = eff.arch_efficiency(packed.gpu.arch)
    assert _micro_batch_time(packed, e).attn_fwd_s == pytest.approx(16 * _micro_batch_time(short, e).attn_fwd_s)
    assert model_flops_per_token(packed) == pytest.approx(flops_per_token(packed.model, 2048))
    assert model_flops_per_token(packed) < model_flops_per_token(setup(catalog))


def test_recomputation_counts_the_documents_attention(catalog):
    """HFU's recomputed attention (full recompute runs each block's forward again) spans the document too."""
    packed, short = setup(catalog, doc_len=2048), setup(catalog, seq_len=2048)
    assert recompute_flops_per_token(packed) == pytest.approx(recompute_flops_per_token(short))
    assert recompute_flops_per_token(packed) < recompute_flops_per_token(setup(catalog))


def test_the_track_record_regime_follows_attention(catalog):
    """A 32k sequence of 2k documents attends like short sequences: the standard regime's record, not long context's."""
    assert regime_of(setup(catalog)).context == "long"
    assert regime_of(setup(catalog, doc_len=2048)).context == "standard"


def test_everything_else_stays_at_the_sequence(catalog):
    whole, packed = setup(catalog), setup(catalog, doc_len=2048)
    assert estimate_memory(packed).peak == estimate_memory(whole).peak  # flash-style attention: memory linear
    assert packed.local_tokens == whole.local_tokens and packed.tokens_per_step == whole.tokens_per_step
    faster = estimate_step(packed).tokens_per_s / estimate_step(whole).tokens_per_s
    assert 1.2 < faster < 3  # attention was most of a 32k step's FLOPs; the GEMMs are untouched


@pytest.mark.parametrize("kw, said", [
    (dict(doc_len=32768), "doc_len 32768 (--doc-len, or a --job file's doc_len) is not shorter than the "
                          "32768-token sequence"),
    (dict(doc_len=2048, cp=2), "doc_len 2048 (--doc-len, or a --job file's doc_len) with --cp 2"),
    (dict(doc_len=2048, stack="hf-trainer"), "flash_attention_2"),
    (dict(doc_len=2048, stack="deepspeed"), "transformers' SDPA path"),
    (dict(doc_len=2048, stack="automodel", attention_kernel="sdpa"), "give --attention-kernel flash2"),
    # gpt-oss's sinks: FlashAttention-2 has none, so the way forward names kernels that do
    (dict(doc_len=2048, model="gpt-oss-20b", stack="hf-trainer", seq_len=8192, attention_kernel="sdpa"),
     "kernels-community/vllm-flash-attn3"),
])
def test_refused_where_it_would_not_hold(catalog, kw, said):
    with pytest.raises(UsageError) as err:
        setup(catalog, **kw)
    assert said in str(err.value)


def test_flash2_on_a_transformers_stack_runs_documents_apart(catalog):
    s = setup(catalog, doc_len=2048, stack="hf-trainer", attention_kernel="flash2")
    assert s.attention_len == 2048


def test_cli_says_it_and_json_carries_it():
    r = cli_run("estimate", "-m", "llama-3.1-8b", "--instance", "p5.48xlarge", "--seq-len", "16384", "--doc-len", "1024",
                "--stack", "torchtitan", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["setup"]["doc_len"] == 1024 and out["setup"]["seq_len"] == 16384
    assert any(a.startswith("packed documents of 1,024 tokens") for a in out["assumptions"])
    human = cli_run("estimate", "-m", "llama-3.1-8b", "--instance", "p5.48xlarge", "--seq-len", "16384",
                    "--doc-len", "1024", "--stack", "torchtitan")
    assert "documents of 1024, masked apart" in human.stdout
    for bad in ("0", "x", "-5"):
        r = cli_run("estimate", "-m", "llama-3.1-8b", "--seq-len", "4096", "--doc-len", bad)
        assert r.returncode == 2 and "--doc-len" in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr


def test_plan_refuses_where_the_kernel_would_compute_every_key():
    r = cli_run("plan", "-m", "llama-3.1-8b", "--tokens", "1e9", "--seq-len", "8192", "--doc-len", "1024",
                "--instances", "p5.48xlarge")  # the default stack: transformers' SDPA
    assert r.returncode == 2 and "give --attention-kernel flash2" in r.stdout + r.stderr
    ok = cli_run("plan", "-m", "llama-3.1-8b", "--tokens", "1e9", "--seq-len", "8192", "--doc-len", "1024",
                 "--instances", "p5.48xlarge", "--attention-kernel", "flash2", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["rows"]


def test_plan_keeps_context_parallelism_out_and_saves_the_length(tmp_path):
    path = tmp_path / "job.toml"
    r = cli_run("plan", "-m", "llama-3.1-8b", "--tokens", "1e9", "--seq-len", "32768", "--doc-len", "4096",
                "--instances", "p5.48xlarge", "--stack", "torchtitan", "--json", "--save", str(path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = out["rows"]
    assert any("context parallelism not searched" in n for n in out["notes"])
    assert rows and all(row["estimate"]["setup"]["cp"] == 1 and row["estimate"]["setup"]["doc_len"] == 4096
                        for row in rows)
    again = json.loads(cli_run("estimate", "--job", str(path), "--json").stdout)
    assert again["setup"]["doc_len"] == 4096
    assert again["throughput"]["tokens_per_s"] == pytest.approx(rows[0]["estimate"]["throughput"]["tokens_per_s"])


def test_the_plan_page_says_the_documents(tmp_path):
    pytest.importorskip("matplotlib")
    page = tmp_path / "plan.html"
    r = cli_run("plan", "-m", "llama-3.1-8b", "--tokens", "1e9", "--seq-len", "8192", "--doc-len", "1024",
                "--instances", "p5.48xlarge", "--attention-kernel", "flash2", "--html", str(page))
    assert r.returncode == 0, r.stderr
    assert "global batch 128 x 8192 tokens (documents of 1,024, attention masked apart)" in page.read_text()


@pytest.mark.parametrize("framework, mechanism", [
    ("torchtitan", '"block_causal"'), ("megatron", "--dataloader-inter-document-masking"),
    ("deepspeed", "DataCollatorWithFlattening"), ("hf-tp", "flash_attention_2")])
def test_each_recipe_says_how_its_framework_masks_documents(catalog, framework, mechanism):
    assert set(PACKED_DOCUMENTS) == set(FRAMEWORKS)
    stack = {"deepspeed": "deepspeed", "hf-tp": "hf-trainer"}.get(framework, framework)
    kw = dict(stack=stack, seq_len=8192, doc_len=1024, activation_checkpointing="none")
    if stack in ("deepspeed", "hf-trainer"):
        kw["attention_kernel"] = "flash2"
    kw["strategy"] = {"hf-tp": "zero3", "megatron": "zero1"}.get(framework, "zero3")
    s = setup(catalog, **kw)
    notes = recipe_for(s, framework).notes
    assert any(mechanism in n and "--doc-len 1024" in n for n in notes)
    if framework == "deepspeed":  # a model with sinks is told the kernels that take them
        sinks = setup(catalog, **{**kw, "model": "gpt-oss-20b"})
        assert any("vllm-flash-attn3" in n for n in recipe_for(sinks, framework).notes)
    assert not any("--doc-len" in n for n in recipe_for(setup(catalog, **{**kw, "doc_len": None}), framework).notes)


def test_megatron_splits_each_document_over_the_context_parallel_ranks(catalog):
    """Megatron-Core's per-document zigzag CP (TE THD): --cp with --doc-len runs there, each rank holding 1/cp of
    every document; the attention per rank is the documents' over cp, the ring as dense CP's."""
    one = setup(catalog, stack="megatron", strategy="zero1", doc_len=4096, activation_checkpointing="none")
    two = setup(catalog, stack="megatron", strategy="zero1", doc_len=4096, activation_checkpointing="none", cp=2)
    assert two.local_tokens * 2 == one.local_tokens and model_flops_per_token(two) == model_flops_per_token(one)
    with pytest.raises(UsageError) as err:
        setup(catalog, stack="megatron", strategy="zero1", doc_len=2, cp=2)
    assert "2 x cp = 4 chunks" in str(err.value)
    r = cli_run("plan", "-m", "llama-3.1-8b", "--tokens", "1e9", "--seq-len", "131072", "--doc-len", "8192",
                "--instances", "p5.48xlarge", "--stack", "megatron", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and any(row["estimate"]["setup"]["cp"] > 1 for row in out["rows"])
    assert not any("context parallelism not searched" in n for n in out["notes"])


def test_context_parallel_chunks_of_documents_run_the_kernel_at_their_length(catalog, monkeypatch):
    """Under --cp the attention kernel runs on a rank's chunk of each document: its efficiency at doc_len / cp; and
    plan's CP sizes stop where a document no longer splits into 2 x cp chunks."""
    from trainready.plan import performance, search

    seen = []
    real = performance.attention_efficiency
    monkeypatch.setattr(performance, "attention_efficiency",
                        lambda s, e, peak, length=None: seen.append(min(s.attention_len / s.cp, length or 1e18))
                        or real(s, e, peak, length))
    s = setup(catalog, stack="megatron", strategy="zero1", doc_len=4096, cp=4, activation_checkpointing="none")
    performance.estimate_step(s)
    assert seen and set(seen) == {1024}
    assert search._cp_options(s.with_(cp=1, seq_len=65536, doc_len=8), nodes=1) == [1, 2, 4]
    assert search._cp_options(s.with_(cp=1, seq_len=65536, doc_len=None, stack="torchtitan"), nodes=1) == [1, 2, 4, 8]
    assert search._cp_options(s.with_(cp=1, seq_len=65536, stack="torchtitan"), nodes=1) == [1]
