"""SFT on tool traces never trains on the tools' results, exactly as RL leaves them out of
``response_mask_BT``: the result blocks are attended to, their tokens carry no loss and no gradient."""

from __future__ import annotations

import torch

from stepcredit.config import ArithConfig, TinyModelConfig
from stepcredit.data import row_to_sample
from stepcredit.data.arith import make_tool_rows
from stepcredit.models import build_tiny, token_logprobs
from stepcredit.tools import PARSERS
from stepcredit.trainer.sft import sft_batch, sft_loss, sft_pairs
from stepcredit.types import Sample

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, tokenizer="bpe")


def _samples(n: int = 4) -> list[Sample]:
    rows = make_tool_rows(ArithConfig(min_steps=2, max_steps=3), n, seed=5, split="train")
    return [row_to_sample(r, f"t:{i}") for i, r in enumerate(rows)]


def test_result_tokens_are_exactly_the_untrained_ones() -> None:
    _, tok = build_tiny(SMALL, seed=0)
    samples = _samples()
    fenced = PARSERS.get("fenced")
    for s, (_, ids, trained) in zip(samples, sft_pairs(tok, samples), strict=True):
        sol = s.extra_info["solution"]
        assert len(ids) == len(trained) and ids[-1] == tok.eos_token_id and trained[-1]
        shown = tok.decode([i for i, t in zip(ids, trained, strict=True) if not t])
        results = [sol[a:b] for a, b in s.extra_info["solution_observations"]]
        # the untrained tokens are the result blocks, each as the rollout appends it
        assert shown == "".join(results) and all(r == fenced.observation(r[11:-5]) for r in results)
        assert len(results) == s.extra_info["steps"]
        # and the trained ones are the rest: the calls and the answer
        kept = tok.decode([i for i, t in zip(ids, trained, strict=True) if t], skip_special_tokens=True)
        at, rest = 0, ""
        for a, b in s.extra_info["solution_observations"]:
            rest, at = rest + sol[at:a], b
        assert kept == rest + sol[at:] and kept.endswith("The answer is\n" + str(s.ground_truth))


def test_without_spans_every_token_is_trained_as_before() -> None:
    _, tok = build_tiny(SMALL, seed=0)
    s = _samples(1)[0]
    plain = s.with_(extra_info={"solution": s.extra_info["solution"]})
    ((_, ids, trained),) = sft_pairs(tok, [plain])
    assert ids == tok(plain.extra_info["solution"], add_special_tokens=False)["input_ids"] + [
        tok.eos_token_id
    ]
    assert all(trained)


def test_results_get_no_gradient_and_no_loss() -> None:
    torch.manual_seed(0)
    model, tok = build_tiny(SMALL, seed=0)
    pairs = sft_pairs(tok, _samples())
    ids, mask, loss_mask = sft_batch(pairs, tok.pad_token_id)
    obs = mask[:, -loss_mask.shape[1] :] & ~loss_mask  # attended response tokens that are not trained
    assert obs.sum() > 0 and loss_mask.sum() > 0
    logp, _ = token_logprobs(model, ids, mask.long(), n_response=loss_mask.shape[1])
    logp.retain_grad()
    loss = sft_loss(logp, loss_mask)
    loss.backward()
    # the loss's gradient reaches every trained token's log-prob, and no result token's
    assert (logp.grad[obs] == 0).all() and (logp.grad[loss_mask] != 0).all()
    # so perturbing the result tokens' log-probs (their targets' scores) leaves the loss unchanged
    noisy = torch.where(obs, logp.detach() - 5.0 * torch.rand_like(logp), logp.detach())
    assert torch.equal(sft_loss(noisy, loss_mask), sft_loss(logp.detach(), loss_mask))
    # and the loss is the mean NLL over the trained tokens (a per-row loop as the reference)
    nll = [-logp[b][loss_mask[b]] for b in range(len(pairs))]
    assert torch.allclose(loss, torch.cat(nll).mean())
    # the results are attended to: the prompt + response attention mask covers them
    assert mask[:, -loss_mask.shape[1] :][obs].all()
